//! A local conda channel for tests and for `just demo`.
//!
//! No conda channel is reachable from our machines, so tests point recipes at a channel written
//! here: the real third-party packages from `tests/data/conda-real`, a `cuda-cudart`
//! package made from NVIDIA's real PyPI wheel, and a few small packages made to exercise prefix
//! replacement, symlinks, noarch python and package sharing between recipes.
//!
//! Every made package is written with a fixed timestamp and fixed compression settings, so its
//! bytes are the same on every run, and the `indexed_timestamp` rattler_index stamps into
//! `repodata.json` is pinned too (see [`pin_indexed_timestamps`]); a lock file solved against
//! this channel is therefore the same in every test process.
//!
//! This file is included both by the integration tests (`tests/support/mod.rs`) and by
//! `examples/make_demo_channel.rs`, so it must not depend on anything else in `tests/support`.

use std::collections::BTreeSet;
use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use rattler_conda_types::RepoData;
use rattler_conda_types::compression_level::CompressionLevel;
use rattler_conda_types::package::{IndexJson, LinkJson, PackageFile, PathsJson};
use sha2::{Digest, Sha256};

/// The prefix placeholder baked into the made packages.
///
/// conda-build pads its placeholder to 255 characters (`…/_h_env_placehold_placehold_…`) so that
/// the real install prefix is shorter and binary files can be patched in place (a binary
/// replacement may only shorten a C string, never lengthen it). We use the same shape.
pub(crate) const PLACEHOLDER: &str = "/home/builder/conda-bld/imgbuild-test_1696118400000/_h_env_\
placehold_placehold_placehold_placehold_placehold_placehold_placehold_placehold_placehold_\
placehold_placehold_placehold_placehold_placehold_placehold_placehold_placehold_placehold_\
placehold_placeh";

/// The time every made package claims to have been built at (tar mtimes, zip dates,
/// `index.json` `timestamp`) and the `indexed_timestamp` pinned in `repodata.json`.
pub(crate) const TIMESTAMP: &str = "2023-10-01T00:00:00Z";
/// [`TIMESTAMP`] in Unix milliseconds, the unit of conda's `timestamp` fields.
pub(crate) const TIMESTAMP_MS: u64 = 1_696_118_400_000;

/// NVIDIA's CUDA runtime wheel from PyPI: the source of the real `libcudart.so.11.0`.
pub(crate) const CUDA_RUNTIME_WHEEL: &str =
    "nvidia_cuda_runtime_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl";
const CUDA_RUNTIME_WHEEL_URL: &str = "https://files.pythonhosted.org/packages/a6/ec/\
a540f28b31de7bc1ed49eecc72035d4cb77db88ead1d42f7bfa5ae407ac6/\
nvidia_cuda_runtime_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl";
const CUDA_RUNTIME_WHEEL_SHA256: &str =
    "92d04069a987e1fbc9213f8376d265df0f7bb42617d44f5eda1f496acea7f2d1";

/// Real packages copied byte for byte from `tests/data/conda-real/channel`, with the sha256
/// that `fixtures/conda-real/MANIFEST.md` records for them.
pub(crate) const REAL_PACKAGES: &[(&str, &str, &str)] = &[
    (
        "linux-64",
        "bcj-cffi-0.5.1-py310h295c915_0.tar.bz2",
        "439848d302dfa70c600ad0f639cd038dcd2092c72baf1731d1236417347fac0d",
    ),
    (
        "linux-64",
        "xtensor-io-0.10.3-hb585cf6_0.tar.bz2",
        "6ca199493941a078c90f5eab1c73da4401470343bf45d0f054d4a27ef749f9ac",
    ),
    (
        "linux-64",
        "zlib-1.2.11-h7b6447c_3.conda",
        "f33afff2144e1d6c4cf2e3e184937db8bf825b4537df74662aea5ee207b6a31b",
    ),
    (
        "linux-64",
        "zlib-1.2.11-h7b6447c_3.tar.bz2",
        "1f07873d6aa0cd18760a7b215d9956f7fa63c2f2761b03f293c659fe982923fa",
    ),
    (
        "noarch",
        "_r-mutex-1.0.1-anacondar_1.tar.bz2",
        "e58f9eeb416b92b550e824bcb1b9fb1958dee69abfe3089dfd1a9173e3a0528a",
    ),
];

/// Packages made by [`write_test_channel`], as (subdir, file name).
pub(crate) const MADE_PACKAGES: &[(&str, &str)] = &[
    ("linux-64", "activation-1.0-h0_0.tar.bz2"),
    ("linux-64", "cuda-cudart-11.8.89-h0_0.conda"),
    ("linux-64", "greeting-1.0-h0_0.tar.bz2"),
    ("linux-64", "hello-1.0-h0_0.tar.bz2"),
    ("linux-64", "hello-2.0-h0_0.tar.bz2"),
    ("linux-64", "libgcc-ng-13.2.0-h0_0.tar.bz2"),
    ("linux-64", "other-1.0-h0_0.tar.bz2"),
    ("linux-64", "python-3.9.18-h0_0.tar.bz2"),
    ("noarch", "pyhello-1.0-pyh0_0.conda"),
];

