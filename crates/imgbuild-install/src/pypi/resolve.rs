//! Resolving the `[pypi]` requirements with PubGrub, for the image's Python and platform.
//!
//! Every version considered is one with a wheel the target accepts (its tags, its
//! `Requires-Python`); a project that offers only source distributions is refused by name,
//! since building one would run the project's code on the build host (the recipe's own
//! requirements all in one error, each with the versions that do have wheels). Distributions the
//! conda environment provides stand as their one conda version, with no dependencies of
//! their own (conda's solver already met those). Extras are packages of their own
//! (`name[extra]`), pinned to their base package's version, as uv models them.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    fmt,
    path::Path,
    rc::Rc,
    str::FromStr,
};

use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{ExtraName, PackageName, Requirement, VersionOrUrl};
use pubgrub::{
    DefaultStringReporter, Dependencies, DependencyProvider, PackageResolutionStatistics,
    PubGrubError, Ranges, Reporter,
};
use rattler_digest::Sha256Hash;
use rattler_networking::LazyClient;
use url::Url;

use crate::{
    compression::bounded::{Bound, TooLarge, read_to_end_bounded},
    report::{Progress, Reporter as BuildReporter},
};

use super::{
    PythonTarget, ResolvedWheel,
    conda::Provided,
    fetch::{FetchError, fetch_wheel},
    index::{DistFile, IndexError, Sources, find_links_files, project_files},
    metadata::CoreMetadata,
    ranges::specifiers_ranges,
    tags::{SupportedTags, WheelName, WheelTarget, sdist_version},
};

/// A project whose versions in the asked range have only source distributions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdistOnly {
    pub package: String,
    /// The source distributions in the range.
    pub files: Vec<String>,
    /// The versions that do have a wheel for the image, newest first.
    pub wheel_versions: Vec<String>,
}

impl SdistOnly {
    /// `only source distributions (a.tar.gz); versions with a wheel for this image: 2.0`
    fn describe(&self) -> String {
        let wheels = if self.wheel_versions.is_empty() {
            "no version has a wheel for this image".to_string()
        } else {
            // The newest few: an old project can have a hundred.
            let shown = &self.wheel_versions[..self.wheel_versions.len().min(5)];
            let more = self.wheel_versions.len() - shown.len();
            let more = if more > 0 {
                format!(" and {more} older")
            } else {
                String::new()
            };
            format!(
                "versions with a wheel for this image: {}{more}",
                shown.join(", ")
            )
        };
        format!(
            "only source distributions ({}); {wheels}",
            self.files.join(", ")
        )
    }
}

/// One requirement keeps the message it always had; several are listed in one.
fn sdist_only_message(projects: &[SdistOnly]) -> String {
    const WHY: &str = "imgbuild installs wheels only, since building a source distribution would run its code on the build host";
    match projects {
        [one] => format!(
            "`{}` has no wheel for this image, {}; {WHY}: pin a version that has a wheel, or build the wheel yourself and add it with `find-links`",
            one.package,
            one.describe()
        ),
        many => {
            let list: Vec<String> = many
                .iter()
                .map(|p| format!("\n  - `{}`: {}", p.package, p.describe()))
                .collect();
            format!(
                "{} requirements have no wheel for this image:{}\n{WHY}: pin versions that have wheels, or build the wheels yourself and add them with `find-links`",
                many.len(),
                list.concat()
            )
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WheelResolveError {
    /// Every requirement that asks for versions with only source distributions, named in
    /// one error so a user fixes them all at once.
    #[error("{}", sdist_only_message(.0))]
    SdistOnly(Vec<SdistOnly>),
    #[error(
        "`{package}` has no wheel the image can use (Python {python}, {platform}, {glibc}); it offers: {files}"
    )]
    NoCompatibleWheel {
        package: String,
        python: String,
        platform: String,
        glibc: String,
        files: String,
    },
    #[error(
        "`{package}` has no version that fits but {version}, which its index marks yanked; pin it with `=={version}` to use it anyway (PEP 592)"
    )]
    Yanked { package: String, version: String },
    #[error("`{package}` was not found on {sources}")]
    NotFound { package: String, sources: String },
    // Boxed: a URL and a reason would make every resolver result large.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error(transparent)]
    Index(Box<IndexError>),
    #[error(transparent)]
    Fetch(Box<FetchError>),
    #[error("The core metadata of `{file}` {reason}")]
    Metadata { file: String, reason: String },
    #[error("The PyPI requirements cannot be met:\n{0}")]
    NoSolution(String),
    #[error(
        "`{0}` is a direct URL requirement; only index and find-links requirements are supported"
    )]
    UrlRequirement(String),
}

