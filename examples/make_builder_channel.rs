//! Packages imgbuild itself as a conda package in a local channel, for
//! `recipes/imgbuild-builder.toml` (the image the `imgbuild k8s --build-job` pods run):
//!
//! ```text
//! cargo run --example make_builder_channel -- OUT_DIR IMGBUILD IMGBUILD_SMOKE
//! ```
//!
//! `just builder` builds both binaries for glibc 2.17 first and the image after.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line example prints its result

#[allow(dead_code)]
#[path = "../tests/support/channel.rs"]
mod channel;

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [out, imgbuild, smoke] = args.as_slice() else {
        eprintln!("usage: make_builder_channel OUT_DIR IMGBUILD IMGBUILD_SMOKE");
        std::process::exit(2)
    };
    fs_err::create_dir_all(out.join("noarch"))?;
    let package = channel::write_imgbuild_package(
        &out.join("linux-64"),
        imgbuild,
        smoke,
        env!("CARGO_PKG_VERSION"),
    )?;
    channel::index_channel(out)?;
    println!("{}", package.display());
    Ok(())
}
