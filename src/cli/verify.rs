//! `imgbuild verify`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use crate::{build::BuildSettings, verify};

pub const VERIFY_EXAMPLES: &str = "\
Examples:
  imgbuild verify images/py39-torch21
  imgbuild verify images/py39-torch21 --recipe recipes/py39-torch21.toml
  imgbuild verify images/py39-torch21 --recipe recipes/py39-torch21.toml --rebuild

Exit codes: 0 the image is whole (and matches its lock, and rebuilds to the same digest),
1 it is not, or cannot be read.";

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The image: an OCI layout directory
    pub image: PathBuf,
    /// The recipe the image was built from: its lock is checked against the layers
    #[arg(long, value_name = "RECIPE")]
    pub recipe: Option<PathBuf>,
    /// Also rebuild from the lock in a temporary directory and compare digests
    #[arg(long, requires = "recipe")]
    pub rebuild: bool,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
pub async fn run_verify(
    args: &VerifyArgs,
    settings: Option<BuildSettings>,
    quiet: bool,
) -> ExitCode {
    let mut report = match verify::verify(&args.image, settings.as_ref()) {
        Ok(report) => report,
        Err(err) => return super::fail(&err, 1),
    };
    if args.rebuild
        && let Some(settings) = settings
    {
        match verify::rebuild_and_compare(&args.image, &report, &settings).await {
            Ok(digest) => report.rebuilt = Some(digest),
            Err(err) => return super::fail(&err, 1),
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("the report serializes")
        );
    } else if !quiet {
        eprintln!(
            "{:>12} {}: {} manifest(s), {} blobs ({}), {} layers' diff_ids{}{}",
            "Verified",
            report.image,
            report.manifests.len(),
            report.blobs_checked,
            super::human_bytes(report.bytes_checked),
            report.layers_checked,
            report
                .lock
                .as_ref()
                .map(|l| format!(", packages and base against {}", l.display()))
                .unwrap_or_default(),
            report
                .rebuilt
                .as_ref()
                .map(|d| format!(", rebuilt to the same {d}"))
                .unwrap_or_default(),
        );
    }
    ExitCode::SUCCESS
}
