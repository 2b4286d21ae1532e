//! What can stop a build, and the exit code each failure gives.

use rattler_conda_types::Subdir;
use std::path::PathBuf;

use crate::{
    cuda::RuntimeMismatch,
    install::InstallError,
    layers::{plan::PlanError, write::WriteError},
    lock::{LockError, Staleness},
    oci::{
        base::{BaseError, GlibcError},
        image::ImageError,
        layout::LayoutError,
        read::ReadError,
    },
    recipe::RecipeError,
    registry::pull::PullError,
    resolve::ResolveError,
    smoke::embed::EmbedError,
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
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
    Provenance(#[from] crate::provenance::ProvenanceError),
    #[error(transparent)]
    Smoke(#[from] EmbedError),
    #[error(transparent)]
    CudaRuntime(#[from] Box<RuntimeMismatch>),
    #[error(transparent)]
    Runnable(#[from] super::runnable::RunnableError),
    #[error("`lock --update` keeps the pins of a lock, and `{}` does not exist: run `imgbuild lock` first", path.display())]
    UpdateWithoutLock { path: PathBuf },
    #[error("`--update {name}`: `{}` pins no package or wheel `{name}`", path.display())]
    UpdateUnknown { path: PathBuf, name: String },
    #[error("`--platform {platform}`: `{}` builds {platforms}, not {platform}", path.display())]
    PlatformNotInRecipe {
        path: PathBuf,
        platform: Subdir,
        platforms: crate::recipe::Platforms,
    },
    /// A library runs on none of `[cuda] architectures`.
    #[error(transparent)]
    GpuArchitectures(#[from] Box<crate::cuda::fatbin::NotCovered>),
    #[error(transparent)]
    Model(#[from] crate::models::ModelError),
    #[error(
        "`--shard` builds layers for the build that follows, and they reach it through the layer cache repository: give `--cache-repo REGISTRY/REPO`, not read-only"
    )]
    ShardWithoutCache,
    #[error(
        "`--shard`: the layer cache repository `{repository}` cannot be used, so this shard's layers would reach no one; see the warning above"
    )]
    ShardCacheUnusable { repository: String },
    #[error(
        "`--shard`: {stored} of this shard's {layers} layers are in the layer cache repository `{repository}` ({why}); the build that follows would compress the others again"
    )]
    ShardNotStored {
        repository: String,
        stored: usize,
        layers: usize,
        why: String,
    },
    /// A PTX-only library needs a newer driver than `[cuda] min-driver`.
    #[error(transparent)]
    PtxDriver(#[from] Box<crate::cuda::jit::PtxTooNew>),
}

impl From<crate::pypi::PypiError> for BuildError {
    fn from(err: crate::pypi::PypiError) -> Self {
        BuildError::Pypi(Box::new(err))
    }
}

impl BuildError {
    /// 1 when the input is at fault (recipe, packages, lock, base), 2 when the machine is
    /// (disk, permissions). Documented in docs/src/reference/exit-codes.md.
    pub(crate) fn exit_code(&self) -> i32 {
        if crate::fs::is_disk_full(self) {
            return 2;
        }
        match self {
            BuildError::Layout(LayoutError::NotALayout { .. }) => 1,
            // Only a base's blob is imported: one that does not match its digest is the
            // base's fault, as when it is read.
            BuildError::Layout(LayoutError::Read(ReadError::Digest { .. })) => 1,
            BuildError::Layout(_) | BuildError::Staging { .. } => 2,
            BuildError::Lock(LockError::Write { .. }) => 2,
            BuildError::Sbom(_) => 2,
            BuildError::Model(crate::models::ModelError::Write { .. }) => 2,
            BuildError::Provenance(err) => err.exit_code(),
            BuildError::Smoke(EmbedError::Stage { .. }) => 2,
            _ => 1,
        }
    }
}
