//! Step 2: a lock that satisfies the recipe. The existing lock is reused when it still
//! holds every platform's target and base (and, with `--locked`, must be); otherwise each
//! platform is solved on its own, its wheels locked after its conda packages, and the lock
//! is written and read back.

use std::path::{Path, PathBuf};

use rattler_conda_types::RepoDataRecord;

use super::{
    error::BuildError,
    model::{BuildSettings, LockMode, LockOutcome, LockReport},
    prepare::{Prepared, PreparedPlatform},
};
use crate::{
    lock::{Lock, PlatformLock, Staleness},
    recipe::Recipe,
    report::{Reporter, Stage},
    resolve::{Environment, ResolveOptions, resolve_environment},
};

/// What to do with the lock file, decided from the mode and what the file holds.
#[derive(Debug, PartialEq)]
enum LockStep {
    /// `--locked` without a lock.
    Missing,
    /// `--locked` with a lock that no longer satisfies the recipe.
    Outdated(Staleness),
    /// The lock satisfies the recipe: use it.
    Reuse,
    /// The lock's packages satisfy the recipe but a `[[files]]` source or a model's file
    /// changed: pin them again without solving (the packages do not depend on them).
    Repin { reason: String },
    /// Solve and write a lock; `reason` says why one that exists is replaced.
    Solve { reason: Option<String> },
}

impl LockStep {
    /// `exists`: whether there is a lock file; `staleness`: why it no longer satisfies the
    /// recipe, if it does not.
    fn decide(mode: LockMode, exists: bool, staleness: Option<Staleness>) -> Self {
        match (mode, exists, staleness) {
            (LockMode::Locked, false, _) => LockStep::Missing,
            (LockMode::Locked, true, Some(reason)) => LockStep::Outdated(reason),
            (LockMode::Locked | LockMode::Reuse, true, None) => LockStep::Reuse,
            (
                LockMode::Reuse,
                true,
                Some(reason @ (Staleness::Sources { .. } | Staleness::Model { .. })),
            ) => LockStep::Repin {
                reason: reason.to_string(),
            },
            (_, exists, staleness) => LockStep::Solve {
                reason: match (exists, staleness) {
                    (_, Some(reason)) => Some(reason.to_string()),
                    (true, None) => Some("refresh requested".to_string()),
                    (false, None) => None,
                },
            },
        }
    }
}

/// What a lock pins beside the packages: the `[[files]]` sources and the models' files.
struct LockPins {
    sources: Vec<crate::lock::SourceDigest>,
    models: Vec<crate::lock::ModelPin>,
}

