//! `imgbuild build` of a recipe with a `[matrix]`: every variant built at once on this
//! machine, sharing the package and layer caches, then a summary of what they share.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode};

use rattler_conda_types::Subdir;

use serde_json::json;

use super::{
    printer::{CommandFailure, Printer, human_bytes},
    progress,
};
use crate::{
    build::{self, BuildReport, BuildSettings, Reporter},
    recipe::matrix::Variant,
};

/// What the variants of a matrix have in common: layers stored once for several of them.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Sharing {
    /// Distinct layer blobs across all variants.
    pub layers: usize,
    /// Their compressed bytes.
    pub bytes: u64,
    /// Blobs that appear in two or more variants, and their bytes (each counted once).
    pub shared_layers: usize,
    pub shared_bytes: u64,
}

/// Counts shared layers from each variant's `(digest, size)` list.
pub(super) fn sharing(variants: &[Vec<(String, u64)>]) -> Sharing {
    let mut blobs: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
    for layers in variants {
        // A blob twice in one image still counts once for that image.
        let mut seen = std::collections::BTreeSet::new();
        for (digest, size) in layers {
            if seen.insert(digest.as_str()) {
                blobs.entry(digest).or_insert((*size, 0)).1 += 1;
            }
        }
    }
    let shared: Vec<u64> = blobs
        .values()
        .filter(|(_, count)| *count >= 2)
        .map(|(size, _)| *size)
        .collect();
    Sharing {
        layers: blobs.len(),
        bytes: blobs.values().map(|(size, _)| size).sum(),
        shared_layers: shared.len(),
        shared_bytes: shared.iter().sum(),
    }
}

/// A variant's reporter: its warnings, naming the variant (as `warning` events with
/// `variant` under `--json`); not its stages, since the variants build at once. The lock and
/// fetch pass before the builds reports nothing: every warning comes again from the build.
struct VariantWarnings {
    variant: String,
    printer: Printer,
}

impl Reporter for VariantWarnings {
    fn on_warning(&self, message: &str) {
        if self.printer.json() {
            self.printer.event(&json!({
                "event": "warning",
                "variant": self.variant,
                "message": message,
            }));
        } else {
            self.printer
                .warning(&format!("{}: {message}", self.variant));
        }
    }
}

/// The layer blobs of a built variant, base layers included, from its layout: of every
/// platform image of a multi-platform variant (a blob two of its platforms hold, such as a
/// noarch package's, counts once for the variant).
fn layers_of(report: &BuildReport) -> Result<Vec<(String, u64)>, crate::inspect::InspectError> {
    let tag = report
        .tags
        .first()
        .cloned()
        .unwrap_or_else(|| "latest".into());
    let image = format!("{}:{tag}", report.layout_dir.display());
    let platforms: Vec<Option<Subdir>> = match report.platforms.as_slice() {
        [] | [_] => vec![None],
        many => many.iter().map(|(subdir, _)| Some(*subdir)).collect(),
    };
    let mut layers = Vec::new();
    for platform in platforms {
        let summary = crate::inspect::inspect_platform(&image, platform)?;
        layers.extend(
            summary
                .layers
                .into_iter()
                .map(|layer| (layer.digest, layer.size)),
        );
    }
    Ok(layers)
}

/// Builds every variant, then prints each one's result and what they share. A matrix build
/// fails in text only, even with `--json` (no `error` event), as it always has.
pub(super) async fn run_matrix(
    settings: &BuildSettings,
    variants: Vec<Variant>,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let count = variants.len();
    // The machine's threads shared between the variants (each at least one).
    let jobs = (settings.jobs / count).max(1);
    printer.status(
        "Matrix",
        format_args!("{count} variants at once, {jobs} compression thread(s) each"),
    );
    let variant_failed = |variant: &Variant, err: build::BuildError| {
        CommandFailure::from(err).after(vec![format!("variant `{}` failed", variant.suffix())])
    };
    // Locks and packages first, one variant after another: builds running at once in one
    // process must not fetch the same package at the same time.
    for variant in &variants {
        let settings = BuildSettings {
            variant: Some(variant.clone()),
            ..settings.clone()
        };
        build::lock_and_fetch(&settings)
            .await
            .map_err(|err| variant_failed(variant, err))?;
    }
    let results = build_all(settings, variants, jobs, printer);
    report_all(results, printer)
}

