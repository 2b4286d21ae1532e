//! `imgbuild smoke`: the GPU smoke test of an image on this machine.

use std::process::ExitCode;

use clap::Args;

use super::printer::{Failure, Printer};

pub(super) const SMOKE_EXAMPLES: &str = "\
Examples:
  imgbuild smoke images/py39-torch21              # the `latest` tag of a layout
  imgbuild smoke images/py39-torch21:cuda11.8 --json
  imgbuild smoke registry.example/ml/py39-torch21@sha256:…   # pulled into the cache first

Exit codes: 0 pass, 3 no NVIDIA driver or GPU, 4 the image's CUDA cannot run on this
driver, 5 the kernel failed or computed wrong values, or a library crashed the test (it
runs in a child process), 1 the image cannot be read.";

#[derive(Debug, Args)]
pub struct SmokeArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`, or a registry reference
    /// naming its registry (`registry.example/ml/x:tag`, `…@sha256:…`)
    pub image: String,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// Runs the test and prints its report; the exit code is the verdict's.
pub(super) async fn run_smoke(
    args: &SmokeArgs,
    cache_dir: &std::path::Path,
    registry: &crate::registry::ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, Failure> {
    let report = crate::smoke::smoke(&args.image, cache_dir, registry)
        .await
        .map_err(|err| Failure::new(err, 1))?;
    printer.document(&report.render(args.json));
    Ok(ExitCode::from(report.verdict.exit_code()))
}
