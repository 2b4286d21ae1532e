//! Step 4: one platform's install and layer plan. Its conda packages and then its wheels
//! are installed into a tree of its own under the staging directory; the tree's activation,
//! CUDA settings and GPU architectures become the image's environment and annotations; and
//! the tree is cut into planned layers (the embedded smoke executable's on top).

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use rattler_conda_types::{MatchSpec, ParseStrictness, Subdir};
use rattler_shell::{activation::Activator, shell};

use super::{
    accounts_layer::accounts_layer,
    compat_layer::compat_layer,
    error::BuildError,
    files_layer::files_layer,
    model::{BuildSettings, Context, counted},
    plan::PlatformWork,
};
use crate::{
    cuda::compat::Support,
    install::{InstallOptions, StagedPackage, StagedPrefix, install_reporting, ownership},
    layers::{LayerLimits, LayerPlan, OwnedLayer, StagedTree, StagedUnit, plan_layers},
    lock::Lock,
    oci::image::Activation,
    pypi::StagedWheel,
    report::{Reporter, Stage},
    smoke::embed,
};

/// One platform of the image, installed and planned, ready to be written.
pub(super) struct StagedPlatform<'a> {
    pub(super) work: &'a PlatformWork<'a>,
    /// The staging directory that stands for the image's `/`.
    pub(super) root: PathBuf,
    pub(super) plan: LayerPlan,
    /// The recipe's own layers above the plan's: accounts, then files.
    pub(super) owned: Vec<OwnedLayer>,
    pub(super) activation: Activation,
    pub(super) annotations: IndexMap<String, String>,
}

/// Removes the staging trees that builds killed earlier left.
pub(super) fn sweep_staging(settings: &BuildSettings) {
    let staging_parent = settings.cache_dir.join("staging");
    if staging_parent.is_dir() {
        crate::staging::sweep(&staging_parent);
    }
}

/// Creates the build's staging directory under the cache, away from the output: a failed
/// build never leaves a half-made tree next to the images. `reporter` hears if the tree
/// cannot be removed at the end.
pub(super) fn create_staging<'r>(
    settings: &BuildSettings,
    reporter: &'r dyn Reporter,
) -> Result<crate::staging::Staging<'r>, BuildError> {
    let staging_parent = settings.cache_dir.join("staging");
    fs_err::create_dir_all(&staging_parent).map_err(|source| BuildError::Staging {
        path: staging_parent.clone(),
        source,
    })?;
    // Also removes the trees of builds that were killed (`crates/imgbuild-model/src/staging.rs`).
    crate::staging::Staging::create(&staging_parent, reporter).map_err(|source| {
        BuildError::Staging {
            path: staging_parent.clone(),
            source,
        }
    })
}

/// One platform after the other, installed and planned.
pub(super) struct Stager<'a> {
    cx: &'a Context<'a>,
    /// The build's staging directory, which holds each platform's tree.
    staging_dir: &'a Path,
}

impl<'a> Stager<'a> {
    pub(super) fn new(cx: &'a Context<'a>, staging_dir: &'a Path) -> Self {
        Stager { cx, staging_dir }
    }