type Built = (Variant, Result<BuildReport, build::BuildError>);

/// Builds the variants at once, `jobs` compression threads each.
fn build_all(
    settings: &BuildSettings,
    variants: Vec<Variant>,
    jobs: usize,
    printer: &Printer,
) -> Vec<Built> {
    // One thread and runtime per variant: the builds run their CPU work (install, layers)
    // on their own threads, so they overlap for real.
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let handles: Vec<_> = variants
                .into_iter()
                .map(|variant| {
                    let settings = BuildSettings {
                        variant: Some(variant.clone()),
                        jobs,
                        ..settings.clone()
                    };
                    let reporter = VariantWarnings {
                        variant: variant.suffix(),
                        printer: *printer,
                    };
                    scope.spawn(move || {
                        let result = tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(1)
                            .enable_all()
                            .build()
                            .map_err(|source| build::BuildError::Staging {
                                path: settings.cache_dir.clone(),
                                source,
                            })
                            .and_then(|runtime| {
                                runtime.block_on(build::build(&settings, &reporter))
                            });
                        (variant, result)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a variant's build thread panicked"))
                .collect()
        })
    })
}

/// Each variant's result event, or its failure; then the images and what they share.
fn report_all(results: Vec<Built>, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let mut failed: Vec<String> = Vec::new();
    let mut last_error = None;
    let mut layer_lists = Vec::new();
    let mut built: Vec<(String, PathBuf, String, String)> = Vec::new();
    for (variant, result) in results {
        match result {
            Ok(report) => {
                match layers_of(&report) {
                    Ok(layers) => layer_lists.push(layers),
                    Err(err) => return Err(CommandFailure::new(err, 1).after(failed)),
                }
                if printer.json() {
                    printer.event(&progress::result_event(&report));
                }
                for tag in &report.tags {
                    built.push((
                        variant.suffix(),
                        report.layout_dir.clone(),
                        tag.clone(),
                        report.manifest_digest.clone(),
                    ));
                }
            }
            Err(err) => {
                failed.push(format!("variant `{}` failed", variant.suffix()));
                last_error = Some(err);
            }
        }
    }
    if let Some(err) = last_error {
        return Err(CommandFailure::from(err).after(failed));
    }
    print_sharing(&built, &sharing(&layer_lists), printer);
    Ok(ExitCode::SUCCESS)
}

/// The `matrix` event with `--json`; else the sharing line and every variant's image.
fn print_sharing(
    built: &[(String, PathBuf, String, String)],
    sharing: &Sharing,
    printer: &Printer,
) {
    if printer.json() {
        printer.event(&json!({
            "event": "matrix",
            "variants": built
                .iter()
                .map(|(variant, layout, tag, digest)| json!({
                    "variant": variant,
                    "image": format!("{}:{tag}@{digest}", layout.display()),
                }))
                .collect::<Vec<_>>(),
            "layers": sharing.layers,
            "bytes": sharing.bytes,
            "shared_layers": sharing.shared_layers,
            "shared_bytes": sharing.shared_bytes,
        }));
    } else {
        printer.status(
            "Shared",
            format_args!(
                "{} of {} distinct layers ({} of {}) are in two or more variants and stored once",
                sharing.shared_layers,
                sharing.layers,
                human_bytes(sharing.shared_bytes),
                human_bytes(sharing.bytes),
            ),
        );
        for (_, layout, tag, digest) in built {
            printer.result(format_args!("{}:{tag}@{digest}", layout.display()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_blobs_are_counted_once() {
        let a = vec![("x".to_string(), 10), ("y".to_string(), 5)];
        let b = vec![("x".to_string(), 10), ("z".to_string(), 7)];
        let c = vec![("x".to_string(), 10), ("y".to_string(), 5)];
        assert_eq!(
            sharing(&[a, b, c]),
            Sharing {
                layers: 3,
                bytes: 22,
                shared_layers: 2,
                shared_bytes: 15
            }
        );
    }
}
