//! `imgbuild notebook`: runs a notebook headless in an image and records what each cell
//! printed, so that a later run, with the same image or another, can be checked against it.
//!
//! The steps, each its own module: read and check the notebook ([`source`]); read the
//! earlier statement when verifying ([`record::read_previous`]); read the image's layout
//! (its manifest digest and user); run nbclient in the image under podman ([`runner`]);
//! then record the cells' outputs and compare them ([`record`]).

pub(crate) mod record;
mod runc;
pub(crate) mod runner;
pub(crate) mod source;

use std::path::PathBuf;

use serde_json::Value;

use crate::oci::read::{LayoutRef, ReadLayoutRef};
pub(crate) use record::{CellDifference, RunExit, RunPredicate};
use source::Notebook;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct NotebookRequest {
    /// The layout `DIR[:TAG]`, as given.
    pub image: String,
    pub notebook: PathBuf,
    /// `--user`, over the image's own.
    pub user: Option<String>,
    pub python: String,
    pub cell_timeout: u64,
    pub max_output: u64,
    /// `--verify`: the statement of the earlier run.
    pub verify: Option<PathBuf>,
    /// The recipe's directory, for a `[[checks]]` entry: `notebook` and `verify` are then
    /// relative to it and read beneath it.
    pub beneath: Option<std::sync::Arc<crate::fs::context::BuildContext>>,
}

