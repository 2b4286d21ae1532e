//! The node side of `just bench`: podman on this machine pulling the bench images from a
//! local `docker-registry`, as a GPU node pulls them, with partial pulls off and on. Bytes
//! are what the registry's access log says it sent for blobs; times are wall seconds.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};

use super::{
    containerd::{Containerd, StargzSnapshotter},
    podman::{Podman, Storage},
};

/// A registry that logs every response (status and bytes written) to a file.
pub(crate) struct LoggingRegistry {
    pub host: String,
    child: Child,
    log: PathBuf,
}

impl LoggingRegistry {
    pub(crate) fn start(dir: &Path) -> anyhow::Result<LoggingRegistry> {
        Self::start_logging(dir, "info")
    }

    /// A registry logging at `level` (`error` logs no responses).
    pub(crate) fn start_logging(dir: &Path, level: &str) -> anyhow::Result<LoggingRegistry> {
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
    pub(crate) fn mark(&self) -> u64 {
        fs_err::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// Blob bytes sent since `mark`, and how many responses were 206 (ranges).
    pub(crate) fn sent_since(&self, mark: u64) -> anyhow::Result<(u64, usize)> {
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

/// A node: podman with empty overlay storage under `dir`, partial pulls on or off.
pub(crate) fn node(dir: &Path, partial_pulls: bool) -> anyhow::Result<Podman> {
    Podman::new(dir, Storage::Overlay { partial_pulls })
        .with_context(|| format!("setting up podman in {}", dir.display()))
}

/// Seconds `podman ARGS` took on `node`; fails on a failed command.
fn timed(node: &Podman, args: &[&str]) -> anyhow::Result<f64> {
    let started = Instant::now();
    node.run(args).map_err(anyhow::Error::msg)?;
    Ok(started.elapsed().as_secs_f64())
}

fn pull(node: &Podman, reference: &str) -> anyhow::Result<f64> {
    timed(node, &["pull", "--quiet", "--tls-verify=false", reference])
}

/// Seconds from nothing on the node to the image's first command having run: the pull,
/// then `podman run --rm IMAGE /bin/sh -c :` (the busybox base's shell doing nothing).
pub(crate) fn first_command(node: &Podman, reference: &str) -> anyhow::Result<f64> {
    timed(
        node,
        &[
            "run",
            "--rm",
            "--tls-verify=false",
            "--pull",
            "always",
            "--network",
            "none",
            reference,
            "/bin/sh",
            "-c",
            ":",
        ],
    )
}

/// One node measurement: what was pulled, the bytes the registry sent, the seconds.
pub(crate) struct Pull {
    pub what: String,
    pub bytes: u64,
    pub ranges: usize,
    pub seconds: f64,
}

/// Pulls `reference` on `node` and measures it against `registry`'s log.
pub(crate) fn measure_pull(
    what: &str,
    registry: &LoggingRegistry,
    node: &Podman,
    reference: &str,
) -> anyhow::Result<Pull> {
    eprintln!("measuring: node: {what}");
    let mark = registry.mark();
    let seconds = pull(node, reference)?;
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

/// From nothing on a containerd node to the image's first command having run, and the
/// blob bytes sent meanwhile: `pull` (an image pull of `reference`), then `ctr run --rm`
/// of `command` with `snapshotter`.
pub(crate) fn containerd_first_command(
    what: &str,
    registry: &LoggingRegistry,
    containerd: &Containerd,
    pull: (&str, &[&str]),
    snapshotter: &str,
    reference: &str,
    command: &[&str],
) -> anyhow::Result<Pull> {
    eprintln!("measuring: node: {what}");
    let mark = registry.mark();
    let started = Instant::now();
    let (program, args) = pull;
    containerd
        .client(program, args)
        .map_err(anyhow::Error::msg)?;
    let mut run = vec![
        "run",
        "--rm",
        "--snapshotter",
        snapshotter,
        reference,
        "first",
    ];
    run.extend(command);
    containerd.ctr(&run).map_err(anyhow::Error::msg)?;
    let seconds = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(200));
    let (bytes, ranges) = registry.sent_since(mark)?;
    Ok(Pull {
        what: what.to_string(),
        bytes,
        ranges,
        seconds,
    })
}

/// The first command of the eStargz image `reference` under containerd 1.6, with a full pull
/// (overlayfs) and with the stargz snapshotter mounting it lazily (built into `work`).
pub(crate) fn lazy_rows(
    registry: &LoggingRegistry,
    work: &Path,
    reference: &str,
    command: &[&str],
) -> anyhow::Result<Vec<Pull>> {
    let full = Containerd::start("").map_err(anyhow::Error::msg)?;
    let full_row = containerd_first_command(
        "nothing on the node → first command ran, estargz, containerd 1.6 (full pull)",
        registry,
        &full,
        ("ctr", &["image", "pull", "--plain-http", reference]),
        "overlayfs",
        reference,
        command,
    )?;
    drop(full);
    let bin =
        StargzSnapshotter::build(&work.join("stargz-snapshotter")).map_err(anyhow::Error::msg)?;
    let node = tempfile::tempdir()?;
    let snapshotter = StargzSnapshotter::start(&bin, node.path()).map_err(anyhow::Error::msg)?;
    let lazy = Containerd::start(&snapshotter.proxy_plugin()).map_err(anyhow::Error::msg)?;
    let lazy_row = containerd_first_command(
        "nothing on the node → first command ran, estargz, containerd 1.6 + stargz snapshotter (lazy)",
        registry,
        &lazy,
        ("ctr-remote", &["image", "rpull", "--plain-http", reference]),
        "stargz",
        reference,
        command,
    )?;
    ensure!(
        !snapshotter.fuse_mounts().is_empty(),
        "the stargz snapshotter mounted nothing: the pull was not lazy\n{}",
        snapshotter.log()
    );
    Ok(vec![full_row, lazy_row])
}