impl From<IndexError> for WheelResolveError {
    fn from(err: IndexError) -> Self {
        WheelResolveError::Index(Box::new(err))
    }
}

impl From<FetchError> for WheelResolveError {
    fn from(err: FetchError) -> Self {
        WheelResolveError::Fetch(Box::new(err))
    }
}

/// A node of the resolution.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ResolveNode {
    Root,
    Package(PackageName),
    Extra(PackageName, ExtraName),
}

impl fmt::Display for ResolveNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveNode::Root => f.write_str("the recipe's [pypi] section"),
            ResolveNode::Package(name) => write!(f, "{name}"),
            ResolveNode::Extra(name, extra) => write!(f, "{name}[{extra}]"),
        }
    }
}

/// A version with its best wheel.
#[derive(Debug, Clone)]
struct Candidate {
    version: Version,
    file: DistFile,
    index: Option<Url>,
}

/// What a project offers this target.
#[derive(Debug, Default)]
struct Project {
    /// Newest first.
    candidates: Vec<Candidate>,
    /// Source distributions, by version, for the refusal message.
    sdists: Vec<(Version, String)>,
    /// Wheels the target cannot use.
    other_wheels: Vec<String>,
    /// Of those, the wheels a newer glibc would take, by version.
    newer_glibc: Vec<(Version, String)>,
    found: bool,
}

struct Provider<'a> {
    handle: tokio::runtime::Handle,
    client: LazyClient,
    cache_dir: &'a Path,
    sources: &'a Sources,
    target: &'a PythonTarget,
    tags: SupportedTags,
    /// The tags the target would take with any newer glibc (none without a glibc).
    newer_glibc_tags: Option<SupportedTags>,
    provided: &'a BTreeMap<PackageName, Provided>,
    requirements: &'a [Requirement],
    projects: RefCell<HashMap<PackageName, Rc<Project>>>,
    metadata: RefCell<HashMap<(PackageName, Version), Rc<CoreMetadata>>>,
    find_links: RefCell<Option<Rc<Vec<DistFile>>>>,
    /// Page requests started ahead of the solver, by project.
    prefetched: RefCell<HashMap<PackageName, PrefetchTask>>,
    /// The sha256 of each wheel read whole for its metadata, so that a wheel without a
    /// published hash is not read again for the lock.
    read_wheels: RefCell<HashMap<Url, Sha256Hash>>,
    reporter: &'a dyn BuildReporter,
}

type PrefetchTask = tokio::task::JoinHandle<Result<Option<(Url, Vec<DistFile>)>, IndexError>>;

/// The project pages of `name`: the first of `indexes` that knows it answers for it (a later
/// index can never shadow a project of an earlier one).
async fn index_pages(
    client: LazyClient,
    indexes: Vec<Url>,
    name: PackageName,
) -> Result<Option<(Url, Vec<DistFile>)>, IndexError> {
    for index in indexes {
        if let Some(listed) = project_files(&client, &index, &name).await? {
            return Ok(Some((index, listed)));
        }
    }
    Ok(None)
}

/// Project pages asked for at most at once ahead of the solver.
const PREFETCH: usize = 8;

/// The most bytes of a wheel's `METADATA`, from the index (PEP 658) or the wheel. Metadata is
/// kilobytes; a huge one is a bomb, not metadata.
const MAX_METADATA_BYTES: u64 = 64 << 20;

