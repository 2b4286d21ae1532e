//! Software bills of materials from a lock: SPDX 2.3 JSON and CycloneDX 1.5 JSON.
//!
//! The lock already pins everything an SBOM needs (each package's URL, sha256, md5, licence
//! and dependencies, and the base image by digest), so an SBOM is a pure function of the
//! lock and the image it describes. Like the image, it is reproducible: the document's
//! namespace and serial number are derived from its content and its `created` time is the
//! image's, never a random value or the clock.

mod cyclonedx;
mod models;
mod spdx;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use rattler_conda_types::{MatchSpec, ParseStrictness, RepoDataRecord};
use sha2::{Digest, Sha256};

use crate::{
    lock::{Lock, LockError, LockedBase, ModelPin, ResolvedWheel},
    recipe::{OciPlatform, Recipe, RecipeError, RecipeOptions},
    reference::Base,
};

/// What the SBOM describes besides the lock's packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SbomSubject {
    /// The image's name (the recipe's `[image] name`).
    pub name: String,
    /// The image's manifest digest (`sha256:…`), when the SBOM is written for a built image.
    pub image_digest: Option<String>,
    /// The base as the recipe wrote it (`oci:../base:latest`); the lock pins its digest.
    pub base_reference: Option<String>,
    /// The image's `created` time, seconds since the epoch.
    pub created: i64,
    /// The files of the `[[models]]` beside the image, as the lock pins them.
    pub models: Vec<ModelPin>,
}

/// The SBOM formats imgbuild writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SbomFormat {
    /// SPDX 2.3 JSON
    Spdx,
    /// CycloneDX 1.5 JSON
    Cyclonedx,
}

impl SbomFormat {
    /// The file name suffix of this format beside an image layout.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            SbomFormat::Spdx => ".spdx.json",
            SbomFormat::Cyclonedx => ".cdx.json",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SbomError {
    #[error("Failed to write SBOM `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("Lock file `{}` does not exist; run `imgbuild lock {}` first", lock.display(), recipe.display())]
    NoLock { lock: PathBuf, recipe: PathBuf },
}

impl SbomError {
    /// 1 when the input is at fault, 2 when the machine is (as for builds).
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            SbomError::Write { .. } => 2,
            _ => 1,
        }
    }
}

/// Reads what an SBOM is made from: a recipe (its lock beside it) or a lock file. `created`
/// is `SOURCE_DATE_EPOCH` when given, else the newest package build time, the same rule
/// the image's `created` follows, so `imgbuild sbom` and `imgbuild build` agree.
pub(crate) fn load_input(
    path: &Path,
    options: &RecipeOptions,
    source_date_epoch: Option<i64>,
) -> Result<(Lock, SbomSubject), SbomError> {
    let is_lock = path.extension().is_some_and(|e| e == "lock");
    let (lock_path, name, base_reference) = if is_lock {
        let name = path
            .file_stem()
            .map_or_else(|| "image".to_string(), |s| s.to_string_lossy().into_owned());
        (path.to_path_buf(), name, None)
    } else {
        let recipe = Recipe::load(path, options)?;
        let base_reference = (recipe.base != Base::Scratch).then(|| recipe.base_reference.clone());
        (recipe.lock_path(), recipe.name, base_reference)
    };
    let lock = Lock::read(&lock_path)?.ok_or_else(|| SbomError::NoLock {
        lock: lock_path.clone(),
        recipe: path.to_path_buf(),
    })?;
    let created = source_date_epoch
        .unwrap_or_else(|| lock.newest_timestamp())
        .max(0);
    let subject = SbomSubject {
        name,
        image_digest: None,
        base_reference,
        created,
        models: crate::lock::read_models(&lock_path)?,
    };
    Ok((lock, subject))
}

