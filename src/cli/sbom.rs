//! `imgbuild sbom`: an SPDX or CycloneDX SBOM from a recipe's lock, to stdout or a file.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::{
    Env,
    printer::{CommandFailure, Printer},
};
use crate::{
    recipe::RecipeOptions,
    sbom::{SbomFormat, load_input, render},
};

pub(super) const SBOM_EXAMPLES: &str = "\
Examples:
  imgbuild sbom recipes/py39-torch21.toml         # SPDX 2.3 JSON from recipes/py39-torch21.lock
  imgbuild sbom recipes/py39-torch21.lock --format cyclonedx -o torch.cdx.json

`imgbuild build` writes both formats beside the image (images/NAME.spdx.json and
images/NAME.cdx.json), with the image's manifest digest in them.";

#[derive(Debug, Args)]
pub(crate) struct SbomArgs {
    /// A recipe (its lock is read) or a lock file
    pub input: PathBuf,
    /// The SBOM format
    #[arg(long, value_enum, default_value = "spdx")]
    pub format: SbomFormat,
    /// Write the SBOM to this file instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub(super) fn run_sbom(
    args: &SbomArgs,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let options = RecipeOptions {
        channel_alias: env.global.channel_alias.clone(),
        variant: None,
    };
    let (lock, subject) =
        load_input(&args.input, &options, env.source_date_epoch).map_err(|err| {
            let code = err.exit_code() as u8;
            CommandFailure::new(err, code)
        })?;
    let text = render(&lock, &subject, args.format);
    match &args.output {
        None => printer.document(&text),
        Some(path) => {
            crate::fs::write_atomic(path, text.as_bytes()).map_err(|source| {
                let err = crate::sbom::SbomError::Write {
                    path: path.clone(),
                    source,
                };
                CommandFailure::new(err, 2)
            })?;
            printer.result(path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
