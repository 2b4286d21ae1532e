//! imgbuild's own pins in a lock's leading comments: one line each, a marker and a JSON list
//! (`# imgbuild-files: […]`, `# imgbuild-models: […]`). rattler_lock reads past them as
//! comments; a lock without a marker pins nothing of that kind.

use std::path::Path;

use serde::de::DeserializeOwned;

use super::{LockError, MAX_LOCK_BYTES};

/// The list after `marker` in the leading comments of `text`; empty without it. `what` names
/// the list in the error of one that does not parse.
pub(super) fn list_in<T: DeserializeOwned>(
    text: &str,
    path: &Path,
    marker: &str,
    what: &str,
) -> Result<Vec<T>, LockError> {
    let Some(json) = text
        .lines()
        .take_while(|line| line.starts_with('#'))
        .find_map(|line| line.strip_prefix(marker))
    else {
        return Ok(Vec::new());
    };
    serde_json::from_str(json).map_err(|err| LockError::Shape {
        path: path.to_path_buf(),
        reason: format!(
            "the `{}` header is not a list of {what}: {err}",
            marker.trim_end()
        ),
    })
}

/// [`list_in`] of the lock at `path`; empty when there is no lock.
pub(super) fn read_list<T: DeserializeOwned>(
    path: &Path,
    marker: &str,
    what: &str,
) -> Result<Vec<T>, LockError> {
    match crate::fs::read_input_text(path, MAX_LOCK_BYTES) {
        Ok(text) => list_in(&text, path, marker, what),
        Err(crate::fs::InputError::Io(err)) if err.kind() == std::io::ErrorKind::NotFound => {
            Ok(Vec::new())
        }
        Err(err) => Err(LockError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::other(err),
        }),
    }
}
