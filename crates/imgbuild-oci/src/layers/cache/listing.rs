//! What the layer cache holds, file by file, for `imgbuild cache prune`: every key file
//! with the blob it names and when it was last used (its mtime, which [`super::LayerCache`]
//! moves on every hit), every blob and every lock file. Nothing is followed: each entry is
//! described by `lstat`, a key file is read only when it is a regular file (opened without
//! following a link, at most [`super::MAX_KEY_FILE`]), and a directory of the cache that is
//! a link is refused.

use std::{
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::{CachedBlob, MAX_KEY_FILE, is_sha256, open_regular, read_bounded};

/// Why the layer cache cannot be listed; each names the directory.
#[derive(Debug, thiserror::Error)]
pub enum LayerCacheListError {
    #[error("`{}` is a symbolic link; the layer cache's directories are never followed", path.display())]
    LinkedDirectory { path: PathBuf },
    #[error("`{}` is {kind}, not a directory", path.display())]
    NotADirectory { path: PathBuf, kind: &'static str },
    #[error("Cannot list `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The files of `<cache>/layers`.
#[derive(Debug, Default)]
pub struct LayerCacheListing {
    /// `<cache>/layers/keys/<key>.json`, sorted by key.
    pub keys: Vec<KeyFileEntry>,
    /// `<cache>/layers/blobs/<hex>`, sorted by digest.
    pub blobs: Vec<CacheBlobFile>,
    /// `<cache>/layers/keys/<key>.lock`, sorted by key.
    pub locks: Vec<CacheLockFile>,
    /// The bytes of every other file directly in `layers`, `keys` or `blobs` (temporary
    /// files of a build writing now, names that are not the cache's): counted, never removed.
    pub other_bytes: u64,
}

/// A key file and what it says.
#[derive(Debug)]
pub struct KeyFileEntry {
    pub key: String,
    pub path: PathBuf,
    /// Its apparent size (a link's own size, for a link).
    pub bytes: u64,
    /// Its mtime: when the entry was stored or last hit.
    pub used: SystemTime,
    /// Whether it is a symbolic link (removed as one, never followed).
    pub is_link: bool,
    /// The blob it names, `sha256:<hex>` and its size; or why the cache would refuse the
    /// key file on use (a link, not a regular file, too large, not a key file).
    pub blob: Result<(String, u64), String>,
}

/// A file of the blobs directory named by a digest.
#[derive(Debug)]
pub struct CacheBlobFile {
    /// `sha256:<hex>`.
    pub digest: String,
    pub path: PathBuf,
    pub bytes: u64,
    pub modified: SystemTime,
    /// A regular file (anything else, a link included, the cache refuses on use).
    pub regular: bool,
    pub is_link: bool,
    /// Device and inode: what two names of one file share.
    pub id: (u64, u64),
}

/// A key's lock file, which a build holds while it fetches or stores the key.
#[derive(Debug)]
pub struct CacheLockFile {
    pub key: String,
    pub path: PathBuf,
    pub bytes: u64,
    pub is_link: bool,
}

/// What `<cache>/layers` holds; `None` when there is no layer cache.
pub fn list(cache_dir: &Path) -> Result<Option<LayerCacheListing>, LayerCacheListError> {
    let root = cache_dir.join("layers");
    if !directory(&root)? {
        return Ok(None);
    }
    let mut listing = LayerCacheListing::default();
    listing.other_bytes += loose_files(&root, &["keys", "blobs"])?;
    let keys = root.join("keys");
    for (name, path, meta) in entries(&keys)? {
        if meta.is_dir() {
            continue;
        }
        let bytes = meta.len();
        let is_link = meta.file_type().is_symlink();
        if let Some(key) = name.strip_suffix(".json").filter(|k| !k.is_empty()) {
            let blob = if is_link {
                Err("the key file is a symbolic link".to_string())
            } else if !meta.is_file() {
                let kind = crate::fs::file_kind(&meta.file_type());
                Err(format!("the key file is {kind}, not a regular file"))
            } else {
                named_blob(&path)
            };
            listing.keys.push(KeyFileEntry {
                key: key.to_string(),
                path,
                bytes,
                used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                is_link,
                blob,
            });
        } else if let Some(key) = name.strip_suffix(".lock").filter(|k| !k.is_empty()) {
            listing.locks.push(CacheLockFile {
                key: key.to_string(),
                path,
                bytes,
                is_link,
            });
        } else {
            listing.other_bytes += bytes;
        }
    }
    let blobs = root.join("blobs");
    for (name, path, meta) in entries(&blobs)? {
        if meta.is_dir() {
            continue;
        }
        let digest = format!("sha256:{name}");
        if !is_sha256(&digest) {
            listing.other_bytes += meta.len();
            continue;
        }
        listing.blobs.push(CacheBlobFile {
            digest,
            path,
            bytes: meta.len(),
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            regular: meta.is_file(),
            is_link: meta.file_type().is_symlink(),
            id: (meta.dev(), meta.ino()),
        });
    }
    listing.keys.sort_by(|a, b| a.key.cmp(&b.key));
    listing.blobs.sort_by(|a, b| a.digest.cmp(&b.digest));
    listing.locks.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(Some(listing))
}

/// The lock file at `path`, opened without following a link and held; `Ok(None)` while a
/// build holds it. Dropping the file releases it.
pub fn hold_lock(path: &Path) -> std::io::Result<Option<File>> {
    let file = open_regular(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(err)) => Err(err),
    }
}

/// Whether `dir` is a directory (`false` when it is missing); a link or another kind of
/// file is an error.
fn directory(dir: &Path) -> Result<bool, LayerCacheListError> {
    match fs_err::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(LayerCacheListError::LinkedDirectory {
            path: dir.to_path_buf(),
        }),
        Ok(meta) if !meta.is_dir() => Err(LayerCacheListError::NotADirectory {
            path: dir.to_path_buf(),
            kind: crate::fs::file_kind(&meta.file_type()),
        }),
        Ok(_) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(LayerCacheListError::Read {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// The entries of `dir` (none when it is missing), each with its `lstat`, by name.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf, std::fs::Metadata)>, LayerCacheListError> {
    if !directory(dir)? {
        return Ok(Vec::new());
    }
    let err = |source| LayerCacheListError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in fs_err::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let path = entry.path();
        let meta = match fs_err::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Removed since it was listed (a build's temporary file renamed into place).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(LayerCacheListError::Read { path, source }),
        };
        out.push((entry.file_name().to_string_lossy().into_owned(), path, meta));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The bytes of the files directly in `dir` other than the directories `skip`.
fn loose_files(dir: &Path, skip: &[&str]) -> Result<u64, LayerCacheListError> {
    Ok(entries(dir)?
        .into_iter()
        .filter(|(name, _, meta)| !meta.is_dir() && !skip.contains(&name.as_str()))
        .map(|(_, _, meta)| meta.len())
        .sum())
}

/// The blob the key file at `path` names, read as a fetch reads it.
fn named_blob(path: &Path) -> Result<(String, u64), String> {
    let text =
        read_bounded(open_regular(path), MAX_KEY_FILE).map_err(|e| format!("the key file: {e}"))?;
    let cached: CachedBlob =
        serde_json::from_slice(&text).map_err(|e| format!("the key file: {e}"))?;
    if !is_sha256(&cached.digest) {
        return Err("the key file: its digest is not `sha256:<hex>`".to_string());
    }
    Ok((cached.digest, cached.size))
}
