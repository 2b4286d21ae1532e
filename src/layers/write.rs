//! Layer blobs: tar → sha256 (diff_id) → fixed-size chunks → gzip → sha256 (digest) → file,
//! in one streaming pass, never a whole layer in memory. Layers compress in parallel, one
//! layer per thread, so the bytes do not depend on the thread count.

use std::{
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use sha2::{Digest, Sha256};

use super::{
    plan::{LayerPlan, PlannedLayer},
    tar::{TarError, write_tar},
};

/// zlib-rs emits different bytes when the same input arrives cut into different writes,
/// so the compressor always gets whole chunks of this size.
const CHUNK: usize = 1 << 20;

/// The compressor of layer blobs. Recorded in an annotation; changing any part of it
/// changes every digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip through flate2 with the zlib-rs backend, at the given level, header mtime 0,
    /// OS byte 255, fed 1 MiB chunks.
    Gzip { level: u32 },
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Gzip { level: 6 }
    }
}

impl Compression {
    pub fn media_type(&self) -> &'static str {
        match self {
            Compression::Gzip { .. } => "application/vnd.oci.image.layer.v1.tar+gzip",
        }
    }

    /// The annotation value naming compressor, backend and settings.
    pub fn describe(&self) -> String {
        match self {
            Compression::Gzip { level } => format!("gzip;level={level};backend=zlib-rs;chunk=1MiB"),
        }
    }
}

/// A layer written to the blob store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBlob {
    /// sha256 of the uncompressed tar, `sha256:<hex>`.
    pub diff_id: String,
    /// sha256 of the compressed blob, `sha256:<hex>`.
    pub digest: String,
    /// Size of the compressed blob in bytes.
    pub size: u64,
    /// Size of the uncompressed tar in bytes.
    pub tar_size: u64,
    pub media_type: &'static str,
}

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

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
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

/// Passes data on in chunks of exactly [`CHUNK`] bytes (the last one shorter).
struct Chunker<W: Write> {
    inner: W,
    buffer: Vec<u8>,
}

impl<W: Write> Chunker<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            buffer: Vec::with_capacity(CHUNK),
        }
    }

    fn finish(mut self) -> std::io::Result<W> {
        if !self.buffer.is_empty() {
            self.inner.write_all(&self.buffer)?;
        }
        Ok(self.inner)
    }
}

impl<W: Write> Write for Chunker<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let take = (CHUNK - self.buffer.len()).min(buf.len());
        self.buffer.extend_from_slice(&buf[..take]);
        if self.buffer.len() == CHUNK {
            self.inner.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(take)
    }

    /// Flushing would cut a chunk short and change the compressed bytes, so it only
    /// flushes what is below the chunker.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes one layer into `blobs_dir` (`…/blobs/sha256`) and returns its blob.
pub fn write_layer(
    root: &Path,
    layer: &PlannedLayer,
    compression: Compression,
    blobs_dir: &Path,
) -> Result<LayerBlob, WriteError> {
    let blob_err = |path: &Path, source: std::io::Error| WriteError::Blob {
        name: layer.name.clone(),
        path: path.to_path_buf(),
        source,
    };
    let temp = tempfile::Builder::new()
        .prefix(".layer-")
        .tempfile_in(blobs_dir)
        .map_err(|e| blob_err(blobs_dir, e))?;
    let file = temp.reopen().map_err(|e| blob_err(temp.path(), e))?;

    let Compression::Gzip { level } = compression;
    let compressed = HashingWriter::new(BufWriter::with_capacity(CHUNK, file));
    let gzip = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(compressed, flate2::Compression::new(level));
    let tar_out = HashingWriter::new(Chunker::new(gzip));

    let tar_out =
        write_tar(root, &layer.paths, layer.mtime, tar_out).map_err(|source| WriteError::Tar {
            name: layer.name.clone(),
            source,
        })?;
    let (chunker, diff_id, tar_size) = tar_out.finish();
    let gzip = chunker.finish().map_err(|e| blob_err(temp.path(), e))?;
    let compressed = gzip.finish().map_err(|e| blob_err(temp.path(), e))?;
    let (buffered, digest, size) = compressed.finish();
    let file = buffered
        .into_inner()
        .map_err(|e| blob_err(temp.path(), e.into_error()))?;
    file.sync_all().map_err(|e| blob_err(temp.path(), e))?;
    drop(file);

    let target = blobs_dir.join(digest.trim_start_matches("sha256:"));
    crate::fs::set_mode(temp.path(), 0o644).map_err(|e| blob_err(temp.path(), e))?;
    // Blobs are named by content: an existing blob of that name already holds these bytes.
    temp.persist(&target)
        .map_err(|e| blob_err(&target, e.error))?;
    Ok(LayerBlob {
        diff_id,
        digest,
        size,
        tar_size,
        media_type: compression.media_type(),
    })
}

/// Writes every layer of `plan` using up to `jobs` threads; blobs come back in plan order.
pub fn write_layers(
    root: &Path,
    plan: &LayerPlan,
    compression: Compression,
    blobs_dir: &Path,
    jobs: usize,
) -> Result<Vec<LayerBlob>, WriteError> {
    write_layers_reporting(
        root,
        plan,
        compression,
        blobs_dir,
        jobs,
        &crate::build::Silent,
    )
}

/// [`write_layers`], telling `reporter` of each layer written (its compressed size).
pub fn write_layers_reporting(
    root: &Path,
    plan: &LayerPlan,
    compression: Compression,
    blobs_dir: &Path,
    jobs: usize,
    reporter: &dyn crate::build::Reporter,
) -> Result<Vec<LayerBlob>, WriteError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<LayerBlob, WriteError>>>> =
        Mutex::new((0..plan.layers.len()).map(|_| None).collect());
    // Largest layers first, so one big layer does not start last and run alone.
    let mut queue: Vec<usize> = (0..plan.layers.len()).collect();
    queue.sort_by(|a, b| plan.layers[*b].size.cmp(&plan.layers[*a].size));

    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, plan.layers.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&index) = queue.get(i) else { break };
                    let result = write_layer(root, &plan.layers[index], compression, blobs_dir);
                    if let Ok(blob) = &result {
                        reporter.on_item_done(crate::build::Stage::Layers, &blob.digest, blob.size);
                    }
                    let failed = result.is_err();
                    results.lock().expect("no panics while holding the lock")[index] = Some(result);
                    if failed {
                        // Stop handing out work; other threads finish their current layer.
                        next.store(queue.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });

    let results = results.into_inner().expect("threads joined");
    let mut blobs = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Some(Ok(blob)) => blobs.push(blob),
            Some(Err(err)) => return Err(err),
            None => {}
        }
    }
    // A `None` only follows an error, which returned above.
    Ok(blobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunker_passes_fixed_chunks() {
        #[derive(Default)]
        struct Record(Vec<usize>);
        impl Write for Record {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.push(buf.len());
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut chunker = Chunker::new(Record::default());
        for size in [10, CHUNK, 3, CHUNK * 2] {
            chunker.write_all(&vec![0u8; size]).unwrap();
        }
        let record = chunker.finish().unwrap();
        assert_eq!(record.0, vec![CHUNK, CHUNK, CHUNK, 13]);
    }
}
