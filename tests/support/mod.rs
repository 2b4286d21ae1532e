//! Helpers shared by the integration tests: a local conda channel, a busybox base image, and
//! where to find the binary under test.
//!
//! Not every test uses every helper.
#![allow(dead_code)]

pub mod base;
pub mod channel;
pub mod hostile;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where tests keep downloads between runs (the CUDA runtime wheel): `$IMGBUILD_TEST_CACHE`, or
/// `tests/.cache` in the crate. Created if missing.
pub fn test_cache_dir() -> PathBuf {
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
/// It lives in a fresh directory under the system temp dir that is deliberately never removed:
/// statics are not dropped, and tests may still be reading it while the process exits.
pub fn shared_channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix(&format!("imgbuild-test-channel-{}-", std::process::id()))
            .tempdir()
            .expect("creating a temp dir for the test channel")
            .keep();
        channel::write_test_channel(&dir, &test_cache_dir())
            .unwrap_or_else(|e| panic!("writing the test channel to {}: {e:#}", dir.display()));
        dir
    })
}

/// The `imgbuild` binary cargo built for these tests.
pub fn imgbuild_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_imgbuild"))
}
