//! What an imported lock pins, turned into a recipe and an imgbuild lock that holds exactly
//! those pins. pixi.lock, conda-lock.yml and `@EXPLICIT` files each read into [`Pins`];
//! from there one path writes the recipe, builds the [`Lock`] for the recipe's own targets
//! and holds it to the checks `build --locked` makes, so an import that would not build is
//! refused here, naming the reason, rather than at build time.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use rattler_conda_types::{
    MatchSpec, PackageName, ParseStrictness, RepoDataRecord, Subdir, Version,
};
use rattler_solve::ChannelPriority;

use super::{InitError, InitRecipe, checked_recipe, comment_text, cuda::cuda_section, quote};
use crate::{
    lock::{Lock, LockedBase, PlatformLock, ResolvedWheel},
    recipe::{OciPlatform, Recipe},
    resolve::Target,
};

/// One environment of an imported lock, as plain data.
#[derive(Debug, Clone, Default)]
pub(super) struct Pins {
    /// Channel base URLs, in the lock's priority order.
    pub channels: Vec<String>,
    pub channel_priority: Option<ChannelPriority>,
    /// The Linux platforms, each with its pins.
    pub platforms: Vec<PinnedPlatform>,
    /// Platforms of the lock that are not Linux, left out.
    pub dropped_platforms: Vec<String>,
    /// The PyPI indexes wheels were locked from; empty when the lock has no wheels.
    pub pypi_indexes: Vec<url::Url>,
    /// Whether the conda packages carry their dependencies (an `@EXPLICIT` file's do not):
    /// with them, the recipe asks for the lock's top-level packages; without, for every one.
    pub has_dependencies: bool,
}

/// The packages one platform pins.
#[derive(Debug, Clone)]
pub(super) struct PinnedPlatform {
    pub subdir: Subdir,
    pub records: Vec<RepoDataRecord>,
    pub wheels: Vec<ResolvedWheel>,
}

/// A recipe and the lock text that goes beside it.
#[derive(Debug, Clone)]
pub struct ImportedLock {
    pub recipe: InitRecipe,
    /// The lock file's text, for `recipe.lock` beside the recipe.
    pub lock: String,
}

/// Splits a lock's platform names into the Linux subdirs an image can be and the others.
pub(super) fn linux_platform(name: &str) -> Option<Subdir> {
    name.parse::<Subdir>()
        .ok()
        .filter(|subdir| OciPlatform::of(*subdir).is_some())
}

impl Pins {
    /// The recipe (written as if at `recipe_path`) and its lock. `name` is the image name,
    /// `file_name` the input's, for comments and notes; `notes` are the reader's so far.
    pub(super) fn into_import(
        self,
        input: &Path,
        recipe_path: &Path,
        name: &str,
        mut notes: Vec<String>,
    ) -> Result<ImportedLock, InitError> {
        let file_name = file_name(input);
        self.check_unique(input)?;
        if self.platforms.is_empty() {
            return Err(InitError::Import {
                path: input.to_path_buf(),
                reason: "it pins no Linux platform (an image runs Linux)".to_string(),
            });
        }
        if !self.dropped_platforms.is_empty() {
            notes.push(format!(
                "{} of {file_name} {} not Linux (an image runs Linux); left out of [image] platforms and the lock",
                self.dropped_platforms
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if self.dropped_platforms.len() == 1 { "is" } else { "are" },
            ));
        }
        let text = self.recipe_text(&file_name, name, &mut notes);
        let recipe = checked_recipe(&text, recipe_path, input)?;
        let lock = self.lock_for(&recipe);
        let wanted: Vec<(Target, LockedBase)> = lock
            .platforms
            .iter()
            .map(|p| (p.target.clone(), LockedBase::Scratch))
            .collect();
        // What `build --locked` asks of a lock, asked now: the import must build as it is.
        lock.check(&recipe, &wanted)
            .map_err(|reason| InitError::Import {
                path: input.to_path_buf(),
                reason: format!("its pins would not build as locked: {reason}"),
            })?;
        lock.check_sources(&recipe, input)
            .map_err(|source| InitError::Lock(Box::new(source)))?;
        let lock_dir = recipe_path.parent().unwrap_or(Path::new("."));
        let recipe_file = file_name_of(recipe_path);
        let lock_text = lock
            .render(&recipe_file, lock_dir)
            .map_err(|source| InitError::Lock(Box::new(source)))?;
        Ok(ImportedLock {
            recipe: InitRecipe { text, notes },
            lock: lock_text,
        })
    }

