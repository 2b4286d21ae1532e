//! An OCI image layout on disk: `oci-layout`, `index.json`, `blobs/sha256/<hex>`.
//!
//! Blobs are immutable and named by content, so they can be added to a live layout at any
//! time; the only file that changes is `index.json`, and it is replaced by a rename. A build
//! that fails or is killed therefore leaves the previous image readable and intact. A layout
//! is a store of many images: a build replaces the entries of its own tags and keeps every
//! other entry (other tags, other tools' images). Blobs no longer reachable from any entry
//! are removed after the switch.

use std::{
    collections::{BTreeSet, HashSet},
    io::{Read, Write},
    path::{Path, PathBuf},
};

use oci_spec::image::{Descriptor, ImageIndex, MediaType};
use sha2::{Digest, Sha256};

use super::{json::canonical_json, read_error::ReadError};
use crate::report::Reporter;

const OCI_LAYOUT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// The annotation that names a tag in an image layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Manifests and indexes larger than this are not read while collecting garbage: no real
/// one comes near it, and a mislabelled layer must not be loaded into memory.
const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// The tag (`org.opencontainers.image.ref.name`) of an index entry, if it has one.
pub(crate) fn ref_name(descriptor: &Descriptor) -> Option<&str> {
    descriptor
        .annotations()
        .as_ref()
        .and_then(|a| a.get(REF_NAME))
        .map(String::as_str)
}

/// The entry of `index` tagged `tag`.
pub fn tagged<'a>(index: &'a ImageIndex, tag: &str) -> Option<&'a Descriptor> {
    index
        .manifests()
        .iter()
        .find(|d| ref_name(d).is_some_and(|name| name == tag))
}

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("`{}` exists and is not an OCI image layout; refusing to write into it", path.display())]
    NotALayout { path: PathBuf },
    #[error("Failed to write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to serialize {what}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// What a writer reads (`index.json`, the blobs it copies or lists) fails as a reader's
    /// read does.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Held while a build writes a layout; released on drop.
#[derive(Debug)]
pub struct LayoutLock {
    _file: std::fs::File,
}

