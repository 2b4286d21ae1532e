//! `imgbuild slurm` (issue 18 part 6) against a real single-node Slurm from Debian's packages
//! (22.05: `slurmctld`, `slurmd`, `sbatch`, with munge for authentication), started by the
//! test on this machine: the podman-runner script of an imgbuild image pushed to Debian's
//! `docker-registry` runs with `sbatch --wait`, and the image's entrypoint, cmd, env and workdir
//! show in the job's output file; the Pyxis script's `#SBATCH` lines pass `sbatch
//! --test-only` (Pyxis itself, a SPANK plugin of NVIDIA's, is not packaged by Debian, so its
//! `srun` line is checked as text and by `bash -n`).

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::{
    common::{LayoutView, Project, require_root},
    registry::{Auth, Registry, free_port},
    support::{
        base::busybox_base_layout,
        base::have,
        channel::tiny_recipe,
        podman::{Podman, Storage},
        shared_channel,
    },
};

/// What the tests run: the Slurm daemons and clients, munge, podman, and what builds the base.
pub(crate) const TOOLS: &[&str] = &[
    "slurmctld",
    "slurmd",
    "sbatch",
    "sinfo",
    "munged",
    "podman",
    "umoci",
];

/// How long the daemons may take to start, and jobs to end.
const DAEMONS: Duration = Duration::from_secs(60);
const JOBS: Duration = Duration::from_secs(300);

/// munged, slurmctld and one slurmd a node as child processes, with every file in one temp
/// dir; killed on drop.
pub(crate) struct Cluster {
    pub dir: tempfile::TempDir,
    nodes: Vec<String>,
    children: Vec<Child>,
}

impl Cluster {
    /// One node: this host, by its name, with its CPUs and memory as `slurmd -C` reads them.
    pub(crate) fn start() -> Cluster {
        let (line, _, _) = hardware();
        Self::start_with(vec![line])
    }

    /// `n` nodes, `node1`…, each a `slurmd -N` of its own on this host with a port of its
    /// own and an equal share of the host's CPUs (one at least) and memory. Debian builds
    /// Slurm with multiple-slurmd support (`scontrol show config` says MULTIPLE_SLURMD = Yes).
    pub(crate) fn start_nodes(n: usize) -> Cluster {
        assert!(n > 0, "a cluster needs a node");
        let (_, cpus, memory) = hardware();
        let host = run_ok(Command::new("hostname").arg("-s"));
        let lines = (1..=n)
            .map(|i| {
                format!(
                    "NodeName=node{i} NodeAddr=127.0.0.1 NodeHostname={} Port={} \
                     CPUs={} RealMemory={}",
                    host.trim(),
                    free_port(),
                    (cpus / n).max(1),
                    memory / n as u64,
                )
            })
            .collect();
        Self::start_with(lines)
    }

