//! `imgbuild lock`: solve the recipe and write its lock, without building.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::{
    Env,
    printer::{CommandFailure, Printer},
    progress::{BuildProgress, lock_event},
};
use crate::build::{self, BuildSettings, LockMode, LockOutcome, LockReport, counted};

pub(super) const LOCK_EXAMPLES: &str = "\
Examples:
  imgbuild lock recipes/py39-torch21.toml         # writes recipes/py39-torch21.lock
  imgbuild lock recipes/x.toml --channel-alias https://mirror.example/conda
  imgbuild lock recipes/py39-torch21.toml --update numpy   # only numpy moves (and what it needs)";

#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    /// The recipe, e.g. recipes/py39-torch21.toml
    pub recipe: PathBuf,
    /// Use only cached repodata
    #[arg(long)]
    pub offline: bool,
    /// Print one JSON event per line on stdout (stages, lock, result)
    #[arg(long)]
    pub json: bool,
    /// Solve again for these packages only (repeatable or comma-separated, conda or PyPI
    /// names), keeping every other pin of the lock where it still fits, as `pixi update`
    /// does; the pins that moved are listed
    #[arg(long = "update", value_name = "NAME", value_delimiter = ',')]
    pub update: Vec<String>,
}

pub(super) async fn run_lock(
    args: &LockArgs,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let settings = BuildSettings {
        offline: args.offline,
        update: args.update.clone(),
        ..env.build_settings(args.recipe.clone(), LockMode::Refresh)
    };
    let reporter = BuildProgress::new(printer);
    let locked = build::lock(&settings, &reporter).await;
    reporter.finish(locked.is_ok());
    let report = locked?;
    if printer.json() {
        printer.event(&lock_event(&report));
    } else {
        describe_lock(&report, printer);
        printer.result(report.lock_path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The status line of a lock: reused, or written and why.
pub(super) fn describe_lock(report: &LockReport, printer: &Printer) {
    let path = report.lock_path.display();
    let packages = counted(report.packages, "package");
    match &report.outcome {
        LockOutcome::Reused => printer.status("Reusing", format_args!("{path} ({packages})")),
        LockOutcome::Written { reason: None } => {
            printer.status("Locked", format_args!("{path} ({packages})"))
        }
        LockOutcome::Written {
            reason: Some(reason),
        } => printer.status(
            "Locked",
            format_args!("{path} ({packages}; re-solved because {reason})"),
        ),
        LockOutcome::Repinned { reason } => printer.status(
            "Locked",
            format_args!("{path} ({packages} kept; files pinned again because {reason})"),
        ),
        LockOutcome::Updated { names, changes } => {
            let moved = counted(changes.len(), "pin");
            printer.status(
                "Locked",
                format_args!(
                    "{path} ({packages}; updated {}: {moved} moved)",
                    names.join(", ")
                ),
            );
            for change in changes {
                printer.status("Updated", change);
            }
        }
    }
}
