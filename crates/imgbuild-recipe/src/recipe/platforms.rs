//! The platforms an image is built for: conda subdirs, each mapped to the OCI platform its
//! manifest declares.

use std::fmt;

use rattler_conda_types::Subdir;

use crate::names::OciPlatform;

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
}

impl fmt::Display for Platforms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.as_str()).collect();
        f.write_str(&names.join(", "))
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
}