    /// A cluster of the nodes `lines` configure (`NodeName=… CPUs=… …`), once all are idle.
    fn start_with(lines: Vec<String>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        // munged refuses a socket in a directory others cannot search.
        fs_err::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let nodes = lines.iter().map(|line| node_name(line)).collect();
        let mut cluster = Cluster {
            dir,
            nodes,
            children: Vec::new(),
        };
        cluster.start_munge();
        cluster.write_config(&lines);
        cluster.start_slurm();
        cluster.wait_until_idle();
        cluster
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The nodes' names, as jobs see them in `SLURMD_NODENAME`.
    pub(crate) fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// munged with a key of its own (in a directory only root reads), on its own socket.
    fn start_munge(&mut self) {
        let (keys, socket_dir) = (self.path("munge-key"), self.path("munge"));
        fs_err::create_dir_all(&keys).unwrap();
        fs_err::create_dir_all(&socket_dir).unwrap();
        fs_err::set_permissions(&keys, std::fs::Permissions::from_mode(0o700)).unwrap();
        let key = keys.join("munge.key");
        fs_err::write(&key, munge_key()).unwrap();
        fs_err::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut munged = Command::new("munged");
        munged
            .arg("--foreground")
            .arg(format!("--key-file={}", key.display()));
        for (flag, file) in [
            ("socket", "munge/socket"),
            ("log-file", "munge-key/munged.log"),
            ("pid-file", "munge-key/munged.pid"),
            ("seed-file", "munge-key/munged.seed"),
        ] {
            munged.arg(format!("--{flag}={}", self.path(file).display()));
        }
        let child = self.spawn(&mut munged, "munged");
        self.children.push(child);
        self.wait_for("munged's socket", DAEMONS, || {
            self.path("munge/socket").exists()
        });
    }

    /// slurmctld, then each node's slurmd, named with `-N` so that it takes its own line of
    /// `slurm.conf` (and its own port, spool, pid and log files, by `%n`).
    fn start_slurm(&mut self) {
        let child = self.spawn(Command::new("slurmctld").arg("-D"), "slurmctld");
        self.children.push(child);
        for node in self.nodes.clone() {
            let mut slurmd = Command::new("slurmd");
            slurmd.args(["-D", "-N", &node]);
            let child = self.spawn(&mut slurmd, &format!("slurmd-{node}"));
            self.children.push(child);
        }
    }

    /// `slurm.conf` for the nodes `lines` configure, each with a stand-in GPU
    /// (`File=/dev/null`) so that `--gres=gpu:1` can be scheduled. There is no slurmdbd:
    /// MinJobAge keeps ended jobs in `scontrol show job` for 10 minutes, and a job whose
    /// dependency can never be met is cancelled rather than left pending for ever.
    fn write_config(&self, lines: &[String]) {
        let host = run_ok(Command::new("hostname").arg("-s"));
        let dir = self.dir.path().display();
        let nodes: String = lines
            .iter()
            .map(|line| format!("{line} Gres=gpu:1 Feature=fast,ib State=UNKNOWN\n"))
            .collect();
        let config = format!(
            "ClusterName=imgbuild\nSlurmctldHost={host}\n\
             SlurmctldPort={}\nSlurmdPort={}\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={dir}/munge/socket\n\
             SlurmUser=root\nSlurmdUser=root\n\
             StateSaveLocation={dir}/state\nSlurmdSpoolDir={dir}/spool/%n\n\
             SlurmctldPidFile={dir}/slurmctld.pid\nSlurmdPidFile={dir}/slurmd-%n.pid\n\
             SlurmctldLogFile={dir}/slurmctld.log\nSlurmdLogFile={dir}/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n\
             MpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n\
             MailProg=/bin/true\nReturnToService=2\nGresTypes=gpu\n\
             MinJobAge=600\nDependencyParameters=kill_invalid_depend\n\
             {nodes}\
             PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP\n",
            free_port(),
            free_port(),
            host = host.trim(),
        );
        fs_err::write(self.path("slurm.conf"), config).unwrap();
        fs_err::write(
            self.path("gres.conf"),
            "AutoDetect=off\nName=gpu File=/dev/null\n",
        )
        .unwrap();
        fs_err::create_dir_all(self.path("state")).unwrap();
        for node in &self.nodes {
            fs_err::create_dir_all(self.path(&format!("spool/{node}"))).unwrap();
        }
    }

    /// `command` with this cluster's `SLURM_CONF`, its output appended to `NAME.out`.
    fn spawn(&self, command: &mut Command, name: &str) -> Child {
        let out = fs_err::File::create(self.path(&format!("{name}.out")))
            .unwrap()
            .into_file();
        command
            .env("SLURM_CONF", self.path("slurm.conf"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"))
    }

    fn wait_until_idle(&self) {
        let what = format!("{} to be idle", self.nodes.join(", "));
        let all: BTreeSet<&str> = self.nodes.iter().map(String::as_str).collect();
        self.wait_for(&what, DAEMONS, || {
            let state = self
                .client("sinfo")
                .args(["-h", "-N", "-o", "%N %T"])
                .output();
            state.is_ok_and(|o| idle(&String::from_utf8_lossy(&o.stdout)) == all)
        });
    }

    /// Polls `ready` for up to `limit`, failing with the daemons' output.
    fn wait_for(&self, what: &str, limit: Duration, ready: impl Fn() -> bool) {
        let started = Instant::now();
        while !ready() {
            assert!(
                started.elapsed() < limit,
                "timed out waiting for {what}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What each daemon wrote: its own output holds what failed before its log file was
    /// open (a bad `slurm.conf`); the log file also holds what slurmstepd wrote for jobs.
    pub(crate) fn logs(&self) -> String {
        let mut files = vec!["munged.out".to_string(), "slurmctld.out".into()];
        files.push("slurmctld.log".into());
        for node in &self.nodes {
            files.push(format!("slurmd-{node}.out"));
            files.push(format!("slurmd-{node}.log"));
        }
        files
            .iter()
            .map(|name| {
                let text = fs_err::read_to_string(self.path(name));
                format!("--- {name}:\n{}", text.unwrap_or_default())
            })
            .collect()
    }

    /// Any command (a Slurm client, a script that submits jobs) with this cluster's
    /// `SLURM_CONF`, run in its directory.
    pub(crate) fn client(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("SLURM_CONF", self.path("slurm.conf"))
            .current_dir(self.dir.path());
        command
    }

    /// Every job slurmctld remembers: pending, running, or ended in the last 10 minutes.
    pub(crate) fn jobs(&self) -> Vec<Job> {
        let text = run_ok(self.client("scontrol").args(["show", "job", "--oneliner"]));
        text.lines()
            .filter(|line| line.starts_with("JobId="))
            .map(Job::parse)
            .collect()
    }

    /// Waits (5 minutes at most) until job `id`, an array's tasks with it, and every job that
    /// depends on it have ended; returns every job, in its final state. The wait is for this
    /// cluster's queue to empty, not for jobs by id: slurmctld forgets a dependency once it
    /// is met, so a dependent that started before this call would not be found by it.
    pub(crate) fn wait_for_job(&self, id: &str) -> Vec<Job> {
        // A job slurmctld does not know (a typo, an id parsed wrongly) fails here.
        run_ok(self.client("scontrol").args(["show", "job", id]));
        self.wait_for(&format!("job {id} and its dependents"), JOBS, || {
            let queue = self.client("squeue").arg("-h").output();
            queue.is_ok_and(|o| o.status.success() && o.stdout.is_empty())
        });
        self.jobs()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The daemons in the reverse order of their start: slurmd, slurmctld, munged.
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A job as `scontrol show job` shows it, by field: `JobId`, `JobState`, `NodeList`,
/// `ArrayJobId`, `ArrayTaskId`…
#[derive(Debug)]
pub(crate) struct Job(BTreeMap<String, String>);

impl Job {
    /// One line of `scontrol show job --oneliner`: `KEY=VALUE` words, where a word without
    /// `=` goes on with the value before it (a job name or a path with a space).
    fn parse(line: &str) -> Job {
        let mut fields = BTreeMap::new();
        let mut last = String::new();
        for word in line.split_whitespace() {
            if let Some((key, value)) = word.split_once('=') {
                fields.insert(key.to_string(), value.to_string());
                last = key.to_string();
            } else if let Some(value) = fields.get_mut(&last) {
                value.push(' ');
                value.push_str(word);
            }
        }
        Job(fields)
    }

    /// The field `key`, empty where the job has none.
    pub(crate) fn get(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }
}

/// The first line of `slurmd -C` (this host as one node), and its CPUs and memory (MiB).
fn hardware() -> (String, usize, u64) {
    let text = run_ok(Command::new("slurmd").arg("-C"));
    let line = text.lines().next().unwrap_or_default().to_string();
    let field = |key: &str| {
        let word = line.split_whitespace().find_map(|w| w.strip_prefix(key));
        word.and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {key} in `slurmd -C`: {line}"))
    };
    let (cpus, memory) = (field("CPUs="), field("RealMemory="));
    (line, cpus as usize, memory)
}

/// The name of the node a `NodeName=NAME …` line configures.
fn node_name(line: &str) -> String {
    let first = line.split_whitespace().next().unwrap_or_default();
    let name = first.strip_prefix("NodeName=");
    name.unwrap_or_else(|| panic!("not a node line: {line}"))
        .to_string()
}

/// The nodes `sinfo -h -N -o '%N %T'` shows idle.
fn idle(sinfo: &str) -> BTreeSet<&str> {
    let nodes = sinfo.lines().filter_map(|line| line.split_once(' '));
    nodes
        .filter(|(_, state)| state.trim() == "idle")
        .map(|(node, _)| node)
        .collect()
}

/// A munge key: 1024 bytes from the kernel's random source.
fn munge_key() -> Vec<u8> {
    use std::io::Read;
    let mut key = vec![0u8; 1024];
    fs_err::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut key)
        .unwrap();
    key
}

#[track_caller]
pub(crate) fn run_ok(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        describe(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn describe(output: &Output) -> String {
    format!(
        "{}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The image the jobs run: busybox, `hello`, and an entrypoint that prints its cmd, the
/// image's env and its workdir.
const ENTRYPOINT: &str = "hello; echo \"workdir=$(pwd) greeting=$GREETING args=$*\"";

/// A project with the image `slurmjob` built on the busybox base and pushed to `registry` as
/// `ml/slurmjob:v1`; returns its manifest digest.
fn pushed_image(project: &Project, registry: &Registry) -> String {
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let entrypoint = serde_json::to_string(&["/bin/sh", "-c", ENTRYPOINT, "sh"]).unwrap();
    let recipe = tiny_recipe(shared_channel(), "slurmjob", &["hello 1.0"]).replace(
        "base = \"scratch\"",
        &format!(
            "base = \"oci:../base\"\nentrypoint = {entrypoint}\ncmd = [\"from-the-cmd\"]\nworkdir = \"/tmp\""
        ),
    ) + "\n[image.env]\nGREETING = \"set-in-the-image\"\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    let docker_env = docker.display().to_string();
    let auth_file = docker.join("auth.json").display().to_string();
    let target = format!("{}/ml/slurmjob:v1", registry.host);
    project
        .run_with(
            &["push", "images/slurmjob", &target, "--insecure"],
            &[
                ("DOCKER_CONFIG", &docker_env),
                ("REGISTRY_AUTH_FILE", &auth_file),
            ],
            None,
        )
        .success();
    LayoutView::new(project.path().join("images/slurmjob")).manifest_digest()
}

/// Writes `imgbuild slurm images/slurmjob --repository … ARGS` to `NAME.sbatch` in the
/// cluster's directory, checks it with `bash -n` and returns its path and text.
fn script(
    project: &Project,
    cluster: &Cluster,
    repository: &str,
    name: &str,
    args: &[&str],
) -> (PathBuf, String) {
    let mut all = vec!["slurm", "images/slurmjob", "--repository", repository];
    all.extend_from_slice(args);
    let text = project.run(&all).success().stdout;
    let path = cluster.path(&format!("{name}.sbatch"));
    fs_err::write(&path, &text).unwrap();
    run_ok(Command::new("bash").arg("-n").arg(&path));
    (path, text)
}

/// `sbatch --test-only` of `script`: what sbatch makes of its `#SBATCH` lines on this
/// cluster, without running it.
fn sbatch_test_only(cluster: &Cluster, script: &Path) -> Output {
    cluster
        .client("sbatch")
        .arg("--test-only")
        .arg(script)
        .output()
        .unwrap()
}

/// `sbatch --wait` of `script` (at most 5 minutes): how sbatch ended, and the job's
/// output file.
fn sbatch_wait(cluster: &Cluster, script: &Path, env: &[(String, String)]) -> (Output, String) {
    let output_file = script.with_extension("out");
    let output = cluster
        .client("timeout")
        .arg("300")
        .arg("sbatch")
        .arg("--wait")
        .arg(format!("--output={}", output_file.display()))
        .arg(script)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    (
        output,
        fs_err::read_to_string(&output_file).unwrap_or_default(),
    )
}

/// [`sbatch_wait`] of a job that must succeed; returns its output file.
fn submit(cluster: &Cluster, script: &Path, env: &[(String, String)]) -> String {
    let (output, job_output) = sbatch_wait(cluster, script, env);
    assert!(
        output.status.success(),
        "sbatch --wait failed: {}\njob output:\n{job_output}\n{}",
        describe(&output),
        cluster.logs()
    );
    job_output
}

#[test]
fn podman_job_runs_the_image_and_the_pyxis_script_passes_sbatch_test_only() {
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| !have(t)).collect();
    if !missing.is_empty() || !Path::new("/bin/busybox").exists() {
        panic!(
            "{} and busybox-static are required: run tests/install-deps.sh (missing: {})",
            TOOLS.join(", "),
            missing.join(", ")
        );
    }
    require_root!("slurmd needs root to start jobs as their users");
    let registry = Registry::start(Auth::None);
    let project = Project::new();
    let digest = pushed_image(&project, &registry);
    let repository = format!("{}/ml/slurmjob", registry.host);
    let cluster = Cluster::start();
    // podman's settings reach the jobs through the environment, which sbatch passes on.
    let podman = Podman::new(&cluster.dir.path().join("podman"), Storage::Vfs).unwrap();
    let env: Vec<(String, String)> = podman
        .env()
        .iter()
        .map(|(key, path)| (key.to_string(), path.display().to_string()))
        .collect();

    // The image holds cuda-cudart, so by default its job asks for a GPU and podman is given
    // the job's GPUs as CDI devices; this machine has none to run it on.
    let (_, text) = script(
        &project,
        &cluster,
        &repository,
        "gpu",
        &["--runner", "podman"],
    );
    for line in [
        "#SBATCH --gres=gpu:1",
        "--device \"nvidia.com/gpu=$id\"",
        "\"${gpus[@]}\"",
    ] {
        assert!(text.contains(line), "`{line}` in:\n{text}");
    }

    // The image's own entrypoint, cmd, env and workdir, as podman reads them from the image
    // it pulled by digest.
    let (path, text) = script(
        &project,
        &cluster,
        &repository,
        "podman",
        &[
            "--runner",
            "podman",
            "--insecure-registry",
            "--set",
            "time=5",
            "--set",
            "gpus=0",
        ],
    );
    assert!(
        text.contains(&format!("{repository}@{digest}")),
        "pinned by digest:\n{text}"
    );
    let job = submit(&cluster, &path, &env);
    assert!(job.contains("hello from /opt/conda"), "{job}");
    assert!(
        job.contains("workdir=/tmp greeting=set-in-the-image args=from-the-cmd"),
        "{job}"
    );
    // The script and what came back, for a reader of `--nocapture`.
    eprintln!("{text}\n--- the job's output file:\n{job}");

    // Hostile values reach the container as the very bytes given, never as shell code.
    let marker = cluster.path("injected");
    let hostile = format!(
        "$(touch {m}) `touch {m}`; touch {m} 'q\"",
        m = marker.display()
    );
    let args = serde_json::to_string(&[hostile.as_str()]).unwrap();
    let (path, _) = script(
        &project,
        &cluster,
        &repository,
        "hostile",
        &[
            "--runner",
            "podman",
            "--insecure-registry",
            "--env",
            &format!("GREETING={hostile}"),
            "--set",
            &format!("args={args}"),
            "--set",
            "gpus=0",
        ],
    );
    let job = submit(&cluster, &path, &env);
    assert!(
        job.contains(&format!("greeting={hostile} args={hostile}")),
        "{job}"
    );
    assert!(!marker.exists(), "a value ran as a command");

    // A host directory mounted read-only: the job reads the file through it. A missing one
    // ends the job before podman runs, with a line saying which.
    let data = cluster.path("data");
    fs_err::create_dir_all(&data).unwrap();
    fs_err::write(data.join("greeting.txt"), "read through the volume\n").unwrap();
    let volume = format!("{}:/data:ro", data.display());
    let read = [
        "--runner",
        "podman",
        "--insecure-registry",
        "--set",
        "gpus=0",
        "--set",
        r#"command=["/bin/sh","-c","cat /data/greeting.txt; touch /data/x || echo read-only"]"#,
    ];
    let (path, text) = script(
        &project,
        &cluster,
        &repository,
        "volume",
        &[&read[..], &["--volume", &volume]].concat(),
    );
    assert!(text.contains("--volume="), "{text}");
    let job = submit(&cluster, &path, &env);
    assert!(job.contains("read through the volume"), "{job}");
    assert!(job.contains("read-only"), "{job}");
    let gone = format!("{}:/data", cluster.path("no-such-dir").display());
    let (path, _) = script(
        &project,
        &cluster,
        &repository,
        "no-volume",
        &[&read[..], &["--volume", &gone]].concat(),
    );
    let (failed, job) = sbatch_wait(&cluster, &path, &env);
    assert!(!failed.status.success(), "{}", describe(&failed));
    assert!(
        job.contains("imgbuild: the volume source") && job.contains("no-such-dir"),
        "{job}"
    );

    // The Pyxis script: sbatch checks its `#SBATCH` lines against the cluster (partition,
    // time, CPUs, memory, the GPU), and refuses a GPU more than the node has.
    let pyxis = [
        "--set",
        "partition=debug",
        "--set",
        "time=0-00:10:00",
        "--set",
        "cpus-per-task=1",
        "--set",
        "memory=64Mi",
        "--set",
        "gpus=1",
    ];
    let (path, text) = script(&project, &cluster, &repository, "pyxis", &pyxis);
    let enroot = format!("--container-image='{}#ml/slurmjob:{digest}'", registry.host);
    for line in [
        "#SBATCH --gres=gpu:1",
        "#SBATCH --mem=64M",
        "#SBATCH --cpus-per-task=1",
        &enroot,
        "--no-container-entrypoint",
        "--container-workdir=/tmp",
        &format!("/bin/sh -c '{ENTRYPOINT}' sh from-the-cmd"),
    ] {
        assert!(text.contains(line), "`{line}` in:\n{text}");
    }
    let test_only = sbatch_test_only(&cluster, &path);
    assert!(test_only.status.success(), "{}", describe(&test_only));
    let verdict = String::from_utf8_lossy(&test_only.stderr);
    assert!(verdict.contains("to start at"), "{}", describe(&test_only));
    eprintln!("{text}\n--- sbatch --test-only:\n{verdict}");

    // A multi-node Pyxis script: its `#SBATCH` lines (nodes, tasks and GPUs per node, node
    // features, exclusive) and its mount list, checked by sbatch against the cluster.
    let multi = [
        "--set",
        "nodes=1",
        "--set",
        "ntasks-per-node=1",
        "--set",
        "gpus-per-node=1",
        "--set",
        "constraint=fast&ib",
        "--set",
        "exclusive=true",
        "--set",
        "time=10",
        "--volume",
        "/srv/data:/data:ro",
    ];
    let (path, text) = script(&project, &cluster, &repository, "multi", &multi);
    for line in [
        "#SBATCH --nodes=1\n",
        "#SBATCH --ntasks-per-node=1\n",
        "#SBATCH --gpus-per-node=1\n",
        "#SBATCH --constraint=fast&ib\n",
        "#SBATCH --exclusive\n",
        "--container-mounts=/srv/data:/data:ro",
    ] {
        assert!(text.contains(line), "`{line}` in:\n{text}");
    }
    let test_only = sbatch_test_only(&cluster, &path);
    assert!(test_only.status.success(), "{}", describe(&test_only));
    let (path, _) = script(
        &project,
        &cluster,
        &repository,
        "two-gpus",
        &["--set", "gpus=2"],
    );
    let refused = sbatch_test_only(&cluster, &path);
    assert!(!refused.status.success(), "{}", describe(&refused));
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "plain", &["hello 1.0"]));
    project.build(&[]).success();
    let slurm = |args: &[&str]| {
        let mut all = vec![
            "slurm",
            "images/plain",
            "--repository",
            "registry.example/ml/plain",
        ];
        all.extend_from_slice(args);
        project.run(&all)
    };
    for (set, needle) in [
        (
            "partition=gpu; touch /tmp/x",
            "`--set partition=gpu; touch /tmp/x`",
        ),
        ("name=$(id)", "`--set name=$(id)`"),
        ("account=a\nb", "`--set account=a\nb`"),
        (
            "time=1 hour",
            "`--set time=1 hour` is not a Slurm time limit",
        ),
        ("memory=lots", "`--set memory=lots` is not a memory size"),
        ("cpus=0", "`--set cpus=0` must be a whole number above 0"),
        ("gpus=-1", "`--set gpus=-1` must be a whole number of GPUs"),
        ("gpus=a 100:1", "`--set gpus=a 100:1`"),
        ("tme=10", "did you mean `time`?"),
        ("command=", "names no program"),
        (
            "nodes=two",
            "`--set nodes=two` must be a whole number above 0",
        ),
        (
            "nodes=2-4",
            "`--set nodes=2-4` must be a whole number above 0",
        ),
        ("ntasks-per-node=$(id)", "`--set ntasks-per-node=$(id)`"),
        ("gpus-per-node=x y:1", "`--set gpus-per-node=x y:1`"),
        (
            "constraint=a\nb",
            "`--set constraint=a\nb` must be node features",
        ),
        ("constraint=$(id)", "`--set constraint=$(id)`"),
        ("qos=hi;gh", "`--set qos=hi;gh`"),
        (
            "exclusive=yes",
            "`--set exclusive=yes` must be `true` or `false`",
        ),
    ] {
        slurm(&["--set", set]).assert_failure_naming(1, &[needle]);
    }
    slurm(&["--env", "A-B=1"]).assert_failure_naming(1, &["`A-B` is not a shell variable name"]);
    // Volumes are clap's to refuse (exit 2), naming the value and why.
    for (volume, needle) in [
        ("/data/../etc:/x", "not an absolute path without `..`"),
        ("data:/x", "the host path `data`"),
        ("/a\nb:/x", "the host path `/a\\nb`"),
        ("/a,b:/x", "without `..` and `,`"),
        ("/a:/x:rx", "`rx` is neither `ro` nor `rw`"),
    ] {
        slurm(&["--volume", volume]).assert_failure_naming(2, &[needle]);
    }
    let two = slurm(&[
        "--set",
        "command=/opt/conda/bin/hello",
        "--set",
        "gpus=1",
        "--set",
        "gpus-per-node=1",
    ]);
    two.assert_failure_naming(
        1,
        &["`--set gpus` and `--set gpus-per-node` both ask for GPUs"],
    );
    // A scratch image without entrypoint or cmd would run nothing, under either runner.
    slurm(&[]).assert_failure_naming(1, &["has neither an entrypoint nor a cmd"]);
    slurm(&["--runner", "podman"])
        .assert_failure_naming(1, &["has neither an entrypoint nor a cmd"]);
    let run = project.run(&[
        "slurm",
        "images/plain",
        "--repository",
        "registry.example/ml/plain:v1",
        "--set",
        "command=/opt/conda/bin/hello",
    ]);
    run.assert_failure_naming(1, &["no tag, no digest"]);
    let ok = slurm(&[
        "--set",
        "command=/opt/conda/bin/hello",
        "--set",
        "gpus=a100:2",
    ])
    .success();
    assert!(
        ok.stdout.contains("#SBATCH --gres=gpu:a100:2"),
        "{}",
        ok.stdout
    );
    assert!(
        ok.stdout.contains("#SBATCH --job-name=plain"),
        "{}",
        ok.stdout
    );
}

/// The `srun --export` list a Pyxis script passes `--env` in, given to the real `srun` of the
/// test cluster: the step's tasks get each value exactly (a comma, shell metacharacters, a
/// newline), and the batch shell has none of them. (Pyxis reads the step's environment; it
/// is not packaged here, so the list is run with `srun` alone.)
#[test]
fn the_pyxis_export_list_reaches_the_step_as_slurm_splits_it() {
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| !have(t)).collect();
    if !missing.is_empty() {
        panic!(
            "{} are required: run tests/install-deps.sh",
            TOOLS.join(", ")
        );
    }
    require_root!("slurmd needs root to start jobs as their users");
    let project = Project::new();
    project.write_recipe(
        &tiny_recipe(shared_channel(), "envjob", &["hello 1.0"]).replace(
            "base = \"scratch\"",
            // An empty base: the script is not started here, only written into files.
            "base = \"scratch\"\nentrypoint = [\"/opt/conda/bin/hello\"]\ncheck-entrypoint = false",
        ),
    );
    project.build(&[]).success();
    let values = ["no", "a,b", "$(id) `id` ; x", "two\nlines"];
    let mut args = vec![
        "slurm".to_string(),
        "images/envjob".into(),
        "--repository".into(),
        "registry.example/ml/envjob".into(),
        "--set".into(),
        "gpus=0".into(),
    ];
    for (i, value) in values.iter().enumerate() {
        args.extend(["--env".to_string(), format!("P{i}={value}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = project.run(&args).success().stdout;
    // The `--export=` word as bash reads it from the script.
    let recorded = crate::hostile_generated::run_script(&project, &text, &[]);
    let export = recorded
        .args
        .iter()
        .find(|a| a.starts_with("--export="))
        .unwrap_or_else(|| panic!("no --export in {:?}", recorded.args))
        .clone();

    let cluster = Cluster::start();
    let job = cluster.path("export.sbatch");
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    fs_err::write(
        &job,
        format!(
            "#!/bin/bash\n#SBATCH --ntasks=1\nset -eu\n\
             [ -z \"${{P0+set}}\" ] || {{ echo 'P0 in the batch shell'; exit 7; }}\n\
             srun {} /usr/bin/env -0\n",
            quote(&export)
        ),
    )
    .unwrap();
    let output = submit(&cluster, &job, &[]);
    let env: Vec<&str> = output.split('\0').collect();
    for (i, value) in values.iter().enumerate() {
        let item = format!("P{i}={value}");
        assert!(
            env.contains(&item.as_str()),
            "{item:?} in the step's environment:\n{output}"
        );
    }
}

/// Panics naming what is missing of `tools` (CI installs them all).
fn require_tools(tools: &[&str]) {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    assert!(
        missing.is_empty(),
        "{} are required: run tests/install-deps.sh (missing: {})",
        tools.join(", "),
        missing.join(", ")
    );
}

/// An array task: records its id and node in the directory `$1`, then waits (a minute at
/// most) until a second task has started too. With one CPU a node, that one runs on another
/// node, so the tasks are spread however fast they end.
const ARRAY_TASK: &str = r#"#!/bin/sh
echo "$SLURM_ARRAY_TASK_ID $SLURMD_NODENAME" > "$1/$SLURM_ARRAY_TASK_ID"
i=0
while [ "$(ls "$1" | wc -l)" -lt 2 ] && [ "$i" -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
"#;

/// What the tasks of [`ARRAY_TASK`] wrote in `dir`, each task's node by its id, once all
/// four of `--array=0-3` have.
fn all_tasks_ran(dir: &Path) -> BTreeMap<String, String> {
    let mut ran = BTreeMap::new();
    for entry in fs_err::read_dir(dir).unwrap() {
        let text = fs_err::read_to_string(entry.unwrap().path()).unwrap();
        let (task, node) = text.trim().split_once(' ').unwrap_or((&text, ""));
        ran.insert(task.to_string(), node.to_string());
    }
    let all = ["0", "1", "2", "3"];
    assert!(ran.keys().map(String::as_str).eq(all), "{ran:?}");
    ran
}

/// `sbatch --parsable ARGS`: the id of the job it submitted.
fn sbatch_parsable(cluster: &Cluster, args: &[&str]) -> String {
    let id = run_ok(cluster.client("sbatch").arg("--parsable").args(args));
    id.trim().to_string()
}

/// `sbatch --wait --array=0-3` of [`ARRAY_TASK`]: the tasks ran on the cluster's nodes, on
/// two of them at least.
fn the_array_spreads_over_the_nodes(cluster: &Cluster, script: &Path) {
    let dir = cluster.path("waited");
    fs_err::create_dir(&dir).unwrap();
    let mut sbatch = cluster.client("timeout");
    sbatch.args(["300", "sbatch", "--wait", "--array=0-3"]);
    run_ok(sbatch.arg(script).arg(&dir));
    let ran = all_tasks_ran(&dir);
    let used: BTreeSet<&String> = ran.values().collect();
    assert!(
        used.iter().all(|node| cluster.nodes().contains(node)),
        "{ran:?}"
    );
    assert!(
        used.len() >= 2,
        "all tasks on one node: {ran:?}\n{}",
        cluster.logs()
    );
}

/// The array submitted without waiting, and a job with `--dependency=afterok:` on it that
/// lists what the tasks wrote: all of them end COMPLETED, and the list has every task's file.
fn a_dependent_runs_after_the_array(cluster: &Cluster, script: &Path) {
    let dir = cluster.path("chained");
    fs_err::create_dir(&dir).unwrap();
    let (script, dir_arg) = (script.display().to_string(), dir.display().to_string());
    let array = sbatch_parsable(cluster, &["--array=0-3", &script, &dir_arg]);
    let listed = cluster.path("dependent.out");
    let dependent = sbatch_parsable(
        cluster,
        &[
            &format!("--dependency=afterok:{array}"),
            &format!("--output={}", listed.display()),
            "--wrap",
            &format!("cat {dir_arg}/*"),
        ],
    );
    let jobs = cluster.wait_for_job(&array);
    let ours = |job: &&Job| job.get("ArrayJobId") == array || job.get("JobId") == dependent;
    let ended: Vec<&str> = jobs
        .iter()
        .filter(ours)
        .map(|j| j.get("JobState"))
        .collect();
    assert_eq!(ended, ["COMPLETED"; 5], "{jobs:#?}\n{}", cluster.logs());
    let expected: String = all_tasks_ran(&dir)
        .iter()
        .map(|(task, node)| format!("{task} {node}\n"))
        .collect();
    let listed = fs_err::read_to_string(&listed).unwrap();
    assert_eq!(listed, expected, "the dependent saw every task's file");
}

/// Two slurmd on this host as two nodes of one CPU each: an array's tasks run on both, and
/// a job that depends on the array starts once all its tasks have ended, seeing what they
/// wrote.
#[test]
fn an_array_runs_across_several_nodes() {
    require_tools(&[
        "slurmctld",
        "slurmd",
        "sbatch",
        "sinfo",
        "squeue",
        "scontrol",
        "munged",
    ]);
    require_root!("slurmd needs root to start jobs as their users");
    let cluster = Cluster::start_nodes(2);
    assert_eq!(cluster.nodes(), ["node1", "node2"]);
    let script = cluster.path("array.sbatch");
    fs_err::write(&script, ARRAY_TASK).unwrap();
    the_array_spreads_over_the_nodes(&cluster, &script);
    a_dependent_runs_after_the_array(&cluster, &script);
}
