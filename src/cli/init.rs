//! `imgbuild init`: a starter recipe or one converted from a conda `environment.yml`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{CommandFailure, Printer};
use crate::init::{InitError, from_environment_file, image_name, starter_recipe, write_new};

pub(super) const INIT_EXAMPLES: &str = "\
Examples:
  imgbuild init -o recipes/app.toml                # a commented starter recipe
  imgbuild init --from environment.yml -o recipes/ds.toml
  imgbuild init --from environment.yml --name ds   # to stdout

The conversion keeps what conda would do on Linux: `nodefaults`, or else conda's implicit
`defaults` channels; CUDA (`cuda-version=`, `cudatoolkit=`, `pytorch-cuda=`, `*cuda*` builds)
as [cuda] version; `platforms:` as [image] platforms; `channel_priority:` strict or
disabled as [conda] channel-priority; the `pip:` section as [pypi] (requirements, --index-url,
--extra-index-url, --find-links, --no-index). What a recipe cannot express (`-r`/`-e` lines,
direct URLs, other pip options, other sections) is kept in a comment block of the recipe;
it, and anything conda would do differently on Linux, is reported on stderr as a warning.";

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Convert this conda environment file (environment.yml) instead of writing a starter
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Write the recipe to this file (never overwritten) instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The image name [default: the environment's name, or `app`]
    #[arg(long)]
    pub name: Option<String>,
}

pub(super) fn run_init(args: &InitArgs, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let made = match &args.from {
        Some(path) => from_environment_file(path, args.name.as_deref()),
        None => Ok(crate::init::InitRecipe {
            text: starter_recipe(&image_name(args.name.as_deref().unwrap_or("app"))),
            notes: Vec::new(),
        }),
    };
    let made = made.map_err(failure)?;
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

fn failure(err: InitError) -> CommandFailure {
    let code = err.exit_code() as u8;
    CommandFailure::new(err, code)
}