/// Every package file name in `subdir` of the test channel, sorted.
pub(crate) fn channel_packages(subdir: &str) -> Vec<String> {
    let real = REAL_PACKAGES.iter().map(|(s, f, _)| (*s, *f));
    let mut names: Vec<String> = real
        .chain(MADE_PACKAGES.iter().copied())
        .filter(|(s, _)| *s == subdir)
        .map(|(_, f)| f.to_string())
        .collect();
    names.sort();
    names
}

/// The real third-party packages and repodata the tests use, in the repository
/// (`tests/data/conda-real`, with their origins and licences in its `MANIFEST.md`).
pub(crate) fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/conda-real")
}

/// A wheel pinned by URL and sha256.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PinnedWheel {
    pub file_name: &'static str,
    pub url: &'static str,
    pub sha256: &'static str,
}

/// NVIDIA's `nvidia-cuda-runtime-cu11` 11.8.89 wheel.
pub(crate) const CUDA_RUNTIME_11_8: PinnedWheel = PinnedWheel {
    file_name: CUDA_RUNTIME_WHEEL,
    url: CUDA_RUNTIME_WHEEL_URL,
    sha256: CUDA_RUNTIME_WHEEL_SHA256,
};

/// NVIDIA's `nvidia-cuda-nvrtc-cu11` 11.8.89 wheel.
pub(crate) const NVRTC_11_8: PinnedWheel = PinnedWheel {
    file_name: "nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/60/44/202e027c224c26e15a53f01c5c7604c7f6b4fd368882d3164ea08fead207/nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl",
    sha256: "a8d02f3cba345be56b1ffc3e74d8f61f02bb758dd31b0f20e12277a5a244f756",
};

/// Writes `cuda-nvrtc-11.8.89-h0_0.conda` into `linux64` from the real NVRTC 11.8 wheel:
/// `libnvrtc.so.11.2` and `libnvrtc-builtins.so.11.8` (which needs `libstdc++.so.6`).
pub(crate) fn write_cuda_nvrtc_11_8(cache_dir: &Path, linux64: &Path) -> anyhow::Result<()> {
    write_wheel_library_package(
        &fetch_wheel(cache_dir, &NVRTC_11_8)?,
        &linux64.join("cuda-nvrtc-11.8.89-h0_0.conda"),
        "cuda-nvrtc",
        "11.8.89",
        &[
            (
                "nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2",
                "lib/libnvrtc.so.11.2",
            ),
            (
                "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.11.8",
                "lib/libnvrtc-builtins.so.11.8",
            ),
        ],
        &[("lib/libnvrtc.so", "libnvrtc.so.11.2")],
    )
}

/// Writes imgbuild itself as the conda package `imgbuild-VERSION-hHASH_0.conda` into
/// `linux64`, what `recipes/imgbuild-builder.toml` installs: `bin/imgbuild` and
/// `bin/imgbuild-smoke`, depending on `__glibc >=` the newest `GLIBC_x.y` either needs (read
/// from their ELF version needs). The build string carries a hash of both binaries: rattler's
/// package cache keys on name-version-build, so other binaries must be another build.
pub(crate) fn write_imgbuild_package(
    linux64: &Path,
    imgbuild: &Path,
    smoke: &Path,
    version: &str,
) -> anyhow::Result<PathBuf> {
    fs_err::create_dir_all(linux64)?;
    let mut glibc: Option<rattler_conda_types::Version> = None;
    let mut hasher = Sha256::new();
    let mut entries = Vec::new();
    for (binary, path) in [(imgbuild, "bin/imgbuild"), (smoke, "bin/imgbuild-smoke")] {
        let needs = imgbuild::smoke::embed::SmokeExecutable::read(binary)?.glibc;
        if needs > glibc {
            glibc = needs;
        }
        let bytes = fs_err::read(binary)?;
        hasher.update(&bytes);
        entries.push(executable(path, bytes));
    }
    let glibc = glibc.map_or_else(|| "2.17".to_string(), |v| v.to_string());
    let build = format!("h{}_0", &hex::encode(hasher.finalize())[..8]);
    let mut index = linux64_index("imgbuild", version, &[&format!("__glibc >={glibc}")]);
    index["build"] = build.clone().into();
    index["license"] = "Apache-2.0".into();
    let out = linux64.join(format!("imgbuild-{version}-{build}.conda"));
    write_package(&out, index, &entries, None)?;
    Ok(out)
}

