//! What a model's layout holds, for `inspect` and `diff`: its files (path, kind, layer digest
//! and size) as its ModelPack artifact lists them, and what its config says of the model.
//! Read through the layout readers: every manifest and config blob checked against its
//! digest and bounded.

use std::{collections::BTreeMap, path::Path};

use serde_json::Value;

use super::{
    MODELPACK_TAG_SUFFIX, ModelError,
    artifact::{CONFIG_MEDIA_TYPE, FILEPATH, MANIFEST_ARTIFACT_TYPE},
};
use crate::oci::{layout::Layout, read::ReadError};

/// The model config is a few KiB; a larger one is not read.
const MAX_CONFIG: u64 = 1 << 20;

/// One file of a model, as its layer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ModelFileSummary {
    pub path: String,
    /// `weight`, `config` (a weight config: `config.json`, tokenizers), `doc` or `code`.
    pub kind: String,
    pub digest: String,
    /// The layer's bytes (an uncompressed tar of the one file).
    pub size: u64,
}

/// A model's layout, summarized.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ModelSummary {
    pub layout: String,
    pub tag: String,
    /// The ModelPack artifact's manifest digest (`TAG-modelpack`).
    pub artifact: String,
    /// The image form's (`TAG`), when the layout has one.
    pub image: Option<String>,
    pub name: Option<String>,
    pub architecture: Option<String>,
    pub format: Option<String>,
    pub param_size: Option<String>,
    pub precision: Option<String>,
    pub files: Vec<ModelFileSummary>,
    pub bytes: u64,
}

/// Whether tag `tag` of the layout at `dir` is a model's: its `TAG-modelpack` entry is a
/// ModelPack artifact. Any read that fails says no; [`summarize`] then names the failure.
pub(crate) fn is_model_layout(dir: &Path, tag: &str) -> bool {
    let layout = Layout::new(dir);
    layout
        .entry(&format!("{tag}{MODELPACK_TAG_SUFFIX}"))
        .ok()
        .is_some_and(|entry| {
            entry.artifact_type().as_ref().map(|t| t.to_string())
                == Some(MANIFEST_ARTIFACT_TYPE.to_string())
        })
}

/// The model whose ModelPack artifact is `TAG-modelpack` in the layout at `dir`.
pub(crate) fn summarize(dir: &Path, tag: &str) -> Result<ModelSummary, ModelError> {
    let layout = Layout::new(dir);
    let failed = |err: ReadError| ModelError::Source {
        model: "*".into(),
        path: dir.display().to_string(),
        why: err.to_string(),
    };
    let entry = layout
        .entry(&format!("{tag}{MODELPACK_TAG_SUFFIX}"))
        .map_err(failed)?;
    let manifest = layout.manifest(&entry).map_err(failed)?;
    let files: Vec<ModelFileSummary> = manifest.layers().iter().map(file_of).collect();
    if let Some(layer) = files.iter().find(|f| f.path.is_empty()) {
        return Err(ModelError::Source {
            model: "*".into(),
            path: dir.display().to_string(),
            why: format!("its layer {} names no file path", layer.digest),
        });
    }
    let config = manifest.config();
    let config: Value = match config.media_type().to_string() == CONFIG_MEDIA_TYPE {
        true => {
            let bytes = layout.blobs().read(config, MAX_CONFIG).map_err(failed)?;
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        }
        false => Value::Null,
    };
    let text = |value: &Value| value.as_str().map(str::to_string);
    Ok(ModelSummary {
        layout: dir.display().to_string(),
        tag: tag.to_string(),
        artifact: entry.digest().to_string(),
        image: layout.entry(tag).ok().map(|e| e.digest().to_string()),
        name: text(&config["descriptor"]["name"]),
        architecture: text(&config["config"]["architecture"]),
        format: text(&config["config"]["format"]),
        param_size: text(&config["config"]["paramSize"]),
        precision: text(&config["config"]["precision"]),
        bytes: files.iter().map(|f| f.size).sum(),
        files,
    })
}

fn file_of(layer: &oci_spec::image::Descriptor) -> ModelFileSummary {
    let media_type = layer.media_type().to_string();
    let kind = media_type
        .strip_prefix("application/vnd.cncf.model.")
        .and_then(|rest| rest.split(".v1").next())
        .map_or("other", |kind| match kind {
            "weight" => "weight",
            "weight.config" => "config",
            "doc" => "doc",
            "code" => "code",
            _ => "other",
        });
    let path = layer
        .annotations()
        .as_ref()
        .and_then(|a| a.get(FILEPATH))
        .cloned()
        .unwrap_or_default();
    ModelFileSummary {
        path,
        kind: kind.to_string(),
        digest: layer.digest().to_string(),
        size: layer.size(),
    }
}

/// A file whose layer differs between two revisions.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct FileChange {
    pub path: String,
    pub from: ModelFileSummary,
    pub to: ModelFileSummary,
}

/// What changed between two revisions of a model, file by file.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ModelDiff {
    pub from: String,
    pub to: String,
    pub added: Vec<ModelFileSummary>,
    pub removed: Vec<ModelFileSummary>,
    pub changed: Vec<FileChange>,
    pub unchanged: usize,
    /// The bytes of `to`'s layers that `from` does not have: what a push of `to` to where
    /// `from` is sends, besides the two configs.
    pub new_bytes: u64,
}

pub(crate) fn diff(from: &ModelSummary, to: &ModelSummary) -> ModelDiff {
    let by_path = |s: &ModelSummary| -> BTreeMap<String, ModelFileSummary> {
        s.files
            .iter()
            .map(|f| (f.path.clone(), f.clone()))
            .collect()
    };
    let (old, new) = (by_path(from), by_path(to));
    let mut changes = ModelDiff {
        from: from.artifact.clone(),
        to: to.artifact.clone(),
        added: new
            .values()
            .filter(|f| !old.contains_key(&f.path))
            .cloned()
            .collect(),
        removed: old
            .values()
            .filter(|f| !new.contains_key(&f.path))
            .cloned()
            .collect(),
        changed: Vec::new(),
        unchanged: 0,
        new_bytes: 0,
    };
    for (path, file) in &new {
        match old.get(path) {
            Some(before) if before.digest == file.digest => changes.unchanged += 1,
            Some(before) => changes.changed.push(FileChange {
                path: path.clone(),
                from: before.clone(),
                to: file.clone(),
            }),
            None => {}
        }
    }
    let had: std::collections::BTreeSet<&str> =
        from.files.iter().map(|f| f.digest.as_str()).collect();
    let mut counted = std::collections::BTreeSet::new();
    changes.new_bytes = to
        .files
        .iter()
        .filter(|f| !had.contains(f.digest.as_str()) && counted.insert(f.digest.as_str()))
        .map(|f| f.size)
        .sum();
    changes
}
