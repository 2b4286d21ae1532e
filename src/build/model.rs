//! What the steps of a build share: the settings a build is given, what it reports, the
//! context the steps after the plan read, and the image it leaves in the layout. The driver
//! in [`super`] passes these from step to step; no step names the driver.

use std::{path::PathBuf, time::Duration};

use rattler_conda_types::Subdir;
use url::Url;

use crate::{
    layers::BuiltLayer,
    lock::Lock,
    recipe::{Recipe, matrix::Variant},
    registry::ClientOptions,
    report::{Reporter, Stage},
};

/// How to treat an existing lock file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LockMode {
    /// Use the lock if it still satisfies the recipe, else solve and rewrite it.
    #[default]
    Reuse,
    /// Use the lock; fail if it is missing or no longer satisfies the recipe.
    Locked,
    /// Always solve and rewrite the lock.
    Refresh,
}

/// Settings of one build, resolved from the command line and environment.
#[derive(Debug, Clone)]
pub(crate) struct BuildSettings {
    pub recipe_path: PathBuf,
    pub channel_alias: Url,
    pub cache_dir: PathBuf,
    /// The layout directory; `images/<name>` under the working directory when `None`.
    pub output: Option<PathBuf>,
    pub lock_mode: LockMode,
    pub offline: bool,
    /// Layers compressed at once.
    pub jobs: usize,
    /// `SOURCE_DATE_EPOCH`, if set: the image's `created` time.
    pub source_date_epoch: Option<i64>,
    /// How to reach registries (bases).
    pub registry: ClientOptions,
    /// The matrix variant to build, for a recipe with a `[matrix]`.
    pub variant: Option<Variant>,
    /// The `imgbuild-smoke` executables for `[smoke] embed = true`, one per architecture;
    /// default: those beside imgbuild.
    pub smoke_exe: Vec<PathBuf>,
    /// `build -t`: tags that replace the recipe's `[image] tags`; none keeps the recipe's.
    pub tags: Vec<String>,
    /// `build --platform`: the recipe's platforms to build, in the recipe's order; none
    /// builds them all. The lock still holds every platform of the recipe.
    pub platforms: Vec<Subdir>,
    /// `lock --update`: the packages to solve again, every other pin of the lock kept.
    pub update: Vec<String>,
    /// `--cache-repo`: the registry repository layers are shared through.
    pub cache_repo: Option<CacheRepoSettings>,
}

/// `--cache-repo`: the registry repository layers are shared through (`cache_repo`).
#[derive(Debug, Clone)]
pub(crate) struct CacheRepoSettings {
    /// `REGISTRY/REPO`, neither tag nor digest.
    pub repository: crate::registry::Reference,
    /// `--cache-repo-readonly`: entries are read, never written.
    pub readonly: bool,
    /// `--cache-sign-by`, `--cache-verify-key`.
    pub keys: crate::registry::cache_repo::EntryKeys,
}

/// How the lock was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockOutcome {
    Reused,
    /// Solved and written; `reason` says why a lock that existed was replaced.
    Written {
        reason: Option<String>,
    },
    /// The packages kept, the `[[files]]` sources pinned again because `reason`.
    Repinned {
        reason: String,
    },
    /// Solved again with every pin kept but the named packages'; `changes`, one line per pin
    /// that moved (see `lock_update::changes`).
    Updated {
        names: Vec<String>,
        changes: Vec<String>,
    },
}

/// The result of `lock`.
#[derive(Debug, Clone)]
pub(crate) struct LockReport {
    pub lock_path: PathBuf,
    pub outcome: LockOutcome,
    pub packages: usize,
}

/// The result of `build`.
#[derive(Debug, Clone)]
pub(crate) struct BuildReport {
    pub layout_dir: PathBuf,
    pub tags: Vec<String>,
    /// What the tags name: the manifest, or the image index of a multi-platform image.
    pub manifest_digest: String,
    /// Each platform's manifest digest, in the recipe's order.
    pub platforms: Vec<(Subdir, String)>,
    pub base_layers: usize,
    pub layers: Vec<BuiltLayer>,
    pub lock: LockReport,
    pub timings: Vec<(Stage, Duration)>,
    /// The SPDX and CycloneDX SBOMs written beside the layout.
    pub sboms: Vec<PathBuf>,
    /// The SLSA provenance written beside the layout.
    pub provenance: PathBuf,
    /// The inputs were those of the image already in the layout: nothing was rebuilt.
    pub unchanged: bool,
    /// What the layer cache repository did, when one was used.
    pub cache_repo: Option<crate::registry::cache_repo::CacheRepoSummary>,
    /// The `[[models]]` written beside the image, in the recipe's order.
    pub models: Vec<crate::models::WrittenModel>,
}

/// The result of `build --shard I/N`: what this worker compressed and stored.
#[derive(Debug)]
pub(crate) struct ShardReport {
    pub shard: crate::layers::shard::Shard,
    /// Variants staged (1 for a recipe without a matrix).
    pub variants: usize,
    /// Distinct package layers of all the variants and platforms, and their file bytes.
    pub distinct_layers: usize,
    pub distinct_bytes: u64,
    /// This shard's layers, each once.
    pub layers: Vec<ShardLayer>,
    pub cache_repo: crate::registry::cache_repo::CacheRepoSummary,
}

/// One of a shard's layers: its layer-cache key, and the layer (`reused`: taken from a
/// cache, not compressed).
#[derive(Debug)]
pub(crate) struct ShardLayer {
    pub key: String,
    pub built: BuiltLayer,
}

/// The image a build leaves in the layout (written, or found unchanged), as it reports it.
#[derive(Debug)]
pub(super) struct BuiltImage {
    /// What the tags name: the manifest, or the image index of several platforms.
    pub(super) digest: String,
    /// Each platform's manifest digest, in the recipe's order.
    pub(super) manifests: Vec<(Subdir, String)>,
    /// The image's own layers (not its bases'), platform after platform.
    pub(super) layers: Vec<BuiltLayer>,
}

/// What the steps after the plan share.
pub(super) struct Context<'a> {
    pub(super) settings: &'a BuildSettings,
    pub(super) recipe: &'a Recipe,
    /// The image's `created` time, seconds since the epoch: `SOURCE_DATE_EPOCH`, else the
    /// time of the lock's newest package.
    pub(super) created_seconds: i64,
    pub(super) reporter: &'a dyn Reporter,
}

impl<'a> Context<'a> {
    pub(super) fn new(
        settings: &'a BuildSettings,
        recipe: &'a Recipe,
        lock: &Lock,
        reporter: &'a dyn Reporter,
    ) -> Self {
        let created_seconds = settings
            .source_date_epoch
            .unwrap_or_else(|| lock.newest_timestamp())
            .max(0);
        Context {
            settings,
            recipe,
            created_seconds,
            reporter,
        }
    }
}

/// `1 package`, `2 packages`: a count with its noun in the number it takes. Only for
/// nouns whose plural adds an `s` (package, layer).
pub(crate) fn counted(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}