/// Returns the path of NVIDIA's `nvidia-cuda-runtime-cu11` 11.8.89 wheel (see [`fetch_wheel`]).
pub(crate) fn cuda_runtime_wheel(cache_dir: &Path) -> anyhow::Result<PathBuf> {
    fetch_wheel(cache_dir, &CUDA_RUNTIME_11_8)
}

/// Returns the path of `wheel`, downloading it from PyPI into `cache_dir` unless it is already
/// there, in `$IMGBUILD_TEST_WHEELS`, or in pip's find-links directory `/opt/wheels`. Every
/// candidate, and every download, is checked against the pinned sha256; a mismatch is an error
/// rather than a silent re-download, because it means someone put a different file under that
/// name.
pub(crate) fn fetch_wheel(cache_dir: &Path, wheel: &PinnedWheel) -> anyhow::Result<PathBuf> {
    let PinnedWheel {
        file_name,
        url,
        sha256,
    } = *wheel;
    let mut candidates = vec![cache_dir.join(file_name)];
    if let Some(dir) = std::env::var_os("IMGBUILD_TEST_WHEELS") {
        candidates.push(Path::new(&dir).join(file_name));
    }
    candidates.push(Path::new("/opt/wheels").join(file_name));
    for candidate in candidates {
        if candidate.is_file() {
            verify_sha256(&candidate, sha256)?;
            return Ok(candidate);
        }
    }

    fs_err::create_dir_all(cache_dir)?;
    let target = cache_dir.join(file_name);
    // Download under a temporary name in the same directory, so a half-written or wrong file is
    // never seen under the final name and the final rename is atomic (concurrent test processes
    // may race here; both write the same bytes).
    let tmp = tempfile::Builder::new()
        .prefix(".download-")
        .tempfile_in(cache_dir)
        .with_context(|| format!("creating a temporary file in {}", cache_dir.display()))?;
    let digest = block_on_fresh_runtime(|| download(url, tmp.path())).with_context(|| {
        format!(
            "downloading {url} (offline? put {file_name} in $IMGBUILD_TEST_WHEELS or {})",
            cache_dir.display()
        )
    })?;
    ensure!(
        digest == sha256,
        "sha256 mismatch for {url}: expected {sha256}, got {digest}"
    );
    // tempfile creates 0600 files; a cache may be shared by users and containers.
    fs_err::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(&target)
        .with_context(|| format!("moving the download to {}", target.display()))?;
    Ok(target)
}

/// MarkupSafe 2.1.5 for CPython 3.11 on x86-64 Linux: a real x86-64 ELF extension module.
pub(crate) const MARKUPSAFE_X86_64: PinnedWheel = PinnedWheel {
    file_name: "MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/97/18/\
c30da5e7a0e7f4603abfc6780574131221d9148f323752c2755d48abad30/\
MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256: "b91c037585eba9095565a3556f611e3cbfaa42ca1e865f7b8015fe5c7336d5a5",
};

/// The same release for aarch64 Linux: a real aarch64 ELF extension module.
pub(crate) const MARKUPSAFE_AARCH64: PinnedWheel = PinnedWheel {
    file_name: "MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    url: "https://files.pythonhosted.org/packages/1c/cf/\
35fe557e53709e93feb65575c93927942087e9b97213eabc3fe9d5b25a55/\
MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    sha256: "6ec585f69cec0aa07d945b20805be741395e28ac1627333b1c5b0105962ffced",
};

/// Writes a two-platform channel into `channel_dir`: `speedups` 2.1.5 for `linux-64` and for
/// `linux-aarch64`, each holding MarkupSafe's real compiled extension for its architecture
/// (`lib/_speedups.so`, from the pinned PyPI wheels), and a `noarch: generic` package
/// `greeting` both platforms install. Indexed with rattler_index.
pub(crate) fn write_platforms_channel(channel_dir: &Path, cache_dir: &Path) -> anyhow::Result<()> {
    for (subdir, arch, wheel, member) in [
        (
            "linux-64",
            "x86_64",
            MARKUPSAFE_X86_64,
            "markupsafe/_speedups.cpython-311-x86_64-linux-gnu.so",
        ),
        (
            "linux-aarch64",
            "aarch64",
            MARKUPSAFE_AARCH64,
            "markupsafe/_speedups.cpython-311-aarch64-linux-gnu.so",
        ),
    ] {
        let wheel = fetch_wheel(cache_dir, &wheel)?;
        let mut zip = zip::ZipArchive::new(fs_err::File::open(&wheel)?)
            .with_context(|| format!("opening {}", wheel.display()))?;
        let mut library = Vec::new();
        zip.by_name(member)
            .with_context(|| format!("{member} in {}", wheel.display()))?
            .read_to_end(&mut library)?;
        ensure!(
            library.starts_with(b"\x7fELF"),
            "{member} is not an ELF file"
        );
        let mut index = linux64_index("speedups", "2.1.5", &["__glibc >=2.17"]);
        index["subdir"] = subdir.into();
        index["arch"] = arch.into();
        index["license"] = "BSD-3-Clause".into();
        let dir = channel_dir.join(subdir);
        fs_err::create_dir_all(&dir)?;
        write_package(
            &dir.join("speedups-2.1.5-h0_0.conda"),
            index,
            &[executable("lib/_speedups.so", library)],
            None,
        )?;
    }
    let noarch = channel_dir.join("noarch");
    fs_err::create_dir_all(&noarch)?;
    write_package(
        &noarch.join("greeting-1.0-0.tar.bz2"),
        serde_json::json!({
            "arch": null,
            "build": "0",
            "build_number": 0,
            "depends": [],
            "license": "Apache-2.0",
            "name": "greeting",
            "noarch": "generic",
            "platform": null,
            "subdir": "noarch",
            "timestamp": TIMESTAMP_MS,
            "version": "1.0",
        }),
        &[file("share/greeting.txt", "hello from every platform\n")],
        None,
    )?;
    index_channel(channel_dir)
}

