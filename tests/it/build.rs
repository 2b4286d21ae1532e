//! A build end to end, checked by real consumers: umoci, oci-image-tool, skopeo, runc.

use std::{io::Read, path::Path};

use sha2::{Digest, Sha256};

use crate::{
    common::{
        LayoutView, Project, env_of, require_root, run_bundle, run_tool, unpack, validate_layout,
    },
    support::{
        base::{busybox_base_layout, have},
        channel::{PLACEHOLDER, cuda_runtime_wheel, tiny_recipe},
        shared_channel, test_cache_dir,
    },
};

const DEPS: &[&str] = &["hello 1.0", "pyhello", "_r-mutex"];

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The real `libcudart.so.11.0` from NVIDIA's wheel.
fn wheel_libcudart() -> Vec<u8> {
    let wheel = cuda_runtime_wheel(&test_cache_dir()).unwrap();
    let mut archive = zip::ZipArchive::new(fs_err::File::open(wheel).unwrap()).unwrap();
    let mut member = archive
        .by_name("nvidia/cuda_runtime/lib/libcudart.so.11.0")
        .unwrap();
    let mut bytes = Vec::new();
    member.read_to_end(&mut bytes).unwrap();
    bytes
}

#[test]
fn build_is_accepted_by_umoci_oci_image_tool_and_skopeo() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "tiny", DEPS));
    let run = project.build(&[]).success();
    let layout_dir = project.path().join("images/tiny");
    let layout = LayoutView::new(&layout_dir);
    assert_eq!(run.digest(), layout.manifest_digest());
    assert_eq!(
        run.stdout.trim(),
        format!("images/tiny:latest@{}", layout.manifest_digest())
    );

    // oci-image-tool checks the layout, the manifest, the config and every descriptor.
    let layout_arg = layout_dir.to_str().unwrap();
    validate_layout(layout_arg);

    // skopeo reads the same digest and layers.
    let inspect: serde_json::Value = serde_json::from_str(&run_tool(
        "skopeo",
        &["inspect", &format!("oci:{layout_arg}:latest")],
    ))
    .unwrap();
    assert_eq!(inspect["Digest"], layout.manifest_digest());
    assert_eq!(inspect["Architecture"], "amd64");
    let layer_digests: Vec<String> = layout.layers().into_iter().map(|(_, d)| d).collect();
    assert_eq!(inspect["Layers"], serde_json::json!(layer_digests));

    // One layer per package (cuda-cudart, hello, pyhello, python, _r-mutex), CUDA runtime
    // lowest, then the image's own layer.
    let packages: Vec<String> = layout.layers().into_iter().map(|(p, _)| p).collect();
    assert_eq!(packages.len(), 6, "{packages:?}");
    assert_eq!(packages[0], "cuda-cudart-11.8.89-h0_0");
    assert_eq!(packages[5], "", "the last layer is the image's own");
    let mut sorted = packages[..5].to_vec();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "_r-mutex-1.0.1-anacondar_1",
            "cuda-cudart-11.8.89-h0_0",
            "hello-1.0-h0_0",
            "pyhello-1.0-pyh0_0",
            "python-3.9.18-h0_0"
        ]
    );
    let config = layout.config();
    assert_eq!(config["rootfs"]["diff_ids"].as_array().unwrap().len(), 6);
    assert_eq!(config["history"].as_array().unwrap().len(), 6);
    let env = env_of(&config);
    assert!(env.contains(&"CONDA_PREFIX=/opt/conda"), "{env:?}");
    assert!(
        env.iter().any(|e| e.starts_with("PATH=/opt/conda/bin:")),
        "{env:?}"
    );
    // Without SOURCE_DATE_EPOCH, `created` is the newest package build time of the lock.
    assert_eq!(config["created"], "2023-10-01T00:00:00Z");

    // umoci, the strictest reader, unpacks it; the files are where they belong.
    let bundle = project.path().join("bundle");
    let rootfs = unpack(&layout_dir, "latest", &bundle);
    let prefix = rootfs.join("opt/conda");
    assert_eq!(
        fs_err::read_to_string(prefix.join("etc/hello.conf")).unwrap(),
        "prefix=/opt/conda/share/hello\n"
    );
    assert!(
        fs_err::read_to_string(prefix.join("bin/hello"))
            .unwrap()
            .contains("hello from /opt/conda")
    );
    // The binary placeholder is replaced in place: same length, NUL-padded.
    let data = fs_err::read(prefix.join("lib/libhello.data")).unwrap();
    let at = data
        .windows(b"/opt/conda/".len())
        .position(|w| w == b"/opt/conda/")
        .expect("in-image prefix in the binary file");
    assert!(
        !data
            .windows(PLACEHOLDER.len())
            .any(|w| w == PLACEHOLDER.as_bytes())
    );
    let end = at + data[at..].iter().position(|b| *b == 0).unwrap();
    assert!(
        std::str::from_utf8(&data[at..end])
            .unwrap()
            .starts_with("/opt/conda/")
    );
    // noarch python: in the target's site-packages, with an entry point for the image.
    assert!(
        prefix
            .join("lib/python3.9/site-packages/pyhello/__init__.py")
            .is_file()
    );
    assert!(
        fs_err::read_to_string(prefix.join("bin/pyhello"))
            .unwrap()
            .starts_with("#!/opt/conda/bin/python3.9\n")
    );
    // The real CUDA runtime, byte for byte, with its symlink.
    let libcudart = fs_err::read(prefix.join("lib/libcudart.so.11.0")).unwrap();
    assert_eq!(&libcudart[..4], b"\x7fELF");
    assert_eq!(sha256_hex(&libcudart), sha256_hex(&wheel_libcudart()));
    assert_eq!(
        fs_err::read_link(prefix.join("lib/libcudart.so")).unwrap(),
        Path::new("libcudart.so.11.0")
    );
    // conda-meta: readable by any user, and free of the build host's paths.
    assert!(!prefix.join("CACHEDIR.TAG").exists());
    for entry in fs_err::read_dir(prefix.join("conda-meta")).unwrap() {
        let entry = entry.unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", entry.path().display());
        let text = fs_err::read_to_string(entry.path()).unwrap();
        for host in [
            project.path().to_str().unwrap(),
            shared_channel().to_str().unwrap(),
            "extracted_package_dir",
            "package_tarball_full_path",
        ] {
            assert!(
                !text.contains(host),
                "{} holds `{host}`",
                entry.path().display()
            );
        }
    }
}

