//! Installing: locked records → a staging root whose in-image path is the recipe's prefix.
//!
//! rattler's installer does the linking; this module tells it the *in-image* prefix, so text
//! and binary placeholders get `/opt/conda` (say) and never the staging path, then scrubs what
//! rattler writes for a host environment but must not reach an image: cache paths in
//! `conda-meta`, the cache tag, 0600 metadata files. Before rattler links anything, every
//! package is fetched into the cache and checked by imgbuild itself (`fetch.rs`, `scan.rs`,
//! `checked.rs`): rattler trusts a package far more than an image build can.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use rattler::install::{ExternalSymlinkPolicy, Installer, InstallerError, LinkOptions};
use rattler_cache::package_cache::PackageCache;
use rattler_conda_types::RepoDataRecord;
use serde_json::Value;

mod checked;
mod confine;
mod fetch;
mod forward_progress;
/// Public for the fuzz target (`fuzz/fuzz_targets/package_reader.rs`).
pub mod scan;

/// Keys of a `conda-meta/*.json` record that describe the build host, not the package.
const HOST_KEYS: &[&str] = &[
    "extracted_package_dir",
    "package_tarball_full_path",
    "link",
    "requested_spec",
    "requested_specs",
];

/// How to install.
#[derive(Debug, Clone)]
pub struct InstallOptions<'a> {
    /// Holds the package caches (`pkgs/`, see [`package_cache_dir`]).
    pub cache_dir: &'a Path,
}

/// The package cache for packages of `platform`: `pkgs/` for linux-64, `pkgs-<subdir>/`
/// for the others. rattler names an extracted package `name-version-build` only, and conda
/// channels do publish one name-version-build for several subdirs (`_openmp_mutex-4.5-2_gnu`
/// is in linux-64 and linux-aarch64), so one shared cache would hand the installer one
/// platform's files for another's package, or re-extract over files a staging tree still
/// links to (conda/rattler#2166). The noarch packages of each platform go with it.
pub(crate) fn package_cache_dir(
    cache_dir: &Path,
    platform: rattler_conda_types::Subdir,
) -> PathBuf {
    match platform {
        rattler_conda_types::Subdir::Linux64 => cache_dir.join("pkgs"),
        other => cache_dir.join(format!("pkgs-{other}")),
    }
}

/// One installed package and the prefix-relative paths it owns.
#[derive(Debug, Clone)]
pub struct StagedPackage {
    pub record: RepoDataRecord,
    /// Prefix-relative paths of the package's files, its `conda-meta` record included.
    pub files: Vec<String>,
}

impl StagedPackage {
    /// `name-version-build`, the way conda names a package file.
    pub fn dist_name(&self) -> String {
        dist_name(&self.record)
    }
}

pub use crate::names::dist_name;

/// An installed environment in a staging root.
#[derive(Debug, Clone)]
pub struct StagedPrefix {
    /// The staging directory that stands for the image's `/`.
    pub root: PathBuf,
    /// The in-image prefix, e.g. `/opt/conda`.
    pub prefix: String,
    /// Packages in the order of the lock (by name).
    pub packages: Vec<StagedPackage>,
}

