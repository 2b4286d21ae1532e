//! Wheel file names and the tags a target accepts (PEP 425, PEP 600, the binary
//! distribution format spec), computed from the recipe's platform and the target's glibc
//! and Python, never from the build host.

use std::{collections::HashMap, fmt};

use pep440_rs::Version;
use pep508_rs::PackageName;
use rattler_conda_types::Subdir;

/// A wheel's file name, parsed: `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelName {
    pub name: PackageName,
    pub version: Version,
    /// Every (python, abi, platform) triple the name's compressed tag sets expand to.
    pub tags: Vec<(String, String, String)>,
}

impl WheelName {
    /// Parses a file name; `None` for anything that is not a well-formed wheel name.
    pub fn parse(file_name: &str) -> Option<WheelName> {
        let stem = file_name.strip_suffix(".whl")?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (name, version, python, abi, platform) = match parts.as_slice() {
            [name, version, python, abi, platform] => (*name, *version, *python, *abi, *platform),
            [name, version, _build, python, abi, platform] => {
                (*name, *version, *python, *abi, *platform)
            }
            _ => return None,
        };
        let name = PackageName::new(name.to_string()).ok()?;
        let version: Version = version.parse().ok()?;
        let mut tags = Vec::new();
        for python in python.split('.') {
            for abi in abi.split('.') {
                for platform in platform.split('.') {
                    tags.push((python.to_string(), abi.to_string(), platform.to_string()));
                }
            }
        }
        Some(WheelName {
            name,
            version,
            tags,
        })
    }
}

/// The name and version of a source distribution's file name (`name-1.0.tar.gz`), which
/// imgbuild never builds but names when it is all a project offers.
pub fn sdist_version(file_name: &str) -> Option<(PackageName, Version)> {
    let stem = [".tar.gz", ".zip", ".tar.bz2", ".tgz"]
        .iter()
        .find_map(|ext| file_name.strip_suffix(ext))?;
    // Names may hold `-` in old sdists; the version is what follows the last one.
    let (name, version) = stem.rsplit_once('-')?;
    Some((
        PackageName::new(name.to_string()).ok()?,
        version.parse().ok()?,
    ))
}

/// The Python of the image: CPython `major.minor.patch`, from the solved conda environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonVersion {
    pub major: u64,
    pub minor: u64,
    /// The full version as the conda package gives it (`3.9.18`).
    pub full: Version,
}

impl PythonVersion {
    /// From a conda `python` package version; `None` unless it is `3.N…`.
    pub(crate) fn from_conda(version: &str) -> Option<PythonVersion> {
        let full: Version = version.parse().ok()?;
        let release = full.release();
        match release {
            [3, minor, ..] => Some(PythonVersion {
                major: 3,
                minor: *minor,
                full: Version::new(release.iter().copied()),
            }),
            _ => None,
        }
    }

    /// `3.9`.
    pub fn short(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.full)
    }
}

/// What the image runs wheels on: its Python, CPU and glibc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelTarget {
    pub python: PythonVersion,
    pub platform: Subdir,
    /// `(major, minor)` of the target's glibc; `None` when it has none, and then no
    /// manylinux wheel fits.
    pub glibc: Option<(u64, u64)>,
}

impl WheelTarget {
    /// The `platform_machine` of the target (`x86_64`, `aarch64`, `ppc64le`).
    pub fn machine(&self) -> Option<&'static str> {
        match self.platform {
            Subdir::Linux64 => Some("x86_64"),
            Subdir::LinuxAarch64 => Some("aarch64"),
            Subdir::LinuxPpc64le => Some("ppc64le"),
            Subdir::LinuxS390X => Some("s390x"),
            _ => None,
        }
    }

    /// Platform tags, most specific first: `manylinux_2_X` from the target's glibc down to
    /// the oldest the architecture has, each legacy alias (`manylinux2014` …) right after the
    /// glibc it stands for, then `linux_<machine>`.
    fn platform_tags(&self) -> Vec<String> {
        let Some(machine) = self.machine() else {
            return Vec::new();
        };
        let mut tags = Vec::new();
        if let Some((2, minor)) = self.glibc {
            // manylinux1/2010 exist only for x86; everything else starts at 2.17.
            let oldest = if machine == "x86_64" { 5 } else { 17 };
            for glibc in (oldest..=minor).rev() {
                tags.push(format!("manylinux_2_{glibc}_{machine}"));
                let legacy = match glibc {
                    17 => Some("manylinux2014"),
                    12 => Some("manylinux2010"),
                    5 => Some("manylinux1"),
                    _ => None,
                };
                if let Some(legacy) = legacy {
                    tags.push(format!("{legacy}_{machine}"));
                }
            }
        }
        tags.push(format!("linux_{machine}"));
        tags
    }

    /// Every tag the target accepts, best first, in the order `pip` and `packaging` use for
    /// CPython.
    pub fn supported_tags(&self) -> SupportedTags {
        let minor = self.python.minor;
        let cp = format!("cp3{minor}");
        let py = format!("py3{minor}");
        let platforms = self.platform_tags();
        let mut ordered: Vec<(String, String, String)> = Vec::new();
        let mut push = |python: &str, abi: &str, platform: &str| {
            ordered.push((python.to_string(), abi.to_string(), platform.to_string()));
        };
        for abi in [cp.as_str(), "abi3", "none"] {
            for platform in &platforms {
                push(&cp, abi, platform);
            }
        }
        // The stable ABI of older CPythons runs on this one.
        for older in (2..minor).rev() {
            for platform in &platforms {
                push(&format!("cp3{older}"), "abi3", platform);
            }
        }
        let mut generic = vec![py.clone(), "py3".to_string()];
        generic.extend((0..minor).rev().map(|older| format!("py3{older}")));
        for python in &generic {
            for platform in &platforms {
                push(python, "none", platform);
            }
        }
        push(&cp, "none", "any");
        for python in &generic {
            push(python, "none", "any");
        }
        SupportedTags(
            ordered
                .into_iter()
                .enumerate()
                .map(|(rank, tag)| (tag, rank))
                .collect(),
        )
    }
}

