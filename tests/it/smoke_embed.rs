//! `[smoke] embed = true` (issue 8 part 4): the `imgbuild-smoke` executable, built for glibc
//! 2.17 with cargo-zigbuild, becomes the image's top layer and runs inside the image, here
//! on Debian bullseye's glibc 2.31 under runc. No GPU in CI: it loads the image's own NVRTC
//! (which needs no GPU) and then says there is no driver, exit 3; an image whose NVRTC cannot
//! load is caught all the same, exit 5. Executables the image cannot run are refused before
//! solving.

use std::path::Path;

use serde_json::Value;

use crate::{
    common::{
        LayoutView, Project, require_root, run_bundle_output, run_tool, unpack, validate_layout,
    },
    support::{
        base::{OLD_GLIBC_SUITE, debian_base_layout},
        channel::tiny_recipe,
        nvrtc_channel, shared_channel, smoke_exe, test_cache_dir,
    },
};

const IN_IMAGE: &str = "/opt/imgbuild/bin/imgbuild-smoke";

/// What NVRTC 11.8 needs beyond glibc: its builtins link `libstdc++.so.6`.
const WITH_LIBSTDCXX: &[&str] = &["libc6", "libgcc-s1", "libstdc++6"];

/// A CUDA 11.8 recipe (cudart and NVRTC from NVIDIA's wheels) on a bullseye base holding
/// `WITH_LIBSTDCXX`, embedding the smoke test.
pub(crate) fn embedding_project(name: &str) -> Project {
    embedding_project_on(name, WITH_LIBSTDCXX)
}

fn embedding_project_on(name: &str, base_packages: &[&str]) -> Project {
    let project = Project::new();
    debian_base_layout(
        &project.path().join("base"),
        &test_cache_dir(),
        OLD_GLIBC_SUITE,
        base_packages,
    )
    .unwrap();
    let nvrtc = url::Url::from_directory_path(nvrtc_channel()).unwrap();
    let recipe = tiny_recipe(shared_channel(), name, &["cuda-cudart", "cuda-nvrtc"])
        .replace("base = \"scratch\"", "base = \"oci:../base\"")
        .replacen("channels = [", &format!("channels = [\"{nvrtc}\", "), 1)
        + "\n[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\"\n\n[smoke]\nembed = true\n";
    project.write_recipe(&recipe);
    project
}

