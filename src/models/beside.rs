//! The models a build wrote beside an image's layout (`DIR.models/MODEL`), found again by
//! the commands that publish or deploy the image. The layout directory may come from
//! anyone, so it is read like any input: through a handle on its parent, links not
//! followed, each entry a directory whose name a model may have.

use std::path::{Path, PathBuf};

use super::{ModelError, models_dir};
use crate::{
    fs::context::{BuildContext, special_kind},
    recipe::models::is_model_name,
};

/// A model's layout beside an image's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelLayout {
    pub name: String,
    pub dir: PathBuf,
}

/// The models beside the layout at `layout_dir`, by name; none when there is no
/// `DIR.models`.
pub(crate) fn beside(layout_dir: &Path) -> Result<Vec<ModelLayout>, ModelError> {
    let dir = models_dir(layout_dir);
    let refused = |path: &Path, why: String| ModelError::Source {
        model: "*".into(),
        path: path.display().to_string(),
        why,
    };
    let parent = dir.parent().unwrap_or(Path::new("."));
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let context = BuildContext::open(parent).map_err(|e| refused(parent, e.to_string()))?;
    let top = Path::new(dir.file_name().expect("a layout directory has a name"));
    match context.file_type(top) {
        Err(err) if err.is_not_found() => return Ok(Vec::new()),
        Err(err) => return Err(refused(&dir, err.to_string())),
        Ok(kind) if !kind.is_dir() => {
            return Err(refused(
                &dir,
                format!("is {}, not a directory", kind_of(&kind)),
            ));
        }
        Ok(_) => {}
    }
    let entries = context
        .read_dir(top)
        .map_err(|e| refused(&dir, e.to_string()))?;
    let mut models = Vec::with_capacity(entries.len());
    for (name, kind) in entries {
        let path = dir.join(&name);
        let name = name
            .to_str()
            .filter(|n| is_model_name(n))
            .ok_or_else(|| refused(&path, "is not named as a model is".into()))?;
        if !kind.is_dir() {
            return Err(refused(
                &path,
                format!("is {}, not a model's layout", kind_of(&kind)),
            ));
        }
        models.push(ModelLayout {
            name: name.to_string(),
            dir: path,
        });
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

/// What the entry is, for the message that refuses it.
fn kind_of(kind: &cap_std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a regular file"
    } else {
        special_kind(kind)
    }
}
