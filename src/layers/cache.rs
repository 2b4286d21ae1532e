//! The content-keyed layer cache: a layer whose inputs did not change is never compressed
//! again. Shared by every recipe and matrix variant using the same cache directory.
//!
//! `<cache>/layers/blobs/<hex>` holds blobs named by digest; `<cache>/layers/keys/<key>.json`
//! maps a layer key to the blob (digest, diff_id, sizes). Both are written complete under a
//! temporary name and renamed into place, so a build killed at any moment leaves either
//! nothing or a whole entry, and a key file only ever names a blob that is already there.
//!
//! The key of a package layer is the sha256 of everything that decides its bytes except
//! the bytes of package files: imgbuild's version, the compressor, the entries' mtime and,
//! for every tar entry, its path, kind, mode, size and symlink target, plus the full contents
//! of the packages' `conda-meta/*.json` records. A record names its package archive by
//! sha256 and lists each file's sha256 (after prefix replacement), and the in-image prefix
//! is part of every path, so equal keys mean equal tars without reading the 2 GB of
//! libraries again. A wheel's layer is keyed the same way by its installed `RECORD`. Layers
//! that hold no package record (the image's own files) are not
//! cached: they are small and their bytes come from the build, not from packages.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    compress::Compression,
    plan::{LayerKind, PlannedLayer},
    tar::Entry,
    write::LayerBlob,
};

/// Bump when the tar writer or the planner change what a layer holds for the same inputs.
const KEY_FORMAT: &str = "imgbuild-layer-key/1";

/// What a key file records: enough to describe the blob without reading it.
#[derive(Debug, Serialize, Deserialize)]
struct CachedBlob {
    digest: String,
    diff_id: String,
    size: u64,
    tar_size: u64,
    /// The layer's own manifest annotations (the TOC of an eStargz or zstd:chunked layer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct LayerCache {
    blobs: PathBuf,
    keys: PathBuf,
}

impl LayerCache {
    /// The cache under `cache_dir`, created if missing.
    pub fn open(cache_dir: &Path) -> std::io::Result<Self> {
        let root = cache_dir.join("layers");
        let cache = Self {
            blobs: root.join("blobs"),
            keys: root.join("keys"),
        };
        fs_err::create_dir_all(&cache.blobs)?;
        fs_err::create_dir_all(&cache.keys)?;
        Ok(cache)
    }

    fn key_path(&self, key: &str) -> PathBuf {
        self.keys.join(format!("{key}.json"))
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.blobs.join(digest.trim_start_matches("sha256:"))
    }

    /// The blob cached under `key`, linked into `blobs_dir`, or `None` on a miss. An entry
    /// whose blob is missing or has the wrong size counts as a miss.
    pub fn fetch(
        &self,
        key: &str,
        compression: Compression,
        blobs_dir: &Path,
    ) -> std::io::Result<Option<LayerBlob>> {
        let Ok(text) = fs_err::read_to_string(self.key_path(key)) else {
            return Ok(None);
        };
        let Ok(cached) = serde_json::from_str::<CachedBlob>(&text) else {
            tracing::warn!("ignoring unreadable layer cache entry {key}");
            return Ok(None);
        };
        let source = self.blob_path(&cached.digest);
        match fs_err::metadata(&source) {
            Ok(meta) if meta.len() == cached.size => {}
            _ => return Ok(None),
        }
        let target = blobs_dir.join(cached.digest.trim_start_matches("sha256:"));
        crate::fs::link_or_copy(&source, &target)?;
        Ok(Some(LayerBlob {
            diff_id: cached.diff_id,
            digest: cached.digest,
            size: cached.size,
            tar_size: cached.tar_size,
            media_type: compression.media_type(),
            annotations: cached.annotations,
        }))
    }

    /// Holds `key` for this process until the returned file is dropped: a second build
    /// wanting the same layer (matrix variants at once) waits, then finds it cached instead
    /// of compressing it again.
    pub fn lock_key(&self, key: &str) -> std::io::Result<std::fs::File> {
        let file = fs_err::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.keys.join(format!("{key}.lock")))?
            .into_file();
        file.lock()?;
        Ok(file)
    }

    /// Records `blob`, already written at `blob_path`, under `key`.
    pub fn store(&self, key: &str, blob: &LayerBlob, blob_path: &Path) -> std::io::Result<()> {
        crate::fs::link_or_copy(blob_path, &self.blob_path(&blob.digest))?;
        let cached = CachedBlob {
            digest: blob.digest.clone(),
            diff_id: blob.diff_id.clone(),
            size: blob.size,
            tar_size: blob.tar_size,
            annotations: blob.annotations.clone(),
        };
        let json = serde_json::to_vec(&cached).map_err(std::io::Error::other)?;
        crate::fs::write_atomic(&self.key_path(key), &json)
    }
}

/// The cache key of a layer with these `entries`, or `None` when the layer is not one to
/// cache (no package records in it).
pub fn layer_key(
    layer: &PlannedLayer,
    entries: &[Entry],
    compression: Compression,
    landmark: Option<usize>,
) -> std::io::Result<Option<String>> {
    if layer.packages.is_empty() {
        return Ok(None);
    }
    let records: Vec<String> = layer
        .packages
        .iter()
        .map(|package| {
            // A wheel's RECORD lists every installed file with its sha256, as a conda-meta
            // record does.
            match layer.kind {
                LayerKind::Wheels => format!("/{package}.dist-info/RECORD"),
                _ => format!("/conda-meta/{package}.json"),
            }
        })
        .collect();
    let mut found = 0;
    let mut hasher = Sha256::new();
    let mut line = |value: serde_json::Value| {
        hasher.update(value.to_string().as_bytes());
        hasher.update(b"\n");
    };
    line(serde_json::json!([
        KEY_FORMAT,
        env!("CARGO_PKG_VERSION"),
        compression.describe(),
        layer.mtime
    ]));
    // eStargz prefetch: where the landmark goes (the entries' order is hashed below).
    if let Some(prefetched) = landmark {
        line(serde_json::json!(["prefetch", prefetched]));
    }
    for entry in entries {
        line(match entry {
            Entry::Directory { path } => serde_json::json!(["d", path]),
            Entry::Symlink { path, target } => {
                serde_json::json!(["l", path, target.to_string_lossy()])
            }
            Entry::File {
                path,
                mode,
                size,
                source,
            } => {
                if records.iter().any(|record| path.ends_with(record.as_str())) {
                    found += 1;
                    serde_json::json!([
                        "f",
                        path,
                        mode,
                        size,
                        hex::encode(
                            rattler_digest::compute_file_digest::<rattler_digest::Sha256>(source)?
                        )
                    ])
                } else {
                    serde_json::json!(["f", path, mode, size])
                }
            }
        });
    }
    // Without every package's record the files' contents are not pinned: no key.
    if found != records.len() {
        return Ok(None);
    }
    Ok(Some(hex::encode(hasher.finalize())))
}