impl Provider<'_> {
    /// Starts fetching the pages of the projects in `nodes`, which the solver will ask for
    /// next, a few at a time on the runtime: a tree of 50 projects then costs a few round
    /// trips instead of 50.
    fn prefetch(&self, nodes: &[(ResolveNode, Ranges<Version>)]) {
        if self.sources.indexes.is_empty() {
            return;
        }
        let mut prefetched = self.prefetched.borrow_mut();
        for (node, _) in nodes {
            let (ResolveNode::Package(name) | ResolveNode::Extra(name, _)) = node else {
                continue;
            };
            if prefetched.len() >= PREFETCH {
                break;
            }
            if self.provided.contains_key(name)
                || self.projects.borrow().contains_key(name)
                || prefetched.contains_key(name)
            {
                continue;
            }
            let task = self.handle.spawn(index_pages(
                self.client.clone(),
                self.sources.indexes.clone(),
                name.clone(),
            ));
            prefetched.insert(name.clone(), task);
        }
    }

    fn find_links(&self) -> Result<Rc<Vec<DistFile>>, WheelResolveError> {
        if let Some(files) = self.find_links.borrow().as_ref() {
            return Ok(files.clone());
        }
        let mut files = Vec::new();
        for location in &self.sources.find_links {
            files.extend(
                self.handle
                    .block_on(find_links_files(&self.client, location))?,
            );
        }
        let files = Rc::new(files);
        *self.find_links.borrow_mut() = Some(files.clone());
        Ok(files)
    }

    fn project(&self, name: &PackageName) -> Result<Rc<Project>, WheelResolveError> {
        if let Some(project) = self.projects.borrow().get(name) {
            return Ok(project.clone());
        }
        let mut files: Vec<(DistFile, Option<Url>)> = self
            .find_links()?
            .iter()
            .filter(|f| file_project(&f.filename).as_ref() == Some(name))
            .map(|f| (f.clone(), None))
            .collect();
        let mut found = !files.is_empty();
        let pending = self.prefetched.borrow_mut().remove(name);
        let listed = match pending {
            Some(task) => self.handle.block_on(task).map_err(|e| {
                WheelResolveError::from(IndexError::Fetch {
                    url: self.sources.indexes[0].clone(),
                    reason: format!("the request task failed: {e}"),
                })
            })??,
            None => self.handle.block_on(index_pages(
                self.client.clone(),
                self.sources.indexes.clone(),
                name.clone(),
            ))?,
        };
        if !self.sources.indexes.is_empty() {
            self.reporter
                .on_progress(Progress::PypiProject(name.as_ref()));
        }
        if let Some((index, listed)) = listed {
            found = true;
            files.extend(listed.into_iter().map(|f| (f, Some(index.clone()))));
        }
        let mut project = Project {
            found,
            ..Project::default()
        };
        // version → (yanked, rank, file name, file) of its best wheel
        let mut best: BTreeMap<Version, (bool, usize, String, Candidate)> = BTreeMap::new();
        for (file, index) in files {
            if let Some(wheel) = WheelName::parse(&file.filename) {
                if &wheel.name != name {
                    continue;
                }
                let python_ok = file
                    .requires_python
                    .as_deref()
                    .and_then(|r| VersionSpecifiers::from_str(r).ok())
                    .is_none_or(|r| self.target.python_allowed(&r));
                let rank = self.tags.rank(&wheel).filter(|_| python_ok);
                let Some(rank) = rank else {
                    if python_ok
                        && self
                            .newer_glibc_tags
                            .as_ref()
                            .is_some_and(|t| t.rank(&wheel).is_some())
                    {
                        project
                            .newer_glibc
                            .push((wheel.version.clone(), file.filename.clone()));
                    }
                    project.other_wheels.push(file.filename.clone());
                    continue;
                };
                // A version's unyanked wheels come before its yanked ones.
                let key = (file.yanked, rank, file.filename.clone());
                let better = best
                    .get(&wheel.version)
                    .is_none_or(|(y, r, f, _)| key < (*y, *r, f.clone()));
                if better {
                    best.insert(
                        wheel.version.clone(),
                        (
                            file.yanked,
                            rank,
                            file.filename.clone(),
                            Candidate {
                                version: wheel.version,
                                file,
                                index,
                            },
                        ),
                    );
                }
            } else if let Some((_, version)) = sdist_version(&file.filename) {
                project.sdists.push((version, file.filename.clone()));
            }
        }
        project.candidates = best.into_values().rev().map(|(_, _, _, c)| c).collect();
        let project = Rc::new(project);
        self.projects
            .borrow_mut()
            .insert(name.clone(), project.clone());
        Ok(project)
    }

    fn core_metadata(
        &self,
        name: &PackageName,
        candidate: &Candidate,
    ) -> Result<Rc<CoreMetadata>, WheelResolveError> {
        let key = (name.clone(), candidate.version.clone());
        if let Some(metadata) = self.metadata.borrow().get(&key) {
            return Ok(metadata.clone());
        }
        let file = &candidate.file;
        let metadata_error = |reason: String| WheelResolveError::Metadata {
            file: file.filename.clone(),
            reason,
        };
        let remote = file.url.scheme() != "file";
        let text = match &file.metadata {
            Some(sha256) if remote => self.pep658_metadata(file, sha256.as_ref())?,
            _ => {
                // Without PEP 658, by ranges where the server takes them, else the wheel.
                let ranged = match remote {
                    true => self.handle.block_on(super::range_metadata::read_metadata(
                        &self.client,
                        &file.url,
                    )),
                    false => None,
                };
                match ranged {
                    Some(read) => {
                        self.reporter.on_progress(Progress::PypiMetadata {
                            file: &file.filename,
                            bytes: read.received,
                        });
                        read.text
                    }
                    None => self.wheel_metadata(file)?,
                }
            }
        };
        let metadata = CoreMetadata::parse(&text).map_err(|e| metadata_error(e.to_string()))?;
        if &metadata.name != name || metadata.version != candidate.version {
            return Err(metadata_error(format!(
                "names {} {}, not {name} {}",
                metadata.name, metadata.version, candidate.version
            )));
        }
        let metadata = Rc::new(metadata);
        self.metadata.borrow_mut().insert(key, metadata.clone());
        Ok(metadata)
    }

    /// PEP 658: the metadata alone at `<url>.metadata`, checked against the sha256 the index
    /// gives for it.
    fn pep658_metadata(
        &self,
        file: &DistFile,
        sha256: Option<&rattler_digest::Sha256Hash>,
    ) -> Result<String, WheelResolveError> {
        let metadata_error = |reason: String| WheelResolveError::Metadata {
            file: file.filename.clone(),
            reason,
        };
        let url = Url::parse(&format!("{}.metadata", file.url))
            .map_err(|e| metadata_error(e.to_string()))?;
        let bytes = self
            .handle
            .block_on(async {
                let response = self
                    .client
                    .client()
                    .get(url.clone())
                    .send()
                    .await
                    .map_err(|e| crate::http::error_chain(&e))?
                    .error_for_status()
                    .map_err(|e| crate::http::error_chain(&e))?;
                crate::http::read_bounded(response, MAX_METADATA_BYTES)
                    .await
                    .map_err(|e| e.to_string())
            })
            .map_err(|reason| {
                metadata_error(format!("could not be fetched from `{url}`: {reason}"))
            })?;
        if let Some(expected) = sha256 {
            let actual = rattler_digest::compute_bytes_digest::<rattler_digest::Sha256>(&bytes);
            if actual.as_slice() != expected.as_slice() {
                return Err(metadata_error(format!(
                    "at `{url}` does not match the sha256 the index gives"
                )));
            }
        }
        self.reporter.on_progress(Progress::PypiMetadata {
            file: &file.filename,
            bytes: bytes.len() as u64,
        });
        String::from_utf8(bytes).map_err(|_| metadata_error("is not UTF-8".to_string()))
    }

    /// The metadata of the whole wheel, downloaded (or copied) into the cache.
    fn wheel_metadata(&self, file: &DistFile) -> Result<String, WheelResolveError> {
        let (path, sha256) = self.handle.block_on(fetch_wheel(
            &self.client,
            self.cache_dir,
            &file.url,
            &file.filename,
            file.sha256,
            self.reporter,
        ))?;
        self.read_wheels
            .borrow_mut()
            .insert(file.url.clone(), sha256);
        wheel_metadata(&path).map_err(|reason| WheelResolveError::Metadata {
            file: file.filename.clone(),
            reason,
        })
    }

    fn candidate(&self, name: &PackageName, version: &Version) -> Option<Candidate> {
        let projects = self.projects.borrow();
        projects
            .get(name)?
            .candidates
            .iter()
            .find(|c| &c.version == version)
            .cloned()
    }

    /// The dependencies that `requirements` add, under `extras`.
    /// Refuses the recipe's own requirements that only source distributions meet, all of
    /// them at once (the solver would meet them one at a time).
    fn refuse_sdist_only(
        &self,
        constraints: &[(ResolveNode, Ranges<Version>)],
    ) -> Result<(), WheelResolveError> {
        let mut refused = Vec::new();
        for (node, range) in constraints {
            let ResolveNode::Package(name) = node else {
                continue;
            };
            if self.provided.contains_key(name) {
                continue;
            }
            let project = self.project(name)?;
            if let Some(sdist_only) = sdist_only(name, &project, range) {
                refused.push(sdist_only);
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(WheelResolveError::SdistOnly(refused))
        }
    }

    fn constraints(
        &self,
        requirements: &[Requirement],
        extras: &[ExtraName],
    ) -> Result<Vec<(ResolveNode, Ranges<Version>)>, WheelResolveError> {
        let mut constraints = Vec::new();
        for requirement in requirements {
            if !self.target.applies(requirement, extras) {
                continue;
            }
            let range = match &requirement.version_or_url {
                None => Ranges::full(),
                Some(VersionOrUrl::VersionSpecifier(specifiers)) => specifiers_ranges(specifiers),
                Some(VersionOrUrl::Url(_)) => {
                    return Err(WheelResolveError::UrlRequirement(requirement.to_string()));
                }
            };
            constraints.push((
                ResolveNode::Package(requirement.name.clone()),
                range.clone(),
            ));
            for extra in &requirement.extras {
                // Extras of a conda-provided package are conda's to meet.
                if !self.provided.contains_key(&requirement.name) {
                    constraints.push((
                        ResolveNode::Extra(requirement.name.clone(), extra.clone()),
                        range.clone(),
                    ));
                }
            }
        }
        Ok(constraints)
    }
}

