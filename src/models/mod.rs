//! `[[models]]`: model weights shipped beside the image, each an OCI layout of its own under
//! `images/NAME.models/MODEL`, pinned file by file in the image's lock.
//!
//! 1. [`source`]: the model's files, read beneath the recipe's directory and nowhere else.
//! 2. [`pins`]: each file by path, size and sha256, what the lock holds; `--locked` refuses
//!    a lock whose pins are not these (`crate::lock::check_models` names the file).
//! 3. [`write_all`]: a layer per file ([`artifact`]), read once and checked against its pin,
//!    then the ModelPack artifact and the image form over the same layers, with the config
//!    the files describe ([`describe`]).

mod artifact;
mod beside;
mod describe;
mod source;
mod summary;

pub(crate) use artifact::MODELPACK_TAG_SUFFIX;
pub(crate) use beside::{ModelLayout, beside};
pub(crate) use summary::{ModelDiff, ModelSummary, diff, is_model_layout, summarize};

use std::path::{Path, PathBuf};

use crate::{lock::ModelPin, oci::layout::Layout, recipe::Recipe};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ModelError {
    #[error("model `{model}`: `{path}` {why}")]
    Source {
        model: String,
        path: String,
        why: String,
    },
    #[error(
        "model `{model}`: `{path}` changed while the build read it (the lock pins {pinned}, it now reads as {read}); build again"
    )]
    Changed {
        model: String,
        path: String,
        pinned: String,
        read: String,
    },
    #[error(
        "model `{model}`: `{path}` is pinned by the lock in no form the build reads: build without `--locked` to pin it again"
    )]
    Unpinned { model: String, path: String },
    #[error("could not write the model's layout at `{path}`: {why}")]
    Write { path: String, why: String },
}

/// A model written beside the image.
#[derive(Debug, Clone)]
pub(crate) struct WrittenModel {
    pub name: String,
    pub mount: String,
    pub layout: PathBuf,
    /// The image form's manifest digest (what `--mount type=image` and `image` volumes
    /// mount), and the ModelPack artifact's.
    pub image_digest: String,
    pub artifact_digest: String,
    pub files: usize,
    pub bytes: u64,
    /// Layer digests, one per file, in path order.
    pub layers: Vec<(String, String)>,
}

/// Every file of every model of `recipe`, pinned: in the recipe's order of models, each
/// model's files in byte order of their paths.
pub(crate) fn pins(recipe: &Recipe) -> Result<Vec<ModelPin>, ModelError> {
    let mut pins = Vec::new();
    for model in &recipe.models {
        for file in source::files(model)? {
            pins.push(ModelPin {
                model: model.name.clone(),
                sha256: source::sha256(&model.name, &file)?,
                path: file.path,
                size: file.size,
            });
        }
    }
    Ok(pins)
}

/// Where the models of an image whose layout is `layout_dir` go: `DIR.models/MODEL`.
pub(crate) fn models_dir(layout_dir: &Path) -> PathBuf {
    let name = layout_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".into());
    layout_dir.with_file_name(format!("{name}.models"))
}

/// Writes every model of `recipe` beside `layout_dir`, each file checked against `pinned`
/// (the lock's pins) as it is read; `created` is the image's, `architecture` the image
/// form's (the first platform's).
pub(crate) fn write_all(
    recipe: &Recipe,
    pinned: &[ModelPin],
    layout_dir: &Path,
    created: &str,
    architecture: &str,
) -> Result<Vec<WrittenModel>, ModelError> {
    let dir = models_dir(layout_dir);
    recipe
        .models
        .iter()
        .map(|model| {
            let files = source::files(model)?;
            let layout = Layout::new(dir.join(&model.name));
            layout.prepare().map_err(|e| ModelError::Write {
                path: layout.dir.display().to_string(),
                why: e.to_string(),
            })?;
            let mut layers = Vec::with_capacity(files.len());
            for file in &files {
                let pin = pinned
                    .iter()
                    .find(|p| p.model == model.name && p.path == file.path && p.size == file.size)
                    .ok_or_else(|| ModelError::Unpinned {
                        model: model.name.clone(),
                        path: file.path.clone(),
                    })?;
                layers.push(artifact::write_layer(
                    &layout,
                    &model.name,
                    file,
                    &pin.sha256,
                )?);
            }
            let config = describe::model_config(&model.name, created, &files);
            let (image_digest, artifact_digest) =
                artifact::write_manifests(&layout, &layers, &config, architecture, &recipe.tags)?;
            let _ = layout.collect_garbage(&crate::report::Silent);
            Ok(WrittenModel {
                name: model.name.clone(),
                mount: model.mount.clone(),
                layout: layout.dir.clone(),
                image_digest,
                artifact_digest,
                files: files.len(),
                bytes: files.iter().map(|f| f.size).sum(),
                layers: layers.into_iter().map(|l| (l.path, l.digest)).collect(),
            })
        })
        .collect()
}