/// A finished run (every cell ran, or one failed).
#[derive(Debug)]
pub(crate) struct NotebookRun {
    /// The in-toto statement of the run.
    pub statement: Value,
    pub predicate: RunPredicate,
    /// The executed notebook, as nbformat wrote it.
    pub executed: String,
    /// With `--verify`: the first cell that differs, if any.
    pub verified: Option<Option<CellDifference>>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NotebookError {
    #[error(transparent)]
    Source(#[from] source::SourceError),
    #[error(transparent)]
    Previous(#[from] record::PreviousError),
    #[error("Cannot open image `{image}`")]
    Open {
        image: String,
        #[source]
        source: crate::oci::read::ReadError,
    },
    #[error(
        "The image `{image}` runs as root ({why}); notebooks run as a non-root user: give `--user UID[:GID]` (e.g. `--user 1000`), or set `[image] user` in its recipe"
    )]
    Root { image: String, why: String },
    #[error(transparent)]
    Run(#[from] runner::RunError),
    #[error("The executed notebook that came back is not the one that was run: {0}")]
    Executed(String),
    #[error(transparent)]
    Attest(#[from] crate::attest::AttestError),
}

impl NotebookError {
    /// 1 when the input (notebook, statement, image) is at fault, 2 when the machine is.
    pub(crate) fn exit_code(&self) -> u8 {
        use runner::RunError;
        match self {
            NotebookError::Run(RunError::Spawn { .. } | RunError::Stage(_)) => 2,
            _ => 1,
        }
    }
}

/// Runs the notebook of `request` in its image.
pub(crate) fn run(request: &NotebookRequest) -> Result<NotebookRun, NotebookError> {
    let files = match &request.beneath {
        Some(context) => source::Files::Beneath(context),
        None => source::Files::Operator,
    };
    let notebook = Notebook::read(files, &request.notebook)?;
    let previous = match &request.verify {
        Some(path) => Some(record::read_previous(files, path, &notebook)?),
        None => None,
    };
    let layout = LayoutRef::parse(&request.image);
    let image = layout.image(None).map_err(|source| NotebookError::Open {
        image: request.image.clone(),
        source,
    })?;
    let image_user = image
        .config
        .config()
        .as_ref()
        .and_then(|c| c.user().clone())
        .unwrap_or_default();
    check_user(&request.image, request.user.as_deref(), &image_user)?;
    let plan = runner::RunPlan {
        layout: layout.dir.clone(),
        tag: layout.tag().to_string(),
        user: request.user.clone(),
        python: request.python.clone(),
        cell_timeout: request.cell_timeout,
        max_output: request.max_output,
    };
    let (result, runtime) = run_in_image(&plan, &notebook.bytes)?;
    let predicate = predicate(&notebook, &result, runtime)?;
    let statement = crate::attest::statement(
        &request.image,
        &image.manifest_digest,
        record::NOTEBOOK_RUN_V1,
        serde_json::to_value(&predicate).expect("the predicate serializes"),
    )?;
    let verified = previous.map(|p| record::first_difference(&p.cells, &predicate.cells));
    Ok(NotebookRun {
        statement,
        predicate,
        executed: result.notebook,
        verified,
    })
}

/// Runs `notebook` (its bytes) as `plan` says: the driver's result, and what ran it.
fn run_in_image(
    plan: &runner::RunPlan,
    notebook: &[u8],
) -> Result<(runner::DriverResult, runner::Runtime), runner::RunError> {
    let runtime = runner::Runtime::find()?;
    // The bytes that were read and hashed are what runs: a private copy, readable by the
    // container's user.
    let staged = tempfile::Builder::new()
        .prefix("imgbuild-notebook-")
        .tempdir()
        .map_err(runner::RunError::Stage)?;
    let notebook_dir = staged.path().join("notebook");
    fs_err::create_dir(&notebook_dir).map_err(runner::RunError::Stage)?;
    crate::fs::write_atomic(&notebook_dir.join("notebook.ipynb"), notebook)
        .map_err(runner::RunError::Stage)?;
    for dir in [staged.path(), &notebook_dir] {
        crate::fs::set_mode(dir, 0o755).map_err(runner::RunError::Stage)?;
    }
    let name = format!("imgbuild-notebook-{}", runner::unique());
    let (status, stdout, stderr) = match runtime {
        runner::Runtime::Podman => {
            let image = runner::load(plan)?;
            let args = runner::run_args(plan, &image, &name, &notebook_dir);
            let remove = ["rm", "--force", "--time=0", &name];
            runner::execute("podman", &args, plan.max_output, &remove)?
        }
        runner::Runtime::Runc => {
            let bundle = runc::bundle(plan, &notebook_dir, staged.path())?;
            let args = ["run", "--bundle", &bundle.display().to_string(), &name].map(String::from);
            runner::execute(
                "runc",
                &args,
                plan.max_output,
                &["delete", "--force", &name],
            )?
        }
    };
    runner::driver_result(status, &stdout, &stderr).map(|result| (result, runtime))
}

/// Refuses a run as root: the image's user when no `--user` is given, else that one.
fn check_user(image: &str, given: Option<&str>, image_user: &str) -> Result<(), NotebookError> {
    let (user, whose) = match given {
        Some(user) => (user, "`--user`"),
        None => (image_user, "its config's User"),
    };
    let name = user.split(':').next().unwrap_or_default();
    let why = match name {
        "" => format!("{whose} is empty"),
        "0" | "root" => format!("{whose} is `{user}`"),
        _ => return Ok(()),
    };
    Err(NotebookError::Root {
        image: image.to_string(),
        why,
    })
}

/// The record of the run: each code cell's outputs up to the first that failed.
fn predicate(
    notebook: &Notebook,
    result: &runner::DriverResult,
    runtime: runner::Runtime,
) -> Result<RunPredicate, NotebookError> {
    let executed: Value = serde_json::from_str(&result.notebook)
        .map_err(|e| NotebookError::Executed(e.to_string()))?;
    let (_, executed_cells) = source::check(&executed).map_err(NotebookError::Executed)?;
    let cells = executed["cells"].as_array().cloned().unwrap_or_default();
    if executed_cells
        .iter()
        .map(|c| c.index)
        .ne(notebook.code_cells.iter().map(|c| c.index))
    {
        return Err(NotebookError::Executed(
            "its code cells are not the notebook's".into(),
        ));
    }
    let failed = result.error.as_ref().and_then(|e| e.cell);
    let records = notebook
        .code_cells
        .iter()
        .filter(|cell| failed.is_none_or(|failed| cell.index <= failed))
        .map(|cell| record::cell_record(cell, &cells[cell.index]))
        .collect();
    let exit = match &result.error {
        Some(error) => {
            let index = error.cell.unwrap_or_default();
            let id = notebook.code_cells.iter().find(|c| c.index == index);
            RunExit::Failed {
                index,
                id: id.and_then(|c| c.id.clone()),
                error: error.ename.clone(),
            }
        }
        None => RunExit::Ok,
    };
    Ok(RunPredicate {
        notebook: record::NotebookRecord {
            name: notebook.name(),
            sha256: notebook.sha256.clone(),
            nbformat: notebook.nbformat.clone(),
        },
        kernel: record::KernelRecord {
            name: result.kernel.clone(),
            language: result.language.clone(),
            language_version: result.version.clone(),
        },
        cells: records,
        exit,
        runner: runtime.name().into(),
        imgbuild: env!("CARGO_PKG_VERSION").into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_refused_whether_the_image_or_the_flag_names_it() {
        for (given, image) in [
            (None, ""),
            (None, "root"),
            (None, "0:0"),
            (Some("0"), "1000"),
        ] {
            let err = check_user("images/x", given, image).unwrap_err();
            assert!(err.to_string().contains("--user UID[:GID]"), "{err}");
        }
        assert!(check_user("images/x", None, "jovyan").is_ok());
        assert!(check_user("images/x", Some("1000:100"), "").is_ok());
    }
}
