//! `init --from FILE`: which reader a file goes to, by its name, and what comes back: a
//! recipe alone (environment.yml, a pixi manifest without a lock) or a recipe with the lock
//! that goes beside it.
//!
//! Every file is read as a bounded regular file (`fs::read_input_text`): locks to the
//! bound of imgbuild's own lock, manifests and environment files to a recipe's.

use std::path::{Path, PathBuf};

use super::{
    InitError, InitRecipe, conda_lock, explicit, image_name, lockfile,
    pins::{ImportedLock, Pins},
    pixi::{self, Manifest},
};
use crate::{lock::MAX_LOCK_BYTES, recipe::MAX_RECIPE_BYTES};

/// What `init --from` made.
#[derive(Debug, Clone)]
pub enum Converted {
    /// A recipe alone.
    Recipe(InitRecipe),
    /// A recipe and the lock to write beside it.
    Locked(ImportedLock),
}

/// The lock beside the recipe `recipe`: its path with the extension `.lock`, the rule
/// `Recipe::lock_path` follows.
pub fn lock_path_for(recipe: &Path) -> PathBuf {
    recipe.with_extension("lock")
}

/// The kinds of file `init --from` reads, told by the file's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InputKind {
    /// A conda environment file: everything not named below.
    Environment,
    /// `pixi.toml` or `pyproject.toml`.
    Manifest,
    /// `*.lock`, `*.txt`, `conda-lock.yml` or `*.conda-lock.yml` (conda-lock's names; its
    /// input files, `conda-lock-env.yml`, are environment files): pixi.lock, conda-lock.yml, or an
    /// `@EXPLICIT` file (`conda-linux-64.lock`, `spec-file.txt`), told apart by content.
    Lock,
}

fn kind_of(path: &Path) -> InputKind {
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    if name.ends_with(".toml") {
        InputKind::Manifest
    } else if name.ends_with(".lock")
        || name.ends_with(".txt")
        || ["conda-lock.yml", "conda-lock.yaml"]
            .iter()
            .any(|lock| name == *lock || name.ends_with(&format!(".{lock}")))
    {
        InputKind::Lock
    } else {
        InputKind::Environment
    }
}

/// Converts the file at `path`. `output` is where the recipe will be written (a lock goes
/// beside it, so an import that pins needs one), `name` the image name, `environment` the
/// lock's environment (pixi's `default` when `None`).
pub fn convert_file(
    path: &Path,
    output: Option<&Path>,
    name: Option<&str>,
    environment: Option<&str>,
) -> Result<Converted, InitError> {
    match kind_of(path) {
        InputKind::Environment => super::from_environment_file(path, name).map(Converted::Recipe),
        InputKind::Manifest => from_manifest(path, output, name, environment),
        InputKind::Lock => {
            let text = read(path, MAX_LOCK_BYTES)?;
            let recipe = output.ok_or_else(|| InitError::NeedsOutput {
                path: path.to_path_buf(),
            })?;
            let name = image_name(name.unwrap_or(&default_name(path)));
            import_lock(&text, path, recipe, &name, environment).map(Converted::Locked)
        }
    }
}

/// A pixi manifest: imported from the pixi.lock beside it, else its specs alone.
fn from_manifest(
    path: &Path,
    output: Option<&Path>,
    name: Option<&str>,
    environment: Option<&str>,
) -> Result<Converted, InitError> {
    let manifest = Manifest::parse(&read(path, MAX_RECIPE_BYTES)?, path)?;
    let name = image_name(
        name.or(manifest.name.as_deref())
            .unwrap_or(&default_name(path)),
    );
    let lock_path = pixi::lock_beside(path);
    let text = match crate::fs::read_input_text(&lock_path, MAX_LOCK_BYTES) {
        Ok(text) => text,
        Err(crate::fs::InputError::Io(err)) if err.kind() == std::io::ErrorKind::NotFound => {
            return manifest.recipe(path, &name).map(Converted::Recipe);
        }
        Err(err) => return Err(read_error(&lock_path, err)),
    };
    let recipe = output.ok_or_else(|| InitError::NeedsOutput {
        path: path.to_path_buf(),
    })?;
    import_lock(&text, &lock_path, recipe, &name, environment).map(Converted::Locked)
}

/// A lock's `text`, read from `path`, as a recipe at `recipe` and its lock.
fn import_lock(
    text: &str,
    path: &Path,
    recipe: &Path,
    name: &str,
    environment: Option<&str>,
) -> Result<ImportedLock, InitError> {
    if recipe.extension().is_some_and(|e| e == "lock") {
        return Err(InitError::Import {
            path: path.to_path_buf(),
            reason: format!(
                "the recipe `{}` would be its own lock; name it `….toml`",
                recipe.display()
            ),
        });
    }
    let mut notes = Vec::new();
    let pins = read_pins(text, path, environment, &mut notes)?;
    pins.into_import(path, recipe, name, notes)
}

/// The pins of a lock's `text`: an `@EXPLICIT` file, or a lock rattler_lock reads.
fn read_pins(
    text: &str,
    path: &Path,
    environment: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<Pins, InitError> {
    let import_error = |reason: String| InitError::Import {
        path: path.to_path_buf(),
        reason,
    };
    if text.lines().any(|line| line.trim() == "@EXPLICIT") {
        if let Some(environment) = environment {
            return Err(import_error(format!(
                "an @EXPLICIT file has one environment, not `{environment}`"
            )));
        }
        return explicit::pins(text, notes).map_err(import_error);
    }
    let lock = lockfile::parse(text, path)?;
    let environment = environment.unwrap_or(rattler_lock::DEFAULT_ENVIRONMENT_NAME);
    let mut pins = lockfile::pins(&lock, environment, path)?;
    // Parsed again as plain YAML for what rattler_lock does not model; it parsed once.
    if let Ok(document) = serde_yaml::from_str::<serde_yaml::Value>(text)
        && conda_lock::is_conda_lock(&document)
    {
        conda_lock::drop_optional(&document, &mut pins, notes);
    }
    Ok(pins)
}

/// The image name when nothing names one: the project directory's name, else the file's.
fn default_name(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    absolute
        .parent()
        .and_then(|p| p.file_name())
        .or_else(|| path.file_stem())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "app".to_string())
}

fn read(path: &Path, max: u64) -> Result<String, InitError> {
    crate::fs::read_input_text(path, max).map_err(|e| read_error(path, e))
}

fn read_error(path: &Path, err: crate::fs::InputError) -> InitError {
    InitError::Read {
        path: path.to_path_buf(),
        source: match err {
            crate::fs::InputError::Io(source) => source,
            other => std::io::Error::other(other),
        },
    }
}