/// The project a distribution file belongs to.
fn file_project(filename: &str) -> Option<PackageName> {
    WheelName::parse(filename)
        .map(|w| w.name)
        .or_else(|| sdist_version(filename).map(|(name, _)| name))
}

/// `*.dist-info/METADATA` of a wheel file.
pub fn wheel_metadata(path: &Path) -> Result<String, String> {
    let file = fs_err::File::open(path).map_err(|e| e.to_string())?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| format!("is not a zip file: {e}"))?;
    let name = super::install::member_names(&archive)
        .into_iter()
        .find(|n| {
            n.strip_suffix("/METADATA")
                .is_some_and(|dir| dir.ends_with(".dist-info") && !dir.contains('/'))
        })
        .ok_or_else(|| "is missing: the wheel has no `*.dist-info/METADATA`".to_string())?;
    let bound = Bound::new(
        MAX_METADATA_BYTES,
        format!("`{name}`"),
        "the most METADATA may hold",
    );
    let entry = archive.by_name(&name).map_err(|e| e.to_string())?;
    let bytes = read_to_end_bounded(entry, bound).map_err(|e| match TooLarge::in_io(&e) {
        Some(too_large) => too_large.to_string(),
        None => format!("cannot be read: {e}"),
    })?;
    String::from_utf8(bytes).map_err(|_| "cannot be read: it is not UTF-8".to_string())
}

