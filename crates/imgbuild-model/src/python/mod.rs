//! The image's Python as the PyPI stage and the lock both reason about it: the wheel tags it
//! takes ([`tags`]), PEP 440 specifiers as version ranges ([`ranges`]), its PEP 508 marker
//! environment ([`PythonTarget`]), and the distributions its conda packages already provide
//! ([`provided`]). Plain rules over conda records and rattler's virtual packages, below both
//! the lock (which checks locked wheels against the recipe) and `imgbuild_install::pypi` (which
//! resolves and installs them).

use std::{collections::BTreeMap, str::FromStr};

use pep440_rs::Version;
use pep440_rs::VersionSpecifiers;
use pep508_rs::{ExtraName, MarkerEnvironment, MarkerEnvironmentBuilder, PackageName, Requirement};
use rattler_conda_types::{GenericVirtualPackage, RepoDataRecord, Subdir};

pub mod ranges;
pub mod requirement;
pub mod tags;

use tags::{PythonVersion, WheelTarget};

/// The environment has PyPI requirements but no Python to install them for.
#[derive(Debug, thiserror::Error)]
#[error(
    "The recipe has PyPI dependencies but the conda environment for {platform} has no `python` 3.x package; add `python` to [conda] dependencies"
)]
pub struct NoPython {
    pub platform: String,
}

/// The Python of a solved conda environment.
pub(crate) fn python_of(records: &[RepoDataRecord]) -> Option<PythonVersion> {
    records
        .iter()
        .find(|r| r.package_record.name.as_normalized() == "python")
        .and_then(|r| PythonVersion::from_conda(&r.package_record.version.to_string()))
}

/// The image's Python target on `platform`, whose virtual packages (`__glibc`) are
/// `virtual_packages`, with the solved conda `records`.
pub fn python_target(
    platform: Subdir,
    virtual_packages: &[GenericVirtualPackage],
    records: &[RepoDataRecord],
) -> Result<PythonTarget, NoPython> {
    let python = python_of(records).ok_or_else(|| NoPython {
        platform: platform.to_string(),
    })?;
    let glibc = virtual_packages
        .iter()
        .find(|v| v.name.as_normalized() == "__glibc")
        .and_then(|v| {
            let text = v.version.to_string();
            let mut parts = text.split('.').map(|p| p.parse::<u64>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        });
    Ok(PythonTarget::new(WheelTarget {
        python,
        platform,
        glibc,
    }))
}

/// The image's Python environment as PEP 508 markers see it, and the wheel tags it takes.
#[derive(Debug, Clone)]
pub struct PythonTarget {
    pub wheel: WheelTarget,
    pub markers: MarkerEnvironment,
}

impl PythonTarget {
    pub fn new(wheel: WheelTarget) -> PythonTarget {
        let full = wheel.python.full.to_string();
        let short = wheel.python.short();
        let markers = MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
            implementation_name: "cpython",
            implementation_version: &full,
            os_name: "posix",
            platform_machine: wheel.machine().unwrap_or(""),
            platform_python_implementation: "CPython",
            platform_release: "",
            platform_system: "Linux",
            platform_version: "",
            python_full_version: &full,
            python_version: &short,
            sys_platform: "linux",
        })
        .expect("a parsed version prints as a valid version");
        PythonTarget { wheel, markers }
    }

    /// Does the requirement apply to this target (with `extras` asked for)?
    pub fn applies(&self, requirement: &Requirement, extras: &[ExtraName]) -> bool {
        requirement.evaluate_markers(&self.markers, extras)
    }

    /// Does a `Requires-Python` allow this target's Python?
    pub fn python_allowed(&self, requires: &VersionSpecifiers) -> bool {
        requires.contains(&self.wheel.python.full)
    }
}

/// A distribution the conda environment provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provided {
    pub version: Version,
    /// The conda package that provides it (`name-version-build`).
    pub package: String,
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
                        package: crate::names::dist_name(record),
                    },
                );
            }
        }
    }
    provided
}
