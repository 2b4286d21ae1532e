//! `recipes/imgbuild-builder.toml` (issue 4 part 4): imgbuild, packaged as a conda package,
//! is built into an image by its own recipe, and that image, run under runc as an
//! unprivileged user with nothing but two writable directories, builds an image from a lock:
//! the same manifest digest as the build of that lock on the host. This is what each pod of
//! `imgbuild k8s --build-job` does.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, require_root, unpack},
    support::{
        base::{debian_base_layout, host_debian_suite},
        channel::{index_channel, tiny_recipe, write_imgbuild_package},
        imgbuild_bin, shared_channel, smoke_exe, test_cache_dir,
    },
};

/// The uid the build job's pods run as.
const POD_UID: u64 = 1000;

fn open_dir(path: &Path) {
    fs_err::create_dir_all(path).unwrap();
    fs_err::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
}

#[test]
fn the_builder_image_builds_the_same_image_unprivileged_in_a_container() {
    let project = Project::new();

    // imgbuild as a conda package, in a channel of its own.
    let channel = project.path().join("builder-channel");
    fs_err::create_dir_all(channel.join("noarch")).unwrap();
    let package = write_imgbuild_package(
        &channel.join("linux-64"),
        &imgbuild_bin(),
        smoke_exe(),
        "0.1.0",
    )
    .unwrap();
    index_channel(&channel).unwrap();
    assert!(
        package
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("imgbuild-0.1.0-h")
    );

    // The repository's recipe, with a base we can make here (this machine's Debian release:
    // its glibc is what the test binary needs) instead of distroless from a registry.
    let base = project.path().join("base");
    let suite = host_debian_suite().unwrap();
    debian_base_layout(&base, &test_cache_dir(), &suite, &["libc6", "libgcc-s1"]).unwrap();
    let recipe = fs_err::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/imgbuild-builder.toml"),
    )
    .unwrap();
    let distroless = "base = \"gcr.io/distroless/cc-debian12:nonroot\"";
    assert!(recipe.contains(distroless), "{recipe}");
    let recipe = recipe
        .replace(distroless, "base = \"oci:../base\"")
        .replace(
            "\"../images/.builder-channel\"",
            &format!("\"{}\"", channel.display()),
        );
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let layout = project.path().join("images/imgbuild-builder");
    let config = LayoutView::new(&layout).config();
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/opt/imgbuild/bin/imgbuild"])
    );
    assert_eq!(config["config"]["User"], "65532:65532");

    // The image to build inside: locked and built on the host first.
    let inner = Project::new();
    inner.write_recipe(&tiny_recipe(shared_channel(), "inner", &["hello 1.0"]));
    let host_digest = inner.build(&[]).success().digest();

    require_root!("runc needs root to run a container here");
    // The pod: its own work and cache directories, the recipe and lock (the ConfigMap), the
    // local channel at the path the lock names, and no root.
    let work = project.path().join("pod-work");
    let cache = project.path().join("pod-cache");
    open_dir(&work);
    open_dir(&work.join("recipes"));
    open_dir(&cache);
    for file in ["image.toml", "image.lock"] {
        fs_err::copy(
            inner.path().join("recipes").join(file),
            work.join("recipes").join(file),
        )
        .unwrap();
    }
    let bundle = project.path().join("bundle");
    unpack(&layout, "latest", &bundle);
    let config_path = bundle.join("config.json");
    let mut runtime: Value = serde_json::from_slice(&fs_err::read(&config_path).unwrap()).unwrap();
    runtime["process"]["terminal"] = false.into();
    runtime["process"]["user"] = serde_json::json!({ "uid": POD_UID, "gid": POD_UID });
    runtime["process"]["args"] = serde_json::json!([
        "/opt/imgbuild/bin/imgbuild",
        "build",
        "/work/recipes/image.toml",
        "--locked",
    ]);
    let mounts = runtime["mounts"].as_array_mut().unwrap();
    for (source, destination, mode) in [
        (work.as_path(), Path::new("/work"), "rw"),
        (cache.as_path(), Path::new("/cache"), "rw"),
        (shared_channel(), shared_channel(), "ro"),
    ] {
        mounts.push(serde_json::json!({
            "destination": destination,
            "type": "bind",
            "source": source,
            "options": ["rbind", mode],
        }));
    }
    fs_err::write(&config_path, serde_json::to_vec(&runtime).unwrap()).unwrap();
    let output = std::process::Command::new("runc")
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(format!("imgbuild-builder-{}", std::process::id()))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("images/inner:latest@{host_digest}")),
        "the pod's build has the host build's digest {host_digest}:\n{stdout}\n{stderr}"
    );
    assert_eq!(
        fs_err::read(work.join("images/inner/index.json")).unwrap(),
        fs_err::read(inner.path().join("images/inner/index.json")).unwrap()
    );
    // Everything the pod wrote belongs to the pod's user.
    let owner = std::os::unix::fs::MetadataExt::uid(
        &fs_err::metadata(work.join("images/inner/index.json")).unwrap(),
    );
    assert_eq!(u64::from(owner), POD_UID);
}
