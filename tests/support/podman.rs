//! podman with configuration and storage of its own, as the tests and the bench's node run
//! it: the host's containers.conf, storage.conf and images are neither read nor touched.
//!
//! The settings go through `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF`, so whatever
//! podman a test starts indirectly (a Slurm job's runner script) sees the same ones:
//! - cgroupfs and no events log: there is no systemd here;
//! - runc, the runtime Debian's podman and the other tests use;
//! - a runtime directory of its own (`tmp_dir`, else `/run/libpod`, shared by every podman
//!   on the machine): `system reset` of one instance then leaves the others' containers
//!   running;
//! - container rlimits no higher than this sandbox's: its processes lack CAP_SYS_RESOURCE,
//!   and podman's default nofile of 1048576 makes runc fail with EPERM.
//!
//! Shared by the integration tests and `examples/bench.rs` (through `#[path]`), so it uses
//! the standard library only.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// How podman stores images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    /// Plain copies of every layer: works wherever podman does.
    Vfs,
    /// overlay (needs root), with containers/storage's partial pulls on or off; the pull
    /// options are the ones issue 20 gives.
    Overlay { partial_pulls: bool },
}

/// podman whose configuration and storage live under one directory.
pub(crate) struct Podman {
    dir: PathBuf,
    storage: Storage,
}

impl Podman {
    /// podman keeping everything under `dir`, which starts empty: storage left there by an
    /// earlier run is reset first.
    pub(crate) fn new(dir: &Path, storage: Storage) -> std::io::Result<Podman> {
        let podman = Podman {
            dir: dir.to_path_buf(),
            storage,
        };
        if dir.exists() {
            podman.reset();
            fs_err::remove_dir_all(dir)?;
        }
        fs_err::create_dir_all(dir)?;
        fs_err::write(podman.containers_conf(), podman.containers_text())?;
        fs_err::write(podman.storage_conf(), podman.storage_text())?;
        Ok(podman)
    }

    fn containers_conf(&self) -> PathBuf {
        self.dir.join("containers.conf")
    }

    fn storage_conf(&self) -> PathBuf {
        self.dir.join("storage.conf")
    }

    fn containers_text(&self) -> String {
        format!(
            "[containers]\n\
             default_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
             [engine]\n\
             cgroup_manager = \"cgroupfs\"\n\
             events_logger = \"none\"\n\
             runtime = \"runc\"\n\
             tmp_dir = \"{}\"\n",
            self.dir.join("tmp").display()
        )
    }

    fn driver(&self) -> &'static str {
        match self.storage {
            Storage::Vfs => "vfs",
            Storage::Overlay { .. } => "overlay",
        }
    }

    fn storage_text(&self) -> String {
        let options = match self.storage {
            Storage::Vfs => String::new(),
            Storage::Overlay { partial_pulls } => format!(
                "[storage.options]\npull_options = {{enable_partial_images = \"{partial_pulls}\", \
                 use_hard_links = \"false\", ostree_repos = \"\"}}\n"
            ),
        };
        format!(
            "[storage]\ndriver = \"{}\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n{options}",
            self.driver(),
            self.dir.join("root").display(),
            self.dir.join("run").display(),
        )
    }

    /// skopeo's name for `image` in this storage.
    pub(crate) fn storage_reference(&self, image: &str) -> String {
        format!(
            "containers-storage:[{}@{}+{}]{image}",
            self.driver(),
            self.dir.join("root").display(),
            self.dir.join("run").display()
        )
    }

    /// The environment that points podman at this configuration, for a process that runs
    /// podman itself.
    pub(crate) fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("CONTAINERS_CONF", self.containers_conf()),
            ("CONTAINERS_STORAGE_CONF", self.storage_conf()),
        ]
    }

    /// `podman ARGS` with this configuration, not started.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("podman");
        command.envs(self.env()).args(args);
        command
    }

    /// Runs `podman ARGS`: its stdout, or on failure a message with both its outputs.
    pub(crate) fn run(&self, args: &[&str]) -> Result<String, String> {
        let output = self
            .command(args)
            .output()
            .map_err(|e| format!("running podman {args:?}: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "podman {args:?} failed ({}):\n{stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// As [`Podman::run`], panicking on failure.
    #[track_caller]
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        self.run(args).unwrap_or_else(|message| panic!("{message}"))
    }

    /// Removes every image and container of this storage (overlay leaves mounts that a plain
    /// directory removal cannot undo).
    fn reset(&self) {
        let _ = self.command(&["system", "reset", "--force"]).output();
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        self.reset();
        let _ = fs_err::remove_dir_all(&self.dir);
    }
}
