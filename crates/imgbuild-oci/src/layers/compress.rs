//! Layer compressors whose output bytes depend only on the input, never on the thread count
//! or on how the input arrives: the tar is cut into fixed-size blocks, each block is
//! compressed on its own on a pool shared by every layer of the build, and the results are
//! written in order. Blocks are independent, so any number of threads gives the same bytes,
//! and one 500 MB library keeps every core busy instead of one.
//!
//! gzip: 1 MiB blocks, each a complete gzip member from libdeflate at level 6; the blob is the
//! members in order (a multi-member gzip, which RFC 1952 allows and Go's `compress/gzip`,
//! containerd, podman, skopeo, gzip, pigz and Python read). libdeflate is 1.5× faster per
//! core than zlib-rs at level 6 and 0.8 % smaller (`notes/compression.md`).
//!
//! zstd: 4 MiB blocks, each a complete zstd frame at level 3 (single-threaded libzstd per
//! frame); the blob is the frames in order, which the zstd format defines as one stream.
//! Larger blocks than gzip's because zstd's window is larger and a frame starts it afresh.
//!
//! Memory: every block in flight holds bytes of the build's [`MemoryBudget`], acquired
//! before the block is filled and released once it is written, so the blocks in flight are
//! bounded by bytes whatever `-j` is; the compressor contexts are shared the same way.

use std::{
    collections::BTreeMap,
    io::Write,
    sync::{Arc, Mutex, mpsc},
};

use super::{
    budget::{DEFAULT_LAYER_MEMORY, MemoryBudget, Reservation},
    buffers,
};

pub use crate::compression::{Compression, GZIP_BLOCK, GZIP_LEVEL, ZSTD_BLOCK, ZSTD_LEVEL};

/// Where compression work runs: a pool of `threads` threads shared by every layer of a
/// build, so layers and blocks of large layers compress in parallel without
/// oversubscribing the machine.
#[derive(Clone)]
pub struct CompressPool {
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
    budget: MemoryBudget,
}

/// The most compression threads a build starts per CPU. More only wait for a CPU, each
/// holding blocks in memory (a layer keeps up to `2 × threads + 2` blocks in flight), and
/// starting 100 000 of them took minutes for a build of three layers.
pub(crate) const MAX_THREADS_PER_CPU: usize = 4;

/// The most compression threads on this machine: [`MAX_THREADS_PER_CPU`] per CPU.
pub(crate) fn max_threads() -> usize {
    cpus().saturating_mul(MAX_THREADS_PER_CPU)
}

/// The CPUs this process may use (its cgroup's quota included), at least 1.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The value of `--jobs` / `IMGBUILD_JOBS`: a whole number of threads, 1 or more.
pub fn parse_jobs(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err(
            "0 threads cannot compress anything: give 1 or more (default: the number of CPUs)"
                .to_string(),
        ),
        Ok(threads) => Ok(threads),
        Err(err) => Err(format!("not a number of threads: {err}")),
    }
}

/// The compression threads for `requested` (`--jobs`; None: one per CPU), at most
/// [`max_threads`]; with the warning to show when the request was cut down. The thread count
/// never changes the bytes, so clamping changes only the time a build takes.
pub fn threads_for(requested: Option<usize>) -> (usize, Option<String>) {
    let max = max_threads();
    match requested {
        None => (cpus(), None),
        Some(threads) if threads > max => (
            max,
            Some(format!(
                "--jobs {threads} is more than {MAX_THREADS_PER_CPU} compression threads per CPU; using {max} ({} CPUs)",
                cpus()
            )),
        ),
        Some(threads) => (threads.max(1), None),
    }
}

impl CompressPool {
    /// A pool of `threads` threads, at least 1 and at most [`max_threads`] (`threads_for`
    /// is where a request above it is reported).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let threads = threads.clamp(1, max_threads());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("imgbuild-compress-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Self {
            pool: Arc::new(pool),
            threads,
            budget: MemoryBudget::new(DEFAULT_LAYER_MEMORY),
        })
    }

    /// The pool with a budget of `bytes` for the blocks in flight of all its layers.
    pub fn with_memory(mut self, bytes: u64) -> Self {
        self.budget = MemoryBudget::new(bytes);
        self
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The budget shared by every layer written on this pool.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// Runs `job` on the pool.
    pub(super) fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        self.pool.spawn(job);
    }

    /// A writer compressing into `inner` with `compression`.
    pub fn writer<W: Write + Send>(
        &self,
        compression: Compression,
        inner: W,
    ) -> std::io::Result<Compressor<W>> {
        Ok(Compressor::new(inner, self.clone(), compression))
    }
}

