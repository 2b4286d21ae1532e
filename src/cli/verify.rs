//! `imgbuild verify`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{CommandFailure, Printer, human_bytes};
use crate::{build::BuildSettings, verify};

pub(super) const VERIFY_EXAMPLES: &str = "\
Examples:
  imgbuild verify images/py39-torch21
  imgbuild verify images/py39-torch21 --recipe recipes/py39-torch21.toml
  imgbuild verify images/py39-torch21 --recipe recipes/py39-torch21.toml --rebuild
  imgbuild verify images/py39-torch21 --provenance --lock recipes/py39-torch21.lock

Exit codes: 0 the image is whole (and matches its lock, and rebuilds to the same digest, and
its provenance names it and its lock), 1 it is not, or cannot be read.";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("lock_source").args(["recipe", "lock"])))]
pub(crate) struct VerifyArgs {
    /// The image: an OCI layout directory
    pub image: PathBuf,
    /// The recipe the image was built from: its lock is checked against the layers
    #[arg(long, value_name = "RECIPE")]
    pub recipe: Option<PathBuf>,
    /// Also rebuild from the lock in a temporary directory and compare digests
    #[arg(long, requires = "recipe")]
    pub rebuild: bool,
    /// Also check the build's SLSA provenance (default: the one beside the layout,
    /// IMAGE.provenance.json): it names this image and the lock (RECIPE's with --recipe,
    /// else --lock's; the path it records is never read), whose every package, wheel and
    /// base it lists
    #[arg(long, value_name = "FILE", num_args = 0..=1, requires = "lock_source")]
    pub provenance: Option<Option<PathBuf>>,
    /// The lock to hold the provenance to, without --recipe
    #[arg(
        long,
        value_name = "LOCK",
        requires = "provenance",
        conflicts_with = "recipe"
    )]
    pub lock: Option<PathBuf>,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub(super) async fn run_verify(
    args: &VerifyArgs,
    settings: Option<BuildSettings>,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let mut report = verify::verify(&args.image, settings.as_ref())
        .map_err(|err| CommandFailure::new(err, 1))?;
    // Before the rebuild: it is cheap, and a mismatch is found without building.
    if let Some(file) = &args.provenance {
        let against = match (&settings, &args.lock) {
            (Some(settings), _) => verify::LockSource::Recipe(settings),
            (None, Some(lock)) => verify::LockSource::Lock(lock),
            // clap requires one of them with --provenance.
            (None, None) => {
                return Err(CommandFailure::new(
                    "--provenance needs --recipe or --lock",
                    2,
                ));
            }
        };
        let checked = verify::check_provenance(&args.image, file.as_deref(), against)
            .map_err(|err| CommandFailure::new(err, 1))?;
        report.provenance = Some(checked);
    }
    if args.rebuild
        && let Some(settings) = &settings
    {
        let digest = verify::rebuild_and_compare(&args.image, &report, settings)
            .await
            .map_err(|err| CommandFailure::new(err, 1))?;
        report.rebuilt = Some(digest);
    }
    if args.json {
        printer.result(serde_json::to_string(&report).expect("the report serializes"));
        return Ok(ExitCode::SUCCESS);
    }
    printer.status(
        "Verified",
        format_args!(
            "{}: {} manifest(s), {} blobs ({}), {} layers' diff_ids{}{}{}",
            report.image,
            report.manifests.len(),
            report.blobs_checked,
            human_bytes(report.bytes_checked),
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
            report
                .provenance
                .as_ref()
                .map(|p| format!(", provenance {} of it and its lock", p.display()))
                .unwrap_or_default(),
        ),
    );
    Ok(ExitCode::SUCCESS)
}