#[test]
fn image_on_a_busybox_base_runs_under_runc() {
    if !(have("runc") && have("umoci") && Path::new("/bin/busybox").exists()) {
        panic!("runc, umoci and busybox-static are required: run tests/install-deps.sh");
    }
    require_root!("runc needs root to run a container here");
    let project = Project::new();
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let mut recipe = tiny_recipe(shared_channel(), "runnable", &["hello 1.0"]);
    recipe = recipe.replace(
        "base = \"scratch\"",
        "base = \"oci:../base:latest\"\nentrypoint = [\"/bin/sh\", \"-c\"]\ncmd = [\"hello; cat /opt/conda/etc/hello.conf; echo GREETING=$GREETING\"]",
    );
    recipe.push_str("\n[image.env]\nGREETING = \"hi there\"\n");
    project.write_recipe(&recipe);
    project.build(&[]).success();

    let layout_dir = project.path().join("images/runnable");
    let layout = LayoutView::new(&layout_dir);
    // The base layer is reused byte for byte, below ours.
    let base_view = LayoutView::new(&base);
    let base_layer = base_view.manifest()["layers"][0]["digest"].clone();
    assert_eq!(layout.manifest()["layers"][0]["digest"], base_layer);
    assert_eq!(
        layout.manifest()["annotations"]["org.opencontainers.image.base.digest"],
        base_view.manifest_digest()
    );

    let bundle = project.path().join("bundle");
    unpack(&layout_dir, "latest", &bundle);
    // No terminal: the test has none to give.
    assert_eq!(
        run_bundle(&bundle, "build"),
        "hello from /opt/conda\nprefix=/opt/conda/share/hello\nGREETING=hi there\n"
    );
}

#[test]
fn activation_variables_become_image_env_and_scripts_are_reported() {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "activated", &["activation"])
        + "\n[image.env]\nACTIVATION_MODE = \"from the recipe\"\n";
    project.write_recipe(&recipe);
    let run = project.build(&[]).success();
    assert!(
        run.stderr.contains(
            "warning: activation script `/opt/conda/etc/conda/activate.d/activation.sh` is not run at build time"
        ),
        "{}",
        run.stderr
    );
    let config = LayoutView::new(project.path().join("images/activated")).config();
    let env = env_of(&config);
    assert!(env.contains(&"ACTIVATION_HOME=/somewhere/else"), "{env:?}");
    // The recipe's env is applied last.
    assert!(env.contains(&"ACTIVATION_MODE=from the recipe"), "{env:?}");
    assert!(
        !env.iter().any(|e| e.starts_with("ACTIVATION_SCRIPT_RAN")),
        "{env:?}"
    );
}

#[test]
fn a_cuda_image_is_configured_like_nvidias() {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "cuda", &["cuda-cudart"])
        + "\n[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\"\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let layout = LayoutView::new(project.path().join("images/cuda"));
    crate::common::assert_cuda_11_8_config(&layout);
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("__cuda=11.8=0"), "{lock}");
}
