//! The platforms an image is built for: conda subdirs, each mapped to the OCI platform its
//! manifest declares.

use std::fmt;

use rattler_conda_types::Subdir;

use crate::names::oci_architecture;

/// The conda subdirs of a recipe, in the recipe's order: never empty, no duplicates, each a
/// Linux subdir with an OCI architecture (checked when the recipe is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platforms(Vec<Subdir>);

impl Platforms {
    /// `None` when `subdirs` is empty, repeats one, or names one without an OCI platform.
    pub fn new(subdirs: Vec<Subdir>) -> Option<Self> {
        let valid = !subdirs.is_empty()
            && subdirs.iter().all(|s| OciPlatform::of(*s).is_some())
            && subdirs
                .iter()
                .enumerate()
                .all(|(i, s)| !subdirs[..i].contains(s));
        valid.then_some(Self(subdirs))
    }

    /// One platform.
    pub fn single(subdir: Subdir) -> Self {
        Self::new(vec![subdir]).expect("a Linux subdir with an OCI architecture")
    }

    pub fn as_slice(&self) -> &[Subdir] {
        &self.0
    }

    pub fn iter(&self) -> impl Iterator<Item = Subdir> + '_ {
        self.0.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the image is an index of several platform images rather than one image.
    pub fn is_multi(&self) -> bool {
        self.0.len() > 1
    }

    pub fn contains(&self, subdir: Subdir) -> bool {
        self.0.contains(&subdir)
    }

    /// The platform a command that needs one image picks when not told: the build host's
    /// if the image has it, else the first.
    pub fn default_platform(&self) -> Subdir {
        Subdir::current()
            .filter(|host| self.contains(*host))
            .unwrap_or(self.0[0])
    }
}

impl fmt::Display for Platforms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.as_str()).collect();
        f.write_str(&names.join(", "))
    }
}

/// An OCI platform (`linux/arm64/v8`), as image configs and index entries name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OciPlatform {
    pub architecture: &'static str,
    pub variant: Option<&'static str>,
}

impl OciPlatform {
    /// The OCI platform of a conda subdir; `None` for subdirs that are not Linux.
    pub fn of(subdir: Subdir) -> Option<Self> {
        oci_architecture(subdir).map(|(architecture, variant)| Self {
            architecture,
            variant,
        })
    }

    /// The conda subdir of an OCI platform as a user writes it (`linux/arm64`, `arm64`,
    /// `linux/arm64/v8`, or the subdir itself, `linux-aarch64`).
    pub fn parse_subdir(text: &str) -> Option<Subdir> {
        if let Ok(subdir) = text.parse::<Subdir>() {
            return OciPlatform::of(subdir).map(|_| subdir);
        }
        let mut parts = text.split('/');
        let first = parts.next()?;
        let architecture = if first == "linux" {
            parts.next()?
        } else {
            first
        };
        let variant = parts.next();
        if parts.next().is_some() {
            return None;
        }
        [
            Subdir::Linux64,
            Subdir::LinuxAarch64,
            Subdir::LinuxPpc64le,
            Subdir::LinuxS390X,
            Subdir::LinuxArmV7l,
            Subdir::LinuxRiscv64,
        ]
        .into_iter()
        .find(|subdir| {
            OciPlatform::of(*subdir).is_some_and(|p| {
                p.architecture == architecture && (variant.is_none() || p.variant == variant)
            })
        })
    }
}

impl fmt::Display for OciPlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "linux/{}", self.architecture)?;
        if let Some(variant) = self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_refuse_empty_duplicate_and_non_linux_lists() {
        assert!(Platforms::new(vec![]).is_none());
        assert!(Platforms::new(vec![Subdir::Linux64, Subdir::Linux64]).is_none());
        assert!(Platforms::new(vec![Subdir::Win64]).is_none());
        let both = Platforms::new(vec![Subdir::LinuxAarch64, Subdir::Linux64]).unwrap();
        assert!(both.is_multi());
        assert_eq!(both.to_string(), "linux-aarch64, linux-64");
        assert!(!Platforms::single(Subdir::Linux64).is_multi());
    }

    #[test]
    fn the_default_platform_is_the_hosts_when_the_image_has_it() {
        let both = Platforms::new(vec![Subdir::LinuxAarch64, Subdir::Linux64]).unwrap();
        let host = Subdir::current().unwrap();
        let expected = if both.contains(host) {
            host
        } else {
            Subdir::LinuxAarch64
        };
        assert_eq!(both.default_platform(), expected);
        let arm = Platforms::single(Subdir::LinuxAarch64);
        assert_eq!(arm.default_platform(), Subdir::LinuxAarch64);
    }

    #[test]
    fn oci_platforms_parse_from_the_forms_users_write() {
        for text in ["linux/arm64", "arm64", "linux/arm64/v8", "linux-aarch64"] {
            assert_eq!(
                OciPlatform::parse_subdir(text),
                Some(Subdir::LinuxAarch64),
                "{text}"
            );
        }
        for text in ["linux/amd64", "amd64", "linux-64"] {
            assert_eq!(
                OciPlatform::parse_subdir(text),
                Some(Subdir::Linux64),
                "{text}"
            );
        }
        for text in [
            "win-64",
            "linux/sparc",
            "linux/arm64/v9",
            "linux/arm64/v8/x",
            "",
        ] {
            assert_eq!(OciPlatform::parse_subdir(text), None, "{text}");
        }
        assert_eq!(
            OciPlatform::of(Subdir::LinuxAarch64).unwrap().to_string(),
            "linux/arm64/v8"
        );
        assert_eq!(
            OciPlatform::of(Subdir::Linux64).unwrap().to_string(),
            "linux/amd64"
        );
    }
}