/// Writes a conda package `name-version-h0_0.conda` (linux-64) holding shared libraries taken
/// from a wheel: `files` maps wheel members to prefix paths, `links` adds symlinks.
pub(crate) fn write_wheel_library_package(
    wheel: &Path,
    out: &Path,
    name: &str,
    version: &str,
    files: &[(&str, &str)],
    links: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut zip = zip::ZipArchive::new(fs_err::File::open(wheel)?)
        .with_context(|| format!("opening {}", wheel.display()))?;
    let mut entries = Vec::new();
    for (member, path) in files {
        let mut bytes = Vec::new();
        zip.by_name(member)
            .with_context(|| format!("{member} in {}", wheel.display()))?
            .read_to_end(&mut bytes)?;
        ensure!(bytes.starts_with(b"\x7fELF"), "{member} is not an ELF file");
        entries.push(executable(*path, bytes));
    }
    for (path, target) in links {
        entries.push(link(*path, *target));
    }
    let mut index = linux64_index(name, version, &["__glibc >=2.17"]);
    index["license"] = "NVIDIA End User License Agreement".into();
    write_package(out, index, &entries, None)
}

/// Streams `url` into `dest` and returns the hex sha256 of what was written.
async fn download(url: &str, dest: &Path) -> anyhow::Result<String> {
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(std::time::Duration::from_secs(600))
        .build()?;
    let mut response = client.get(url).send().await?.error_for_status()?;
    let mut file = fs_err::File::create(dest)?;
    let mut hasher = Sha256::new();
    while let Some(chunk) = response.chunk().await? {
        hasher.update(&chunk);
        file.write_all(&chunk)?;
    }
    file.sync_all()?;
    Ok(hex::encode(hasher.finalize()))
}

/// Runs an async job on its own current-thread runtime in its own OS thread, so the sync helpers
/// here work both from plain `#[test]`s and from inside a `#[tokio::test]` (where `block_on` on
/// the calling thread would panic with "Cannot start a runtime from within a runtime").
fn block_on_fresh_runtime<T, Fut, F>(job: F) -> anyhow::Result<T>
where
    T: Send,
    Fut: Future<Output = anyhow::Result<T>>,
    F: FnOnce() -> Fut + Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(job())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the async helper thread panicked"))?
    })
}

/// The hex sha256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The hex sha256 of a file, read in pieces.
pub(crate) fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut file = fs_err::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

fn verify_sha256(path: &Path, expected: &str) -> anyhow::Result<()> {
    let actual = sha256_file(path)?;
    ensure!(
        actual == expected,
        "sha256 mismatch for {}: expected {expected}, got {actual}",
        path.display()
    );
    Ok(())
}