    /// Installs and plans every platform of `work`, in order, as one `Install` stage.
    pub(super) async fn stage_all<'w>(
        &self,
        work: &'w [PlatformWork<'w>],
        lock: &Lock,
    ) -> Result<Vec<StagedPlatform<'w>>, BuildError> {
        let reporter = self.cx.reporter;
        reporter.on_stage(Stage::Install, &install_detail(lock, work.len() > 1));
        let host = Subdir::current();
        let totals = InstallTotals::new(reporter);
        let mut staged = Vec::with_capacity(work.len());
        for platform in work {
            if host != Some(platform.prepared.platform) {
                reporter.on_warning(&foreign_platform_warning(platform.prepared.platform, host));
            }
            staged.push(self.stage(platform, &totals, staged.is_empty()).await?);
        }
        Ok(staged)
    }

    /// One platform: install, image settings, layer plan. `first`: whether it is the first
    /// platform, which says what is said once for all.
    async fn stage<'w>(
        &self,
        work: &'w PlatformWork<'w>,
        totals: &InstallTotals<'_>,
        first: bool,
    ) -> Result<StagedPlatform<'w>, BuildError> {
        let (staged, wheels) = self.install(work, totals).await?;
        let platform = work.prepared.platform;
        let mut activation = activation(
            &staged.prefix_dir(),
            &self.cx.recipe.prefix,
            platform,
            self.cx.reporter,
        )?;
        for warning in link_script_warnings(&staged.packages) {
            self.cx.reporter.on_warning(&warning);
        }
        let annotations = self.configure(work, &staged, &wheels, &mut activation, first)?;
        let owned = self.owned_layers(work)?;
        let (plan, annotations) =
            self.plan_layers(work, &staged, &wheels, owned.len(), annotations)?;
        Ok(StagedPlatform {
            work,
            root: staged.root,
            plan,
            owned,
            activation,
            annotations,
        })
    }

    /// The platform's conda packages, then its wheels, into its tree.
    async fn install(
        &self,
        work: &PlatformWork<'_>,
        totals: &InstallTotals<'_>,
    ) -> Result<(StagedPrefix, Vec<StagedWheel>), BuildError> {
        let (recipe, locked) = (self.cx.recipe, work.locked);
        let options = InstallOptions {
            cache_dir: &self.cx.settings.cache_dir,
        };
        let staged = install_reporting(
            &locked.records,
            work.prepared.platform,
            &self.staging_dir.join(&work.rootfs),
            &recipe.prefix,
            &options,
            totals,
        )
        .await
        .map_err(|source| BuildError::Install {
            name: recipe.name.clone(),
            source,
        })?;
        // Wheels are packages of the stage too: counted in its total and as done, so the
        // finished line agrees with the `Installing N packages` line (issue 18).
        totals.add_to_total(locked.wheels.len());
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
                &self.cx.settings.cache_dir,
                owned,
                totals,
            )
            .await?;
        }
        totals.platform_done();
        Ok((staged, wheels))
    }

    /// The CUDA settings (added to `activation`) and the GPU architectures of the staged
    /// tree: the platform's annotations.
    fn configure(
        &self,
        work: &PlatformWork<'_>,
        staged: &StagedPrefix,
        wheels: &[StagedWheel],
        activation: &mut Activation,
        first: bool,
    ) -> Result<IndexMap<String, String>, BuildError> {
        let recipe = self.cx.recipe;
        let mut annotations = IndexMap::new();
        let runtime = work.locked.cuda_runtime();
        // A runtime without `[cuda]` is configured as the section it implies (warned about
        // with the lock).
        let derived = match (&recipe.cuda, &runtime) {
            (None, Some(runtime)) => Some(crate::cuda::intent::derived_target(runtime)),
            _ => None,
        };
        // Which GPUs the kernels run on, read from the libraries' fatbins (issue 16), and the
        // driver their PTX needs where it is all a GPU of `[cuda] architectures` runs (issue 30).
        let (architectures, warnings) = scan_architectures(staged, wheels);
        for warning in &warnings {
            self.cx.reporter.on_warning(warning);
        }
        let mut ptx = None;
        if let Some(cuda) = recipe.cuda.as_ref().filter(|c| !c.architectures.is_empty()) {
            crate::cuda::fatbin::check_architectures(&architectures, &cuda.architectures)?;
            let only = crate::cuda::jit::check_ptx_drivers(
                &architectures,
                &cuda.architectures,
                &cuda.min_driver,
            )?;
            ptx = crate::cuda::jit::newest_need(&only).map(|(_, release, _)| release);
        }
        if let Some(cuda) = recipe.cuda.as_ref().or(derived.as_ref()) {
            // Said once, not once per platform.
            if cuda.support == Support::MinorVersion && first {
                self.cx.reporter.on_warning(&format!(
                    "CUDA {} runs on driver {} only through minor-version compatibility: kernels must be built for the device, PTX newer than the driver cannot be JIT-compiled",
                    cuda.version, cuda.min_driver
                ));
            }
            let settings = crate::cuda::image_settings(cuda, runtime.as_ref(), ptx);
            activation.variables.extend(settings.env);
            annotations = settings.annotations;
        }
        annotations.extend(crate::cuda::fatbin::annotations(&architectures));
        Ok(annotations)
    }

    /// The recipe's own layers, which sit above the environment's: the accounts layer
    /// (users, groups, homes, the user's workdir), when there is one, the forward-compat
    /// link with `[cuda] compat`, then a layer for each `[[files]]` entry, in the recipe's order, with the account tables `prepare` read
    /// (only when something needs them).
    fn owned_layers(&self, work: &PlatformWork<'_>) -> Result<Vec<OwnedLayer>, BuildError> {
        let recipe = self.cx.recipe;
        let mtime = self.cx.created_seconds as u64;
        let tables = work.prepared.tables.as_ref();
        let mut layers = Vec::new();
        if let Some(tables) = tables {
            layers.extend(accounts_layer(recipe, tables, mtime)?);
        }
        layers.extend(compat_layer(recipe, mtime));
        for copy in &recipe.files {
            layers.push(files_layer(recipe, copy, tables, mtime)?);
        }
        Ok(layers)
    }

    /// The staged tree's layers, then the smoke executable's, which names itself in the
    /// annotations. `owned` layers of the recipe's own go on top of them.
    fn plan_layers(
        &self,
        work: &PlatformWork<'_>,
        staged: &StagedPrefix,
        wheels: &[StagedWheel],
        owned: usize,
        mut annotations: IndexMap<String, String>,
    ) -> Result<(LayerPlan, IndexMap<String, String>), BuildError> {
        let prepared = work.prepared;
        // The smoke executable's layer and the recipe's own are planned like more base
        // layers, then added on top.
        let limits = LayerLimits {
            budget: self.cx.recipe.layer_budget,
            base_layers: prepared.base_layers() + usize::from(prepared.smoke.is_some()) + owned,
            split: self.cx.recipe.split,
        };
        let mut plan = plan_layers(
            &planned_tree(staged, wheels),
            limits,
            self.cx.created_seconds as u64,
        )?;
        if let Some(smoke) = &prepared.smoke {
            plan.layers.push(smoke.stage(&staged.root)?);
            annotations.insert(
                crate::oci::annotations::SMOKE.to_string(),
                embed::in_image_path(),
            );
        }
        Ok((plan, annotations))
    }
}