/// The SBOM as pretty JSON text, ending in a newline.
pub(crate) fn render(lock: &Lock, subject: &SbomSubject, format: SbomFormat) -> String {
    let document = match format {
        SbomFormat::Spdx => spdx::document(lock, subject),
        SbomFormat::Cyclonedx => cyclonedx::document(lock, subject),
    };
    let mut text = serde_json::to_string_pretty(&document).expect("JSON values serialize");
    text.push('\n');
    text
}

/// Where the SBOMs of the layout at `layout_dir` go: beside it, never inside (an OCI tool
/// would take an unknown file in a layout for corruption). `images/demo` gets
/// `images/demo.spdx.json` and `images/demo.cdx.json`.
pub(crate) fn path_beside(layout_dir: &Path, format: SbomFormat) -> PathBuf {
    let mut name = layout_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "image".into());
    name.push(format.suffix());
    layout_dir.with_file_name(name)
}

/// Writes both SBOMs beside the layout, atomically; returns their paths.
pub(crate) fn write_beside(
    layout_dir: &Path,
    lock: &Lock,
    subject: &SbomSubject,
) -> Result<Vec<PathBuf>, SbomError> {
    [SbomFormat::Spdx, SbomFormat::Cyclonedx]
        .into_iter()
        .map(|format| {
            let path = path_beside(layout_dir, format);
            crate::fs::write_atomic(&path, render(lock, subject, format).as_bytes()).map_err(
                |source| SbomError::Write {
                    path: path.clone(),
                    source,
                },
            )?;
            Ok(path)
        })
        .collect()
}

/// One conda package as both formats see it.
struct SbomPackage<'a> {
    record: &'a RepoDataRecord,
    name: String,
    sha256: String,
    md5: Option<String>,
    purl: String,
    licence: Licence,
    /// Names of the locked packages this one depends on.
    depends: Vec<String>,
}

/// A package's licence: an SPDX expression when its text is one, else the text as given.
enum Licence {
    Expression(String),
    /// Free text such as `NVIDIA End User License Agreement`, referred to by a
    /// `LicenseRef-` id in SPDX.
    Text {
        reference: String,
        text: String,
    },
    None,
}

impl Licence {
    fn of(text: Option<&str>) -> Licence {
        let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
            return Licence::None;
        };
        // Strict: only identifiers on the SPDX licence list, so every expression we emit is
        // one an SPDX consumer can resolve. Anything else is kept verbatim.
        if ::spdx::Expression::parse(text).is_ok() {
            return Licence::Expression(text.to_string());
        }
        Licence::Text {
            reference: format!("LicenseRef-{}", spdx_id_part(text)),
            text: text.to_string(),
        }
    }
}

fn packages(lock: &Lock) -> Vec<SbomPackage<'_>> {
    let records = lock.distinct_records();
    let locked: BTreeSet<&str> = records
        .iter()
        .map(|r| r.package_record.name.as_normalized())
        .collect();
    records
        .into_iter()
        .map(|record| {
            let package = &record.package_record;
            let mut depends: Vec<String> = package
                .depends
                .iter()
                .filter_map(|d| MatchSpec::from_str(d, ParseStrictness::Lenient).ok())
                .filter_map(|spec| Some(spec.name.as_exact()?.as_normalized().to_string()))
                .filter(|name| locked.contains(name.as_str()))
                .collect();
            depends.sort();
            depends.dedup();
            SbomPackage {
                record,
                name: package.name.as_normalized().to_string(),
                sha256: package.sha256.map(hex::encode).unwrap_or_default(),
                md5: package.md5.map(hex::encode),
                purl: purl(record),
                licence: Licence::of(package.license.as_deref()),
                depends,
            }
        })
        .collect()
}

