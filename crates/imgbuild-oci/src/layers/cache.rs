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
//!
//! The cache is evidence, not authority: it may come from another branch's CI run or another
//! machine. An entry enters an image only once this machine has seen that it holds what its
//! key says ([`verify`]: the blob decompressed is the layer's tar, byte for byte; a seekable
//! layer is built again and must come out the same); then its key file is sealed with this
//! machine's key ([`seal`]). The seal also covers the blob file's identity (device, inode,
//! size, mtime and ctime): while that is unchanged, a hit reads nothing of the blob; once it
//! changed (a link added or removed, a write, a restore), the hit costs one sha256 of the
//! blob and is sealed again. An entry that fails is evicted, named in a warning, and the
//! layer is built again. Key files and blobs are opened without following links, as regular
//! files of bounded size. Every hit leaves its key file's mtime at the time of use (written
//! again, or touched), so `imgbuild cache prune` ([`listing`]) evicts the least recently
//! used entries first.

use std::{
    collections::BTreeMap,
    fs::{File, Metadata},
    io::{Read, Seek, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::report::Reporter;

use super::{
    built::LayerBlob,
    compress::Compression,
    plan::{PlannedLayer, record_suffix},
    remote::SharedEntry,
    tar::{Entry, TarError},
};

pub mod listing;
pub mod seal;
pub mod verify;

use seal::SealKey;

/// Bump when the tar writer or the planner change what a layer holds for the same inputs.
const KEY_FORMAT: &str = "imgbuild-layer-key/1";
/// The largest key file read: a few digests and a TOC position.
const MAX_KEY_FILE: u64 = 64 << 10;

/// What a key file records: enough to describe the blob without reading it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CachedBlob {
    digest: String,
    diff_id: String,
    size: u64,
    tar_size: u64,
    /// The layer's own manifest annotations (the TOC of an eStargz or zstd:chunked layer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
    /// This machine's seal ([`seal`]) once the entry was verified here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seal: Option<String>,
    /// This machine's seal of the same claims and of the blob file's identity when it was
    /// last checked ([`identity`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity_seal: Option<String>,
}

impl CachedBlob {
    fn of(blob: &LayerBlob) -> Self {
        CachedBlob {
            digest: blob.digest.clone(),
            diff_id: blob.diff_id.clone(),
            size: blob.size,
            tar_size: blob.tar_size,
            annotations: blob.annotations.clone(),
            seal: None,
            identity_seal: None,
        }
    }

    /// What a seal covers: the layer key (itself the digest of the layer's entry list and
    /// package records) and every claim about the blob.
    fn sealed_fields(&self, key: &str, compression: Compression) -> serde_json::Value {
        serde_json::json!([
            key,
            compression.describe(),
            self.digest,
            self.diff_id,
            self.size,
            self.tar_size,
            self.annotations,
        ])
    }

    /// What an identity seal covers: the sealed fields and the blob file's identity.
    fn identity_fields(
        &self,
        key: &str,
        compression: Compression,
        blob: &Metadata,
    ) -> serde_json::Value {
        serde_json::json!([
            "identity",
            self.sealed_fields(key, compression),
            identity(blob)
        ])
    }
}

/// What tells one state of a blob file from another without reading it. A write moves
/// mtime and ctime, and nothing but the clock sets ctime (`utimensat` can put mtime back,
/// never ctime); a restored, copied or replaced file is a new inode with a new ctime. So an
/// unchanged identity means unchanged bytes. Links added or removed move ctime too: the
/// next hit then reads the blob once. (With coarse timestamps a write in the same clock
/// tick as the seal keeps ctime; that window is the few milliseconds after a check.)
fn identity(blob: &Metadata) -> serde_json::Value {
    serde_json::json!([
        blob.dev(),
        blob.ino(),
        blob.size(),
        blob.mtime(),
        blob.mtime_nsec(),
        blob.ctime(),
        blob.ctime_nsec(),
    ])
}

/// How much of a cached entry had to be checked before it could be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitCheck {
    /// Sealed, and the blob file's identity is what was sealed: nothing was read.
    Unchanged,
    /// Sealed, and the blob was read for its digest.
    Digest,
    /// Not sealed by this machine: the blob was decompressed and compared with the tar.
    Full,
}

/// Why an entry is refused, and the blob its key file names (to evict with it).
type EntryError = (String, Option<String>);

