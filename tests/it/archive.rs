//! `build --format docker-archive | oci-archive`: single-file images read by `podman load`
//! and skopeo, and run by podman and by runc.
//!
//! podman runs with the rlimits of `support::podman` (its default nofile is more than this
//! sandbox lets runc set); the same archive is also run with runc after `skopeo copy`.

use crate::{
    common::{LayoutView, Project, is_root, require_root, run_bundle, run_tool, unpack},
    support::{
        base::busybox_base_layout,
        channel::tiny_recipe,
        podman::{Podman, Storage},
        shared_channel,
    },
};

#[test]
fn docker_archive_loads_in_podman_and_runs() {
    let project = Project::new();
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let recipe = tiny_recipe(shared_channel(), "archived", &["hello 1.0"]).replace(
        "base = \"scratch\"",
        "base = \"oci:../base\"\nentrypoint = [\"/opt/conda/bin/hello\"]",
    );
    project.write_recipe(&recipe);
    let run = project.build(&["--format", "docker-archive"]).success();
    let archive = project.path().join("images/archived.docker.tar");
    assert!(
        run.stdout.contains("images/archived.docker.tar"),
        "{}",
        run.stdout
    );
    let layout = LayoutView::new(project.path().join("images/archived"));
    let diff_ids = layout.config()["rootfs"]["diff_ids"].clone();

    // A second build writes the same archive, byte for byte.
    let first = fs_err::read(&archive).unwrap();
    project.build(&["--format", "docker-archive"]).success();
    assert_eq!(fs_err::read(&archive).unwrap(), first);

    // podman loads it under its name, with our config and layers.
    let podman = Podman::new(&project.path().join("podman"), Storage::Vfs).unwrap();
    let podman = |args: &[&str]| podman.ok(args);
    let loaded = podman(&["load", "-i", archive.to_str().unwrap()]);
    assert!(
        loaded.contains("Loaded image: localhost/archived:latest"),
        "{loaded}"
    );
    let inspect: serde_json::Value =
        serde_json::from_str(&podman(&["image", "inspect", "archived:latest"])).unwrap();
    assert_eq!(
        inspect[0]["Config"]["Entrypoint"],
        serde_json::json!(["/opt/conda/bin/hello"])
    );
    assert_eq!(inspect[0]["RootFS"]["Layers"], diff_ids);
    if is_root() {
        // podman runs what it loaded: the entrypoint, on the busybox base.
        let ran = podman(&["run", "--rm", "--network", "none", "archived:latest"]);
        assert_eq!(ran, "hello from /opt/conda\n");
    }

    // The archive's image runs.
    let copied = project.path().join("from-archive");
    run_tool(
        "skopeo",
        &[
            "copy",
            &format!("docker-archive:{}", archive.display()),
            &format!("oci:{}:latest", copied.display()),
        ],
    );
    require_root!("runc needs root here");
    let bundle = project.path().join("bundle");
    unpack(&copied, "latest", &bundle);
    assert_eq!(run_bundle(&bundle, "archive"), "hello from /opt/conda\n");
}

#[test]
fn oci_archive_is_the_same_image() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "ociarch", &["hello 1.0"]));
    let run = project.build(&["--format", "oci-archive"]).success();
    let archive = project.path().join("images/ociarch.oci.tar");
    let inspect: serde_json::Value = serde_json::from_str(&run_tool(
        "skopeo",
        &[
            "inspect",
            &format!("oci-archive:{}:latest", archive.display()),
        ],
    ))
    .unwrap();
    assert_eq!(inspect["Digest"].as_str().unwrap(), run.digest());
}