/// `project` as a refusal when no wheel it offers is in `range` but a source distribution is.
fn sdist_only(name: &PackageName, project: &Project, range: &Ranges<Version>) -> Option<SdistOnly> {
    let in_range = |v: &Version| range.contains(v);
    if project.candidates.iter().any(|c| in_range(&c.version)) {
        return None;
    }
    let files: Vec<String> = project
        .sdists
        .iter()
        .filter(|(v, _)| in_range(v))
        .map(|(_, f)| f.clone())
        .collect();
    (!files.is_empty()).then(|| SdistOnly {
        package: name.to_string(),
        files,
        wheel_versions: project
            .candidates
            .iter()
            .filter(|c| !c.file.yanked)
            .map(|c| c.version.to_string())
            .collect(),
    })
}

impl DependencyProvider for Provider<'_> {
    type P = ResolveNode;
    type V = Version;
    type VS = Ranges<Version>;
    type M = String;
    type Priority = u32;
    type Err = WheelResolveError;

    fn prioritize(
        &self,
        _package: &ResolveNode,
        _range: &Ranges<Version>,
        statistics: &PackageResolutionStatistics,
    ) -> u32 {
        // Packages that conflict often are decided first, as uv does.
        statistics.conflict_count()
    }

    fn choose_version(
        &self,
        node: &ResolveNode,
        range: &Ranges<Version>,
    ) -> Result<Option<Version>, WheelResolveError> {
        let name = match node {
            ResolveNode::Root => return Ok(Some(Version::new([0]))),
            ResolveNode::Package(name) | ResolveNode::Extra(name, _) => name,
        };
        if let Some(provided) = self.provided.get(name) {
            return Ok(range
                .contains(&provided.version)
                .then(|| provided.version.clone()));
        }
        let project = self.project(name)?;
        // PEP 592: a yanked file is taken only when pinned to exactly its version.
        let in_range: Vec<&Candidate> = project
            .candidates
            .iter()
            .filter(|c| range.contains(&c.version))
            .filter(|c| !c.file.yanked || super::ranges::is_pin(range, &c.version))
            .collect();
        // Pre-releases only when nothing else fits, as pip does.
        let chosen = in_range
            .iter()
            .find(|c| !c.version.any_prerelease())
            .or_else(|| in_range.first());
        if let Some(chosen) = chosen {
            return Ok(Some(chosen.version.clone()));
        }
        if !project.found {
            return Err(WheelResolveError::NotFound {
                package: name.to_string(),
                sources: self.sources.to_string(),
            });
        }
        if let Some(yanked) = project
            .candidates
            .iter()
            .find(|c| c.file.yanked && range.contains(&c.version))
        {
            return Err(WheelResolveError::Yanked {
                package: name.to_string(),
                version: yanked.version.to_string(),
            });
        }
        if let Some(sdist_only) = sdist_only(name, &project, range) {
            return Err(WheelResolveError::SdistOnly(vec![sdist_only]));
        }
        if project.candidates.is_empty() && !project.other_wheels.is_empty() {
            let wheel = &self.target.wheel;
            return Err(WheelResolveError::NoCompatibleWheel {
                package: name.to_string(),
                python: wheel.python.to_string(),
                platform: wheel.platform.to_string(),
                glibc: wheel
                    .glibc
                    .map_or("no glibc".to_string(), |(a, b)| format!("glibc {a}.{b}")),
                files: project.other_wheels.join(", "),
            });
        }
        Ok(None)
    }

    fn get_dependencies(
        &self,
        node: &ResolveNode,
        version: &Version,
    ) -> Result<Dependencies<ResolveNode, Ranges<Version>, String>, WheelResolveError> {
        let (name, extra) = match node {
            ResolveNode::Root => {
                let constraints = self.constraints(self.requirements, &[])?;
                self.prefetch(&constraints);
                self.refuse_sdist_only(&constraints)?;
                return Ok(Dependencies::Available(constraints.into_iter().collect()));
            }
            ResolveNode::Package(name) => (name, None),
            ResolveNode::Extra(name, extra) => (name, Some(extra)),
        };
        if self.provided.contains_key(name) {
            return Ok(Dependencies::Available(Vec::new().into_iter().collect()));
        }
        let candidate = self
            .candidate(name, version)
            .expect("versions are chosen from the project's candidates");
        let metadata = self.core_metadata(name, &candidate)?;
        if let Some(requires) = &metadata.requires_python
            && !self.target.python_allowed(requires)
        {
            return Ok(Dependencies::Unavailable(format!(
                "it requires Python {requires}"
            )));
        }
        let mut constraints = match extra {
            None => self.constraints(&metadata.requires_dist, &[])?,
            Some(extra) => {
                // `name[extra]` is `name` at the same version plus the extra's requirements.
                let mut constraints = vec![(
                    ResolveNode::Package(name.clone()),
                    Ranges::singleton(version.clone()),
                )];
                constraints.extend(
                    self.constraints(&metadata.requires_dist, std::slice::from_ref(extra))?,
                );
                constraints
            }
        };
        constraints
            .retain(|(n, _)| !matches!(n, ResolveNode::Package(p) if p == name && extra.is_none()));
        self.prefetch(&constraints);
        Ok(Dependencies::Available(constraints.into_iter().collect()))
    }
}

