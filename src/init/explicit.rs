//! An `@EXPLICIT` file (`conda list --explicit --md5` or `--sha256`, conda-lock's
//! `--kind explicit`) read into [`Pins`]. rattler's [`ExplicitEnvironmentSpec`] reads the
//! lines; each URL names its package (`name-version-build.conda`) and carries its digest as
//! the fragment. The file holds nothing else: no dependencies, no channel list, and with
//! `--md5` no sha256, which the notes say.

use std::str::FromStr;

use rattler_conda_types::{
    ExplicitEnvironmentSpec, PackageName, PackageRecord, RepoDataRecord, Subdir,
    package::{BuildString, DistArchiveIdentifier},
};

use super::pins::{PinnedPlatform, Pins, linux_platform};

/// The pins of an `@EXPLICIT` file's `text`, with notes; the reason when it cannot be one.
pub(super) fn pins(text: &str, notes: &mut Vec<String>) -> Result<Pins, String> {
    let spec = ExplicitEnvironmentSpec::from_str(text).map_err(|e| e.to_string())?;
    let mut records = Vec::with_capacity(spec.packages.len());
    let mut channels: Vec<String> = Vec::new();
    let mut subdirs: Vec<Subdir> = Vec::new();
    let mut md5_only = 0;
    for entry in &spec.packages {
        let record = record_of(&entry.url)?;
        if record.package_record.sha256.is_none() {
            md5_only += 1;
        }
        let channel = record.channel.clone().unwrap_or_default();
        if !channels.contains(&channel) {
            channels.push(channel);
        }
        let subdir = record.package_record.subdir.parse::<Subdir>().ok();
        if let Some(subdir) = subdir.filter(|s| *s != Subdir::NoArch)
            && !subdirs.contains(&subdir)
        {
            subdirs.push(subdir);
        }
        records.push(record);
    }
    let platform = match (spec.platform, subdirs.as_slice()) {
        (Some(platform), _) => platform,
        (None, [one]) => *one,
        (None, []) => {
            return Err(
                "it names no platform (`# platform:`) and pins no platform's package".into(),
            );
        }
        (None, many) => {
            return Err(format!(
                "it names no platform (`# platform:`) and pins packages of {}",
                many.iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    };
    if let Some(other) = subdirs.iter().find(|s| **s != platform) {
        return Err(format!(
            "it is for `{platform}` but pins a package of `{other}`"
        ));
    }
    notes.push(
        "an @EXPLICIT file records no dependencies: every package is a dependency of the recipe, pinned to its version, and its channels are the ones its URLs name"
            .to_string(),
    );
    if md5_only > 0 {
        notes.push(format!(
            "{md5_only} of {} packages carry only an md5 (`conda list --explicit --md5`): the lock pins them by URL and md5, which the build checks each archive against; md5 is not collision-resistant, so prefer `--sha256` where the conda that wrote it has it",
            records.len()
        ));
    }
    let mut pins = Pins {
        channels,
        has_dependencies: false,
        ..Pins::default()
    };
    match linux_platform(platform.as_str()) {
        Some(subdir) => pins.platforms.push(PinnedPlatform {
            subdir,
            records,
            wheels: Vec::new(),
        }),
        None => pins.dropped_platforms.push(platform.to_string()),
    }
    Ok(pins)
}

/// The record a package URL names: name, version and build from its file name, subdir
/// and channel from the directories above it, the digest from its fragment.
fn record_of(url: &url::Url) -> Result<RepoDataRecord, String> {
    let mut bare = url.clone();
    bare.set_fragment(None);
    let shown = bare.as_str().to_string();
    let digest = digest_of(url.fragment(), &shown)?;
    let identifier = DistArchiveIdentifier::try_from_url(&bare).ok_or_else(|| {
        format!(
            "`{shown}` does not name a conda package (`name-version-build.conda` or `.tar.bz2`)"
        )
    })?;
    let segments: Vec<&str> = bare
        .path_segments()
        .map(|s| s.collect())
        .unwrap_or_default();
    let [.., subdir, _file] = segments.as_slice() else {
        return Err(format!("`{shown}` has no subdir directory above its file"));
    };
    let mut channel = bare.clone();
    channel.set_path(&segments[..segments.len() - 2].join("/"));
    let name = PackageName::from_str(&identifier.identifier.name)
        .map_err(|e| format!("`{shown}`: {e}"))?;
    let version = identifier
        .identifier
        .version
        .parse::<rattler_conda_types::VersionWithSource>()
        .map_err(|e| format!("`{shown}`: {e}"))?;
    let mut record = PackageRecord::new(
        name,
        version,
        BuildString::new_unchecked(&identifier.identifier.build_string),
    );
    record.subdir = subdir.to_string();
    match digest {
        Digest::Md5(md5) => record.md5 = Some(md5),
        Digest::Sha256(sha) => record.sha256 = Some(sha),
    }
    Ok(RepoDataRecord {
        package_record: record,
        identifier,
        url: bare,
        channel: Some(channel.to_string().trim_end_matches('/').to_string()),
    })
}

/// The digest an `@EXPLICIT` line carries.
enum Digest {
    Md5(rattler_digest::Md5Hash),
    Sha256(rattler_digest::Sha256Hash),
}

/// The URL fragment as conda writes it: `sha256:HEX` (`--sha256`) or 32 hex digits of an
/// md5 (`--md5`); anything else is refused, as a lock pins every package by a digest.
fn digest_of(fragment: Option<&str>, shown: &str) -> Result<Digest, String> {
    let fragment = fragment.ok_or_else(|| {
        format!(
            "`{shown}` has no digest (`#MD5` or `#sha256:HEX`); a lock pins every package by one"
        )
    })?;
    let not_hex =
        || format!("the digest of `{shown}` is not a hex md5 or `sha256:` and 64 hex digits");
    let sha = fragment
        .strip_prefix("sha256:")
        .or((fragment.len() == 64).then_some(fragment));
    match sha {
        Some(hex) => rattler_digest::parse_digest_from_hex::<rattler_digest::Sha256>(hex)
            .map(Digest::Sha256)
            .ok_or_else(not_hex),
        None => rattler_digest::parse_digest_from_hex::<rattler_digest::Md5>(fragment)
            .map(Digest::Md5)
            .ok_or_else(not_hex),
    }
}
