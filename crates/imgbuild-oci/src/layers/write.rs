//! Layer blobs: tar → sha256 (diff_id) → compressor → sha256 (digest) → file, in one
//! streaming pass, never a whole layer in memory. Several layers are written at once and the
//! blocks of each are compressed on a shared pool ([`super::compress`]), so the bytes do not
//! depend on the thread count. A layer found in the layer cache ([`super::cache`]) is linked,
//! not written.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use sha2::{Digest, Sha256};

use crate::report::Reporter;

use super::{
    blob_file::BlobFile,
    built::{BuiltLayer, LayerBlob},
    cache::{Fetched, LayerCache, layer_key},
    compress::{CompressPool, Compression},
    owned::{OwnedLayer, write_owned_tar},
    plan::{LayerKind, LayerPlan, PlannedLayer},
    remote::SharedCache,
    seekable::SeekableWriter,
    tar::{TarError, entries, prefetch_first, write_entries},
};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("Failed to write layer `{name}`")]
    Tar {
        name: String,
        #[source]
        source: TarError,
    },
    #[error("Failed to write layer `{name}` to `{}`", path.display())]
    Blob {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A writer that hashes and counts what passes through it: a layer's tar (its diff_id) and
/// its blob (its digest), and a model's layers (`crate::models`).
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The inner writer, the `sha256:<hex>` of what passed and its bytes.
    pub fn finish(self) -> (W, String, u64) {
        (
            self.inner,
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.bytes,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// How a layer is found in the caches: its key (none: not cached) and whether it may be
/// shared with other builders.
struct Cached {
    key: Option<String>,
    shared: bool,
}

/// A layer's tar entries as written, where the prefetched ones end, and its cache key.
struct KeyedEntries {
    entries: Vec<super::tar::Entry>,
    landmark: Option<usize>,
    key: Option<String>,
}

/// Where and how layers are written.
pub struct LayerWriter<'a> {
    pub root: &'a Path,
    pub compression: Compression,
    pub blobs_dir: &'a Path,
    pub pool: CompressPool,
    pub cache: Option<&'a LayerCache>,
    /// The cache shared with other builders (`--cache-repo`), asked after a local miss and
    /// offered every package layer; only used with a local cache.
    pub shared: Option<&'a dyn SharedCache>,
    /// `[layers] prefetch` (eStargz): the paths each package layer puts first.
    pub prefetch: &'a [glob::Pattern],
    /// Hears of each layer done (its compressed size), and of the layer cache's warnings.
    pub reporter: &'a dyn Reporter,
}

impl LayerWriter<'_> {
    /// The key the layer cache files `layer` under; `None` for a layer it does not keep
    /// (one without packages), or without a cache. A sharded build assigns layers by it.
    pub fn key(&self, layer: &PlannedLayer) -> Result<Option<String>, WriteError> {
        self.keyed_entries(layer).map(|keyed| keyed.key)
    }

    /// The tar entries of `layer` in the order they are written (the prefetched paths
    /// first), and its cache key.
    fn keyed_entries(&self, layer: &PlannedLayer) -> Result<KeyedEntries, WriteError> {
        let tar_err = |source: TarError| WriteError::Tar {
            name: layer.name.clone(),
            source,
        };
        let entries = entries(self.root, &layer.paths).map_err(tar_err)?;
        let (entries, landmark) = if self.prefetch.is_empty() {
            (entries, None)
        } else {
            let (ordered, first) = prefetch_first(entries, self.prefetch);
            (ordered, Some(first))
        };
        let key = match self.cache {
            Some(_) => layer_key(self.root, layer, &entries, self.compression, landmark)
                .map_err(|e| self.blob_err(&layer.name, self.root, e))?,
            None => None,
        };
        Ok(KeyedEntries {
            entries,
            landmark,
            key,
        })
    }

    /// Writes (or takes from the cache) one layer.
    pub fn write(&self, layer: &PlannedLayer) -> Result<BuiltLayer, WriteError> {
        let KeyedEntries {
            entries,
            landmark,
            key,
        } = self.keyed_entries(layer)?;
        // Only package layers are shared: the others are the build's own, small, and made
        // from what this build read.
        let shared = matches!(layer.kind, LayerKind::Conda | LayerKind::Wheels);
        let cached = Cached { key, shared };
        let (blob, reused) = self.cached_or_written(&layer.name, cached, landmark, |out| {
            write_entries(&entries, layer.mtime, out).map(drop)
        })?;
        Ok(BuiltLayer {
            kind: layer.kind,
            name: layer.name.clone(),
            packages: layer.packages.clone(),
            part: layer.part.as_ref().map(|planned| planned.part),
            blob,
            reused,
        })
    }

    /// Writes (or takes from the cache) a layer of entries with their own owners, keyed by
    /// every entry whole.
    pub fn write_owned(&self, layer: &OwnedLayer) -> Result<BuiltLayer, WriteError> {
        let key = self.cache.map(|_| layer.key(self.compression));
        let cached = Cached { key, shared: false };
        let (blob, reused) = self.cached_or_written(&layer.name, cached, None, |out| {
            write_owned_tar(layer, out).map(drop)
        })?;
        Ok(BuiltLayer {
            kind: layer.kind,
            name: layer.name.clone(),
            packages: Vec::new(),
            part: None,
            blob,
            reused,
        })
    }

    fn blob_err(&self, name: &str, path: &Path, source: std::io::Error) -> WriteError {
        WriteError::Blob {
            name: name.to_string(),
            path: path.to_path_buf(),
            source,
        }
    }

    /// The blob cached under `key` (held while it is written, so a second build wanting it
    /// waits and takes it from the cache) once the cache shows it is the tar `write_tar`
    /// makes, else that tar, compressed, written and stored under `key`; a shared layer is
    /// also looked up in, and offered to, the shared cache. Says whether it was reused.
    fn cached_or_written(
        &self,
        name: &str,
        cached: Cached,
        landmark: Option<usize>,
        write_tar: impl Fn(&mut dyn Write) -> Result<(), TarError>,
    ) -> Result<(LayerBlob, bool), WriteError> {
        let (cache, key) = match (self.cache, cached.key) {
            (Some(cache), Some(key)) => (cache, key),
            _ => return Ok((self.write_blob(name, landmark, &write_tar)?.0, false)),
        };
        let _key_lock = match cache.lock_key(&key) {
            Ok(lock) => lock,
            Err(err) => {
                self.reporter.on_warning(&format!(
                    "layer `{name}`: the layer cache cannot be locked ({err}); not using it"
                ));
                return Ok((self.write_blob(name, landmark, &write_tar)?.0, false));
            }
        };
        let shared = self.shared.filter(|_| cached.shared);
        let (blob, target, reused) = match self.look_up(cache, shared, name, &key, &write_tar)? {
            Fetched::Hit(blob, check) => {
                tracing::debug!("layer `{name}`: from the layer cache ({check:?})");
                let target = self
                    .blobs_dir
                    .join(blob.digest.trim_start_matches("sha256:"));
                (blob, target, true)
            }
            missed => {
                let claimed = match &missed {
                    Fetched::Rebuild { claimed } => Some(claimed.as_str()),
                    _ => None,
                };
                let (blob, target) =
                    self.written_and_stored(cache, name, &key, claimed, landmark, &write_tar)?;
                (blob, target, false)
            }
        };
        if let Some(shared) = shared {
            shared.offer(&key, &blob, &target, self.compression);
        }
        Ok((blob, reused))
    }

    /// What the local cache holds under `key`, or after a local miss, what the shared cache
    /// does, taken into the local cache and checked there.
    fn look_up(
        &self,
        cache: &LayerCache,
        shared: Option<&dyn SharedCache>,
        name: &str,
        key: &str,
        write_tar: &dyn Fn(&mut dyn Write) -> Result<(), TarError>,
    ) -> Result<Fetched, WriteError> {
        let fetch = || {
            cache
                .fetch(
                    name,
                    key,
                    self.compression,
                    self.blobs_dir,
                    write_tar,
                    self.reporter,
                )
                .map_err(|e| self.blob_err(name, self.blobs_dir, e))
        };
        let local = fetch()?;
        let shared = shared.filter(|s| s.serves(self.compression));
        let (Fetched::Miss, Some(shared)) = (&local, shared) else {
            return Ok(local);
        };
        let incoming = cache.incoming_dir();
        let Some(entry) = shared.fetch(name, key, self.compression, incoming, self.reporter) else {
            return Ok(Fetched::Miss);
        };
        if let Err(err) = cache.adopt(key, &entry, self.compression, self.reporter) {
            self.reporter.on_warning(&format!(
                "layer `{name}`: the shared cache's entry cannot be taken into the layer cache ({err}); building the layer"
            ));
            // The download is already gone when the rename took it.
            let _ = fs_err::remove_file(&entry.path);
            shared.rejected(key);
            return Ok(Fetched::Miss);
        }
        let fetched = fetch()?;
        if !matches!(fetched, Fetched::Hit(..)) {
            shared.rejected(key);
        }
        Ok(fetched)
    }

    /// The layer compressed and written, then stored under `key`; a seekable entry the cache
    /// `claimed` is checked against it (its TOC holds offsets into the compressed bytes, so
    /// building it again is its check) and evicted.
    fn written_and_stored(
        &self,
        cache: &LayerCache,
        name: &str,
        key: &str,
        claimed: Option<&str>,
        landmark: Option<usize>,
        write_tar: &dyn Fn(&mut dyn Write) -> Result<(), TarError>,
    ) -> Result<(LayerBlob, PathBuf), WriteError> {
        let (blob, target) = self.write_blob(name, landmark, write_tar)?;
        if let Some(claimed) = claimed {
            if claimed != blob.digest {
                self.reporter.on_warning(&format!(
                    "layer `{name}`: the layer cache's entry {key} fails its check (its blob is not what the layer builds to); evicted"
                ));
            }
            cache.evict(key, Some(claimed));
        }
        // A cache that cannot be written costs the next build time, not this build.
        let stored = cache.store(key, &blob, &target, self.compression, self.reporter);
        if let Err(err) = stored {
            self.reporter.on_warning(&format!(
                "could not store layer `{name}` in the layer cache: {err}"
            ));
        }
        Ok((blob, target))
    }

    /// Compresses the tar `write_tar` makes into a blob named by its digest; returns the
    /// blob and its path.
    fn write_blob(
        &self,
        name: &str,
        landmark: Option<usize>,
        write_tar: &dyn Fn(&mut dyn Write) -> Result<(), TarError>,
    ) -> Result<(LayerBlob, PathBuf), WriteError> {
        let blob_err = |path: &Path, source| self.blob_err(name, path, source);
        let temp = tempfile::Builder::new()
            .prefix(".layer-")
            .tempfile_in(self.blobs_dir)
            .map_err(|e| blob_err(self.blobs_dir, e))?;
        let file = BlobFile::create(temp.path()).map_err(|e| blob_err(temp.path(), e))?;
        tracing::debug!(
            "layer `{name}`: blob written {}",
            if file.is_direct() {
                "direct (O_DIRECT)"
            } else {
                "through the page cache"
            }
        );
        let compressed = HashingWriter::new(file);
        let tar_err = |source| WriteError::Tar {
            name: name.to_string(),
            source,
        };
        let (compressed, written) = if let Some(format) = self.compression.seekable() {
            let mut writer = SeekableWriter::new(compressed, self.pool.clone(), format);
            if let Some(prefetched) = landmark {
                writer = writer.with_landmark(prefetched);
            }
            write_tar(&mut writer).map_err(tar_err)?;
            let (compressed, summary) = writer.finish().map_err(|e| blob_err(temp.path(), e))?;
            let written = (summary.diff_id, summary.uncompressed_size);
            (compressed, (written, summary.annotations))
        } else {
            let compressor = self
                .pool
                .writer(self.compression, compressed)
                .map_err(|e| blob_err(temp.path(), e))?;
            let mut tar_out = HashingWriter::new(compressor);
            write_tar(&mut tar_out).map_err(tar_err)?;
            let (compressor, diff_id, tar_size) = tar_out.finish();
            let compressed = compressor.finish().map_err(|e| blob_err(temp.path(), e))?;
            (compressed, ((diff_id, tar_size), BTreeMap::new()))
        };
        let ((diff_id, tar_size), annotations) = written;
        let (file, digest, size) = compressed.finish();
        file.finish().map_err(|e| blob_err(temp.path(), e))?;

        let target = self.blobs_dir.join(digest.trim_start_matches("sha256:"));
        crate::fs::set_mode(temp.path(), 0o644).map_err(|e| blob_err(temp.path(), e))?;
        // Blobs are named by content: an existing blob of that name already holds these bytes.
        temp.persist(&target)
            .map_err(|e| blob_err(&target, e.error))?;
        let blob = LayerBlob {
            diff_id,
            digest,
            size,
            tar_size,
            media_type: self.compression.media_type(),
            annotations,
        };
        Ok((blob, target))
    }

    /// Writes every layer of `plan`, up to the pool's thread count at once; layers come back
    /// in plan order.
    pub fn write_all(&self, plan: &LayerPlan) -> Result<Vec<BuiltLayer>, WriteError> {
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<BuiltLayer, WriteError>>>> =
            Mutex::new((0..plan.layers.len()).map(|_| None).collect());
        // Largest layers first, so one big layer does not start last and run alone.
        let mut queue: Vec<usize> = (0..plan.layers.len()).collect();
        queue.sort_by(|a, b| plan.layers[*b].size.cmp(&plan.layers[*a].size));

        // One producer (tar + digests) per pool thread: producers mostly wait for the pool,
        // and more layers in flight keep the pool busy when a layer ends. Each costs memory
        // outside the budget (buffers, hashes), so the budget caps them too.
        let producers = self
            .pool
            .threads()
            .min(self.pool.budget().layers_at_once())
            .clamp(1, plan.layers.len().max(1));
        std::thread::scope(|scope| {
            for _ in 0..producers {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&index) = queue.get(i) else { break };
                        let result = self.write(&plan.layers[index]);
                        if let Ok(layer) = &result {
                            self.reporter.on_item_done(
                                crate::report::Stage::Layers,
                                &layer.blob.digest,
                                layer.blob.size,
                            );
                        }
                        let failed = result.is_err();
                        results.lock().expect("no panics while holding the lock")[index] =
                            Some(result);
                        if failed {
                            // Stop handing out work; other threads finish their current layer.
                            next.store(queue.len(), Ordering::Relaxed);
                        }
                    }
                });
            }
        });

        let results = results.into_inner().expect("threads joined");
        let mut layers = Vec::with_capacity(results.len());
        for result in results {
            match result {
                Some(Ok(layer)) => layers.push(layer),
                Some(Err(err)) => return Err(err),
                None => {}
            }
        }
        // A `None` only follows an error, which returned above.
        Ok(layers)
    }
}