/// What a resolution needs.
pub struct ResolveInput<'a> {
    pub requirements: &'a [Requirement],
    pub sources: &'a Sources,
    pub target: &'a PythonTarget,
    pub provided: &'a BTreeMap<PackageName, Provided>,
    pub cache_dir: &'a Path,
    /// Told of the pages and wheels read, and of wheels skipped for glibc.
    pub reporter: &'a dyn BuildReporter,
}

/// Resolves `input.requirements`; wheels sorted by name. Runs the solver on a blocking
/// thread (it is synchronous; index requests run on the caller's runtime).
pub async fn resolve(input: ResolveInput<'_>) -> Result<Vec<ResolvedWheel>, WheelResolveError> {
    let client = crate::http::client()?;
    let handle = tokio::runtime::Handle::current();
    let provider = Provider {
        handle,
        client,
        cache_dir: input.cache_dir,
        sources: input.sources,
        target: input.target,
        tags: input.target.wheel.supported_tags(),
        newer_glibc_tags: newer_glibc_tags(&input.target.wheel),
        provided: input.provided,
        requirements: input.requirements,
        projects: RefCell::default(),
        metadata: RefCell::default(),
        find_links: RefCell::default(),
        prefetched: RefCell::default(),
        read_wheels: RefCell::default(),
        reporter: input.reporter,
    };
    // The solver blocks on index requests; `block_in_place` lets the runtime carry on.
    // The error is boxed: PubGrub's derivation tree makes it large.
    let solution = tokio::task::block_in_place(|| {
        pubgrub::resolve(&provider, ResolveNode::Root, Version::new([0])).map_err(Box::new)
    });
    let solution = match solution {
        Ok(solution) => solution,
        Err(err) => match *err {
            PubGrubError::NoSolution(tree) => {
                // The root is a node with the made-up version 0: never shown.
                let root = ResolveNode::Root.to_string();
                let mut report = DefaultStringReporter::report(&tree)
                    .replace(&format!("{root} 0 "), &format!("{root} "))
                    .replace(&format!("{root} 0,"), &format!("{root},"));
                // PubGrub knows a conda-provided distribution only as its one version: say
                // where that version comes from.
                for (name, conda) in input.provided {
                    if tree
                        .packages()
                        .contains(&ResolveNode::Package(name.clone()))
                    {
                        report.push_str(&format!(
                            "\nnote: {name} {} is provided by the conda package {}; a PyPI requirement on {name} must accept that version (or change the conda dependency)",
                            conda.version, conda.package
                        ));
                    }
                }
                return Err(WheelResolveError::NoSolution(report));
            }
            PubGrubError::ErrorChoosingVersion { source, .. }
            | PubGrubError::ErrorRetrievingDependencies { source, .. }
            | PubGrubError::ErrorInShouldCancel(source) => return Err(source),
        },
    };
    let mut wheels = Vec::new();
    for (node, version) in solution {
        let ResolveNode::Package(name) = node else {
            continue;
        };
        if provider.provided.contains_key(&name) {
            continue;
        }
        let candidate = provider
            .candidate(&name, &version)
            .expect("chosen from the candidates");
        let metadata = provider.core_metadata(&name, &candidate)?;
        let read = provider
            .read_wheels
            .borrow()
            .get(&candidate.file.url)
            .copied();
        let sha256 = match candidate.file.sha256.or(read) {
            Some(sha256) => sha256,
            // An index without hashes, a find-links directory: the lock pins what was read.
            None => {
                tokio::task::block_in_place(|| {
                    provider.handle.block_on(fetch_wheel(
                        &provider.client,
                        input.cache_dir,
                        &candidate.file.url,
                        &candidate.file.filename,
                        None,
                        input.reporter,
                    ))
                })?
                .1
            }
        };
        wheels.push(ResolvedWheel {
            name,
            version,
            filename: candidate.file.filename.clone(),
            url: candidate.file.url.clone(),
            sha256,
            index: candidate.index.clone(),
            requires_dist: metadata.requires_dist.clone(),
            requires_python: metadata.requires_python.clone(),
        });
    }
    wheels.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(warning) = glibc_warning(&provider, &wheels) {
        input.reporter.on_warning(&warning);
    }
    Ok(wheels)
}

