//! Issue 30, the framework check on real PyTorch builds, on a machine without a GPU (CI):
//! `imgbuild smoke` unpacks each image into a private root and runs the image's own Python
//! there (as root, the tests' case: a private mount namespace, `chroot`, then the user
//! nobody), and PyTorch's own answers decide the verdict:
//! - Debian bookworm's `python3-torch` (1.13, built without CUDA) is a `cpu-build`;
//! - PyPI's `torch` 1.12.1 wheel (CUDA 10.2) on a Python 3.9 sees no driver: `no-device`,
//!   with torch's own reason.
//!
//! Without a driver the CUDA part's verdict, `no-device` (exit 3), stands unless the framework
//! fails on any machine (a CPU build: `framework-failure`, exit 6); the framework
//! part still runs (it needs no GPU to tell a CPU build) and is in the report beside it.
//! With a GPU these verdicts would differ; that path is proven on the device machine.

use std::path::Path;

use serde_json::Value;

use crate::{
    common::{Project, Run},
    support::{
        base::{OLD_GLIBC_SUITE, debian_base_layout},
        channel::tiny_recipe,
        pypi::{
            SimpleIndex, TORCH_1_12_1_CP39, TYPING_EXTENSIONS_4_12_2, pinned_dists, pypi_channel,
            wheel_with_record_fixed,
        },
        shared_channel, test_cache_dir,
    },
};

/// These tests are for machines without a GPU (CI).
fn skipped_with_a_driver() -> bool {
    let driver = Path::new("/proc/driver/nvidia/version").exists();
    if driver {
        eprintln!(
            "skipped: this machine has an NVIDIA driver; the GPU path is tested on the device"
        );
    }
    driver
}

/// The `--json` report of a smoke run without a driver, with exit `code` and `verdict`
/// (`no-device` from the CUDA part, or `framework-failure` when the framework fails on any
/// machine), and the one framework check, PyTorch's.
#[track_caller]
fn pytorch_check(run: &Run, code: i32, verdict: &str) -> Value {
    assert_eq!(run.code, code, "{}{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["verdict"], verdict, "{report}");
    assert_eq!(report["gpu"], Value::Null, "{report}");
    let checks = report["framework"].as_array().expect("a framework section");
    assert_eq!(checks.len(), 1, "{report}");
    assert_eq!(checks[0]["framework"], "pytorch", "{report}");
    checks[0].clone()
}

#[test]
fn debians_pytorch_is_a_cpu_build() {
    if skipped_with_a_driver() {
        return;
    }
    let project = Project::new();
    debian_base_layout(
        &project.path().join("base"),
        &test_cache_dir(),
        "bookworm",
        &["python3-torch"],
    )
    .unwrap();
    // The base is unpacked without maintainer scripts, so the alternatives that put
    // `libblas.so.3` and `liblapack.so.3` on the loader's path are not there: the image names
    // their directories, as an image whose base ran them would not need to.
    let recipe = tiny_recipe(shared_channel(), "debtorch", &["hello 1.0"])
        .replace("base = \"scratch\"", "base = \"oci:../base\"")
        + "\n[image.env]\nLD_LIBRARY_PATH = \
           \"/usr/lib/x86_64-linux-gnu/blas:/usr/lib/x86_64-linux-gnu/lapack\"\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    // No layer of a base imgbuild did not build names its packages: `--framework` asks.
    let check = pytorch_check(
        &project.run(&["smoke", "images/debtorch", "--framework", "--json"]),
        6,
        "framework-failure",
    );
    assert_eq!(check["verdict"], "cpu-build", "{check}");
    assert_eq!(check["python"], "/usr/bin/python3", "{check}");
    assert_eq!(check["python_version"], "3.11.2", "{check}");
    // Debian's 1.13.1 calls itself 1.13.0a0.
    let version = check["version"].as_str().unwrap();
    assert!(version.starts_with("1.13."), "{check}");
    assert_eq!(check["cuda"], Value::Null, "{check}");
    assert!(
        check["message"]
            .as_str()
            .unwrap()
            .starts_with("built without CUDA"),
        "{check}"
    );
}

#[test]
fn pypis_cuda_wheel_of_pytorch_sees_no_device_without_a_driver() {
    if skipped_with_a_driver() {
        return;
    }
    // The wheel's RECORD is wrong about its METADATA (and only that): imgbuild refuses such
    // a wheel, so the index serves a copy with that row corrected, torch's files untouched.
    let torch =
        wheel_with_record_fixed(&TORCH_1_12_1_CP39, "torch-1.12.1.dist-info/METADATA").unwrap();
    let mut dists = pinned_dists(&[TYPING_EXTENSIONS_4_12_2]).unwrap();
    dists.push((torch, "torch".into()));
    let index = SimpleIndex::serve(&dists).unwrap();
    let project = Project::new();
    // Bullseye's Python 3.9 (the venv `python` of the PyPI channel runs it) and the C++
    // runtime torch's libraries link; the wheel brings its own libgomp.
    debian_base_layout(
        &project.path().join("base"),
        &test_cache_dir(),
        OLD_GLIBC_SUITE,
        &["python3.9", "libstdc++6"],
    )
    .unwrap();
    let recipe = tiny_recipe(pypi_channel(), "cudatorch", &["python"])
        .replace("base = \"scratch\"", "base = \"oci:../base\"")
        + &format!(
            "\n[pypi]\nindex-url = \"{}\"\ndependencies = [\"torch==1.12.1\"]\n",
            index.url()
        );
    project.write_recipe(&recipe);
    project.build(&[]).success();
    // No `--framework`: the layer of the torch wheel says it is there.
    let check = pytorch_check(
        &project.run(&["smoke", "images/cudatorch", "--json"]),
        3,
        "no-device",
    );
    assert_eq!(check["verdict"], "no-device", "{check}");
    assert_eq!(check["python"], "/opt/conda/bin/python3", "{check}");
    assert_eq!(check["python_version"], "3.9.2", "{check}");
    assert_eq!(check["version"], "1.12.1+cu102", "{check}");
    assert_eq!(check["cuda"], "10.2", "{check}");
    assert_eq!(check["available"], false, "{check}");
    let message = check["message"].as_str().unwrap();
    assert!(
        message.starts_with("no GPU where it ran: ") && message.contains("Found no NVIDIA driver"),
        "{check}"
    );
}