/// A compressed block coming back from the pool: its sequence number, bytes, and the budget
/// it holds until written.
type Done = (u64, Vec<u8>, Reservation);

/// The parallel block writer; [`Compressor::finish`] ends the stream and returns the inner
/// writer. The writing thread cuts blocks and hands each to the pool; finished blocks come
/// back out of order and are written in order. At most `2 × threads + 2` blocks are in
/// flight, and no more than the pool's budget holds.
pub struct Compressor<W> {
    inner: W,
    pool: CompressPool,
    compression: Compression,
    block: Vec<u8>,
    /// The budget held for `block`, taken before its first byte.
    reserved: Option<Reservation>,
    next_seq: u64,
    next_out: u64,
    done_tx: mpsc::Sender<std::io::Result<Done>>,
    done_rx: mpsc::Receiver<std::io::Result<Done>>,
    waiting: BTreeMap<u64, (Vec<u8>, Reservation)>,
}

impl<W: Write> Compressor<W> {
    fn new(inner: W, pool: CompressPool, compression: Compression) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        Self {
            inner,
            pool,
            compression,
            block: Vec::new(),
            reserved: None,
            next_seq: 0,
            next_out: 0,
            done_tx,
            done_rx,
            waiting: BTreeMap::new(),
        }
    }

    fn max_in_flight(&self) -> u64 {
        2 * self.pool.threads as u64 + 2
    }

    /// The budget for one more block: a block's input and its compressed output.
    fn reserve(&mut self) -> std::io::Result<Reservation> {
        let bytes = 2 * block_size(self.compression) as u64;
        let in_flight = |me: &Self| me.next_seq > me.next_out;
        acquire_draining(
            &self.pool.budget.clone(),
            bytes,
            self,
            in_flight,
            Self::receive_one,
        )
    }

    /// Hands the current block to the pool.
    fn submit(&mut self) -> std::io::Result<()> {
        let reserved = match self.reserved.take() {
            Some(reserved) => reserved,
            None => self.reserve()?,
        };
        while self.next_seq - self.next_out >= self.max_in_flight() {
            self.receive_one()?;
        }
        let block = std::mem::take(&mut self.block);
        let seq = self.next_seq;
        self.next_seq += 1;
        let done = self.done_tx.clone();
        let compression = self.compression;
        self.pool.pool.spawn(move || {
            // Seekable layers are cut at entries by `super::seekable`; through this writer
            // they are plain block-member gzip or zstd.
            let compressed = match compression {
                Compression::Gzip | Compression::Estargz => gzip_member(&block),
                Compression::Zstd | Compression::ZstdChunked => zstd_frame(&block),
            };
            buffers::give(block);
            // The receiver only goes away when the writer is dropped after an error.
            let _ = done.send(compressed.map(|bytes| (seq, bytes, reserved)));
        });
        Ok(())
    }

    /// Waits for one finished block and writes out every member that is now in order.
    fn receive_one(&mut self) -> std::io::Result<()> {
        let (seq, member, reserved) = self
            .done_rx
            .recv()
            .map_err(|_| std::io::Error::other("a compression thread stopped"))??;
        self.waiting.insert(seq, (member, reserved));
        while let Some((member, reserved)) = self.waiting.remove(&self.next_out) {
            self.inner.write_all(&member)?;
            buffers::give(member);
            self.next_out += 1;
            drop(reserved);
        }
        Ok(())
    }

    pub fn finish(mut self) -> std::io::Result<W> {
        // An empty input still makes one (empty) member or frame: a zero-byte file is
        // neither gzip nor zstd.
        if !self.block.is_empty() || self.next_seq == 0 {
            self.submit()?;
        }
        while self.next_out < self.next_seq {
            self.receive_one()?;
        }
        Ok(self.inner)
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.reserved.is_none() {
            self.reserved = Some(self.reserve()?);
        }
        let size = block_size(self.compression);
        if self.block.capacity() == 0 {
            self.block = buffers::take(size);
        }
        let take = (size - self.block.len()).min(buf.len());
        self.block.extend_from_slice(&buf[..take]);
        if self.block.len() == size {
            self.submit()?;
        }
        Ok(take)
    }

    /// Does not end a block early: that would change the bytes.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn block_size(compression: Compression) -> usize {
    match compression {
        Compression::Gzip | Compression::Estargz => GZIP_BLOCK,
        Compression::Zstd | Compression::ZstdChunked => ZSTD_BLOCK,
    }
}

