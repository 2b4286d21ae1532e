//! `imgbuild sbom`: an SPDX or CycloneDX SBOM from a recipe's lock, to stdout or a file.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use url::Url;

use super::{fail, source_date_epoch};
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
pub struct SbomArgs {
    /// A recipe (its lock is read) or a lock file
    pub input: PathBuf,
    /// The SBOM format
    #[arg(long, value_enum, default_value = "spdx")]
    pub format: SbomFormat,
    /// Write the SBOM to this file instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
pub(super) fn run_sbom(args: &SbomArgs, channel_alias: &Url) -> ExitCode {
    let source_date_epoch = match source_date_epoch() {
        Ok(value) => value,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(1);
        }
    };
    let options = RecipeOptions {
        channel_alias: channel_alias.clone(),
        variant: None,
    };
    let (lock, subject) = match load_input(&args.input, &options, source_date_epoch) {
        Ok(input) => input,
        Err(err) => {
            let code = err.exit_code() as u8;
            return fail(&err, code);
        }
    };
    let text = render(&lock, &subject, args.format);
    match &args.output {
        None => print!("{text}"),
        Some(path) => {
            if let Err(source) = crate::fs::write_atomic(path, text.as_bytes()) {
                let err = crate::sbom::SbomError::Write {
                    path: path.clone(),
                    source,
                };
                return fail(&err, 2);
            }
            println!("{}", path.display());
        }
    }
    ExitCode::SUCCESS
}
