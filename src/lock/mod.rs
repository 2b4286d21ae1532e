//! The lock file: `recipes/<name>.lock`, next to its recipe.
//!
//! It is a rattler/pixi lock file (format v7), so pixi and rattler tools can read it, with
//! one imgbuild addition kept in a leading comment: the digest of the base image. A lock
//! pins every package by URL and sha256, the target's virtual packages and the channels.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::{Path, PathBuf},
};

use rattler_conda_types::{
    GenericVirtualPackage, MatchSpec, Matches, PackageName, ParseStrictness, RepoDataRecord, Subdir,
};
use rattler_lock::{
    CondaPackageData, DEFAULT_ENVIRONMENT_NAME, FindLinksUrlOrPath, LockFile, PackageHashes,
    ParseCondaLockError, PlatformData, PlatformName, PypiDistributionData, PypiIndexes,
    SolveOptions, UrlOrPath, Verbatim,
};
use rattler_solve::ChannelPriority;

use crate::{
    cuda::{SolvedCuda, solved_cuda, solved_cuda_from_wheels},
    recipe::pypi::{FindLinks, Sources},
    recipe::{Recipe, lexical_path},
    resolve::Target,
};

const BASE_MARKER: &str = "# imgbuild-base: ";

/// The base image as pinned in a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockedBase {
    Scratch,
    /// The manifest digest of the base image, `sha256:<hex>`.
    Digest(String),
}

impl fmt::Display for LockedBase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockedBase::Scratch => f.write_str("scratch"),
            LockedBase::Digest(digest) => f.write_str(digest),
        }
    }
}

/// What a lock file holds, in the shape the build uses.
#[derive(Debug, Clone)]
pub struct Lock {
    /// Channel base URLs in priority order.
    pub channels: Vec<String>,
    /// How the channels' order was used in the solve: the lock file's `options:
    /// channel-priority` (rattler's own field; absent, as in locks older than the key, is
    /// strict).
    pub channel_priority: ChannelPriority,
    /// One solved environment per platform, in the lock file's order; never empty, no
    /// platform twice.
    pub platforms: Vec<PlatformLock>,
    /// Where the PyPI wheels were resolved from; `None` for a recipe without `[pypi]`.
    pub pypi: Option<Sources>,
}

/// The environment of one platform.
#[derive(Debug, Clone)]
pub struct PlatformLock {
    pub target: Target,
    pub base: LockedBase,
    /// Packages sorted by name.
    pub records: Vec<RepoDataRecord>,
    /// PyPI wheels sorted by name, installed after the conda packages.
    pub wheels: Vec<ResolvedWheel>,
}

/// A wheel the resolution picked, with what the lock records about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedWheel {
    pub name: pep508_rs::PackageName,
    pub version: pep440_rs::Version,
    pub filename: String,
    pub url: url::Url,
    pub sha256: rattler_digest::Sha256Hash,
    /// The index it came from; `None` for a `find-links` file.
    pub index: Option<url::Url>,
    pub requires_dist: Vec<pep508_rs::Requirement>,
    pub requires_python: Option<pep440_rs::VersionSpecifiers>,
}

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

/// Why an existing lock no longer satisfies the recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staleness {
    Platform {
        locked: String,
        wanted: String,
    },
    VirtualPackages {
        locked: Vec<String>,
        wanted: Vec<String>,
    },
    Channels {
        locked: Vec<String>,
        wanted: Vec<String>,
    },
    ChannelPriority {
        locked: ChannelPriority,
        wanted: ChannelPriority,
    },
    Base {
        locked: String,
        wanted: String,
    },
    MissingSpec(String),
    UnsatisfiedDependency {
        package: String,
        dependency: String,
    },
    Unrequested(String),
    /// The `[pypi]` part no longer matches the recipe.
    Pypi(String),
    /// A reason that holds for one platform of a multi-platform lock.
    OnPlatform {
        platform: String,
        reason: Box<Staleness>,
    },
}

impl fmt::Display for Staleness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Staleness::Platform { locked, wanted } => {
                write!(
                    f,
                    "the lock is for platforms `{locked}`, the recipe asks for `{wanted}`"
                )
            }
            Staleness::VirtualPackages { locked, wanted } => write!(
                f,
                "the target changed: locked for [{}], the recipe now targets [{}]",
                locked.join(", "),
                wanted.join(", ")
            ),
            Staleness::Channels { locked, wanted } => write!(
                f,
                "the channels changed: locked [{}], the recipe has [{}]",
                locked.join(", "),
                wanted.join(", ")
            ),
            Staleness::ChannelPriority { locked, wanted } => write!(
                f,
                "the channel priority changed: locked `{}`, the recipe has `{}`",
                priority_name(*locked),
                priority_name(*wanted)
            ),
            Staleness::Base { locked, wanted } => {
                write!(f, "the base image changed: locked {locked}, now {wanted}")
            }
            Staleness::MissingSpec(spec) => {
                write!(f, "no locked package satisfies the dependency `{spec}`")
            }
            Staleness::UnsatisfiedDependency {
                package,
                dependency,
            } => write!(
                f,
                "locked package `{package}` needs `{dependency}`, which no locked package provides"
            ),
            Staleness::Unrequested(package) => write!(
                f,
                "locked package `{package}` is no longer needed by the recipe's dependencies"
            ),
            Staleness::Pypi(reason) => f.write_str(reason),
            Staleness::OnPlatform { platform, reason } => write!(f, "{platform}: {reason}"),
        }
    }
}

