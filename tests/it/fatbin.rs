//! Issue 16, part 5: the GPU architectures of real NVIDIA libraries, read from their CUDA
//! fatbins (`crates/imgbuild-model/src/cuda/fatbin.rs`).

use std::io::Read;

use imgbuild::cuda::fatbin::{self, Coverage};

use crate::{
    common::{LayoutView, Project},
    support::{
        channel::{
            PinnedWheel, cuda_runtime_wheel, executable, fetch_wheel, index_channel, linux64_index,
            tiny_recipe, write_package,
        },
        test_cache_dir,
    },
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

/// The same library of CUDA 11.8: `nvidia-curand-cu11` 10.3.0.86.
const CURAND_11_8: PinnedWheel = PinnedWheel {
    file_name: "nvidia_curand_cu11-10.3.0.86-py3-none-manylinux2014_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/58/e5/\
ce5806afc48a6e4e0dddd25316ac60b6fa94fd1791bdbf4ca17bf52696ea/\
nvidia_curand_cu11-10.3.0.86-py3-none-manylinux2014_x86_64.whl",
    sha256: "cd4cffbf78bb06580206b4814d5dc696d1161c902aae37b2bba00056832379e6",
};

/// The same library of CUDA 12.9: `nvidia-curand-cu12` 10.3.10.19, PTX ISA 8.8 for compute_121.
const CURAND_12_9: PinnedWheel = PinnedWheel {
    file_name: "nvidia_curand_cu12-10.3.10.19-py3-none-manylinux_2_27_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/31/44/\
193a0e171750ca9f8320626e8a1f2381e4077a65e69e2fb9708bd479e34a/\
nvidia_curand_cu12-10.3.10.19-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "49b274db4780d421bd2ccd362e1415c13887c53c214f0d4b761752b8f9f6aa1e",
};

const CURAND_LIB: &str = "nvidia/curand/lib/libcurand.so.10";

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

/// CUDA 11.8 still builds for Kepler (sm_35, deprecated), and already for Hopper.
#[test]
fn curand_of_cuda_11_8_carries_sm_35_to_sm_90_and_compute_90() -> anyhow::Result<()> {
    let wheel = fetch_wheel(&test_cache_dir(), &CURAND_11_8)?;
    let dir = tempfile::tempdir()?;
    let lib = extract(&wheel, "nvidia/curand/lib/libcurand.so.10", dir.path())?;
    let archs = fatbin::read_library(&lib)?.expect("a fatbin");
    assert_eq!(
        fatbin::format_list(&archs),
        "sm_35,sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,compute_90"
    );
    // A K80 (3.7) runs sm_35; a Maxwell GM204 (5.2) sm_50.
    assert!(matches!(fatbin::coverage(&archs, 37), Coverage::Sass(a) if a.sm == 35));
    assert!(matches!(fatbin::coverage(&archs, 52), Coverage::Sass(a) if a.sm == 50));
    Ok(())
}

/// The PTX ISA of every PTX entry of the real cuRAND of `wheel`: the header's, and the
/// `.version` of the entry's LZ4-decompressed text agrees. Returns the library's architectures
/// and PTX ISAs as the annotations write them.
fn curand_ptx(wheel: &PinnedWheel, isa: &str) -> anyhow::Result<(String, String)> {
    let wheel = fetch_wheel(&test_cache_dir(), wheel)?;
    let dir = tempfile::tempdir()?;
    let lib = extract(&wheel, CURAND_LIB, dir.path())?;
    let entries = fatbin::read_entries(&lib)?.expect("a fatbin");
    let ptx: Vec<_> = entries.iter().filter(|e| e.ptx_isa.is_some()).collect();
    assert_eq!(ptx.len(), 10, "cuRAND's kernel modules each carry one PTX");
    let mut file = fs_err::File::open(&lib)?;
    for entry in &ptx {
        assert_eq!(entry.ptx_isa.unwrap().to_string(), isa);
        let text = fatbin::read_ptx_text(&mut file, entry)?.expect("PTX has text");
        assert!(text.len() as u64 > entry.payload_size / 2, "decompressed");
        let version = imgbuild::cuda::ptx::version_directive(&text)?;
        assert_eq!(version.to_string(), isa, "the text agrees with the header");
    }
    // SASS entries have no ISA and no text.
    let sass = entries.iter().find(|e| e.ptx_isa.is_none()).unwrap();
    assert_eq!(fatbin::read_ptx_text(&mut file, sass)?, None);
    Ok((
        fatbin::format_list(&fatbin::entry_architectures(&entries)),
        fatbin::format_ptx_isas(&fatbin::entry_ptx_isas(&entries)),
    ))
}

/// CUDA 11.8's cuRAND carries PTX ISA 7.8, 12.1's 8.1 and 12.9's 8.8: the ISA of the toolkit
/// that built it, so the driver of that release (`compat::PTX_ISA_RELEASE`).
#[test]
fn the_ptx_isa_of_real_curand_is_its_toolkits() -> anyhow::Result<()> {
    assert_eq!(curand_ptx(&CURAND_11_8, "7.8")?.1, "compute_90:7.8");
    assert_eq!(curand_ptx(&CURAND_12_1, "8.1")?.1, "compute_90:8.1");
    // 12.9 adds Blackwell SASS and builds its PTX for the newest, sm_121.
    assert_eq!(
        curand_ptx(&CURAND_12_9, "8.8")?,
        (
            "sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,sm_100,sm_101,sm_103,sm_120,sm_121,compute_121".to_string(),
            "compute_121:8.8".to_string()
        )
    );
    use imgbuild::cuda::compat::{PtxDriver, ptx_minimum_driver};
    let driver = |isa: &str| match ptx_minimum_driver(isa.parse().unwrap()) {
        PtxDriver::Needs { driver, .. } => driver.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(driver("7.8"), "520.61.05");
    assert_eq!(driver("8.1"), "530.30.02");
    assert_eq!(driver("8.8"), "575.51.03");
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

/// A fatbin entry header as real libraries have it (64 bytes, `arch` at 28, a PTX entry's
/// ISA 8.1 at 24 and 26, as CUDA 12.1 writes it), with no payload.
fn entry(kind: u16, sm: u32) -> Vec<u8> {
    let mut e = vec![0u8; 64];
    e[0..2].copy_from_slice(&kind.to_le_bytes());
    e[4..8].copy_from_slice(&64u32.to_le_bytes());
    if kind == 1 {
        e[24..26].copy_from_slice(&1u16.to_le_bytes());
        e[26..28].copy_from_slice(&8u16.to_le_bytes());
    }
    e[28..32].copy_from_slice(&sm.to_le_bytes());
    e
}

/// A smallest ELF64 shared object whose only contents are a `.nv_fatbin` section of one
/// blob holding `archs` (`(2, 80)` for SASS sm_80, `(1, 90)` for PTX compute_90).
pub(crate) fn tiny_gpu_library(archs: &[(u16, u32)]) -> Vec<u8> {
    let entries: Vec<u8> = archs.iter().flat_map(|&(k, sm)| entry(k, sm)).collect();
    elf_with_fatbin(&entries)
}

/// A smallest ELF64 shared object whose only contents are a `.nv_fatbin` section of one
/// blob holding `entries`, entry headers and payloads as they are.
fn elf_with_fatbin(entries: &[u8]) -> Vec<u8> {
    let mut fatbin = Vec::new();
    fatbin.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
    fatbin.extend_from_slice(&1u16.to_le_bytes());
    fatbin.extend_from_slice(&16u16.to_le_bytes());
    fatbin.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    fatbin.extend_from_slice(entries);
    let names = b"\0.nv_fatbin\0.shstrtab\0";
    let fatbin_at = 64u64;
    let names_at = fatbin_at + fatbin.len() as u64;
    let headers_at = (names_at + names.len() as u64).next_multiple_of(8);

    let mut elf = vec![0u8; 64];
    elf[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[40..48].copy_from_slice(&headers_at.to_le_bytes());
    elf[52..54].copy_from_slice(&64u16.to_le_bytes());
    elf[54..56].copy_from_slice(&56u16.to_le_bytes());
    elf[58..60].copy_from_slice(&64u16.to_le_bytes());
    elf[60..62].copy_from_slice(&3u16.to_le_bytes());
    elf[62..64].copy_from_slice(&2u16.to_le_bytes());
    elf.extend_from_slice(&fatbin);
    elf.extend_from_slice(names);
    elf.resize(headers_at as usize, 0);
    let section = |name: u32, kind: u32, offset: u64, size: u64| {
        let mut h = vec![0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&offset.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[48..56].copy_from_slice(&8u64.to_le_bytes());
        h
    };
    elf.extend(vec![0u8; 64]);
    elf.extend(section(1, 1, fatbin_at, fatbin.len() as u64));
    elf.extend(section(12, 3, names_at, names.len() as u64));
    elf
}

/// A channel of `libgpu` (SASS sm_80 and sm_86, PTX compute_86) and `libold` (sm_60 and
/// compute_60), each a `lib/*.so.1` with a fatbin, and `libcpu` with none.
pub(crate) fn write_gpu_channel(channel: &std::path::Path) -> anyhow::Result<()> {
    let linux64 = channel.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(channel.join("noarch"))?;
    let packages: [(&str, Vec<u8>); 3] = [
        ("libgpu", tiny_gpu_library(&[(2, 80), (2, 86), (1, 86)])),
        ("libold", tiny_gpu_library(&[(1, 60), (2, 60)])),
        ("libcpu", b"\x7fELF not really".to_vec()),
    ];
    for (name, library) in packages {
        write_package(
            &linux64.join(format!("{name}-1.0-h0_0.conda")),
            linux64_index(name, "1.0", &[]),
            &[executable(format!("lib/{name}.so.1"), library)],
            None,
        )?;
    }
    index_channel(channel)
}

/// The build records the architectures of the environment's libraries in the manifest, and
/// `inspect` shows them, all together and per package.
#[test]
fn the_manifest_records_the_architectures_and_inspect_shows_them_per_package() {
    let channel = tempfile::tempdir().unwrap();
    write_gpu_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        channel.path(),
        "gpu",
        &["libgpu", "libold", "libcpu"],
    ));
    project.run(&["build", "recipes/image.toml"]).success();
    let layout = LayoutView::new(project.path().join("images/gpu"));
    let annotations = layout.manifest()["annotations"].clone();
    assert_eq!(
        annotations["dev.imgbuild.cuda.architectures"],
        "sm_60,sm_80,sm_86,compute_60,compute_86"
    );
    assert_eq!(
        annotations["dev.imgbuild.cuda.package-architectures"],
        "libgpu-1.0-h0_0=sm_80,sm_86,compute_86;libold-1.0-h0_0=sm_60,compute_60"
    );
    assert_eq!(
        annotations["dev.imgbuild.cuda.ptx-isa"],
        "libgpu-1.0-h0_0=compute_86:8.1;libold-1.0-h0_0=compute_60:8.1"
    );

    let run = project.run(&["inspect", "images/gpu", "--json"]).success();
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        json["gpu"]["architectures"],
        serde_json::json!(["sm_60", "sm_80", "sm_86", "compute_60", "compute_86"])
    );
    assert_eq!(
        json["gpu"]["packages"][0],
        serde_json::json!({"package": "libgpu-1.0-h0_0", "architectures": ["sm_80", "sm_86", "compute_86"], "ptx_isa": ["compute_86:8.1"]})
    );
    let text = project.run(&["inspect", "images/gpu"]).success().stdout;
    assert!(
        text.contains("gpu          libold-1.0-h0_0: sm_60 compute_60\n"),
        "{text}"
    );
}

/// `[cuda] architectures` fails the build when a library runs on none of them, naming it and
/// what it carries; a library that runs on one of them (by PTX too) passes.
#[test]
fn a_library_for_none_of_the_recipes_architectures_fails_the_build_naming_it() {
    let channel = tempfile::tempdir().unwrap();
    write_gpu_channel(channel.path()).unwrap();
    let project = Project::new();
    let recipe = |archs: &str| {
        tiny_recipe(channel.path(), "gpu", &["libgpu", "libold", "libcpu"])
            + &format!("\n[cuda]\nversion = \"12.1\"\narchitectures = {archs}\n")
    };
    // 7.0: `libold` JIT-compiles its compute_60 PTX, `libgpu` has nothing at or below 7.0.
    project.write_recipe(&recipe("[\"sm_70\"]"));
    let run = project.run(&["build", "recipes/image.toml"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr
            .contains("A library runs on none of `[cuda] architectures` (sm_70)")
            && run
                .stderr
                .contains("`lib/libgpu.so.1` (libgpu-1.0-h0_0) carries sm_80,sm_86,compute_86"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("libold.so.1"), "{}", run.stderr);
    project.assert_no_image();
    // 8.6 runs both (libold by PTX).
    project.write_recipe(&recipe("[\"sm_70\", \"sm_86\"]"));
    project.run(&["build", "recipes/image.toml"]).success();
}

/// `imgbuild k8s` keeps a GPU pod on nodes whose compute capability (GPU feature discovery's
/// labels) every package's kernels run on, ANDed into each driver term; the manifest
/// validates; `--any-gpu-architecture` leaves the requirement out.
#[test]
fn k8s_requires_nodes_of_a_compute_capability_the_kernels_run_on() {
    let channel = tempfile::tempdir().unwrap();
    write_gpu_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(
        &(tiny_recipe(channel.path(), "gpu", &["libgpu", "libold"])
            + "\n[cuda]\nversion = \"12.1\"\nmin-driver = \"530.30.02\"\n"),
    );
    project.run(&["build", "recipes/image.toml"]).success();
    let k8s = |extra: &[&str]| {
        let mut args = vec![
            "k8s",
            "images/gpu",
            "--repository",
            "registry.example/ml/gpu",
        ];
        args.extend_from_slice(extra);
        let run = project.run(&args).success();
        let mut docs = crate::k8s::validated(&project, &run.stdout);
        docs.remove(0)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .as_array()
            .unwrap()
            .clone()
    };
    // `label op values` of the compute capability requirements of each term.
    let compute = |term: &serde_json::Value| -> Vec<String> {
        term["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["key"]
                    .as_str()
                    .unwrap()
                    .starts_with("nvidia.com/gpu.compute.")
            })
            .map(|r| {
                let values: Vec<&str> = r["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                format!(
                    "{} {} {}",
                    r["key"].as_str().unwrap(),
                    r["operator"].as_str().unwrap(),
                    values.join(",")
                )
            })
            .collect()
    };
    let terms = k8s(&[]);
    // Three driver terms (530 < major, 530 and 30 < minor, 530.30 and 1 < rev), each with
    // either compute capability term: 8.0 and newer runs both libraries.
    assert_eq!(terms.len(), 6, "{terms:#?}");
    let every: Vec<Vec<String>> = terms.iter().map(compute).collect();
    for pair in every.chunks(2) {
        assert_eq!(
            pair,
            [
                vec!["nvidia.com/gpu.compute.major In 8,9,10,11,12".to_string()],
                vec!["nvidia.com/gpu.compute.major Gt 12".to_string()],
            ]
        );
    }
    for term in &terms {
        let keys = term["matchExpressions"].to_string();
        assert!(keys.contains("nvidia.com/cuda.driver.major"), "{keys}");
        assert!(keys.contains("kubernetes.io/arch"), "{keys}");
    }
    let opted_out = k8s(&["--any-gpu-architecture"]);
    assert_eq!(opted_out.len(), 3);
    assert!(opted_out.iter().all(|t| compute(t).is_empty()));
}

/// A channel whose `libcurand` package holds NVIDIA's real `libcurand.so.10` of CUDA 12.1:
/// SASS sm_50 to sm_90 and PTX compute_90 of ISA 8.1, so PTX-only on a Blackwell (sm_100).
fn write_curand_channel(channel: &std::path::Path) -> anyhow::Result<()> {
    let wheel = fetch_wheel(&test_cache_dir(), &CURAND_12_1)?;
    let mut zip = zip::ZipArchive::new(fs_err::File::open(&wheel)?)?;
    let mut library = Vec::new();
    zip.by_name(CURAND_LIB)?.read_to_end(&mut library)?;
    let linux64 = channel.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(channel.join("noarch"))?;
    write_package(
        &linux64.join("libcurand-10.3.2.106-h0_0.conda"),
        linux64_index("libcurand", "10.3.2.106", &[]),
        &[executable("lib/libcurand.so.10", library)],
        None,
    )?;
    index_channel(channel)
}

/// A library that runs on a GPU of `[cuda] architectures` only by PTX whose ISA needs a newer
/// driver than `[cuda] min-driver` fails the build, naming the library, its ISA and the
/// driver; with `min-driver` raised the image requires that CUDA of the toolkit
/// (`NVIDIA_REQUIRE_CUDA`, above the 12.0 runtime) and records the ISA.
#[test]
fn real_curand_ptx_on_blackwell_needs_its_toolkits_driver() {
    let channel = tempfile::tempdir().unwrap();
    write_curand_channel(channel.path()).unwrap();
    let project = Project::new();
    let recipe = |min_driver: &str| {
        tiny_recipe(channel.path(), "curand", &["libcurand"])
            + &format!(
                "\n[cuda]\nversion = \"12.0\"\nmin-driver = \"{min_driver}\"\narchitectures = [\"sm_90\", \"sm_100\"]\n"
            )
    };
    // 12.0's own driver: the runtime runs, cuRAND's 12.1 PTX does not JIT on a B200.
    project.write_recipe(&recipe("525.60.13"));
    let run = project.run(&["build", "recipes/image.toml"]);
    run.assert_failure_naming(
        1,
        &[
            "A PTX-only library needs a newer driver than `[cuda] min-driver` 525.60.13",
            "`lib/libcurand.so.10` (libcurand-10.3.2.106-h0_0) is PTX-only for sm_100 (compute_90, ISA 8.1): needs driver ≥ 530.30.02 (CUDA 12.1)",
            "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        ],
    );
    // The H100 runs the SASS: it is not named.
    assert!(!run.stderr.contains("for sm_90 "), "{}", run.stderr);
    project.assert_no_image();

    project.write_recipe(&recipe("530.30.02"));
    project.run(&["build", "recipes/image.toml"]).success();
    let layout = LayoutView::new(project.path().join("images/curand"));
    let annotations = layout.manifest()["annotations"].clone();
    assert_eq!(
        annotations["dev.imgbuild.cuda.ptx-isa"],
        "libcurand-10.3.2.106-h0_0=compute_90:8.1"
    );
    assert_eq!(annotations["dev.imgbuild.cuda.min-driver"], "530.30.02");
    let env = layout.config()["config"]["Env"].clone();
    let env: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(env.contains(&"NVIDIA_REQUIRE_CUDA=cuda>=12.1"), "{env:?}");
    assert!(env.contains(&"CUDA_VERSION=12.0"), "{env:?}");
}

/// A library whose PTX entry holds no ISA in its header and a forged LZ4 text (an exabyte
/// decompressed, or a block cut short) is a warning naming the library through the real
/// build, never a panic or an allocation of what it claims; the build goes on without it.
#[test]
fn a_forged_ptx_entry_is_a_warning_naming_the_library() {
    let ptx = |compressed: u32, size: u64, payload: &[u8]| {
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&1u16.to_le_bytes());
        e[4..8].copy_from_slice(&64u32.to_le_bytes());
        e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        e[16..20].copy_from_slice(&compressed.to_le_bytes());
        e[28..32].copy_from_slice(&90u32.to_le_bytes());
        e[40..48].copy_from_slice(&0x2011u64.to_le_bytes());
        e[56..64].copy_from_slice(&size.to_le_bytes());
        e.extend_from_slice(payload);
        e
    };
    let channel = tempfile::tempdir().unwrap();
    let linux64 = channel.path().join("linux-64");
    fs_err::create_dir_all(&linux64).unwrap();
    fs_err::create_dir_all(channel.path().join("noarch")).unwrap();
    let block = [0xf0u8, 0xff, 0xff, 0x10, b'.', b'v'];
    let libraries = [
        ("libbomb", elf_with_fatbin(&ptx(6, 1 << 60, &block))),
        ("libcut", elf_with_fatbin(&ptx(6, 1000, &block))),
    ];
    for (name, library) in libraries {
        write_package(
            &linux64.join(format!("{name}-1.0-h0_0.conda")),
            linux64_index(name, "1.0", &[]),
            &[executable(format!("lib/{name}.so.1"), library)],
            None,
        )
        .unwrap();
    }
    index_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        channel.path(),
        "forged",
        &["libbomb", "libcut"],
    ));
    let run = project.run(&["build", "recipes/image.toml"]).success();
    for (name, why) in [
        ("libbomb", "more than LZ4 or the 67108864-byte bound allows"),
        ("libcut", "its LZ4 block does not decode"),
    ] {
        assert!(
            run.stderr.contains(&format!(
                "the CUDA fatbin of `lib/{name}.so.1` ({name}-1.0-h0_0) cannot be read"
            )) && run.stderr.contains(why),
            "{name}: {}",
            run.stderr
        );
    }
    let layout = LayoutView::new(project.path().join("images/forged"));
    let annotations = layout.manifest()["annotations"].clone();
    assert!(annotations.get("dev.imgbuild.cuda.ptx-isa").is_none());
}

/// `imgbuild k8s` gives the GPUs on which NVIDIA's real cuRAND of CUDA 12.1 runs only its PTX
/// (ISA 8.1: Blackwell and newer) the driver that ISA needs, 530.30.02, above the image's
/// `min-driver`, and keeps the image's floor where its SASS runs.
#[test]
fn k8s_raises_the_driver_floor_where_only_real_curand_ptx_runs() {
    let channel = tempfile::tempdir().unwrap();
    write_curand_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(
        &(tiny_recipe(channel.path(), "curand", &["libcurand"])
            + "\n[cuda]\nversion = \"12.0\"\nmin-driver = \"525.60.13\"\n"),
    );
    project.run(&["build", "recipes/image.toml"]).success();
    let run = project
        .run(&[
            "k8s",
            "images/curand",
            "--repository",
            "registry.example/ml/c",
        ])
        .success();
    let mut docs = crate::k8s::validated(&project, &run.stdout);
    let terms = docs.remove(0)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .unwrap()
        .clone();
    // (compute capability requirement, driver major requirement) of each term.
    let pairs: std::collections::BTreeSet<(String, String)> = terms
        .iter()
        .map(|term| {
            let find = |key: &str| {
                let r = term["matchExpressions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["key"] == key)
                    .unwrap();
                let values: Vec<&str> = r["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                format!("{} {}", r["operator"].as_str().unwrap(), values.join(","))
            };
            (
                find("nvidia.com/gpu.compute.major"),
                find("nvidia.com/cuda.driver.major"),
            )
        })
        .collect();
    let pair = |compute: &str, driver: &str| (compute.to_string(), driver.to_string());
    assert_eq!(
        pairs,
        [
            pair("In 5,6,7,8,9", "Gt 525"),
            pair("In 5,6,7,8,9", "In 525"),
            pair("In 10,11,12", "Gt 530"),
            pair("In 10,11,12", "In 530"),
            pair("Gt 12", "Gt 530"),
            pair("Gt 12", "In 530"),
        ]
        .into_iter()
        .collect()
    );
    // Three driver terms per GPU class: 525.60.13 (or 530.30.02) by major, minor, rev.
    assert_eq!(terms.len(), 9, "{terms:#?}");
}

/// `inspect --sizes --architectures sm_90` counts the SASS of the real cuRAND 12.1 that an
/// sm_90 GPU never runs: every SASS but sm_90's, read from the fatbin's entry headers.
#[test]
fn sizes_count_the_real_curand_sass_for_other_gpus() {
    let channel = tempfile::tempdir().unwrap();
    write_curand_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(&tiny_recipe(channel.path(), "curand", &["libcurand"]));
    project.run(&["build", "recipes/image.toml"]).success();
    let sizes = |archs: &str| -> serde_json::Value {
        let run = project
            .run(&[
                "inspect",
                "images/curand",
                "--sizes",
                "--json",
                "--architectures",
                archs,
            ])
            .success();
        serde_json::from_str(&run.stdout).unwrap()
    };
    let hopper = sizes("sm_90");
    let outside = &hopper["sass_outside"];
    assert_eq!(outside["architectures"], "sm_90");
    let library = &outside["libraries"][0];
    assert_eq!(library["path"], "/opt/conda/lib/libcurand.so.10");
    assert_eq!(library["package"], "libcurand-10.3.2.106-h0_0");
    let others = library["architectures"].as_str().unwrap();
    assert!(
        others.starts_with("sm_50,") && !others.contains("sm_90"),
        "{others}"
    );
    let bytes = library["bytes"].as_u64().unwrap();
    let file = hopper["largest_files"][0]["bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < file, "{bytes} of {file}");
    // Asked about every GPU it has SASS for, nothing is for others.
    let all = sizes("sm_50,sm_52,sm_60,sm_61,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90");
    assert_eq!(
        all["sass_outside"]["bytes"].as_u64(),
        Some(0),
        "{}",
        all["sass_outside"]
    );
}
