//! What a run records and how two runs are compared: each code cell's outputs, normalized
//! and hashed; the in-toto statement of the run; and the comparison with an earlier
//! statement (`--verify`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::source::{CodeCell, Notebook};

/// `predicateType` of the statement `imgbuild notebook` writes.
pub(crate) const NOTEBOOK_RUN_V1: &str = "https://imgbuild.dev/attestations/notebook-run/v1";

/// The largest earlier statement `--verify` reads (one holds a digest and a short text per
/// cell).
pub(crate) const MAX_STATEMENT_BYTES: u64 = 4 << 20;

/// How much of a cell's output text the statement keeps, for the diff `--verify` shows.
const TEXT_KEPT: usize = 2000;

/// One code cell's outputs as a run recorded them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CellRecord {
    pub index: usize,
    pub id: Option<String>,
    /// sha256 (hex) of the normalized outputs (see [`normalized_outputs`]).
    pub sha256: String,
    /// Left out of `--verify`'s comparison (tagged `imgbuild:volatile`).
    pub volatile: bool,
    /// The outputs' text (streams, `text/plain`, errors' `ename: evalue`), its first
    /// [`TEXT_KEPT`] characters.
    pub text: String,
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub(crate) enum RunExit {
    Ok,
    /// The first cell that raised (or ran past its timeout); the cells after it did not run.
    Failed {
        index: usize,
        id: Option<String>,
        error: String,
    },
}

/// The predicate of [`NOTEBOOK_RUN_V1`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunPredicate {
    pub notebook: NotebookRecord,
    pub kernel: KernelRecord,
    pub cells: Vec<CellRecord>,
    pub exit: RunExit,
    /// What ran the container: `podman` or `runc`.
    pub runner: String,
    pub imgbuild: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NotebookRecord {
    pub name: String,
    pub sha256: String,
    pub nbformat: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct KernelRecord {
    pub name: String,
    pub language: String,
    pub language_version: String,
}

/// The outputs of a cell, normalized so that two runs printing the same things hash alike:
/// - `execution_count` is dropped: it counts executions, not results;
/// - an error keeps `ename` and `evalue` but not its traceback, which names the execution
///   count (`Cell In[3]`) and the kernel's temporary file of the cell;
/// - `text` and MIME data held as lists of lines are joined into one string (nbformat
///   stores either);
/// - consecutive stream outputs of one stream are merged: how a stream is cut into messages
///   depends on timing (flushes), not on what was printed.
///
/// Timing is recorded in the cell's metadata (`execution`), which is not an output and not
/// hashed. Object keys are sorted by serde_json's map.
pub(crate) fn normalized_outputs(outputs: &[Value]) -> Vec<Value> {
    let mut normalized: Vec<Value> = Vec::new();
    for output in outputs {
        let mut output = joined(output.clone());
        if let Some(object) = output.as_object_mut() {
            object.remove("execution_count");
            if object.get("output_type").and_then(Value::as_str) == Some("error") {
                object.remove("traceback");
            }
        }
        if let Some(last) = normalized.last_mut()
            && same_stream(last, &output)
        {
            let more = output["text"].as_str().unwrap_or_default().to_string();
            let text = last["text"].as_str().unwrap_or_default().to_string() + &more;
            last["text"] = text.into();
            continue;
        }
        normalized.push(output);
    }
    normalized
}

fn same_stream(a: &Value, b: &Value) -> bool {
    a["output_type"] == "stream" && b["output_type"] == "stream" && a["name"] == b["name"]
}

/// `output` with its `text` and every MIME bundle entry that is a list of strings joined.
fn joined(mut output: Value) -> Value {
    fn join(value: &mut Value) {
        if let Value::Array(lines) = value
            && lines.iter().all(Value::is_string)
        {
            *value = lines
                .iter()
                .filter_map(Value::as_str)
                .collect::<String>()
                .into();
        }
    }
    if let Some(text) = output.get_mut("text") {
        join(text);
    }
    if let Some(Value::Object(data)) = output.get_mut("data") {
        data.values_mut().for_each(join);
    }
    output
}

/// The text a person reads in `outputs`: streams, `text/plain` and errors.
fn output_text(outputs: &[Value]) -> String {
    let mut text = String::new();
    for output in outputs {
        if let Some(stream) = output["text"].as_str() {
            text.push_str(stream);
        } else if let Some(plain) = output["data"]["text/plain"].as_str() {
            text.push_str(plain);
            text.push('\n');
        } else if output["output_type"] == "error" {
            let (name, value) = (&output["ename"], &output["evalue"]);
            text.push_str(&format!(
                "{}: {}\n",
                name.as_str().unwrap_or_default(),
                value.as_str().unwrap_or_default()
            ));
        }
    }
    text
}

/// The record of `cell` from the executed notebook's cell of the same index.
pub(crate) fn cell_record(cell: &CodeCell, executed: &Value) -> CellRecord {
    let outputs = executed["outputs"].as_array().cloned().unwrap_or_default();
    let normalized = normalized_outputs(&outputs);
    let bytes = serde_json::to_vec(&normalized).expect("JSON values serialize");
    CellRecord {
        index: cell.index,
        id: cell.id.clone(),
        sha256: hex::encode(Sha256::digest(bytes)),
        volatile: cell.volatile,
        text: output_text(&normalized).chars().take(TEXT_KEPT).collect(),
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum PreviousError {
    #[error("Cannot read the statement `{}`: it {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: super::source::ReadFailure,
    },
    #[error(
        "`{}` is not an in-toto statement of a notebook run: {reason}", path.display()
    )]
    NotAStatement { path: PathBuf, reason: String },
    #[error(
        "The statement `{}` is of the notebook sha256:{previous}, not of `{}` (sha256:{current}); --verify compares runs of one notebook",
        path.display(), notebook.display()
    )]
    OtherNotebook {
        path: PathBuf,
        notebook: PathBuf,
        previous: String,
        current: String,
    },
}