/// The largest lock file read.
pub const MAX_LOCK_BYTES: u64 = 64 << 20;

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

    fn parse(text: &str, path: &Path) -> Result<Lock, LockError> {
        let shape = |reason: &str| LockError::Shape {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let base = text
            .lines()
            .take_while(|line| line.starts_with('#'))
            .find_map(|line| line.strip_prefix(BASE_MARKER))
            .ok_or_else(|| shape("the `# imgbuild-base:` header is missing"))?;
        let bases = parse_bases(base.trim()).ok_or_else(|| {
            shape("the `# imgbuild-base:` header is not `scratch`, a digest, or `PLATFORM=scratch|digest` pairs")
        })?;
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
            .ok_or_else(|| shape("it has no `default` environment"))?;
        let mut platforms: Vec<PlatformLock> = Vec::new();
        for platform in environment.platforms() {
            let subdir = platform.subdir();
            if platforms.iter().any(|p| p.target.platform == subdir) {
                return Err(shape(&format!("it locks `{subdir}` twice")));
            }
            let virtual_packages = platform
                .virtual_packages()
                .iter()
                .map(|v| {
                    serde_json::from_value::<GenericVirtualPackage>(serde_json::Value::String(
                        v.clone(),
                    ))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| shape("a virtual package entry cannot be parsed"))?;
            let base = match &bases {
                Bases::All(base) => base.clone(),
                Bases::PerPlatform(bases) => bases
                    .iter()
                    .find(|(name, _)| name == subdir.as_str())
                    .map(|(_, base)| base.clone())
                    .ok_or_else(|| {
                        shape(&format!(
                            "the `# imgbuild-base:` header pins no base for `{subdir}`"
                        ))
                    })?,
            };
            let mut records = environment
                .conda_repodata_records(platform)
                .map_err(|_| shape("a package entry cannot be read as a conda package"))?
                .unwrap_or_default();
            // A record without a sha256 (some old repodata has none) is read as the solve
            // wrote it: pinned by its URL (and md5 when the channel gives one), downloaded
            // and checked the way the README says such records are.
            records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
            let mut wheels = Vec::new();
            for package in environment.pypi_packages(platform).into_iter().flatten() {
                wheels.push(locked_wheel(package, lock_dir).map_err(|reason| shape(&reason))?);
            }
            wheels.sort_by(|a, b| a.name.cmp(&b.name));
            platforms.push(PlatformLock {
                target: Target {
                    platform: subdir,
                    virtual_packages,
                },
                base,
                records,
                wheels,
            });
        }
        if platforms.is_empty() {
            return Err(shape("it locks no platform"));
        }
        // rattler_lock gives an environment's platforms in no fixed order: sort them, so
        // whatever follows the lock's order (messages, the lock written back) is the same
        // every time.
        platforms.sort_by(|a, b| a.target.platform.as_str().cmp(b.target.platform.as_str()));
        let pypi = environment.pypi_indexes().map(|indexes| Sources {
            indexes: indexes.indexes.clone(),
            find_links: indexes
                .find_links
                .iter()
                .map(|f| match f {
                    FindLinksUrlOrPath::Path(path) => {
                        // Resolved by name, as the recipe resolves its own: a directory
                        // beside the project is `../../wheels` from the lock.
                        let path = lock_dir.join(path);
                        FindLinks::Directory(lexical_path(
                            &std::path::absolute(&path).unwrap_or(path),
                        ))
                    }
                    FindLinksUrlOrPath::Url(url) => FindLinks::Page(url.clone()),
                })
                .collect(),
        });
        Ok(Lock {
            channels: environment
                .channels()
                .iter()
                .map(|c| c.url.clone())
                .collect(),
            channel_priority: environment.solve_options().channel_priority,
            platforms,
            pypi,
        })
    }

    /// The environment locked for `platform`.
    pub fn platform(&self, platform: Subdir) -> Option<&PlatformLock> {
        self.platforms
            .iter()
            .find(|p| p.target.platform == platform)
    }

    /// How many packages the lock pins, conda packages and wheels, over all platforms.
    pub fn package_count(&self) -> usize {
        self.platforms
            .iter()
            .map(|p| p.records.len() + p.wheels.len())
            .sum()
    }

    /// Every locked package of every platform.
    pub fn all_records(&self) -> impl Iterator<Item = &RepoDataRecord> {
        self.platforms.iter().flat_map(|p| p.records.iter())
    }

    /// The packages of every platform, each once (a noarch package locked for two platforms
    /// is one file), sorted by name.
    pub fn distinct_records(&self) -> Vec<&RepoDataRecord> {
        let mut seen = BTreeSet::new();
        let mut records: Vec<&RepoDataRecord> = self
            .all_records()
            .filter(|r| seen.insert(r.url.as_str()))
            .collect();
        records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
        records
    }

    /// The base of every platform, when they all have the same one (a one-platform lock
    /// always has).
    pub fn common_base(&self) -> Option<&LockedBase> {
        let first = &self.platforms[0].base;
        self.platforms
            .iter()
            .all(|p| &p.base == first)
            .then_some(first)
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
            .map_err(|e| LockError::Build(Box::new(e)))?
            .with_channels(DEFAULT_ENVIRONMENT_NAME, self.channels.iter().cloned())
            .with_options(
                DEFAULT_ENVIRONMENT_NAME,
                SolveOptions {
                    channel_priority: self.channel_priority,
                    ..SolveOptions::default()
                },
            );
        if let Some(sources) = &self.pypi {
            builder.set_pypi_indexes(
                DEFAULT_ENVIRONMENT_NAME,
                PypiIndexes {
                    indexes: sources.indexes.clone(),
                    find_links: sources
                        .find_links
                        .iter()
                        .map(|f| match f {
                            FindLinks::Directory(path) => {
                                FindLinksUrlOrPath::Path(relative_to(path, lock_dir))
                            }
                            FindLinks::Page(url) => FindLinksUrlOrPath::Url(url.clone()),
                        })
                        .collect(),
                },
            );
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
                    .map_err(|e| LockError::Build(Box::new(e)))?;
            }
            for wheel in &platform.wheels {
                builder
                    .add_pypi_package(
                        DEFAULT_ENVIRONMENT_NAME,
                        name.as_str(),
                        wheel_data(wheel, lock_dir),
                    )
                    .map_err(|e| LockError::Build(Box::new(e)))?;
            }
        }
        let body = builder
            .finish()
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

    /// The newest package build time in the lock, in seconds since the epoch. Images built
    /// from the same lock get the same `created` time from it.
    pub fn newest_timestamp(&self) -> i64 {
        self.all_records()
            .filter_map(|r| r.package_record.timestamp.as_ref())
            .map(|t| t.timestamp())
            .max()
            .unwrap_or(0)
            .max(0)
    }

    /// Checks that this lock still satisfies `recipe` for `wanted`, the target and base of
    /// each of the recipe's platforms; the first reason it does not is returned.
    pub fn check(&self, recipe: &Recipe, wanted: &[(Target, LockedBase)]) -> Result<(), Staleness> {
        let names = |platforms: &mut dyn Iterator<Item = Subdir>| {
            let mut names: Vec<&str> = platforms.map(|p| p.as_str()).collect();
            names.sort_unstable();
            names.join(", ")
        };
        let locked = names(&mut self.platforms.iter().map(|p| p.target.platform));
        let asked = names(&mut wanted.iter().map(|(t, _)| t.platform));
        if locked != asked {
            return Err(Staleness::Platform {
                locked,
                wanted: asked,
            });
        }
        let wanted_channels: Vec<String> = recipe
            .channels
            .iter()
            .map(|c| c.base_url.to_string())
            .collect();
        let normalise = |urls: &[String]| -> Vec<String> {
            urls.iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect()
        };
        let channels_changed = normalise(&self.channels) != normalise(&wanted_channels);
        let multi = wanted.len() > 1;
        for (target, base) in wanted {
            let locked = self
                .platform(target.platform)
                .expect("the platform sets are equal");
            // Virtual packages first: a changed target explains a changed solution.
            let result = locked
                .check_target(target)
                .and_then(|()| {
                    if channels_changed {
                        return Err(Staleness::Channels {
                            locked: self.channels.clone(),
                            wanted: wanted_channels.clone(),
                        });
                    }
                    // The same channels in another priority can choose other packages, which
                    // the closure check below cannot see.
                    if self.channel_priority != recipe.channel_priority {
                        return Err(Staleness::ChannelPriority {
                            locked: self.channel_priority,
                            wanted: recipe.channel_priority,
                        });
                    }
                    Ok(())
                })
                .and_then(|()| locked.check_base(base))
                .and_then(|()| locked.check_closure(&recipe.specs, &target.virtual_packages))
                .and_then(|()| locked.check_pypi(recipe.pypi.as_ref(), self.pypi.as_ref()));
            match result {
                // Not one platform's: every platform has the recipe's channels and priority.
                Err(reason @ (Staleness::Channels { .. } | Staleness::ChannelPriority { .. })) => {
                    return Err(reason);
                }
                Err(reason) if multi => {
                    return Err(Staleness::OnPlatform {
                        platform: target.platform.to_string(),
                        reason: Box::new(reason),
                    });
                }
                other => other?,
            }
        }
        Ok(())
    }
}

impl Lock {
    /// Every package this lock pins comes from the recipe's own sources: each conda package's
    /// URL lies under one of the recipe's channels (as the recipe resolves them, channel alias
    /// included), and each wheel comes from one of its `[pypi]` indexes or find-links. A
    /// lock is an input like the recipe, and pins by sha256 only what it is given: one edited
    /// to fetch from elsewhere must not be built from. `path` is the lock's, for the message.
    pub fn check_sources(&self, recipe: &Recipe, path: &Path) -> Result<(), LockError> {
        let foreign = |package: String, url: &url::Url, expected: String| {
            Err(LockError::ForeignSource {
                path: path.to_path_buf(),
                package,
                url: url.to_string(),
                expected,
            })
        };
        let channels: Vec<String> = recipe
            .channels
            .iter()
            .map(|c| directory_url(c.base_url.url()))
            .collect();
        for record in self.distinct_records() {
            if !channels.iter().any(|c| url_under(&record.url, c)) {
                let package = format!(
                    "`{}-{}-{}`",
                    record.package_record.name.as_normalized(),
                    record.package_record.version,
                    record.package_record.build
                );
                return foreign(package, &record.url, channels_text(&channels));
            }
        }
        for wheel in self.platforms.iter().flat_map(|p| &p.wheels) {
            let sources = recipe.pypi.as_ref().map(|p| &p.sources);
            if !sources.is_some_and(|s| wheel_from(wheel, s)) {
                let expected = match sources {
                    Some(sources) => format!("the recipe's PyPI indexes and find-links: {sources}"),
                    None => "any PyPI source: the recipe has no `[pypi]` section".to_string(),
                };
                return foreign(
                    format!("the PyPI package `{} {}`", wheel.name, wheel.version),
                    &wheel.url,
                    expected,
                );
            }
        }
        Ok(())
    }
}

/// `url` as a directory: with a trailing `/`, so `https://x/conda-forge/` is not a prefix of
/// `https://x/conda-forge-evil/…`.
fn directory_url(url: &url::Url) -> String {
    let text = url.as_str();
    match text.ends_with('/') {
        true => text.to_string(),
        false => format!("{text}/"),
    }
}

/// Whether `url` names a file under `directory` (from [`directory_url`]). Both are parsed
/// URLs, so `.` and `..` segments (also as `%2e`) are already resolved; a percent-encoded
/// `/`, `\` or `.` after the directory is refused too, as a file name never needs one and
/// a reader that decodes it would climb out.
fn url_under(url: &url::Url, directory: &str) -> bool {
    let Some(rest) = url.as_str().strip_prefix(directory) else {
        return false;
    };
    let rest = rest.to_ascii_lowercase();
    !rest.is_empty() && !["%2f", "%5c", "%2e"].iter().any(|e| rest.contains(e))
}

/// The priority as the recipe and the lock file spell it.
fn priority_name(priority: ChannelPriority) -> &'static str {
    match priority {
        ChannelPriority::Strict => "strict",
        ChannelPriority::Disabled => "disabled",
        ChannelPriority::Flexible => "flexible",
    }
}

