//! The build pipeline, top to bottom: recipe → base → target → lock (reuse or solve) →
//! install → layer plan → layer blobs → config and manifest → `index.json` switch.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rattler_conda_types::{RepoDataRecord, Subdir};
use rattler_shell::{activation::Activator, shell};
use url::Url;

use crate::{
    cuda::{RuntimeMismatch, compat::Support},
    install::{InstallError, InstallOptions, install_reporting},
    layers::{
        BuiltLayer,
        cache::LayerCache,
        compress::CompressPool,
        plan::PlanError,
        plan_layers,
        write::{LayerWriter, WriteError},
    },
    lock::{Lock, LockError, LockedBase, PlatformLock, Staleness},
    oci::{
        base::{BaseError, BaseImage, GlibcError, detect_glibc, open_base},
        image::{Activation, ImageError, ImageInputs, index_of, tag_entries, write_image},
        layout::{Layout, LayoutError},
    },
    rebuild::{BuildInputs, BuildRecord, BuildRecords, unchanged_image},
    recipe::{Base, Recipe, RecipeError, RecipeOptions, oci_architecture},
    registry::{
        ClientOptions, Reference, RepositoryClient,
        pull::{PullError, pull_base},
    },
    resolve::{ResolveError, ResolveOptions, Target, resolve_recipe},
    smoke::embed::{self, EmbedError, SmokeExecutable, SmokeExecutables},
};

impl From<crate::pypi::PypiError> for BuildError {
    fn from(err: crate::pypi::PypiError) -> Self {
        BuildError::Pypi(Box::new(err))
    }
}

/// How to treat an existing lock file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockMode {
    /// Use the lock if it still satisfies the recipe, else solve and rewrite it.
    #[default]
    Reuse,
    /// Use the lock; fail if it is missing or no longer satisfies the recipe.
    Locked,
    /// Always solve and rewrite the lock.
    Refresh,
}

/// Settings of one build, resolved from the command line and environment.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    pub recipe_path: PathBuf,
    pub channel_alias: Url,
    pub cache_dir: PathBuf,
    /// The layout directory; `images/<name>` under the working directory when `None`.
    pub output: Option<PathBuf>,
    pub lock_mode: LockMode,
    pub offline: bool,
    /// Layers compressed at once.
    pub jobs: usize,
    /// `SOURCE_DATE_EPOCH`, if set: the image's `created` time.
    pub source_date_epoch: Option<i64>,
    /// How to reach registries (bases).
    pub registry: ClientOptions,
    /// The matrix variant to build, for a recipe with a `[matrix]`.
    pub variant: Option<crate::recipe::matrix::Variant>,
    /// The `imgbuild-smoke` executables for `[smoke] embed = true`, one per architecture;
    /// default: those beside imgbuild.
    pub smoke_exe: Vec<PathBuf>,
}

// Progress reporting lives in `report`, below the stages that report; re-exported here,
// where callers of `build` look for it.
pub use crate::report::{Reporter, Silent, Stage};

/// How the lock was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    Reused,
    Written { reason: Option<String> },
}

/// The result of `lock`.
#[derive(Debug, Clone)]
pub struct LockReport {
    pub lock_path: PathBuf,
    pub outcome: LockOutcome,
    pub packages: usize,
}

