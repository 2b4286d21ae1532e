//! Knowing that a build has nothing to do. A rebuild whose inputs are byte-for-byte the
//! ones of the image already in the layout skips install and layers: the answer is the
//! image that is there.
//!
//! The inputs key is the sha256 of imgbuild's version, the recipe file, the lock file, the
//! base manifest digest and `SOURCE_DATE_EPOCH`: together they decide every byte of the
//! image (the lock pins every package by sha256). `<cache>/builds/<key>` records the
//! manifest digest and layers the build with that key produced. The record is only a hint: the build
//! is skipped only when the layout still holds that manifest under exactly the recipe's
//! tags and every blob it names is present with its size.

use std::path::{Path, PathBuf};

use oci_spec::image::{ImageIndex, ImageManifest, MediaType};
use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use crate::{
    layers::{BuiltLayer, Compression, LayerBlob, LayerKind},
    oci::layout::{Layout, tagged},
};

/// The parts of a build that decide its output.
pub struct BuildInputs<'a> {
    pub recipe_path: &'a Path,
    pub lock_path: &'a Path,
    pub base_manifest: Option<&'a str>,
    pub source_date_epoch: Option<i64>,
    /// The matrix variant (`cuda11.8-python3.9`), if any.
    pub variant: Option<&'a str>,
    /// The digest of the embedded smoke executable, if any.
    pub smoke_exe: Option<&'a str>,
}

impl BuildInputs<'_> {
    /// The inputs key, or `None` when an input cannot be read (then the build just runs).
    pub fn key(&self) -> Option<String> {
        let mut hasher = Sha256::new();
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        part(b"imgbuild-build-key/1");
        part(env!("CARGO_PKG_VERSION").as_bytes());
        part(&fs_err::read(self.recipe_path).ok()?);
        part(&fs_err::read(self.lock_path).ok()?);
        part(self.base_manifest.unwrap_or("scratch").as_bytes());
        part(self.variant.unwrap_or_default().as_bytes());
        part(self.smoke_exe.unwrap_or_default().as_bytes());
        part(
            self.source_date_epoch
                .map(|s| s.to_string())
                .unwrap_or_default()
                .as_bytes(),
        );
        Some(hex::encode(hasher.finalize()))
    }
}

/// What a build with a given inputs key produced.
#[derive(Debug, Serialize, Deserialize)]
pub struct BuildRecord {
    pub manifest_digest: String,
    layers: Vec<RecordedLayer>,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecordedLayer {
    kind: LayerKind,
    name: String,
    packages: Vec<String>,
    digest: String,
    diff_id: String,
    size: u64,
    tar_size: u64,
    compression: String,
}

impl BuildRecord {
    pub fn new(manifest_digest: &str, layers: &[BuiltLayer], compression: Compression) -> Self {
        Self {
            manifest_digest: manifest_digest.to_string(),
            layers: layers
                .iter()
                .map(|layer| RecordedLayer {
                    kind: layer.kind,
                    name: layer.name.clone(),
                    packages: layer.packages.clone(),
                    digest: layer.blob.digest.clone(),
                    diff_id: layer.blob.diff_id.clone(),
                    size: layer.blob.size,
                    tar_size: layer.blob.tar_size,
                    compression: compression.name().to_string(),
                })
                .collect(),
        }
    }
}

/// Where inputs keys are recorded.
pub struct BuildRecords {
    dir: PathBuf,
}

impl BuildRecords {
    pub fn new(cache_dir: &Path) -> Self {
        Self {
            dir: cache_dir.join("builds"),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// What was recorded for `key`.
    pub fn get(&self, key: &str) -> Option<BuildRecord> {
        serde_json::from_slice(&fs_err::read(self.path(key)).ok()?).ok()
    }

    /// Records what the build of `key` produced. Failing to record only costs a later
    /// no-op rebuild its shortcut, so errors are logged, not returned.
    pub fn put(&self, key: &str, record: &BuildRecord) {
        let result = fs_err::create_dir_all(&self.dir).and_then(|()| {
            let json = serde_json::to_vec(record).map_err(std::io::Error::other)?;
            crate::fs::write_atomic(&self.path(key), &json)
        });
        if let Err(err) = result {
            tracing::warn!(
                "could not record the build in `{}`: {err}",
                self.dir.display()
            );
        }
    }
}

/// The layers of `record`'s image when `layout` holds that image under every one of `tags`
/// (other images may be there too), with every blob present at its size; `None` otherwise. The image is one manifest,
/// or an image index of one manifest per platform; the first `base_layers[i]` layers of
/// platform `i`'s manifest come from its base.
pub fn unchanged_image(
    layout: &Layout,
    tags: &[String],
    record: &BuildRecord,
    base_layers: &[usize],
) -> Option<Vec<BuiltLayer>> {
    // Other entries of the layout (other images' tags) are kept by every build, so only the
    // recipe's own tags decide.
    let index = layout.read_index().ok()??;
    let mut top = None;
    for tag in tags {
        let descriptor = tagged(&index, tag)?;
        if descriptor.digest().to_string() != record.manifest_digest {
            return None;
        }
        top = Some(descriptor);
    }
    let read = |digest: &str| {
        let bytes = fs_err::read(layout.blob_path(digest)).ok()?;
        (crate::oci::sha256_digest(&bytes) == digest).then_some(bytes)
    };
    let top = top?;
    let manifests: Vec<String> = if *top.media_type() == MediaType::ImageIndex {
        let nested: ImageIndex = serde_json::from_slice(&read(&record.manifest_digest)?).ok()?;
        nested
            .manifests()
            .iter()
            .map(|d| d.digest().to_string())
            .collect()
    } else {
        vec![record.manifest_digest.clone()]
    };
    if manifests.len() != base_layers.len() {
        return None;
    }
    let present = |digest: &str, size: u64| {
        fs_err::metadata(layout.blob_path(digest)).is_ok_and(|m| m.len() == size)
    };
    let mut ours: Vec<oci_spec::image::Descriptor> = Vec::new();
    for (digest, base_layers) in manifests.iter().zip(base_layers) {
        let manifest: ImageManifest = serde_json::from_slice(&read(digest)?).ok()?;
        let config = manifest.config();
        if !present(config.digest().as_ref(), config.size()) {
            return None;
        }
        for descriptor in manifest.layers() {
            if !present(descriptor.digest().as_ref(), descriptor.size()) {
                return None;
            }
        }
        ours.extend(manifest.layers().get(*base_layers..)?.iter().cloned());
    }
    if ours.len() != record.layers.len() {
        return None;
    }
    let mut layers = Vec::with_capacity(ours.len());
    for (descriptor, recorded) in ours.iter().zip(&record.layers) {
        if descriptor.digest().to_string() != recorded.digest {
            return None;
        }
        let compression = Compression::from_name(&recorded.compression)?;
        layers.push(BuiltLayer {
            kind: recorded.kind,
            name: recorded.name.clone(),
            packages: recorded.packages.clone(),
            blob: LayerBlob {
                diff_id: recorded.diff_id.clone(),
                digest: recorded.digest.clone(),
                size: recorded.size,
                tar_size: recorded.tar_size,
                media_type: compression.media_type(),
            },
            reused: true,
        });
    }
    Some(layers)
}