/// Writes the test channel into `channel_dir` (`linux-64/`, `noarch/`, each with a
/// `repodata.json`) and checks that rattler reads every package back from the index.
///
/// `cache_dir` is where the CUDA runtime wheel is cached (see [`cuda_runtime_wheel`]).
pub(crate) fn write_test_channel(channel_dir: &Path, cache_dir: &Path) -> anyhow::Result<()> {
    let linux64 = channel_dir.join("linux-64");
    let noarch = channel_dir.join("noarch");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(&noarch)?;

    // a. Real third-party packages, copied untouched.
    let real_dir = fixtures_dir().join("channel");
    for (subdir, name, sha256) in REAL_PACKAGES {
        let from = real_dir.join(subdir).join(name);
        let to = channel_dir.join(subdir).join(name);
        fs_err::copy(&from, &to)
            .context("copying a real fixture package from tests/data/conda-real")?;
        // A fixture may be read-only in a checkout; the channel copy must not be, so it can be
        // rewritten (a second run into the same directory) or cleaned up as any user.
        fs_err::set_permissions(&to, std::fs::Permissions::from_mode(0o644))?;
        verify_sha256(&to, sha256)?;
    }

    // b..g. Packages made here.
    let wheel = cuda_runtime_wheel(cache_dir)?;
    write_cuda_cudart(&wheel, &linux64.join("cuda-cudart-11.8.89-h0_0.conda"))?;
    write_hello("1.0", "hello", &linux64.join("hello-1.0-h0_0.tar.bz2"))?;
    write_hello("2.0", "hello 2", &linux64.join("hello-2.0-h0_0.tar.bz2"))?;
    write_python_standin(&linux64.join("python-3.9.18-h0_0.tar.bz2"))?;
    write_pyhello(&noarch.join("pyhello-1.0-pyh0_0.conda"))?;
    write_other(&linux64.join("other-1.0-h0_0.tar.bz2"))?;
    write_libgcc_standin(&linux64.join("libgcc-ng-13.2.0-h0_0.tar.bz2"))?;
    write_activation(&linux64.join("activation-1.0-h0_0.tar.bz2"))?;
    write_greeting(&linux64.join("greeting-1.0-h0_0.tar.bz2"))?;

    index_channel(channel_dir)?;
    check_repodata(channel_dir)
}

/// Indexes `channel_dir` with rattler_index, the way a user's local channel would be indexed,
/// then pins the indexing time so `repodata.json` is reproducible.
pub(crate) fn index_channel(channel_dir: &Path) -> anyhow::Result<()> {
    let config = rattler_index::IndexFsConfig {
        channel: channel_dir.to_path_buf(),
        target_platform: None, // every subdir found
        repodata_patch: None,
        write_zst: false,
        write_shards: false,
        repodata_revisions: vec![],
        package_revision_assignment: Default::default(),
        force: true,
        max_parallel: 2,
        multi_progress: None,
    };
    block_on_fresh_runtime(|| rattler_index::index_fs(config))
        .with_context(|| format!("indexing {}", channel_dir.display()))?;
    // rattler_index leaves an empty `.tmp/` (its staging area) at the channel root; remove it
    // so the channel holds only subdirs. `remove_dir` never removes a non-empty directory.
    let _ = fs_err::remove_dir(channel_dir.join(".tmp"));
    for subdir in subdirs(channel_dir)? {
        let path = subdir.join("repodata.json");
        let json = fs_err::read_to_string(&path)?;
        fs_err::write(&path, pin_indexed_timestamps(&json, TIMESTAMP_MS)?)?;
    }
    Ok(())
}

