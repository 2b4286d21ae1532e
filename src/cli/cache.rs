//! `imgbuild cache du` and `imgbuild cache prune`: the local cache's size by kind, and
//! evicting layer-cache entries (see [`crate::cache_admin`]).

use std::{fmt::Write, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Subcommand};
use serde_json::json;

use super::{
    Env,
    printer::{CommandFailure, Printer, human_bytes, printable},
};
use crate::cache_admin::{
    CacheAdminError,
    du::{CacheUsage, usage},
    prune::{self, PruneLimits, PruneOutcome, PrunePlan, RemovedFile},
};

pub(super) const CACHE_EXAMPLES: &str = "\
Examples:
  imgbuild cache du                                 # the cache's size by kind
  imgbuild cache du --json
  imgbuild cache prune --max-size 10GiB --dry-run   # what would go, least recently used first
  imgbuild cache prune --older-than 30 --keep-layout images/demo

The cache is --cache-dir (or $IMGBUILD_CACHE_DIR), by default $XDG_CACHE_HOME/imgbuild or
~/.cache/imgbuild. prune evicts layer-cache entries only; a build stores them again when it
needs them.";

const DU_EXAMPLES: &str = "\
Examples:
  imgbuild cache du
  imgbuild --cache-dir /var/cache/imgbuild cache du --json";

const PRUNE_EXAMPLES: &str = "\
Examples:
  imgbuild cache prune --max-size 10GiB
  imgbuild cache prune --older-than 30 --dry-run
  imgbuild cache prune --max-size 2GiB --keep-layout images/demo --json";

#[derive(Debug, Args)]
pub(crate) struct CacheArgs {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// The local cache's size by kind (layer cache, build records, packages, …)
    #[command(after_help = DU_EXAMPLES)]
    Du(CacheDuArgs),
    /// Evict layer-cache entries, least recently used first, down to --max-size, and those
    /// unused for more than --older-than days
    #[command(after_help = PRUNE_EXAMPLES)]
    Prune(CachePruneArgs),
    /// List the entries of a registry layer cache (`build --cache-repo REGISTRY/REPO`)
    #[command(after_help = LS_EXAMPLES)]
    Ls(CacheLsArgs),
}

const LS_EXAMPLES: &str = "\
Examples:
  imgbuild cache ls registry.example/ci/imgbuild-cache
  imgbuild --insecure cache ls 127.0.0.1:5000/ci/cache --json

Each entry: its key, compression, the layer's digest and size, and its diff_id. A tag that
looks like an entry but cannot be read as one is listed with why.";

#[derive(Debug, Args)]
struct CacheLsArgs {
    /// The cache repository, `REGISTRY/REPO` (no tag)
    #[arg(value_name = "REGISTRY/REPO", value_parser = super::build::parse_cache_repo)]
    repository: crate::registry::Reference,
    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct CacheDuArgs {
    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("limit")
        .args(["max_size", "older_than"])
        .required(true)
        .multiple(true)
))]
struct CachePruneArgs {
    /// Evict the least recently used entries until the layer cache holds at most SIZE
    /// (e.g. 10GiB, 500MB)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_size: Option<u64>,
    /// Evict every entry not used for more than DAYS days
    #[arg(long, value_name = "DAYS", value_parser = parse_days)]
    older_than: Option<Duration>,
    /// Keep every blob an image of this OCI layout uses, and the entries naming it
    /// (repeatable)
    #[arg(long, value_name = "DIR")]
    keep_layout: Vec<PathBuf>,
    /// List what would be removed, and remove nothing
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

fn parse_size(text: &str) -> Result<u64, String> {
    text.parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|_| format!("`{text}` is not a size such as `10GiB` or `500MB`"))
}

fn parse_days(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<u64>() {
        Ok(days) if days <= 100 * 365 => Ok(Duration::from_secs(days * 86_400)),
        _ => Err(format!(
            "`{text}` is not a number of days (a whole number, at most 36500)"
        )),
    }
}

fn failure(err: CacheAdminError) -> CommandFailure {
    let code = err.exit_code();
    CommandFailure::new(err, code)
}

