//! The researcher's workflow of issue 29 end to end: `imgbuild slurm --jupyter` of the
//! JupyterLab image (tests/it/jupyter.rs builds it from JupyterLab's real wheels), pushed to
//! Debian's `docker-registry`, submitted to a real Slurm (tests/it/slurm.rs starts it) and
//! reached from "a laptop" through a real OpenSSH daemon: Debian's `sshd` on 127.0.0.1 at a
//! free port, with a host key, a config and an authorized key of its own. The test runs the
//! `ssh -N -L` command the job printed, talks to the server through the tunnel (the token,
//! a kernel over its websocket), then cancels the job and looks for what was left.

use std::{
    net::TcpStream,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::{Value, json};

use crate::{
    common::{Project, require_root},
    jupyter::http,
    registry::{Auth, Registry, free_port},
    slurm::{Cluster, TOOLS, run_ok},
    support::{
        base::have,
        jupyter::build_image,
        podman::{Podman, Storage},
    },
};

/// The name the laptop's SSH config gives the login node.
const LOGIN_HOST: &str = "login.imgbuild.test";

/// A child process killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An `sshd` of its own on 127.0.0.1, and the client config that reaches it as
/// [`LOGIN_HOST`]: the host key pinned in its own known_hosts, a key that root may log in
/// with, forwarding allowed, nothing of the machine's own ssh configuration used.
struct Sshd {
    dir: tempfile::TempDir,
    _daemon: Running,
}

impl Sshd {
    fn start() -> Sshd {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        for key in ["host_ed25519", "client_ed25519"] {
            run_ok(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", ""])
                    .arg("-f")
                    .arg(path(key)),
            );
        }
        fs_err::copy(path("client_ed25519.pub"), path("authorized_keys")).unwrap();
        let host_key = fs_err::read_to_string(path("host_ed25519.pub")).unwrap();
        fs_err::write(path("known_hosts"), format!("{LOGIN_HOST} {host_key}")).unwrap();
        let port = free_port();
        let d = dir.path().display();
        fs_err::write(
            path("sshd_config"),
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_ed25519\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nLogLevel VERBOSE\n"
            ),
        )
        .unwrap();
        fs_err::write(
            path("ssh_config"),
            format!(
                "Host {LOGIN_HOST}\n  HostName 127.0.0.1\n  Port {port}\n  IdentityFile {d}/client_ed25519\n\
                 \x20 IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n  GlobalKnownHostsFile /dev/null\n\
                 \x20 HostKeyAlias {LOGIN_HOST}\n  StrictHostKeyChecking yes\n  BatchMode yes\n\
                 \x20 ExitOnForwardFailure yes\n"
            ),
        )
        .unwrap();
        // sshd's privilege separation needs its directory, which only a running service makes.
        fs_err::create_dir_all("/run/sshd").unwrap();
        let log = fs_err::File::create(path("sshd.log")).unwrap().into_file();
        let daemon = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(path("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting sshd");
        let sshd = Sshd {
            _daemon: Running(daemon),
            dir,
        };
        wait_until(
            "sshd to listen",
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
            || sshd.log(),
        );
        sshd
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }

    fn log(&self) -> String {
        fs_err::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

/// Polls `ready` every half second, at most 1200 times: a bound, so that a job that never
/// gets there fails with `context` instead of hanging the suite.
fn wait_until(what: &str, ready: impl Fn() -> bool, context: impl Fn() -> String) {
    for _ in 0..1200 {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("never saw {what}:\n{}", context());
}

/// The image's JupyterLab image, pushed to `registry` as `ml/jupyter:v1`.
fn pushed_jupyter_image(project: &Project, registry: &Registry) {
    build_image(project, "jupyter-e2e", "");
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    let auth_file = docker.join("auth.json").display().to_string();
    let target = format!("{}/ml/jupyter:v1", registry.host);
    project
        .run_with(
            &["push", "images/jupyter-e2e", &target, "--insecure"],
            &[
                ("DOCKER_CONFIG", &docker.display().to_string()),
                ("REGISTRY_AUTH_FILE", &auth_file),
            ],
            None,
        )
        .success();
}

/// The job's id from `sbatch`'s `Submitted batch job N`.
fn submit(cluster: &Cluster, script: &Path, env: &[(String, String)]) -> String {
    let submitted = run_ok(
        cluster
            .client("sbatch")
            .arg(script)
            .envs(env.iter().map(|(k, v)| (k, v))),
    );
    submitted.split_whitespace().last().unwrap().to_string()
}

fn job_running(cluster: &Cluster, job: &str) -> bool {
    let output = cluster
        .client("squeue")
        .args(["-h", "-j", job, "-o", "%T"])
        .output()
        .unwrap();
    !String::from_utf8_lossy(&output.stdout).trim().is_empty()
}

/// The `ssh -N -L …` and `http://localhost…` lines the job printed, once it has.
fn tunnel_lines(output: &Path) -> Option<(String, String)> {
    let text = fs_err::read_to_string(output).ok()?;
    let ssh = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ssh -N -L "))?;
    let url = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("http://localhost:"))?;
    Some((ssh.to_string(), url.to_string()))
}

/// Runs `code` in a new kernel of the server at `port` through its websocket, as JupyterLab
/// does, and returns what the cell printed.
fn run_cell(port: u16, token: &str, code: &str) -> String {
    let base = format!("http://127.0.0.1:{port}");
    let (status, body) = http(
        "POST",
        &format!("{base}/api/kernels"),
        Some(token),
        Some(&json!({"name": "python3"})),
    );
    assert_eq!(status, 201, "starting a kernel: {body}");
    let kernel: Value = serde_json::from_str(&body).unwrap();
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A bound on each read, so that a kernel that never answers fails the test.
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let url = format!(
        "ws://127.0.0.1:{port}/api/kernels/{}/channels?token={token}",
        kernel["id"].as_str().unwrap()
    );
    let (mut socket, _) =
        tungstenite::client(url.as_str(), stream).expect("the kernel's websocket");
    let request = json!({
        "header": {"msg_id": "imgbuild-cell-1", "msg_type": "execute_request", "username": "imgbuild",
                   "session": "imgbuild-test", "version": "5.3", "date": "2026-12-02T00:00:00.000000Z"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": false, "store_history": false, "user_expressions": {},
                    "allow_stdin": false, "stop_on_error": true}
    });
    socket
        .send(tungstenite::Message::text(request.to_string()))
        .unwrap();
    let mut printed = String::new();
    for _ in 0..10_000 {
        let tungstenite::Message::Text(text) = socket.read().expect("a kernel message") else {
            continue;
        };
        let message: Value = serde_json::from_str(text.as_str()).unwrap();
        if message["parent_header"]["msg_id"] != "imgbuild-cell-1" {
            continue;
        }
        match message["msg_type"].as_str() {
            Some("stream") => {
                printed.push_str(message["content"]["text"].as_str().unwrap_or_default())
            }
            Some("error") => panic!("the cell failed: {}", message["content"]),
            Some("status") if message["content"]["execution_state"] == "idle" => return printed,
            _ => {}
        }
    }
    panic!("the kernel never went idle; printed so far: {printed}")
}

#[test]
fn jupyter_on_slurm_is_reached_through_the_ssh_tunnel_the_job_prints() {
    let mut tools = TOOLS.to_vec();
    tools.extend([
        "sshd",
        "ssh",
        "ssh-keygen",
        "scancel",
        "squeue",
        "curl",
        "skopeo",
    ]);
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    assert!(
        missing.is_empty(),
        "run tests/install-deps.sh (missing: {})",
        missing.join(", ")
    );
    require_root!("slurmd needs root to start jobs as their users");
    let registry = Registry::start(Auth::None);
    let project = Project::new();
    pushed_jupyter_image(&project, &registry);
    let cluster = Cluster::start();
    let sshd = Sshd::start();
    let podman = Podman::new(&cluster.dir.path().join("podman"), Storage::Vfs).unwrap();
    let mut env: Vec<(String, String)> = podman
        .env()
        .iter()
        .map(|(k, p)| (k.to_string(), p.display().to_string()))
        .collect();
    env.push(("SLURM_JOB_USER".into(), "root".into()));
    let local_port = free_port();

    let repository = format!("{}/ml/jupyter", registry.host);
    let local = local_port.to_string();
    let script_text = project
        .run(&[
            "slurm",
            "images/jupyter-e2e",
            "--repository",
            &repository,
            "--runner",
            "podman",
            "--insecure-registry",
            "--jupyter",
            "--login-host",
            LOGIN_HOST,
            "--local-port",
            &local,
            "--set",
            "time=20",
            "--set",
            "gpus=0",
        ])
        .success()
        .stdout;
    let script = cluster.path("jupyter.sbatch");
    fs_err::write(&script, &script_text).unwrap();
    run_ok(Command::new("bash").arg("-n").arg(&script));
    let job = submit(&cluster, &script, &env);
    let output = cluster.path(&format!("jupyter-{job}.out"));
    let context = || {
        format!(
            "{}\n{}",
            fs_err::read_to_string(&output).unwrap_or_default(),
            cluster.logs()
        )
    };

    // 1. The job prints the tunnel and the URL; its output file is the user's alone.
    wait_until(
        "the tunnel line",
        || tunnel_lines(&output).is_some(),
        context,
    );
    let (ssh_line, url) = tunnel_lines(&output).unwrap();
    let mode = fs_err::metadata(&output).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the output file holds the token: {mode:o}");
    let token = url.split_once("token=").unwrap().1.to_string();
    assert_eq!(token.len(), 48, "{url}");
    assert!(
        url.starts_with(&format!("http://localhost:{local_port}/lab?token=")),
        "{url}"
    );

    // 2. Exactly that command, with the laptop's ssh config (the login host's address, port, key).
    let words: Vec<&str> = ssh_line.split_whitespace().collect();
    assert_eq!(words[..4], ["ssh", "-N", "-L", words[3]], "{ssh_line}");
    assert_eq!(words[4], format!("root@{LOGIN_HOST}"), "{ssh_line}");
    let _tunnel = Running(
        Command::new(words[0])
            .arg("-F")
            .arg(sshd.config())
            .args(&words[1..])
            .stdin(Stdio::null())
            .stderr(
                fs_err::File::create(sshd.dir.path().join("ssh.log"))
                    .unwrap()
                    .into_file(),
            )
            .spawn()
            .unwrap(),
    );

    // 3. Through the tunnel: the token is required, the lab opens with it, a kernel runs a cell
    // as the image's user, and the server itself is not root.
    let base = format!("http://127.0.0.1:{local_port}");
    wait_until(
        "JupyterLab through the tunnel",
        || http("GET", &format!("{base}/api/status"), Some(&token), None).0 == 200,
        || format!("{}\n--- sshd:\n{}", context(), sshd.log()),
    );
    assert_eq!(
        http("GET", &format!("{base}/api/status"), None, None).0,
        403
    );
    assert_eq!(
        http(
            "GET",
            &format!("{base}/api/status"),
            Some("not-the-token"),
            None
        )
        .0,
        403
    );
    let (lab, _) = http("GET", &url.replace("localhost", "127.0.0.1"), None, None);
    assert_eq!(lab, 200, "the printed URL opens the lab");
    let printed = run_cell(
        local_port,
        &token,
        "import os\nprint('uid', os.getuid())\nprint([l for l in open('/proc/1/status') if l.startswith('Uid:')][0])",
    );
    assert!(printed.contains("uid 1000\n"), "{printed}");
    let server_uid = printed
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next());
    assert_eq!(server_uid, Some("1000"), "{printed}");
    let container = format!("imgbuild-jupyter-{job}");
    let server_pid = podman
        .ok(&["inspect", "--format", "{{.State.Pid}}", &container])
        .trim()
        .to_string();
    assert!(
        Path::new("/proc").join(&server_pid).exists(),
        "{server_pid}"
    );

    // 4. scancel: the job ends, the server stops, no container is left.
    run_ok(cluster.client("scancel").arg(&job));
    let stopped = || {
        let text = fs_err::read_to_string(&output).unwrap_or_default();
        text.contains("imgbuild: JupyterLab stopped") && !job_running(&cluster, &job)
    };
    wait_until("the job to stop JupyterLab and end", stopped, context);
    let left = podman.ok(&["ps", "--all", "--format", "{{.Names}} {{.Status}}"]);
    assert!(
        !left
            .lines()
            .any(|n| n.split(' ').next() == Some(container.as_str())),
        "left: {left}\n{}",
        context()
    );
    assert!(
        !Path::new("/proc").join(&server_pid).exists(),
        "the server process {server_pid} is still there"
    );
    let text = fs_err::read_to_string(&output).unwrap();
    let masked = text.replace(&token, "<token>");
    eprintln!(
        "--- the script:\n{script_text}\n--- the job's output file:\n{masked}\n--- the cell printed:\n{printed}"
    );
}
