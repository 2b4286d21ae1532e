//! Reading and writing the lock file: a rattler/pixi lock (format v7) with imgbuild's pin of
//! the base image in a leading `# imgbuild-base:` comment, and the conversions between
//! rattler_lock's types and the lock's model.

use std::path::{Path, PathBuf};

use rattler_conda_types::{GenericVirtualPackage, Subdir};
use rattler_lock::{
    CondaPackageData, DEFAULT_ENVIRONMENT_NAME, Environment, FindLinksUrlOrPath, LockFile,
    PackageHashes, ParseCondaLockError, PlatformData, PlatformName, PypiDistributionData,
    PypiIndexes, SolveOptions, UrlOrPath, Verbatim,
};

use super::{Lock, LockedBase, PlatformLock, ResolvedWheel};
use crate::{
    recipe::lexical_path,
    recipe::pypi::{FindLinks, Sources},
    resolve::Target,
};

const BASE_MARKER: &str = "# imgbuild-base: ";

/// The largest lock file read.
pub const MAX_LOCK_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("Failed to read lock file `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Lock file `{}` is not a valid lock file", path.display())]
    Parse {
        path: PathBuf,
        // Boxed: the parser's error is large and errors travel up every stage.
        #[source]
        source: Box<ParseCondaLockError>,
    },
    #[error("Lock file `{}` is not an imgbuild lock: {reason}", path.display())]
    Shape { path: PathBuf, reason: String },
    /// A package the lock pins from somewhere the recipe does not name: the lock was edited,
    /// or written for other sources. Never used, and never silently re-solved either.
    #[error(
        "Lock file `{}` pins {package} at `{url}`, which is not under {expected}; a lock may only pin packages from the recipe's own sources: check how it got there, then re-create it with `imgbuild lock`",
        path.display()
    )]
    ForeignSource {
        path: PathBuf,
        package: String,
        url: String,
        expected: String,
    },
    #[error("Failed to build the lock file")]
    Build(#[source] Box<ParseCondaLockError>),
    #[error("Failed to write lock file `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Lock {
    /// Reads the lock at `path`; `Ok(None)` when there is none.
    pub fn read(path: &Path) -> Result<Option<Lock>, LockError> {
        // Locks arrive in pull requests: read with a bound (a lock of a 200-package PyTorch
        // environment is about 200 KB).
        let text = match crate::fs::read_input_text(path, MAX_LOCK_BYTES) {
            Ok(text) => text,
            Err(crate::fs::InputError::Io(err)) if err.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(err) => {
                return Err(LockError::Read {
                    path: path.to_path_buf(),
                    source: std::io::Error::other(err),
                });
            }
        };
        Self::parse(&text, path).map(Some)
    }

    /// Reads lock text as if from `path` (local wheels and find-links directories resolve
    /// against its directory). What rattler_lock reads but imgbuild cannot use is a
    /// [`LockError::Shape`], with the reason.
    pub fn parse(text: &str, path: &Path) -> Result<Lock, LockError> {
        let shape = |reason: String| LockError::Shape {
            path: path.to_path_buf(),
            reason,
        };
        let bases = bases_of(text).map_err(shape)?;
        crate::python::requirement::check_lock(text)
            .map_err(|reason| shape(format!("a PyPI requirement {reason}")))?;
        let lock_dir = path.parent().unwrap_or(Path::new("."));
        let lock =
            LockFile::from_str_with_base_directory(text, path.parent()).map_err(|source| {
                LockError::Parse {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                }
            })?;
        let environment = lock
            .default_environment()
            .ok_or_else(|| shape("it has no `default` environment".to_string()))?;
        let platforms = platforms_of(environment, &bases, lock_dir).map_err(shape)?;
        Ok(Lock {
            channels: environment
                .channels()
                .iter()
                .map(|c| c.url.clone())
                .collect(),
            channel_priority: environment.solve_options().channel_priority,
            platforms,
            pypi: environment
                .pypi_indexes()
                .map(|indexes| sources_of(indexes, lock_dir)),
        })
    }

    /// The `# imgbuild-base:` value: one base for all platforms (the only form a
    /// one-platform lock has), else `PLATFORM=BASE` pairs.
    pub fn bases_header(&self) -> String {
        let first = &self.platforms[0].base;
        if self.platforms.iter().all(|p| &p.base == first) {
            return first.to_string();
        }
        self.platforms
            .iter()
            .map(|p| format!("{}={}", p.target.platform, p.base))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Renders the lock file text; local wheels and find-links directories are written
    /// relative to `lock_dir`, so the lock works wherever the project is.
    pub fn render(&self, recipe_file: &str, lock_dir: &Path) -> Result<String, LockError> {
        let body = self
            .lock_file(lock_dir)?
            .render_to_string()
            .map_err(|source| LockError::Write {
                path: recipe_file.into(),
                source,
            })?;
        Ok(format!(
            "# Generated by imgbuild from `{recipe_file}`; do not edit. Re-create it with `imgbuild lock`.\n\
             # This is a rattler/pixi lock file; the next line is imgbuild's own pin of the base image.\n\
             {BASE_MARKER}{}\n{body}",
            self.bases_header()
        ))
    }

    /// Writes the lock atomically: a reader sees the old or the new file, never half of one.
    pub fn write(&self, path: &Path, recipe_file: &str) -> Result<(), LockError> {
        let text = self.render(recipe_file, path.parent().unwrap_or(Path::new(".")))?;
        crate::fs::write_atomic(path, text.as_bytes()).map_err(|source| LockError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    /// This lock as rattler_lock's [`LockFile`], everything in its `default` environment.
    fn lock_file(&self, lock_dir: &Path) -> Result<LockFile, LockError> {
        let build = |e: ParseCondaLockError| LockError::Build(Box::new(e));
        let mut builder = LockFile::builder()
            .with_platforms(
                self.platforms
                    .iter()
                    .map(|p| PlatformData {
                        name: PlatformName::from(&p.target.platform),
                        subdir: p.target.platform,
                        virtual_packages: p.target.virtual_package_strings(),
                    })
                    .collect(),
            )
            .map_err(build)?
            .with_channels(DEFAULT_ENVIRONMENT_NAME, self.channels.iter().cloned())
            .with_options(
                DEFAULT_ENVIRONMENT_NAME,
                SolveOptions {
                    channel_priority: self.channel_priority,
                    ..SolveOptions::default()
                },
            );
        if let Some(sources) = &self.pypi {
            builder.set_pypi_indexes(DEFAULT_ENVIRONMENT_NAME, pypi_indexes(sources, lock_dir));
        }
        for platform in &self.platforms {
            let name = PlatformName::from(&platform.target.platform);
            for record in &platform.records {
                builder
                    .add_conda_package(
                        DEFAULT_ENVIRONMENT_NAME,
                        name.as_str(),
                        CondaPackageData::from(record.clone()),
                    )
                    .map_err(build)?;
            }
            for wheel in &platform.wheels {
                builder
                    .add_pypi_package(
                        DEFAULT_ENVIRONMENT_NAME,
                        name.as_str(),
                        wheel_data(wheel, lock_dir),
                    )
                    .map_err(build)?;
            }
        }
        Ok(builder.finish())
    }
}

/// The `# imgbuild-base:` header among the lock's leading comments, read.
fn bases_of(text: &str) -> Result<Bases, String> {
    let base = text
        .lines()
        .take_while(|line| line.starts_with('#'))
        .find_map(|line| line.strip_prefix(BASE_MARKER))
        .ok_or("the `# imgbuild-base:` header is missing")?;
    parse_bases(base.trim()).ok_or_else(|| {
        "the `# imgbuild-base:` header is not `scratch`, a digest, or `PLATFORM=scratch|digest` pairs".to_string()
    })
}

/// Every platform of `environment`, sorted by name, each with its base from `bases`.
fn platforms_of(
    environment: Environment<'_>,
    bases: &Bases,
    lock_dir: &Path,
) -> Result<Vec<PlatformLock>, String> {
    let mut platforms: Vec<PlatformLock> = Vec::new();
    for platform in environment.platforms() {
        let subdir = platform.subdir();
        if platforms.iter().any(|p| p.target.platform == subdir) {
            return Err(format!("it locks `{subdir}` twice"));
        }
        platforms.push(platform_of(environment, platform, bases, lock_dir)?);
    }
    if platforms.is_empty() {
        return Err("it locks no platform".to_string());
    }
    // rattler_lock gives an environment's platforms in no fixed order: sort them, so
    // whatever follows the lock's order (messages, the lock written back) is the same
    // every time.
    platforms.sort_by(|a, b| a.target.platform.as_str().cmp(b.target.platform.as_str()));
    Ok(platforms)
}

/// One platform of `environment`: its target, base, conda packages and wheels.
fn platform_of<'lock>(
    environment: Environment<'lock>,
    platform: rattler_lock::Platform<'lock>,
    bases: &Bases,
    lock_dir: &Path,
) -> Result<PlatformLock, String> {
    let subdir = platform.subdir();
    let virtual_packages = platform
        .virtual_packages()
        .iter()
        .map(|v| {
            serde_json::from_value::<GenericVirtualPackage>(serde_json::Value::String(v.clone()))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "a virtual package entry cannot be parsed".to_string())?;
    let base = bases.of(subdir)?;
    let mut records = environment
        .conda_repodata_records(platform)
        .map_err(|_| "a package entry cannot be read as a conda package".to_string())?
        .unwrap_or_default();
    // A record without a sha256 (some old repodata has none) is read as the solve
    // wrote it: pinned by its URL (and md5 when the channel gives one), downloaded
    // and checked the way the README says such records are.
    records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
    let mut wheels = Vec::new();
    for package in environment.pypi_packages(platform).into_iter().flatten() {
        wheels.push(locked_wheel(package, lock_dir)?);
    }
    wheels.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(PlatformLock {
        target: Target {
            platform: subdir,
            virtual_packages,
        },
        base,
        records,
        wheels,
    })
}

/// The lock's PyPI sources as the recipe has them.
fn sources_of(indexes: &PypiIndexes, lock_dir: &Path) -> Sources {
    Sources {
        indexes: indexes.indexes.clone(),
        find_links: indexes
            .find_links
            .iter()
            .map(|f| match f {
                FindLinksUrlOrPath::Path(path) => {
                    // Resolved by name, as the recipe resolves its own: a directory
                    // beside the project is `../../wheels` from the lock.
                    let path = lock_dir.join(path);
                    FindLinks::Directory(lexical_path(&std::path::absolute(&path).unwrap_or(path)))
                }
                FindLinksUrlOrPath::Url(url) => FindLinks::Page(url.clone()),
            })
            .collect(),
    }
}

/// The recipe's PyPI sources as the lock file has them: find-links directories relative to
/// `lock_dir`.
fn pypi_indexes(sources: &Sources, lock_dir: &Path) -> PypiIndexes {
    PypiIndexes {
        indexes: sources.indexes.clone(),
        find_links: sources
            .find_links
            .iter()
            .map(|f| match f {
                FindLinks::Directory(path) => FindLinksUrlOrPath::Path(relative_to(path, lock_dir)),
                FindLinks::Page(url) => FindLinksUrlOrPath::Url(url.clone()),
            })
            .collect(),
    }
}

/// `path` relative to `base` when both are absolute (`../wheels`), else as it is.
fn relative_to(path: &Path, base: &Path) -> PathBuf {
    let (Ok(path), Ok(base)) = (std::path::absolute(path), std::path::absolute(base)) else {
        return path.to_path_buf();
    };
    let common = path
        .components()
        .zip(base.components())
        .take_while(|(a, b)| a == b)
        .count();
    if common == 0 {
        return path;
    }
    let mut relative = PathBuf::new();
    for _ in base.components().skip(common) {
        relative.push("..");
    }
    relative.extend(path.components().skip(common));
    if relative.as_os_str().is_empty() {
        relative.push(".");
    }
    relative
}

/// A locked wheel as rattler_lock stores it: by URL, or for a local file by its path
/// relative to the lock.
fn wheel_data(wheel: &ResolvedWheel, lock_dir: &Path) -> rattler_lock::PypiPackageData {
    let location = match wheel.url.to_file_path() {
        Ok(path) if wheel.url.scheme() == "file" => {
            let relative = relative_to(&path, lock_dir);
            match relative.to_str() {
                Some(text) => UrlOrPath::Path(text.replace('\\', "/").into()),
                None => UrlOrPath::Url(wheel.url.clone()),
            }
        }
        _ => UrlOrPath::Url(wheel.url.clone()),
    };
    PypiDistributionData {
        name: wheel.name.clone(),
        version: wheel.version.clone(),
        location: Verbatim::new(location),
        index_url: wheel.index.clone(),
        hash: Some(PackageHashes::Sha256(wheel.sha256)),
        requires_dist: wheel.requires_dist.clone(),
        requires_python: wheel.requires_python.clone(),
    }
    .into()
}

impl ResolvedWheel {
    /// A PyPI entry of any rattler/pixi lock as imgbuild uses it (see [`locked_wheel`]);
    /// the reason when it is not a wheel pinned by sha256. `init --from pixi.lock` reads
    /// pixi's entries with it, so they are held to what imgbuild's own lock reads.
    pub fn from_locked(
        package: &rattler_lock::PypiPackageData,
        lock_dir: &Path,
    ) -> Result<Self, String> {
        locked_wheel(package, lock_dir)
    }
}

/// A lock's PyPI entry as imgbuild uses it: a wheel by URL (a path is relative to
/// `lock_dir`), pinned by sha256.
fn locked_wheel(
    package: &rattler_lock::PypiPackageData,
    lock_dir: &Path,
) -> Result<ResolvedWheel, String> {
    let name = package.name();
    let wheel = package
        .as_wheel()
        .ok_or_else(|| format!("PyPI package `{name}` is a source tree, not a wheel"))?;
    let url = match &*wheel.location {
        UrlOrPath::Url(url) => url.clone(),
        UrlOrPath::Path(path) => {
            let path = lock_dir.join(path.as_str());
            let path = std::path::absolute(&path).unwrap_or(path);
            url::Url::from_file_path(&path).map_err(|()| {
                format!(
                    "PyPI package `{name}` has a path that is not a file: `{}`",
                    path.display()
                )
            })?
        }
    };
    let sha256 = match &wheel.hash {
        Some(PackageHashes::Sha256(sha) | PackageHashes::Md5Sha256(_, sha)) => *sha,
        _ => return Err(format!("PyPI package `{name}` has no sha256")),
    };
    let filename = url
        .path_segments()
        .and_then(|mut s| s.next_back())
        .filter(|f| f.ends_with(".whl"))
        .ok_or_else(|| format!("PyPI package `{name}` is not a wheel URL: `{url}`"))?
        .to_string();
    Ok(ResolvedWheel {
        name: name.clone(),
        version: wheel.version.clone(),
        filename,
        url,
        sha256,
        index: wheel.index_url.clone(),
        requires_dist: wheel.requires_dist.clone(),
        requires_python: wheel.requires_python.clone(),
    })
}

/// The `# imgbuild-base:` header, read.
enum Bases {
    All(LockedBase),
    PerPlatform(Vec<(String, LockedBase)>),
}

impl Bases {
    /// The base the header pins for `subdir`.
    fn of(&self, subdir: Subdir) -> Result<LockedBase, String> {
        match self {
            Bases::All(base) => Ok(base.clone()),
            Bases::PerPlatform(bases) => bases
                .iter()
                .find(|(name, _)| name == subdir.as_str())
                .map(|(_, base)| base.clone())
                .ok_or_else(|| {
                    format!("the `# imgbuild-base:` header pins no base for `{subdir}`")
                }),
        }
    }
}

fn parse_base(text: &str) -> Option<LockedBase> {
    match text {
        "scratch" => Some(LockedBase::Scratch),
        digest if digest.starts_with("sha256:") => Some(LockedBase::Digest(digest.to_string())),
        _ => None,
    }
}

fn parse_bases(text: &str) -> Option<Bases> {
    if !text.contains('=') {
        return parse_base(text).map(Bases::All);
    }
    text.split_whitespace()
        .map(|pair| {
            let (platform, base) = pair.split_once('=')?;
            Some((platform.to_string(), parse_base(base)?))
        })
        .collect::<Option<Vec<_>>>()
        .map(Bases::PerPlatform)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_headers_parse_in_both_forms_and_refuse_others() {
        assert!(matches!(
            parse_bases("scratch"),
            Some(Bases::All(LockedBase::Scratch))
        ));
        let digest = format!("sha256:{}", "a".repeat(64));
        assert!(matches!(
            parse_bases(&digest),
            Some(Bases::All(LockedBase::Digest(_)))
        ));
        let Some(Bases::PerPlatform(pairs)) =
            parse_bases(&format!("linux-64=scratch linux-aarch64={digest}"))
        else {
            panic!("pairs")
        };
        assert_eq!(pairs.len(), 2);
        assert_eq!(
            pairs[1],
            ("linux-aarch64".to_string(), LockedBase::Digest(digest))
        );
        for bad in ["latest", "linux-64=latest", "linux-64", "=scratch x"] {
            assert!(parse_bases(bad).is_none(), "{bad}");
        }
    }
}
