//! `imgbuild build RECIPE --shard I/N`: one worker's part of the distinct package layers of
//! every variant, compressed and stored in the `--cache-repo`; then what it did, as status
//! lines or one `shard` event.

use std::process::ExitCode;

use serde_json::json;

use super::{
    printer::{CommandFailure, Printer, human_bytes},
    progress::BuildProgress,
};
use crate::{
    build::{self, BuildSettings, ShardReport},
    layers::shard::Shard,
};

/// Runs shard `shard` of the recipe `settings` names; `build` has refused the flags that
/// name an image.
pub(super) async fn run_shard(
    settings: &BuildSettings,
    shard: Shard,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let recipe = settings.recipe_path.as_path();
    let text = crate::recipe::read_recipe_text(recipe).map_err(|e| CommandFailure::new(e, 1))?;
    let variants = crate::recipe::matrix::variants(&text, recipe)
        .map_err(|err| CommandFailure::new(err, 1))?;
    let variants = match variants.is_empty() {
        true => vec![None],
        false => variants.into_iter().map(Some).collect(),
    };
    let reporter = BuildProgress::new(printer);
    let built = build::build_shard(settings, variants, shard, &reporter).await;
    reporter.finish(built.is_ok());
    print_shard(&built?, printer);
    Ok(ExitCode::SUCCESS)
}

/// The `shard` event: every layer of this shard by key, whether it was compressed here, and
/// what the cache repository took; or the same as status lines.
fn print_shard(report: &ShardReport, printer: &Printer) {
    let compressed: Vec<_> = report.layers.iter().filter(|l| !l.built.reused).collect();
    let compressed_bytes: u64 = compressed.iter().map(|l| l.built.blob.size).sum();
    if printer.json() {
        printer.event(&json!({
            "event": "shard",
            "shard": report.shard.index,
            "shards": report.shard.count,
            "variants": report.variants,
            "distinct_layers": report.distinct_layers,
            "distinct_bytes": report.distinct_bytes,
            "layers": report.layers.iter().map(|l| json!({
                "key": l.key,
                "name": l.built.name,
                "kind": l.built.kind,
                "digest": l.built.blob.digest,
                "size": l.built.blob.size,
                "compressed": !l.built.reused,
            })).collect::<Vec<_>>(),
            "compressed_layers": compressed.len(),
            "compressed_size": compressed_bytes,
            "cache_repo": report.cache_repo,
        }));
        return;
    }
    let cache = &report.cache_repo;
    printer.status(
        "Shard",
        format_args!(
            "{}: {} of the {} distinct layers of {}; {} compressed here ({}), {} from a cache",
            report.shard,
            report.layers.len(),
            report.distinct_layers,
            build::counted(report.variants, "variant"),
            compressed.len(),
            human_bytes(compressed_bytes),
            report.layers.len() - compressed.len(),
        ),
    );
    printer.status(
        "Layer cache",
        format_args!(
            "{}: {} stored ({} sent), {} already there",
            cache.repository,
            cache.stored,
            human_bytes(cache.bytes_uploaded),
            cache.present
        ),
    );
}