/// Unpacks the image with umoci and runs the embedded executable with `args` under runc.
fn run_embedded(project: &Project, image: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let bundle = project.path().join(format!("bundle-{}", args.len()));
    unpack(
        &project.path().join("images").join(image),
        "latest",
        &bundle,
    );
    let mut all = vec![IN_IMAGE];
    all.extend_from_slice(args);
    let output = run_bundle_output(&bundle, image, Some(&all));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn has_driver() -> bool {
    Path::new("/proc/driver/nvidia/version").exists()
}

pub(crate) fn build_with(project: &Project, exe: &Path) -> crate::common::Run {
    project.run_with(
        &["build", "recipes/image.toml"],
        &[("IMGBUILD_SMOKE_EXE", exe.to_str().unwrap())],
        None,
    )
}

#[test]
fn the_smoke_executable_needs_no_glibc_newer_than_2_17() {
    let exe = smoke_exe();
    let symbols = run_tool("objdump", &["-T", exe.to_str().unwrap()]);
    let mut versions: Vec<Vec<u32>> = symbols
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .map(|v| v.split('.').map(|p| p.parse().unwrap()).collect())
        .collect();
    versions.sort();
    let newest = versions.last().expect("a glibc-linked executable");
    assert!(newest <= &vec![2, 17], "needs GLIBC_{newest:?}:\n{symbols}");
    let header = fs_err::read(exe).unwrap();
    assert_eq!(&header[..4], b"\x7fELF");
    assert_eq!(u16::from_le_bytes([header[18], header[19]]), 0x3e, "x86-64");
}

#[test]
fn the_embedded_smoke_test_runs_inside_a_bullseye_image() {
    let project = embedding_project("smoke-embed");
    build_with(&project, smoke_exe()).success();
    let layout = project.path().join("images/smoke-embed");
    validate_layout(layout.to_str().unwrap());
    let view = LayoutView::new(&layout);

    // The executable is the top layer, alone, byte for byte, executable.
    let manifest = view.manifest();
    assert_eq!(manifest["annotations"]["dev.imgbuild.smoke"], IN_IMAGE);
    let top = manifest["layers"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let blob = view.blob(top["digest"].as_str().unwrap());
    let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(&blob[..]));
    let mut files = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if entry.header().entry_type().is_file() {
            assert_eq!(entry.header().mode().unwrap(), 0o755, "{path}");
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            assert_eq!(bytes, fs_err::read(smoke_exe()).unwrap(), "{path}");
            files.push(path);
        }
    }
    assert_eq!(files, [IN_IMAGE.trim_start_matches('/')]);
    let history = view.config()["history"].as_array().unwrap().clone();
    assert_eq!(
        history.last().unwrap()["created_by"],
        "imgbuild: smoke test executable"
    );
    project.run(&["verify", "images/smoke-embed"]).success();

    // The provenance names the executable by its sha256, with the builder's parameters.
    let provenance: serde_json::Value = serde_json::from_slice(
        &fs_err::read(project.path().join("images/smoke-embed.provenance.json")).unwrap(),
    )
    .unwrap();
    let sha256 = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(fs_err::read(smoke_exe()).unwrap()))
    };
    assert_eq!(
        provenance["predicate"]["buildDefinition"]["internalParameters"]["smokeExecutables"],
        serde_json::json!([{"platform": "linux-64", "digest": format!("sha256:{sha256}")}]),
        "{provenance}"
    );

    // Another image embedding the same executable carries the same layer blob.
    let other = embedding_project("smoke-embed-other");
    build_with(&other, smoke_exe()).success();
    let other_view = LayoutView::new(other.path().join("images/smoke-embed-other"));
    assert_ne!(other_view.manifest_digest(), view.manifest_digest());
    assert_eq!(
        other_view.manifest()["layers"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["digest"],
        top["digest"]
    );

    require_root!("runc needs root to run a container here");
    let (code, stdout, stderr) = run_embedded(
        &project,
        "smoke-embed",
        &["--json", "--prefix", "/opt/conda"],
    );
    let rootfs = project.path().join("bundle-3/rootfs");
    assert!(rootfs.join("lib/x86_64-linux-gnu/libc-2.31.so").is_file());
    if has_driver() {
        eprintln!("this machine has an NVIDIA driver: the verdict is not checked here");
        return;
    }
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["verdict"], "no-device");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("libcuda.so.1 cannot be loaded"),
        "{report}"
    );
    // CUDA_VERSION from the image's environment, and the image's own NVRTC, loaded inside
    // the container on bullseye's glibc and libstdc++ and asked for its version. (cudart
    // 11.8 tells its version only with a driver: without one, cudaRuntimeGetVersion fails
    // with cudaErrorInsufficientDriver, so it stays unknown.)
    assert_eq!(report["image_cuda"], "11.8.89");
    assert_eq!(report["image_nvrtc"], "11.8", "{report}");
    assert_eq!(report["image_cudart"], Value::Null, "{report}");
    let libraries = report["libraries"].as_array().unwrap();
    for library in [
        "/opt/conda/lib/libcudart.so.11.0",
        "/opt/conda/lib/libnvrtc.so.11.2",
        "/opt/conda/lib/libnvrtc-builtins.so.11.8",
    ] {
        assert!(libraries.contains(&Value::from(library)), "{report}");
    }

    // Text output, and a prefix that is not there (exit 1), not a crash.
    let (code, stdout, _) = run_embedded(&project, "smoke-embed", &[]);
    assert_eq!(code, Some(3));
    assert!(stdout.contains("image NVRTC      11.8"), "{stdout}");
    let (code, _, stderr) = run_embedded(&project, "smoke-embed", &["--prefix", "/nonexistent"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("`/nonexistent` is not a directory"),
        "{stderr}"
    );
}

/// NVRTC's builtins need `libstdc++.so.6`; on a base without it the image cannot compile a
/// kernel on any machine, and the embedded test says so without a GPU: exit 5, naming it.
#[test]
fn an_image_whose_nvrtc_cannot_load_is_caught_without_a_gpu() {
    require_root!("runc needs root to run a container here");
    let project = embedding_project_on("smoke-broken", &["libc6", "libgcc-s1"]);
    build_with(&project, smoke_exe()).success();
    let (code, stdout, stderr) = run_embedded(&project, "smoke-broken", &["--json"]);
    assert_eq!(code, Some(5), "{stdout}{stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["verdict"], "kernel-failure");
    let message = report["message"].as_str().unwrap();
    assert!(
        message.contains("the image's NVRTC does not load")
            && message.contains("libnvrtc-builtins.so.11.8")
            && message.contains("libstdc++.so.6: cannot open shared object file"),
        "{message}"
    );
}

#[test]
fn executables_the_image_cannot_run_are_refused_before_solving() {
    let project = embedding_project("smoke-refused");
    let no_solve = "Solving";

    // Built on this host, imgbuild itself needs a glibc newer than bullseye's 2.31.
    let run = build_with(&project, &crate::support::imgbuild_bin());
    run.assert_failure_naming(1, &["needs glibc 2.", "the image has glibc 2.31"]);
    assert!(!run.stderr.contains(no_solve), "{}", run.stderr);
    project.assert_no_image();

    // Not an executable at all.
    let script = project.path().join("smoke.sh");
    fs_err::write(&script, "#!/bin/sh\n").unwrap();
    build_with(&project, &script).assert_failure_naming(1, &["is not a 64-bit ELF executable"]);

    // Missing.
    build_with(&project, &project.path().join("nowhere"))
        .assert_failure_naming(1, &["needs the `imgbuild-smoke` executable", "nowhere"]);
    project.assert_no_image();

    // A base without glibc (scratch) cannot run it.
    let recipe = fs_err::read_to_string(project.recipe_path())
        .unwrap()
        .replace("base = \"oci:../base\"", "base = \"scratch\"");
    project.write_recipe(&recipe);
    build_with(&project, smoke_exe())
        .assert_failure_naming(1, &["needs an image with glibc", "`[image] glibc`"]);
    project.assert_no_image();
}