impl StagedPrefix {
    /// The staging path of the prefix.
    pub fn prefix_dir(&self) -> PathBuf {
        self.root.join(self.prefix.trim_start_matches('/'))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error("Failed to create the staging directory `{}`", path.display())]
    Staging {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to install the environment")]
    Install(#[source] InstallerError),
    #[error("Failed to clean the conda metadata `{}`", path.display())]
    Metadata {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("The conda metadata `{}` is not valid JSON", path.display())]
    MetadataJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("Failed to fetch package `{package}`")]
    Fetch {
        package: String,
        #[source]
        source: rattler_cache::package_cache::PackageCacheError,
    },
    #[error("Failed to download package `{package}`")]
    Download {
        package: String,
        // Boxed: a `Url` and a reason would make every `InstallError` large.
        #[source]
        source: Box<crate::download::DownloadError>,
    },
    #[error("Package `{package}` is refused: `{entry}` {reason}")]
    Check {
        package: String,
        entry: String,
        reason: String,
    },
    #[error("Failed to extract a package into `{}`", path.display())]
    DiskFull {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("rattler wrote no conda metadata for `{0}`")]
    MissingMetadata(String),
    #[error("Failed to lock the package cache `{}`", path.display())]
    CacheLock {
        path: PathBuf,
        #[source]
        source: rattler_cache::package_cache::PackageCacheError,
    },
}

/// Installs `records` into `<root><prefix>` for the records' platform.
pub async fn install(
    records: &[RepoDataRecord],
    platform: rattler_conda_types::Subdir,
    root: &Path,
    prefix: &str,
    options: &InstallOptions<'_>,
) -> Result<StagedPrefix, InstallError> {
    install_reporting(
        records,
        platform,
        root,
        prefix,
        options,
        &crate::report::Silent,
    )
    .await
}

/// Takes rattler's whole-cache lock, which its installer holds while linking: builds in other
/// processes sharing the cache must not extract a package while this one does, or while
/// this one links from it (rattler leaves that coordination to the lock's holders).
async fn lock_cache(
    cache: &PackageCache,
    cache_dir: &Path,
    platform: rattler_conda_types::Subdir,
) -> Result<rattler_cache::package_cache::CacheGlobalLock, InstallError> {
    cache
        .acquire_global_lock()
        .await
        .map_err(|source| InstallError::CacheLock {
            path: package_cache_dir(cache_dir, platform),
            source,
        })
}

/// Fetches and checks `records` into the package cache without installing them: what
/// matrix builds do one variant after another before building them at once, so no two
/// builds of one process fetch the same package at the same time.
pub async fn fetch_only(
    records: &[RepoDataRecord],
    platform: rattler_conda_types::Subdir,
    options: &InstallOptions<'_>,
) -> Result<(), InstallError> {
    fetch_only_reporting(records, platform, options, &crate::report::Silent).await
}

/// [`fetch_only`], telling `reporter` of bytes downloaded and of the archives' bytes as they
/// are checked and extracted.
pub(crate) async fn fetch_only_reporting(
    records: &[RepoDataRecord],
    platform: rattler_conda_types::Subdir,
    options: &InstallOptions<'_>,
    reporter: &dyn crate::report::Reporter,
) -> Result<(), InstallError> {
    confine::check_record_fields(&records.iter().collect::<Vec<_>>())?;
    let client = crate::http::client()?;
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let cache = PackageCache::new(package_cache_dir(options.cache_dir, platform));
    let cache_lock = lock_cache(&cache, options.cache_dir, platform).await?;
    forward_progress::forward_until_done(
        fetch::fetch_and_check(
            records,
            (&cache, &package_cache_dir(options.cache_dir, platform)),
            options.cache_dir,
            &client,
            events_tx,
        ),
        &mut events_rx,
        reporter,
    )
    .await?;
    drop(cache_lock);
    Ok(())
}

/// [`install`], telling `reporter` of bytes downloaded and packages linked.
pub async fn install_reporting(
    records: &[RepoDataRecord],
    platform: rattler_conda_types::Subdir,
    root: &Path,
    prefix: &str,
    options: &InstallOptions<'_>,
    reporter: &dyn crate::report::Reporter,
) -> Result<StagedPrefix, InstallError> {
    let staged = StagedPrefix {
        root: root.to_path_buf(),
        prefix: prefix.to_string(),
        packages: Vec::new(),
    };
    let prefix_dir = staged.prefix_dir();
    fs_err::create_dir_all(&prefix_dir).map_err(|source| InstallError::Staging {
        path: prefix_dir.clone(),
        source,
    })?;
    if records.is_empty() {
        return Ok(staged);
    }

    // Record fields that become paths are judged before anything is fetched.
    confine::check_record_fields(&records.iter().collect::<Vec<_>>())?;
    let client = crate::http::client()?;
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let cache = PackageCache::new(package_cache_dir(options.cache_dir, platform));
    // The installer takes the same lock for linking; it must not be held here then.
    let cache_lock = lock_cache(&cache, options.cache_dir, platform).await?;
    let dirs = forward_progress::forward_until_done(
        fetch::fetch_and_check(
            records,
            (&cache, &package_cache_dir(options.cache_dir, platform)),
            options.cache_dir,
            &client,
            events_tx.clone(),
        ),
        &mut events_rx,
        reporter,
    )
    .await?;
    // The whole prefix is planned from the extracted copies before rattler writes anything
    // (see `confine.rs`); the lock is still held, so the copies are the ones it will link.
    let planned: Vec<confine::Planned<'_>> = records
        .iter()
        .zip(&dirs)
        .map(|(record, dir)| confine::Planned { record, dir })
        .collect();
    confine::check_plan(&planned, platform)?;
    drop(cache_lock);
    let installing = Installer::new()
        .with_download_client(client)
        .with_target_platform(platform)
        .with_package_cache(cache)
        // Placeholders get the path the files will have inside the image.
        .with_alternative_target_prefix(prefix)
        // Hard links into the cache where the file system allows (rattler copies a file it
        // cannot link, and always copies a file whose placeholder it replaces): staging a
        // 2.7 GB environment then costs no copy. Nothing writes into staged files in place
        // (records are replaced by rename), so the cache is never changed through a link,
        // and the tar writer does not look at inodes, so linked and copied trees give the
        // same layers.
        .with_link_options(LinkOptions {
            allow_symbolic_links: Some(true),
            allow_hard_links: Some(true),
            allow_ref_links: Some(false),
        })
        // Link scripts are target code; never run them on the build host.
        .with_execute_link_scripts(false)
        .with_external_symlink_policy(ExternalSymlinkPolicy::Deny)
        .with_installed_packages(Vec::new())
        .with_reporter(forward_progress::Forward::new(events_tx))
        .install(&prefix_dir, records.iter().cloned());
    forward_progress::forward_until_done(installing, &mut events_rx, reporter)
        .await
        .map_err(InstallError::Install)?;

    let packages = scrub(&prefix_dir, records)?;
    confine::check_staged(&prefix_dir)?;
    Ok(StagedPrefix { packages, ..staged })
}

/// Removes `__clobbers__`, where rattler moves the copies that lose when several packages
/// ship the same path. The plan lets packages share a path only when it is the same file
/// (`confine.rs`), so each copy there is the same bytes as the one kept, and which package
/// lost depends on the order rattler's parallel links finished: none of it may reach the image.
fn remove_clobbers(prefix_dir: &Path) -> Result<(), InstallError> {
    let root = prefix_dir.join(CLOBBERS);
    match fs_err::symlink_metadata(&root) {
        Ok(meta) if meta.is_dir() => fs_err::remove_dir_all(&root)
            .map_err(|source| InstallError::Metadata { path: root, source }),
        _ => Ok(()),
    }
}

const CLOBBERS: &str = "__clobbers__";

/// A path rattler recorded as `__clobbers__/<package>/<path>` is the package's `<path>`, as
/// the package ships it (and the kept copy holds the same bytes).
fn unclobbered(path: &str) -> &str {
    path.strip_prefix("__clobbers__/")
        .and_then(|rest| rest.split_once('/'))
        .map_or(path, |(_, path)| path)
}

/// Removes host details from the prefix and collects the files of each package.
fn scrub(
    prefix_dir: &Path,
    records: &[RepoDataRecord],
) -> Result<Vec<StagedPackage>, InstallError> {
    remove_clobbers(prefix_dir)?;
    let tag = prefix_dir.join("CACHEDIR.TAG");
    if tag.exists() {
        fs_err::remove_file(&tag).map_err(|source| InstallError::Metadata {
            path: tag.clone(),
            source,
        })?;
    }

    let meta_dir = prefix_dir.join("conda-meta");
    let mut packages = Vec::with_capacity(records.len());
    for record in records {
        let file_name = format!("{}.json", dist_name(record));
        let path = meta_dir.join(&file_name);
        let text = fs_err::read_to_string(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                return InstallError::MissingMetadata(dist_name(record));
            }
            InstallError::Metadata {
                path: path.clone(),
                source,
            }
        })?;
        let mut json: Value =
            serde_json::from_str(&text).map_err(|source| InstallError::MetadataJson {
                path: path.clone(),
                source,
            })?;
        let mut files = Vec::new();
        if let Value::Object(map) = &mut json {
            for key in HOST_KEYS {
                map.remove(*key);
            }
            for key in ["url", "channel"] {
                if let Some(Value::String(url)) = map.get_mut(key) {
                    *url = without_host_path(url);
                }
            }
            // rattler links files in parallel, and when packages clobber one another the
            // renamed paths (`__clobbers__/…`) land in these lists in the order the links
            // finished. Sorted, the record is the same on every run.
            if let Some(Value::Array(list)) = map.get_mut("files") {
                for path in list.iter_mut() {
                    if let Some(p) = path.as_str() {
                        *path = Value::String(unclobbered(p).to_string());
                    }
                }
                list.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            }
            if let Some(Value::Array(list)) =
                map.get_mut("paths_data").and_then(|p| p.get_mut("paths"))
            {
                for entry in list.iter_mut() {
                    if let Some(p) = entry["_path"].as_str() {
                        entry["_path"] = Value::String(unclobbered(p).to_string());
                    }
                }
                list.sort_by(|a, b| a["_path"].as_str().cmp(&b["_path"].as_str()));
            }
            if let Some(Value::Array(list)) = map.get("files") {
                files.extend(list.iter().filter_map(Value::as_str).map(str::to_string));
            }
        }
        files.push(format!("conda-meta/{file_name}"));
        let mut bytes =
            serde_json::to_vec_pretty(&json).map_err(|source| InstallError::MetadataJson {
                path: path.clone(),
                source,
            })?;
        bytes.push(b'\n');
        crate::fs::write_atomic(&path, &bytes).map_err(|source| InstallError::Metadata {
            path: path.clone(),
            source,
        })?;
        packages.push(StagedPackage {
            record: record.clone(),
            files,
        });
    }
    Ok(packages)
}

