//! The node side of `just bench`: podman on this machine pulling the bench images from a
//! local `docker-registry`, as a GPU node pulls them, with partial pulls off and on. Bytes
//! are what the registry's access log says it sent for blobs; times are wall seconds.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};

/// A registry that logs every response (status and bytes written) to a file.
pub struct LoggingRegistry {
    pub host: String,
    child: Child,
    log: PathBuf,
}

impl LoggingRegistry {
    pub fn start(dir: &Path) -> anyhow::Result<LoggingRegistry> {
        Self::start_logging(dir, "info")
    }

    /// A registry logging at `level` (`error` logs no responses).
    pub fn start_logging(dir: &Path, level: &str) -> anyhow::Result<LoggingRegistry> {
        fs_err::create_dir_all(dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let config = dir.join("config.yml");
        fs_err::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: {level}\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )?;
        let log = dir.join("registry.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(fs_err::File::create(&log)?.into_file()))
            .spawn()?;
        let host = format!("127.0.0.1:{port}");
        let started = Instant::now();
        while std::net::TcpStream::connect(&host).is_err() {
            ensure!(
                started.elapsed() < Duration::from_secs(20),
                "docker-registry did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(LoggingRegistry { host, child, log })
    }

    /// Where the log ends now: [`Self::sent_since`] counts from here.
    pub fn mark(&self) -> u64 {
        fs_err::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// Blob bytes sent since `mark`, and how many responses were 206 (ranges).
    pub fn sent_since(&self, mark: u64) -> anyhow::Result<(u64, usize)> {
        let log = fs_err::read(&self.log)?;
        let text = String::from_utf8_lossy(&log[mark as usize..]);
        Ok(super::registry_log::bytes_sent(&text, "/blobs/sha256:"))
    }
}

impl Drop for LoggingRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// podman with storage of its own (overlay), partial pulls on or off.
pub struct Podman {
    conf: PathBuf,
    dir: PathBuf,
}

impl Podman {
    /// A node with empty storage under `dir`.
    pub fn new(dir: &Path, partial: bool) -> anyhow::Result<Podman> {
        if dir.exists() {
            let _ = Command::new("podman")
                .env("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"))
                .args(["system", "reset", "--force"])
                .output();
            fs_err::remove_dir_all(dir)?;
        }
        fs_err::create_dir_all(dir)?;
        let conf = dir.join("storage.conf");
        fs_err::write(
            &conf,
            format!(
                "[storage]\ndriver = \"overlay\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n\
                 [storage.options]\npull_options = {{enable_partial_images = \"{partial}\", use_hard_links = \"false\", ostree_repos = \"\"}}\n",
                dir.join("run").display(),
                dir.join("root").display()
            ),
        )?;
        Ok(Podman {
            conf,
            dir: dir.to_path_buf(),
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("podman");
        command
            .env("CONTAINERS_STORAGE_CONF", &self.conf)
            .args(["--events-backend", "none", "--cgroup-manager", "cgroupfs"])
            .args(args);
        command
    }

    /// Seconds `podman ARGS` took; fails on a failed command.
    pub fn timed(&self, args: &[&str]) -> anyhow::Result<f64> {
        let started = Instant::now();
        let output = self.command(args).output()?;
        ensure!(
            output.status.success(),
            "podman {args:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(started.elapsed().as_secs_f64())
    }

    pub fn pull(&self, reference: &str) -> anyhow::Result<f64> {
        self.timed(&["pull", "--quiet", "--tls-verify=false", reference])
    }

    /// Seconds from nothing on the node to the image's first command having run: the pull,
    /// then `podman run --rm IMAGE /bin/sh -c :` (the busybox base's shell doing nothing).
    pub fn first_command(&self, reference: &str) -> anyhow::Result<f64> {
        self.timed(&[
            "run",
            "--rm",
            "--tls-verify=false",
            "--pull",
            "always",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--network",
            "none",
            reference,
            "/bin/sh",
            "-c",
            ":",
        ])
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.command(&["system", "reset", "--force"]).output();
        let _ = fs_err::remove_dir_all(&self.dir);
    }
}

/// One node measurement: what was pulled, the bytes the registry sent, the seconds.
pub struct Pull {
    pub what: String,
    pub bytes: u64,
    pub ranges: usize,
    pub seconds: f64,
}

/// Pulls `reference` on `node` and measures it against `registry`'s log.
pub fn measure_pull(
    what: &str,
    registry: &LoggingRegistry,
    node: &Podman,
    reference: &str,
) -> anyhow::Result<Pull> {
    eprintln!("measuring: node: {what}");
    let mark = registry.mark();
    let seconds = node.pull(reference)?;
    // The registry writes its line after the response; give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    let (bytes, ranges) = registry.sent_since(mark).context("the registry's log")?;
    Ok(Pull {
        what: what.to_string(),
        bytes,
        ranges,
        seconds,
    })
}
