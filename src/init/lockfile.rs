//! One environment of a rattler lock file read into [`Pins`]. rattler_lock reads pixi's
//! lock formats (v1–v7: pixi.lock) and conda-lock's unified format (version 1,
//! conda-lock.yml, which early pixi wrote too), so both come through here.

use std::path::Path;

use rattler_lock::{CondaPackageData, LockFile};

use super::{
    InitError,
    pins::{PinnedPlatform, Pins, linux_platform},
};
use crate::lock::ResolvedWheel;

/// Parses `text`, read from `path`. Paths in the lock are relative to its directory.
pub(super) fn parse(text: &str, path: &Path) -> Result<LockFile, InitError> {
    crate::python::requirement::check_lock(text).map_err(|reason| InitError::Import {
        path: path.to_path_buf(),
        reason: format!("a PyPI requirement {reason}"),
    })?;
    LockFile::from_str_with_base_directory(text, path.parent()).map_err(|source| {
        InitError::LockParse {
            path: path.to_path_buf(),
            source: Box::new(source),
        }
    })
}

/// The pins of `environment` in `lock`, read from `path`.
pub(super) fn pins(lock: &LockFile, environment: &str, path: &Path) -> Result<Pins, InitError> {
    let import_error = |reason: String| InitError::Import {
        path: path.to_path_buf(),
        reason,
    };
    let env = lock.environment(environment).ok_or_else(|| {
        let mut names: Vec<&str> = lock.environments().map(|(name, _)| name).collect();
        names.sort_unstable();
        InitError::NoEnvironment {
            path: path.to_path_buf(),
            name: environment.to_string(),
            available: names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    })?;
    let lock_dir = path.parent().unwrap_or(Path::new("."));
    let mut pins = Pins {
        channels: env.channels().iter().map(|c| c.url.clone()).collect(),
        channel_priority: Some(env.solve_options().channel_priority),
        pypi_indexes: env
            .pypi_indexes()
            .map(|i| i.indexes.clone())
            .unwrap_or_default(),
        has_dependencies: true,
        ..Pins::default()
    };
    if env.pypi_indexes().is_some_and(|i| !i.find_links.is_empty()) {
        return Err(import_error(
            "its PyPI sources include find-links, which an import does not carry yet".to_string(),
        ));
    }
    let mut platforms: Vec<_> = env.platforms().collect();
    platforms.sort_by_key(|p| p.name().as_str().to_string());
    for platform in platforms {
        let Some(subdir) = linux_platform(platform.subdir().as_str()) else {
            pins.dropped_platforms
                .push(platform.name().as_str().to_string());
            continue;
        };
        if pins.platforms.iter().any(|p| p.subdir == subdir) {
            return Err(import_error(format!("it locks `{subdir}` twice")));
        }
        let mut records = Vec::new();
        for package in env.conda_packages(platform).into_iter().flatten() {
            let binary = match package {
                CondaPackageData::Binary(binary) => binary,
                CondaPackageData::Source(_) => {
                    return Err(import_error(format!(
                        "`{}` on `{subdir}` is a source package, which pixi builds; imgbuild installs built packages only",
                        package.name().as_normalized()
                    )));
                }
            };
            let record = rattler_conda_types::RepoDataRecord::try_from(binary.as_ref().clone())
                .map_err(|e| {
                    import_error(format!(
                        "`{}` on `{subdir}` has no URL imgbuild can fetch: {e}",
                        binary.package_record.name.as_normalized()
                    ))
                })?;
            records.push(record);
        }
        let mut wheels = Vec::new();
        for package in env.pypi_packages(platform).into_iter().flatten() {
            wheels.push(
                ResolvedWheel::from_locked(package, lock_dir)
                    .map_err(|reason| import_error(format!("on `{subdir}`: {reason}")))?,
            );
        }
        pins.platforms.push(PinnedPlatform {
            subdir,
            records,
            wheels,
        });
    }
    Ok(pins)
}
