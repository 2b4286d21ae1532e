//! Build records: knowing that a build has nothing to do. A rebuild whose inputs are
//! byte-for-byte the ones of the image already in the layout skips install and layers: the
//! answer is the image that is there.
//!
//! The inputs key is the sha256 of imgbuild's version, the recipe file, the lock file, the
//! base manifest digest and `SOURCE_DATE_EPOCH`: together they decide every byte of the
//! image (the lock pins every package by sha256). `<cache>/builds/<key>` records the
//! manifest digest and layers the build with that key produced. The record is only a hint:
//! the build plan (`build::plan`) skips the build only when the layout still holds that
//! manifest under exactly the recipe's tags and every blob it names is present with its size.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use crate::{
    layers::{BuiltLayer, Compression, LayerBlob, LayerKind, LayerPart},
    report::Reporter,
};

/// The parts of a build that decide its output.
pub(crate) struct BuildInputs<'a> {
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
    pub(crate) fn key(&self) -> Option<String> {
        let mut hasher = Sha256::new();
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        part(b"imgbuild-build-key/1");
        part(env!("CARGO_PKG_VERSION").as_bytes());
        part(&crate::fs::read_input(self.recipe_path, crate::recipe::MAX_RECIPE_BYTES).ok()?);
        part(&crate::fs::read_input(self.lock_path, crate::lock::MAX_LOCK_BYTES).ok()?);
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
pub(crate) struct BuildRecord {
    pub manifest_digest: String,
    layers: Vec<RecordedLayer>,
}

#[derive(Debug, Serialize, Deserialize)]
struct RecordedLayer {
    kind: LayerKind,
    name: String,
    packages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    part: Option<LayerPart>,
    digest: String,
    diff_id: String,
    size: u64,
    tar_size: u64,
    compression: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

impl BuildRecord {
    pub(crate) fn new(
        manifest_digest: &str,
        layers: &[BuiltLayer],
        compression: Compression,
    ) -> Self {
        Self {
            manifest_digest: manifest_digest.to_string(),
            layers: layers
                .iter()
                .map(|layer| RecordedLayer {
                    kind: layer.kind,
                    name: layer.name.clone(),
                    packages: layer.packages.clone(),
                    part: layer.part,
                    digest: layer.blob.digest.clone(),
                    diff_id: layer.blob.diff_id.clone(),
                    size: layer.blob.size,
                    tar_size: layer.blob.tar_size,
                    compression: compression.name().to_string(),
                    annotations: layer.blob.annotations.clone(),
                })
                .collect(),
        }
    }

    /// The recorded layers, as layers reused, when `digests` (the image's own layers,
    /// platform after platform) are exactly the recorded ones; `None` otherwise.
    pub(crate) fn reused_layers(&self, digests: &[&str]) -> Option<Vec<BuiltLayer>> {
        if digests.len() != self.layers.len() {
            return None;
        }
        let mut layers = Vec::with_capacity(digests.len());
        for (digest, recorded) in digests.iter().zip(&self.layers) {
            if *digest != recorded.digest {
                return None;
            }
            let compression = Compression::from_name(&recorded.compression)?;
            layers.push(BuiltLayer {
                kind: recorded.kind,
                name: recorded.name.clone(),
                packages: recorded.packages.clone(),
                part: recorded.part,
                blob: LayerBlob {
                    diff_id: recorded.diff_id.clone(),
                    digest: recorded.digest.clone(),
                    size: recorded.size,
                    tar_size: recorded.tar_size,
                    media_type: compression.media_type(),
                    annotations: recorded.annotations.clone(),
                },
                reused: true,
            });
        }
        Some(layers)
    }
}

/// Where inputs keys are recorded.
pub(crate) struct BuildRecords {
    dir: PathBuf,
}

impl BuildRecords {
    pub(crate) fn new(cache_dir: &Path) -> Self {
        Self {
            dir: cache_dir.join("builds"),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// What was recorded for `key`.
    pub(crate) fn get(&self, key: &str) -> Option<BuildRecord> {
        // A record is a few KB; anything else in its place (a fifo, a huge file) is none.
        serde_json::from_slice(&crate::fs::read_input(&self.path(key), 1 << 20).ok()?).ok()
    }

    /// Records what the build of `key` produced. Failing to record only costs a later
    /// no-op rebuild its shortcut, so errors are warnings, not returned.
    pub(crate) fn put(&self, key: &str, record: &BuildRecord, reporter: &dyn Reporter) {
        let result = fs_err::create_dir_all(&self.dir).and_then(|()| {
            let json = serde_json::to_vec(record).map_err(std::io::Error::other)?;
            crate::fs::write_atomic(&self.path(key), &json)
        });
        if let Err(err) = result {
            reporter.on_warning(&format!(
                "could not record the build in `{}`: {err}",
                self.dir.display()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: &Path, lock: &str) -> Option<String> {
        let recipe_path = dir.join("recipe.toml");
        let lock_path = dir.join("recipe.lock");
        fs_err::write(&recipe_path, "[image]\nname = \"demo\"\n").unwrap();
        fs_err::write(&lock_path, lock).unwrap();
        BuildInputs {
            recipe_path: &recipe_path,
            lock_path: &lock_path,
            base_manifest: None,
            source_date_epoch: Some(0),
            variant: None,
            smoke_exe: None,
        }
        .key()
    }

    #[test]
    fn a_changed_lock_changes_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let before = key(dir.path(), "version: 6\n").unwrap();
        assert_eq!(key(dir.path(), "version: 6\n").unwrap(), before);
        assert_ne!(key(dir.path(), "version: 6\n# edited\n").unwrap(), before);
    }

    #[test]
    fn unreadable_inputs_have_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.lock");
        let inputs = BuildInputs {
            recipe_path: &missing,
            lock_path: &missing,
            base_manifest: None,
            source_date_epoch: None,
            variant: None,
            smoke_exe: None,
        };
        assert_eq!(inputs.key(), None);
    }
}
