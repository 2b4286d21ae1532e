//! `imgbuild smoke` without a GPU (as in CI): the image's CUDA libraries are extracted, and
//! the missing driver is reported with its own exit code, never a panic; a library that
//! crashes the loader is a `kernel-failure` naming it (issue 15). The GPU path runs on the
//! device machine; its output is kept in `docs/evidence/`.

use std::{io::Read, path::Path};

use sha2::{Digest, Sha256};

use crate::{
    common::Project,
    support::{
        channel::{
            cuda_runtime_wheel, executable, index_channel, linux64_index, tiny_recipe,
            write_package,
        },
        shared_channel, test_cache_dir,
    },
};

pub(crate) fn cuda_image() -> Project {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "cudaimg", &["cuda-cudart"])
        + "\n[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\"\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    project
}

#[test]
fn the_images_cuda_libraries_are_extracted_from_its_layers() {
    let project = cuda_image();
    let layout = project.path().join("images/cudaimg");
    let image = imgbuild::smoke::extract::open_image(&layout, "latest").unwrap();
    let cuda = imgbuild::smoke::extract::extract_cuda_libraries(&image).unwrap();
    assert_eq!(cuda.libraries.cuda_version.as_deref(), Some("11.8.89"));
    assert!(
        cuda.libraries.nvrtc.is_none(),
        "the test image has no NVRTC"
    );
    let cudart = cuda.libraries.cudart.as_ref().expect("cudart found");
    assert_eq!(cudart.file_name().unwrap(), "libcudart.so.11.0");
    // Byte for byte the library the image holds.
    let unpacked = crate::common::unpack(&layout, "latest", &project.path().join("bundle"));
    let in_image = fs_err::read(unpacked.join("opt/conda/lib/libcudart.so.11.0")).unwrap();
    assert_eq!(
        Sha256::digest(fs_err::read(cudart).unwrap()),
        Sha256::digest(&in_image)
    );
    assert_eq!(
        fs_err::read_link(cuda.dir.path().join("libcudart.so")).unwrap(),
        std::path::Path::new("libcudart.so.11.0")
    );
    assert_eq!(
        cuda.sources.get("libcudart.so.11.0").map(String::as_str),
        Some("opt/conda/lib/libcudart.so.11.0")
    );
}

