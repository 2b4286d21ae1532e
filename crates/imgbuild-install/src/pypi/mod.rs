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
pub mod range_metadata;
pub mod resolve;

pub use crate::{
    lock::ResolvedWheel,
    python::{PythonTarget, ranges, tags},
};
pub use index::{FindLinks, Sources};
pub use install::StagedWheel;

pub use crate::recipe::pypi::{DEFAULT_INDEX_URL, PypiRecipe};

#[derive(Debug, thiserror::Error)]
pub enum PypiError {
    #[error(transparent)]
    NoPython(#[from] crate::python::NoPython),
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error(transparent)]
    Resolve(#[from] resolve::WheelResolveError),
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    #[error(transparent)]
    Install(#[from] install::WheelInstallError),
    #[error("Failed to fetch the conda packages to see which Python distributions they provide")]
    Conda(#[source] Box<crate::install::InstallError>),
}

/// The image's Python target for `target` with the solved conda `records`.
pub fn python_target(
    target: &Target,
    records: &[RepoDataRecord],
) -> Result<PythonTarget, PypiError> {
    Ok(crate::python::python_target(
        target.platform,
        &target.virtual_packages,
        records,
    )?)
}

/// Resolves the recipe's PyPI requirements for one platform of a solved conda environment.
/// The conda packages that install into Python are fetched first, and each record that
/// provides a Python distribution gets its `pkg:pypi` purl (kept in the lock).
/// `reporter` is told of the index pages and wheels read, and warned of wheels skipped for
/// the image's glibc.
pub async fn lock_platform(
    pypi: &PypiRecipe,
    target: &Target,
    records: &mut [RepoDataRecord],
    cache_dir: &Path,
    reporter: &dyn crate::report::Reporter,
) -> Result<Vec<ResolvedWheel>, PypiError> {
    if pypi.requirements.is_empty() {
        return Ok(Vec::new());
    }
    let python_target = python_target(target, records)?;
    // Their archives' bytes are shown while the solve waits on them.
    crate::install::fetch_only_reporting(
        records,
        target.platform,
        &crate::install::InstallOptions { cache_dir },
        reporter,
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
        reporter,
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
                    &crate::report::Silent,
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

/// Installs the locked `wheels` of one platform (`target`, whose solved conda packages are
/// `records`) into `prefix_dir` (the staging path of `prefix`), after the conda packages
/// whose files are `owned`; `reporter` is told of each wheel as it is installed.
#[allow(clippy::too_many_arguments)] // the plain inputs of one step, each named
pub async fn install_platform(
    wheels: &[ResolvedWheel],
    target: &Target,
    records: &[RepoDataRecord],
    requested: &[Requirement],
    prefix_dir: &Path,
    prefix: &str,
    cache_dir: &Path,
    mut owned: BTreeMap<String, String>,
    reporter: &dyn crate::report::Reporter,
) -> Result<Vec<StagedWheel>, PypiError> {
    if wheels.is_empty() {
        return Ok(Vec::new());
    }
    let python = python_target(target, records)?;
    let scheme = install::Scheme::conda(prefix, &python.wheel.python.short());
    let paths = fetch_locked(wheels, cache_dir).await?;
    let requested: Vec<&PackageName> = requested.iter().map(|r| &r.name).collect();
    let mut staged = Vec::with_capacity(wheels.len());
    for (wheel, path) in wheels.iter().zip(paths) {
        staged.push(install::install_wheel(
            &path,
            &wheel.filename,
            prefix_dir,
            &scheme,
            requested.contains(&&wheel.name),
            &mut owned,
        )?);
        // As each finishes: a hundred wheels take seconds, which a count that waited for
        // the last one would show as a stalled `1/96 packages`.
        reporter.on_item_done(crate::report::Stage::Install, wheel.name.as_ref(), 0);
    }
    Ok(staged)
}