fn subdirs(channel_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for entry in fs_err::read_dir(channel_dir)? {
        let path = entry?.path();
        if path.join("repodata.json").is_file() {
            dirs.push(path);
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// rattler_index stamps every record with `indexed_timestamp` = the current time. That value is
/// copied into lock files and `conda-meta/*.json`, so two test processes that each index the
/// channel would otherwise solve to different lock files. Replace it, byte for byte in
/// rattler_index's own (compact) output, with [`TIMESTAMP_MS`]; fail loudly if the output format
/// ever changes so that not every record got pinned.
pub(crate) fn pin_indexed_timestamps(json: &str, ms: u64) -> anyhow::Result<String> {
    const KEY: &str = "\"indexed_timestamp\":";
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    let mut pinned = 0usize;
    while let Some(at) = rest.find(KEY) {
        let after = &rest[at + KEY.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        ensure!(digits > 0, "unexpected repodata.json format after {KEY}");
        out.push_str(&rest[..at + KEY.len()]);
        out.push_str(&ms.to_string());
        rest = &after[digits..];
        pinned += 1;
    }
    out.push_str(rest);

    let repodata: RepoData = serde_json::from_str(&out).context("re-reading pinned repodata")?;
    let records = repodata.packages.len() + repodata.conda_packages.len();
    ensure!(
        pinned == records,
        "pinned {pinned} indexed_timestamp values but repodata.json has {records} records"
    );
    Ok(out)
}

/// Every package we put in the channel must be in its index, i.e. rattler could read it.
fn check_repodata(channel_dir: &Path) -> anyhow::Result<()> {
    for subdir in ["linux-64", "noarch"] {
        let path = channel_dir.join(subdir).join("repodata.json");
        let repodata =
            RepoData::from_path(&path).with_context(|| format!("reading {}", path.display()))?;
        let indexed: BTreeSet<String> = repodata
            .packages
            .keys()
            .chain(repodata.conda_packages.keys())
            .map(|id| id.to_string())
            .collect();
        for name in channel_packages(subdir) {
            ensure!(
                indexed.contains(&name),
                "{name} is missing from {}; indexed: {indexed:?}",
                path.display()
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Package writer

/// One entry of a package's payload (everything outside `info/`).
pub(crate) enum Entry {
    File {
        path: String,
        bytes: Vec<u8>,
        executable: bool,
        /// `Some("text" | "binary")` when the file contains [`PLACEHOLDER`] and must be patched.
        file_mode: Option<&'static str>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    fn path(&self) -> &str {
        match self {
            Entry::File { path, .. } | Entry::Symlink { path, .. } => path,
        }
    }
}

/// A plain (mode 0644) payload file.
pub(crate) fn file(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Entry {
    Entry::File {
        path: path.into(),
        bytes: bytes.into(),
        executable: false,
        file_mode: None,
    }
}

/// An executable (mode 0755) payload file.
pub(crate) fn executable(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Entry {
    Entry::File {
        path: path.into(),
        bytes: bytes.into(),
        executable: true,
        file_mode: None,
    }
}

fn patched(entry: Entry, mode: &'static str) -> Entry {
    match entry {
        Entry::File {
            path,
            bytes,
            executable,
            ..
        } => Entry::File {
            path,
            bytes,
            executable,
            file_mode: Some(mode),
        },
        link => link,
    }
}

/// A symlink in the payload; `target` must resolve to a payload file.
pub(crate) fn link(path: impl Into<String>, target: impl Into<String>) -> Entry {
    Entry::Symlink {
        path: path.into(),
        target: target.into(),
    }
}

/// Writes a package to `out` (`.conda` or `.tar.bz2`, from the file name): lays the payload out
/// in a staging directory, writes `info/index.json`, `info/paths.json`, `info/files` and an
/// optional `info/link.json`, checks rattler parses them, and archives everything with the fixed
/// [`TIMESTAMP`].
pub(crate) fn write_package(
    out: &Path,
    index: serde_json::Value,
    entries: &[Entry],
    link_json: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    let staging = tempfile::tempdir()?;
    let base = staging.path();
    let mut paths = Vec::new();
    let mut payload: Vec<&str> = Vec::new();

    for entry in entries {
        let (rel, abs) = (entry.path(), base.join(entry.path()));
        fs_err::create_dir_all(abs.parent().expect("payload paths have a parent"))?;
        match entry {
            Entry::File {
                bytes, executable, ..
            } => {
                fs_err::write(&abs, bytes)?;
                // Only the executable bit survives: the archive writer normalises modes to 0644
                // or 0755 (tar HeaderMode::Deterministic), so the host umask cannot leak in.
                let mode = if *executable { 0o755 } else { 0o644 };
                fs_err::set_permissions(&abs, std::fs::Permissions::from_mode(mode))?;
            }
            Entry::Symlink { target, .. } => {
                symlink(target, &abs)
                    .with_context(|| format!("symlink {} -> {target}", abs.display()))?;
            }
        }
        paths.push(abs);
        payload.push(rel);
    }

    // paths.json, in path order like conda-build writes it.
    let mut by_path: Vec<&Entry> = entries.iter().collect();
    by_path.sort_by(|a, b| a.path().cmp(b.path()));
    let mut records = Vec::new();
    for entry in by_path {
        records.push(match entry {
            Entry::File {
                path,
                bytes,
                file_mode,
                ..
            } => {
                let mut record = serde_json::json!({
                    "_path": path,
                    "path_type": "hardlink",
                    "sha256": sha256_hex(bytes),
                    "size_in_bytes": bytes.len(),
                });
                if let Some(mode) = file_mode {
                    ensure!(
                        contains(bytes, PLACEHOLDER.as_bytes()),
                        "{path} is marked for prefix replacement but has no placeholder"
                    );
                    record["file_mode"] = (*mode).into();
                    record["prefix_placeholder"] = PLACEHOLDER.into();
                } else {
                    ensure!(
                        !contains(bytes, PLACEHOLDER.as_bytes()),
                        "{path} contains the placeholder but is not marked for replacement"
                    );
                }
                record
            }
            // conda-build records a softlink with the sha256 and size of the file it points to.
            Entry::Symlink { path, .. } => {
                let resolved = fs_err::read(base.join(path))
                    .with_context(|| format!("softlink {path} must point at a payload file"))?;
                serde_json::json!({
                    "_path": path,
                    "path_type": "softlink",
                    "sha256": sha256_hex(&resolved),
                    "size_in_bytes": resolved.len(),
                })
            }
        });
    }
    let paths_json = serde_json::json!({ "paths": records, "paths_version": 1 });

    let info = base.join("info");
    fs_err::create_dir_all(&info)?;
    let mut info_files = vec![
        ("index.json", to_json(&index)?),
        ("paths.json", to_json(&paths_json)?),
    ];
    // info/files is the pre-paths.json file list; old conda versions still read it.
    let mut listing: Vec<&str> = payload.clone();
    listing.sort_unstable();
    info_files.push(("files", listing.iter().map(|p| format!("{p}\n")).collect()));
    if let Some(link_json) = &link_json {
        info_files.push(("link.json", to_json(link_json)?));
    }
    for (name, text) in info_files {
        let path = info.join(name);
        fs_err::write(&path, text)?;
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        paths.push(path);
    }

    // What we wrote must be what rattler reads.
    IndexJson::from_package_directory(base).context("rattler rejects our index.json")?;
    PathsJson::from_package_directory(base).context("rattler rejects our paths.json")?;
    if link_json.is_some() {
        LinkJson::from_package_directory(base).context("rattler rejects our link.json")?;
    }

    let timestamp: jiff::Timestamp = TIMESTAMP.parse()?;
    let file_name = out
        .file_name()
        .and_then(|n| n.to_str())
        .context("package file name")?;
    let writer = fs_err::File::create(out)?;
    if let Some(stem) = file_name.strip_suffix(".conda") {
        // One zstd thread: zstd's output depends on its worker count.
        rattler_package_streaming::write::write_conda_package(
            writer,
            base,
            &paths,
            CompressionLevel::Default,
            Some(1),
            stem,
            Some(&timestamp),
            None,
        )?;
    } else if file_name.ends_with(".tar.bz2") {
        rattler_package_streaming::write::write_tar_bz2_package(
            writer,
            base,
            &paths,
            CompressionLevel::Default,
            Some(&timestamp),
            None,
        )?;
    } else {
        bail!("unknown package format: {file_name}");
    }
    Ok(())
}

fn to_json(value: &serde_json::Value) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `tiny-1.0-h0_0.conda` in `linux64`: one small file, `share/tiny/hello`.
pub(crate) fn write_tiny(linux64: &Path) -> anyhow::Result<()> {
    write_package(
        &linux64.join("tiny-1.0-h0_0.conda"),
        linux64_index("tiny", "1.0", &[]),
        &[file("share/tiny/hello", "hello\n")],
        None,
    )
}

/// The `index.json` of a linux-64 package, build `h0_0`, built at [`TIMESTAMP`].
pub(crate) fn linux64_index(name: &str, version: &str, depends: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "arch": "x86_64",
        "build": "h0_0",
        "build_number": 0,
        "depends": depends,
        "license": "Apache-2.0",
        "name": name,
        "platform": "linux",
        "subdir": "linux-64",
        "timestamp": TIMESTAMP_MS,
        "version": version,
    })
}

// ---------------------------------------------------------------------------------------------
// The made packages

/// b. `cuda-cudart` 11.8.89 built from NVIDIA's wheel: the real ELF `libcudart.so.11.0`, its
/// development symlink and one header.
fn write_cuda_cudart(wheel: &Path, out: &Path) -> anyhow::Result<()> {
    let mut zip = zip::ZipArchive::new(fs_err::File::open(wheel)?)
        .with_context(|| format!("opening {}", wheel.display()))?;
    let mut member = |name: &str| -> anyhow::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        zip.by_name(name)
            .with_context(|| format!("{name} in {}", wheel.display()))?
            .read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    let libcudart = member("nvidia/cuda_runtime/lib/libcudart.so.11.0")?;
    let header = member("nvidia/cuda_runtime/include/cuda_runtime_api.h")?;
    ensure!(
        libcudart.starts_with(b"\x7fELF"),
        "libcudart.so.11.0 is not an ELF file"
    );

    let mut index = linux64_index("cuda-cudart", "11.8.89", &["__glibc >=2.17"]);
    index["license"] = "NVIDIA End User License Agreement".into();
    write_package(
        out,
        index,
        &[
            executable("lib/libcudart.so.11.0", libcudart),
            link("lib/libcudart.so", "libcudart.so.11.0"),
            file("include/cuda_runtime_api.h", header),
        ],
        None,
    )
}

/// c/d. `hello`: a script, a config file and a binary data file that all embed the placeholder
/// (text and binary prefix replacement), and a relative symlink.
fn write_hello(version: &str, greeting: &str, out: &Path) -> anyhow::Result<()> {
    let script = format!("#!/bin/sh\necho \"{greeting} from {PLACEHOLDER}\"\n");
    let conf = format!("prefix={PLACEHOLDER}/share/hello\n");
    // A binary file: a magic, NULs and high bytes around the placeholder as a NUL-terminated C
    // string, the way a compiled-in path sits in a shared library. Binary replacement must keep
    // the file length and pad the shortened string with NULs.
    let mut data = b"HELLODAT\0\x01\x02\xff\0".to_vec();
    data.extend_from_slice(PLACEHOLDER.as_bytes());
    data.extend_from_slice(b"/share/hello\0");
    data.extend_from_slice(b"\xde\xad\xbe\xef\0\0\0\0trailer\0");

    write_package(
        out,
        linux64_index("hello", version, &["cuda-cudart 11.8.*"]),
        &[
            patched(executable("bin/hello", script), "text"),
            link("bin/hi", "hello"),
            patched(file("etc/hello.conf", conf), "text"),
            patched(file("lib/libhello.data", data), "binary"),
        ],
        None,
    )
}

/// The demo's command (`recipes/demo.toml`): `hello`'s script without its CUDA runtime, so
/// the demo image carries no CUDA and asks for no GPU.
fn write_greeting(out: &Path) -> anyhow::Result<()> {
    let script = format!("#!/bin/sh\necho \"hello from {PLACEHOLDER}\"\n");
    write_package(
        out,
        linux64_index("greeting", "1.0", &[]),
        &[patched(executable("bin/greeting", script), "text")],
        None,
    )
}

/// e. A STAND-IN for CPython 3.9: no conda channel is reachable from our machines, so there is no
/// real `python` package to install. It has the layout rattler's noarch-python linking relies
/// on (`bin/python3.9`, `lib/python3.9/site-packages`) and a shell script that says what it is.
fn write_python_standin(out: &Path) -> anyhow::Result<()> {
    write_package(
        out,
        linux64_index("python", "3.9.18", &[]),
        &[
            executable(
                "bin/python3.9",
                "#!/bin/sh\necho \"stand-in python 3.9 $@\"\n",
            ),
            link("bin/python", "python3.9"),
            // Archives carry no empty directories, so a marker file keeps site-packages.
            file(
                "lib/python3.9/site-packages/README.txt",
                "site-packages of the stand-in python used by imgbuild's tests\n",
            ),
        ],
        None,
    )
}

/// f. A noarch: python package with an entry point, linked into the python package's
/// site-packages at install time.
fn write_pyhello(out: &Path) -> anyhow::Result<()> {
    let index = serde_json::json!({
        "build": "pyh0_0",
        "build_number": 0,
        "depends": ["python >=3.9"],
        "license": "Apache-2.0",
        "name": "pyhello",
        "noarch": "python",
        "subdir": "noarch",
        "timestamp": TIMESTAMP_MS,
        "version": "1.0",
    });
    let link_json = serde_json::json!({
        "noarch": { "type": "python", "entry_points": ["pyhello = pyhello:main"] },
        "package_metadata_version": 1,
    });
    write_package(
        out,
        index,
        &[file(
            "site-packages/pyhello/__init__.py",
            "def main():\n    print(\"hi\")\n",
        )],
        Some(link_json),
    )
}

/// i. A package that sets environment variables on activation, the way `cuda-nvcc` or
/// `openjdk` do: `etc/conda/env_vars.d/*.json` (static, becomes image `Env`) and an
/// `etc/conda/activate.d/*.sh` script (target code, never run at build time).
fn write_activation(out: &Path) -> anyhow::Result<()> {
    write_package(
        out,
        linux64_index("activation", "1.0", &[]),
        &[
            file(
                "etc/conda/env_vars.d/activation.json",
                "{\"ACTIVATION_HOME\": \"/somewhere/else\", \"ACTIVATION_MODE\": \"static\"}\n",
            ),
            executable(
                "etc/conda/activate.d/activation.sh",
                "export ACTIVATION_SCRIPT_RAN=yes\n",
            ),
        ],
        None,
    )
}

/// h. A STAND-IN for conda-forge's `libgcc-ng` (metadata only): the real `zlib` fixtures
/// depend on it, and with it they can be solved, so tests reach their broken payloads.
fn write_libgcc_standin(out: &Path) -> anyhow::Result<()> {
    write_package(
        out,
        linux64_index("libgcc-ng", "13.2.0", &[]),
        &[file(
            "share/libgcc-ng/STAND-IN",
            "metadata-only stand-in for tests\n",
        )],
        None,
    )
}

/// g. A second package that depends on `cuda-cudart`, so two recipes can share it.
fn write_other(out: &Path) -> anyhow::Result<()> {
    write_package(
        out,
        linux64_index("other", "1.0", &["cuda-cudart 11.8.*"]),
        &[file("share/other/data.txt", "other package data\n")],
        None,
    )
}

// ---------------------------------------------------------------------------------------------
// Recipes

/// A minimal recipe on `scratch` for linux-64 that installs `deps` from the channel at
/// `channel_dir` (must be absolute).
pub(crate) fn tiny_recipe(channel_dir: &Path, name: &str, deps: &[&str]) -> String {
    let url = url::Url::from_file_path(channel_dir)
        .unwrap_or_else(|()| panic!("channel dir must be absolute: {}", channel_dir.display()));
    // JSON string syntax is valid TOML basic-string syntax, and serde_json escapes properly.
    let quote = |s: &str| serde_json::to_string(s).expect("strings serialise");
    let deps: Vec<String> = deps.iter().map(|d| quote(d)).collect();
    format!(
        "[image]\nname = {name}\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [{url}]\ndependencies = [{deps}]\n",
        name = quote(name),
        url = quote(url.as_str()),
        deps = deps.join(", "),
    )
}
