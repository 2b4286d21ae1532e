//! containerd 1.6 (Debian's `containerd` and `ctr`), the runtime of Kubernetes nodes, pulls
//! imgbuild images from the local registry and runs them, for each layer format: gzip, zstd,
//! eStargz and zstd:chunked. Its unpacker checks every layer's diff_id against the config as it applies
//! it, so a wrong diff_id fails the pull. The test starts a containerd of its own (its own
//! root, state and socket; overlayfs snapshots, runc), as root.

use std::path::Path;

use crate::{
    common::{Project, require_root},
    registry::{Auth, Registry},
    support::{
        base::{busybox_base_layout, have},
        channel::tiny_recipe,
        containerd::Containerd,
        shared_channel,
    },
};

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
    require_root!("containerd runs containers as root here");
    assert!(
        have("containerd") && have("ctr") && have("runc"),
        "containerd, ctr and runc are required: run tests/install-deps.sh"
    );
    let registry = Registry::start(Auth::None);
    let containerd = Containerd::start("").unwrap();
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