/// Returns a lock that satisfies the recipe, solving and writing one when needed.
pub(super) async fn obtain_lock(
    prepared: &Prepared,
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<(Lock, LockReport), BuildError> {
    let recipe = &prepared.recipe;
    let lock_path = recipe.lock_path();
    let existing = Lock::read(&lock_path)?;
    // Checked first, whatever the lock: a `[[files]]` source that is missing or cannot be
    // read, or an account name the image lacks, fails before a solve or an install that
    // would be for nothing.
    for platform in &prepared.platforms {
        super::accounts_layer::check_names(recipe, platform.tables.as_ref())?;
    }
    let pins = LockPins {
        sources: super::files_layer::source_digests(recipe)?,
        models: crate::models::pins(recipe)?,
    };
    let staleness = match &existing {
        Some(lock) => {
            // The `[[files]]` sources and the models after the packages: a changed
            // package explains more.
            let files = crate::lock::read_sources(&lock_path)?;
            let models = crate::lock::read_models(&lock_path)?;
            lock.check(recipe, &prepared.wanted())
                .and_then(|()| crate::lock::check_files(&files, &pins.sources))
                .and_then(|()| crate::lock::check_models(&models, &pins.models))
                .err()
        }
        None => None,
    };
    if !settings.update.is_empty() {
        let old = existing.ok_or_else(|| BuildError::UpdateWithoutLock {
            path: lock_path.clone(),
        })?;
        super::lock_update::check_names(&old, &settings.update, &lock_path)?;
        let lock = solve(prepared, settings, Some(&old), &lock_path, reporter).await?;
        let lock = write_and_read_back(&lock, recipe, &pins, &lock_path)?;
        let outcome = LockOutcome::Updated {
            names: settings.update.clone(),
            changes: super::lock_update::changes(&old, &lock),
        };
        return Ok(reported(lock, lock_path, outcome));
    }
    match (
        LockStep::decide(settings.lock_mode, existing.is_some(), staleness),
        existing,
    ) {
        (LockStep::Missing, _) => Err(BuildError::LockMissing { path: lock_path }),
        (LockStep::Outdated(reason), _) => Err(BuildError::LockOutdated {
            path: lock_path,
            reason,
        }),
        (LockStep::Reuse, existing) => {
            let lock = existing.expect("a lock is reused only when there is one");
            // Refused, not re-solved: a lock pinning packages from elsewhere was tampered with.
            lock.check_sources(recipe, &lock_path)?;
            check_cuda_runtimes(recipe, &lock.platforms, reporter)?;
            Ok(reported(lock, lock_path, LockOutcome::Reused))
        }
        (LockStep::Repin { reason }, existing) => {
            let lock = existing.expect("a lock is repinned only when there is one");
            lock.check_sources(recipe, &lock_path)?;
            check_cuda_runtimes(recipe, &lock.platforms, reporter)?;
            let lock = write_and_read_back(&lock, recipe, &pins, &lock_path)?;
            Ok(reported(lock, lock_path, LockOutcome::Repinned { reason }))
        }
        (LockStep::Solve { reason }, _) => {
            let lock = solve(prepared, settings, None, &lock_path, reporter).await?;
            let lock = write_and_read_back(&lock, recipe, &pins, &lock_path)?;
            Ok(reported(lock, lock_path, LockOutcome::Written { reason }))
        }
    }
}

fn reported(lock: Lock, lock_path: PathBuf, outcome: LockOutcome) -> (Lock, LockReport) {
    let packages = lock.package_count();
    let report = LockReport {
        lock_path,
        outcome,
        packages,
    };
    (lock, report)
}

/// Solves every platform of the recipe into a lock (not yet written); with `old`, keeping
/// its pins but those of `settings.update`.
async fn solve(
    prepared: &Prepared,
    settings: &BuildSettings,
    old: Option<&Lock>,
    lock_path: &Path,
    reporter: &dyn Reporter,
) -> Result<Lock, BuildError> {
    let recipe = &prepared.recipe;
    reporter.on_stage(
        Stage::Solve,
        &format!(
            "{} {} for {}",
            recipe.specs.len(),
            if recipe.specs.len() == 1 {
                "dependency"
            } else {
                "dependencies"
            },
            recipe.platforms
        ),
    );
    if settings.offline
        && let Some(pypi) = &recipe.pypi
        && pypi.sources.needs_network()
    {
        return Err(BuildError::PypiOffline {
            path: lock_path.to_path_buf(),
        });
    }
    // Each platform is solved on its own, for its own virtual packages.
    let mut platforms = Vec::with_capacity(prepared.platforms.len());
    for platform in &prepared.platforms {
        let old = old.and_then(|lock| {
            lock.platforms
                .iter()
                .find(|p| p.target.platform == platform.platform)
        });
        let kept = super::lock_update::kept(old, &settings.update);
        platforms.push(solve_platform(recipe, platform, &kept, settings, reporter).await?);
    }
    // Before the lock is written: a runtime the image cannot run leaves no lock.
    check_cuda_runtimes(recipe, &platforms, reporter)?;
    Ok(Lock::for_recipe(recipe, platforms))
}

/// One platform's conda packages, then its wheels.
async fn solve_platform(
    recipe: &Recipe,
    platform: &PreparedPlatform,
    kept: &[RepoDataRecord],
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<PlatformLock, BuildError> {
    let mut records: Vec<RepoDataRecord> = resolve_environment(
        &Environment {
            locked: kept,
            ..Environment::of(recipe)
        },
        &platform.target,
        &ResolveOptions {
            cache_dir: &settings.cache_dir,
            offline: settings.offline,
        },
    )
    .await?;
    // PyPI after conda: its Python, and what conda already provides, decide it.
    let wheels = match &recipe.pypi {
        Some(pypi) => {
            crate::pypi::lock_platform(
                pypi,
                &platform.target,
                &mut records,
                &settings.cache_dir,
                reporter,
            )
            .await?
        }
        None => Vec::new(),
    };
    Ok(PlatformLock {
        target: platform.target.clone(),
        base: platform.locked_base.clone(),
        records,
        wheels,
    })
}

/// Writes `lock` for `recipe`, with its `[[files]]` sources' digests and its models'
/// files, and reads it back.
fn write_and_read_back(
    lock: &Lock,
    recipe: &Recipe,
    pins: &LockPins,
    lock_path: &Path,
) -> Result<Lock, BuildError> {
    let recipe_file = recipe.path.file_name().map_or_else(
        || recipe.path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    lock.write_pinned(lock_path, &recipe_file, &pins.sources, &pins.models)?;
    // Build from the lock as it reads back, not from the solver's records: the lock
    // keeps fewer fields (no `arch`/`platform`, which some channels leave to be
    // derived), and a build from a fresh solve must equal any later build from its
    // lock.
    Lock::read(lock_path)?.ok_or_else(|| BuildError::LockMissing {
        path: lock_path.to_path_buf(),
    })
}

/// The CUDA runtimes each platform solved to, against the recipe's `[cuda]` (see
/// [`crate::cuda::check_runtime`]): one other than `[cuda] version` is an error (with
/// `compat`, one forward compatibility runs is a warning), and so is a CPU build of a GPU
/// framework that an older lock pins. A recipe without `[cuda]` whose
/// environment holds a runtime gets a warning showing the section it is built as if it had
/// (see [`crate::cuda::intent::derived_target`]). Warnings are said once for all platforms.
fn check_cuda_runtimes(
    recipe: &Recipe,
    platforms: &[PlatformLock],
    reporter: &dyn Reporter,
) -> Result<(), BuildError> {
    let mut warnings = std::collections::BTreeSet::new();
    for platform in platforms {
        match &recipe.cuda {
            Some(cuda) => {
                crate::cuda::check_no_cpu_builds(cuda, &platform.records)?;
                for runtime in platform.cuda_runtimes() {
                    warnings.extend(crate::cuda::check_runtime(cuda, &runtime)?);
                }
            }
            None => {
                if let Some(runtime) = platform.cuda_runtime() {
                    let derived = crate::cuda::intent::derived_target(&runtime);
                    warnings.insert(crate::cuda::intent::undeclared_runtime_warning(
                        &runtime, &derived,
                    ));
                }
            }
        }
    }
    for warning in warnings {
        reporter.on_warning(&warning);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stale() -> Staleness {
        Staleness::MissingSpec("numpy".to_string())
    }

    #[test]
    fn locked_needs_a_lock_that_satisfies_the_recipe() {
        use LockStep::*;
        assert_eq!(LockStep::decide(LockMode::Locked, false, None), Missing);
        assert_eq!(
            LockStep::decide(LockMode::Locked, true, Some(stale())),
            Outdated(stale())
        );
        assert_eq!(LockStep::decide(LockMode::Locked, true, None), Reuse);
    }

    #[test]
    fn reuse_solves_only_a_missing_or_stale_lock() {
        assert_eq!(
            LockStep::decide(LockMode::Reuse, true, None),
            LockStep::Reuse
        );
        assert_eq!(
            LockStep::decide(LockMode::Reuse, false, None),
            LockStep::Solve { reason: None }
        );
        assert_eq!(
            LockStep::decide(LockMode::Reuse, true, Some(stale())),
            LockStep::Solve {
                reason: Some(stale().to_string())
            }
        );
    }

    #[test]
    fn a_changed_files_source_is_repinned_not_solved_and_refused_when_locked() {
        let files = || Staleness::Sources {
            src: "notebooks".into(),
            locked: Some(format!("sha256:{}", "a".repeat(64))),
            wanted: Some(format!("sha256:{}", "b".repeat(64))),
        };
        assert_eq!(
            LockStep::decide(LockMode::Reuse, true, Some(files())),
            LockStep::Repin {
                reason: files().to_string()
            }
        );
        assert_eq!(
            LockStep::decide(LockMode::Locked, true, Some(files())),
            LockStep::Outdated(files())
        );
        assert!(matches!(
            LockStep::decide(LockMode::Refresh, true, Some(files())),
            LockStep::Solve { .. }
        ));
    }

    #[test]
    fn refresh_always_solves_and_says_why() {
        assert_eq!(
            LockStep::decide(LockMode::Refresh, true, None),
            LockStep::Solve {
                reason: Some("refresh requested".to_string())
            }
        );
        assert_eq!(
            LockStep::decide(LockMode::Refresh, false, None),
            LockStep::Solve { reason: None }
        );
        assert_eq!(
            LockStep::decide(LockMode::Refresh, true, Some(stale())),
            LockStep::Solve {
                reason: Some(stale().to_string())
            }
        );
    }
}
