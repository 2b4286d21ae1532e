//! Which Python distributions the conda environment already provides, so a PyPI
//! requirement they meet is not installed a second time.
//!
//! pixi asks a name mapping service (conda-forge name → PyPI name); imgbuild reads the
//! packages themselves: a conda package that installs `…/site-packages/NAME-VERSION.dist-info`
//! (or `.egg-info`) provides that distribution, whatever the two names are (`pytorch` installs
//! `torch`). What is found is written into the lock as each record's `purls`
//! (`pkg:pypi/torch@2.1.0`), the field pixi uses for the same purpose, so a build from the
//! lock needs no package to decide it again.

use std::{collections::BTreeMap, path::Path, str::FromStr};

use pep440_rs::Version;
use pep508_rs::PackageName;
use rattler_conda_types::{PackageUrl, RepoDataRecord};

use super::metadata::CoreMetadata;

/// A distribution the conda environment provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provided {
    pub version: Version,
    /// The conda package that provides it (`name-version-build`).
    pub package: String,
}

/// Does the record install into a Python environment (a `python` dependency or a
/// `noarch: python` package)? Only those are looked into.
fn is_python_package(record: &RepoDataRecord) -> bool {
    record.package_record.noarch.is_python()
        || record.package_record.depends.iter().any(|d| {
            d == "python"
                || d.starts_with("python ")
                || d.starts_with("python=")
                || d.starts_with("python>")
                || d.starts_with("python<")
        })
}

/// The dist-info or egg-info metadata of an extracted package, by its `info/paths.json`
/// listing (read from the directory itself when that file is missing).
fn distribution_in(extracted: &Path) -> Option<CoreMetadata> {
    let metadata_path = walkdir::WalkDir::new(extracted)
        .max_depth(6)
        .sort_by_file_name()
        .into_iter()
        .filter_map(Result::ok)
        .find_map(|entry| {
            let path = entry.path();
            let parent = path.parent()?.file_name()?.to_str()?;
            let grand = path.parent()?.parent()?.file_name()?.to_str()?;
            let name = entry.file_name().to_str()?;
            let in_site_packages = grand == "site-packages";
            match (parent.rsplit_once('.'), name) {
                (Some((_, "dist-info")), "METADATA") | (Some((_, "egg-info")), "PKG-INFO")
                    if in_site_packages =>
                {
                    Some(path.to_path_buf())
                }
                _ => None,
            }
        })?;
    let text = fs_err::read_to_string(&metadata_path).ok()?;
    CoreMetadata::parse(&text).ok()
}

/// Sets the `pkg:pypi/NAME@VERSION` purl of each record whose extracted package (in
/// `package_dir(record)`) installs a Python distribution. Returns how many it set.
pub fn record_provided(
    records: &mut [RepoDataRecord],
    package_dir: impl Fn(&RepoDataRecord) -> std::path::PathBuf,
) -> usize {
    let mut found = 0;
    for record in records.iter_mut().filter(|r| is_python_package(r)) {
        let Some(metadata) = distribution_in(&package_dir(record)) else {
            continue;
        };
        let Ok(purl) =
            PackageUrl::from_str(&format!("pkg:pypi/{}@{}", metadata.name, metadata.version))
        else {
            continue;
        };
        record.package_record.purls = Some([purl].into_iter().collect());
        found += 1;
    }
    found
}

/// The distributions the locked conda packages provide, from their `pypi` purls (a purl
/// without a version stands for the conda package's own version).
pub fn provided(records: &[RepoDataRecord]) -> BTreeMap<PackageName, Provided> {
    let mut provided = BTreeMap::new();
    for record in records {
        for purl in record.package_record.purls.iter().flatten() {
            if purl.package_type().as_str() != "pypi" {
                continue;
            }
            let Ok(name) = PackageName::new(purl.name().to_string()) else {
                continue;
            };
            let version = purl
                .version()
                .and_then(|v| Version::from_str(v).ok())
                .or_else(|| Version::from_str(&record.package_record.version.to_string()).ok());
            if let Some(version) = version {
                provided.insert(
                    name,
                    Provided {
                        version,
                        package: crate::install::dist_name(record),
                    },
                );
            }
        }
    }
    provided
}