pub(super) async fn run_cache(
    args: &CacheArgs,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    match &args.command {
        CacheCommand::Du(du) => {
            let report = usage(&env.cache_dir).map_err(failure)?;
            if du.json {
                printer
                    .result(serde_json::to_string_pretty(&report).expect("the report serializes"));
            } else {
                printer.document(&render_usage(&report));
            }
        }
        CacheCommand::Prune(args) => run_prune(args, env, printer)?,
        CacheCommand::Ls(args) => run_ls(args, env, printer).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `cache ls`: the remote cache's entries, read as a build reads them.
async fn run_ls(
    args: &CacheLsArgs,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let reference = &args.repository;
    let failed = |err: &dyn std::fmt::Display| {
        CommandFailure::new(format!("layer cache repository `{reference}`: {err}"), 1)
    };
    let credentials =
        crate::registry::auth::credentials_for(&reference.registry).map_err(|e| failed(&e))?;
    let options = env.global.registry_options();
    let client = crate::registry::RepositoryClient::new(reference, credentials, &options)
        .map_err(|e| failed(&e))?;
    let (entries, unread) = crate::registry::cache_repo::list(&client)
        .await
        .map_err(|e| failed(&e))?;
    if args.json {
        let value =
            json!({"repository": reference.to_string(), "entries": entries, "unread": unread});
        printer.result(serde_json::to_string_pretty(&value).expect("the listing serializes"));
        return Ok(());
    }
    let mut out = String::new();
    let total: u64 = entries.iter().map(|e| e.size).sum();
    let _ = writeln!(
        out,
        "{reference}: {} entries, {}",
        entries.len(),
        human_bytes(total)
    );
    for entry in &entries {
        let _ = writeln!(
            out,
            "{}  {:<12}  {}  {:>10}",
            &entry.key[..12.min(entry.key.len())],
            entry.compression,
            entry.digest,
            human_bytes(entry.size)
        );
    }
    for tag in &unread {
        // One line each, whatever the registry's error text holds.
        let problem = tag.problem.replace(['\n', '\r'], " ");
        let _ = writeln!(
            out,
            "{}: unreadable ({})",
            printable(&tag.tag),
            printable(&problem)
        );
    }
    printer.document(&out);
    Ok(())
}

fn render_usage(report: &CacheUsage) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "cache {}", report.cache_dir.display());
    if report.kinds.is_empty() {
        let _ = writeln!(out, "empty");
        return out;
    }
    let _ = writeln!(out, "{:<11} {:>10} {:>8}  what", "kind", "size", "files");
    for kind in &report.kinds {
        let _ = writeln!(
            out,
            "{:<11} {:>10} {:>8}  {}",
            kind.kind,
            human_bytes(kind.bytes),
            kind.files,
            kind.description
        );
    }
    let _ = writeln!(
        out,
        "{:<11} {:>10} {:>8}",
        "total",
        human_bytes(report.bytes),
        report.files
    );
    out
}

fn run_prune(
    args: &CachePruneArgs,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let kept = prune::kept_blobs(&args.keep_layout).map_err(failure)?;
    let listing = prune::list(&env.cache_dir).map_err(failure)?;
    let limits = PruneLimits {
        max_size: args.max_size,
        older_than: args.older_than,
        now: std::time::SystemTime::now(),
    };
    let plan = prune::plan(&listing, &limits, &kept);
    let outcome = if args.dry_run {
        None
    } else {
        Some(prune::execute(&plan).map_err(failure)?)
    };
    if args.json {
        printer.result(
            serde_json::to_string_pretty(&prune_json(&plan, outcome.as_ref(), args))
                .expect("the report serializes"),
        );
    } else {
        printer.document(&render_prune(&plan, outcome.as_ref(), args));
    }
    Ok(())
}

/// Entries, blobs, lock files and bytes: what went, or with `--dry-run` what would.
fn tally(plan: &PrunePlan, outcome: Option<&PruneOutcome>) -> (usize, usize, usize, u64) {
    match outcome {
        Some(done) => (
            done.count(RemovedFile::KeyFile),
            done.count(RemovedFile::Blob),
            done.count(RemovedFile::LockFile),
            done.bytes(),
        ),
        None => (
            plan.entries(),
            plan.count(RemovedFile::Blob),
            plan.count(RemovedFile::LockFile),
            plan.bytes(),
        ),
    }
}

fn prune_json(
    plan: &PrunePlan,
    outcome: Option<&PruneOutcome>,
    args: &CachePruneArgs,
) -> serde_json::Value {
    let (entries, blobs, locks, bytes) = tally(plan, outcome);
    let removed = outcome.map_or(&plan.removals, |o| &o.removed);
    json!({
        "dry_run": args.dry_run,
        "max_size": args.max_size,
        "older_than_days": args.older_than.map(|d| d.as_secs() / 86_400),
        "entries_removed": entries,
        "blobs_removed": blobs,
        "lock_files_removed": locks,
        "bytes_removed": bytes,
        "bytes_left": plan.bytes_before.saturating_sub(bytes),
        "kept_for_layouts": plan.kept_for_layouts,
        "busy": outcome.map(|o| o.busy.clone()).unwrap_or_default(),
        "removed": removed,
    })
}

fn render_prune(plan: &PrunePlan, outcome: Option<&PruneOutcome>, args: &CachePruneArgs) -> String {
    let (entries, blobs, locks, bytes) = tally(plan, outcome);
    let left = plan.bytes_before.saturating_sub(bytes);
    let mut out = String::new();
    if args.dry_run {
        for removal in &plan.removals {
            let reason = serde_json::to_value(removal.reason).unwrap_or_default();
            let _ = writeln!(
                out,
                "would remove {}{} ({}, {})",
                printable(&removal.path.display().to_string()),
                if removal.link { " (a link)" } else { "" },
                reason.as_str().unwrap_or("?"),
                human_bytes(removal.bytes)
            );
        }
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let _ = writeln!(
        out,
        "{verb} {entries} layer-cache entries, {blobs} blobs and {locks} lock files: {} ({} left)",
        human_bytes(bytes),
        human_bytes(left)
    );
    if plan.kept_for_layouts > 0 {
        let _ = writeln!(
            out,
            "kept {} entries whose blobs the --keep-layout images use",
            plan.kept_for_layouts
        );
    }
    if let Some(max) = args.max_size
        && left > max
    {
        let _ = writeln!(
            out,
            "the layer cache stays above --max-size {}: what is left is kept for the layouts, in use or not the cache's own",
            human_bytes(max)
        );
    }
    if let Some(done) = outcome
        && !done.busy.is_empty()
    {
        let _ = writeln!(
            out,
            "left {} entries a build is using now: {}",
            done.busy.len(),
            crate::report::list_capped(&done.busy, 5)
        );
    }
    out
}
