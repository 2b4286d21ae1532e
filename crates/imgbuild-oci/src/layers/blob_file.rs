//! A layer blob on its way to disk.
//!
//! On Linux the blob is written with `O_DIRECT`, from a page-aligned buffer, past the page
//! cache: a build writes gigabytes of blobs that nothing reads soon, and putting them into the
//! page cache first costs CPU (on our build machines 2–3 s of system time per GB when the
//! cache must evict to make room, against 0.3 s direct) and evicts the package cache the next
//! build wants. The last, partial block is padded to the alignment and the file truncated to
//! its real length. Where `O_DIRECT` is refused (tmpfs, some overlay or network file systems,
//! other systems) the blob is written through the page cache, with writeback started every
//! 8 MiB so the closing `fsync` waits for the tail only. Either way the bytes are the same,
//! and the file is synced before it is renamed into place.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

/// Direct writes go out in pieces of this size (a multiple of any block size): small, as
/// every layer written at once holds [`DIRECT_BUFFERS`] of them outside the memory budget.
const DIRECT_CHUNK: usize = 1 << 20;
/// `O_DIRECT` buffers, offsets and lengths are aligned to this (4 KiB covers 512-byte and
/// 4 KiB logical blocks).
const ALIGN: usize = 4096;
/// Buffer between the compressor and a page-cache blob file.
const WRITE_BUFFER: usize = 1 << 20;

/// The file a blob is written to; [`BlobFile::finish`] flushes and syncs it.
pub(super) struct BlobFile(BlobSink);

enum BlobSink {
    Direct(Direct),
    Buffered(BufWriter<Writeback>),
}

impl BlobFile {
    /// Opens the (empty) file at `path` for writing, directly where the system allows.
    pub(super) fn create(path: &Path) -> io::Result<BlobFile> {
        Self::create_with(path, true)
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "a std::fs::File for the buffered writer; the caller names the blob"
    )]
    fn create_with(path: &Path, try_direct: bool) -> io::Result<BlobFile> {
        if try_direct && let Some(file) = open_direct(path) {
            return Ok(BlobFile(BlobSink::Direct(Direct::new(file))));
        }
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        Ok(BlobFile(BlobSink::Buffered(buffered(file))))
    }

    /// Whether the blob goes past the page cache.
    pub(super) fn is_direct(&self) -> bool {
        matches!(self.0, BlobSink::Direct(_))
    }

    /// Writes what is buffered and syncs the file.
    pub(super) fn finish(self) -> io::Result<()> {
        let file = match self.0 {
            BlobSink::Direct(direct) => direct.finish()?,
            BlobSink::Buffered(buffered) => buffered.into_inner().map_err(|e| e.into_error())?.file,
        };
        file.sync_all()
    }
}

impl Write for BlobFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.0 {
            BlobSink::Direct(direct) => direct.write(buf),
            BlobSink::Buffered(writer) => writer.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        // Only `finish` ends the file: a direct write of a partial block would misalign it.
        Ok(())
    }
}

#[cfg(target_os = "linux")]
#[allow(
    clippy::disallowed_methods,
    reason = "O_DIRECT needs std OpenOptions, and a refusal only means buffered writes"
)]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

#[cfg(target_os = "linux")]
fn clear_direct(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own, reading and then setting its status flags.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0
        || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_DIRECT) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn clear_direct(_file: &File) -> io::Result<()> {
    Ok(())
}

fn buffered(file: File) -> BufWriter<Writeback> {
    BufWriter::with_capacity(WRITE_BUFFER, Writeback::new(file))
}

/// Aligned buffers in flight per blob: one being filled while the writer thread writes the
/// others, so a slow disk holds the compressor back only after this many chunks.
const DIRECT_BUFFERS: usize = 4;

/// A page-aligned buffer of [`DIRECT_CHUNK`] bytes.
struct Aligned {
    memory: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new() -> Self {
        let memory = vec![0u8; DIRECT_CHUNK + ALIGN];
        let start = memory.as_ptr().align_offset(ALIGN);
        Self {
            memory,
            start,
            len: 0,
        }
    }

    /// Pads the content with zeros to the alignment; returns the padded length.
    fn pad(&mut self) -> usize {
        let padded = self.len.div_ceil(ALIGN) * ALIGN;
        self.memory[self.start + self.len..self.start + padded].fill(0);
        padded
    }
}

/// Direct writes, done by a writer thread of the blob's own: a direct write returns only
/// when the disk has the data, and the thread that tars and hashes the layer must not wait
/// for that (writing synchronously made gzip builds 20 % slower). Full buffers go to the
/// thread, which hands them back once written.
struct Direct {
    to_writer: Option<std::sync::mpsc::SyncSender<(Aligned, usize)>>,
    free: std::sync::mpsc::Receiver<Aligned>,
    writer: Option<std::thread::JoinHandle<io::Result<File>>>,
    current: Aligned,
    /// Bytes of the blob handed to the writer so far (whole chunks).
    handed: u64,
}

