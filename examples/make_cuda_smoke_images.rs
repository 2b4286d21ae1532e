//! Writes what the GPU smoke evidence is built from (see `docs/evidence/README.md`):
//!
//! ```text
//! cargo run --example make_cuda_smoke_images -- OUT_DIR
//! ```
//!
//! * `OUT_DIR/channel`: a local channel of conda packages made from NVIDIA's real PyPI
//!   wheels: `cuda-cudart` and `cuda-nvrtc` 11.8.89 (`nvidia-cuda-runtime-cu11`,
//!   `nvidia-cuda-nvrtc-cu11`) and 13.2.86 (`nvidia-cuda-runtime`, `nvidia-cuda-nvrtc`),
//!   each wheel pinned by sha256.
//! * `OUT_DIR/smoke-cuda118.toml`, `OUT_DIR/smoke-cuda132.toml`: recipes for the two images.
//! * `OUT_DIR/wheels`: the same four wheels as they are, and `OUT_DIR/smoke-pypi-cuda118.toml`,
//!   `OUT_DIR/smoke-pypi-cuda132.toml`: the same CUDA images with the wheels installed by
//!   `[pypi]` (no index, `find-links = ["wheels"]`) into a conda environment whose `python`
//!   3.9.2 is a metadata-only package of the channel.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line example prints its result

#[allow(dead_code)]
#[path = "../tests/support/channel.rs"]
mod channel;

use std::path::{Path, PathBuf};

use channel::PinnedWheel;

const RUNTIME_13_2: PinnedWheel = PinnedWheel {
    file_name: "nvidia_cuda_runtime-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/70/c6/8f8c5e893d183082ea78f973aebc7ebc845ee219d68bddac73b0f62490fe/nvidia_cuda_runtime-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "3498247680dfddce31bad102af7e3e26fc795342a3cac64722bb0fa95e7f60f0",
};
const NVRTC_13_2: PinnedWheel = PinnedWheel {
    file_name: "nvidia_cuda_nvrtc-13.2.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/1e/39/c58835ec8392a91b8d7bad83760eafc3085f64788b722ec2b44a27b3ca3e/nvidia_cuda_nvrtc-13.2.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "8111c5130e967b78222ea2124145f8efe9ce201b752b2579a2513100a53be1c5",
};

fn recipe(name: &str, channel: &Path, cuda: &str, min_driver: &str, version: &str) -> String {
    format!(
        "[image]\nname = \"{name}\"\n\n[cuda]\nversion = \"{cuda}\"\nmin-driver = \"{min_driver}\"\n\n\
         [conda]\nchannels = [\"{}\"]\ndependencies = [\"cuda-cudart =={version}\", \"cuda-nvrtc =={version}\"]\n",
        url::Url::from_directory_path(channel)
            .expect("absolute")
            .as_str()
    )
}

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: make_cuda_smoke_images OUT_DIR");
        std::process::exit(2)
    }));
    let out = std::path::absolute(out)?;
    let channel_dir = out.join("channel");
    let linux64 = channel_dir.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    let cache = std::env::var_os("IMGBUILD_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/.cache"));

    let runtime_11 = channel::cuda_runtime_wheel(&cache)?;
    channel::write_wheel_library_package(
        &runtime_11,
        &linux64.join("cuda-cudart-11.8.89-h0_0.conda"),
        "cuda-cudart",
        "11.8.89",
        &[(
            "nvidia/cuda_runtime/lib/libcudart.so.11.0",
            "lib/libcudart.so.11.0",
        )],
        &[("lib/libcudart.so", "libcudart.so.11.0")],
    )?;
    channel::write_cuda_nvrtc_11_8(&cache, &linux64)?;
    channel::write_wheel_library_package(
        &channel::fetch_wheel(&cache, &RUNTIME_13_2)?,
        &linux64.join("cuda-cudart-13.2.86-h0_0.conda"),
        "cuda-cudart",
        "13.2.86",
        &[("nvidia/cu13/lib/libcudart.so.13", "lib/libcudart.so.13")],
        &[("lib/libcudart.so", "libcudart.so.13")],
    )?;
    channel::write_wheel_library_package(
        &channel::fetch_wheel(&cache, &NVRTC_13_2)?,
        &linux64.join("cuda-nvrtc-13.2.86-h0_0.conda"),
        "cuda-nvrtc",
        "13.2.86",
        &[
            ("nvidia/cu13/lib/libnvrtc.so.13", "lib/libnvrtc.so.13"),
            (
                "nvidia/cu13/lib/libnvrtc-builtins.so.13.2",
                "lib/libnvrtc-builtins.so.13.2",
            ),
        ],
        &[("lib/libnvrtc.so", "libnvrtc.so.13")],
    )?;
    // The Python the wheels are resolved for; the smoke test runs none of it.
    channel::write_package(
        &linux64.join("python-3.9.2-h0_0.conda"),
        channel::linux64_index("python", "3.9.2", &["__glibc >=2.17"]),
        &[channel::file(
            "lib/python3.9/site-packages/README.txt",
            "site-packages\n",
        )],
        None,
    )?;
    fs_err::create_dir_all(channel_dir.join("noarch"))?;
    channel::index_channel(&channel_dir)?;

    let wheels = out.join("wheels");
    fs_err::create_dir_all(&wheels)?;
    for wheel in [
        channel::CUDA_RUNTIME_11_8,
        channel::NVRTC_11_8,
        RUNTIME_13_2,
        NVRTC_13_2,
    ] {
        fs_err::copy(
            channel::fetch_wheel(&cache, &wheel)?,
            wheels.join(wheel.file_name),
        )?;
    }
    for (name, cuda, min_driver, runtime, nvrtc) in [
        (
            "smoke-pypi-cuda118",
            "11.8",
            "520.61.05",
            "nvidia-cuda-runtime-cu11==11.8.89",
            "nvidia-cuda-nvrtc-cu11==11.8.89",
        ),
        (
            "smoke-pypi-cuda132",
            "13.2",
            "580.65.06",
            "nvidia-cuda-runtime==13.2.86",
            "nvidia-cuda-nvrtc==13.2.86",
        ),
    ] {
        fs_err::write(
            out.join(format!("{name}.toml")),
            format!(
                "[image]\nname = \"{name}\"\n\n[cuda]\nversion = \"{cuda}\"\nmin-driver = \"{min_driver}\"\n\n\
                 [conda]\nchannels = [\"{}\"]\ndependencies = [\"python 3.9.*\"]\n\n\
                 [pypi]\nno-index = true\nfind-links = [\"wheels\"]\ndependencies = [\"{runtime}\", \"{nvrtc}\"]\n",
                url::Url::from_directory_path(&channel_dir)
                    .expect("absolute")
                    .as_str()
            ),
        )?;
    }

    fs_err::write(
        out.join("smoke-cuda118.toml"),
        recipe(
            "smoke-cuda118",
            &channel_dir,
            "11.8",
            "520.61.05",
            "11.8.89",
        ),
    )?;
    // NVRTC 13.2 is newer than the H200's driver (580, CUDA 13.0): it runs there only through
    // minor-version compatibility.
    fs_err::write(
        out.join("smoke-cuda132.toml"),
        recipe(
            "smoke-cuda132",
            &channel_dir,
            "13.2",
            "580.65.06",
            "13.2.86",
        ),
    )?;
    println!("channel: {}", channel_dir.display());
    println!(
        "recipes: {0}/smoke-cuda118.toml {0}/smoke-cuda132.toml {0}/smoke-pypi-cuda118.toml {0}/smoke-pypi-cuda132.toml",
        out.display()
    );
    Ok(())
}
