//! `build --shard I/N`: one worker's part of a sharded build. Every variant of the matrix,
//! and every platform of each, is solved (or its lock read), installed and planned as a
//! build would; the distinct package layers, keyed as the layer caches key them, are
//! assigned to the N workers by [`crate::layers::shard::assign`]; and this worker compresses
//! its own and stores them in the `--cache-repo`. No image is written: the build of each
//! variant that follows takes every package layer from the cache.
//!
//! The key is known only once a layer's files are staged, so every worker installs every
//! variant; what it saves the others is the compression, and their upload.

use std::collections::BTreeSet;

use super::{
    cache_repo,
    error::BuildError,
    model::{BuildSettings, Context, ShardLayer, ShardReport, counted},
    obtain_lock::obtain_lock,
    plan::work,
    prepare::{Prepared, prepare},
    stage::{Stager, create_staging, sweep_staging},
    write::{KeyedLayer, Writer},
};
use crate::{
    layers::shard::{Shard, assign},
    lock::Lock,
    oci::layout::Layout,
    recipe::matrix::Variant,
    report::Reporter,
};

/// One variant, solved: its settings, recipe and platforms, and its lock.
struct Solved {
    settings: BuildSettings,
    prepared: Prepared,
    lock: Lock,
}

/// Builds `shard`'s part of the distinct package layers of `variants` (one `None` for a
/// recipe without a matrix) into the layer caches, and stores them in the cache repository.
pub(crate) async fn build_shard(
    settings: &BuildSettings,
    variants: Vec<Option<Variant>>,
    shard: Shard,
    reporter: &dyn Reporter,
) -> Result<ShardReport, BuildError> {
    let repository = match &settings.cache_repo {
        Some(asked) if !asked.readonly => asked.repository.to_string(),
        _ => return Err(BuildError::ShardWithoutCache),
    };
    let mut solved = Vec::with_capacity(variants.len());
    for variant in variants {
        let settings = BuildSettings {
            variant,
            ..settings.clone()
        };
        let prepared = prepare(&settings, reporter).await?;
        let (lock, _) = obtain_lock(&prepared, &settings, reporter).await?;
        let (prepared, lock) = prepared.keep_platforms(lock, &settings.platforms);
        solved.push(Solved {
            settings,
            prepared,
            lock,
        });
    }
    sweep_staging(settings);
    let contexts: Vec<Context> = solved
        .iter()
        .map(|s| Context::new(&s.settings, &s.prepared.recipe, &s.lock, reporter))
        .collect();
    let works: Vec<_> = solved
        .iter()
        .map(|s| work(&s.prepared.platforms, &s.lock))
        .collect();
    let mut stagings = Vec::with_capacity(solved.len());
    let mut staged = Vec::with_capacity(solved.len());
    for ((cx, work), variant) in contexts.iter().zip(&works).zip(&solved) {
        let staging = create_staging(settings, reporter)?;
        staged.push(
            Stager::new(cx, staging.dir())
                .stage_all(work, &variant.lock)
                .await?,
        );
        stagings.push(staging);
    }

    // The blobs go to a layout of their own in the staging area: the layer caches keep
    // them, and it goes with the staging tree.
    let scratch = create_staging(settings, reporter)?;
    let layout = Layout::new(scratch.dir().join("blobs"));
    layout.prepare()?;
    let Some(shared) = cache_repo::open(settings, reporter) else {
        return Err(BuildError::ShardCacheUnusable { repository });
    };
    let writers: Vec<Writer> = contexts
        .iter()
        .map(|cx| Writer::new(cx, &layout).sharing(Some(&shared)))
        .collect();
    let keyed: Vec<Vec<KeyedLayer>> = writers
        .iter()
        .zip(&staged)
        .map(|(writer, platforms)| writer.package_layers(platforms))
        .collect::<Result<_, _>>()?;
    let sizes: Vec<(String, u64)> = keyed
        .iter()
        .flatten()
        .map(|l| (l.key.clone(), l.layer.size))
        .collect();
    let assigned = assign(&sizes, shard.count);

    // Each of this shard's layers once, by the first variant that has it.
    let mut taken = BTreeSet::new();
    let mut layers = Vec::new();
    for ((writer, platforms), keyed) in writers.iter().zip(&staged).zip(&keyed) {
        let picked: Vec<&KeyedLayer> = keyed
            .iter()
            .filter(|l| assigned[&l.key] == shard.index && taken.insert(l.key.clone()))
            .collect();
        for (key, built) in writer.write_picked(platforms, &picked)? {
            layers.push(ShardLayer { key, built });
        }
    }
    // Its own stage, so the upload's time is not the last variant's layers'.
    reporter.on_stage(
        crate::report::Stage::Write,
        &format!(
            "{} to the layer cache {repository}",
            counted(layers.len(), "layer")
        ),
    );
    let summary = shared.store_offered(reporter).await;
    let report = ShardReport {
        shard,
        variants: solved.len(),
        distinct_layers: assigned.len(),
        distinct_bytes: distinct_bytes(&sizes),
        layers,
        cache_repo: summary,
    };
    check_stored(&report)?;
    Ok(report)
}

/// The file bytes of the distinct layers, each counted once.
fn distinct_bytes(sizes: &[(String, u64)]) -> u64 {
    let mut seen = BTreeSet::new();
    sizes
        .iter()
        .filter(|(key, _)| seen.insert(key))
        .map(|(_, size)| size)
        .sum()
}

/// A shard's work is its entries in the cache: one it could not store fails the shard, so
/// that the build that waits for every shard (`afterok`) does not start on a cache that
/// lacks them.
fn check_stored(report: &ShardReport) -> Result<(), BuildError> {
    let summary = &report.cache_repo;
    let kept = summary.stored + summary.present;
    if summary.unusable.is_none() && kept >= report.layers.len() {
        return Ok(());
    }
    Err(BuildError::ShardNotStored {
        repository: summary.repository.clone(),
        stored: kept,
        layers: report.layers.len(),
        why: summary
            .unusable
            .clone()
            .unwrap_or_else(|| "see the warnings above".into()),
    })
}
