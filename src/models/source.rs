//! A model's files, read from its `source` beneath the recipe's directory through the build
//! context ([`crate::fs::context`]): no path resolves outside it, whatever links it holds.
//! Regular files only: a link is refused (its target could change under the lock), and so is
//! a fifo, a socket or a device, never waited on.

use std::{io::Read, path::Path, sync::Arc};

use sha2::{Digest, Sha256};

use super::ModelError;
use crate::{
    fs::context::{BuildContext, ContextFile, special_kind},
    recipe::models::Model,
};

/// Directories deeper than this are refused: a model is a few levels at most.
const MAX_DEPTH: usize = 32;

/// One file of a model.
#[derive(Debug, Clone)]
pub(crate) struct ModelFile {
    /// `/`-separated, relative to the model's top (its name, for a model of one file).
    pub path: String,
    pub size: u64,
    pub file: ContextFile,
}

/// Every regular file of `model`, in byte order of their paths.
pub(crate) fn files(model: &Model) -> Result<Vec<ModelFile>, ModelError> {
    let context = BuildContext::open(&model.context).map_err(|e| ModelError::Source {
        model: model.name.clone(),
        path: model.context.display().to_string(),
        why: e.to_string(),
    })?;
    let walk = ModelWalk { model, context };
    let mut found = Vec::new();
    let kind = walk.kind(&model.source)?;
    if kind.is_dir() {
        walk.dir(&model.source, "", 0, &mut found)?;
    } else {
        let name = model
            .source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let name = name.ok_or_else(|| walk.refused(&model.source, "names no file".into()))?;
        walk.file(&model.source, kind, name, &mut found)?;
    }
    if found.is_empty() {
        return Err(walk.refused(&model.source, "holds no file".into()));
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The sha256 of `file`'s bytes, which must still be `size` of them: `sha256:<hex>`.
pub(crate) fn sha256(model: &str, file: &ModelFile) -> Result<String, ModelError> {
    let mut hasher = Sha256::new();
    let read = copy_checked(model, file, &mut HashOnly(&mut hasher))?;
    debug_assert_eq!(read, file.size);
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// Copies `file` into `out`, failing when it has not exactly the size it was listed with
/// (it changed while being read); returns the bytes copied.
pub(crate) fn copy_checked(
    model: &str,
    file: &ModelFile,
    out: &mut dyn std::io::Write,
) -> Result<u64, ModelError> {
    let failed = |why: String| ModelError::Source {
        model: model.to_string(),
        path: file.file.host_path().display().to_string(),
        why,
    };
    let opened = file
        .file
        .open_sized(file.size)
        .map_err(|e| failed(e.to_string()))?;
    // One byte past the size is read, so a file that grew is seen.
    let copied =
        std::io::copy(&mut opened.take(file.size + 1), out).map_err(|e| failed(e.to_string()))?;
    if copied != file.size {
        return Err(failed(format!(
            "has {copied} bytes as it is read, not the {} it was listed with: it changed while the build read it",
            file.size
        )));
    }
    Ok(copied)
}

/// A writer that only hashes.
struct HashOnly<'a>(&'a mut Sha256);

impl std::io::Write for HashOnly<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct ModelWalk<'a> {
    model: &'a Model,
    context: Arc<BuildContext>,
}

impl ModelWalk<'_> {
    fn refused(&self, rel: &Path, why: String) -> ModelError {
        ModelError::Source {
            model: self.model.name.clone(),
            path: self.context.host_path(rel).display().to_string(),
            why,
        }
    }

    fn kind(&self, rel: &Path) -> Result<cap_std::fs::FileType, ModelError> {
        self.context
            .file_type(rel)
            .map_err(|e| self.refused(rel, e.to_string()))
    }

    fn dir(
        &self,
        rel: &Path,
        shown: &str,
        depth: usize,
        found: &mut Vec<ModelFile>,
    ) -> Result<(), ModelError> {
        if depth > MAX_DEPTH {
            return Err(self.refused(rel, format!("is deeper than {MAX_DEPTH} directories")));
        }
        let entries = self
            .context
            .read_dir(rel)
            .map_err(|e| self.refused(rel, e.to_string()))?;
        for (name, kind) in entries {
            let child = rel.join(&name);
            let Some(name) = name.to_str().filter(|n| !n.chars().any(char::is_control)) else {
                return Err(self.refused(
                    &child,
                    "has a name that is not UTF-8 text, or holds a control character".into(),
                ));
            };
            let path = match shown {
                "" => name.to_string(),
                parent => format!("{parent}/{name}"),
            };
            if kind.is_dir() {
                self.dir(&child, &path, depth + 1, found)?;
            } else {
                self.file(&child, kind, path, found)?;
            }
        }
        Ok(())
    }

    fn file(
        &self,
        rel: &Path,
        kind: cap_std::fs::FileType,
        path: String,
        found: &mut Vec<ModelFile>,
    ) -> Result<(), ModelError> {
        if kind.is_symlink() {
            return Err(self.refused(
                rel,
                "is a symbolic link; a model's files are read as they are, never through a link"
                    .into(),
            ));
        }
        if !kind.is_file() {
            return Err(self.refused(
                rel,
                format!("is {}, not a regular file", special_kind(&kind)),
            ));
        }
        let (_, meta) = self
            .context
            .open_file(rel)
            .map_err(|e| self.refused(rel, e.to_string()))?;
        found.push(ModelFile {
            path,
            size: meta.len(),
            file: ContextFile {
                context: self.context.clone(),
                path: rel.to_path_buf(),
            },
        });
        Ok(())
    }
}
