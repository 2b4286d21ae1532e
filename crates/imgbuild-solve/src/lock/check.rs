//! Whether a lock still fits its recipe: staleness (the lock was solved for something else
//! and must be re-solved) and provenance (the lock pins a package from outside the recipe's
//! sources and must not be used at all).

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::Path,
};

use rattler_conda_types::{
    GenericVirtualPackage, MatchSpec, Matches, PackageName, ParseStrictness, RepoDataRecord, Subdir,
};
use rattler_solve::ChannelPriority;

use super::{Lock, LockError, LockedBase, PlatformLock, ResolvedWheel};
use crate::{
    python::PythonTarget,
    recipe::pypi::{FindLinks, PypiRecipe, Sources},
    recipe::{Recipe, lexical_path},
    resolve::Target,
};

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
    /// A `[[files]]` source differs from what the lock pins: `None` where one side has
    /// no such source.
    Sources {
        src: String,
        locked: Option<String>,
        wanted: Option<String>,
    },
    /// A `[[models]]` file differs from what the lock pins: `None` where one side lacks it.
    Model {
        model: String,
        path: String,
        locked: Option<String>,
        wanted: Option<String>,
    },
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
            Staleness::Sources {
                src,
                locked,
                wanted,
            } => match (locked, wanted) {
                (Some(locked), Some(wanted)) => write!(
                    f,
                    "`[[files]]` source `{src}` changed (locked {}…, now {}…)",
                    short_digest(locked),
                    short_digest(wanted)
                ),
                (Some(_), None) => {
                    write!(f, "`[[files]]` source `{src}` is no longer in the recipe")
                }
                _ => write!(f, "`[[files]]` source `{src}` is not in the lock"),
            },
            Staleness::Model {
                model,
                path,
                locked,
                wanted,
            } => match (locked, wanted) {
                (Some(locked), Some(wanted)) => write!(
                    f,
                    "file `{path}` of model `{model}` changed (locked {locked}, now {wanted})"
                ),
                (Some(_), None) => write!(f, "file `{path}` of model `{model}` is no longer there"),
                _ => write!(f, "file `{path}` of model `{model}` is not in the lock"),
            },
            Staleness::OnPlatform { platform, reason } => write!(f, "{platform}: {reason}"),
        }
    }
}

/// `sha256:` and the first 12 hex digits, enough to tell two digests apart in a message.
fn short_digest(digest: &str) -> &str {
    &digest[..digest.len().min("sha256:".len() + 12)]
}

/// The priority as the recipe and the lock file spell it.
fn priority_name(priority: ChannelPriority) -> &'static str {
    match priority {
        ChannelPriority::Strict => "strict",
        ChannelPriority::Disabled => "disabled",
        ChannelPriority::Flexible => "flexible",
    }
}

impl Lock {
    /// Checks that this lock still satisfies `recipe` for `wanted`, the target and base of
    /// each of the recipe's platforms; the first reason it does not is returned.
    pub fn check(&self, recipe: &Recipe, wanted: &[(Target, LockedBase)]) -> Result<(), Staleness> {
        self.check_platforms(wanted)?;
        let multi = wanted.len() > 1;
        for (target, base) in wanted {
            let locked = self
                .platform(target.platform)
                .expect("the platform sets are equal");
            // Virtual packages first: a changed target explains a changed solution.
            let result = locked
                .check_target(target)
                .and_then(|()| self.check_channels(recipe))
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

    /// The lock has exactly the platforms of `wanted`.
    fn check_platforms(&self, wanted: &[(Target, LockedBase)]) -> Result<(), Staleness> {
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
        Ok(())
    }

    /// The lock has the recipe's channels (trailing `/` aside), used in its priority.
    fn check_channels(&self, recipe: &Recipe) -> Result<(), Staleness> {
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
        if normalise(&self.channels) != normalise(&wanted_channels) {
            return Err(Staleness::Channels {
                locked: self.channels.clone(),
                wanted: wanted_channels,
            });
        }
        // The same channels in another priority can choose other packages, which the
        // closure check cannot see.
        if self.channel_priority != recipe.channel_priority {
            return Err(Staleness::ChannelPriority {
                locked: self.channel_priority,
                wanted: recipe.channel_priority,
            });
        }
        Ok(())
    }

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

/// A requirement to meet in the walk of the locked wheels: the extras it is evaluated
/// with, and who asked (for the message).
type Asked<'a> = (
    &'a pep508_rs::Requirement,
    Vec<pep508_rs::ExtraName>,
    String,
);

impl PlatformLock {
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
        wanted: Option<&PypiRecipe>,
        locked: Option<&Sources>,
    ) -> Result<(), Staleness> {
        let Some(wanted) = same_pypi_sources(wanted, locked)? else {
            return Ok(());
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
        let reached = self.wheels_reached(&wanted.requirements, &python)?;
        if let Some(extra) = self.wheels.iter().find(|w| !reached.contains(&w.name)) {
            return Err(Staleness::Pypi(format!(
                "locked PyPI package `{}` is no longer needed by the recipe's `[pypi]` dependencies",
                extra.name
            )));
        }
        Ok(())
    }

    /// The locked wheels reached from `requirements` through their dependencies, each
    /// requirement met by a conda package's or a wheel's version; the first one not met is
    /// the reason the lock is stale.
    fn wheels_reached<'a>(
        &'a self,
        requirements: &'a [pep508_rs::Requirement],
        python: &PythonTarget,
    ) -> Result<BTreeSet<&'a pep508_rs::PackageName>, Staleness> {
        let provided = crate::python::provided(&self.records);
        let by_name: HashMap<&pep508_rs::PackageName, &ResolvedWheel> =
            self.wheels.iter().map(|w| (&w.name, w)).collect();
        let mut reached: BTreeSet<&pep508_rs::PackageName> = BTreeSet::new();
        let mut queue: Vec<Asked<'a>> = requirements
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
                    return Err(Staleness::Pypi(format!(
                        "{asker} needs the PyPI package `{requirement}`, which is not locked"
                    )));
                }
            };
            check_version(requirement, &version, &asker)?;
            let Some(&wheel) = by_name.get(&requirement.name) else {
                continue; // conda's own dependencies are conda's to meet
            };
            let fresh = reached.insert(&wheel.name);
            let mut new_extras = Vec::new();
            for extra in &requirement.extras {
                if visited_extras.insert((wheel.name.to_string(), extra.to_string())) {
                    new_extras.push(extra.clone());
                }
            }
            queue.extend(dependencies_asked(wheel, fresh, &new_extras, python));
        }
        Ok(reached)
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
                if let Some(dep) =
                    locked_dependency(record, dependency, &by_name, virtual_packages)?
                {
                    queue.push(dep);
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

/// The recipe's `[pypi]` section when the lock has one too, from the same sources; `None`
/// when neither has one.
fn same_pypi_sources<'a>(
    wanted: Option<&'a PypiRecipe>,
    locked: Option<&Sources>,
) -> Result<Option<&'a PypiRecipe>, Staleness> {
    let stale = |reason: String| Err(Staleness::Pypi(reason));
    match (wanted, locked) {
        (None, None) => Ok(None),
        (None, Some(_)) => stale("the recipe no longer has a `[pypi]` section".into()),
        (Some(_), None) => stale("the recipe has a new `[pypi]` section".into()),
        (Some(wanted), Some(locked)) => {
            if &wanted.sources != locked {
                return stale(format!(
                    "the PyPI sources changed: locked {}, the recipe has {}",
                    locked, wanted.sources
                ));
            }
            Ok(Some(wanted))
        }
    }
}

