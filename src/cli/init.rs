//! `imgbuild init`: a starter recipe, one converted from a conda `environment.yml`, or one
//! imported with its lock from pixi or conda-lock.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{CommandFailure, Printer};
use crate::init::{
    Converted, InitError, InitRecipe, convert_file, image_name, lock_path_for, starter_recipe,
    write_new,
};

pub(super) const INIT_EXAMPLES: &str = "\
Examples:
  imgbuild init -o recipes/app.toml                # a commented starter recipe
  imgbuild init --from environment.yml -o recipes/ds.toml
  imgbuild init --from environment.yml --name ds   # to stdout
  imgbuild init --from pixi.lock -o recipes/pixi.toml   # and recipes/pixi.lock: its pins
  imgbuild init --from pixi.lock --environment py312 -o recipes/py312.toml
  imgbuild init --from conda-lock.yml -o recipes/locked.toml
  imgbuild init --from conda-linux-64.lock -o recipes/explicit.toml   # @EXPLICIT

The conversion keeps what conda would do on Linux: `nodefaults`, or else conda's implicit
`defaults` channels; CUDA (`cuda-version=`, `cudatoolkit=`, `pytorch-cuda=`, `*cuda*` builds)
as [cuda] version; `platforms:` as [image] platforms; `channel_priority:` strict or
disabled as [conda] channel-priority; the `pip:` section as [pypi] (requirements, --index-url,
--extra-index-url, --find-links, --no-index). What a recipe cannot express (`-r`/`-e` lines,
direct URLs, other pip options, other sections) is kept in a comment block of the recipe;
it, and anything conda would do differently on Linux, is reported on stderr as a warning.

A lock (pixi.lock, conda-lock.yml, an @EXPLICIT file; pixi.toml or pyproject.toml with the
pixi.lock beside them) is imported without solving: the recipe goes to -o FILE.toml and the
lock, holding exactly the file's pins, to FILE.lock beside it, for `imgbuild build --locked`.
Its Linux platforms become [image] platforms; the others are named in a warning and dropped.";

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Convert this file instead of writing a starter: environment.yml, or import pixi.lock,
    /// pixi.toml, pyproject.toml, conda-lock.yml or an @EXPLICIT file with its pins
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// The environment of a pixi.lock to import [default: `default`]
    #[arg(long, value_name = "NAME", requires = "from")]
    pub environment: Option<String>,
    /// Write the recipe to this file (never overwritten) instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The image name [default: the environment's name, or `app`]
    #[arg(long)]
    pub name: Option<String>,
}

pub(super) fn run_init(args: &InitArgs, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let made = match &args.from {
        Some(path) => convert_file(
            path,
            args.output.as_deref(),
            args.name.as_deref(),
            args.environment.as_deref(),
        ),
        None => Ok(Converted::Recipe(InitRecipe {
            text: starter_recipe(&image_name(args.name.as_deref().unwrap_or("app"))),
            notes: Vec::new(),
        })),
    };
    let made = match made.map_err(failure)? {
        Converted::Recipe(recipe) => recipe,
        Converted::Locked(imported) => return write_imported(args, &imported, printer),
    };
    // Notes are warnings about the conversion: shown even with --quiet.
    for note in &made.notes {
        printer.warning(note);
    }
    match &args.output {
        None => printer.document(&made.text),
        Some(path) => {
            write_new(path, &made.text).map_err(failure)?;
            printer.status("Wrote", path.display());
            printer.result(path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes an imported recipe and its lock beside it, neither over an existing file: both
/// are checked before either is written.
fn write_imported(
    args: &InitArgs,
    imported: &crate::init::ImportedLock,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let recipe = args.output.as_deref().expect("an import has an output");
    let lock = lock_path_for(recipe);
    for path in [recipe, lock.as_path()] {
        if path.symlink_metadata().is_ok() {
            return Err(failure(InitError::Exists {
                path: path.to_path_buf(),
            }));
        }
    }
    for note in &imported.recipe.notes {
        printer.warning(note);
    }
    write_new(&lock, &imported.lock).map_err(failure)?;
    write_new(recipe, &imported.recipe.text).map_err(failure)?;
    printer.status(
        "Wrote",
        format_args!("{} and {}", recipe.display(), lock.display()),
    );
    printer.result(recipe.display());
    Ok(ExitCode::SUCCESS)
}

fn failure(err: InitError) -> CommandFailure {
    let code = err.exit_code() as u8;
    CommandFailure::new(err, code)
}
