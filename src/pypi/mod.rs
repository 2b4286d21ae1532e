//! PyPI wheels in the environment: the recipe's `[pypi]` section.
//!
//! After the conda solve, the PyPI requirements are resolved for the image (its Python from
//! the solved conda environment, its CPU and glibc from the recipe's platform and base),
//! pinned by URL and sha256 in the same lock, and installed into the environment's
//! site-packages at the in-image prefix; each wheel is a package of the layer plan, above
//! the conda packages.
//!
//! Why pubgrub and pep508_rs/pep440_rs and an installer of our own rather than uv's crates:
//! uv publishes its crates as internal components without a stable API (every release
//! breaks them), they bring a second HTTP and cache stack, and uv's resolver expects to
//! query a Python interpreter, which for an image is a target binary we must not run. The
//! parts that are hard to get right (version and marker semantics, the solver) come from
//! the same kept crates uv builds on; what is ours is small: index pages, tags, the wheel
//! installer.

use std::{collections::BTreeMap, path::Path};

use pep508_rs::{PackageName, Requirement};
use rattler_conda_types::RepoDataRecord;

use crate::resolve::Target;

pub mod conda;
pub mod fetch;
pub mod index;
pub mod install;
pub mod metadata;
pub mod ranges;
pub mod resolve;
pub mod tags;

pub use index::{FindLinks, Sources};
pub use install::StagedWheel;
pub use resolve::{PythonTarget, ResolvedWheel};

pub use crate::recipe::pypi::{DEFAULT_INDEX_URL, PypiRecipe};

#[derive(Debug, thiserror::Error)]
pub enum PypiError {
    #[error(
        "The recipe has PyPI dependencies but the conda environment for {platform} has no `python` 3.x package; add `python` to [conda] dependencies"
    )]
    NoPython { platform: String },
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error(transparent)]
    Resolve(#[from] resolve::ResolveError),
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    #[error(transparent)]
    Install(#[from] install::WheelInstallError),
    #[error("Failed to fetch the conda packages to see which Python distributions they provide")]
    Conda(#[source] Box<crate::install::InstallError>),
}

/// The Python of a solved conda environment.
pub fn python_of(records: &[RepoDataRecord]) -> Option<tags::PythonVersion> {
    records
        .iter()
        .find(|r| r.package_record.name.as_normalized() == "python")
        .and_then(|r| tags::PythonVersion::from_conda(&r.package_record.version.to_string()))
}

/// The image's Python target for `target` with the solved conda `records`.
pub fn python_target(
    target: &Target,
    records: &[RepoDataRecord],
) -> Result<PythonTarget, PypiError> {
    let python = python_of(records).ok_or_else(|| PypiError::NoPython {
        platform: target.platform.to_string(),
    })?;
    let glibc = target
        .virtual_packages
        .iter()
        .find(|v| v.name.as_normalized() == "__glibc")
        .and_then(|v| {
            let text = v.version.to_string();
            let mut parts = text.split('.').map(|p| p.parse::<u64>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        });
    Ok(PythonTarget::new(tags::WheelTarget {
        python,
        platform: target.platform,
        glibc,
    }))
}

/// Resolves the recipe's PyPI requirements for one platform of a solved conda environment.
/// The conda packages that install into Python are fetched first, and each record that
/// provides a Python distribution gets its `pkg:pypi` purl (kept in the lock).
pub async fn lock_platform(
    pypi: &PypiRecipe,
    target: &Target,
    records: &mut [RepoDataRecord],
    cache_dir: &Path,
) -> Result<Vec<ResolvedWheel>, PypiError> {
    if pypi.requirements.is_empty() {
        return Ok(Vec::new());
    }
    let python_target = python_target(target, records)?;
    crate::install::fetch_only(
        records,
        target.platform,
        &crate::install::InstallOptions { cache_dir },
    )
    .await
    .map_err(|e| PypiError::Conda(Box::new(e)))?;
    let packages = crate::install::package_cache_dir(cache_dir, target.platform);
    conda::record_provided(records, |record| {
        packages.join(crate::install::dist_name(record))
    });
    let provided = conda::provided(records);
    Ok(resolve::resolve(resolve::ResolveInput {
        requirements: &pypi.requirements,
        sources: &pypi.sources,
        target: &python_target,
        provided: &provided,
        cache_dir,
    })
    .await?)
}

/// Wheels downloaded at once: enough to fill a link with NVIDIA's many mid-sized wheels,
/// few enough not to trip an index's rate limits (pip downloads one at a time, uv 50).
const PARALLEL_DOWNLOADS: usize = 4;

/// Fetches the locked wheels into the cache (checked by sha256), several at once, without
/// installing them; returns each wheel's cached path, in the order given.
pub async fn fetch_locked(
    wheels: &[ResolvedWheel],
    cache_dir: &Path,
) -> Result<Vec<std::path::PathBuf>, PypiError> {
    use futures::{StreamExt, TryStreamExt};
    if wheels.is_empty() {
        return Ok(Vec::new());
    }
    let client = crate::http::client()?;
    futures::stream::iter(wheels)
        .map(|wheel| {
            let client = &client;
            async move {
                fetch::fetch_wheel(
                    client,
                    cache_dir,
                    &wheel.url,
                    &wheel.filename,
                    Some(wheel.sha256),
                )
                .await
                .map(|(path, _)| path)
            }
        })
        .buffered(PARALLEL_DOWNLOADS)
        .map_err(PypiError::from)
        .try_collect()
        .await
}

/// Installs the locked wheels of one platform (`locked`) into `prefix_dir` (the staging path
/// of `prefix`), after the conda packages whose files are `owned`.
pub async fn install_platform(
    locked: &crate::lock::PlatformLock,
    requested: &[Requirement],
    prefix_dir: &Path,
    prefix: &str,
    cache_dir: &Path,
    mut owned: BTreeMap<String, String>,
) -> Result<Vec<StagedWheel>, PypiError> {
    if locked.wheels.is_empty() {
        return Ok(Vec::new());
    }
    let python = python_target(&locked.target, &locked.records)?;
    let scheme = install::Scheme::conda(prefix, &python.wheel.python.short());
    let paths = fetch_locked(&locked.wheels, cache_dir).await?;
    let requested: Vec<&PackageName> = requested.iter().map(|r| &r.name).collect();
    let mut staged = Vec::with_capacity(locked.wheels.len());
    for (wheel, path) in locked.wheels.iter().zip(paths) {
        staged.push(install::install_wheel(
            &path,
            &wheel.filename,
            prefix_dir,
            &scheme,
            requested.contains(&&wheel.name),
            &mut owned,
        )?);
    }
    Ok(staged)
}
