//! Names the stages share: the OCI tag grammar, the OCI architecture of a conda subdir, and
//! a conda record's `name-version-build`.
//! A leaf: the recipe checks them, the registry client parses references with them, and the
//! image writer and base reader name platforms with them.

use rattler_conda_types::{RepoDataRecord, Subdir};

/// The OCI distribution spec's tag grammar: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn is_valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
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

/// `name-version-build` of a record, the way conda names a package file.
pub fn dist_name(record: &RepoDataRecord) -> String {
    format!(
        "{}-{}-{}",
        record.package_record.name.as_normalized(),
        record.package_record.version,
        record.package_record.build
    )
}
