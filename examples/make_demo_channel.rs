//! Writes the test fixtures used by `just demo`:
//!
//! ```text
//! cargo run --example make_demo_channel -- OUT_DIR
//! ```
//!
//! * `OUT_DIR/channel`: the local conda channel the integration tests use (real third-party
//!   packages, `cuda-cudart` from NVIDIA's PyPI wheel, small made packages), indexed.
//! * `OUT_DIR/base`: an OCI image layout (tag `latest`) holding a static busybox, made by umoci.
//!
//! The CUDA runtime wheel is cached in `$IMGBUILD_TEST_CACHE` (default `tests/.cache`), the same
//! place the tests use, so a demo after a test run downloads nothing.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line example prints its result

// The same code the integration tests use, so the demo shows exactly what the tests exercise.
#[allow(dead_code)]
#[path = "../tests/support/base.rs"]
mod base;
#[allow(dead_code)]
#[path = "../tests/support/channel.rs"]
mod channel;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        bail!("usage: cargo run --example make_demo_channel -- OUT_DIR");
    };
    let out = std::path::absolute(PathBuf::from(out))?;

    let cache = match std::env::var_os("IMGBUILD_TEST_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/.cache"),
    };
    fs_err::create_dir_all(&cache)?;

    let channel_dir = out.join("channel");
    channel::write_test_channel(&channel_dir, &cache)
        .with_context(|| format!("writing the demo channel to {}", channel_dir.display()))?;
    println!("channel: {}", channel_dir.display());

    let base_dir = out.join("base");
    if base_dir.exists() {
        // Rebuilding is cheap and umoci wants a fresh directory.
        fs_err::remove_dir_all(&base_dir)?;
    }
    base::busybox_base_layout(&base_dir)
        .with_context(|| format!("writing the demo base image to {}", base_dir.display()))?;
    println!("base:    oci:{}:latest", base_dir.display());

    // recipes/demo.toml names these two as `../images/.demo/{channel,base}`.
    println!("\nnext:    cargo run -- build recipes/demo.toml   # → images/demo");
    Ok(())
}