/// What the cache holds under a key.
pub enum Fetched {
    /// A verified entry, linked into the blobs directory, and what its check took.
    Hit(LayerBlob, HitCheck),
    /// Nothing usable: build the layer.
    Miss,
    /// A seekable entry not verified here: build the layer, then [`LayerCache::store`] it
    /// under `claimed`'s digest if it came out the same.
    Rebuild { claimed: String },
}

#[derive(Debug, Clone)]
pub struct LayerCache {
    blobs: PathBuf,
    keys: PathBuf,
    /// `None`: nothing is sealed, every entry is verified on every use.
    seal_key: Option<Arc<SealKey>>,
}

impl LayerCache {
    /// The cache under `cache_dir`, created if missing, sealed with this machine's key
    /// (`reporter` is warned when there is none to use). Its directories must be
    /// directories, not links to elsewhere.
    pub fn open(cache_dir: &Path, reporter: &dyn Reporter) -> std::io::Result<Self> {
        let root = cache_dir.join("layers");
        let cache = Self {
            blobs: root.join("blobs"),
            keys: root.join("keys"),
            seal_key: machine_key(cache_dir, reporter),
        };
        for dir in [&root, &cache.blobs, &cache.keys] {
            match fs_err::symlink_metadata(dir) {
                Ok(meta) if !meta.is_dir() => {
                    let what = crate::fs::file_kind(&meta.file_type());
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("`{}` is {what}, not a directory", dir.display()),
                    ));
                }
                _ => fs_err::create_dir_all(dir)?,
            }
        }
        Ok(cache)
    }

    fn key_path(&self, key: &str) -> PathBuf {
        self.keys.join(format!("{key}.json"))
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.blobs.join(digest.trim_start_matches("sha256:"))
    }

    /// The entry under `key` of layer `name`, checked before use: sealed by this machine and
    /// its blob unchanged since, or its blob's digest right, or verified in full against the
    /// tar `write_tar` makes (then sealed). An entry that fails is evicted with a warning
    /// to `reporter` naming the layer.
    pub fn fetch(
        &self,
        name: &str,
        key: &str,
        compression: Compression,
        blobs_dir: &Path,
        write_tar: &dyn Fn(&mut dyn Write) -> Result<(), TarError>,
        reporter: &dyn Reporter,
    ) -> std::io::Result<Fetched> {
        let reject = |digest: Option<&str>, why: &str| {
            reporter.on_warning(&format!(
                "layer `{name}`: the layer cache's entry {key} fails its check ({why}); evicted, building the layer again"
            ));
            self.evict(key, digest);
            Fetched::Miss
        };
        let (cached, mut file, checked_meta) = match self.open_entry(key) {
            Ok(Some(entry)) => entry,
            Ok(None) => return Ok(Fetched::Miss),
            Err((why, digest)) => return Ok(reject(digest.as_deref(), &why)),
        };
        let check = self.check_needed(key, &cached, compression, &checked_meta);
        let checked = match check {
            HitCheck::Unchanged => Ok(()),
            HitCheck::Digest => check_digest(&mut file, &cached).map_err(|e| e.to_string()),
            HitCheck::Full if compression.seekable().is_some() => {
                return Ok(Fetched::Rebuild {
                    claimed: cached.digest,
                });
            }
            HitCheck::Full => {
                verify::plain(&mut file, &cached, compression, write_tar).map_err(|e| e.to_string())
            }
        };
        if let Err(why) = checked {
            return Ok(reject(Some(&cached.digest), &why));
        }
        let source = self.blob_path(&cached.digest);
        let linked = match link_verified(&file, &source, &cached.digest, blobs_dir) {
            Ok(linked) => linked,
            Err(err) => return Ok(reject(Some(&cached.digest), &err.to_string())),
        };
        if self.seal_key.is_some() && (check != HitCheck::Unchanged || linked) {
            let now = resealable(&file, &checked_meta);
            self.write_key_file(key, &cached, compression, now.as_ref(), reporter);
        } else {
            // A hit that rewrites nothing still marks the entry used: `imgbuild cache prune`
            // evicts the least recently used entries by their key files' mtime.
            self.touch_key_file(key);
        }
        Ok(Fetched::Hit(
            LayerBlob {
                diff_id: cached.diff_id,
                digest: cached.digest,
                size: cached.size,
                tar_size: cached.tar_size,
                media_type: compression.media_type(),
                annotations: cached.annotations,
            },
            check,
        ))
    }

    /// The key file under `key` and its blob, opened; `Ok(None)` when there is no entry,
    /// `Err` with the reason when there is one that cannot be what it says.
    /// The error carries the blob's digest once the key file named a well-formed one.
    fn open_entry(&self, key: &str) -> Result<Option<(CachedBlob, File, Metadata)>, EntryError> {
        let text = match open_regular(&self.key_path(key)) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            opened => {
                read_bounded(opened, MAX_KEY_FILE).map_err(|e| (format!("key file: {e}"), None))?
            }
        };
        let cached: CachedBlob =
            serde_json::from_slice(&text).map_err(|e| (format!("key file: {e}"), None))?;
        if !is_sha256(&cached.digest) || !is_sha256(&cached.diff_id) {
            return Err(("key file: a digest is not `sha256:<hex>`".to_string(), None));
        }
        let blob_err = |e: std::io::Error| (format!("blob: {e}"), Some(cached.digest.clone()));
        let file = open_regular(&self.blob_path(&cached.digest)).map_err(blob_err)?;
        let meta = file.metadata().map_err(blob_err)?;
        if meta.len() != cached.size {
            let why = format!(
                "blob: {} bytes, its key file says {}",
                meta.len(),
                cached.size
            );
            return Err((why, Some(cached.digest)));
        }
        Ok(Some((cached, file, meta)))
    }

    /// The least check that shows the entry is what it claims, given the seals it carries
    /// and its blob file's identity `blob`.
    fn check_needed(
        &self,
        key: &str,
        cached: &CachedBlob,
        compression: Compression,
        blob: &Metadata,
    ) -> HitCheck {
        let Some(machine) = &self.seal_key else {
            return HitCheck::Full;
        };
        let sealed = |seal: &Option<String>, fields: serde_json::Value| {
            seal.as_deref()
                .is_some_and(|seal| machine.is_seal_of(seal, &fields))
        };
        if sealed(
            &cached.identity_seal,
            cached.identity_fields(key, compression, blob),
        ) {
            HitCheck::Unchanged
        } else if sealed(&cached.seal, cached.sealed_fields(key, compression)) {
            HitCheck::Digest
        } else {
            HitCheck::Full
        }
    }

    /// Sets the mtime of the key file under `key` to now, through a descriptor opened
    /// without following a link; a key file that cannot be touched only loses its place in
    /// the least-recently-used order, so a failure is logged, not returned.
    fn touch_key_file(&self, key: &str) {
        let path = self.key_path(key);
        let touched =
            open_regular(&path).and_then(|file| file.set_modified(std::time::SystemTime::now()));
        if let Err(err) = touched {
            tracing::debug!("cannot mark `{}` used: {err}", path.display());
        }
    }

    /// Removes the key file under `key` and the blob `digest` names (a link or file, never
    /// what a link points at; a directory is left).
    pub(crate) fn evict(&self, key: &str, digest: Option<&str>) {
        let blob = digest.filter(|d| is_sha256(d)).map(|d| self.blob_path(d));
        for path in std::iter::once(self.key_path(key)).chain(blob) {
            if fs_err::symlink_metadata(&path).is_ok_and(|m| !m.is_dir())
                && let Err(err) = fs_err::remove_file(&path)
            {
                tracing::debug!("cannot evict `{}`: {err}", path.display());
            }
        }
    }

    /// Holds `key` for this process until the returned file is dropped: a second build
    /// wanting the same layer (matrix variants at once) waits, then finds it cached instead
    /// of compressing it again.
    #[allow(
        clippy::disallowed_methods,
        reason = "O_NOFOLLOW needs std OpenOptions; the error is wrapped with the path"
    )]
    pub(crate) fn lock_key(&self, key: &str) -> std::io::Result<std::fs::File> {
        let path = self.keys.join(format!("{key}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("`{}`: {e}", path.display())))?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("the lock file is not a regular file"));
        }
        file.lock()?;
        Ok(file)
    }

    /// Where a shared cache's blobs are downloaded to, so [`Self::adopt`] moves them in
    /// with one rename.
    pub fn incoming_dir(&self) -> &Path {
        &self.blobs
    }

    /// Takes `entry`, downloaded from a shared cache, as the entry under `key`, not sealed:
    /// the next [`Self::fetch`] verifies it in full, as any entry this machine did not check.
    /// A signed entry of a seekable layer is sealed instead (its signature is its check; the
    /// full check of a seekable layer is a rebuild), so the next fetch checks its digest.
    pub fn adopt(
        &self,
        key: &str,
        entry: &SharedEntry,
        compression: Compression,
        reporter: &dyn Reporter,
    ) -> std::io::Result<()> {
        if !is_sha256(&entry.blob.digest) || !is_sha256(&entry.blob.diff_id) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a digest is not `sha256:<hex>`",
            ));
        }
        let target = self.blob_path(&entry.blob.digest);
        if fs_err::symlink_metadata(&target).is_ok_and(|m| !m.is_file()) {
            fs_err::remove_file(&target)?;
        }
        fs_err::rename(&entry.path, &target)?;
        let cached = CachedBlob::of(&entry.blob);
        if entry.signed && compression.seekable().is_some() && self.seal_key.is_some() {
            // Sealed without the file's identity: the next fetch reads its digest.
            self.write_key_file(key, &cached, compression, None, reporter);
            return Ok(());
        }
        let json = serde_json::to_vec(&cached).map_err(std::io::Error::other)?;
        crate::fs::write_atomic(&self.key_path(key), &json)
    }

    /// Records `blob`, written by this build at `blob_path`, under `key`, sealed; a key file
    /// that cannot be written is a warning to `reporter`.
    pub fn store(
        &self,
        key: &str,
        blob: &LayerBlob,
        blob_path: &Path,
        compression: Compression,
        reporter: &dyn Reporter,
    ) -> std::io::Result<()> {
        let target = self.blob_path(&blob.digest);
        if fs_err::symlink_metadata(&target).is_ok_and(|m| !m.is_file()) {
            fs_err::remove_file(&target)?;
        }
        crate::fs::link_or_copy(blob_path, &target)?;
        // This build wrote the blob: its identity now is the one to seal.
        let meta = open_regular(&target)?.metadata()?;
        self.write_key_file(
            key,
            &CachedBlob::of(blob),
            compression,
            Some(&meta),
            reporter,
        );
        Ok(())
    }

    /// Writes the key file of `cached` under `key`, sealed when this machine has a key, with
    /// the blob file's identity `blob` when given.
    fn write_key_file(
        &self,
        key: &str,
        cached: &CachedBlob,
        compression: Compression,
        blob: Option<&Metadata>,
        reporter: &dyn Reporter,
    ) {
        let mut cached = cached.clone();
        let machine = self.seal_key.as_ref();
        cached.seal = machine.map(|m| m.seal(&cached.sealed_fields(key, compression)));
        cached.identity_seal = machine
            .zip(blob)
            .map(|(m, blob)| m.seal(&cached.identity_fields(key, compression, blob)));
        let written = serde_json::to_vec(&cached)
            .map_err(std::io::Error::other)
            .and_then(|json| crate::fs::write_atomic(&self.key_path(key), &json));
        if let Err(err) = written {
            reporter.on_warning(&format!(
                "could not write the layer cache's entry {key}: {err}"
            ));
        }
    }
}

