//! containerd 1.6 (Debian's `containerd` and `ctr`), the runtime of Kubernetes nodes, pulls
//! imgbuild images from the local registry and runs them, for each layer format: gzip, zstd,
//! eStargz and zstd:chunked. Its unpacker checks every layer's diff_id against the config as it applies
//! it, so a wrong diff_id fails the pull. The test starts a containerd of its own (its own
//! root, state and socket; overlayfs snapshots, runc), as root.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    common::{Project, is_root},
    registry::{Auth, Registry},
    support::{
        base::{busybox_base_layout, have},
        channel::tiny_recipe,
        shared_channel,
    },
};

/// A containerd process with its own directories, stopped on drop.
pub(crate) struct Containerd {
    pub socket: PathBuf,
    child: Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start() -> Containerd {
        Self::start_with("")
    }

    /// containerd with `extra` appended to its configuration (a proxy snapshotter).
    pub fn start_with(extra: &str) -> Containerd {
        let dir = tempfile::tempdir().unwrap();
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
        .unwrap();
        let log = fs_err::File::create(dir.path().join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log.into_file()))
            .spawn()
            .unwrap();
        let started = Instant::now();
        let containerd = Containerd { socket, child, dir };
        while !containerd.ctr(&["version"]).status.success() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "containerd did not start:\n{}",
                containerd.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        containerd
    }

    /// What containerd wrote to its log so far.
    pub fn log(&self) -> String {
        fs_err::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    #[track_caller]
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let output = self.ctr(args);
        assert!(
            output.status.success(),
            "ctr {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the image on the busybox `base` with `compression` and pushes it to `target`.
fn build_and_push(base: &Path, compression: &str, target: &str) {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "node", &["hello 1.0", "pyhello"]).replace(
        "base = \"scratch\"",
        &format!(
            "base = \"oci:{}:latest\"\nentrypoint = [\"/bin/sh\", \"-c\", \"hello; echo layers={compression}\"]",
            base.display()
        ),
    ) + &format!("\n[layers]\ncompression = \"{compression}\"\n");
    project.write_recipe(&recipe);
    project.build(&[]).success();
    project
        .run(&["push", "images/node", target, "--insecure"])
        .success();
}

#[test]
fn containerd_pulls_and_runs_gzip_zstd_estargz_and_zstd_chunked_images() {
    if !is_root() {
        eprintln!("skipped: containerd runs containers as root here");
        return;
    }
    assert!(
        have("containerd") && have("ctr") && have("runc"),
        "containerd, ctr and runc are required: run tests/install-deps.sh"
    );
    let registry = Registry::start(Auth::None);
    let containerd = Containerd::start();
    let base_dir = tempfile::tempdir().unwrap();
    let base = base_dir.path().join("busybox");
    busybox_base_layout(&base).unwrap();
    for compression in ["gzip", "zstd", "estargz", "zstd:chunked"] {
        let target = format!(
            "{}/node/{}:v1",
            registry.host,
            compression.replace(':', "-")
        );
        build_and_push(&base, compression, &target);
        containerd.ctr_ok(&["images", "pull", "--plain-http", &target]);
        let name = format!("run-{}", compression.replace(':', "-"));
        let ran = containerd.ctr_ok(&["run", "--rm", &target, &name]);
        eprintln!("ctr run {target}:\n{ran}");
        assert!(ran.contains("hello from /opt/conda"), "{ran}");
        assert!(ran.contains(&format!("layers={compression}")), "{ran}");
    }
}