#[test]
fn without_a_driver_smoke_says_so_with_exit_code_3() {
    if skipped_with_a_driver() {
        return;
    }
    let project = cuda_image();
    let run = project.run(&["smoke", "images/cudaimg"]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(
        run.stdout.contains("image CUDA       11.8.89"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("verdict          NO-DEVICE: no NVIDIA driver found"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("\nmig "), "{}", run.stdout);

    no_device_report(&project.run(&["smoke", "images/cudaimg:latest", "--json"]));

    // An image that is not there is an input error.
    let run = project.run(&["smoke", "images/none"]);
    run.assert_clean_failure(1);
}

/// `--attest FILE` (issue 21): the run as an in-toto Statement v1 whose subject is the
/// image's manifest digest and whose predicate is the report, verdict and all; checked with
/// the in-toto project's own `in-toto-attestation` package (its Statement's `validate`).
#[test]
fn a_smoke_run_is_attested_as_an_in_toto_statement_of_the_image() {
    if skipped_with_a_driver() {
        return;
    }
    let project = cuda_image();
    let file = project.path().join("smoke.intoto.json");
    let run = project.run(&[
        "smoke",
        "images/cudaimg",
        "--attest",
        file.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    let statement: serde_json::Value =
        serde_json::from_str(&fs_err::read_to_string(&file).unwrap()).unwrap();
    let digest =
        crate::common::LayoutView::new(project.path().join("images/cudaimg")).manifest_digest();
    assert_eq!(crate::common::subject_digest(&statement), digest);
    assert_eq!(statement["subject"][0]["name"], "images/cudaimg");
    assert_eq!(
        statement["predicateType"],
        "https://imgbuild.dev/attestations/gpu-smoke/v1"
    );
    assert_eq!(statement["predicate"]["verdict"], "no-device");
    assert_eq!(statement["predicate"]["image_cuda"], "11.8.89");
    // The MIG state is in the predicate as in the report: none without a GPU.
    assert_eq!(
        statement["predicate"].get("mig"),
        Some(&serde_json::Value::Null)
    );
    let valid = crate::common::venv_python_check(crate::common::IN_TOTO_STATEMENT_CHECK, &file);
    assert!(valid.starts_with("valid https://imgbuild.dev/"), "{valid}");

    // An image that cannot be read is no run: no attestation.
    let missing = project.path().join("none.intoto.json");
    project
        .run(&[
            "smoke",
            "images/none",
            "--attest",
            missing.to_str().unwrap(),
        ])
        .assert_clean_failure(1);
    assert!(!missing.exists());
}

/// `smoke REGISTRY/REPO:TAG`: the image is pulled (layers checked and cached), then tested
/// like a layout; here without a driver, so it must say so after reading the image.
#[test]
fn an_image_in_a_registry_is_pulled_and_smoke_tested() {
    use crate::registry::{Auth, Registry};
    if skipped_with_a_driver() {
        return;
    }
    let registry = Registry::start(Auth::None);
    let project = cuda_image();
    let reference = format!("{}/ml/cudaimg:v1", registry.host);
    project
        .run(&["push", "images/cudaimg", &reference, "--insecure"])
        .success();
    // Gone locally: only the registry has it.
    fs_err::remove_dir_all(project.path().join("images/cudaimg")).unwrap();

    let report = no_device_report(&project.run(&["smoke", &reference, "--insecure", "--json"]));
    assert_eq!(report["image"], reference.as_str());

    // A registry that is not there is a pull error (exit 1), not a missing layout.
    let dead = format!("127.0.0.1:{}/ml/cudaimg:v1", crate::registry::free_port());
    project
        .run(&["smoke", &dead, "--insecure"])
        .assert_failure_naming(1, &["Cannot pull image", &dead]);
}

/// These tests are for machines without a GPU (CI); one with a driver is tested on the
/// device machine, with the output kept in `docs/evidence/`.
fn skipped_with_a_driver() -> bool {
    let driver = std::path::Path::new("/proc/driver/nvidia/version").exists();
    if driver {
        eprintln!(
            "skipped: this machine has an NVIDIA driver; the GPU path is tested on the device"
        );
    }
    driver
}

/// The `--json` report of a smoke run of the CUDA 11.8 test image on a machine without a
/// driver: exit 3, the image's CUDA version and its cudart read from the layers, no GPU and
/// so no MIG state (`mig` is there, null: NVML is only asked about a device CUDA found).
#[track_caller]
fn no_device_report(run: &crate::common::Run) -> serde_json::Value {
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["verdict"], "no-device");
    assert_eq!(report["image_cuda"], "11.8.89");
    assert_eq!(
        report.get("gpu"),
        Some(&serde_json::Value::Null),
        "{report}"
    );
    assert_eq!(
        report.get("mig"),
        Some(&serde_json::Value::Null),
        "{report}"
    );
    assert!(
        report["libraries"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("opt/conda/lib/libcudart.so.11.0")),
        "{report}"
    );
    report
}

/// Issue 15: an image whose `libnvrtc.so.12` is truncated (the first 4096 bytes of a real
/// shared library, NVIDIA's cudart) makes the loader read past the end of the mapped file:
/// SIGBUS. That used to kill imgbuild (exit 135, nothing printed); the libraries are now
/// loaded in a child process, and its death is a `kernel-failure` (exit 5) naming the library
/// and the signal. NVRTC is loaded before the driver is looked for, so this holds with or
/// without a GPU.
#[test]
fn a_library_that_crashes_the_loader_is_a_kernel_failure_naming_it() {
    let project = Project::new();
    let channel = project.path().join("truncated-channel");
    write_truncated_nvrtc_channel(&channel).unwrap();
    let url = url::Url::from_directory_path(&channel).unwrap();
    let recipe = tiny_recipe(shared_channel(), "crashimg", &["cuda-cudart", "cuda-nvrtc"])
        .replacen("channels = [", &format!("channels = [\"{url}\", "), 1);
    project.write_recipe(&recipe);
    project.build(&[]).success();

    let run = project.run(&["smoke", "images/crashimg"]);
    assert_eq!(run.code, 5, "{}{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let verdict = "verdict          KERNEL-FAILURE: loading `libnvrtc.so.12` \
                   (opt/conda/lib/libnvrtc.so.12) crashed the smoke test: its process was \
                   killed by signal 7 (SIGBUS)";
    assert!(run.stdout.contains(verdict), "{}", run.stdout);

    let run = project.run(&["smoke", "images/crashimg", "--json"]);
    assert_eq!(run.code, 5, "{}{}", run.stdout, run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["verdict"], "kernel-failure", "{report}");
    let message = report["message"].as_str().unwrap();
    assert!(
        message.contains("`libnvrtc.so.12`") && message.contains("SIGBUS"),
        "{message}"
    );
    assert_eq!(report["image"], "images/crashimg");
}

/// A channel holding `cuda-nvrtc` 12.0.0 whose `lib/libnvrtc.so.12` is the first 4096 bytes
/// of the real `libcudart.so.11.0`: a valid ELF header whose segments reach past the file's
/// end.
fn write_truncated_nvrtc_channel(channel: &Path) -> anyhow::Result<()> {
    let wheel = cuda_runtime_wheel(&test_cache_dir())?;
    let mut zip = zip::ZipArchive::new(fs_err::File::open(&wheel)?)?;
    let mut cudart = Vec::new();
    zip.by_name("nvidia/cuda_runtime/lib/libcudart.so.11.0")?
        .read_to_end(&mut cudart)?;
    cudart.truncate(4096);
    write_nvrtc_channel(channel, cudart)
}

/// Issue 15: a library whose initialiser never returns. The smoke child is killed after
/// `IMGBUILD_SMOKE_TIMEOUT` seconds and the run is a `kernel-failure` (exit 5) naming the
/// library; before, `imgbuild smoke` waited for good. The library is compiled here with the
/// machine's C compiler; without one the test says so and skips.
#[test]
fn a_library_that_hangs_the_loader_is_a_kernel_failure_naming_it() {
    let project = Project::new();
    let source = project.path().join("hang.c");
    fs_err::write(
        &source,
        "#include <unistd.h>\n__attribute__((constructor)) static void hang(void) { for (;;) pause(); }\n",
    )
    .unwrap();
    let library = project.path().join("libnvrtc.so.12");
    let compiled = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status();
    if !compiled.is_ok_and(|s| s.success()) {
        eprintln!("skipping: no C compiler (cc) to build a hanging library");
        return;
    }
    let channel = project.path().join("hanging-channel");
    write_nvrtc_channel(&channel, fs_err::read(&library).unwrap()).unwrap();
    let url = url::Url::from_directory_path(&channel).unwrap();
    let recipe = tiny_recipe(shared_channel(), "hangimg", &["cuda-cudart", "cuda-nvrtc"]).replacen(
        "channels = [",
        &format!("channels = [\"{url}\", "),
        1,
    );
    project.write_recipe(&recipe);
    project.build(&[]).success();

    let run = project.run_with(
        &["smoke", "images/hangimg"],
        &[("IMGBUILD_SMOKE_TIMEOUT", "2")],
        None,
    );
    assert_eq!(run.code, 5, "{}{}", run.stdout, run.stderr);
    let verdict = "verdict          KERNEL-FAILURE: loading `libnvrtc.so.12` \
                   (opt/conda/lib/libnvrtc.so.12) stopped the smoke test: its process hung: \
                   it had not finished after 2 s and was killed";
    assert!(run.stdout.contains(verdict), "{}", run.stdout);
}

/// A channel holding `cuda-nvrtc` 12.0.0 whose `lib/libnvrtc.so.12` is `library`.
fn write_nvrtc_channel(channel: &Path, library: Vec<u8>) -> anyhow::Result<()> {
    let cudart = library;
    let linux64 = channel.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(channel.join("noarch"))?;
    write_package(
        &linux64.join("cuda-nvrtc-12.0.0-h0_0.conda"),
        linux64_index("cuda-nvrtc", "12.0.0", &[]),
        &[executable("lib/libnvrtc.so.12", cudart)],
        None,
    )?;
    index_channel(channel)
}