/// Reads the statement of an earlier run of `notebook` at `path`: an in-toto Statement v1
/// of [`NOTEBOOK_RUN_V1`] about the same notebook bytes.
pub(crate) fn read_previous(
    files: super::source::Files<'_>,
    path: &Path,
    notebook: &Notebook,
) -> Result<RunPredicate, PreviousError> {
    let bytes = files
        .read(path, MAX_STATEMENT_BYTES)
        .map_err(|source| PreviousError::Read {
            path: files.shown(path),
            source,
        })?;
    let path = &files.shown(path);
    let not = |reason: String| PreviousError::NotAStatement {
        path: path.to_path_buf(),
        reason,
    };
    let statement: Value =
        serde_json::from_slice(&bytes).map_err(|e| not(format!("not JSON ({e})")))?;
    if statement["_type"] != crate::attest::STATEMENT_V1 {
        return Err(not(format!(
            "its `_type` is {}, not `{}`",
            statement["_type"],
            crate::attest::STATEMENT_V1
        )));
    }
    if statement["predicateType"] != NOTEBOOK_RUN_V1 {
        return Err(not(format!(
            "its `predicateType` is {}, not `{NOTEBOOK_RUN_V1}`",
            statement["predicateType"]
        )));
    }
    let predicate: RunPredicate = serde_json::from_value(statement["predicate"].clone())
        .map_err(|e| not(format!("its predicate is not one imgbuild writes ({e})")))?;
    if predicate.notebook.sha256 != notebook.sha256 {
        return Err(PreviousError::OtherNotebook {
            path: path.to_path_buf(),
            notebook: notebook.path.clone(),
            previous: predicate.notebook.sha256,
            current: notebook.sha256.clone(),
        });
    }
    Ok(predicate)
}