/// The identity to seal again for the blob checked through `file` (a link since the check
/// moved its ctime); `None` if its bytes may have changed since the check (size or mtime
/// moved): then the next hit reads it.
fn resealable(file: &File, checked: &Metadata) -> Option<Metadata> {
    file.metadata().ok().filter(|now| {
        (now.size(), now.mtime(), now.mtime_nsec())
            == (checked.size(), checked.mtime(), checked.mtime_nsec())
    })
}

/// This machine's sealing key, or `None` (with a warning to `reporter`) when there is none
/// to use.
fn machine_key(cache_dir: &Path, reporter: &dyn Reporter) -> Option<Arc<SealKey>> {
    let Some(path) = seal::key_path() else {
        reporter.on_warning(&format!(
            "no HOME, XDG_STATE_HOME or {}: cached layers are verified in full on every use",
            seal::KEY_FILE_ENV
        ));
        return None;
    };
    match SealKey::load_or_create(&path, cache_dir) {
        Ok(key) => Some(Arc::new(key)),
        Err(why) => {
            reporter.on_warning(&format!(
                "the layer cache key `{}` cannot be used ({why}): cached layers are verified in full on every use",
                path.display()
            ));
            None
        }
    }
}

/// `path` opened for reading without following a link and without waiting on a fifo; only
/// a regular file is returned.
#[allow(
    clippy::disallowed_methods,
    reason = "O_NOFOLLOW needs std OpenOptions; the caller names the path"
)]
fn open_regular(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other("is a symbolic link"),
            _ => err,
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let kind = crate::fs::file_kind(&meta.file_type());
        return Err(std::io::Error::other(format!(
            "is {kind}, not a regular file"
        )));
    }
    Ok(file)
}

