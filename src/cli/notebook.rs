//! `imgbuild notebook`: runs a notebook in an image and writes the executed notebook and an
//! in-toto statement of its outputs; `--verify` compares the run with an earlier one.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Args;

use super::printer::{CommandFailure, Printer};
use crate::notebook::{NotebookRequest, NotebookRun, RunExit};

pub(super) const NOTEBOOK_EXAMPLES: &str = "\
Examples:
  imgbuild notebook images/jupyter analysis.ipynb     # writes analysis.executed.ipynb and
                                                      # analysis.intoto.json beside it
  imgbuild notebook images/jupyter:v2 analysis.ipynb --verify analysis.intoto.json
  imgbuild notebook images/app analysis.ipynb --user 1000 --timeout 120 -o out.ipynb
  imgbuild notebook --recipe recipes/jupyter.toml   # its [[checks]], in images/NAME

Runs under podman, else runc with umoci (no network, no capabilities, the notebook
read-only), as the image's user, never root, with the image's own nbclient (`python3 -c …`
on the image's PATH).
Cells tagged `imgbuild:volatile` are recorded but left out of --verify's comparison.

Exit codes: 0 every cell ran (and, with --verify, matched the earlier run), 3 a cell
raised or ran past --timeout (the outputs and the statement are still written), 4 --verify:
a cell's outputs differ from the earlier run (the first one is named, with its lines), 1 the
notebook, the statement, the image or its user cannot be used, 2 neither podman nor runc
can be run, or an output cannot be written.";

#[derive(Debug, Args)]
pub(crate) struct NotebookArgs {
    /// The image: an OCI layout directory, optionally with `:TAG` [default with --recipe:
    /// images/NAME, where `build` writes it]
    #[arg(required_unless_present = "recipe")]
    pub image: Option<String>,
    /// The notebook (nbformat 4, at most 16 MiB)
    #[arg(required_unless_present = "recipe")]
    pub notebook: Option<PathBuf>,
    /// Run the recipe's `[[checks]]` instead, in the image it built: each notebook, against
    /// its `expect` statement when it names one; the outputs go to images/NAME.checks/
    #[arg(long, value_name = "RECIPE", conflicts_with_all = ["notebook", "output", "attest", "verify"])]
    pub recipe: Option<PathBuf>,
    /// Where the executed notebook goes [default: NAME.executed.ipynb beside the notebook]
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Where the in-toto statement of the run goes [default: NAME.intoto.json beside the
    /// notebook; with --verify, NAME.verify.intoto.json]
    #[arg(long, value_name = "FILE")]
    pub attest: Option<PathBuf>,
    /// Compare the run, cell by cell, with the earlier run this statement records (of the
    /// same notebook; the image may differ); exit 4 when a cell differs
    #[arg(long, value_name = "STATEMENT")]
    pub verify: Option<PathBuf>,
    /// Run as UID[:GID] (or a name of the image) instead of the image's user; never root
    #[arg(long, value_name = "UID[:GID]")]
    pub user: Option<String>,
    /// Seconds each cell may run before the run stops there (nbclient's timeout)
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
    /// The image's Python that runs nbclient: a name on the image's PATH or an absolute path
    #[arg(long, value_name = "PYTHON", default_value = "python3")]
    pub python: String,
    /// The most bytes of executed notebook read back from the container
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    pub max_output: u64,
}

/// `DIR/NAME.SUFFIX` for the notebook `DIR/NAME.ipynb`.
fn beside(notebook: &Path, suffix: &str) -> PathBuf {
    let stem = notebook
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "notebook".into());
    notebook.with_file_name(format!("{stem}.{suffix}"))
}

pub(super) fn run_notebook(
    args: &NotebookArgs,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    if let Some(recipe) = &args.recipe {
        return run_checks(args, recipe, printer);
    }
    let (Some(image), Some(notebook)) = (&args.image, &args.notebook) else {
        unreachable!("clap requires both without --recipe");
    };
    let request = request(args, image.clone(), notebook.clone(), args.verify.clone());
    let run = crate::notebook::run(&request).map_err(failure)?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| beside(notebook, "executed.ipynb"));
    let default_statement = match args.verify {
        Some(_) => "verify.intoto.json",
        None => "intoto.json",
    };
    let attest = args
        .attest
        .clone()
        .unwrap_or_else(|| beside(notebook, default_statement));
    write_outputs(&run, &output, &attest, printer)?;
    verdict(&run, printer)
}