/// The PyPI wheels of every platform, each once (a pure wheel locked for two platforms is
/// one file), by name.
fn wheels(lock: &Lock) -> Vec<&ResolvedWheel> {
    let mut seen = BTreeSet::new();
    let mut wheels: Vec<&ResolvedWheel> = lock
        .platforms
        .iter()
        .flat_map(|p| p.wheels.iter())
        .filter(|w| seen.insert(w.url.as_str()))
        .collect();
    wheels.sort_by(|a, b| (&a.name, &a.filename).cmp(&(&b.name, &b.filename)));
    wheels
}

/// The package URL of a wheel (purl spec, type `pypi`): `pkg:pypi/NAME@VERSION?file_name=F`.
fn wheel_purl(wheel: &ResolvedWheel) -> String {
    format!(
        "pkg:pypi/{}@{}?file_name={}",
        percent_encode(wheel.name.as_ref()),
        percent_encode(&wheel.version.to_string()),
        percent_encode(&wheel.filename)
    )
}

/// The package URL of a conda package (purl spec, type `conda`):
/// `pkg:conda/NAME@VERSION?build=BUILD&channel=URL&subdir=SUBDIR&type=tar.bz2|conda`.
/// Qualifiers are sorted by key, as the spec's canonical form asks.
pub(crate) fn purl(record: &RepoDataRecord) -> String {
    let package = &record.package_record;
    let file_name = record.identifier.to_string();
    let archive = if file_name.ends_with(".conda") {
        "conda"
    } else {
        "tar.bz2"
    };
    let channel = channel_url(record);
    format!(
        "pkg:conda/{}@{}?build={}&channel={}&subdir={}&type={archive}",
        percent_encode(package.name.as_normalized()),
        percent_encode(&package.version.to_string()),
        percent_encode(package.build.as_str()),
        percent_encode(&channel),
        percent_encode(&package.subdir),
    )
}

/// The channel a record came from, as a URL without a trailing slash.
fn channel_url(record: &RepoDataRecord) -> String {
    match &record.channel {
        Some(channel) if !channel.is_empty() => channel.trim_end_matches('/').to_string(),
        // The package URL is `<channel>/<subdir>/<file>`.
        _ => {
            let url = record.url.as_str();
            let mut parts = url.rsplitn(3, '/');
            let (_file, _subdir) = (parts.next(), parts.next());
            parts.next().unwrap_or(url).to_string()
        }
    }
}

/// Percent-encodes everything but unreserved characters and the `:` and `/` that URLs in
/// qualifier values keep readable (the purl spec leaves both unencoded there).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:/".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Characters an SPDX id may hold (`[A-Za-z0-9.-]`); anything else becomes `-`.
fn spdx_id_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// SPDX accepts only network locations (`http`, `https`, `ftp`, VCS URLs) as a download
/// location; a package from a local channel (`file://`) has none, and its URL stays in the
/// purl's channel and the package's source information.
fn download_location(url: &url::Url) -> String {
    // SPDX's download-location pattern takes a domain name with a 2–5 letter top-level
    // domain; an address (`127.0.0.1`, a mirror on `localhost`) is not a location it
    // accepts, so it is NOASSERTION there (the URL stays in `sourceInfo`).
    let named_host = matches!(url.host(), Some(url::Host::Domain(domain))
    if domain.contains('.')
        && domain.rsplit('.').next().is_some_and(|tld| {
            (2..=5).contains(&tld.len()) && tld.chars().all(|c| c.is_ascii_alphabetic())
        }));
    match url.scheme() {
        "http" | "https" | "ftp" if named_host => url.to_string(),
        _ => "NOASSERTION".to_string(),
    }
}

fn package_spdx_id(package: &SbomPackage<'_>) -> String {
    // The hash prefix keeps ids unique when two names differ only in `_` vs `-`.
    format!(
        "SPDXRef-Package-conda-{}-{}",
        spdx_id_part(&package.name),
        &package.sha256[..package.sha256.len().min(8)]
    )
}

