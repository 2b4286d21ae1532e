//! Step 1: everything known about a recipe before solving: the recipe itself and, for each
//! of its platforms, the base image, the solver's target and the embedded smoke executable.

use rattler_conda_types::Subdir;

use super::{
    accounts_layer::{Merged, account_tables, needs_tables},
    error::BuildError,
    model::BuildSettings,
};
use crate::{
    lock::{Lock, LockedBase},
    oci::base::{BaseImage, detect_glibc, open_base},
    recipe::{Recipe, RecipeOptions, oci_architecture},
    reference::Base,
    registry::{
        Reference, RepositoryClient,
        pull::{Platform, PullError, pull_base_reporting},
    },
    report::Reporter,
    resolve::Target,
    smoke::embed::{SmokeExecutable, SmokeExecutables},
};

/// Everything known about a recipe before solving.
pub(super) struct Prepared {
    pub(super) recipe: Recipe,
    /// One per platform of the recipe, in its order.
    pub(super) platforms: Vec<PreparedPlatform>,
}

/// What one platform of the image starts from.
pub(super) struct PreparedPlatform {
    pub(super) platform: Subdir,
    pub(super) base: Option<BaseImage>,
    pub(super) target: Target,
    pub(super) locked_base: LockedBase,
    /// The executable `[smoke] embed = true` puts into this platform's image, checked
    /// against it.
    pub(super) smoke: Option<SmokeExecutable>,
    /// The image's account tables (the base's with `[accounts]` merged in) when the recipe
    /// needs them: read once, for the check of names before solving and for the layers.
    pub(super) tables: Option<Merged>,
}

impl Prepared {
    /// What `value` gives for each platform that has one, `,`-joined in platform order.
    pub(super) fn joined<'a>(
        &'a self,
        value: impl Fn(&'a PreparedPlatform) -> Option<&'a str>,
    ) -> String {
        let values: Vec<&str> = self.platforms.iter().filter_map(value).collect();
        values.join(",")
    }

    /// What a lock must hold for this recipe: each platform's target and base.
    pub(super) fn wanted(&self) -> Vec<(Target, LockedBase)> {
        self.platforms
            .iter()
            .map(|p| (p.target.clone(), p.locked_base.clone()))
            .collect()
    }

    /// `build --platform`: only the platforms in `wanted` (all when it is empty), here and
    /// in `lock`. Applied after the lock is obtained, so that the lock keeps every platform
    /// of the recipe and a build of one never drops the pins of the others.
    pub(super) fn keep_platforms(mut self, mut lock: Lock, wanted: &[Subdir]) -> (Self, Lock) {
        if wanted.is_empty() {
            return (self, lock);
        }
        self.platforms.retain(|p| wanted.contains(&p.platform));
        lock.platforms
            .retain(|p| wanted.contains(&p.target.platform));
        let kept = self.platforms.iter().map(|p| p.platform).collect();
        self.recipe.platforms =
            crate::recipe::Platforms::new(kept).expect("a non-empty subset of valid platforms");
        (self, lock)
    }
}

impl PreparedPlatform {
    /// The number of the base's layers, which come first in this platform's image.
    pub(super) fn base_layers(&self) -> usize {
        self.base.as_ref().map_or(0, |b| b.layers.len())
    }
}

/// Loads the recipe and prepares each of its platforms, in the recipe's order.
pub(super) async fn prepare(
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<Prepared, BuildError> {
    let options = RecipeOptions {
        channel_alias: settings.channel_alias.clone(),
        variant: settings.variant.clone(),
    };
    let mut recipe = Recipe::load(&settings.recipe_path, &options)?;
    if !settings.tags.is_empty() {
        recipe.tags = settings.tags.clone();
    }
    // Before any base is pulled: a platform the recipe does not build is a typing slip.
    if let Some(platform) = settings
        .platforms
        .iter()
        .find(|p| !recipe.platforms.contains(**p))
    {
        return Err(BuildError::PlatformNotInRecipe {
            path: settings.recipe_path.clone(),
            platform: *platform,
            platforms: recipe.platforms.clone(),
        });
    }
    if let Some(warning) = crate::http::missing_certificates() {
        reporter.on_warning(&warning);
    }
    // Read once; checked against each platform before solving, so a smoke executable that
    // cannot run in one of the images fails now.
    let smoke = match recipe.embed_smoke {
        true => Some(SmokeExecutables::find(&settings.smoke_exe)?),
        false => None,
    };
    let mut platforms = Vec::with_capacity(recipe.platforms.len());
    for platform in recipe.platforms.iter() {
        platforms
            .push(prepare_platform(&recipe, platform, smoke.as_ref(), settings, reporter).await?);
    }
    Ok(Prepared { recipe, platforms })
}

/// One platform's base (pulled or opened), the glibc it bounds the environment to, the
/// solver's target and the smoke executable that runs there.
async fn prepare_platform(
    recipe: &Recipe,
    platform: Subdir,
    smoke: Option<&SmokeExecutables>,
    settings: &BuildSettings,
    reporter: &dyn Reporter,
) -> Result<PreparedPlatform, BuildError> {
    // A base that is an index gives each platform its own manifest.
    let base = match &recipe.base {
        Base::Registry(reference) => {
            Some(pull(recipe, reference, platform, settings, reporter).await?)
        }
        other => open_base(other, platform)?,
    };
    // The base's glibc bounds what the environment may need, unless the recipe says.
    let base_glibc = match (&recipe.glibc, &base) {
        (None, Some(base)) => detect_glibc(base)?,
        _ => None,
    };
    let smoke = match smoke {
        Some(smoke) => Some(
            smoke
                .for_platform(platform, recipe.glibc.as_ref().or(base_glibc.as_ref()))?
                .clone(),
        ),
        None => None,
    };
    let target = Target::for_recipe(recipe, platform, base_glibc.as_ref());
    let locked_base = base.as_ref().map_or(LockedBase::Scratch, |b| {
        LockedBase::Digest(b.manifest_digest.clone())
    });
    let tables = needs_tables(recipe)
        .then(|| account_tables(recipe, base.as_ref()))
        .transpose()?;
    Ok(PreparedPlatform {
        platform,
        base,
        target,
        locked_base,
        smoke,
        tables,
    })
}

/// Pulls a registry base into the cache, for `platform`. Offline, the digest pinned in the
/// lock is used, so a locked build needs no registry once the base is cached.
async fn pull(
    recipe: &Recipe,
    reference: &Reference,
    platform: Subdir,
    settings: &BuildSettings,
    reporter: &dyn Reporter,
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
    let platform = Platform {
        architecture,
        variant,
    };
    Ok(pull_base_reporting(
        &client,
        platform,
        &settings.cache_dir,
        settings.offline,
        reporter,
    )
    .await?)
}