/// The staged prefix and the wheels installed into it, as the layer planner sees them.
fn planned_tree(staged: &StagedPrefix, wheels: &[StagedWheel]) -> StagedTree {
    let mut files = vec![Vec::new(); staged.packages.len()];
    for (path, owner) in ownership(&staged.packages) {
        files[owner].push(path.to_string());
    }
    let packages = staged
        .packages
        .iter()
        .zip(files)
        .map(|(package, files)| {
            let record = &package.record.package_record;
            StagedUnit {
                name: record.name.as_normalized().to_string(),
                label: package.dist_name(),
                depends: depended_names(&record.depends),
                files,
                mtime: record
                    .timestamp
                    .as_ref()
                    .map_or(0, |t| t.timestamp().max(0) as u64),
            }
        })
        .collect();
    let wheels = wheels
        .iter()
        .map(|wheel| StagedUnit {
            name: wheel.name.to_string(),
            label: wheel.dist_name.clone(),
            depends: Vec::new(),
            files: wheel.files.clone(),
            mtime: wheel.mtime,
        })
        .collect();
    StagedTree {
        root: staged.root.clone(),
        prefix: staged.prefix.clone(),
        packages,
        wheels,
    }
}

/// The package names a record's `depends` match exactly (`numpy >=1` → `numpy`); a spec that
/// does not parse or names no one package is left out.
fn depended_names(depends: &[String]) -> Vec<String> {
    depends
        .iter()
        .filter_map(|d| MatchSpec::from_str(d, ParseStrictness::Lenient).ok())
        .filter_map(|s| s.name.as_exact().map(|n| n.as_normalized().to_string()))
        .collect()
}

/// The `Installing` line's detail: the lock's package count and, for several platforms,
/// each one's.
fn install_detail(lock: &Lock, multi: bool) -> String {
    let detail = counted(lock.package_count(), "package");
    if !multi {
        return detail;
    }
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
    format!("{detail}: {}", each.join(", "))
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
    fn on_progress(&self, progress: crate::report::Progress<'_>) {
        self.inner.on_progress(progress);
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

/// [`crate::cuda::fatbin::scan_packages`] over a staged environment: its conda packages and its wheels, named
/// as layer annotations name them.
fn scan_architectures(
    staged: &StagedPrefix,
    wheels: &[StagedWheel],
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

/// The link scripts conda would run for `packages` and imgbuild does not (no package code
/// runs at build time), one warning each: without one, a package that does its work in a
/// post-link script (`cudatoolkit-dev` downloads CUDA in one) is silently incomplete.
/// `pre-unlink` scripts run only when a package is removed, which an image build never
/// does, so they are not reported.
fn link_script_warnings(packages: &[StagedPackage]) -> Vec<String> {
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
    let mut variables = IndexMap::new();
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