/// The tags a target accepts, each with its rank (0 is best).
#[derive(Debug, Clone)]
pub struct SupportedTags(HashMap<(String, String, String), usize>);

impl SupportedTags {
    /// The best rank of any of the wheel's tags, `None` when the target accepts none.
    pub fn rank(&self, wheel: &WheelName) -> Option<usize> {
        wheel
            .tags
            .iter()
            .filter_map(|t| self.0.get(t))
            .min()
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(platform: Subdir, glibc: Option<(u64, u64)>) -> WheelTarget {
        WheelTarget {
            python: PythonVersion::from_conda("3.9.18").unwrap(),
            platform,
            glibc,
        }
    }

    fn rank(target: &WheelTarget, file: &str) -> Option<usize> {
        target
            .supported_tags()
            .rank(&WheelName::parse(file).unwrap())
    }

    #[test]
    fn wheel_names_parse_with_compressed_tags_and_build_numbers() {
        let wheel = WheelName::parse("six-1.16.0-py2.py3-none-any.whl").unwrap();
        assert_eq!(wheel.name.as_ref(), "six");
        assert_eq!(wheel.version.to_string(), "1.16.0");
        assert_eq!(wheel.tags.len(), 2);
        let wheel = WheelName::parse(
            "MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        )
        .unwrap();
        assert_eq!(wheel.name.as_ref(), "markupsafe");
        assert_eq!(wheel.tags.len(), 2);
        assert!(WheelName::parse("torch-2.1.0-1-cp39-cp39-linux_x86_64.whl").is_some());
        assert!(WheelName::parse("six-1.16.0.tar.gz").is_none());
        assert!(WheelName::parse("six-py3-none-any.whl").is_none());
        assert_eq!(
            sdist_version("python-dateutil-2.9.0.post0.tar.gz")
                .map(|(n, v)| (n.to_string(), v.to_string())),
            Some(("python-dateutil".to_string(), "2.9.0.post0".to_string()))
        );
    }

    #[test]
    fn tags_follow_the_targets_cpu_glibc_and_python_not_the_hosts() {
        let x86 = target(Subdir::Linux64, Some((2, 31)));
        let arm = target(Subdir::LinuxAarch64, Some((2, 31)));
        let markupsafe_arm =
            "MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_aarch64.manylinux2014_aarch64.whl";
        let markupsafe_x86 =
            "MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl";
        assert!(rank(&arm, markupsafe_arm).is_some());
        assert!(rank(&arm, markupsafe_x86).is_none());
        assert!(rank(&x86, markupsafe_x86).is_some());
        // Another Python's extension, a newer glibc's wheel: refused.
        assert!(rank(&x86, "m-1-cp310-cp310-manylinux_2_17_x86_64.whl").is_none());
        assert!(rank(&x86, "m-1-cp39-cp39-manylinux_2_34_x86_64.whl").is_none());
        assert!(rank(&x86, "m-1-cp39-cp39-manylinux1_x86_64.whl").is_some());
        // No glibc: only pure wheels and `linux_*`.
        let bare = target(Subdir::Linux64, None);
        assert!(rank(&bare, markupsafe_x86).is_none());
        assert!(rank(&bare, "six-1.16.0-py2.py3-none-any.whl").is_some());
        // abi3 wheels of older CPythons fit; a binary wheel beats a pure one.
        let abi3 = rank(&x86, "c-1-cp36-abi3-manylinux_2_17_x86_64.whl").unwrap();
        let pure = rank(&x86, "c-1-py3-none-any.whl").unwrap();
        let native = rank(&x86, markupsafe_x86).unwrap();
        assert!(native < abi3 && abi3 < pure, "{native} {abi3} {pure}");
        assert!(rank(&x86, "c-1-cp310-abi3-manylinux_2_17_x86_64.whl").is_none());
    }
}
