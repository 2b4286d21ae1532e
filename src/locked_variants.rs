//! The variants a cluster builds with `--locked` (`k8s --build-job`, `slurm --build`): each
//! with its recipe and its lock, read now so that a missing lock is an error here and not a
//! failed pod or job, and each pushing to a tag of its own.

use std::path::Path;

use crate::recipe::{
    Recipe, RecipeOptions,
    matrix::{self, Variant},
};

/// One variant of a recipe (the recipe itself when it has no `[matrix]`).
pub(crate) struct LockedVariant {
    pub variant: Option<Variant>,
    pub recipe: Recipe,
    /// The lock's file name, beside the recipe.
    pub lock_file: String,
    pub lock_text: String,
}

/// The recipe at `recipe_path`: its text, and every variant in the order `--variant INDEX`
/// counts them, each locked and with a first tag no other has.
pub(crate) fn locked_variants(
    recipe_path: &Path,
) -> Result<(String, Vec<LockedVariant>), Box<dyn std::error::Error>> {
    let text = crate::recipe::read_recipe_text(recipe_path)?;
    let variants = matrix::variants(&text, recipe_path)?;
    let choices: Vec<Option<Variant>> = match variants.is_empty() {
        true => vec![None],
        false => variants.into_iter().map(Some).collect(),
    };
    let mut tags = std::collections::BTreeMap::new();
    let mut locked = Vec::with_capacity(choices.len());
    for variant in choices {
        let options = RecipeOptions {
            variant: variant.clone(),
            ..RecipeOptions::default()
        };
        let recipe = Recipe::load(recipe_path, &options)?;
        let suffix = variant.as_ref().map(Variant::suffix).unwrap_or_default();
        let tag = recipe.tags.first().cloned().unwrap_or_default();
        if let Some(other) = tags.insert(tag.clone(), suffix.clone()) {
            return Err(format!(
                "variants `{other}` and `{suffix}` would both push to tag `{tag}`: put a matrix key in the recipe's tags, e.g. `tags = [\"{{{{python}}}}-{{{{cuda}}}}\"]`"
            )
            .into());
        }
        let (lock_file, lock_text) = read_lock(&recipe, recipe_path)?;
        locked.push(LockedVariant {
            variant,
            recipe,
            lock_file,
            lock_text,
        });
    }
    Ok((text, locked))
}

impl LockedVariant {
    /// The recipe's name without the variant's suffix: what the variants share.
    pub(crate) fn base_name(&self) -> String {
        match &self.variant {
            Some(variant) => self
                .recipe
                .name
                .strip_suffix(&format!("-{}", variant.suffix()))
                .unwrap_or(&self.recipe.name)
                .to_string(),
            None => self.recipe.name.clone(),
        }
    }
}

/// A variant's lock: (file name, text). The cluster builds with `--locked`, so a missing
/// lock is an error here.
fn read_lock(recipe: &Recipe, recipe_path: &Path) -> Result<(String, String), String> {
    let lock_path = recipe.lock_path();
    let lock = crate::fs::read_input_text(&lock_path, crate::lock::MAX_LOCK_BYTES).map_err(|err| {
        if !err.is_not_found() {
            return format!("`{}` cannot be read: {err}", lock_path.display());
        }
        format!(
            "`{}` does not exist: the cluster builds with `--locked`, so lock every variant first (`imgbuild build {}`)",
            lock_path.display(),
            recipe_path.display()
        )
    })?;
    let file_name = lock_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((file_name, lock))
}