/// A package from a local channel is recorded as `file:///channel/<subdir>/<file>` (and its
/// channel as `file:///channel/`), so the builder's directory layout never reaches an image
/// and the same package gives the same layer from any local channel. Remote URLs are kept.
fn without_host_path(url: &str) -> String {
    let Some(path) = url.strip_prefix("file://") else {
        return url.to_string();
    };
    let parts: Vec<&str> = path.trim_end_matches('/').rsplit('/').take(2).collect();
    let looks_like_package = path.ends_with(".conda") || path.ends_with(".tar.bz2");
    match (looks_like_package, parts.as_slice()) {
        (true, [file, subdir]) => format!("file:///channel/{subdir}/{file}"),
        _ => "file:///channel/".to_string(),
    }
}

/// Prefix-relative paths claimed by each package: a path listed by two packages belongs to
/// the one installed later, as on disk.
pub fn ownership(packages: &[StagedPackage]) -> BTreeMap<&str, usize> {
    let mut owners = BTreeMap::new();
    for (index, package) in packages.iter().enumerate() {
        for file in &package.files {
            owners.insert(file.as_str(), index);
        }
    }
    owners
}

#[cfg(test)]
mod tests {
    use super::without_host_path;

    #[test]
    fn local_urls_lose_the_host_directory() {
        assert_eq!(
            without_host_path("file:///home/alice/ch/linux-64/zlib-1.2.11-h0_0.conda"),
            "file:///channel/linux-64/zlib-1.2.11-h0_0.conda"
        );
        assert_eq!(
            without_host_path("file:///home/alice/ch/"),
            "file:///channel/"
        );
        assert_eq!(
            without_host_path("https://conda.anaconda.org/conda-forge/noarch/x-1-0.conda"),
            "https://conda.anaconda.org/conda-forge/noarch/x-1-0.conda"
        );
    }
}