/// The first cell whose outputs differ between `previous` and `current`, cells volatile in
/// either left out; a cell one run reached and the other did not differs too.
pub(crate) fn first_difference(
    previous: &[CellRecord],
    current: &[CellRecord],
) -> Option<CellDifference> {
    let count = previous.len().max(current.len());
    (0..count).find_map(|i| {
        let (before, now) = (previous.get(i), current.get(i));
        if before.is_some_and(|c| c.volatile) || now.is_some_and(|c| c.volatile) {
            return None;
        }
        if before.map(|c| &c.sha256) == now.map(|c| &c.sha256) {
            return None;
        }
        let cell = now.or(before).expect("one of them is there");
        Some(CellDifference {
            index: cell.index,
            id: cell.id.clone(),
            diff: text_diff(
                before.map_or("(not run)", |c| &c.text),
                now.map_or("(not run)", |c| &c.text),
            ),
        })
    })
}

/// A cell whose outputs differ from the earlier run's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CellDifference {
    pub index: usize,
    pub id: Option<String>,
    /// The first lines that differ, `-` the earlier run's and `+` this run's.
    pub diff: Vec<String>,
}

/// At most 3 pairs of differing lines of `before` and `after`.
fn text_diff(before: &str, after: &str) -> Vec<String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    let mut lines = Vec::new();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i), b.get(i));
        if x == y {
            continue;
        }
        if let Some(x) = x {
            lines.push(format!("- {x}"));
        }
        if let Some(y) = y {
            lines.push(format!("+ {y}"));
        }
        if lines.len() >= 6 {
            break;
        }
    }
    if lines.is_empty() {
        // Same text, other outputs (an image, metadata).
        lines.push("  (the same text; other outputs differ)".to_string());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn outputs_are_normalized_before_they_are_hashed() {
        let run = |count: u64, split: bool| {
            let streams = if split {
                vec![
                    json!({"output_type": "stream", "name": "stdout", "text": ["1\n", "2"]}),
                    json!({"output_type": "stream", "name": "stdout", "text": "\n3\n"}),
                ]
            } else {
                vec![json!({"output_type": "stream", "name": "stdout", "text": "1\n2\n3\n"})]
            };
            let mut outputs = streams;
            outputs.push(
                json!({"output_type": "execute_result", "execution_count": count,
                "metadata": {}, "data": {"text/plain": ["4", "2"]}}),
            );
            outputs.push(json!({"output_type": "error", "ename": "E", "evalue": "v",
                "traceback": [format!("Cell In[{count}]")]}));
            normalized_outputs(&outputs)
        };
        assert_eq!(run(1, true), run(7, false));
        assert_eq!(run(1, false)[1]["data"]["text/plain"], "42");
        assert_eq!(output_text(&run(1, false)), "1\n2\n3\n42\nE: v\n");
    }

    fn record(index: usize, sha: &str, volatile: bool, text: &str) -> CellRecord {
        CellRecord {
            index,
            id: Some(format!("c{index}")),
            sha256: sha.into(),
            volatile,
            text: text.into(),
        }
    }

    #[test]
    fn the_first_differing_cell_is_found_and_volatile_cells_are_skipped() {
        let before = [record(0, "a", true, "t1"), record(2, "b", false, "x\ny\n")];
        let same = [record(0, "z", true, "t2"), record(2, "b", false, "x\ny\n")];
        assert_eq!(first_difference(&before, &same), None);
        let changed = [record(0, "z", true, "t2"), record(2, "c", false, "x\nw\n")];
        let difference = first_difference(&before, &changed).unwrap();
        assert_eq!(
            (difference.index, difference.id.as_deref()),
            (2, Some("c2"))
        );
        assert_eq!(difference.diff, vec!["- y", "+ w"]);
        let short = [record(0, "z", true, "t2")];
        assert_eq!(first_difference(&before, &short).unwrap().index, 2);
    }
}