/// The tags `target` would take if its glibc were as new as any: what tells a wheel
/// skipped for its glibc alone. `None` for a target without glibc.
fn newer_glibc_tags(target: &WheelTarget) -> Option<SupportedTags> {
    target.glibc?;
    let newest = WheelTarget {
        glibc: Some((2, NEWEST_GLIBC_MINOR)),
        ..target.clone()
    };
    Some(newest.supported_tags())
}

/// Higher than any glibc a wheel names yet (2.41 in 2025).
const NEWEST_GLIBC_MINOR: u64 = 99;

/// The glibc imgbuild assumes when a base has none to read, a `scratch` base's.
const ASSUMED_GLIBC: (u64, u64) = (2, 17);

/// Wheels shown in the glibc warning; the rest are counted.
const SHOWN_WHEELS: usize = 3;

/// When the image's glibc is the 2.17 assumed for a `scratch` base, a warning naming the
/// wheels it skipped that a newer glibc would have taken, of the versions resolved or
/// newer, and how to say the image's glibc.
fn glibc_warning(provider: &Provider<'_>, wheels: &[ResolvedWheel]) -> Option<String> {
    if provider.target.wheel.glibc != Some(ASSUMED_GLIBC) {
        return None;
    }
    let projects = provider.projects.borrow();
    let mut skipped: Vec<&str> = wheels
        .iter()
        .filter_map(|wheel| Some((wheel, projects.get(&wheel.name)?)))
        .flat_map(|(wheel, project)| {
            project
                .newer_glibc
                .iter()
                .filter(|(version, _)| *version >= wheel.version)
                .map(|(_, file)| file.as_str())
        })
        .collect();
    if skipped.is_empty() {
        return None;
    }
    skipped.sort_unstable();
    let needed = skipped
        .iter()
        .filter_map(|file| wheel_glibc(file))
        .max()
        .unwrap_or(ASSUMED_GLIBC.1 + 1);
    let shown: Vec<String> = skipped
        .iter()
        .take(SHOWN_WHEELS)
        .map(|f| format!("`{f}`"))
        .collect();
    let more = match skipped.len().saturating_sub(SHOWN_WHEELS) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "wheels for a newer glibc than 2.17 were skipped: {}{more}. imgbuild takes the image's \
         glibc to be 2.17 when its base has none to read (a `scratch` base); if the image runs \
         on a newer one, say so in the recipe, e.g. `[image] glibc = \"2.{needed}\"`, which \
         all of these need",
        shown.join(", ")
    ))
}

/// The newest glibc minor version a wheel's `manylinux_2_X` tags need at the least: the
/// lowest of its tags (a wheel tagged for several runs on the oldest).
fn wheel_glibc(file: &str) -> Option<u64> {
    WheelName::parse(file)?
        .tags
        .iter()
        .filter_map(|(_, _, platform)| {
            let rest = platform.strip_prefix("manylinux_2_")?;
            rest.split('_').next()?.parse().ok()
        })
        .min()
}