impl Direct {
    fn new(file: File) -> Self {
        let (to_writer, chunks) = std::sync::mpsc::sync_channel::<(Aligned, usize)>(DIRECT_BUFFERS);
        let (give_back, free) = std::sync::mpsc::channel::<Aligned>();
        for _ in 1..DIRECT_BUFFERS {
            let _ = give_back.send(Aligned::new());
        }
        let writer = std::thread::Builder::new()
            .name("imgbuild-blob-writer".into())
            .spawn(move || {
                let mut file = file;
                let mut written = 0u64;
                for (buffer, len) in chunks {
                    let data = &buffer.memory[buffer.start..buffer.start + len];
                    match file.write_all(data) {
                        // The file system took the flag at open but refuses direct writes:
                        // nothing is written yet, so go on through the page cache.
                        Err(err) if written == 0 && err.raw_os_error() == Some(libc::EINVAL) => {
                            clear_direct(&file)?;
                            file.write_all(data)?;
                        }
                        other => other?,
                    }
                    written += len as u64;
                    // The filler may be gone (finished or failed): nothing to give back to.
                    let _ = give_back.send(buffer);
                }
                Ok(file)
            });
        let (to_writer, writer) = match writer {
            Ok(handle) => (Some(to_writer), Some(handle)),
            Err(_) => (None, None),
        };
        Self {
            to_writer,
            free,
            writer,
            current: Aligned::new(),
            handed: 0,
        }
    }

    /// The writer thread's result: its error when it stopped on one.
    fn join(&mut self) -> io::Result<File> {
        self.to_writer = None;
        match self.writer.take() {
            Some(handle) => handle
                .join()
                .map_err(|_| io::Error::other("the blob writer thread panicked"))?,
            None => Err(io::Error::other(
                "the blob writer thread could not be started",
            )),
        }
    }

    /// Hands the current buffer (`len` bytes of it) to the writer and takes a free one.
    fn hand_over(&mut self, len: usize) -> io::Result<()> {
        let next = match self.free.recv() {
            Ok(buffer) => buffer,
            // Every buffer is gone: the writer stopped on an error.
            Err(_) => return Err(self.join().err().unwrap_or_else(stopped)),
        };
        let full = std::mem::replace(&mut self.current, next);
        self.current.len = 0;
        self.send(full, len)?;
        self.handed += len as u64;
        Ok(())
    }

    /// Gives `len` bytes of `buffer` to the writer thread; its error if it has stopped.
    fn send(&mut self, buffer: Aligned, len: usize) -> io::Result<()> {
        let sent = self
            .to_writer
            .as_ref()
            .is_some_and(|tx| tx.send((buffer, len)).is_ok());
        if sent {
            Ok(())
        } else {
            Err(self.join().err().unwrap_or_else(stopped))
        }
    }

    /// Pads the last block to the alignment, writes it, waits for the writer, and cuts the
    /// file to the blob's real length.
    fn finish(mut self) -> io::Result<File> {
        let real = self.handed + self.current.len as u64;
        if self.current.len > 0 {
            let padded = self.current.pad();
            let last = std::mem::replace(
                &mut self.current,
                Aligned {
                    memory: Vec::new(),
                    start: 0,
                    len: 0,
                },
            );
            self.send(last, padded)?;
        }
        let file = self.join()?;
        file.set_len(real)?;
        Ok(file)
    }
}

fn stopped() -> io::Error {
    io::Error::other("the blob writer thread stopped")
}

impl Write for Direct {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let current = &mut self.current;
        let take = (DIRECT_CHUNK - current.len).min(buf.len());
        current.memory[current.start + current.len..current.start + current.len + take]
            .copy_from_slice(&buf[..take]);
        current.len += take;
        if current.len == DIRECT_CHUNK {
            self.hand_over(DIRECT_CHUNK)?;
        }
        Ok(take)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Blob bytes written between two starts of writeback.
const WRITEBACK_STEP: u64 = 8 << 20;

/// A blob file that asks the kernel to start writing its pages to disk every
/// [`WRITEBACK_STEP`] bytes (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not
/// wait). The `fsync` that ends every blob then waits for the last few megabytes instead of
/// the whole blob, and the disk works while the CPUs compress: as git's batched fsync does.
struct Writeback {
    file: File,
    written: u64,
    started: u64,
}

impl Writeback {
    fn new(file: File) -> Self {
        Self {
            file,
            written: 0,
            started: 0,
        }
    }

    #[cfg(target_os = "linux")]
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (
            libc::off64_t::try_from(self.started),
            libc::off64_t::try_from(self.written - self.started),
        ) else {
            return;
        };
        // SAFETY: a valid open descriptor and a range of it; the call only schedules I/O.
        // A failure costs nothing but the head start: the final fsync still syncs it all.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset,
                len,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.started = self.written;
    }

    #[cfg(not(target_os = "linux"))]
    fn start_writeback(&mut self) {}
}

impl Write for Writeback {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITEBACK_STEP {
            self.start_writeback();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes around the chunk and the alignment, written direct (where this machine's
    /// temp dir allows it) and through the page cache: the file holds exactly the bytes.
    #[test]
    fn the_file_holds_exactly_the_bytes_written() {
        let dir = tempfile::tempdir().unwrap();
        for try_direct in [true, false] {
            for size in [
                0,
                1,
                ALIGN - 1,
                ALIGN,
                ALIGN + 1,
                DIRECT_CHUNK,
                DIRECT_CHUNK + 12_345,
            ] {
                let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
                let path = dir.path().join(format!("blob-{size}-{try_direct}"));
                fs_err::File::create(&path).unwrap();
                let mut file = BlobFile::create_with(&path, try_direct).unwrap();
                assert!(try_direct || !file.is_direct());
                // Odd write sizes, as the compressor's members have.
                for piece in bytes.chunks(100_003) {
                    file.write_all(piece).unwrap();
                }
                file.finish().unwrap();
                assert!(
                    fs_err::read(&path).unwrap() == bytes,
                    "{size} bytes, direct tried: {try_direct}"
                );
            }
        }
    }
}
