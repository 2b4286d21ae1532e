//! The recipe: the TOML file a user writes, parsed into a validated [`Recipe`].
//!
//! Parsing happens in two steps: [`schema`] is the serde view of the file (unknown keys are
//! rejected, every value keeps its byte span), and [`load`] turns it into a [`Recipe`] whose
//! fields are already checked and typed, so later stages never see an invalid value.
//! Every error points at the file, line and column of the offending value.

pub mod accounts;
mod checker;
pub mod checks;
mod error;
pub mod files;
mod load;
pub mod matrix;
pub mod models;
mod platforms;
pub mod pypi;
mod runtime;
mod schema;
pub mod suggest;

pub use crate::cuda::CudaTarget;
pub use crate::names::{OciPlatform, is_valid_tag, oci_architecture};
pub use checker::{lexical_path, name_problem, visible};
pub use error::{RecipeError, SourceSpan, shown};
pub use load::{Recipe, RecipeOptions, read_recipe_text};
pub use platforms::Platforms;

/// Where channel names such as `conda-forge` resolve when no alias is configured.
pub const DEFAULT_CHANNEL_ALIAS: &str = "https://conda.anaconda.org";

/// The in-image prefix of the conda environment when the recipe does not name one.
pub(crate) const DEFAULT_PREFIX: &str = "/opt/conda";

/// The most bytes a recipe file may have. Recipes are a few kilobytes: anything near this
/// is a mistake (or `/dev/zero`), refused before it is read into memory.
pub const MAX_RECIPE_BYTES: u64 = 1 << 20;

/// The default layer budget, base layers included. containerd and overlay2 stop near 127.
pub(crate) const DEFAULT_LAYER_BUDGET: u32 = 60;

/// `[layers] split` when the recipe does not set it: a package of more bytes is split
/// into layers of at most this size (see `docs/benchmarks.md` for the pulls it was
/// measured on).
pub const DEFAULT_SPLIT_BYTES: u64 = 512 << 20;

/// The smallest `[layers] split`: below it, packages of ordinary size would take several
/// layers of the budget each for no pull they speed up.
pub const MIN_SPLIT_BYTES: u64 = 16 << 20;

/// The recipe `[image] name = "x"` followed by `tables`, as if read from
/// `/p/recipes/x.toml`; its error as text. For the tests of the sections' checks.
#[cfg(test)]
pub(crate) fn parse_with(tables: &str) -> Result<Recipe, String> {
    let text = format!("[image]\nname = \"x\"\n{tables}\n");
    Recipe::from_str_at(
        &text,
        std::path::Path::new("/p/recipes/x.toml"),
        &RecipeOptions::default(),
    )
    .map_err(|e| e.to_string())
}
