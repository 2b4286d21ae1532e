//! Helpers shared by the integration tests: a local conda channel, a busybox base image, and
//! where to find the binary under test.
//!
//! Not every test uses every helper.
#![allow(dead_code)]

pub(crate) mod base;
pub(crate) mod channel;
pub(crate) mod containerd;
pub(crate) mod go;
pub(crate) mod hostile;
pub(crate) mod jupyter;
pub(crate) mod podman;
pub(crate) mod pypi;
pub(crate) mod registry_log;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where tests keep downloads between runs (the CUDA runtime wheel): `$IMGBUILD_TEST_CACHE`, or
/// `tests/.cache` in the crate. Created if missing.
pub(crate) fn test_cache_dir() -> PathBuf {
    let dir = match std::env::var_os("IMGBUILD_TEST_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/.cache"),
    };
    fs_err::create_dir_all(&dir).expect("creating the test cache dir");
    dir
}

/// The test channel (see [`channel::write_test_channel`]), built once per test process and
/// shared by every test in it. Treat it as read-only: copy it before adding packages.
///
/// It lives in a fresh directory under the system temp dir that this process never removes:
/// statics are not dropped, and tests may still be reading it while the process exits. The
/// next test process removes it (see [`kept_channel_dir`]).
pub(crate) fn shared_channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        kept_channel_dir("channel", |dir| {
            channel::write_test_channel(dir, &test_cache_dir())
        })
    })
}

/// The prefix of every kept directory: `imgbuild-t<pid>-<name>-<random>`. Short, because the
/// hostile-package tests write this path into 100-byte tar name fields.
const KEPT_PREFIX: &str = "imgbuild-t";

/// A fresh directory under the system temp dir, filled by `write`, not removed by this test
/// process (see [`shared_channel`]); the next test process removes it once this one has exited.
pub(crate) fn kept_channel_dir(
    name: &str,
    write: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> PathBuf {
    remove_dirs_of_exited_test_processes();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{KEPT_PREFIX}{}-{name}-", std::process::id()))
        .tempdir()
        .unwrap_or_else(|e| panic!("creating a temp dir for the {name}: {e}"))
        .keep();
    write(&dir).unwrap_or_else(|e| panic!("writing the {name} to {}: {e:#}", dir.display()));
    dir
}

/// Removes the kept directories of test processes that are no longer running (their pid has
/// no `/proc` entry). A directory of a running process, or one whose name holds no pid, stays.
fn remove_dirs_of_exited_test_processes() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let Ok(entries) = fs_err::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(KEPT_PREFIX)) else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && pid != std::process::id()
                && !Path::new("/proc").join(pid.to_string()).exists()
            {
                // Another process may be sweeping too: losing that race is fine.
                let _ = fs_err::remove_dir_all(entry.path());
            }
        }
    });
}

/// A second channel holding only `cuda-nvrtc` 11.8.89 from NVIDIA's wheel (see
/// [`channel::write_cuda_nvrtc_11_8`]), built once per test process, for recipes that list it
/// after [`shared_channel`]. Read-only and kept, like the shared channel.
pub(crate) fn nvrtc_channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        kept_channel_dir("nvrtc-channel", |dir| {
            let linux64 = dir.join("linux-64");
            fs_err::create_dir_all(&linux64)?;
            fs_err::create_dir_all(dir.join("noarch"))?;
            channel::write_cuda_nvrtc_11_8(&test_cache_dir(), &linux64)?;
            channel::index_channel(dir)
        })
    })
}

/// The `imgbuild` binary cargo built for these tests.
pub(crate) fn imgbuild_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_imgbuild"))
}

/// The target of the in-image smoke executable: x86-64, linked against glibc 2.17 (`just
/// smoke-exe` builds the same).
pub(crate) const SMOKE_EXE_TARGET: &str = "x86_64-unknown-linux-gnu.2.17";
/// The same for aarch64 (needs `rustup target add aarch64-unknown-linux-gnu`).
pub(crate) const SMOKE_EXE_TARGET_AARCH64: &str = "aarch64-unknown-linux-gnu.2.17";

/// The x86-64 `imgbuild-smoke` executable (see [`smoke_exe_for`]).
pub(crate) fn smoke_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| smoke_exe_for(SMOKE_EXE_TARGET))
}

/// The aarch64 `imgbuild-smoke` executable (see [`smoke_exe_for`]).
pub(crate) fn smoke_exe_aarch64() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| smoke_exe_for(SMOKE_EXE_TARGET_AARCH64))
}

/// The `imgbuild-smoke` executable built for `target` with `cargo zigbuild` (zig and
/// cargo-zigbuild come from PyPI into the test venv), in its own target directory under the
/// test cache: the outer `cargo test` holds the usual one. One build at a time.
fn smoke_exe_for(target: &str) -> PathBuf {
    static ONE_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let venv_bin = test_cache_dir().join("venv/bin");
    assert!(
        venv_bin.join("cargo-zigbuild").is_file(),
        "cargo-zigbuild is missing from {}: run tests/install-deps.sh",
        venv_bin.display()
    );
    let target_dir = test_cache_dir().join("smoke-exe-target");
    let path = format!(
        "{}:{}",
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = std::process::Command::new(venv_bin.join("cargo-zigbuild"))
        .args([
            "zigbuild",
            "--release",
            "--locked",
            "-p",
            "imgbuild-smoke",
            "--target",
        ])
        .arg(target)
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("PATH", path)
        .output()
        .expect("running cargo zigbuild");
    assert!(
        output.status.success(),
        "cargo zigbuild of imgbuild-smoke for {target} failed (tests/install-deps.sh adds the Rust targets):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let triple = target.split('.').next().expect("a target triple");
    target_dir.join(triple).join("release/imgbuild-smoke")
}
