//! Building an image from a recipe, top to bottom. [`build`] is a list of named steps,
//! each in a module of its own, passing plain data from one to the next:
//!
//! 1. `prepare`: the recipe, and for each of its platforms the base image (pulled from its
//!    registry or opened from a layout), the target the solver solves for and the smoke
//!    executable to embed.
//! 2. `obtain_lock`: a lock that satisfies the recipe: the existing one, or each platform solved
//!    (conda packages, then wheels) and the lock written and read back.
//! 3. `plan`: what there is to do, computed from what is wanted and what is there, and only
//!    read: *unchanged* when the build record of these inputs (recipe, lock, bases,
//!    `SOURCE_DATE_EPOCH`, …; see [`crate::rebuild`]) names the image the layout holds,
//!    whole; else *build* every platform from its part of the lock.
//! 4. `stage`: each platform installed into a tree of its own under the cache's staging
//!    directory, its environment, CUDA settings and annotations read from it, and its
//!    layers planned. Then `runnable`: the entrypoint (or cmd) must be able to start in the
//!    image: the program, an ELF's loader, a script's interpreter.
//! 5. `write`: the layers compressed (or taken from the layer cache), each platform's
//!    config and manifest written, and `index.json` switched to them, under the layout's
//!    lock.
//! 6. The build is recorded under its inputs key, and the SPDX and CycloneDX SBOMs and the
//!    SLSA provenance ([`crate::provenance`]) are written beside the layout (for an
//!    unchanged image too).
//!
//! [`lock()`] stops after step 2; [`lock_and_fetch`] also fetches the lock's packages.
//!
//! What the steps share (settings, reports, the context and the built image) is in
//! `model`; this module is only the driver, and no step names it.

mod accounts_layer;
mod cache_repo;
mod compat_layer;
mod error;
mod files_layer;
mod lock_update;
mod model;
mod obtain_lock;
mod plan;
mod prepare;
mod runnable;
mod shard;
mod stage;
mod write;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub(crate) use error::BuildError;
pub(crate) use files_layer::source_digests;
pub(crate) use model::counted;
pub(crate) use model::{
    BuildReport, BuildSettings, CacheRepoSettings, LockMode, LockOutcome, LockReport, ShardReport,
};
pub(crate) use shard::build_shard;

use crate::{
    install::InstallOptions,
    layers::Compression,
    lock::Lock,
    oci::{
        image::merge_env,
        layout::{Layout, LayoutLock},
        rootfs::{BaseTree, base_tree},
    },
    rebuild::{BuildInputs, BuildRecord, BuildRecords},
    recipe::Recipe,
    sbom::SbomSubject,
};
use model::{BuiltImage, Context};
use obtain_lock::obtain_lock;
use plan::{BuildPlan, ImageInPlace, PlanInputs};
use prepare::{Prepared, prepare};
use runnable::{ImageTree, RunnableError};
use stage::StagedPlatform;
use stage::{Stager, create_staging, sweep_staging};
use write::Writer;

// Progress reporting lives in `report`, below the stages that report; re-exported here,
// where callers of `build` look for it.
pub(crate) use crate::report::{Reporter, Silent, Stage};