/// A directory holding (or about to hold) an OCI image layout.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs").join("sha256")
    }

    /// The path of the blob `sha256:<hex>`.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.blobs_dir().join(digest.trim_start_matches("sha256:"))
    }

    pub fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    /// Takes the layout's write lock, waiting for another writer (another imgbuild process
    /// building the same image) to finish: blobs and `index.json` are written and unused
    /// blobs removed under it, so one build never collects another's fresh blobs. The lock is
    /// a file beside the layout (`.NAME.lock`), not in it, so OCI tools never see it; the OS
    /// releases it when the process ends, even when it is killed.
    #[allow(
        clippy::disallowed_methods,
        reason = "the lock needs a std::fs::File; the error is wrapped with the path"
    )]
    pub fn lock(&self) -> Result<LayoutLock, LayoutError> {
        let name = self
            .dir
            .file_name()
            .map_or_else(|| "image".into(), |n| n.to_string_lossy().into_owned());
        let parent = match self.dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let path = parent.join(format!(".{name}.lock"));
        let err = |source| LayoutError::Write {
            path: path.clone(),
            source,
        };
        fs_err::create_dir_all(&parent).map_err(err)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(err)?;
        file.lock().map_err(err)?;
        Ok(LayoutLock { _file: file })
    }

    /// Whether `dir` already holds a layout (it has an `oci-layout` file).
    pub fn exists(&self) -> bool {
        self.dir.join("oci-layout").is_file()
    }

    /// Makes the directory a layout without touching an image already in it. Returns
    /// whether the directory was created by this call (so a failed first build can remove
    /// it again).
    pub fn prepare(&self) -> Result<bool, LayoutError> {
        let write = |path: &Path, source| LayoutError::Write {
            path: path.to_path_buf(),
            source,
        };
        let created = !self.dir.exists();
        if !created && !self.exists() {
            let empty = fs_err::read_dir(&self.dir)
                .map(|mut entries| entries.next().is_none())
                .unwrap_or(false);
            if !empty {
                return Err(LayoutError::NotALayout {
                    path: self.dir.clone(),
                });
            }
        }
        fs_err::create_dir_all(self.blobs_dir()).map_err(|e| write(&self.blobs_dir(), e))?;
        let marker = self.dir.join("oci-layout");
        if !marker.exists() {
            crate::fs::write_atomic(&marker, OCI_LAYOUT.as_bytes())
                .map_err(|e| write(&marker, e))?;
        }
        Ok(created)
    }

    /// Writes `bytes` as a blob and returns its digest.
    pub fn write_blob(&self, bytes: &[u8]) -> Result<String, LayoutError> {
        let digest = super::sha256_digest(bytes);
        let path = self.blob_path(&digest);
        if !path.exists() {
            crate::fs::write_atomic(&path, bytes).map_err(|source| LayoutError::Write {
                path: path.clone(),
                source,
            })?;
        }
        Ok(digest)
    }

    /// Serializes `value` canonically, stores it as a blob, and returns its descriptor.
    pub fn write_json_blob<T: serde::Serialize>(
        &self,
        value: &T,
        media_type: MediaType,
        what: &'static str,
    ) -> Result<(Descriptor, Vec<u8>), LayoutError> {
        let bytes =
            canonical_json(value).map_err(|source| LayoutError::Serialize { what, source })?;
        let digest = self.write_blob(&bytes)?;
        let descriptor = Descriptor::new(
            media_type,
            bytes.len() as u64,
            digest
                .parse::<oci_spec::image::Digest>()
                .expect("sha256 digests parse"),
        );
        Ok((descriptor, bytes))
    }

    /// Copies blob `digest` from `input` (a base's blob, opened by
    /// [`super::blobs::BlobStore::open`]; `from` is its path, for messages), checking its
    /// digest on the way; a blob already present is left alone.
    pub fn import_blob(
        &self,
        mut input: std::fs::File,
        from: &Path,
        digest: &str,
    ) -> Result<(), LayoutError> {
        let target = self.blob_path(digest);
        if target.exists() {
            return Ok(());
        }
        let read = |source| ReadError::Read {
            path: from.to_path_buf(),
            source,
        };
        let write = |source| LayoutError::Write {
            path: target.clone(),
            source,
        };
        let mut temp = tempfile::Builder::new()
            .prefix(".import-")
            .tempfile_in(self.blobs_dir())
            .map_err(write)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let n = input.read(&mut buffer).map_err(read)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            temp.write_all(&buffer[..n]).map_err(write)?;
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            return Err(ReadError::Digest {
                layout: from.to_path_buf(),
                digest: digest.to_string(),
                actual,
            }
            .into());
        }
        temp.as_file().sync_all().map_err(write)?;
        crate::fs::set_mode(temp.path(), 0o644).map_err(write)?;
        temp.persist(&target).map_err(|e| write(e.error))?;
        Ok(())
    }

    /// `index.json` as [`Self::index`] reads it, or `None` when the layout has none yet.
    fn existing_index(&self) -> Result<Option<ImageIndex>, LayoutError> {
        match self.index() {
            Ok(index) => Ok(Some(index)),
            Err(err) if err.is_not_found() => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Makes `index`'s entries the layout's images under their tags, keeping every other
    /// image in the layout: an entry on disk whose tag `index` does not name (or that has no
    /// tag) stays, after `index`'s entries and in its order. One rename, as
    /// [`Self::commit_index`]. An `index.json` that cannot be read is an error, never
    /// overwritten: the images it lists would be lost with it.
    pub fn commit_tags(&self, index: &ImageIndex) -> Result<(), LayoutError> {
        let merged = match self.existing_index()? {
            Some(existing) => merge_entries(index, &existing),
            None => index.clone(),
        };
        self.commit_index(&merged)
    }

    /// Replaces `index.json` in one rename: the switch from the old image to the new.
    pub fn commit_index(&self, index: &ImageIndex) -> Result<(), LayoutError> {
        let bytes = canonical_json(index).map_err(|source| LayoutError::Serialize {
            what: "index.json",
            source,
        })?;
        let path = self.index_path();
        crate::fs::write_atomic(&path, &bytes).map_err(|source| LayoutError::Write { path, source })
    }

    /// Removes blobs (and leftover temporary files) that no entry of `index.json` reaches,
    /// whoever wrote the entry. Returns how many files were removed. When a manifest or
    /// index an entry reaches cannot be read (missing, damaged, not JSON), what it reaches is
    /// unknown, so nothing is removed (`reporter` is warned): collecting is only ever a
    /// saving of space.
    pub fn collect_garbage(&self, reporter: &dyn Reporter) -> Result<usize, LayoutError> {
        let Some(index) = self.existing_index()? else {
            return Ok(0);
        };
        let live = match self.reachable(&index) {
            Ok(live) => live,
            Err(unreadable) => {
                reporter.on_warning(&format!(
                    "not removing unused blobs from `{}`: `{}` is reachable from index.json but cannot be read as a manifest or index",
                    self.dir.display(),
                    unreadable.display()
                ));
                return Ok(0);
            }
        };
        let mut removed = 0;
        let blobs = self.blobs_dir();
        let entries = fs_err::read_dir(&blobs).map_err(|source| ReadError::Read {
            path: blobs.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !live.contains(&format!("sha256:{name}")) {
                fs_err::remove_file(entry.path()).map_err(|source| LayoutError::Write {
                    path: entry.path(),
                    source,
                })?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Every digest the layout's `index.json` reaches ([`Self::reachable`]): the blobs its
    /// images use, which a cache must not remove from under them. A missing or unreadable
    /// `index.json`, or a manifest or index it reaches that cannot be read, is an error
    /// naming the file.
    pub fn reachable_blobs(&self) -> Result<HashSet<String>, ReadError> {
        let index = self.index()?;
        self.reachable(&index).map_err(|path| ReadError::Read {
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "reachable from index.json, but missing or not a manifest or index",
            ),
        })
    }

    /// Every digest `index` reaches: its entries, and through each manifest or index its
    /// config, layers, children and subject. What a blob is comes from its content, not the
    /// descriptor's media type, so images other tools wrote (Docker media types, artifacts)
    /// keep their blobs too. `Err` names a manifest or index that cannot be read.
    fn reachable(&self, index: &ImageIndex) -> Result<HashSet<String>, PathBuf> {
        let mut live = HashSet::new();
        // Digests of blobs that are manifests or indexes, to be read for what they name.
        let mut pending: Vec<String> = index
            .manifests()
            .iter()
            .map(|d| d.digest().to_string())
            .collect();
        while let Some(digest) = pending.pop() {
            if !live.insert(digest.clone()) {
                continue;
            }
            let value = self
                .read_small_json(&digest)
                .ok_or_else(|| self.blob_path(&digest))?;
            let digests_of = |key: &str| -> Vec<String> {
                value[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d["digest"].as_str().map(str::to_string))
                    .collect()
            };
            pending.extend(digests_of("manifests"));
            if let Some(subject) = value["subject"]["digest"].as_str() {
                pending.push(subject.to_string());
            }
            // Leaves: never read, only kept.
            let leaves = value["config"]["digest"]
                .as_str()
                .map(str::to_string)
                .into_iter()
                .chain(digests_of("layers"))
                .chain(digests_of("blobs"));
            live.extend(leaves);
        }
        Ok(live)
    }
}

/// `index` with the entries of `existing` that it does not replace appended: those whose tag
/// `index` does not name, or that have no tag (unless `index` holds the same entry). The
/// top-level annotations of `existing` are kept where `index` has none.
fn merge_entries(index: &ImageIndex, existing: &ImageIndex) -> ImageIndex {
    let ours: BTreeSet<&str> = index.manifests().iter().filter_map(ref_name).collect();
    let kept = existing
        .manifests()
        .iter()
        .filter(|entry| match ref_name(entry) {
            Some(tag) => !ours.contains(tag),
            None => !index.manifests().contains(entry),
        });
    let mut entries = index.manifests().clone();
    entries.extend(kept.cloned());
    let mut merged = index.clone();
    merged.set_manifests(entries);
    if merged.annotations().is_none() {
        merged.set_annotations(existing.annotations().clone());
    }
    merged
}

impl Layout {
    /// The JSON of a blob that should be a manifest or an index; `None` when it is missing,
    /// too large to be one, not a regular file of the layout, or not JSON.
    fn read_small_json(&self, digest: &str) -> Option<serde_json::Value> {
        let relative = Path::new("blobs/sha256").join(digest.trim_start_matches("sha256:"));
        let bytes = crate::fs::read_input_beneath(&self.dir, &relative, MAX_MANIFEST_BYTES).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use oci_spec::image::{DescriptorBuilder, ImageIndexBuilder};

    use super::*;

    /// A manifest blob naming a config and one layer, each a blob of its own; returns the
    /// manifest's descriptor tagged `tag`, and the three digests.
    fn image(layout: &Layout, tag: &str, seed: &str) -> (Descriptor, [String; 3]) {
        let config = layout
            .write_blob(format!("config {seed}").as_bytes())
            .unwrap();
        let layer = layout
            .write_blob(format!("layer {seed}").as_bytes())
            .unwrap();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 1},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": 1}],
        });
        let bytes = serde_json::to_vec(&manifest).unwrap();
        let digest = layout.write_blob(&bytes).unwrap();
        let descriptor = DescriptorBuilder::default()
            .media_type(MediaType::ImageManifest)
            .size(bytes.len() as u64)
            .digest(digest.parse::<oci_spec::image::Digest>().unwrap())
            .annotations(HashMap::from([(REF_NAME.to_string(), tag.to_string())]))
            .build()
            .unwrap();
        (descriptor, [digest, config, layer])
    }

    fn index(entries: Vec<Descriptor>) -> ImageIndex {
        ImageIndexBuilder::default()
            .schema_version(2u32)
            .manifests(entries)
            .build()
            .unwrap()
    }

    fn tags(layout: &Layout) -> Vec<String> {
        let index = layout.index().unwrap();
        index
            .manifests()
            .iter()
            .map(|d| ref_name(d).unwrap().to_string())
            .collect()
    }

    #[test]
    fn a_commit_keeps_other_tags_and_their_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("l"));
        layout.prepare().unwrap();
        let (a, a_blobs) = image(&layout, "a", "a");
        layout.commit_tags(&index(vec![a])).unwrap();
        let (b1, b1_blobs) = image(&layout, "b", "b1");
        layout.commit_tags(&index(vec![b1])).unwrap();
        assert_eq!(layout.collect_garbage(&crate::report::Silent).unwrap(), 0);
        assert_eq!(tags(&layout), ["b", "a"]);

        // Tag `b` moves: only what b1 alone held goes.
        let (b2, b2_blobs) = image(&layout, "b", "b2");
        layout.commit_tags(&index(vec![b2])).unwrap();
        assert_eq!(tags(&layout), ["b", "a"]);
        assert_eq!(layout.collect_garbage(&crate::report::Silent).unwrap(), 3);
        for digest in a_blobs.iter().chain(&b2_blobs) {
            assert!(layout.blob_path(digest).is_file(), "{digest}");
        }
        for digest in &b1_blobs {
            assert!(!layout.blob_path(digest).exists(), "{digest}");
        }
    }

    #[test]
    fn blobs_of_an_unreadable_manifest_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("l"));
        layout.prepare().unwrap();
        let (a, [manifest, ..]) = image(&layout, "a", "a");
        let orphan = layout.write_blob(b"orphan").unwrap();
        layout.commit_tags(&index(vec![a])).unwrap();
        fs_err::remove_file(layout.blob_path(&manifest)).unwrap();
        assert_eq!(layout.collect_garbage(&crate::report::Silent).unwrap(), 0);
        assert!(layout.blob_path(&orphan).is_file());
    }

    #[test]
    fn a_damaged_index_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("l"));
        layout.prepare().unwrap();
        fs_err::write(layout.index_path(), b"{not json").unwrap();
        let (a, _) = image(&layout, "a", "a");
        assert!(matches!(
            layout.commit_tags(&index(vec![a])),
            Err(LayoutError::Read(ReadError::Json { .. }))
        ));
        assert_eq!(fs_err::read(layout.index_path()).unwrap(), b"{not json");
    }
}
