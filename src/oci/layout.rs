//! An OCI image layout on disk: `oci-layout`, `index.json`, `blobs/sha256/<hex>`.
//!
//! Blobs are immutable and named by content, so they can be added to a live layout at any
//! time; the only file that changes is `index.json`, and it is replaced by a rename. A build
//! that fails or is killed therefore leaves the previous image readable and intact. Blobs no
//! longer reachable from the index are removed after the switch.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    path::{Path, PathBuf},
};

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use sha2::{Digest, Sha256};

use super::json::canonical_json;

const OCI_LAYOUT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// The annotation that names a tag in an image layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The entry of `index` tagged `tag`.
pub fn tagged<'a>(index: &'a ImageIndex, tag: &str) -> Option<&'a Descriptor> {
    index.manifests().iter().find(|d| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .is_some_and(|name| name == tag)
    })
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
    #[error("Failed to read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is not valid OCI JSON", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("Failed to serialize {what}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("Blob `{}` does not match its digest: expected {expected}, found {actual}", path.display())]
    DigestMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
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

    /// Copies blob `digest` from another layout's blob directory, checking its digest on
    /// the way; a blob already present is left alone.
    pub fn import_blob(&self, from: &Path, digest: &str) -> Result<(), LayoutError> {
        let target = self.blob_path(digest);
        if target.exists() {
            return Ok(());
        }
        let read = |source| LayoutError::Read {
            path: from.to_path_buf(),
            source,
        };
        let write = |source| LayoutError::Write {
            path: target.clone(),
            source,
        };
        let mut input = fs_err::File::open(from).map_err(read)?;
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
            return Err(LayoutError::DigestMismatch {
                path: from.to_path_buf(),
                expected: digest.to_string(),
                actual,
            });
        }
        temp.as_file().sync_all().map_err(write)?;
        crate::fs::set_mode(temp.path(), 0o644).map_err(write)?;
        temp.persist(&target).map_err(|e| write(e.error))?;
        Ok(())
    }

    /// Reads `index.json`, if there is one.
    pub fn read_index(&self) -> Result<Option<ImageIndex>, LayoutError> {
        let path = self.index_path();
        if !path.exists() {
            return Ok(None);
        }
        ImageIndex::from_file(&path)
            .map(Some)
            .map_err(|source| LayoutError::Json { path, source })
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

    /// Removes blobs (and leftover temporary files) that `index.json` no longer reaches.
    /// Returns how many files were removed.
    pub fn collect_garbage(&self) -> Result<usize, LayoutError> {
        let Some(index) = self.read_index()? else {
            return Ok(0);
        };
        let mut live = BTreeSet::new();
        let mut pending: Vec<Descriptor> = index.manifests().clone();
        while let Some(descriptor) = pending.pop() {
            let digest = descriptor.digest().to_string();
            if !live.insert(digest.clone()) {
                continue;
            }
            let path = self.blob_path(&digest);
            match descriptor.media_type() {
                MediaType::ImageManifest => {
                    let manifest = ImageManifest::from_file(&path)
                        .map_err(|source| LayoutError::Json { path, source })?;
                    pending.push(manifest.config().clone());
                    pending.extend(manifest.layers().iter().cloned());
                }
                MediaType::ImageIndex => {
                    let nested = ImageIndex::from_file(&path)
                        .map_err(|source| LayoutError::Json { path, source })?;
                    pending.extend(nested.manifests().iter().cloned());
                }
                _ => {}
            }
        }
        let mut removed = 0;
        let blobs = self.blobs_dir();
        let entries = fs_err::read_dir(&blobs).map_err(|source| LayoutError::Read {
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
}