/// Solves the recipe and writes its lock (always re-solving with [`LockMode::Refresh`]).
pub(crate) async fn lock(
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<LockReport, BuildError> {
    let prepared = prepare(settings, reporter).await?;
    obtain_lock(&prepared, settings, reporter)
        .await
        .map(|(_, report)| report)
}

/// Solves (or reuses) the recipe's lock and fetches its packages into the cache, without
/// building: the first step of a matrix build, taken one variant at a time.
pub(crate) async fn lock_and_fetch(settings: &BuildSettings) -> Result<(), BuildError> {
    let prepared = prepare(settings, &Silent).await?;
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
pub(crate) async fn build(
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<BuildReport, BuildError> {
    let mut timings = Vec::new();
    let started = Instant::now();
    let prepared = prepare(settings, reporter).await?;
    let (lock, lock_report) = obtain_lock(&prepared, settings, reporter).await?;
    let (prepared, lock) = prepared.keep_platforms(lock, &settings.platforms);
    timings.push((Stage::Solve, started.elapsed()));
    let cx = Context::new(settings, &prepared.recipe, &lock, reporter);
    let output = Output::new(&cx, &prepared);
    // A build killed earlier left its staging tree; even a build with nothing to do
    // removes it.
    sweep_staging(settings);

    let layout = Layout::new(&output.layout_dir);
    let records = Records::new(settings, &prepared);
    let recorded = records.read(&layout, &cx.recipe.tags)?;
    let plan = BuildPlan::new(&PlanInputs {
        platforms: &prepared.platforms,
        lock: &lock,
        recorded: recorded.as_ref().map(|r| &r.record),
        in_place: recorded.as_ref().and_then(|r| r.image.as_ref()),
    });
    let work = match plan {
        BuildPlan::Unchanged(image) => {
            reporter.on_stage(
                Stage::Write,
                "unchanged: inputs identical to the image in place",
            );
            let models = write_models(&cx, &output.layout_dir)?;
            let mut report = output.report(image, &lock, lock_report, timings, true)?;
            report.models = models;
            return Ok(report);
        }
        BuildPlan::Build(work) => work,
    };
    // Installing does not hold the layout; it is locked again to be written.
    drop(recorded);

    let staging = create_staging(settings, reporter)?;
    let started = Instant::now();
    let staged = Stager::new(&cx, staging.dir())
        .stage_all(&work, &lock)
        .await?;
    timings.push((Stage::Install, started.elapsed()));
    check_runnable(&cx, &staged)?;

    let _lock = layout.lock()?;
    let shared = cache_repo::open(settings, reporter);
    let image = Writer::new(&cx, &layout)
        .sharing(shared.as_ref())
        .write(&staged, &mut timings)?;
    records.put(&image, cx.recipe.compression, reporter);
    // Stored while the layout is locked: no other build collects the blobs meanwhile.
    let shared = match &shared {
        Some(shared) => Some(shared.store_offered(reporter).await),
        None => None,
    };
    let models = write_models(&cx, &output.layout_dir)?;
    let mut report = output.report(image, &lock, lock_report, timings, false)?;
    report.cache_repo = shared;
    report.models = models;
    Ok(report)
}

/// Step 5½: the recipe's `[[models]]` beside the image's layout, each file checked against
/// the lock's pin as it is read (for an unchanged image too: the models have layouts of
/// their own).
fn write_models(
    cx: &Context<'_>,
    layout_dir: &Path,
) -> Result<Vec<crate::models::WrittenModel>, BuildError> {
    let recipe = cx.recipe;
    if recipe.models.is_empty() {
        return Ok(Vec::new());
    }
    let pinned = crate::lock::read_models(&recipe.lock_path())?;
    let architecture = recipe
        .platforms
        .iter()
        .next()
        .and_then(crate::names::oci_architecture)
        .map_or("amd64", |(arch, _)| arch);
    let created = write::rfc3339_utc(cx.created_seconds);
    Ok(crate::models::write_all(
        recipe,
        &pinned,
        layout_dir,
        &created,
        architecture,
    )?)
}

/// Step 4½ ([`runnable`]): each staged platform must start the program the recipe's
/// entrypoint (or, with none, its cmd) names. A recipe that names neither runs the base's,
/// which is the base's to get right.
fn check_runnable(cx: &Context<'_>, staged: &[StagedPlatform<'_>]) -> Result<(), BuildError> {
    let recipe = cx.recipe;
    let config = &recipe.config;
    let program = config
        .entrypoint
        .as_ref()
        .or(config.cmd.as_ref())
        .and_then(|args| args.first());
    let Some(program) = program.filter(|_| recipe.check_entrypoint) else {
        return Ok(());
    };
    for platform in staged {
        let base = platform.work.prepared.base.as_ref();
        let tree = match base {
            Some(base) => base_tree(base).map_err(RunnableError::from)?,
            None => BaseTree::default(),
        };
        let base_env = base
            .and_then(|b| b.config.config().as_ref())
            .and_then(|c| c.env().clone())
            .unwrap_or_default();
        let env = merge_env(&base_env, &platform.activation, &config.env);
        let path = env
            .iter()
            .find_map(|kv| kv.strip_prefix("PATH="))
            .unwrap_or_default();
        ImageTree::new(&platform.owned, &platform.root, tree)
            .check(program, path)
            .map_err(|problem| {
                BuildError::from(RunnableError::NotRunnable {
                    platform: platform.work.prepared.platform.to_string(),
                    base: recipe.base_reference.clone(),
                    problem,
                })
            })?;
    }
    Ok(())
}

/// The build records, and this build's inputs key in them (see [`crate::rebuild`]).
struct Records {
    records: BuildRecords,
    /// `None` when an input cannot be read: then the build just runs, unrecorded.
    key: Option<String>,
}

impl Records {
    fn new(settings: &BuildSettings, prepared: &Prepared) -> Self {
        let recipe = &prepared.recipe;
        let has_base = prepared.platforms.iter().any(|p| p.base.is_some());
        // Each platform's base and embedded executable, in platform order.
        let base_manifests =
            prepared.joined(|p| p.base.as_ref().map(|b| b.manifest_digest.as_str()));
        let smoke_exes = prepared.joined(|p| p.smoke.as_ref().map(|s| s.digest.as_str()));
        let key = BuildInputs {
            recipe_path: &settings.recipe_path,
            lock_path: &recipe.lock_path(),
            base_manifest: has_base.then_some(base_manifests.as_str()),
            source_date_epoch: settings.source_date_epoch,
            variant: recipe.variant.as_deref(),
            smoke_exe: recipe.embed_smoke.then_some(smoke_exes.as_str()),
        }
        .key()
        .and_then(|key| with_sources(key, recipe));
        Records {
            records: BuildRecords::new(&settings.cache_dir),
            key,
        }
    }

    /// What the records hold for this build's inputs, with the image `layout` holds under
    /// `tags`; `None` when there is no key or no record of it, and then the layout is not
    /// even locked.
    fn read(&self, layout: &Layout, tags: &[String]) -> Result<Option<PreviousBuild>, BuildError> {
        let Some(record) = self.key.as_deref().and_then(|key| self.records.get(key)) else {
            return Ok(None);
        };
        let lock = layout.lock()?;
        let image = ImageInPlace::read(layout, tags);
        Ok(Some(PreviousBuild {
            record,
            image,
            _lock: lock,
        }))
    }

    /// Records what this build produced, for the next build with the same inputs.
    fn put(&self, image: &BuiltImage, compression: Compression, reporter: &dyn Reporter) {
        if let Some(key) = &self.key {
            let record = BuildRecord::new(&image.digest, &image.layers, compression);
            self.records.put(key, &record, reporter);
        }
    }
}

/// `key` with the digests of the recipe's `[[files]]` sources: they are read from the host,
/// not from the recipe or the lock, so a changed file must change the key. `None` (no
/// record: the build runs, and reports the error) when a source cannot be walked.
fn with_sources(key: String, recipe: &Recipe) -> Option<String> {
    if recipe.files.is_empty() {
        return Some(key);
    }
    let digests = files_layer::source_digests(recipe).ok()?;
    let json = serde_json::to_string(&digests).expect("strings serialize");
    Some(crate::oci::sha256_digest(
        format!("{key}\n{json}").as_bytes(),
    ))
}

/// What a previous build with these inputs left: its build record, with the image the layout
/// holds under the recipe's tags, read under the layout's lock; the lock is held while this
/// is.
struct PreviousBuild {
    record: BuildRecord,
    image: Option<ImageInPlace>,
    _lock: LayoutLock,
}

/// Where the image goes and what it says of itself, known once the lock is.
struct Output {
    layout_dir: PathBuf,
    /// The recipe's tags, which name the image.
    tags: Vec<String>,
    /// The number of the bases' layers, over all platforms.
    base_layers: usize,
    /// The SBOMs' subject, less the image's digest.
    sbom: SbomSubject,
    /// What the provenance says of the build, less the image's digest.
    provenance: ProvenanceInputs,
}

/// The build as its provenance describes it, known once the lock is.
struct ProvenanceInputs {
    recipe_path: PathBuf,
    lock_path: PathBuf,
    platforms: Vec<String>,
    compression: Compression,
    epoch_source: crate::provenance::EpochSource,
    variant: Option<String>,
    /// `[smoke] embed = true`: each platform's embedded executable, by its sha256.
    smoke_executables: Vec<crate::provenance::EmbeddedSmoke>,
}

impl Output {
    fn new(cx: &Context<'_>, prepared: &Prepared) -> Self {
        let recipe = cx.recipe;
        let has_base = prepared.platforms.iter().any(|p| p.base.is_some());
        Output {
            layout_dir: cx
                .settings
                .output
                .clone()
                .unwrap_or_else(|| Path::new("images").join(&recipe.name)),
            tags: recipe.tags.clone(),
            base_layers: prepared.platforms.iter().map(|p| p.base_layers()).sum(),
            sbom: SbomSubject {
                name: recipe.name.clone(),
                image_digest: None,
                base_reference: has_base.then(|| recipe.base_reference.clone()),
                created: cx.created_seconds,
                // Read from the lock the build used, with the documents (`report`).
                models: Vec::new(),
            },
            provenance: ProvenanceInputs {
                recipe_path: cx.settings.recipe_path.clone(),
                lock_path: recipe.lock_path(),
                platforms: recipe.platforms.iter().map(|p| p.to_string()).collect(),
                compression: recipe.compression,
                epoch_source: match cx.settings.source_date_epoch {
                    Some(_) => crate::provenance::EpochSource::Environment,
                    None => crate::provenance::EpochSource::Lock,
                },
                variant: recipe.variant.clone(),
                smoke_executables: prepared
                    .platforms
                    .iter()
                    .filter_map(|p| {
                        p.smoke
                            .as_ref()
                            .map(|smoke| crate::provenance::EmbeddedSmoke {
                                platform: p.platform.to_string(),
                                digest: smoke.digest.clone(),
                            })
                    })
                    .collect(),
            },
        }
    }

    /// Writes the provenance of the image `digest` beside the layout. The recipe and lock
    /// are hashed now, after the build: the lock is the one the build used (written and
    /// read back, or reused) and a build holds no lock on its recipe either way.
    fn write_provenance(
        &self,
        digest: &str,
        lock: &Lock,
        models: Vec<crate::lock::ModelPin>,
    ) -> Result<PathBuf, BuildError> {
        use crate::provenance::{Build, InputFile, write_beside};
        let inputs = &self.provenance;
        let build = Build {
            name: &self.sbom.name,
            image_digest: digest,
            recipe: InputFile::read(&inputs.recipe_path)?,
            lock: InputFile::read(&inputs.lock_path)?,
            base_reference: self.sbom.base_reference.as_deref(),
            platforms: inputs.platforms.clone(),
            compression: inputs.compression,
            source_date_epoch: self.sbom.created,
            epoch_source: inputs.epoch_source,
            variant: inputs.variant.as_deref(),
            files: crate::lock::read_sources(&inputs.lock_path)?,
            models,
            smoke_executables: inputs.smoke_executables.clone(),
        };
        Ok(write_beside(&self.layout_dir, &build, lock)?)
    }

    /// Writes the SBOMs and the provenance of `image` beside the layout (only once the
    /// image is in it: a failed build writes neither) and reports the build.
    fn report(
        self,
        image: BuiltImage,
        lock: &Lock,
        lock_report: LockReport,
        timings: Vec<(Stage, Duration)>,
        unchanged: bool,
    ) -> Result<BuildReport, BuildError> {
        let models = crate::lock::read_models(&self.provenance.lock_path)?;
        let sboms = crate::sbom::write_beside(
            &self.layout_dir,
            lock,
            &SbomSubject {
                image_digest: Some(image.digest.clone()),
                models: models.clone(),
                ..self.sbom.clone()
            },
        )?;
        let provenance = self.write_provenance(&image.digest, lock, models)?;
        Ok(BuildReport {
            layout_dir: self.layout_dir,
            tags: self.tags,
            manifest_digest: image.digest,
            platforms: image.manifests,
            base_layers: self.base_layers,
            layers: image.layers,
            lock: lock_report,
            timings,
            sboms,
            provenance,
            unchanged,
            cache_repo: None,
            models: Vec::new(),
        })
    }
}