    /// A package named twice for one platform is two claims on one name: refused.
    fn check_unique(&self, input: &Path) -> Result<(), InitError> {
        for platform in &self.platforms {
            let mut seen = BTreeSet::new();
            let names = platform
                .records
                .iter()
                .map(|r| r.package_record.name.as_normalized().to_string())
                .chain(platform.wheels.iter().map(|w| format!("{} (PyPI)", w.name)));
            for name in names {
                if !seen.insert(name.clone()) {
                    return Err(InitError::Import {
                        path: input.to_path_buf(),
                        reason: format!(
                            "it pins `{name}` twice for `{}`; a lock pins one build of each package",
                            platform.subdir
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The recipe's text: `[image]`, `[cuda]` from the pinned CUDA, `[conda]` asking for the
    /// pinned packages, `[pypi]` for the wheels.
    fn recipe_text(&self, file_name: &str, name: &str, notes: &mut Vec<String>) -> String {
        let platforms: Vec<String> = self
            .platforms
            .iter()
            .map(|p| quote(p.subdir.as_str()))
            .collect();
        let mut text = format!(
            "# Made by `imgbuild init --from {file_name}`: its pins are in the lock beside this file,\n\
             # used as they are by `imgbuild build --locked`. `imgbuild lock` would solve again.\n\n\
             [image]\nname = {name}\n\
             # The lock pins `scratch` (an empty base): a base with glibc (\"docker.io/library/debian:12-slim\",\n\
             # what the shipped recipes use) is pinned by digest when `imgbuild lock` solves for it.\n\
             base = \"scratch\"\n\
             platforms = [{platforms}]\n",
            file_name = comment_text(file_name),
            name = quote(name),
            platforms = platforms.join(", "),
        );
        if let Some(glibc) = self.needed_glibc() {
            text.push_str(&format!(
                "glibc = {}                 # the newest `__glibc` a pinned package asks for\n",
                quote(&glibc.to_string())
            ));
        }
        // On `scratch` the environment's python cannot start (no glibc loader), and the
        // build refuses an entrypoint that cannot: it waits for a base.
        text.push_str(
            "# entrypoint = [\"/opt/conda/bin/python\"]   # with a glibc base (the build checks it)\n",
        );
        let specs = self.conda_specs();
        let parsed: Vec<MatchSpec> = specs
            .iter()
            .filter_map(|s| MatchSpec::from_str(s, ParseStrictness::Lenient).ok())
            .collect();
        let cuda_specs: Vec<MatchSpec> = self.all_records().map(pinned_spec).collect();
        let cuda_refs: Vec<&MatchSpec> = cuda_specs.iter().collect();
        text.push_str(&cuda_section(&cuda_refs, notes));
        text.push_str(&self.conda_text(&parsed));
        text.push_str(&self.pypi_text());
        text
    }

    fn all_records(&self) -> impl Iterator<Item = &RepoDataRecord> {
        self.platforms.iter().flat_map(|p| p.records.iter())
    }

    /// The `[conda]` section.
    fn conda_text(&self, specs: &[MatchSpec]) -> String {
        let mut text = String::from("\n[conda]\nchannels = [\n");
        for channel in &self.channels {
            text.push_str(&format!("    {},\n", quote(channel)));
        }
        text.push_str(if self.has_dependencies {
            "]\n# The lock's top-level packages (none of the others depends on them), at their\n\
             # locked versions; the lock pins them and everything they need.\ndependencies = [\n"
        } else {
            "]\n# Every pinned package: the file records no dependencies, so each is asked for.\n\
             dependencies = [\n"
        });
        for spec in specs {
            text.push_str(&format!("    {},\n", quote(&spec.to_string())));
        }
        text.push_str("]\n");
        if self.channel_priority == Some(ChannelPriority::Disabled) {
            text.push_str("channel-priority = \"disabled\"\n");
        }
        text
    }

    /// The `[pypi]` section: the lock's indexes and every pinned wheel at its version (a
    /// wheel's dependencies hold markers, so which of them are top-level depends on the
    /// target; asking for each is exact on every one).
    fn pypi_text(&self) -> String {
        let mut wheels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for wheel in self.platforms.iter().flat_map(|p| &p.wheels) {
            wheels
                .entry(wheel.name.to_string())
                .or_default()
                .insert(wheel.version.to_string());
        }
        if wheels.is_empty() {
            return String::new();
        }
        let mut text = String::from("\n[pypi]\n");
        if let Some((first, rest)) = self.pypi_indexes.split_first() {
            text.push_str(&format!("index-url = {}\n", quote(first.as_str())));
            if !rest.is_empty() {
                let rest: Vec<String> = rest.iter().map(|u| quote(u.as_str())).collect();
                text.push_str(&format!("extra-index-urls = [{}]\n", rest.join(", ")));
            }
        }
        text.push_str("dependencies = [\n");
        for (name, versions) in &wheels {
            // One version on every platform: pinned; else the name alone.
            let requirement = match versions.iter().collect::<Vec<_>>().as_slice() {
                [version] => format!("{name}=={version}"),
                _ => name.clone(),
            };
            text.push_str(&format!("    {},\n", quote(&requirement)));
        }
        text.push_str("]\n");
        text
    }

    /// The conda specs of the recipe, sorted by name: the top-level packages (or every one
    /// without dependency data), each at its version when every platform pins the same.
    fn conda_specs(&self) -> Vec<String> {
        let mut versions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for platform in &self.platforms {
            let asked = match self.has_dependencies {
                true => top_level(&platform.records),
                false => platform.records.iter().collect(),
            };
            for record in asked {
                versions
                    .entry(record.package_record.name.as_normalized().to_string())
                    .or_default()
                    .insert(record.package_record.version.to_string());
            }
        }
        versions
            .into_iter()
            .map(
                |(name, versions)| match versions.iter().collect::<Vec<_>>().as_slice() {
                    [version] => format!("{name} =={version}"),
                    _ => name,
                },
            )
            .collect()
    }

    /// The newest glibc a pinned package asks for with `__glibc >=X`, when it is newer than
    /// the default target's (2.17); `None` keeps the default.
    fn needed_glibc(&self) -> Option<Version> {
        let default: Version = "2.17".parse().expect("a version");
        self.all_records()
            .flat_map(|r| &r.package_record.depends)
            .filter_map(|dependency| {
                let rest = dependency.strip_prefix("__glibc")?.trim_start();
                let lower = rest.strip_prefix(">=")?;
                let lower = lower.split([',', ' ', '|']).next()?;
                lower.parse::<Version>().ok()
            })
            .filter(|v| *v > default)
            .max()
    }

    /// The lock for `recipe`: each platform with the recipe's target, on scratch.
    fn lock_for(&self, recipe: &Recipe) -> Lock {
        let mut platforms: Vec<PlatformLock> = self
            .platforms
            .iter()
            .map(|p| {
                let mut records = p.records.clone();
                records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
                let mut wheels = p.wheels.clone();
                wheels.sort_by(|a, b| a.name.cmp(&b.name));
                PlatformLock {
                    target: Target::for_recipe(recipe, p.subdir, None),
                    base: LockedBase::Scratch,
                    records,
                    wheels,
                }
            })
            .collect();
        platforms.sort_by(|a, b| a.target.platform.as_str().cmp(b.target.platform.as_str()));
        Lock::for_recipe(recipe, platforms)
    }
}

/// The packages of `records` that none of the others depends on, and of each cycle
/// among the rest one, so that walking their dependencies reaches every package.
fn top_level(records: &[RepoDataRecord]) -> Vec<&RepoDataRecord> {
    let by_name: BTreeMap<&PackageName, &RepoDataRecord> = records
        .iter()
        .map(|r| (&r.package_record.name, r))
        .collect();
    let needs = |record: &RepoDataRecord| -> Vec<&PackageName> {
        record
            .package_record
            .depends
            .iter()
            .filter_map(|d| MatchSpec::from_str(d, ParseStrictness::Lenient).ok())
            .filter_map(|spec| {
                let name = spec.name.as_exact()?;
                by_name.get_key_value(name).map(|(name, _)| *name)
            })
            .collect()
    };
    let needed: BTreeSet<&PackageName> = records.iter().flat_map(needs).collect();
    let mut top: Vec<&RepoDataRecord> = records
        .iter()
        .filter(|r| !needed.contains(&r.package_record.name))
        .collect();
    // A cycle no other package needs has no top: take its first package, and repeat.
    let mut reached: BTreeSet<&PackageName> = BTreeSet::new();
    let mut queue: Vec<&RepoDataRecord> = top.clone();
    loop {
        while let Some(record) = queue.pop() {
            if reached.insert(&record.package_record.name) {
                queue.extend(
                    needs(record)
                        .into_iter()
                        .filter_map(|n| by_name.get(n).copied()),
                );
            }
        }
        match records
            .iter()
            .find(|r| !reached.contains(&r.package_record.name))
        {
            Some(record) => {
                top.push(record);
                queue.push(record);
            }
            None => break,
        }
    }
    top
}

/// `name ==version build` for a record: the spec [`cuda_section`] reads CUDA from.
fn pinned_spec(record: &RepoDataRecord) -> MatchSpec {
    let text = format!(
        "{} =={} {}",
        record.package_record.name.as_normalized(),
        record.package_record.version,
        record.package_record.build
    );
    MatchSpec::from_str(&text, ParseStrictness::Lenient).unwrap_or_else(|_| {
        MatchSpec::from_str(
            record.package_record.name.as_normalized(),
            ParseStrictness::Lenient,
        )
        .expect("a package name is a spec")
    })
}

pub(super) fn file_name(path: &Path) -> String {
    file_name_of(path)
}

fn file_name_of(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}