/// `version`, the one locked for `requirement`'s package, meets it.
fn check_version(
    requirement: &pep508_rs::Requirement,
    version: &pep440_rs::Version,
    asker: &str,
) -> Result<(), Staleness> {
    let satisfied = match &requirement.version_or_url {
        Some(pep508_rs::VersionOrUrl::VersionSpecifier(specifiers)) => {
            crate::python::ranges::specifiers_ranges(specifiers).contains(version)
        }
        _ => true,
    };
    if !satisfied {
        return Err(Staleness::Pypi(format!(
            "{asker} needs `{requirement}`, but {} {version} is locked",
            requirement.name
        )));
    }
    Ok(())
}

/// The dependencies of `wheel` still to meet: all that apply without extras when the wheel
/// is reached for the first time (`fresh`), and those that `new_extras` bring.
fn dependencies_asked<'a>(
    wheel: &'a ResolvedWheel,
    fresh: bool,
    new_extras: &[pep508_rs::ExtraName],
    python: &PythonTarget,
) -> Vec<Asked<'a>> {
    let asker = format!("locked PyPI package `{} {}`", wheel.name, wheel.version);
    let mut asked = Vec::new();
    for dependency in &wheel.requires_dist {
        if fresh && python.applies(dependency, &[]) {
            asked.push((dependency, Vec::new(), asker.clone()));
        }
        for extra in new_extras {
            if python.applies(dependency, std::slice::from_ref(extra)) {
                asked.push((dependency, vec![extra.clone()], asker.clone()));
            }
        }
    }
    asked
}

/// The locked package that meets `dependency` of `record`: `None` when there is none to
/// walk to (a spec without one exact name, or a virtual package the target has), an error
/// when nothing locked meets it.
fn locked_dependency<'a>(
    record: &RepoDataRecord,
    dependency: &str,
    by_name: &HashMap<&PackageName, &'a RepoDataRecord>,
    virtual_packages: &[GenericVirtualPackage],
) -> Result<Option<&'a RepoDataRecord>, Staleness> {
    let unsatisfied = || Staleness::UnsatisfiedDependency {
        package: format!(
            "{}-{}-{}",
            record.package_record.name.as_normalized(),
            record.package_record.version,
            record.package_record.build
        ),
        dependency: dependency.to_string(),
    };
    let spec =
        MatchSpec::from_str(dependency, ParseStrictness::Lenient).map_err(|_| unsatisfied())?;
    let Some(name) = spec.name.as_exact() else {
        return Ok(None);
    };
    if name.as_normalized().starts_with("__") {
        if virtual_packages.iter().any(|v| spec.matches(v)) {
            return Ok(None);
        }
        return Err(unsatisfied());
    }
    match by_name.get(name) {
        Some(&dep) if spec.matches(dep) => Ok(Some(dep)),
        _ => Err(unsatisfied()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::fixtures::{platform_lock, recipe, two_platform_lock, wanted};
    use super::*;

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
}
