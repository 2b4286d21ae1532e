//! The notebook a user hands to `imgbuild notebook`: read once, bounded, as a regular file,
//! and checked to be a Jupyter notebook of nbformat 4 before anything runs. The bytes read
//! here are what is hashed and what the container runs (they are copied into a private
//! file for it), so the statement names exactly the notebook that ran.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The largest notebook read: a notebook with outputs saved can be large, but one beyond
/// this is not a source to re-run.
pub(crate) const MAX_NOTEBOOK_BYTES: u64 = 16 << 20;

/// The tag that leaves a cell out of `--verify`'s comparison: its outputs may differ from run
/// to run (a time, a random number), so only that it ran is recorded.
pub(crate) const VOLATILE_TAG: &str = "imgbuild:volatile";

#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error("Cannot read the notebook `{}`: it {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: ReadFailure,
    },
    #[error("The notebook `{}` is not JSON: {reason}", path.display())]
    NotJson { path: PathBuf, reason: String },
    #[error("The notebook `{}` is not a Jupyter notebook of nbformat 4: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
}

/// A checked notebook.
#[derive(Debug, Clone)]
pub(crate) struct Notebook {
    pub path: PathBuf,
    /// The exact bytes read, which [`Notebook::sha256`] names and the container runs.
    pub bytes: Vec<u8>,
    /// Hex.
    pub sha256: String,
    /// `4.N`.
    pub nbformat: String,
    pub code_cells: Vec<CodeCell>,
}

/// A code cell: where it is among all the notebook's cells, its id (nbformat 4.5 and
/// later; older notebooks have none) and whether it is tagged [`VOLATILE_TAG`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CodeCell {
    pub index: usize,
    pub id: Option<String>,
    pub volatile: bool,
}

/// Why [`Files::read`] read nothing: the operator's file ([`crate::fs::InputError`]) or a
/// recipe's ([`crate::fs::context::ContextError`]).
pub(crate) type ReadFailure = Box<dyn std::error::Error + Send + Sync>;

/// Where the notebook and the earlier statement are read from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Files<'a> {
    /// Paths the operator named on the command line, read as given.
    Operator,
    /// Paths a recipe's `[[checks]]` named: relative to its directory and read beneath it,
    /// never through a link or `..` out of it.
    Beneath(&'a crate::fs::context::BuildContext),
}

impl Files<'_> {
    /// The regular file `path`, of at most `max` bytes.
    pub(crate) fn read(self, path: &Path, max: u64) -> Result<Vec<u8>, ReadFailure> {
        match self {
            Files::Operator => Ok(crate::fs::read_input(path, max)?),
            Files::Beneath(context) => Ok(context.read_bounded(path, max)?),
        }
    }

    /// `path` as messages name it.
    pub(crate) fn shown(self, path: &Path) -> PathBuf {
        match self {
            Files::Operator => path.to_path_buf(),
            Files::Beneath(context) => context.host_path(path),
        }
    }
}

impl Notebook {
    /// Reads and checks the notebook at `path`.
    pub(crate) fn read(files: Files<'_>, path: &Path) -> Result<Notebook, SourceError> {
        let bytes = files
            .read(path, MAX_NOTEBOOK_BYTES)
            .map_err(|source| SourceError::Read {
                path: files.shown(path),
                source,
            })?;
        let path = &files.shown(path);
        let document: Value = serde_json::from_slice(&bytes).map_err(|e| SourceError::NotJson {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let format = |reason: String| SourceError::Format {
            path: path.to_path_buf(),
            reason,
        };
        let (nbformat, code_cells) = check(&document).map_err(format)?;
        Ok(Notebook {
            path: path.to_path_buf(),
            sha256: hex::encode(Sha256::digest(&bytes)),
            bytes,
            nbformat,
            code_cells,
        })
    }

    /// The file name, as the statement records it.
    pub(crate) fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The nbformat version and the code cells of `document`, or why it is no notebook of
/// nbformat 4 (the one nbclient runs).
pub(crate) fn check(document: &Value) -> Result<(String, Vec<CodeCell>), String> {
    let object = document
        .as_object()
        .ok_or("its top level is not a JSON object")?;
    let major = object.get("nbformat").and_then(Value::as_u64);
    if major != Some(4) {
        return Err(format!(
            "`nbformat` is {}, not 4",
            object.get("nbformat").unwrap_or(&Value::Null)
        ));
    }
    let minor = object
        .get("nbformat_minor")
        .and_then(Value::as_u64)
        .ok_or("`nbformat_minor` is not a number")?;
    let cells = object
        .get("cells")
        .and_then(Value::as_array)
        .ok_or("`cells` is not a list")?;
    let mut code_cells = Vec::new();
    for (index, cell) in cells.iter().enumerate() {
        let kind = cell
            .get("cell_type")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("cell {index} has no `cell_type`"))?;
        if kind == "code" {
            code_cells.push(code_cell(index, cell)?);
        }
    }
    Ok((format!("4.{minor}"), code_cells))
}

fn code_cell(index: usize, cell: &Value) -> Result<CodeCell, String> {
    let id = match cell.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(other) => return Err(format!("cell {index}'s `id` is {other}, not a string")),
    };
    let source = cell.get("source");
    let source_ok = match source {
        Some(Value::String(_)) => true,
        Some(Value::Array(lines)) => lines.iter().all(Value::is_string),
        _ => false,
    };
    if !source_ok {
        return Err(format!(
            "cell {index}'s `source` is not a string or a list of strings"
        ));
    }
    let tags = cell.pointer("/metadata/tags").and_then(Value::as_array);
    let volatile = tags.is_some_and(|tags| tags.iter().any(|t| t == VOLATILE_TAG));
    Ok(CodeCell {
        index,
        id,
        volatile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn code_cells_are_found_with_their_index_id_and_tag() {
        let document = json!({
            "nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [
                {"cell_type": "markdown", "id": "m", "source": "# x", "metadata": {}},
                {"cell_type": "code", "id": "a", "source": ["1"], "metadata": {}, "outputs": []},
                {"cell_type": "code", "id": "b", "source": "2", "outputs": [],
                 "metadata": {"tags": ["imgbuild:volatile"]}},
            ]
        });
        let (version, cells) = check(&document).unwrap();
        assert_eq!(version, "4.5");
        assert_eq!(
            cells,
            vec![
                CodeCell {
                    index: 1,
                    id: Some("a".into()),
                    volatile: false
                },
                CodeCell {
                    index: 2,
                    id: Some("b".into()),
                    volatile: true
                },
            ]
        );
    }

    #[test]
    fn what_is_no_notebook_of_nbformat_4_is_refused() {
        for (document, reason) in [
            (json!([1]), "not a JSON object"),
            (
                json!({"nbformat": 3, "cells": []}),
                "`nbformat` is 3, not 4",
            ),
            (json!({"nbformat": 4, "cells": []}), "`nbformat_minor`"),
            (
                json!({"nbformat": 4, "nbformat_minor": 5, "cells": {}}),
                "`cells` is not a list",
            ),
            (
                json!({"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "code", "source": 7}]}),
                "cell 0's `source`",
            ),
        ] {
            let err = check(&document).unwrap_err();
            assert!(err.contains(reason), "{err}");
        }
    }
}
