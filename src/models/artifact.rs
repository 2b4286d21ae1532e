//! A model as an OCI layout of two manifests over the same layers, one per file: the CNCF
//! ModelPack artifact (`application/vnd.cncf.model.manifest.v1+json`), which model tools
//! read, and a plain image whose root holds the files, which podman's `--mount type=image`
//! and Kubernetes' `image` volumes mount. Every layer is an uncompressed tar of one file
//! (mode 0644, owner 0:0, mtime 0, no names), so the same file gives the same layer on any
//! machine and in every revision that keeps it.

use std::collections::BTreeMap;

use oci_spec::image::{Descriptor, DescriptorBuilder, MediaType};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{ModelError, source::ModelFile};
use crate::layers::write::HashingWriter;
use crate::oci::layout::{Layout, REF_NAME};

pub(crate) const MANIFEST_ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
pub(crate) const CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.model.config.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// The ModelPack annotation of a layer's file path, relative to the model's top.
pub(crate) const FILEPATH: &str = "org.cncf.model.filepath";
/// The tag of a model's ModelPack artifact is its image form's with this after it.
pub(crate) const MODELPACK_TAG_SUFFIX: &str = "-modelpack";

/// One layer written: its file, its tar's digest (which is also its diff_id) and size.
#[derive(Debug, Clone)]
pub(crate) struct FileLayer {
    pub path: String,
    pub media_type: &'static str,
    pub digest: String,
    pub size: u64,
}

/// What a file is to ModelPack, by its name: weights, their configuration (and tokenizer),
/// documentation, or code.
pub(crate) fn media_type(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    const WEIGHTS: &[&str] = &[
        "safetensors",
        "bin",
        "gguf",
        "pt",
        "pth",
        "onnx",
        "h5",
        "msgpack",
        "ckpt",
        "pdparams",
        "tflite",
        "mlmodel",
        "npz",
    ];
    if WEIGHTS.contains(&ext) {
        "application/vnd.cncf.model.weight.v1.tar"
    } else if name.starts_with("readme") || name.starts_with("license") || ext == "md" {
        "application/vnd.cncf.model.doc.v1.tar"
    } else if ext == "py" {
        "application/vnd.cncf.model.code.v1.tar"
    } else {
        "application/vnd.cncf.model.weight.config.v1.tar"
    }
}

/// Writes `file` as a layer blob of `layout`, the file read once and checked against
/// `pinned` (the lock's sha256 of it) as it is copied.
pub(crate) fn write_layer(
    layout: &Layout,
    model: &str,
    file: &ModelFile,
    pinned: &str,
) -> Result<FileLayer, ModelError> {
    let blobs = layout.blobs_dir();
    let io = |e: std::io::Error| ModelError::Write {
        path: blobs.display().to_string(),
        why: e.to_string(),
    };
    let temp = tempfile::Builder::new()
        .prefix(".model-")
        .tempfile_in(&blobs)
        .map_err(io)?;
    let mut out = HashingWriter::new(std::io::BufWriter::new(temp.as_file()));
    let mut header = tar::Header::new_gnu();
    header.set_size(file.size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    let mut content = Vec::new();
    {
        let mut builder = tar::Builder::new(&mut out);
        builder.mode(tar::HeaderMode::Deterministic);
        // The file streams through a hashing pipe into the tar: read once, checked as read.
        let mut reader = PinnedReader::new(model, file)?;
        builder
            .append_data(&mut header, &file.path, &mut reader)
            .map_err(io)?;
        content.push(reader.finish()?);
        builder.finish().map_err(io)?;
    }
    let file_sha256 = content.pop().expect("one file");
    if file_sha256 != pinned {
        return Err(ModelError::Changed {
            model: model.to_string(),
            path: file.path.clone(),
            pinned: pinned.to_string(),
            read: file_sha256,
        });
    }
    let (writer, digest, size) = out.finish();
    writer.into_inner().map_err(|e| io(e.into_error()))?;
    let target = layout.blob_path(&digest);
    crate::fs::set_mode(temp.path(), 0o644).map_err(io)?;
    temp.persist(&target).map_err(|e| io(e.error))?;
    Ok(FileLayer {
        path: file.path.clone(),
        media_type: media_type(&file.path),
        digest,
        size,
    })
}

/// The two manifests and `index.json`: the image form under each of `tags`, the ModelPack
/// artifact under `TAG-modelpack`. Returns both manifests' digests.
pub(crate) fn write_manifests(
    layout: &Layout,
    layers: &[FileLayer],
    model_config: &Value,
    architecture: &str,
    tags: &[String],
) -> Result<(String, String), ModelError> {
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = with_modelfs(model_config, &diff_ids);
    let config = json_blob(layout, &config, CONFIG_MEDIA_TYPE)?;
    let artifact = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": MANIFEST_ARTIFACT_TYPE,
        "config": config,
        "layers": layers.iter().map(|l| layer_descriptor(l, l.media_type)).collect::<Vec<_>>(),
    });
    let image_config = json!({
        "architecture": architecture,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let image_config = json_blob(layout, &image_config, IMAGE_CONFIG)?;
    let image = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": image_config,
        "layers": layers
            .iter()
            .map(|l| layer_descriptor(l, "application/vnd.oci.image.layer.v1.tar"))
            .collect::<Vec<_>>(),
    });
    let artifact = json_blob(layout, &artifact, MANIFEST)?;
    let image = json_blob(layout, &image, MANIFEST)?;
    let mut entries = Vec::new();
    for tag in tags {
        entries.push(entry(&image, tag, None)?);
        entries.push(entry(
            &artifact,
            &format!("{tag}{MODELPACK_TAG_SUFFIX}"),
            Some(MANIFEST_ARTIFACT_TYPE),
        )?);
    }
    let index = crate::oci::image::index_of(entries).map_err(|e| ModelError::Write {
        path: layout.dir.display().to_string(),
        why: e.to_string(),
    })?;
    layout.commit_index(&index).map_err(|e| ModelError::Write {
        path: layout.dir.display().to_string(),
        why: e.to_string(),
    })?;
    Ok((digest_of(&image), digest_of(&artifact)))
}