/// At most `max` bytes of `file`; more is an error.
fn read_bounded(file: std::io::Result<File>, max: u64) -> std::io::Result<Vec<u8>> {
    Ok(crate::fs::read_stream(file?, max)?)
}

fn is_sha256(digest: &str) -> bool {
    crate::names::is_sha256_digest(digest)
}

/// `sha256:<hex>` and size of `file`, read from its start.
fn digest_of(file: &mut File) -> std::io::Result<(String, u64)> {
    file.rewind()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((format!("sha256:{}", hex::encode(hasher.finalize())), size))
}

/// A sealed entry's cheap check: its blob still has the digest it had when sealed.
fn check_digest(file: &mut File, cached: &CachedBlob) -> std::io::Result<()> {
    match digest_of(file)? {
        (digest, size) if digest == cached.digest && size == cached.size => Ok(()),
        _ => Err(std::io::Error::other(
            "its blob is not the one its key file names",
        )),
    }
}

/// Puts the checked blob `file` (opened from `source`) into `blobs_dir`: a hard link that
/// must be `file`'s inode (a swap since the check is refused), else a copy of `file`. Says
/// whether it linked (which moves the blob's ctime).
fn link_verified(
    file: &File,
    source: &Path,
    digest: &str,
    blobs_dir: &Path,
) -> std::io::Result<bool> {
    let target = blobs_dir.join(digest.trim_start_matches("sha256:"));
    if fs_err::symlink_metadata(&target).is_ok() {
        // Content-addressed: the layout already holds these bytes.
        return Ok(false);
    }
    let checked = file.metadata()?;
    match fs_err::hard_link(source, &target) {
        Ok(()) => {
            let linked = fs_err::symlink_metadata(&target)?;
            if (linked.dev(), linked.ino()) == (checked.dev(), checked.ino()) {
                return Ok(true);
            }
            fs_err::remove_file(&target)?;
            Err(std::io::Error::other(
                "its blob was replaced while it was checked",
            ))
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(_) => {
            let mut temp = tempfile::Builder::new()
                .prefix(".imgbuild-")
                .tempfile_in(blobs_dir)?;
            let mut from = file;
            from.rewind()?;
            std::io::copy(&mut from, &mut temp)?;
            temp.as_file().sync_all()?;
            crate::fs::set_mode(temp.path(), 0o644)?;
            temp.persist(&target).map_err(|err| err.error)?;
            Ok(false)
        }
    }
}

/// The cache key of a layer with these `entries`, or `None` when the layer is not one to
/// cache (no package records in it). A part of a split package is keyed by its package's
/// record too, read from beneath `root` when another part holds it.
pub(crate) fn layer_key(
    root: &Path,
    layer: &PlannedLayer,
    entries: &[Entry],
    compression: Compression,
    landmark: Option<usize>,
) -> std::io::Result<Option<String>> {
    if layer.packages.is_empty() {
        return Ok(None);
    }
    // A wheel's RECORD lists every installed file with its sha256, as a conda-meta record
    // does.
    let records: Vec<String> = layer
        .packages
        .iter()
        .map(|package| record_suffix(layer.kind, package))
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
    if let Some(planned) = layer.part.as_ref().filter(|_| found == 0) {
        let Some(digest) = record_digest(&root.join(&planned.record))? else {
            return Ok(None);
        };
        line(serde_json::json!(["part-of", planned.record, digest]));
        found = records.len();
    }
    // Without every package's record the files' contents are not pinned: no key.
    if found != records.len() {
        return Ok(None);
    }
    Ok(Some(hex::encode(hasher.finalize())))
}

/// The sha256 of a split package's record in the staging tree, or `None` when it is not a
/// regular file there (the installer writes it, so that would be a broken staging tree).
fn record_digest(path: &Path) -> std::io::Result<Option<String>> {
    if !fs_err::symlink_metadata(path)?.is_file() {
        return Ok(None);
    }
    Ok(Some(hex::encode(rattler_digest::compute_file_digest::<
        rattler_digest::Sha256,
    >(path)?)))
}
