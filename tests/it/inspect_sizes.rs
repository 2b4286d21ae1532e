//! Issue 32, part 4: `imgbuild inspect IMAGE --sizes`, on a real duplicate: NVIDIA's
//! `nvidia-cuda-runtime-cu11` wheel and the conda `cuda-cudart` package made from it, both
//! in one environment, as users get them when a `[pypi]` dependency pulls NVIDIA's wheels
//! beside conda's CUDA.

use std::path::Path;

use serde_json::Value;

use crate::{
    common::{LayoutView, Project},
    support::{
        channel::{
            CUDA_RUNTIME_11_8, cuda_runtime_wheel, file, index_channel, linux64_index,
            write_package, write_wheel_library_package,
        },
        test_cache_dir,
    },
};

/// A channel with `cuda-cudart` 11.8.89 made from NVIDIA's wheel and a metadata-only
/// `python` 3.9.2 (what the wheel is resolved for), and a find-links directory with the
/// wheel itself.
fn channel_and_wheels(dir: &Path) {
    let wheel = cuda_runtime_wheel(&test_cache_dir()).unwrap();
    let linux64 = dir.join("channel/linux-64");
    fs_err::create_dir_all(&linux64).unwrap();
    fs_err::create_dir_all(dir.join("channel/noarch")).unwrap();
    write_wheel_library_package(
        &wheel,
        &linux64.join("cuda-cudart-11.8.89-h0_0.conda"),
        "cuda-cudart",
        "11.8.89",
        &[(
            "nvidia/cuda_runtime/lib/libcudart.so.11.0",
            "lib/libcudart.so.11.0",
        )],
        &[("lib/libcudart.so", "libcudart.so.11.0")],
    )
    .unwrap();
    write_package(
        &linux64.join("python-3.9.2-h0_0.conda"),
        linux64_index("python", "3.9.2", &["__glibc >=2.17"]),
        &[file(
            "lib/python3.9/site-packages/README.txt",
            "site-packages\n",
        )],
        None,
    )
    .unwrap();
    index_channel(&dir.join("channel")).unwrap();
    fs_err::create_dir_all(dir.join("wheels")).unwrap();
    fs_err::copy(&wheel, dir.join("wheels").join(CUDA_RUNTIME_11_8.file_name)).unwrap();
}

fn duplicate_project() -> Project {
    let project = Project::new();
    channel_and_wheels(project.path());
    let channel = url::Url::from_directory_path(project.path().join("channel")).unwrap();
    project.write_recipe(&format!(
        r#"[image]
name = "dup"

[cuda]
version = "11.8"

[conda]
channels = ["{channel}"]
dependencies = ["python 3.9.*", "cuda-cudart ==11.8.89"]

[pypi]
no-index = true
find-links = ["../wheels"]
dependencies = ["nvidia-cuda-runtime-cu11==11.8.89"]
"#
    ));
    project.build(&[]).success();
    project
}

#[test]
fn sizes_find_the_cuda_runtime_twice_and_put_each_byte_down_to_its_package() {
    let project = duplicate_project();
    let run = project
        .run(&["inspect", "images/dup", "--sizes", "--json", "--top", "3"])
        .success();
    let report: Value = serde_json::from_str(&run.stdout).unwrap();

    // The layers' blob sizes add up to the manifest's.
    let manifest = LayoutView::new(project.path().join("images/dup")).manifest();
    let blobs: u64 = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    assert_eq!(report["compressed"].as_u64(), Some(blobs));

    // The same library from both: by soname, with the bytes of one copy wasted.
    let duplicate = &report["duplicate_libraries"][0];
    assert_eq!(duplicate["key"], "libcudart.so.11", "{duplicate}");
    let copies: Vec<(&str, &str)> = duplicate["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["path"].as_str().unwrap(), c["package"].as_str().unwrap()))
        .collect();
    assert_eq!(
        copies,
        [
            (
                "/opt/conda/lib/libcudart.so.11.0",
                "cuda-cudart-11.8.89-h0_0"
            ),
            (
                "/opt/conda/lib/python3.9/site-packages/nvidia/cuda_runtime/lib/libcudart.so.11.0",
                "pypi:nvidia_cuda_runtime_cu11-11.8.89"
            ),
        ]
    );
    let bytes = duplicate["copies"][0]["bytes"].as_u64().unwrap();
    assert!(bytes > 600_000, "the real library: {bytes}");
    assert_eq!(duplicate["wasted"].as_u64(), Some(bytes));

    // Every package is listed, the wheel's bytes with the wheel.
    let packages: Vec<&str> = report["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["package"].as_str().unwrap())
        .collect();
    for package in [
        "cuda-cudart-11.8.89-h0_0",
        "python-3.9.2-h0_0",
        "pypi:nvidia_cuda_runtime_cu11-11.8.89",
    ] {
        assert!(packages.contains(&package), "{packages:?}");
    }
    assert_eq!(report["largest_files"].as_array().unwrap().len(), 3);

    // The text says the same.
    let text = project.run(&["inspect", "images/dup", "--sizes"]).success();
    assert!(
        text.stdout.contains("soname libcudart.so.11"),
        "{}",
        text.stdout
    );
}

#[test]
fn sizes_refuse_a_tampered_layer_and_a_registry_image_with_their_names() {
    let project = duplicate_project();
    let layout = LayoutView::new(project.path().join("images/dup"));
    let (_, digest) = layout.layers()[0].clone();
    let blob = project
        .path()
        .join("images/dup/blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let mut bytes = fs_err::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs_err::write(&blob, bytes).unwrap();
    project
        .run(&["inspect", "images/dup", "--sizes"])
        .assert_failure_naming(1, &["Failed to read layer", &digest]);

    project
        .run(&["inspect", "registry.example/ml/dup:v1", "--sizes"])
        .assert_failure_naming(
            1,
            &["takes a local OCI layout", "registry.example/ml/dup:v1"],
        );
}
