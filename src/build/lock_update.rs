//! `imgbuild lock --update NAME`: solve again keeping every pin of the lock but NAME's, as
//! `pixi update NAME` does. The kept pins are the solver's preferred records, not
//! requirements, so a kept package that no longer fits the updated one gives way; what
//! changed is reported pin by pin.

use std::path::Path;

use rattler_conda_types::RepoDataRecord;

use super::error::BuildError;
use crate::lock::{Lock, PlatformLock};

/// Refuses a name that no platform of `lock` pins, as a conda package or a wheel: an
/// update of it would solve for nothing.
pub(super) fn check_names(
    lock: &Lock,
    names: &[String],
    lock_path: &Path,
) -> Result<(), BuildError> {
    for name in names {
        let pinned = lock.platforms.iter().any(|platform| {
            platform.records.iter().any(|r| is_named(r, name))
                || platform
                    .wheels
                    .iter()
                    .any(|w| w.name.as_ref() == pep503(name))
        });
        if !pinned {
            return Err(BuildError::UpdateUnknown {
                path: lock_path.to_path_buf(),
                name: name.clone(),
            });
        }
    }
    Ok(())
}

/// The records of `old` (the lock's platform being solved again) the solve keeps: all but
/// those `names` frees.
pub(super) fn kept(old: Option<&PlatformLock>, names: &[String]) -> Vec<RepoDataRecord> {
    old.map(|platform| {
        platform
            .records
            .iter()
            .filter(|r| !names.iter().any(|n| is_named(r, n)))
            .cloned()
            .collect()
    })
    .unwrap_or_default()
}

/// What changed from `old` to `new`, one line per pin: `linux-64: numpy 1.26.0 -> 1.26.4`,
/// `+ name version` for one added and `- name version` for one dropped.
pub(super) fn changes(old: &Lock, new: &Lock) -> Vec<String> {
    let mut lines = Vec::new();
    for platform in &new.platforms {
        let subdir = platform.target.platform;
        let before = old
            .platforms
            .iter()
            .find(|p| p.target.platform == subdir)
            .map(pins)
            .unwrap_or_default();
        let after = pins(platform);
        for (name, version) in &after {
            match before.iter().find(|(n, _)| n == name) {
                Some((_, was)) if was != version => {
                    lines.push(format!("{subdir}: {name} {was} -> {version}"))
                }
                Some(_) => {}
                None => lines.push(format!("{subdir}: + {name} {version}")),
            }
        }
        for (name, version) in &before {
            if !after.iter().any(|(n, _)| n == name) {
                lines.push(format!("{subdir}: - {name} {version}"));
            }
        }
    }
    lines
}

/// Each pin of a platform as `(name, version-build)`, conda packages then wheels.
fn pins(platform: &PlatformLock) -> Vec<(String, String)> {
    let conda = platform.records.iter().map(|r| {
        let p = &r.package_record;
        (
            p.name.as_normalized().to_string(),
            format!("{}-{}", p.version, p.build),
        )
    });
    let wheels = platform
        .wheels
        .iter()
        .map(|w| (format!("{} (wheel)", w.name), w.version.to_string()));
    conda.chain(wheels).collect()
}

/// Conda names compare lowercase (`_libgcc_mutex` and `libgcc-mutex` are two packages).
fn is_named(record: &RepoDataRecord, name: &str) -> bool {
    record.package_record.name.as_normalized() == name.to_ascii_lowercase()
}

/// A PyPI name as PEP 503 compares it: lowercase, each run of `-`, `_` and `.` as `-`.
fn pep503(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let parts: Vec<&str> = lower
        .split(['-', '_', '.'])
        .filter(|p| !p.is_empty())
        .collect();
    parts.join("-")
}
