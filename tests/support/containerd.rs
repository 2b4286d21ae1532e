//! containerd 1.6 (Debian's `containerd`, `ctr`) as a Kubernetes node runs it, and the stargz
//! snapshotter beside it, each with directories of its own and stopped on drop. Shared by
//! the integration tests and `examples/bench.rs` (through `#[path]`), so it uses the standard
//! library, tempfile, fs_err and libc only, and reports failures as text.
//!
//! Debian packages the snapshotter's client (`ctr-remote`) and its Go library but no daemon:
//! [`StargzSnapshotter::build`] makes one from `tests/tools/stargz-snapshotter` with Debian's
//! Go, offline (`super::go`).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

/// A bound on waiting for a daemon to come up, not a timing: one that never does must fail.
const START_LIMIT: Duration = Duration::from_secs(60);

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A containerd process with its own root, state and socket.
pub(crate) struct Containerd {
    pub socket: PathBuf,
    child: Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// containerd with overlayfs snapshots and runc, `extra` appended to its configuration
    /// (a proxy snapshotter).
    #[allow(clippy::disallowed_methods, reason = "Stdio takes a std::fs::File")]
    pub(crate) fn start(extra: &str) -> Result<Containerd, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let socket = dir.path().join("containerd.sock");
        let config = dir.path().join("config.toml");
        fs_err::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 [grpc]\n  address = \"{socket}\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  disable_tcp_service = true\n{extra}",
                root = dir.path().join("root").display(),
                state = dir.path().join("state").display(),
                socket = socket.display(),
            ),
        )
        .map_err(|e| e.to_string())?;
        let log =
            std::fs::File::create(dir.path().join("containerd.log")).map_err(|e| e.to_string())?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("starting containerd: {e}"))?;
        let containerd = Containerd { socket, child, dir };
        let started = Instant::now();
        while containerd.ctr(&["version"]).is_err() {
            if started.elapsed() > START_LIMIT {
                return Err(format!("containerd did not start:\n{}", containerd.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(containerd)
    }

    /// What containerd wrote to its log so far.
    pub(crate) fn log(&self) -> String {
        fs_err::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `PROGRAM --address SOCKET ARGS` (`ctr` or `ctr-remote`): its stdout, or on failure a
    /// message with both outputs.
    pub(crate) fn client(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let output = Command::new(program)
            .arg("--address")
            .arg(&self.socket)
            .args(args)
            .output()
            .map_err(|e| format!("running {program}: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!("{program} {args:?} failed:\n{}", text(&output)))
        }
    }

    pub(crate) fn ctr(&self, args: &[&str]) -> Result<String, String> {
        self.client("ctr", args)
    }

    /// As [`Containerd::ctr`], panicking on failure.
    #[track_caller]
    pub(crate) fn ctr_ok(&self, args: &[&str]) -> String {
        self.ctr(args).unwrap_or_else(|message| panic!("{message}"))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stargz snapshotter daemon on its own socket and root. Dropping it sends SIGTERM, which
/// unmounts its FUSE layers, then lazily unmounts any it left.
pub(crate) struct StargzSnapshotter {
    pub socket: PathBuf,
    root: PathBuf,
    child: Child,
    log: PathBuf,
}

impl StargzSnapshotter {
    /// Builds the daemon into `dir` (Go's build cache kept there too, so a second build
    /// takes seconds) and returns its path.
    pub(crate) fn build(dir: &Path) -> Result<PathBuf, String> {
        fs_err::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = dir.join("stargz-snapshotter");
        super::go::build_tool("stargz-snapshotter", &out, &dir.join("gocache"))?;
        Ok(out)
    }

    /// The daemon `bin` with its socket, root and log under `dir`, once it listens.
    #[allow(clippy::disallowed_methods, reason = "Stdio takes a std::fs::File")]
    pub(crate) fn start(bin: &Path, dir: &Path) -> Result<StargzSnapshotter, String> {
        let socket = dir.join("stargz.sock");
        let root = dir.join("stargz");
        let log = dir.join("stargz.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg("-address")
            .arg(&socket)
            .arg("-root")
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let snapshotter = StargzSnapshotter {
            socket,
            root,
            child,
            log,
        };
        let started = Instant::now();
        while !snapshotter.socket.exists() {
            if started.elapsed() > START_LIMIT {
                return Err(format!(
                    "the snapshotter never listened:\n{}",
                    snapshotter.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(snapshotter)
    }

    /// containerd configuration that makes this daemon the `stargz` snapshotter.
    pub(crate) fn proxy_plugin(&self) -> String {
        format!(
            "[proxy_plugins]\n  [proxy_plugins.stargz]\n    type = \"snapshot\"\n    address = \"{}\"\n",
            self.socket.display()
        )
    }

    pub(crate) fn log(&self) -> String {
        fs_err::read_to_string(&self.log).unwrap_or_default()
    }

    /// The FUSE mounts under the snapshotter's root: one per lazily mounted layer.
    pub(crate) fn fuse_mounts(&self) -> Vec<String> {
        let mounts = fs_err::read_to_string("/proc/self/mounts").unwrap_or_default();
        let root = self.root.display().to_string();
        mounts
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields.len() > 2 && fields[2].starts_with("fuse") && fields[1].starts_with(&root))
                    .then(|| fields[1].to_string())
            })
            .collect()
    }
}

impl Drop for StargzSnapshotter {
    fn drop(&mut self) {
        // SAFETY: kill only sends a signal to the child this value started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        for mount in self.fuse_mounts() {
            let _ = Command::new("umount").args(["-l", &mount]).status();
        }
    }
}