fn request(
    args: &NotebookArgs,
    image: String,
    notebook: PathBuf,
    verify: Option<PathBuf>,
) -> NotebookRequest {
    NotebookRequest {
        image,
        notebook,
        user: args.user.clone(),
        python: args.python.clone(),
        cell_timeout: args.timeout,
        max_output: args.max_output,
        verify,
        beneath: None,
    }
}

fn failure(err: crate::notebook::NotebookError) -> CommandFailure {
    let code = err.exit_code();
    CommandFailure::new(err, code)
}

/// `--recipe`: every `[[checks]]` entry in turn, its files read beneath the recipe's
/// directory and its outputs written under `images/NAME.checks/` (never beside the
/// notebook: the recipe's directory is a stranger's, where a link could lead a write out).
/// A notebook or statement that cannot be used stops the run; a cell that fails or differs
/// is reported and the other checks still run; the exit is the first such check's.
fn run_checks(
    args: &NotebookArgs,
    recipe_path: &Path,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let recipe = crate::recipe::Recipe::load(recipe_path, &Default::default())
        .map_err(|err| CommandFailure::new(err, 1))?;
    if recipe.checks.is_empty() {
        return Err(CommandFailure::new(
            format!("`{}` has no `[[checks]]` to run", recipe_path.display()),
            1,
        ));
    }
    let dir = match recipe_path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let context = crate::fs::context::BuildContext::open(dir)
        .map_err(|err| CommandFailure::new(format!("Cannot open `{}`: {err}", dir.display()), 1))?;
    let image = (args.image.clone()).unwrap_or_else(|| format!("images/{}", recipe.name));
    let out = Path::new("images").join(format!("{}.checks", recipe.name));
    fs_err::create_dir_all(&out).map_err(|e| CommandFailure::new(e, 2))?;
    let mut first_failure = None;
    for check in &recipe.checks {
        printer.status("Checking", check.notebook.display());
        let mut request = request(
            args,
            image.clone(),
            check.notebook.clone(),
            check.expect.clone(),
        );
        request.beneath = Some(context.clone());
        let run = crate::notebook::run(&request).map_err(failure)?;
        let stem = beside(
            &out.join(check.notebook.file_name().unwrap_or_default()),
            "",
        );
        let stem = stem.to_string_lossy();
        let (output, attest) = (
            format!("{stem}executed.ipynb"),
            format!("{stem}intoto.json"),
        );
        write_outputs(&run, Path::new(&output), Path::new(&attest), printer)?;
        if let Err(failed) = verdict(&run, printer) {
            printer.warning(&format!(
                "{}: {}",
                check.notebook.display(),
                failed.message()
            ));
            first_failure.get_or_insert(failed);
        }
    }
    first_failure.map_or(Ok(ExitCode::SUCCESS), Err)
}

fn write_outputs(
    run: &NotebookRun,
    output: &Path,
    attest: &Path,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let statement = serde_json::to_string_pretty(&run.statement).expect("JSON serializes") + "\n";
    for (path, bytes, what) in [
        (output, run.executed.as_bytes(), "the executed notebook"),
        (attest, statement.as_bytes(), "the statement"),
    ] {
        crate::fs::write_atomic(path, bytes).map_err(|e| {
            CommandFailure::new(
                format!("Failed to write {what} `{}`: {e}", path.display()),
                2,
            )
        })?;
        printer.status("Wrote", format_args!("{what} to {}", path.display()));
    }
    Ok(())
}

/// The run's exit, then `--verify`'s.
fn verdict(run: &NotebookRun, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let predicate = &run.predicate;
    if let RunExit::Failed { index, id, error } = &predicate.exit {
        return Err(CommandFailure::new(
            format!(
                "cell {} raised {error}; the cells after it did not run",
                cell_name(*index, id.as_deref())
            ),
            3,
        ));
    }
    let compared = predicate.cells.iter().filter(|c| !c.volatile).count();
    match &run.verified {
        Some(Some(difference)) => Err(CommandFailure::new(
            format!(
                "cell {} differs from the earlier run:\n{}",
                cell_name(difference.index, difference.id.as_deref()),
                difference.diff.join("\n")
            ),
            4,
        )),
        Some(None) => {
            printer.result(format_args!(
                "verified: {compared} cells match the earlier run ({} volatile left out)",
                predicate.cells.len() - compared
            ));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            printer.result(format_args!(
                "ran {} code cells with kernel {} ({} {})",
                predicate.cells.len(),
                predicate.kernel.name,
                predicate.kernel.language,
                predicate.kernel.language_version
            ));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `3 (id "a1b2")`, or `3` for a cell without an id.
fn cell_name(index: usize, id: Option<&str>) -> String {
    match id {
        Some(id) => format!("{index} (id `{id}`)"),
        None => index.to_string(),
    }
}
