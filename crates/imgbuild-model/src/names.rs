//! Names the stages share: the OCI tag and sha256 digest grammars, the OCI architecture and platform of a conda
//! subdir (and the subdir of a platform as a user writes it), and a conda record's
//! `name-version-build`.
//! A leaf: the recipe checks them, the registry client parses references with them, and the
//! image writer and base reader name platforms with them.

use std::fmt;

use rattler_conda_types::{RepoDataRecord, Subdir};

/// [`is_valid_tag`]'s grammar as an error message says it.
pub const TAG_RULE: &str = "up to 128 of `A-Za-z0-9_.-`, not starting with `.` or `-`";

/// The OCI distribution spec's tag grammar: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn is_valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits: the only digests imgbuild
/// writes or takes from a cache.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The OCI `architecture` (and `variant`) of a conda subdir.
pub fn oci_architecture(subdir: Subdir) -> Option<(&'static str, Option<&'static str>)> {
    Some(match subdir {
        Subdir::Linux64 => ("amd64", None),
        Subdir::LinuxAarch64 => ("arm64", Some("v8")),
        Subdir::LinuxPpc64le => ("ppc64le", None),
        Subdir::LinuxS390X => ("s390x", None),
        Subdir::LinuxArmV7l => ("arm", Some("v7")),
        Subdir::LinuxRiscv64 => ("riscv64", None),
        _ => return None,
    })
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

/// `name-version-build` of a record, the way conda names a package file.
pub fn dist_name(record: &RepoDataRecord) -> String {
    format!(
        "{}-{}-{}",
        record.package_record.name.as_normalized(),
        record.package_record.version,
        record.package_record.build
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
