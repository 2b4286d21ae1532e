//! `imgbuild-smoke`: the GPU smoke test run inside the image (`[smoke] embed = true`), e.g. by
//! the Job of `imgbuild k8s --smoke-job`. It finds the image's own CUDA libraries under the
//! environment's prefix, where `imgbuild smoke` would extract them from the layers, and runs
//! the same test. Built for glibc 2.17 (`cargo zigbuild`), so it runs on any image with glibc.

use std::{path::PathBuf, process::ExitCode};

use clap::Parser;
use imgbuild_smoke::{
    CudaLibraries, SmokeReport,
    isolate::{CHILD_ARG, child_main, run_in_child},
    libraries::find_under,
};

/// Runs imgbuild's CUDA smoke test inside this image: the image's NVRTC compiles a kernel that
/// runs on unified memory on the first GPU, and every element is checked on the CPU.
///
/// Exit codes: 0 pass, 1 cannot run (bad prefix), 2 usage, 3 no NVIDIA driver or GPU,
/// 4 the image's CUDA cannot run on this driver, 5 the kernel failed or computed wrong values,
/// or a library crashed the test (it runs in a child process of this executable).
#[derive(Debug, Parser)]
#[command(name = "imgbuild-smoke", version)]
struct Args {
    /// Where the image's environment is; searched recursively for cudart and NVRTC.
    /// Default: `$CONDA_PREFIX`, else `/opt/conda`.
    #[arg(long, value_name = "DIR")]
    prefix: Vec<PathBuf>,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Do not check the environment's GPU frameworks (PyTorch, CuPy, JAX), which are
    /// otherwise checked by the environment's own Python, as a user that is not root.
    #[arg(long)]
    no_framework: bool,
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1).peekable();
    if args.peek().is_some_and(|a| a == CHILD_ARG) {
        return child_main(args.skip(1));
    }
    let args = Args::parse();
    let prefixes = if args.prefix.is_empty() {
        vec![
            std::env::var_os("CONDA_PREFIX")
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from("/opt/conda"), PathBuf::from),
        ]
    } else {
        args.prefix
    };
    if let Some(missing) = prefixes.iter().find(|p| !p.is_dir()) {
        eprintln!(
            "imgbuild-smoke: error: the prefix `{}` is not a directory in this image (pass the environment's prefix with --prefix)",
            missing.display()
        );
        return ExitCode::from(1);
    }
    let cuda_version = std::env::var("CUDA_VERSION").ok().filter(|v| !v.is_empty());
    let (libraries, files) = find_under(&prefixes, cuda_version.clone());
    let image = format!(
        "this container ({})",
        prefixes
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let report = SmokeReport::new(
        image,
        cuda_version,
        files.iter().map(|f| f.display().to_string()).collect(),
    );
    // The container runtime has decided for the compat libraries already (NVIDIA's hook);
    // the report says what its rule gives here, and the run uses what the loader finds.
    let mut report = report;
    report.forward_compat = imgbuild_smoke::forward_compat::decide_here(std::path::Path::new(
        imgbuild_smoke::forward_compat::COMPAT_DIR,
    ));
    let mut report = run_isolated(&libraries, report);
    if !args.no_framework {
        report = report.with_frameworks(check_frameworks(&prefixes));
    }
    print!("{}", report.render(args.json));
    ExitCode::from(report.verdict.exit_code())
}

/// The frameworks of the first prefix's Python, each probed by it; as nobody (65534) when
/// this runs as root, since the check never runs as root.
fn check_frameworks(prefixes: &[PathBuf]) -> Vec<imgbuild_smoke::framework::FrameworkCheck> {
    use std::os::unix::process::CommandExt;
    let python = prefixes
        .iter()
        .flat_map(|p| [p.join("bin/python3"), p.join("bin/python")])
        .find(|p| p.exists());
    let Some(python) = python else {
        return Vec::new();
    };
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    let command = |args: &[String]| {
        let mut command = std::process::Command::new(&python);
        command.args(args).env("HOME", "/tmp");
        if as_root {
            command.uid(65534).gid(65534);
        }
        command
    };
    imgbuild_smoke::framework::check_all(command, &python.display().to_string())
}

/// The run in a child process of this executable (see `imgbuild_smoke::isolate`), so that a
/// library that crashes the loader is a `kernel-failure`; in this process when no child can
/// be started (no `/proc` to find this executable by, say).
#[allow(clippy::print_stderr)]
fn run_isolated(libraries: &CudaLibraries, report: SmokeReport) -> SmokeReport {
    let child =
        std::env::current_exe().and_then(|exe| run_in_child(&exe, libraries, report.clone()));
    match child {
        Ok(report) => report,
        Err(err) => {
            eprintln!(
                "imgbuild-smoke: warning: cannot run the test in a child process ({err}); running it in this one"
            );
            imgbuild_smoke::run(libraries, report)
        }
    }
}