fn channels_text(channels: &[String]) -> String {
    match channels {
        [] => "any channel: the recipe has no `[conda] channels`".to_string(),
        channels => format!(
            "the recipe's channels: {}",
            channels
                .iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Whether a locked wheel comes from `sources`: served from the origin of one of its
/// indexes (PyPI's files from `files.pythonhosted.org`) or find-links pages, or a file in one
/// of its find-links directories. The wheel's recorded index says nothing: rattler_lock
/// reads a wheel without one as the environment's first index (else PyPI), local ones too.
fn wheel_from(wheel: &ResolvedWheel, sources: &Sources) -> bool {
    sources
        .indexes
        .iter()
        .any(|index| served_by(index, &wheel.url))
        || sources.find_links.iter().any(|location| match location {
            FindLinks::Directory(dir) => file_in(&wheel.url, dir),
            FindLinks::Page(page) => served_by(page, &wheel.url),
        })
}

/// Whether `source` (an index or a find-links page) serves `url`: the same scheme, host and
/// port. Index pages may link files anywhere on their server (the test index serves
/// `/simple/` and `/files/`), and PyPI keeps its files on its own file host.
fn served_by(source: &url::Url, url: &url::Url) -> bool {
    let pypi_files = source.scheme() == "https"
        && source.host_str() == Some("pypi.org")
        && url.scheme() == "https"
        && url.host_str() == Some("files.pythonhosted.org")
        && url.port().is_none();
    matches!(source.scheme(), "http" | "https") && (url.origin() == source.origin() || pypi_files)
}

/// Whether the `file:` URL `url` names a file inside `dir`, compared component by component
/// after `..` is resolved on both sides (a lock's local wheels are read relative to it).
fn file_in(url: &url::Url, dir: &Path) -> bool {
    if url.scheme() != "file" || !url_under(url, "file:///") {
        return false;
    }
    let Ok(path) = url.to_file_path() else {
        return false;
    };
    let (path, dir) = (lexical_path(&path), lexical_path(dir));
    path != dir && path.starts_with(&dir)
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

impl PlatformLock {
    /// The CUDA runtime of this platform: its conda packages', else NVIDIA's runtime wheel's.
    pub fn cuda_runtime(&self) -> Option<SolvedCuda> {
        solved_cuda(&self.records).or_else(|| solved_cuda_from_wheels(self.wheel_versions()))
    }

    /// Every CUDA runtime this platform holds: its conda packages' and NVIDIA's runtime
    /// wheels' (a `-cu12` wheel beside conda's 11.8 `cuda-cudart` is a second runtime).
    pub fn cuda_runtimes(&self) -> Vec<SolvedCuda> {
        let conda = solved_cuda(&self.records);
        let wheel = solved_cuda_from_wheels(self.wheel_versions());
        conda.into_iter().chain(wheel).collect()
    }

    /// (normalized name, version) of each locked wheel.
    fn wheel_versions(&self) -> impl Iterator<Item = (&str, String)> {
        self.wheels
            .iter()
            .map(|w| (w.name.as_ref(), w.version.to_string()))
    }

    fn check_target(&self, target: &Target) -> Result<(), Staleness> {
        if self.target.virtual_package_strings() != target.virtual_package_strings() {
            return Err(Staleness::VirtualPackages {
                locked: self.target.virtual_package_strings(),
                wanted: target.virtual_package_strings(),
            });
        }
        Ok(())
    }

    fn check_base(&self, base: &LockedBase) -> Result<(), Staleness> {
        if &self.base != base {
            return Err(Staleness::Base {
                locked: self.base.to_string(),
                wanted: base.to_string(),
            });
        }
        Ok(())
    }

    /// The locked wheels were resolved from the recipe's indexes, meet its PyPI
    /// requirements with their dependencies (on this platform's Python, with what the conda
    /// packages provide), and are all needed.
    fn check_pypi(
        &self,
        wanted: Option<&crate::recipe::pypi::PypiRecipe>,
        locked: Option<&Sources>,
    ) -> Result<(), Staleness> {
        let stale = |reason: String| Err(Staleness::Pypi(reason));
        let wanted = match (wanted, locked) {
            (None, None) => return Ok(()),
            (None, Some(_)) => return stale("the recipe no longer has a `[pypi]` section".into()),
            (Some(_), None) => return stale("the recipe has a new `[pypi]` section".into()),
            (Some(wanted), Some(locked)) => {
                if &wanted.sources != locked {
                    return stale(format!(
                        "the PyPI sources changed: locked {}, the recipe has {}",
                        locked, wanted.sources
                    ));
                }
                wanted
            }
        };
        if self.wheels.is_empty() && wanted.requirements.is_empty() {
            return Ok(());
        }
        let python = crate::python::python_target(
            self.target.platform,
            &self.target.virtual_packages,
            &self.records,
        )
        .map_err(|e| Staleness::Pypi(e.to_string()))?;
        let provided = crate::python::provided(&self.records);
        let by_name: HashMap<&pep508_rs::PackageName, &ResolvedWheel> =
            self.wheels.iter().map(|w| (&w.name, w)).collect();
        let mut reached: BTreeSet<&pep508_rs::PackageName> = BTreeSet::new();
        // (requirement, extras it is evaluated with, who asked)
        let mut queue: Vec<(&pep508_rs::Requirement, Vec<pep508_rs::ExtraName>, String)> = wanted
            .requirements
            .iter()
            .map(|r| (r, Vec::new(), "the recipe".to_string()))
            .collect();
        let mut visited_extras: BTreeSet<(String, String)> = BTreeSet::new();
        while let Some((requirement, extras, asker)) = queue.pop() {
            if !python.applies(requirement, &extras) {
                continue;
            }
            let version = match (
                provided.get(&requirement.name),
                by_name.get(&requirement.name),
            ) {
                (Some(conda), _) => conda.version.clone(),
                (None, Some(wheel)) => wheel.version.clone(),
                (None, None) => {
                    return stale(format!(
                        "{asker} needs the PyPI package `{requirement}`, which is not locked"
                    ));
                }
            };
            let satisfied = match &requirement.version_or_url {
                Some(pep508_rs::VersionOrUrl::VersionSpecifier(specifiers)) => {
                    crate::python::ranges::specifiers_ranges(specifiers).contains(&version)
                }
                _ => true,
            };
            if !satisfied {
                return stale(format!(
                    "{asker} needs `{requirement}`, but {} {version} is locked",
                    requirement.name
                ));
            }
            let Some(wheel) = by_name.get(&requirement.name) else {
                continue; // conda's own dependencies are conda's to meet
            };
            let fresh = reached.insert(&wheel.name);
            let mut new_extras = Vec::new();
            for extra in &requirement.extras {
                if visited_extras.insert((wheel.name.to_string(), extra.to_string())) {
                    new_extras.push(extra.clone());
                }
            }
            let asker = format!("locked PyPI package `{} {}`", wheel.name, wheel.version);
            for dependency in &wheel.requires_dist {
                if fresh && python.applies(dependency, &[]) {
                    queue.push((dependency, Vec::new(), asker.clone()));
                }
                for extra in &new_extras {
                    if python.applies(dependency, std::slice::from_ref(extra)) {
                        queue.push((dependency, vec![extra.clone()], asker.clone()));
                    }
                }
            }
        }
        if let Some(extra) = self.wheels.iter().find(|w| !reached.contains(&w.name)) {
            return stale(format!(
                "locked PyPI package `{}` is no longer needed by the recipe's `[pypi]` dependencies",
                extra.name
            ));
        }
        Ok(())
    }

    /// Every requested spec is met, every locked package's dependencies are met inside the
    /// lock, and every locked package is reachable from the requested specs.
    fn check_closure(
        &self,
        specs: &[MatchSpec],
        virtual_packages: &[GenericVirtualPackage],
    ) -> Result<(), Staleness> {
        let by_name: HashMap<&PackageName, &RepoDataRecord> = self
            .records
            .iter()
            .map(|r| (&r.package_record.name, r))
            .collect();
        let mut reached: BTreeSet<&PackageName> = BTreeSet::new();
        let mut queue: Vec<&RepoDataRecord> = Vec::new();
        for spec in specs {
            let record = spec
                .name
                .as_exact()
                .and_then(|name| by_name.get(name))
                .filter(|record| spec.matches(**record))
                .ok_or_else(|| Staleness::MissingSpec(spec.to_string()))?;
            queue.push(record);
        }
        while let Some(record) = queue.pop() {
            if !reached.insert(&record.package_record.name) {
                continue;
            }
            for dependency in &record.package_record.depends {
                let package = || {
                    format!(
                        "{}-{}-{}",
                        record.package_record.name.as_normalized(),
                        record.package_record.version,
                        record.package_record.build
                    )
                };
                let spec =
                    MatchSpec::from_str(dependency, ParseStrictness::Lenient).map_err(|_| {
                        Staleness::UnsatisfiedDependency {
                            package: package(),
                            dependency: dependency.clone(),
                        }
                    })?;
                let Some(name) = spec.name.as_exact() else {
                    continue;
                };
                if name.as_normalized().starts_with("__") {
                    if virtual_packages.iter().any(|v| spec.matches(v)) {
                        continue;
                    }
                    return Err(Staleness::UnsatisfiedDependency {
                        package: package(),
                        dependency: dependency.clone(),
                    });
                }
                match by_name.get(name) {
                    Some(dep) if spec.matches(*dep) => queue.push(dep),
                    _ => {
                        return Err(Staleness::UnsatisfiedDependency {
                            package: package(),
                            dependency: dependency.clone(),
                        });
                    }
                }
            }
        }
        if let Some(extra) = self
            .records
            .iter()
            .find(|r| !reached.contains(&r.package_record.name))
        {
            return Err(Staleness::Unrequested(
                extra.package_record.name.as_normalized().to_string(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::recipe::RecipeOptions;

    fn record(name: &str, subdir: &str, sha: u8) -> RepoDataRecord {
        let file = format!("{name}-1.0-0.conda");
        serde_json::from_value(serde_json::json!({
            "name": name,
            "version": "1.0",
            "build": "0",
            "build_number": 0,
            "depends": if name == "app" { vec!["lib", "__glibc >=2.17"] } else { vec![] },
            "subdir": subdir,
            "fn": file,
            "url": format!("file:///ch/{subdir}/{file}"),
            "channel": "file:///ch/",
            "sha256": format!("{sha:02x}").repeat(32),
        }))
        .unwrap()
    }

    fn recipe(platforms: &str) -> Recipe {
        Recipe::from_str_at(
            &format!(
                "[image]\nname = \"x\"\nplatforms = [{platforms}]\n[conda]\nchannels = [\"file:///ch\"]\ndependencies = [\"app\"]\n"
            ),
            Path::new("/work/recipes/x.toml"),
            &RecipeOptions::default(),
        )
        .unwrap()
    }

    fn platform_lock(recipe: &Recipe, platform: Subdir, base: LockedBase, sha: u8) -> PlatformLock {
        PlatformLock {
            target: Target::for_recipe(recipe, platform, None),
            base,
            records: vec![
                record("app", platform.as_str(), sha),
                record("lib", "noarch", 9),
            ],
            wheels: Vec::new(),
        }
    }

    fn two_platform_lock(recipe: &Recipe) -> Lock {
        Lock {
            channels: vec!["file:///ch/".to_string()],
            channel_priority: ChannelPriority::Strict,
            pypi: None,
            platforms: vec![
                platform_lock(
                    recipe,
                    Subdir::Linux64,
                    LockedBase::Digest(format!("sha256:{}", "a".repeat(64))),
                    1,
                ),
                platform_lock(
                    recipe,
                    Subdir::LinuxAarch64,
                    LockedBase::Digest(format!("sha256:{}", "b".repeat(64))),
                    2,
                ),
            ],
        }
    }

    fn wanted(lock: &Lock) -> Vec<(Target, LockedBase)> {
        lock.platforms
            .iter()
            .map(|p| (p.target.clone(), p.base.clone()))
            .collect()
    }

    #[test]
    fn a_two_platform_lock_reads_back_with_each_platforms_base() {
        let recipe = recipe("\"linux-64\", \"linux-aarch64\"");
        let lock = two_platform_lock(&recipe);
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(
            text.contains(&format!(
                "# imgbuild-base: linux-64=sha256:{} linux-aarch64=sha256:{}\n",
                "a".repeat(64),
                "b".repeat(64)
            )),
            "{text}"
        );
        let read = Lock::parse(&text, Path::new("/work/recipes/x.lock")).unwrap();
        assert_eq!(read.platforms.len(), 2);
        for platform in [Subdir::Linux64, Subdir::LinuxAarch64] {
            let (locked, original) = (
                read.platform(platform).unwrap(),
                lock.platform(platform).unwrap(),
            );
            assert_eq!(locked.base, original.base);
            assert_eq!(locked.target, original.target);
            assert_eq!(locked.records.len(), 2);
        }
        // The noarch `lib` is locked for both platforms but is one package.
        assert_eq!(read.all_records().count(), 4);
        assert_eq!(read.distinct_records().len(), 3);
        assert_eq!(read.common_base(), None);
        assert!(read.check(&recipe, &wanted(&lock)).is_ok());
    }

    /// `record` as some old repodata has it: no sha256, with or without an md5.
    fn without_sha256(mut record: RepoDataRecord, md5: bool) -> RepoDataRecord {
        record.package_record.sha256 = None;
        record.package_record.md5 = md5.then(|| {
            rattler_digest::parse_digest_from_hex::<rattler_digest::Md5>(&"ab".repeat(16))
                .expect("an md5 in hex")
        });
        record
    }

    #[test]
    fn a_record_without_sha256_is_written_and_read_back() {
        let recipe = recipe("\"linux-64\"");
        for md5 in [true, false] {
            let mut lock = two_platform_lock(&recipe);
            lock.platforms.truncate(1);
            let records = &mut lock.platforms[0].records;
            records[0] = without_sha256(records[0].clone(), md5);
            let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
            let read = Lock::parse(&text, Path::new("/work/recipes/x.lock"))
                .unwrap_or_else(|e| panic!("md5 {md5}: {e}\n{text}"));
            let app = &read.platforms[0].records[0].package_record;
            assert_eq!(app.name.as_normalized(), "app");
            assert_eq!(app.sha256, None, "{text}");
            assert_eq!(app.md5, lock.platforms[0].records[0].package_record.md5);
            assert!(read.check(&recipe, &wanted(&lock)).is_ok());
        }
    }

    #[test]
    fn a_one_platform_lock_keeps_its_one_line_base_pin() {
        let recipe = recipe("\"linux-aarch64\"");
        let lock = Lock {
            channels: vec!["file:///ch/".to_string()],
            channel_priority: ChannelPriority::Strict,
            pypi: None,
            platforms: vec![platform_lock(
                &recipe,
                Subdir::LinuxAarch64,
                LockedBase::Scratch,
                2,
            )],
        };
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(text.contains("\n# imgbuild-base: scratch\n"), "{text}");
        let read = Lock::parse(&text, Path::new("/work/recipes/x.lock")).unwrap();
        assert_eq!(read.common_base(), Some(&LockedBase::Scratch));
        assert!(read.check(&recipe, &wanted(&lock)).is_ok());
    }

    #[test]
    fn a_changed_channel_priority_makes_the_lock_stale_and_survives_the_file() {
        let strict = recipe("\"linux-64\", \"linux-aarch64\"");
        let mut disabled = strict.clone();
        disabled.channel_priority = ChannelPriority::Disabled;
        let mut lock = two_platform_lock(&strict);
        assert_eq!(lock.check(&strict, &wanted(&lock)), Ok(()));
        // Not one platform's reason: the priority is the recipe's.
        assert_eq!(
            lock.check(&disabled, &wanted(&lock)),
            Err(Staleness::ChannelPriority {
                locked: ChannelPriority::Strict,
                wanted: ChannelPriority::Disabled,
            })
        );
        assert_eq!(
            lock.check(&disabled, &wanted(&lock))
                .unwrap_err()
                .to_string(),
            "the channel priority changed: locked `strict`, the recipe has `disabled`"
        );

        // A strict lock is written as before the key existed (rattler omits its default).
        let path = Path::new("/work/recipes/x.lock");
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(!text.contains("channel-priority"), "{text}");
        assert_eq!(
            Lock::parse(&text, path).unwrap().channel_priority,
            ChannelPriority::Strict
        );
        lock.channel_priority = ChannelPriority::Disabled;
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(text.contains("channel-priority: disabled"), "{text}");
        let read = Lock::parse(&text, path).unwrap();
        assert_eq!(read.channel_priority, ChannelPriority::Disabled);
        assert_eq!(read.check(&disabled, &wanted(&read)), Ok(()));
    }

    #[test]
    fn a_lock_is_stale_for_a_missing_platform_or_one_platforms_change() {
        let both = recipe("\"linux-64\", \"linux-aarch64\"");
        let lock = two_platform_lock(&both);
        let mut only_64 = lock.clone();
        only_64.platforms.truncate(1);
        assert_eq!(
            only_64
                .check(&both, &wanted(&lock))
                .unwrap_err()
                .to_string(),
            "the lock is for platforms `linux-64`, the recipe asks for `linux-64, linux-aarch64`"
        );
        // The arm64 base moved: the reason names the platform.
        let mut moved = wanted(&lock);
        moved[1].1 = LockedBase::Digest(format!("sha256:{}", "c".repeat(64)));
        let reason = lock.check(&both, &moved).unwrap_err();
        assert!(
            matches!(&reason, Staleness::OnPlatform { platform, reason }
                if platform == "linux-aarch64" && matches!(**reason, Staleness::Base { .. })),
            "{reason:?}"
        );
        assert!(
            reason
                .to_string()
                .starts_with("linux-aarch64: the base image changed")
        );
    }

    /// A one-platform lock of `app` and `lib` whose `lib` is at `url`.
    fn lock_with_lib_at(recipe: &Recipe, url: &str) -> Lock {
        let mut platform = platform_lock(recipe, Subdir::Linux64, LockedBase::Scratch, 1);
        platform.records[1].url = url::Url::parse(url).unwrap();
        Lock {
            channels: vec!["file:///ch/".to_string()],
            channel_priority: ChannelPriority::Strict,
            pypi: None,
            platforms: vec![platform],
        }
    }

    #[test]
    fn a_package_outside_the_recipes_channels_is_refused_naming_it_and_them() {
        let recipe = recipe("\"linux-64\"");
        let path = Path::new("/work/recipes/x.lock");
        for inside in [
            "file:///ch/noarch/lib-1.0-0.conda",
            "file:///ch/./noarch/lib-1.0-0.conda",
            "file:///ch/sub/../noarch/lib-1.0-0.conda",
        ] {
            let lock = lock_with_lib_at(&recipe, inside);
            assert!(lock.check_sources(&recipe, path).is_ok(), "{inside}");
        }
        for outside in [
            "file:///ch-evil/noarch/lib-1.0-0.conda",
            "file:///ch/../evil/noarch/lib-1.0-0.conda",
            "file:///ch/%2e%2e/evil/lib-1.0-0.conda",
            "file:///ch/noarch%2F..%2F..%2Fetc/lib-1.0-0.conda",
            "file:///elsewhere/noarch/lib-1.0-0.conda",
            "https://evil.example/ch/noarch/lib-1.0-0.conda",
        ] {
            let lock = lock_with_lib_at(&recipe, outside);
            let err = lock.check_sources(&recipe, path).unwrap_err().to_string();
            assert!(
                err.starts_with("Lock file `/work/recipes/x.lock` pins `lib-1.0-0` at `"),
                "{outside}: {err}"
            );
            assert!(
                err.contains("which is not under the recipe's channels: `file:///ch/`"),
                "{outside}: {err}"
            );
        }
    }

    fn wheel_at(url: &str) -> ResolvedWheel {
        ResolvedWheel {
            name: "six".parse().unwrap(),
            version: "1.16.0".parse().unwrap(),
            filename: "six-1.16.0-py2.py3-none-any.whl".into(),
            url: url::Url::parse(url).unwrap(),
            sha256: Default::default(),
            index: None,
            requires_dist: Vec::new(),
            requires_python: None,
        }
    }

    #[test]
    fn a_wheel_must_come_from_an_index_origin_or_a_find_links_location() {
        let sources = Sources {
            indexes: vec![
                url::Url::parse("https://pypi.org/simple").unwrap(),
                url::Url::parse("http://127.0.0.1:8080/simple").unwrap(),
            ],
            find_links: vec![
                FindLinks::Directory("/work/wheels".into()),
                FindLinks::Page(url::Url::parse("https://links.example/torch.html").unwrap()),
            ],
        };
        for from in [
            "https://files.pythonhosted.org/packages/d9/5a/six-1.16.0-py2.py3-none-any.whl",
            "https://pypi.org/packages/six-1.16.0-py2.py3-none-any.whl",
            "http://127.0.0.1:8080/files/six-1.16.0-py2.py3-none-any.whl",
            "file:///work/wheels/six-1.16.0-py2.py3-none-any.whl",
            "file:///work/recipes/../wheels/six-1.16.0-py2.py3-none-any.whl",
            "https://links.example/cpu/six-1.16.0-py2.py3-none-any.whl",
        ] {
            assert!(wheel_from(&wheel_at(from), &sources), "{from}");
        }
        for not in [
            "https://evil.example/six-1.16.0-py2.py3-none-any.whl",
            "http://files.pythonhosted.org/packages/six-1.16.0-py2.py3-none-any.whl",
            "http://127.0.0.1:8081/files/six-1.16.0-py2.py3-none-any.whl",
            "https://127.0.0.1:8080/files/six-1.16.0-py2.py3-none-any.whl",
            "file:///work/wheels-evil/six-1.16.0-py2.py3-none-any.whl",
            "file:///work/wheels/../evil/six-1.16.0-py2.py3-none-any.whl",
            "file:///work/wheels/..%2Fevil/six-1.16.0-py2.py3-none-any.whl",
            "file:///etc/six-1.16.0-py2.py3-none-any.whl",
        ] {
            assert!(!wheel_from(&wheel_at(not), &sources), "{not}");
        }
        // Without `[pypi]`, no wheel belongs.
        let recipe = recipe("\"linux-64\"");
        let mut lock = lock_with_lib_at(&recipe, "file:///ch/noarch/lib-1.0-0.conda");
        lock.platforms[0]
            .wheels
            .push(wheel_at("https://files.pythonhosted.org/six.whl"));
        let err = lock
            .check_sources(&recipe, Path::new("x.lock"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pins the PyPI package `six 1.16.0` at `https://files.pythonhosted.org/six.whl`, which is not under any PyPI source: the recipe has no `[pypi]` section"),
            "{err}"
        );
    }

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