/// A digest of everything the document states, so the same lock and image give the same
/// identifiers and a different one never does.
fn content_digest(lock: &Lock, subject: &SbomSubject) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in [
        subject.name.as_str(),
        subject.image_digest.as_deref().unwrap_or("-"),
        subject.base_reference.as_deref().unwrap_or("-"),
        &lock.bases_header(),
        &subject.created.to_string(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    for record in lock.distinct_records() {
        hasher.update(record.url.as_str().as_bytes());
        hasher.update([0]);
        if let Some(sha256) = record.package_record.sha256 {
            hasher.update(sha256);
        }
    }
    for wheel in wheels(lock) {
        hasher.update(wheel.url.as_str().as_bytes());
        hasher.update([0]);
        hasher.update(wheel.sha256);
    }
    for pin in &subject.models {
        for part in [&pin.model, &pin.path, &pin.sha256] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
    }
    hasher.finalize().into()
}

/// A UUID made from the content digest (RFC 9562 version 8, "custom"): deterministic, and
/// distinct for distinct content.
fn content_uuid(digest: &[u8; 32]) -> String {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn timestamp(seconds: i64) -> String {
    jiff::Timestamp::from_second(seconds.max(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

fn tool() -> String {
    format!("imgbuild-{}", env!("CARGO_PKG_VERSION"))
}

/// The base image as a purl (type `oci`): named by the last path component of its
/// reference, pinned by digest, with its repository (registry bases) and tag as qualifiers.
/// `oci:../images/base:latest` → `pkg:oci/base@sha256%3A…?tag=latest`;
/// `docker.io/library/ubuntu:22.04` → `pkg:oci/ubuntu@sha256%3A…?repository_url=docker.io/library/ubuntu&tag=22.04`.
fn base_purl(reference: Option<&str>, digest: &str, arch: Option<&str>) -> String {
    // Qualifiers in the purl spec's canonical (sorted) order: arch, repository_url, tag.
    let mut qualifiers = Vec::new();
    if let Some(arch) = arch {
        qualifiers.push(("arch", arch));
    }
    let Some(reference) = reference else {
        return oci_purl("base", digest, &qualifiers);
    };
    let (local, reference) = match reference.strip_prefix("oci:") {
        Some(path) => (true, path),
        None => (false, reference),
    };
    // A registry reference pinned by digest carries no tag.
    let (reference, pinned) = match reference.split_once('@') {
        Some((name, _)) => (name, true),
        None => (reference, false),
    };
    let (path, tag) = crate::reference::split_layout(reference);
    let tag = tag.unwrap_or(crate::reference::DEFAULT_TAG);
    let name = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .unwrap_or("base")
        .to_lowercase();
    if !local {
        qualifiers.push(("repository_url", path));
    }
    if !pinned {
        qualifiers.push(("tag", tag));
    }
    oci_purl(&name, digest, &qualifiers)
}

fn oci_purl(name: &str, digest: &str, qualifiers: &[(&str, &str)]) -> String {
    let mut purl = format!(
        "pkg:oci/{}@{}",
        percent_encode(name),
        percent_encode(digest).replace(':', "%3A")
    );
    for (position, (key, value)) in qualifiers.iter().enumerate() {
        let separator = if position == 0 { '?' } else { '&' };
        let _ = write!(purl, "{separator}{key}={}", percent_encode(value));
    }
    purl
}

/// A base image the SBOM lists: the one base of every platform, or, when the platforms'
/// bases differ (a multi-platform base), each platform's own manifest.
struct BaseEntry {
    /// `Base`, or `Base-linux-aarch64` for one platform's.
    id: String,
    name: String,
    digest: String,
    purl: String,
    description: String,
}

fn base_entries(lock: &Lock, subject: &SbomSubject) -> Vec<BaseEntry> {
    let name = subject.base_reference.as_deref().unwrap_or("base");
    if let Some(base) = lock.common_base() {
        return match base {
            LockedBase::Scratch => Vec::new(),
            LockedBase::Digest(digest) => vec![BaseEntry {
                id: "Base".into(),
                name: name.into(),
                digest: digest.clone(),
                purl: base_purl(subject.base_reference.as_deref(), digest, None),
                description: "The base image, pinned by manifest digest in the lock".into(),
            }],
        };
    }
    lock.platforms
        .iter()
        .filter_map(|platform| {
            let LockedBase::Digest(digest) = &platform.base else {
                return None;
            };
            let subdir = platform.target.platform;
            let oci = OciPlatform::of(subdir)?;
            Some(BaseEntry {
                id: format!("Base-{subdir}"),
                name: format!("{name} ({oci})"),
                digest: digest.clone(),
                purl: base_purl(
                    subject.base_reference.as_deref(),
                    digest,
                    Some(oci.architecture),
                ),
                description: format!(
                    "The base image's {oci} manifest, pinned by digest in the lock"
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn licences_are_spdx_expressions_or_references() {
        assert!(
            matches!(Licence::of(Some("Apache-2.0")), Licence::Expression(e) if e == "Apache-2.0")
        );
        assert!(matches!(
            Licence::of(Some("BSD-3-Clause AND MIT")),
            Licence::Expression(_)
        ));
        match Licence::of(Some("NVIDIA End User License Agreement")) {
            Licence::Text { reference, text } => {
                assert_eq!(reference, "LicenseRef-NVIDIA-End-User-License-Agreement");
                assert_eq!(text, "NVIDIA End User License Agreement");
            }
            _ => panic!("free text is not an expression"),
        }
        assert!(matches!(Licence::of(Some("  ")), Licence::None));
        assert!(matches!(Licence::of(None), Licence::None));
    }

    #[test]
    fn purl_qualifier_values_are_encoded() {
        assert_eq!(percent_encode("1.0+cpu"), "1.0%2Bcpu");
        assert_eq!(
            percent_encode("https://conda.anaconda.org/conda-forge"),
            "https://conda.anaconda.org/conda-forge"
        );
        assert_eq!(percent_encode("a b&c=d"), "a%20b%26c%3Dd");
    }

    #[test]
    fn content_uuids_are_version_8() {
        let uuid = content_uuid(&[0xff; 32]);
        assert_eq!(uuid, "ffffffff-ffff-8fff-bfff-ffffffffffff");
        assert_ne!(content_uuid(&[1; 32]), content_uuid(&[2; 32]));
    }

    #[test]
    fn sboms_go_beside_the_layout() {
        assert_eq!(
            path_beside(Path::new("images/demo"), SbomFormat::Spdx),
            Path::new("images/demo.spdx.json")
        );
        assert_eq!(
            path_beside(Path::new("/tmp/out/"), SbomFormat::Cyclonedx),
            Path::new("/tmp/out.cdx.json")
        );
    }

    #[test]
    fn base_purls() {
        let digest = "sha256:abc";
        assert_eq!(
            base_purl(Some("oci:../images/base:v1"), digest, None),
            "pkg:oci/base@sha256%3Aabc?tag=v1"
        );
        assert_eq!(
            base_purl(Some("docker.io/library/ubuntu:22.04"), digest, None),
            "pkg:oci/ubuntu@sha256%3Aabc?repository_url=docker.io/library/ubuntu&tag=22.04"
        );
        assert_eq!(
            base_purl(Some("ghcr.io/org/cuda@sha256:abc"), digest, None),
            "pkg:oci/cuda@sha256%3Aabc?repository_url=ghcr.io/org/cuda"
        );
        assert_eq!(base_purl(None, digest, None), "pkg:oci/base@sha256%3Aabc");
        assert_eq!(
            base_purl(
                Some("docker.io/library/ubuntu:22.04"),
                digest,
                Some("arm64")
            ),
            "pkg:oci/ubuntu@sha256%3Aabc?arch=arm64&repository_url=docker.io/library/ubuntu&tag=22.04"
        );
    }
}