/// Takes `bytes` of `budget` for `writer`, which has blocks of its own in flight while
/// `in_flight` says so: those are received (written and released) while the budget is
/// short, and only a writer with none in flight waits. Every byte held is then held by a
/// block that the pool finishes without waiting for the budget, so the build never
/// deadlocks, and a block larger than the whole budget waits until it runs alone.
pub(super) fn acquire_draining<T>(
    budget: &MemoryBudget,
    bytes: u64,
    writer: &mut T,
    in_flight: impl Fn(&T) -> bool,
    receive_one: impl Fn(&mut T) -> std::io::Result<()>,
) -> std::io::Result<Reservation> {
    loop {
        if let Some(reserved) = budget.try_acquire(bytes) {
            return Ok(reserved);
        }
        if !in_flight(writer) {
            return Ok(budget.acquire(bytes));
        }
        receive_one(writer)?;
    }
}

/// Compressor contexts shared by every pool thread, taken for one block and put back: a zstd
/// context allocates its tables and libdeflate its match finder on creation, which per block
/// costs time for nothing, and one per thread costs memory at a high `-j`. There are never
/// more than the blocks compressing at once, which the budget bounds. A context is reset for
/// every frame or member, so the bytes are those of a fresh one.
static ZSTD: Mutex<Vec<zstd::bulk::Compressor<'static>>> = Mutex::new(Vec::new());
static DEFLATE: Mutex<Vec<libdeflater::Compressor>> = Mutex::new(Vec::new());

/// Runs `work` with a context from `shelf` (or a new one from `make`), then puts it back.
fn with_context<C, T>(
    shelf: &Mutex<Vec<C>>,
    make: impl FnOnce() -> std::io::Result<C>,
    work: impl FnOnce(&mut C) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let taken = shelf.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut context = match taken {
        Some(context) => context,
        None => make()?,
    };
    let result = work(&mut context);
    shelf
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(context);
    result
}

/// One block as a complete zstd frame (with its content size, so readers can size buffers).
pub(super) fn zstd_frame(block: &[u8]) -> std::io::Result<Vec<u8>> {
    with_context(
        &ZSTD,
        || zstd::bulk::Compressor::new(ZSTD_LEVEL),
        |compressor| {
            let mut out = buffers::take(zstd::zstd_safe::compress_bound(block.len()));
            compressor.compress_to_buffer(block, &mut out)?;
            Ok(out)
        },
    )
}

