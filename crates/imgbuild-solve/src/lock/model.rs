//! What a lock holds, in the shape the build uses: plain data and the small questions the
//! stages ask of it.

use std::{collections::BTreeSet, fmt};

use rattler_conda_types::{RepoDataRecord, Subdir};
use rattler_solve::ChannelPriority;

use crate::{
    cuda::{SolvedCuda, solved_cuda, solved_cuda_from_wheels},
    recipe::{Recipe, pypi::Sources},
    resolve::Target,
};

/// The base image as pinned in a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockedBase {
    Scratch,
    /// The manifest digest of the base image, `sha256:<hex>`.
    Digest(String),
}

impl fmt::Display for LockedBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockedBase::Scratch => f.write_str("scratch"),
            LockedBase::Digest(digest) => f.write_str(digest),
        }
    }
}

/// What a lock file holds, in the shape the build uses.
#[derive(Debug, Clone)]
pub struct Lock {
    /// Channel base URLs in priority order.
    pub channels: Vec<String>,
    /// How the channels' order was used in the solve: the lock file's `options:
    /// channel-priority` (rattler's own field; absent, as in locks older than the key, is
    /// strict).
    pub channel_priority: ChannelPriority,
    /// One solved environment per platform, in the lock file's order; never empty, no
    /// platform twice.
    pub platforms: Vec<PlatformLock>,
    /// Where the PyPI wheels were resolved from; `None` for a recipe without `[pypi]`.
    pub pypi: Option<Sources>,
}

/// The environment of one platform.
#[derive(Debug, Clone)]
pub struct PlatformLock {
    pub target: Target,
    pub base: LockedBase,
    /// Packages sorted by name.
    pub records: Vec<RepoDataRecord>,
    /// PyPI wheels sorted by name, installed after the conda packages.
    pub wheels: Vec<ResolvedWheel>,
}

/// A wheel the resolution picked, with what the lock records about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedWheel {
    pub name: pep508_rs::PackageName,
    pub version: pep440_rs::Version,
    pub filename: String,
    pub url: url::Url,
    pub sha256: rattler_digest::Sha256Hash,
    /// The index it came from; `None` for a `find-links` file.
    pub index: Option<url::Url>,
    pub requires_dist: Vec<pep508_rs::Requirement>,
    pub requires_python: Option<pep440_rs::VersionSpecifiers>,
}

impl Lock {
    /// A lock of `platforms` for `recipe`: its channels (base URLs, in its order), channel
    /// priority and PyPI sources, as a solve of it writes them.
    pub fn for_recipe(recipe: &Recipe, platforms: Vec<PlatformLock>) -> Lock {
        Lock {
            channels: recipe
                .channels
                .iter()
                .map(|c| c.base_url.to_string())
                .collect(),
            channel_priority: recipe.channel_priority,
            platforms,
            pypi: recipe.pypi.as_ref().map(|p| p.sources.clone()),
        }
    }

    /// The environment locked for `platform`.
    pub fn platform(&self, platform: Subdir) -> Option<&PlatformLock> {
        self.platforms
            .iter()
            .find(|p| p.target.platform == platform)
    }

    /// How many packages the lock pins, conda packages and wheels, over all platforms.
    pub fn package_count(&self) -> usize {
        self.platforms
            .iter()
            .map(|p| p.records.len() + p.wheels.len())
            .sum()
    }

    /// Every locked package of every platform.
    pub fn all_records(&self) -> impl Iterator<Item = &RepoDataRecord> {
        self.platforms.iter().flat_map(|p| p.records.iter())
    }

    /// The packages of every platform, each once (a noarch package locked for two platforms
    /// is one file), sorted by name.
    pub fn distinct_records(&self) -> Vec<&RepoDataRecord> {
        let mut seen = BTreeSet::new();
        let mut records: Vec<&RepoDataRecord> = self
            .all_records()
            .filter(|r| seen.insert(r.url.as_str()))
            .collect();
        records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
        records
    }

    /// The base of every platform, when they all have the same one (a one-platform lock
    /// always has).
    pub fn common_base(&self) -> Option<&LockedBase> {
        let first = &self.platforms[0].base;
        self.platforms
            .iter()
            .all(|p| &p.base == first)
            .then_some(first)
    }

    /// The newest package build time in the lock, in seconds since the epoch. Images built
    /// from the same lock get the same `created` time from it.
    pub fn newest_timestamp(&self) -> i64 {
        self.all_records()
            .filter_map(|r| r.package_record.timestamp.as_ref())
            .map(|t| t.timestamp())
            .max()
            .unwrap_or(0)
            .max(0)
    }
}

impl PlatformLock {
    /// The CUDA runtime of this platform: its conda packages', else NVIDIA's runtime wheel's.
    pub fn cuda_runtime(&self) -> Option<SolvedCuda> {
        solved_cuda(&self.records).or_else(|| solved_cuda_from_wheels(self.wheel_versions()))
    }

    /// Every CUDA runtime this platform holds: its conda packages' and NVIDIA's runtime
    /// wheels' (a `-cu12` wheel beside conda's 11.8 `cuda-cudart` is a second runtime).
    pub fn cuda_runtimes(&self) -> Vec<SolvedCuda> {
        let conda = solved_cuda(&self.records);
        let wheel = solved_cuda_from_wheels(self.wheel_versions());
        conda.into_iter().chain(wheel).collect()
    }

    /// (normalized name, version) of each locked wheel.
    fn wheel_versions(&self) -> impl Iterator<Item = (&str, String)> {
        self.wheels
            .iter()
            .map(|w| (w.name.as_ref(), w.version.to_string()))
    }
}