/// The model's config with its `modelfs`: the layers' diff_ids, in order.
fn with_modelfs(config: &Value, diff_ids: &[&str]) -> Value {
    let mut config = config.clone();
    config["modelfs"] = json!({"type": "layers", "diffIds": diff_ids});
    config
}

fn layer_descriptor(layer: &FileLayer, media_type: &str) -> Value {
    json!({
        "mediaType": media_type,
        "digest": layer.digest,
        "size": layer.size,
        "annotations": {FILEPATH: layer.path},
    })
}

/// Writes `value` as a canonical JSON blob of `media_type`: its descriptor, as JSON.
fn json_blob(layout: &Layout, value: &Value, media_type: &str) -> Result<Value, ModelError> {
    let failed = |why: String| ModelError::Write {
        path: layout.dir.display().to_string(),
        why,
    };
    let kind = MediaType::Other(media_type.to_string());
    let (descriptor, _) = layout
        .write_json_blob(value, kind, "a model's manifest or config")
        .map_err(|e| failed(e.to_string()))?;
    serde_json::to_value(&descriptor).map_err(|e| failed(e.to_string()))
}

fn digest_of(descriptor: &Value) -> String {
    descriptor["digest"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// An `index.json` entry for the manifest `descriptor`, tagged `tag`.
fn entry(
    descriptor: &Value,
    tag: &str,
    artifact_type: Option<&str>,
) -> Result<Descriptor, ModelError> {
    let bad = |why: String| ModelError::Write {
        path: "index.json".into(),
        why,
    };
    let digest = digest_of(descriptor)
        .parse::<oci_spec::image::Digest>()
        .map_err(|e| bad(e.to_string()))?;
    let mut builder = DescriptorBuilder::default()
        .media_type(MediaType::ImageManifest)
        .digest(digest)
        .size(descriptor["size"].as_u64().unwrap_or_default())
        .annotations(
            BTreeMap::from([(REF_NAME.to_string(), tag.to_string())])
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
        );
    if let Some(kind) = artifact_type {
        builder = builder.artifact_type(MediaType::Other(kind.to_string()));
    }
    builder.build().map_err(|e| bad(e.to_string()))
}

/// A model file read for its layer, hashed as it is read, and of exactly its listed size.
struct PinnedReader {
    model: String,
    host: String,
    file: std::io::Take<std::fs::File>,
    size: u64,
    read: u64,
    hasher: Sha256,
}

impl PinnedReader {
    fn new(model: &str, file: &ModelFile) -> Result<Self, ModelError> {
        let host = file.file.host_path().display().to_string();
        let opened = file
            .file
            .open_sized(file.size)
            .map_err(|e| ModelError::Source {
                model: model.to_string(),
                path: host.clone(),
                why: e.to_string(),
            })?;
        Ok(PinnedReader {
            model: model.to_string(),
            host,
            // The tar entry holds `size` bytes; `finish` looks for one more.
            file: std::io::Read::take(opened, file.size),
            size: file.size,
            read: 0,
            hasher: Sha256::new(),
        })
    }

    /// The file's sha256, once it was read whole and was of its size: not shorter, and
    /// with no byte past it.
    fn finish(self) -> Result<String, ModelError> {
        let mut rest = self.file.into_inner();
        let mut one = [0u8; 1];
        let grew = std::io::Read::read(&mut rest, &mut one).unwrap_or(0) > 0;
        if self.read != self.size || grew {
            return Err(ModelError::Source {
                model: self.model,
                path: self.host,
                why: format!(
                    "does not have the {} bytes it was listed with as it is read: it changed while the build read it",
                    self.size
                ),
            });
        }
        Ok(format!("sha256:{}", hex::encode(self.hasher.finalize())))
    }
}

impl std::io::Read for PinnedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}
