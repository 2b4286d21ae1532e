//! Which Python distributions the conda environment already provides, so a PyPI
//! requirement they meet is not installed a second time.
//!
//! pixi asks a name mapping service (conda-forge name → PyPI name); imgbuild reads the
//! packages themselves: a conda package that installs `…/site-packages/NAME-VERSION.dist-info`
//! (or `.egg-info`) provides that distribution, whatever the two names are (`pytorch` installs
//! `torch`). What is found is written into the lock as each record's `purls`
//! (`pkg:pypi/torch@2.1.0`), the field pixi uses for the same purpose, so a build from the
//! lock needs no package to decide it again.

use std::{path::Path, str::FromStr};

use rattler_conda_types::{PackageUrl, RepoDataRecord};

use super::metadata::CoreMetadata;
pub use crate::python::{Provided, provided};

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

/// The dist-info and egg-info metadata of an extracted package: usually one distribution,
/// sometimes several (a package that vendors another).
fn distributions_in(extracted: &Path) -> Vec<CoreMetadata> {
    walkdir::WalkDir::new(extracted)
        .max_depth(6)
        .sort_by_file_name()
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            let parent = path.parent()?.file_name()?.to_str()?;
            let grand = path.parent()?.parent()?.file_name()?.to_str()?;
            let name = entry.file_name().to_str()?;
            match (parent.rsplit_once('.'), name) {
                (Some((_, "dist-info")), "METADATA") | (Some((_, "egg-info")), "PKG-INFO")
                    if grand == "site-packages" =>
                {
                    // Metadata is kilobytes; a package shipping a huge one gets no answer.
                    let text = crate::fs::read_input_text(path, 64 << 20).ok()?;
                    CoreMetadata::parse(&text).ok()
                }
                _ => None,
            }
        })
        .collect()
}

/// Sets the `pkg:pypi/NAME@VERSION` purls of each record whose extracted package (in
/// `package_dir(record)`) installs Python distributions. Returns how many records it set.
pub(crate) fn record_provided(
    records: &mut [RepoDataRecord],
    package_dir: impl Fn(&RepoDataRecord) -> std::path::PathBuf,
) -> usize {
    let mut found = 0;
    for record in records.iter_mut().filter(|r| is_python_package(r)) {
        let purls: std::collections::BTreeSet<PackageUrl> = distributions_in(&package_dir(record))
            .into_iter()
            .filter_map(|metadata| {
                PackageUrl::from_str(&format!("pkg:pypi/{}@{}", metadata.name, metadata.version))
                    .ok()
            })
            .collect();
        if purls.is_empty() {
            continue;
        }
        record.package_record.purls = Some(purls);
        found += 1;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, depends: &[&str]) -> RepoDataRecord {
        serde_json::from_value(serde_json::json!({
            "name": name, "version": "2.1.0", "build": "py39_0", "build_number": 0,
            "depends": depends, "subdir": "linux-64",
            "fn": format!("{name}-2.1.0-py39_0.conda"),
            "url": format!("https://example.org/c/linux-64/{name}-2.1.0-py39_0.conda"),
            "channel": "https://example.org/c/",
        }))
        .unwrap()
    }

    #[test]
    fn distributions_are_read_from_the_packages_files_whatever_their_conda_names() {
        let dir = tempfile::tempdir().unwrap();
        let site = "lib/python3.9/site-packages";
        let write = |package: &str, file: &str, text: &str| {
            let path = dir.path().join(package).join(site).join(file);
            fs_err::create_dir_all(path.parent().unwrap()).unwrap();
            fs_err::write(path, text).unwrap();
        };
        // `pytorch` installs `torch` and vendors `functorch`; an old package has an egg-info.
        write(
            "pytorch",
            "torch-2.1.0.dist-info/METADATA",
            "Name: torch\nVersion: 2.1.0\n",
        );
        write(
            "pytorch",
            "functorch-2.0.0.dist-info/METADATA",
            "Name: functorch\nVersion: 2.0.0\n",
        );
        write(
            "oldpkg",
            "oldpkg-0.9.egg-info/PKG-INFO",
            "Name: OldPkg\nVersion: 0.9\n",
        );
        // Not a Python package: never looked into, whatever it holds.
        write(
            "libfoo",
            "foo-1.0.dist-info/METADATA",
            "Name: foo\nVersion: 1.0\n",
        );
        let mut records = vec![
            record("pytorch", &["python >=3.9,<3.10"]),
            record("oldpkg", &["python"]),
            record("libfoo", &[]),
        ];
        let found = record_provided(&mut records, |r| {
            dir.path().join(r.package_record.name.as_normalized())
        });
        assert_eq!(found, 2);
        let provided = provided(&records);
        let names: Vec<String> = provided
            .iter()
            .map(|(name, p)| format!("{name} {} {}", p.version, p.package))
            .collect();
        assert_eq!(
            names,
            [
                "functorch 2.0.0 pytorch-2.1.0-py39_0",
                "oldpkg 0.9 oldpkg-2.1.0-py39_0",
                "torch 2.1.0 pytorch-2.1.0-py39_0"
            ]
        );
    }
}
