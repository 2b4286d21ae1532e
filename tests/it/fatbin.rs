//! Issue 16, part 5: the GPU architectures of real NVIDIA libraries, read from their CUDA
//! fatbins (`src/cuda/fatbin.rs`).

use std::io::Read;

use imgbuild::cuda::fatbin::{self, Coverage};

use crate::support::{
    channel::{PinnedWheel, cuda_runtime_wheel, fetch_wheel},
    test_cache_dir,
};

/// NVIDIA's `nvidia-curand-cu12` 10.3.2.106 (CUDA 12.1): `libcurand.so.10`, 97 MB, eleven
/// fatbin blobs, one of them compressed PTX.
const CURAND_12_1: PinnedWheel = PinnedWheel {
    file_name: "nvidia_curand_cu12-10.3.2.106-py3-none-manylinux1_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/44/31/\
4890b1c9abc496303412947fc7dcea3d14861720642b49e8ceed89636705/\
nvidia_curand_cu12-10.3.2.106-py3-none-manylinux1_x86_64.whl",
    sha256: "9d264c5036dde4e64f1de8c50ae753237c12e0b1348738169cd0f8a536c0e1e0",
};

/// Extracts `member` of `wheel` into `dir`, returning its path.
fn extract(
    wheel: &std::path::Path,
    member: &str,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let mut zip = zip::ZipArchive::new(fs_err::File::open(wheel)?)?;
    let out = dir.join(member);
    fs_err::create_dir_all(out.parent().unwrap())?;
    std::io::copy(&mut zip.by_name(member)?, &mut fs_err::File::create(&out)?)?;
    Ok(out)
}

/// CUDA 12.1's libraries carry SASS for every architecture from Maxwell to Hopper and PTX
/// for the newest, as NVIDIA's release notes list them.
#[test]
fn curand_of_cuda_12_1_carries_sm_50_to_sm_90_and_compute_90() -> anyhow::Result<()> {
    let wheel = fetch_wheel(&test_cache_dir(), &CURAND_12_1)?;
    let dir = tempfile::tempdir()?;
    let member = "nvidia/curand/lib/libcurand.so.10";
    extract(&wheel, member, dir.path())?;
    let archs = fatbin::read_library(&dir.path().join(member))?.expect("a fatbin");
    assert_eq!(
        fatbin::format_list(&archs),
        "sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,compute_90"
    );
    // An Ampere A10 (8.6) runs its SASS, a Blackwell B200 (10.0) only JIT-compiles the PTX,
    // a Kepler K80 (3.7) runs nothing.
    assert!(matches!(fatbin::coverage(&archs, 86), Coverage::Sass(a) if a.sm == 86));
    assert!(matches!(fatbin::coverage(&archs, 100), Coverage::PtxOnly(a) if a.sm == 90));
    assert_eq!(fatbin::coverage(&archs, 37), Coverage::None);

    // Scanned as the wheel's files in a prefix, the package carries the same.
    let files = [member.to_string(), "nvidia/curand/include/curand.h".into()];
    let (found, warnings) = fatbin::scan_packages(
        dir.path(),
        [("pypi:nvidia_curand_cu12-10.3.2.106".to_string(), &files[..])],
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].union(), archs);
    Ok(())
}

/// A real library with no kernels (`libcudart`) has no fatbin: nothing, not an error.
#[test]
fn cudart_has_no_fatbin() -> anyhow::Result<()> {
    let wheel = cuda_runtime_wheel(&test_cache_dir())?;
    let dir = tempfile::tempdir()?;
    let lib = extract(
        &wheel,
        "nvidia/cuda_runtime/lib/libcudart.so.11.0",
        dir.path(),
    )?;
    assert_eq!(fatbin::read_library(&lib)?, None);
    Ok(())
}

/// A library whose fatbin claims more than its section holds is a typed error the scan
/// turns into a warning, never a panic or an allocation of the size it claims.
#[test]
fn a_forged_fatbin_is_a_warning_naming_the_library() -> anyhow::Result<()> {
    let wheel = fetch_wheel(&test_cache_dir(), &CURAND_12_1)?;
    let mut zip = zip::ZipArchive::new(fs_err::File::open(&wheel)?)?;
    let mut bytes = Vec::new();
    zip.by_name("nvidia/curand/lib/libcurand.so.10")?
        .read_to_end(&mut bytes)?;
    // The section starts at 0x14b00e0; its first blob now claims an exabyte of payload.
    let blob = 0x14b00e0;
    assert_eq!(bytes[blob..blob + 4], 0xBA55_ED50u32.to_le_bytes());
    bytes[blob + 8..blob + 16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let dir = tempfile::tempdir()?;
    fs_err::create_dir_all(dir.path().join("lib"))?;
    fs_err::write(dir.path().join("lib/libcurand.so.10"), &bytes)?;
    let files = ["lib/libcurand.so.10".to_string()];
    let (found, warnings) = fatbin::scan_packages(
        dir.path(),
        [("libcurand-10.3.2.106-0".to_string(), &files[..])],
    );
    assert!(found.is_empty());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("`lib/libcurand.so.10` (libcurand-10.3.2.106-0)")
            && warnings[0].contains("malformed"),
        "{}",
        warnings[0]
    );
    Ok(())
}