/// The result of `build`.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub layout_dir: PathBuf,
    pub tags: Vec<String>,
    /// What the tags name: the manifest, or the image index of a multi-platform image.
    pub manifest_digest: String,
    /// Each platform's manifest digest, in the recipe's order.
    pub platforms: Vec<(Subdir, String)>,
    pub base_layers: usize,
    pub layers: Vec<BuiltLayer>,
    pub lock: LockReport,
    pub timings: Vec<(Stage, Duration)>,
    /// The SPDX and CycloneDX SBOMs written beside the layout.
    pub sboms: Vec<PathBuf>,
    /// The inputs were those of the image already in the layout: nothing was rebuilt.
    pub unchanged: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Base(#[from] BaseError),
    #[error(
        "The PyPI requirements must be resolved (`{}` is missing or out of date), which asks their package index: not possible with `--offline`; run `imgbuild lock` online once, or use `no-index = true` with local `find-links`", path.display()
    )]
    PypiOffline { path: PathBuf },
    // Boxed: resolver errors carry URLs and reasons.
    #[error(transparent)]
    Pypi(Box<crate::pypi::PypiError>),
    #[error(transparent)]
    Glibc(#[from] GlibcError),
    #[error(transparent)]
    Pull(#[from] PullError),
    #[error(transparent)]
    Auth(#[from] crate::registry::auth::AuthError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("Lock file `{}` does not exist and `--locked` forbids creating it", path.display())]
    LockMissing { path: PathBuf },
    #[error("Lock file `{}` no longer satisfies the recipe: {reason}; run `imgbuild lock` or drop `--locked`", path.display())]
    LockOutdated { path: PathBuf, reason: Staleness },
    #[error("Failed to install packages for `{name}`")]
    Install {
        name: String,
        #[source]
        source: InstallError,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    WriteLayer(#[from] WriteError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("Failed to create the staging directory in `{}`", path.display())]
    Staging {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to read the environment's activation")]
    Activation(#[source] rattler_shell::activation::ActivationError),
    #[error(transparent)]
    Sbom(#[from] crate::sbom::SbomError),
    #[error(transparent)]
    Smoke(#[from] EmbedError),
    #[error(transparent)]
    CudaRuntime(#[from] Box<RuntimeMismatch>),
    /// A library runs on none of `[cuda] architectures`.
    #[error(transparent)]
    GpuArchitectures(#[from] Box<crate::cuda::fatbin::NotCovered>),
}

impl BuildError {
    /// 1 when the input is at fault (recipe, packages, lock, base), 2 when the machine is
    /// (disk, permissions). Documented in the README.
    pub fn exit_code(&self) -> i32 {
        if crate::fs::is_disk_full(self) {
            return 2;
        }
        match self {
            BuildError::Layout(LayoutError::NotALayout { .. }) => 1,
            BuildError::Layout(_) | BuildError::Staging { .. } => 2,
            BuildError::Lock(LockError::Write { .. }) => 2,
            BuildError::Sbom(_) => 2,
            BuildError::Smoke(EmbedError::Stage { .. }) => 2,
            _ => 1,
        }
    }
}

/// `seconds` since the epoch as an RFC 3339 UTC time, for `created`. Civil time, because
/// jiff's `Timestamp` ends a day before 9999-12-31T23:59:59Z (the last `SOURCE_DATE_EPOCH`
/// accepted), where the image would silently say 1970.
fn rfc3339_utc(seconds: i64) -> String {
    let epoch = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0);
    epoch
        .checked_add(jiff::SignedDuration::from_secs(seconds.max(0)))
        .unwrap_or(epoch)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Everything known about a recipe before solving.
struct Prepared {
    recipe: Recipe,
    /// One per platform of the recipe, in its order.
    platforms: Vec<PreparedPlatform>,
}

/// What one platform of the image starts from.
struct PreparedPlatform {
    platform: Subdir,
    base: Option<BaseImage>,
    target: Target,
    locked_base: LockedBase,
    /// The executable `[smoke] embed = true` puts into this platform's image, checked
    /// against it.
    smoke: Option<SmokeExecutable>,
}

impl Prepared {
    /// What `value` gives for each platform that has one, `,`-joined in platform order.
    fn joined<'a>(&'a self, value: impl Fn(&'a PreparedPlatform) -> Option<&'a str>) -> String {
        let values: Vec<&str> = self.platforms.iter().filter_map(value).collect();
        values.join(",")
    }

    /// What a lock must hold for this recipe: each platform's target and base.
    fn wanted(&self) -> Vec<(Target, LockedBase)> {
        self.platforms
            .iter()
            .map(|p| (p.target.clone(), p.locked_base.clone()))
            .collect()
    }
}

async fn prepare(settings: &BuildSettings) -> Result<Prepared, BuildError> {
    let options = RecipeOptions {
        channel_alias: settings.channel_alias.clone(),
        variant: settings.variant.clone(),
    };
    let recipe = Recipe::load(&settings.recipe_path, &options)?;
    // Read once; checked against each platform before solving, so a smoke executable that
    // cannot run in one of the images fails now.
    let smoke = match recipe.embed_smoke {
        true => Some(SmokeExecutables::find(&settings.smoke_exe)?),
        false => None,
    };
    let mut platforms = Vec::with_capacity(recipe.platforms.len());
    for platform in recipe.platforms.iter() {
        // A base that is an index gives each platform its own manifest.
        let base = match &recipe.base {
            Base::Registry(reference) => Some(pull(&recipe, reference, platform, settings).await?),
            other => open_base(other, platform)?,
        };
        // The base's glibc bounds what the environment may need, unless the recipe says.
        let base_glibc = match (&recipe.glibc, &base) {
            (None, Some(base)) => detect_glibc(base)?,
            _ => None,
        };
        let smoke = match &smoke {
            Some(smoke) => Some(
                smoke
                    .for_platform(platform, recipe.glibc.as_ref().or(base_glibc.as_ref()))?
                    .clone(),
            ),
            None => None,
        };
        let target = Target::for_recipe(&recipe, platform, base_glibc.as_ref());
        let locked_base = base.as_ref().map_or(LockedBase::Scratch, |b| {
            LockedBase::Digest(b.manifest_digest.clone())
        });
        platforms.push(PreparedPlatform {
            platform,
            base,
            target,
            locked_base,
            smoke,
        });
    }
    Ok(Prepared { recipe, platforms })
}

/// Pulls a registry base into the cache, for `platform`. Offline, the digest pinned in the
/// lock is used, so a locked build needs no registry once the base is cached.
async fn pull(
    recipe: &Recipe,
    reference: &Reference,
    platform: Subdir,
    settings: &BuildSettings,
) -> Result<BaseImage, BuildError> {
    let mut reference = reference.clone();
    if settings.offline
        && reference.digest.is_none()
        && let Ok(Some(lock)) = Lock::read(&recipe.lock_path())
        && let Some(LockedBase::Digest(digest)) = lock.platform(platform).map(|p| &p.base)
    {
        reference = reference.with_digest(digest);
    }
    let credentials = crate::registry::auth::credentials_for(&reference.registry)?;
    let client =
        RepositoryClient::new(&reference, credentials, &settings.registry).map_err(|e| {
            BuildError::Pull(PullError::Registry {
                reference: reference.to_string(),
                source: Box::new(e),
            })
        })?;
    let (architecture, variant) = oci_architecture(platform).expect("validated platform");
    Ok(pull_base(
        &client,
        architecture,
        variant,
        &settings.cache_dir,
        settings.offline,
    )
    .await?)
}

/// Returns a lock that satisfies the recipe, solving and writing one when needed.
async fn obtain_lock(
    prepared: &Prepared,
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<(Lock, LockReport), BuildError> {
    let recipe = &prepared.recipe;
    let lock_path = recipe.lock_path();
    let existing = Lock::read(&lock_path)?;
    let staleness = match &existing {
        Some(lock) => lock.check(recipe, &prepared.wanted()).err(),
        None => None,
    };
    match (settings.lock_mode, existing, staleness) {
        (LockMode::Locked, None, _) => Err(BuildError::LockMissing { path: lock_path }),
        (LockMode::Locked, Some(_), Some(reason)) => Err(BuildError::LockOutdated {
            path: lock_path,
            reason,
        }),
        (LockMode::Locked | LockMode::Reuse, Some(lock), None) => {
            // Refused, not re-solved: a lock pinning packages from elsewhere was tampered with.
            lock.check_sources(recipe, &lock_path)?;
            check_cuda_runtimes(recipe, &lock.platforms, reporter)?;
            let packages = lock.package_count();
            Ok((
                lock,
                LockReport {
                    lock_path,
                    outcome: LockOutcome::Reused,
                    packages,
                },
            ))
        }
        (_, existing, staleness) => {
            let reason = match (existing.is_some(), staleness) {
                (_, Some(reason)) => Some(reason.to_string()),
                (true, None) => Some("refresh requested".to_string()),
                (false, None) => None,
            };
            reporter.on_stage(
                Stage::Solve,
                &format!(
                    "{} {} for {}",
                    recipe.specs.len(),
                    if recipe.specs.len() == 1 {
                        "dependency"
                    } else {
                        "dependencies"
                    },
                    recipe.platforms
                ),
            );
            if settings.offline
                && let Some(pypi) = &recipe.pypi
                && pypi.sources.needs_network()
            {
                return Err(BuildError::PypiOffline {
                    path: lock_path.clone(),
                });
            }
            // Each platform is solved on its own, for its own virtual packages.
            let mut platforms = Vec::with_capacity(prepared.platforms.len());
            for platform in &prepared.platforms {
                let mut records: Vec<RepoDataRecord> = resolve_recipe(
                    recipe,
                    &platform.target,
                    &ResolveOptions {
                        cache_dir: &settings.cache_dir,
                        offline: settings.offline,
                    },
                )
                .await?;
                // PyPI after conda: its Python, and what conda already provides, decide it.
                let wheels = match &recipe.pypi {
                    Some(pypi) => {
                        crate::pypi::lock_platform(
                            pypi,
                            &platform.target,
                            &mut records,
                            &settings.cache_dir,
                        )
                        .await?
                    }
                    None => Vec::new(),
                };
                platforms.push(PlatformLock {
                    target: platform.target.clone(),
                    base: platform.locked_base.clone(),
                    records,
                    wheels,
                });
            }
            // Before the lock is written: a runtime the image cannot run leaves no lock.
            check_cuda_runtimes(recipe, &platforms, reporter)?;
            let lock = Lock {
                channels: recipe
                    .channels
                    .iter()
                    .map(|c| c.base_url.to_string())
                    .collect(),
                channel_priority: recipe.channel_priority,
                platforms,
                pypi: recipe.pypi.as_ref().map(|p| p.sources.clone()),
            };
            let recipe_file = recipe.path.file_name().map_or_else(
                || recipe.path.display().to_string(),
                |f| f.to_string_lossy().into_owned(),
            );
            lock.write(&lock_path, &recipe_file)?;
            // Build from the lock as it reads back, not from the solver's records: the lock
            // keeps fewer fields (no `arch`/`platform`, which some channels leave to be
            // derived), and a build from a fresh solve must equal any later build from its
            // lock.
            let lock = Lock::read(&lock_path)?.ok_or_else(|| BuildError::LockMissing {
                path: lock_path.clone(),
            })?;
            let packages = lock.package_count();
            Ok((
                lock,
                LockReport {
                    lock_path,
                    outcome: LockOutcome::Written { reason },
                    packages,
                },
            ))
        }
    }
}

/// The CUDA runtimes each platform solved to, against the recipe's `[cuda]` (see
/// [`crate::cuda::check_runtime`]): one other than `[cuda] version` is an error (with
/// `compat`, one forward compatibility runs is a warning), and so is a CPU build of a GPU
/// framework that an older lock pins. A recipe without `[cuda]` whose
/// environment holds a runtime gets a warning showing the section it is built as if it had
/// (see [`crate::cuda::intent::derived_target`]). Warnings are said once for all platforms.
fn check_cuda_runtimes(
    recipe: &Recipe,
    platforms: &[PlatformLock],
    reporter: &dyn Reporter,
) -> Result<(), BuildError> {
    let mut warnings = std::collections::BTreeSet::new();
    for platform in platforms {
        match &recipe.cuda {
            Some(cuda) => {
                crate::cuda::check_no_cpu_builds(cuda, &platform.records)?;
                for runtime in platform.cuda_runtimes() {
                    warnings.extend(crate::cuda::check_runtime(cuda, &runtime)?);
                }
            }
            None => {
                if let Some(runtime) = platform.cuda_runtime() {
                    let derived = crate::cuda::intent::derived_target(&runtime);
                    warnings.insert(crate::cuda::intent::undeclared_runtime_warning(
                        &runtime, &derived,
                    ));
                }
            }
        }
    }
    for warning in warnings {
        reporter.on_warning(&warning);
    }
    Ok(())
}

/// Solves the recipe and writes its lock (always re-solving with [`LockMode::Refresh`]).
pub async fn lock(
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<LockReport, BuildError> {
    let prepared = prepare(settings).await?;
    obtain_lock(&prepared, settings, reporter)
        .await
        .map(|(_, report)| report)
}

/// Solves (or reuses) the recipe's lock and fetches its packages into the cache, without
/// building: the first step of a matrix build, taken one variant at a time.
pub async fn lock_and_fetch(settings: &BuildSettings) -> Result<(), BuildError> {
    let prepared = prepare(settings).await?;
    let (lock, _) = obtain_lock(&prepared, settings, &Silent).await?;
    for platform in &lock.platforms {
        crate::install::fetch_only(
            &platform.records,
            platform.target.platform,
            &InstallOptions {
                cache_dir: &settings.cache_dir,
            },
        )
        .await
        .map_err(|source| BuildError::Install {
            name: prepared.recipe.name.clone(),
            source,
        })?;
        crate::pypi::fetch_locked(&platform.wheels, &settings.cache_dir).await?;
    }
    Ok(())
}

/// Builds the image of a recipe into its layout directory: one image per platform, under an
/// image index when there are several.
pub async fn build(
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<BuildReport, BuildError> {
    let mut timings = Vec::new();
    let started = Instant::now();
    let prepared = prepare(settings).await?;
    let (lock, lock_report) = obtain_lock(&prepared, settings, reporter).await?;
    timings.push((Stage::Solve, started.elapsed()));
    let recipe = &prepared.recipe;
    let created_seconds = settings
        .source_date_epoch
        .unwrap_or_else(|| lock.newest_timestamp())
        .max(0);
    let base_layers: Vec<usize> = prepared
        .platforms
        .iter()
        .map(|p| p.base.as_ref().map_or(0, |b| b.layers.len()))
        .collect();
    let layout_dir = settings
        .output
        .clone()
        .unwrap_or_else(|| Path::new("images").join(&recipe.name));
    let has_base = prepared.platforms.iter().any(|p| p.base.is_some());
    let sbom_subject = crate::sbom::SbomSubject {
        name: recipe.name.clone(),
        image_digest: None,
        base_reference: has_base.then(|| recipe.base_reference.clone()),
        created: created_seconds,
    };

    // A build killed earlier left its staging tree; even a build with nothing to do
    // removes it.
    let staging_parent = settings.cache_dir.join("staging");
    if staging_parent.is_dir() {
        crate::staging::sweep(&staging_parent);
    }

    // Same inputs as the image already there: nothing to install, nothing to compress.
    // Each platform's base and embedded executable, in platform order.
    let base_manifests = prepared.joined(|p| p.base.as_ref().map(|b| b.manifest_digest.as_str()));
    let smoke_exes = prepared.joined(|p| p.smoke.as_ref().map(|s| s.digest.as_str()));
    let inputs_key = BuildInputs {
        recipe_path: &settings.recipe_path,
        lock_path: &recipe.lock_path(),
        base_manifest: has_base.then_some(base_manifests.as_str()),
        source_date_epoch: settings.source_date_epoch,
        variant: recipe.variant.as_deref(),
        smoke_exe: recipe.embed_smoke.then_some(smoke_exes.as_str()),
    }
    .key();
    let records = BuildRecords::new(&settings.cache_dir);
    if let Some(record) = inputs_key.as_deref().and_then(|key| records.get(key)) {
        let layout = Layout::new(&layout_dir);
        let _lock = layout.lock()?;
        if let Some(layers) = unchanged_image(&layout, &recipe.tags, &record, &base_layers) {
            reporter.on_stage(
                Stage::Write,
                "unchanged: inputs identical to the image in place",
            );
            let sboms = crate::sbom::write_beside(
                &layout_dir,
                &lock,
                &crate::sbom::SbomSubject {
                    image_digest: Some(record.manifest_digest.clone()),
                    ..sbom_subject
                },
            )?;
            let platforms = platform_manifests(&layout, recipe, &record.manifest_digest);
            return Ok(BuildReport {
                layout_dir,
                tags: recipe.tags.clone(),
                manifest_digest: record.manifest_digest,
                platforms,
                base_layers: base_layers.iter().sum(),
                layers,
                lock: lock_report,
                timings,
                sboms,
                unchanged: true,
            });
        }
    }

    // Stage the environment under the cache, away from the output: a failed build never
    // leaves a half-made tree next to the images.
    fs_err::create_dir_all(&staging_parent).map_err(|source| BuildError::Staging {
        path: staging_parent.clone(),
        source,
    })?;
    // Also removes the trees of builds that were killed (`src/staging.rs`).
    let staging =
        crate::staging::Staging::create(&staging_parent).map_err(|source| BuildError::Staging {
            path: staging_parent.clone(),
            source,
        })?;

    let started = Instant::now();
    let mut detail = counted(lock.package_count(), "package");
    if recipe.platforms.is_multi() {
        let each: Vec<String> = lock
            .platforms
            .iter()
            .map(|p| {
                format!(
                    "{} for {}",
                    p.records.len() + p.wheels.len(),
                    p.target.platform
                )
            })
            .collect();
        detail = format!("{detail}: {}", each.join(", "));
    }
    reporter.on_stage(Stage::Install, &detail);
    let host = Subdir::current();
    let install_reporter = InstallTotals::new(reporter);
    let mut staged_platforms = Vec::with_capacity(prepared.platforms.len());
    for platform in &prepared.platforms {
        if host != Some(platform.platform) {
            reporter.on_warning(&foreign_platform_warning(platform.platform, host));
        }
        let locked = lock
            .platform(platform.platform)
            .expect("a lock that satisfies the recipe has each of its platforms");
        // One tree per platform, so a multi-platform build never mixes them.
        let root = if recipe.platforms.is_multi() {
            staging.dir().join(format!("rootfs-{}", platform.platform))
        } else {
            staging.dir().join("rootfs")
        };
        let staged = install_reporting(
            &locked.records,
            platform.platform,
            &root,
            &recipe.prefix,
            &InstallOptions {
                cache_dir: &settings.cache_dir,
            },
            &install_reporter,
        )
        .await
        .map_err(|source| BuildError::Install {
            name: recipe.name.clone(),
            source,
        })?;
        // Wheels are packages of the stage too: counted in its total and as done, so the
        // finished line agrees with the `Installing N packages` line (issue 18).
        install_reporter.add_to_total(locked.wheels.len());
        let mut wheels = Vec::new();
        if !locked.wheels.is_empty() {
            let owned = crate::install::ownership(&staged.packages)
                .into_iter()
                .map(|(path, owner)| (path.to_string(), staged.packages[owner].dist_name()))
                .collect();
            wheels = crate::pypi::install_platform(
                &locked.wheels,
                &locked.target,
                &locked.records,
                recipe
                    .pypi
                    .as_ref()
                    .map_or(&[][..], |p| p.requirements.as_slice()),
                &staged.prefix_dir(),
                &recipe.prefix,
                &settings.cache_dir,
                owned,
            )
            .await?;
            for wheel in &wheels {
                install_reporter.on_item_done(Stage::Install, wheel.name.as_ref(), 0);
            }
        }
        install_reporter.platform_done();
        let mut activation = activation(
            &staged.prefix_dir(),
            &recipe.prefix,
            platform.platform,
            reporter,
        )?;
        for warning in link_script_warnings(&staged.packages) {
            reporter.on_warning(&warning);
        }
        let mut annotations = indexmap::IndexMap::new();
        let runtime = locked.cuda_runtime();
        // A runtime without `[cuda]` is configured as the section it implies (warned about
        // with the lock).
        let derived = match (&recipe.cuda, &runtime) {
            (None, Some(runtime)) => Some(crate::cuda::intent::derived_target(runtime)),
            _ => None,
        };
        if let Some(cuda) = recipe.cuda.as_ref().or(derived.as_ref()) {
            // Said once, not once per platform.
            if cuda.support == Support::MinorVersion && staged_platforms.is_empty() {
                reporter.on_warning(&format!(
                    "CUDA {} runs on driver {} only through minor-version compatibility: kernels must be built for the device, PTX newer than the driver cannot be JIT-compiled",
                    cuda.version, cuda.min_driver
                ));
            }
            let settings = crate::cuda::image_settings(cuda, runtime.as_ref(), &recipe.prefix);
            activation.variables.extend(settings.env);
            annotations = settings.annotations;
        }
        // Which GPUs the kernels run on, read from the libraries' fatbins (issue 16).
        let (architectures, warnings) = scan_architectures(&staged, &wheels);
        for warning in &warnings {
            reporter.on_warning(warning);
        }
        annotations.extend(crate::cuda::fatbin::annotations(&architectures));
        if let Some(cuda) = recipe.cuda.as_ref().filter(|c| !c.architectures.is_empty()) {
            crate::cuda::fatbin::check_architectures(&architectures, &cuda.architectures)?;
        }
        // The smoke executable's layer is planned like one more base layer, then added on
        // top.
        let mut plan = plan_layers(
            &staged,
            &wheels,
            recipe.layer_budget,
            platform.base.as_ref().map_or(0, |b| b.layers.len())
                + usize::from(platform.smoke.is_some()),
            created_seconds as u64,
        )?;
        if let Some(smoke) = &platform.smoke {
            plan.layers.push(smoke.stage(&staged.root)?);
            annotations.insert(
                crate::oci::annotations::SMOKE.to_string(),
                embed::in_image_path(),
            );
        }
        staged_platforms.push(StagedPlatform {
            prepared: platform,
            root: staged.root,
            plan,
            activation,
            annotations,
        });
    }
    timings.push((Stage::Install, started.elapsed()));

    let created = rfc3339_utc(created_seconds);
    let layout = Layout::new(&layout_dir);
    let _lock = layout.lock()?;
    let created_dir = layout.prepare()?;
    let result = write_output(
        &layout,
        recipe,
        &staged_platforms,
        created,
        settings,
        reporter,
        &mut timings,
    );
    match result {
        Ok(Output {
            digest: manifest_digest,
            manifests: platforms,
            layers,
        }) => {
            if let Some(key) = &inputs_key {
                records.put(
                    key,
                    &BuildRecord::new(&manifest_digest, &layers, recipe.compression),
                );
            }
            let sboms = crate::sbom::write_beside(
                &layout_dir,
                &lock,
                &crate::sbom::SbomSubject {
                    image_digest: Some(manifest_digest.clone()),
                    ..sbom_subject
                },
            )?;
            Ok(BuildReport {
                layout_dir,
                tags: recipe.tags.clone(),
                manifest_digest,
                platforms,
                base_layers: base_layers.iter().sum(),
                layers,
                lock: lock_report,
                timings,
                sboms,
                unchanged: false,
            })
        }
        Err(err) => {
            if created_dir {
                // Nothing was there before this build: leave nothing behind.
                let _ = fs_err::remove_dir_all(&layout.dir);
            }
            Err(err)
        }
    }
}

/// The platform manifests of the image `digest` in `layout` (built from `recipe`): itself
/// for one platform, else the manifests its image index lists, in the recipe's order.
fn platform_manifests(layout: &Layout, recipe: &Recipe, digest: &str) -> Vec<(Subdir, String)> {
    if !recipe.platforms.is_multi() {
        return vec![(recipe.platforms.as_slice()[0], digest.to_string())];
    }
    let index = oci_spec::image::ImageIndex::from_file(layout.blob_path(digest));
    // `unchanged_image` has just read this index; it cannot be missing here.
    let manifests = index.map(|i| i.manifests().clone()).unwrap_or_default();
    recipe
        .platforms
        .iter()
        .zip(manifests)
        .map(|(platform, m)| (platform, m.digest().to_string()))
        .collect()
}

/// Reports the installs of several platforms as one stage: a platform's package total adds
/// to those of the platforms before it, so one progress bar counts every package.
struct InstallTotals<'a> {
    inner: &'a dyn Reporter,
    /// The totals of the platforms already installed.
    before: std::sync::atomic::AtomicUsize,
    /// The total of the platform being installed.
    current: std::sync::atomic::AtomicUsize,
    /// Packages of the platform being installed that rattler does not count (wheels).
    extra: std::sync::atomic::AtomicUsize,
}

impl<'a> InstallTotals<'a> {
    fn new(inner: &'a dyn Reporter) -> Self {
        Self {
            inner,
            before: 0.into(),
            current: 0.into(),
            extra: 0.into(),
        }
    }

    /// Adds `count` packages installed outside rattler to the platform's total.
    fn add_to_total(&self, count: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.extra.fetch_add(count, Relaxed);
        self.inner.on_stage_total(
            Stage::Install,
            self.before.load(Relaxed) + self.current.load(Relaxed) + self.extra.load(Relaxed),
        );
    }

    fn platform_done(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let done = self.current.swap(0, Relaxed) + self.extra.swap(0, Relaxed);
        self.before.fetch_add(done, Relaxed);
    }
}

impl Reporter for InstallTotals<'_> {
    fn on_stage(&self, stage: Stage, detail: &str) {
        self.inner.on_stage(stage, detail);
    }
    fn on_warning(&self, message: &str) {
        self.inner.on_warning(message);
    }
    fn on_stage_total(&self, stage: Stage, total: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.current.store(total, Relaxed);
        self.inner.on_stage_total(
            stage,
            self.before.load(Relaxed) + total + self.extra.load(Relaxed),
        );
    }
    fn on_download_bytes(&self, bytes: u64) {
        self.inner.on_download_bytes(bytes);
    }
    fn on_item_done(&self, stage: Stage, name: &str, bytes: u64) {
        self.inner.on_item_done(stage, name, bytes);
    }
}

/// What building a platform other than the host's leaves out. imgbuild runs nothing of the
/// target on any build, so this is what every build leaves out; for a foreign platform it
/// also means nothing was even loaded on the build host.
fn foreign_platform_warning(platform: Subdir, host: Option<Subdir>) -> String {
    let host = host.map_or_else(|| "this".to_string(), |h| format!("a {h}"));
    format!(
        "{platform} is installed on {host} build host without running any of its code: \
         link scripts (post-link.sh, pre-unlink.sh) and activation scripts are not run and \
         no .pyc files are compiled (Python compiles them on first import if the prefix is \
         writable); imgbuild cannot run or smoke-test this platform's image here"
    )
}

/// One platform of the image, installed and planned, ready to be written.
struct StagedPlatform<'a> {
    prepared: &'a PreparedPlatform,
    /// The staging directory that stands for the image's `/`.
    root: PathBuf,
    plan: crate::layers::LayerPlan,
    activation: Activation,
    annotations: indexmap::IndexMap<String, String>,
}

/// What [`write_output`] wrote.
struct Output {
    /// What the tags name: the manifest, or the image index of several platforms.
    digest: String,
    /// Each platform's manifest digest, in the recipe's order.
    manifests: Vec<(Subdir, String)>,
    /// The layers written, platform after platform.
    layers: Vec<BuiltLayer>,
}

/// Writes every platform's layers and image, then switches `index.json` to them.
fn write_output(
    layout: &Layout,
    recipe: &Recipe,
    platforms: &[StagedPlatform<'_>],
    created: String,
    settings: &BuildSettings,
    reporter: &dyn Reporter,
    timings: &mut Vec<(Stage, Duration)>,
) -> Result<Output, BuildError> {
    let started = Instant::now();
    for platform in platforms {
        if let Some(base) = &platform.prepared.base {
            for layer in &base.layers {
                let digest = layer.digest().to_string();
                layout.import_blob(&base.blobs_dir.join(layer.digest().digest()), &digest)?;
            }
        }
    }
    let compression = recipe.compression;
    let total: usize = platforms.iter().map(|p| p.plan.layers.len()).sum();
    reporter.on_stage(Stage::Layers, &counted(total, "layer"));
    reporter.on_stage_total(Stage::Layers, total);
    let blobs_dir = layout.blobs_dir();
    let cache = LayerCache::open(&settings.cache_dir).map_err(|source| BuildError::Staging {
        path: settings.cache_dir.join("layers"),
        source,
    })?;
    let pool = CompressPool::new(settings.jobs).map_err(|source| BuildError::Staging {
        path: settings.cache_dir.clone(),
        source,
    })?;
    let mut platform_layers = Vec::with_capacity(platforms.len());
    for platform in platforms {
        let layers = LayerWriter {
            root: &platform.root,
            compression,
            blobs_dir: &blobs_dir,
            pool: pool.clone(),
            cache: Some(&cache),
        }
        .write_all(&platform.plan, reporter)?;
        platform_layers.push(layers);
    }
    timings.push((Stage::Layers, started.elapsed()));

    let started = Instant::now();
    reporter.on_stage(Stage::Write, &layout.dir.display().to_string());
    let mut images = Vec::with_capacity(platforms.len());
    for (platform, layers) in platforms.iter().zip(&platform_layers) {
        images.push(write_image(
            layout,
            &ImageInputs {
                recipe,
                platform: platform.prepared.platform,
                base: platform.prepared.base.as_ref(),
                activation: &platform.activation,
                layers,
                created: created.clone(),
                compression,
                annotations: platform.annotations.clone(),
            },
        )?);
    }
    let entries = tag_entries(layout, recipe, &created, &images)?;
    let digest = entries
        .first()
        .map(|e| e.digest().to_string())
        .expect("a recipe has at least one tag");
    layout.commit_tags(&index_of(entries)?)?;
    let removed = layout.collect_garbage()?;
    tracing::debug!("removed {removed} unreferenced blobs");
    timings.push((Stage::Write, started.elapsed()));
    let manifests = platforms
        .iter()
        .zip(&images)
        .map(|(p, image)| (p.prepared.platform, image.manifest.digest().to_string()))
        .collect();
    Ok(Output {
        digest,
        manifests,
        layers: platform_layers.into_iter().flatten().collect(),
    })
}

/// [`crate::cuda::fatbin::scan_packages`] over a staged environment: its conda packages and its wheels, named
/// as layer annotations name them.
fn scan_architectures(
    staged: &crate::install::StagedPrefix,
    wheels: &[crate::pypi::StagedWheel],
) -> (Vec<crate::cuda::fatbin::PackageArchitectures>, Vec<String>) {
    let conda = staged
        .packages
        .iter()
        .map(|p| (p.dist_name(), p.files.as_slice()));
    let wheels = wheels.iter().map(|w| {
        (
            crate::layers::plan::wheel_label(&w.dist_name),
            w.files.as_slice(),
        )
    });
    crate::cuda::fatbin::scan_packages(&staged.prefix_dir(), conda.chain(wheels))
}

/// `1 package`, `2 packages`: a count with its noun in the number it takes. Only for
/// nouns whose plural adds an `s` (package, layer).
pub(crate) fn counted(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// The link scripts conda would run for `packages` and imgbuild does not (no package code
/// runs at build time), one warning each: without one, a package that does its work in a
/// post-link script (`cudatoolkit-dev` downloads CUDA in one) is silently incomplete.
/// `pre-unlink` scripts run only when a package is removed, which an image build never
/// does, so they are not reported.
fn link_script_warnings(packages: &[crate::install::StagedPackage]) -> Vec<String> {
    let mut warnings = Vec::new();
    for package in packages {
        let name = package.record.package_record.name.as_normalized();
        for kind in ["pre-link", "post-link"] {
            let script = format!("bin/.{name}-{kind}.sh");
            if package.files.contains(&script) {
                warnings.push(format!(
                    "package `{}` has a {kind} script `{script}` that is not run at build time \
                     (imgbuild runs no package code); what it would do is missing from the image",
                    package.dist_name()
                ));
            }
        }
    }
    warnings
}

/// The environment variables activating the prefix sets, in the image's terms. Activation
/// scripts (`etc/conda/activate.d`) are target code and are not run; they are reported.
fn activation(
    prefix_dir: &Path,
    prefix: &str,
    platform: Subdir,
    reporter: &dyn Reporter,
) -> Result<Activation, BuildError> {
    let activator = Activator::from_path(prefix_dir, shell::Bash::default(), platform)
        .map_err(BuildError::Activation)?;
    let staging = prefix_dir.to_string_lossy().into_owned();
    let in_image = |value: &str| value.replace(&staging, prefix);
    for script in &activator.activation_scripts {
        reporter.on_warning(&format!(
            "activation script `{}` is not run at build time; set what it sets in `[image.env]`",
            in_image(&script.to_string_lossy())
        ));
    }
    let mut variables = indexmap::IndexMap::new();
    variables.insert("CONDA_PREFIX".to_string(), prefix.to_string());
    variables.insert("CONDA_DEFAULT_ENV".to_string(), prefix.to_string());
    variables.insert("CONDA_SHLVL".to_string(), "1".to_string());
    for (key, value) in &activator.env_vars {
        variables.insert(key.clone(), in_image(value));
    }
    Ok(Activation {
        path: activator
            .paths
            .iter()
            .map(|p| in_image(&p.to_string_lossy()))
            .collect(),
        variables,
    })
}