/// One block as a complete gzip member.
pub(super) fn gzip_member(block: &[u8]) -> std::io::Result<Vec<u8>> {
    let make = || {
        let level = libdeflater::CompressionLvl::new(GZIP_LEVEL)
            .map_err(|e| std::io::Error::other(format!("gzip level {GZIP_LEVEL}: {e:?}")))?;
        Ok(libdeflater::Compressor::new(level))
    };
    with_context(&DEFLATE, make, |compressor| {
        let bound = compressor.gzip_compress_bound(block.len());
        let mut out = buffers::take(bound);
        out.resize(bound, 0);
        let written = compressor
            .gzip_compress(block, &mut out)
            .map_err(|e| std::io::Error::other(format!("gzip compression failed: {e}")))?;
        out.truncate(written);
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Input that compresses somewhat, but not to nothing: a deterministic pseudo-random
    /// stream of small words.
    fn sample(len: usize) -> Vec<u8> {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let word = format!("w{} ", state % 5000);
            out.extend_from_slice(word.as_bytes());
        }
        out.truncate(len);
        out
    }

    fn compress(compression: Compression, threads: usize, input: &[u8], write: usize) -> Vec<u8> {
        let pool = CompressPool::new(threads).unwrap();
        let mut writer = pool.writer(compression, Vec::new()).unwrap();
        for piece in input.chunks(write) {
            writer.write_all(piece).unwrap();
        }
        writer.finish().unwrap()
    }

    fn decompress(compression: Compression, blob: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match compression {
            Compression::Gzip | Compression::Estargz => {
                flate2::read::MultiGzDecoder::new(blob)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Compression::Zstd | Compression::ZstdChunked => {
                zstd::stream::Decoder::new(blob)
                    .unwrap()
                    .read_to_end(&mut out)
                    .unwrap();
            }
        }
        out
    }

    /// The determinism requirement: 1, 2 and 8 threads, and any cut of the input
    /// into writes, give the same bytes, and the bytes read back to the input.
    #[test]
    fn same_bytes_for_any_thread_count_and_write_size() {
        // A little over 9 blocks, so several are in flight and the last one is short.
        let input = sample(9 * GZIP_BLOCK + 12_345);
        for compression in [Compression::Gzip, Compression::Zstd] {
            let reference = compress(compression, 1, &input, GZIP_BLOCK);
            assert!(
                reference.len() < input.len() / 2,
                "{compression:?} did not compress"
            );
            for (threads, write) in [(2, 4096), (8, 100_000), (8, 3 * GZIP_BLOCK + 1)] {
                let blob = compress(compression, threads, &input, write);
                assert!(
                    blob == reference,
                    "{compression:?} with {threads} threads and {write}-byte writes differs"
                );
            }
            assert!(decompress(compression, &reference) == input);
        }
    }

    /// The shared contexts are reused from block to block: each block must still come
    /// out as a fresh context would make it.
    #[test]
    fn a_reused_context_gives_the_bytes_of_a_fresh_one() {
        let blocks = [
            sample(ZSTD_BLOCK),
            sample(1000),
            sample(GZIP_BLOCK + 7),
            Vec::new(),
        ];
        for block in &blocks {
            assert!(zstd_frame(block).unwrap() == zstd::bulk::compress(block, ZSTD_LEVEL).unwrap());
            let level = libdeflater::CompressionLvl::new(GZIP_LEVEL).unwrap();
            let mut fresh = libdeflater::Compressor::new(level);
            let mut out = vec![0; fresh.gzip_compress_bound(block.len())];
            let n = fresh.gzip_compress(block, &mut out).unwrap();
            assert!(gzip_member(block).unwrap() == out[..n]);
        }
    }

    #[test]
    fn gzip_members_are_one_per_block() {
        let input = sample(2 * GZIP_BLOCK + 1);
        let blob = compress(Compression::Gzip, 2, &input, 7777);
        // Each member starts with the gzip magic, method 8, and libdeflate's fixed header.
        let members = blob.windows(4).filter(|w| *w == [0x1f, 0x8b, 8, 0]).count();
        assert!(members >= 3, "expected 3 members, saw {members} headers");
        // A single-member reader sees only the first block: the reason our readers use
        // `MultiGzDecoder`.
        let mut first = Vec::new();
        flate2::read::GzDecoder::new(&blob[..])
            .read_to_end(&mut first)
            .unwrap();
        assert_eq!(first.len(), GZIP_BLOCK);
    }

    #[test]
    fn zstd_frames_are_one_per_block() {
        let input = sample(2 * ZSTD_BLOCK + 1);
        let blob = compress(Compression::Zstd, 2, &input, 7777);
        let frames = blob
            .windows(4)
            .filter(|w| *w == [0x28, 0xb5, 0x2f, 0xfd])
            .count();
        assert!(frames >= 3, "expected 3 frames, saw {frames} magics");
        assert!(decompress(Compression::Zstd, &blob) == input);
    }

    #[test]
    fn empty_input_is_valid() {
        for compression in [Compression::Gzip, Compression::Zstd] {
            let blob = compress(compression, 2, &[], 1);
            assert!(!blob.is_empty());
            assert!(decompress(compression, &blob).is_empty());
        }
    }
}
