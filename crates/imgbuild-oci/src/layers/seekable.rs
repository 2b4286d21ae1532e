//! Seekable layers: blobs every runtime reads as a plain compressed tar, laid out so a node
//! can fetch single files. Each regular file's bytes start a new gzip member or zstd frame,
//! and so does every 4 MiB chunk of a larger file; a table of contents (TOC) at the end gives
//! each file's compressed offset and sha256.
//!
//! - **eStargz** (`[layers] compression = "estargz"`, containerd/stargz-snapshotter's
//!   `docs/estargz.md`): gzip. Tar headers, padding and small entries ride in the member
//!   before a file's bytes; after the last entry one member holds the tar entry
//!   `stargz.index.json` (the TOC) and the tar's end; then the 51-byte footer, an empty gzip
//!   member whose extra field gives the TOC's offset. The stargz snapshotter mounts it lazily,
//!   containers/storage pulls it partially.
//! - **zstd:chunked** (`"zstd:chunked"`, containers/storage's `pkg/chunked` as of 1.43, the
//!   release in Debian 12): zstd. A file's frames hold its bytes only (its padding and the
//!   next headers start the next frame); the tar is the layer's tar unchanged, end included;
//!   then the TOC, zstd-compressed JSON in a skippable frame, and a 40-byte footer in another
//!   skippable frame. containers/storage pulls it partially; zstd readers skip both frames.
//!
//! The writer takes the layer's tar as a byte stream, finds the entry boundaries by reading
//! the headers as they pass, and compresses the members on the build's shared pool, several
//! small ones per job. Members are independent and written in order, so the bytes are the
//! same for any thread count, as for plain gzip and zstd.

use std::{collections::BTreeMap, io::Write, sync::mpsc};

use sha2::{Digest, Sha256};

use super::{
    budget::Reservation,
    buffers,
    compress::{CompressPool, acquire_draining, gzip_member, zstd_frame},
};

/// The eStargz TOC's name in the tar.
pub(crate) const TOC_TAR_NAME: &str = "stargz.index.json";
/// The entry after which the stargz snapshotter stops prefetching.
pub(crate) const PREFETCH_LANDMARK: &str = ".prefetch.landmark";
/// The entry that tells the snapshotter to prefetch nothing.
pub(crate) const NO_PREFETCH_LANDMARK: &str = ".no.prefetch.landmark";
/// Layer annotation: the sha256 of the TOC JSON.
pub(crate) const TOC_DIGEST_ANNOTATION: &str = "containerd.io/snapshot/stargz/toc.digest";
/// Layer annotation: the uncompressed size, which containers/storage needs for lazy pulls.
pub(crate) const UNCOMPRESSED_SIZE_ANNOTATION: &str = "io.containers.estargz.uncompressed-size";
/// zstd:chunked layer annotation (containers/storage 1.43's key): sha256 of the compressed
/// TOC.
pub(crate) const MANIFEST_CHECKSUM_ANNOTATION: &str =
    "io.containers.zstd-chunked.manifest-checksum";
/// zstd:chunked layer annotation: `OFFSET:LENGTH:UNCOMPRESSED_LENGTH:TYPE` of the TOC.
pub(crate) const MANIFEST_POSITION_ANNOTATION: &str =
    "io.containers.zstd-chunked.manifest-position";
/// A zstd skippable frame's magic, which zstd readers skip.
const SKIPPABLE_FRAME: [u8; 4] = [0x50, 0x2a, 0x4d, 0x18];
/// The last 8 bytes of a zstd:chunked footer.
const ZSTD_CHUNKED_MAGIC: &[u8; 8] = b"GnUlInUx";
/// The TOC type containers/storage reads: a CRFS-like manifest.
const MANIFEST_TYPE_CRFS: u64 = 1;

/// The layout a [`SeekableWriter`] makes.
pub use crate::compression::SeekableFormat as Format;

/// One member (gzip) or frame (zstd) of `format`.
fn compress(format: Format, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    match format {
        Format::Estargz => gzip_member(bytes),
        Format::ZstdChunked => zstd_frame(bytes),
    }
}
/// The largest piece of a file in one member: the snapshotter fetches at least this much.
pub(crate) const CHUNK: u64 = 4 << 20;
/// Room kept after a chunk in its member for the tar padding and headers that follow it.
const MEMBER_SLACK: usize = 64 << 10;
/// Members' input buffers of at least this many bytes come from and go back to the shelf.
const SHELVED: usize = 1 << 20;
/// Small members are compressed together in jobs of about this many input bytes.
const JOB_BYTES: usize = 1 << 20;
/// The budget a job holds: its input is under [`JOB_BYTES`] plus one member of at most a
/// [`CHUNK`] and a few headers, and its output about as much again.
const JOB_BUDGET: u64 = 2 * (JOB_BYTES as u64 + CHUNK + (64 << 10));

/// What a finished seekable blob is, besides its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seekable {
    /// sha256 of the uncompressed stream (for eStargz, TOC entry included): the diff_id.
    pub diff_id: String,
    pub uncompressed_size: u64,
    /// The layer descriptor's annotations: where the TOC is and what it hashes to.
    pub annotations: BTreeMap<String, String>,
}

/// One entry of the TOC (the snapshotter's `TOCEntry`, with its JSON names).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct TocEntry {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "is_zero")]
    size: u64,
    #[serde(rename = "modtime", skip_serializing_if = "String::is_empty")]
    mod_time: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    link_name: String,
    #[serde(skip_serializing_if = "is_zero")]
    mode: u64,
    #[serde(skip_serializing_if = "is_zero")]
    uid: u64,
    #[serde(skip_serializing_if = "is_zero")]
    gid: u64,
    #[serde(rename = "userName", skip_serializing_if = "String::is_empty")]
    user_name: String,
    #[serde(rename = "groupName", skip_serializing_if = "String::is_empty")]
    group_name: String,
    #[serde(skip_serializing_if = "is_zero")]
    offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    dev_major: u64,
    #[serde(skip_serializing_if = "is_zero")]
    dev_minor: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    digest: String,
    #[serde(skip_serializing_if = "is_zero")]
    chunk_offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    chunk_size: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    chunk_digest: String,
    /// The member this entry's bytes start (its `offset` once members are written).
    #[serde(skip)]
    member: Option<usize>,
    /// zstd:chunked: the member after the file's last frame (its `endOffset`).
    #[serde(skip)]
    end_member: Option<usize>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(serde::Serialize)]
struct Toc<'a> {
    version: u32,
    entries: &'a [TocEntry],
}

/// Where the tar stream is.
enum State {
    /// Reading a 512-byte header into `header`.
    Header,
    /// Inside a GNU long-name or long-link entry's data (headers of the next entry).
    Extension { remaining: u64, long_link: bool },
    /// Inside a regular file's bytes: `remaining` of them, then `padding`.
    File { remaining: u64, padding: u64 },
    /// Padding after an extension or a file.
    Padding { remaining: u64 },
    /// The end-of-archive blocks: held back to follow the TOC.
    End,
}

/// A member's uncompressed bytes; `chunk` is how many of the first are a file chunk whose
/// digest the TOC needs.
struct Segment {
    bytes: Vec<u8>,
    chunk: usize,
}

/// A compressed member and the sha256 of its chunk, if it holds one.
type CompressedMember = (Vec<u8>, Option<String>);
type JobResult = std::io::Result<(usize, Vec<CompressedMember>, Reservation)>;

/// The seekable writer: tar bytes in, the blob out to `inner`.
pub(crate) struct SeekableWriter<W> {
    inner: W,
    pool: CompressPool,
    format: Format,
    state: State,
    header: Vec<u8>,
    long_name: Vec<u8>,
    long_link: Vec<u8>,
    current: Segment,
    batch: Vec<Segment>,
    batch_bytes: usize,
    /// The budget held for the job being gathered, taken before its first byte.
    reserved: Option<Reservation>,
    /// Members submitted so far (the next member's index).
    members: usize,
    jobs_sent: usize,
    jobs_written: usize,
    /// The first member of each job, by job.
    job_first: Vec<usize>,
    waiting: BTreeMap<usize, (Vec<CompressedMember>, Reservation)>,
    done_tx: mpsc::Sender<JobResult>,
    done_rx: mpsc::Receiver<JobResult>,
    /// Compressed offset of each member written.
    offsets: Vec<u64>,
    chunk_digests: Vec<Option<String>>,
    written: u64,
    entries: Vec<TocEntry>,
    /// The TOC entry of the file being read, and the whole-file hash of a multi-chunk one.
    file: Option<(usize, Option<Sha256>)>,
    file_read: u64,
    /// Tar entries read so far (extension headers not counted).
    tar_entries: usize,
    /// eStargz prefetch: the landmark to add once this many entries have been read.
    landmark: Option<(usize, &'static str)>,
    last_user: BTreeMap<u64, String>,
    last_group: BTreeMap<u64, String>,
    diff: Sha256,
    uncompressed: u64,
}

impl<W: Write> SeekableWriter<W> {
    pub(crate) fn new(inner: W, pool: CompressPool, format: Format) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        Self {
            inner,
            pool,
            format,
            state: State::Header,
            header: Vec::with_capacity(512),
            long_name: Vec::new(),
            long_link: Vec::new(),
            current: Segment {
                bytes: Vec::new(),
                chunk: 0,
            },
            batch: Vec::new(),
            batch_bytes: 0,
            reserved: None,
            members: 0,
            jobs_sent: 0,
            jobs_written: 0,
            job_first: Vec::new(),
            waiting: BTreeMap::new(),
            done_tx,
            done_rx,
            offsets: Vec::new(),
            chunk_digests: Vec::new(),
            written: 0,
            entries: Vec::new(),
            file: None,
            file_read: 0,
            tar_entries: 0,
            landmark: None,
            last_user: BTreeMap::new(),
            last_group: BTreeMap::new(),
            diff: Sha256::new(),
            uncompressed: 0,
        }
    }

    /// Adds uncompressed bytes to the open member.
    fn emit(&mut self, bytes: &[u8]) {
        self.diff.update(bytes);
        self.uncompressed += bytes.len() as u64;
        self.current.bytes.extend_from_slice(bytes);
    }

    /// Closes the open member (when it holds anything) and opens a new one; returns the new
    /// member's index.
    fn cut(&mut self) -> std::io::Result<usize> {
        if !self.current.bytes.is_empty() {
            let segment = std::mem::replace(
                &mut self.current,
                Segment {
                    bytes: Vec::new(),
                    chunk: 0,
                },
            );
            self.batch_bytes += segment.bytes.len();
            self.batch.push(segment);
            if self.batch_bytes >= JOB_BYTES {
                self.submit()?;
            }
        }
        Ok(self.members + self.batch.len())
    }

    /// Hands the closed members to the pool as one job.
    fn submit(&mut self) -> std::io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let reserved = match self.reserved.take() {
            Some(reserved) => reserved,
            None => self.reserve()?,
        };
        // Bounded work in flight: jobs hold about a MiB each, chunks up to 4.
        while self.jobs_sent - self.jobs_written >= 2 * self.pool.threads() + 2 {
            self.receive_one()?;
        }
        let segments = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let job = self.jobs_sent;
        self.jobs_sent += 1;
        self.job_first.push(self.members);
        self.members += segments.len();
        let done = self.done_tx.clone();
        let format = self.format;
        self.pool.spawn(move || {
            let compressed: std::io::Result<Vec<CompressedMember>> = segments
                .iter()
                .map(|segment| {
                    let digest = (segment.chunk > 0).then(|| {
                        format!(
                            "sha256:{}",
                            hex::encode(Sha256::digest(&segment.bytes[..segment.chunk]))
                        )
                    });
                    compress(format, &segment.bytes).map(|member| (member, digest))
                })
                .collect();
            // Large inputs go back to the shelf; small ones would only crowd it.
            segments
                .into_iter()
                .filter(|segment| segment.bytes.capacity() >= SHELVED)
                .for_each(|segment| buffers::give(segment.bytes));
            // The receiver only goes away when the writer is dropped after an error.
            let _ = done.send(compressed.map(|members| (job, members, reserved)));
        });
        Ok(())
    }

    /// The budget for one more job (see `compress::acquire_draining`).
    fn reserve(&mut self) -> std::io::Result<Reservation> {
        let budget = self.pool.budget().clone();
        let in_flight = |me: &Self| me.jobs_sent > me.jobs_written;
        acquire_draining(&budget, JOB_BUDGET, self, in_flight, Self::receive_one)
    }

    /// Waits for one job and writes out every job that is now in order.
    fn receive_one(&mut self) -> std::io::Result<()> {
        let (job, members, reserved) = self
            .done_rx
            .recv()
            .map_err(|_| std::io::Error::other("a compression thread stopped"))??;
        self.waiting.insert(job, (members, reserved));
        while let Some((members, _reserved)) = self.waiting.remove(&self.jobs_written) {
            debug_assert_eq!(self.offsets.len(), self.job_first[self.jobs_written]);
            for (member, digest) in members {
                self.offsets.push(self.written);
                self.chunk_digests.push(digest);
                self.inner.write_all(&member)?;
                self.written += member.len() as u64;
                buffers::give(member);
            }
            self.jobs_written += 1;
        }
        Ok(())
    }

    /// Sets the eStargz prefetch landmark: `.prefetch.landmark` after the first `prefetched`
    /// entries (the files the stargz snapshotter fetches before the container starts), or
    /// `.no.prefetch.landmark` first when there are none.
    pub(crate) fn with_landmark(mut self, prefetched: usize) -> Self {
        if self.format == Format::Estargz {
            let name = if prefetched == 0 {
                NO_PREFETCH_LANDMARK
            } else {
                PREFETCH_LANDMARK
            };
            self.landmark = Some((prefetched, name));
        }
        self
    }

    /// Whether the landmark goes in before the header `block` (the next entry, or the end).
    fn landmark_due(&self, block: &[u8; 512]) -> bool {
        let Some((after, _)) = self.landmark else {
            return false;
        };
        self.tar_entries == after || (block.iter().all(|b| *b == 0) && self.tar_entries < after)
    }

    /// Reads the header in `self.header` and moves to what follows it.
    fn on_header(&mut self) -> std::io::Result<()> {
        let block: [u8; 512] = self.header.as_slice().try_into().expect("512 bytes");
        if self.landmark_due(&block) {
            // The landmark goes in before this header, which is then read again.
            let (_, name) = self.landmark.take().expect("due");
            self.header.clear();
            self.write_all(&landmark_entry(name)?)?;
            self.header.extend_from_slice(&block);
            return self.on_header();
        }
        if block.iter().all(|b| *b == 0) {
            self.header.clear();
            if self.format == Format::ZstdChunked {
                self.emit(&block);
            }
            self.state = State::End;
            return Ok(());
        }
        let header = tar::Header::from_byte_slice(&block);
        let size = header.entry_size()?;
        let padding = (512 - size % 512) % 512;
        let kind = header.entry_type();
        if kind.is_gnu_longname() || kind.is_gnu_longlink() {
            self.emit_header();
            self.state = State::Extension {
                remaining: size,
                long_link: kind.is_gnu_longlink(),
            };
            if kind.is_gnu_longname() {
                self.long_name.clear();
            } else {
                self.long_link.clear();
            }
            return Ok(());
        }
        let entry = self.toc_entry(header, size)?;
        self.tar_entries += 1;
        self.emit_header();
        let index = self.entries.len();
        let is_file = entry.kind == "reg";
        self.entries.push(entry);
        if is_file && size == 0 {
            self.entries[index].digest = format!("sha256:{}", hex::encode(Sha256::digest([])));
        }
        if is_file && size > 0 {
            let whole = (size > CHUNK).then(Sha256::new);
            self.file = Some((index, whole));
            self.file_read = 0;
            self.state = State::File {
                remaining: size,
                padding,
            };
        } else {
            self.state = padded(padding);
        }
        Ok(())
    }

    fn emit_header(&mut self) {
        let header = std::mem::take(&mut self.header);
        self.emit(&header);
        self.header = header;
        self.header.clear();
    }

    /// The TOC entry of a (non-extension) header, with the long name or link read before it.
    fn toc_entry(&mut self, header: &tar::Header, size: u64) -> std::io::Result<TocEntry> {
        let text = |bytes: &[u8]| {
            let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        };
        let name = match std::mem::take(&mut self.long_name) {
            long if !long.is_empty() => text(&long),
            _ => text(&header.path_bytes()),
        };
        let link_name = match std::mem::take(&mut self.long_link) {
            long if !long.is_empty() => text(&long),
            _ => header
                .link_name_bytes()
                .map(|b| text(&b))
                .unwrap_or_default(),
        };
        let kind = match header.entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => "reg",
            tar::EntryType::Directory => "dir",
            tar::EntryType::Symlink => "symlink",
            tar::EntryType::Link => "hardlink",
            tar::EntryType::Char => "char",
            tar::EntryType::Block => "block",
            tar::EntryType::Fifo => "fifo",
            other => {
                return Err(std::io::Error::other(format!(
                    "eStargz cannot hold the tar entry `{name}` of type {other:?}"
                )));
            }
        };
        let uid = header.uid()?;
        let gid = header.gid()?;
        let user = header.username().ok().flatten().unwrap_or("").to_string();
        let group = header.groupname().ok().flatten().unwrap_or("").to_string();
        let mtime = header.mtime()?;
        let device = |n: std::io::Result<Option<u32>>| n.ok().flatten().unwrap_or(0) as u64;
        Ok(TocEntry {
            size: if kind == "reg" { size } else { 0 },
            mod_time: modtime(mtime),
            link_name: if matches!(kind, "symlink" | "hardlink") {
                link_name
            } else {
                String::new()
            },
            mode: header.mode()? as u64,
            uid,
            gid,
            user_name: name_if_changed(&mut self.last_user, uid, user),
            group_name: name_if_changed(&mut self.last_group, gid, group),
            dev_major: device(header.device_major()),
            dev_minor: device(header.device_minor()),
            name,
            kind,
            ..TocEntry::default()
        })
    }

    /// Passes `bytes` of the current file on, starting a member at each chunk.
    fn file_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let index = self.file.as_ref().expect("inside a file").0;
        let size = self.entries[index].size;
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.file_read.is_multiple_of(CHUNK) {
                self.start_chunk(index, size)?;
            }
            let in_chunk = (CHUNK - self.file_read % CHUNK) as usize;
            let take = in_chunk.min(rest.len());
            self.emit(&rest[..take]);
            if self.records_chunk_digests(size) {
                self.current.chunk += take;
            }
            if let Some((_, Some(whole))) = &mut self.file {
                whole.update(&rest[..take]);
            }
            self.file_read += take as u64;
            rest = &rest[take..];
        }
        if self.file_read == size {
            self.end_file(index)?;
        }
        Ok(())
    }

    /// Whether the TOC needs the digest of each chunk of a file of `size` bytes. eStargz
    /// records every chunk's; zstd:chunked (1.43) only the whole file's, which for a
    /// one-chunk file is its chunk's, and for a larger one is hashed as it passes.
    fn records_chunk_digests(&self, size: u64) -> bool {
        self.format == Format::Estargz || size <= CHUNK
    }

    /// Opens the member of the chunk at `file_read`: the file's own entry for the first,
    /// a `chunk` entry for the others.
    fn start_chunk(&mut self, index: usize, size: u64) -> std::io::Result<()> {
        let member = self.cut()?;
        let chunk_offset = self.file_read;
        let chunk_size = if size > CHUNK {
            CHUNK.min(size - chunk_offset)
        } else {
            0
        };
        // The chunk's bytes are known: one allocation instead of doubling up to 4 MiB, with
        // room for the padding and headers that ride after it; a large one from the shelf.
        let room = CHUNK.min(size - chunk_offset) as usize + MEMBER_SLACK;
        if room >= SHELVED && self.current.bytes.is_empty() {
            self.current.bytes = buffers::take(room);
        } else {
            self.current.bytes.reserve(room);
        }
        if chunk_offset == 0 {
            let entry = &mut self.entries[index];
            entry.member = Some(member);
            entry.chunk_size = chunk_size;
        } else if self.format == Format::Estargz {
            let name = self.entries[index].name.clone();
            self.entries.push(TocEntry {
                name,
                kind: "chunk",
                chunk_offset,
                // The last chunk's size is implied (to the end of the file) and left out.
                chunk_size: if chunk_offset + chunk_size == size {
                    0
                } else {
                    chunk_size
                },
                member: Some(member),
                ..TocEntry::default()
            });
        }
        Ok(())
    }

    fn end_file(&mut self, index: usize) -> std::io::Result<()> {
        if let Some((_, Some(whole))) = self.file.take() {
            self.entries[index].digest = format!("sha256:{}", hex::encode(whole.finalize()));
        }
        // A zstd:chunked file's frames hold its bytes and nothing else.
        if self.format == Format::ZstdChunked {
            self.entries[index].end_member = Some(self.cut()?);
        }
        Ok(())
    }

    /// Ends the stream: the last member, then the TOC and the footer of the format. Returns
    /// the inner writer and what the manifest needs.
    pub(crate) fn finish(mut self) -> std::io::Result<(W, Seekable)> {
        if !matches!(self.state, State::Header | State::End) || !self.header.is_empty() {
            return Err(std::io::Error::other(
                "the layer's tar ended inside an entry",
            ));
        }
        self.cut()?;
        self.submit()?;
        while self.jobs_written < self.jobs_sent {
            self.receive_one()?;
        }
        self.fill_offsets();
        let annotations = match self.format {
            Format::Estargz => self.estargz_tail()?,
            Format::ZstdChunked => self.zstd_chunked_tail()?,
        };
        Ok((
            self.inner,
            Seekable {
                diff_id: format!("sha256:{}", hex::encode(self.diff.finalize())),
                uncompressed_size: self.uncompressed,
                annotations,
            },
        ))
    }

    /// The TOC member (the TOC as a tar entry, then the tar's end) and the footer.
    fn estargz_tail(&mut self) -> std::io::Result<BTreeMap<String, String>> {
        let toc_json = self.toc_json()?;
        let toc_digest = format!("sha256:{}", hex::encode(Sha256::digest(&toc_json)));
        let toc_offset = self.written;
        let tail = toc_tar(&toc_json)?;
        self.diff.update(&tail);
        self.uncompressed += tail.len() as u64;
        self.inner.write_all(&gzip_member(&tail)?)?;
        self.inner.write_all(&footer(toc_offset))?;
        Ok(BTreeMap::from([
            (TOC_DIGEST_ANNOTATION.to_string(), toc_digest),
            (
                UNCOMPRESSED_SIZE_ANNOTATION.to_string(),
                self.uncompressed.to_string(),
            ),
        ]))
    }

    /// The compressed TOC in a skippable frame, then the footer in another: both outside the
    /// tar, which zstd readers never see.
    fn zstd_chunked_tail(&mut self) -> std::io::Result<BTreeMap<String, String>> {
        let manifest = self.zstd_chunked_manifest()?;
        let compressed = zstd_frame(&manifest)?;
        // The manifest's data starts after its frame's magic and length.
        let offset = self.written + 8;
        self.inner.write_all(&skippable_frame(&compressed))?;
        let mut footer = Vec::with_capacity(40);
        for n in [
            offset,
            compressed.len() as u64,
            manifest.len() as u64,
            MANIFEST_TYPE_CRFS,
        ] {
            footer.extend_from_slice(&n.to_le_bytes());
        }
        footer.extend_from_slice(ZSTD_CHUNKED_MAGIC);
        self.inner.write_all(&skippable_frame(&footer))?;
        Ok(BTreeMap::from([
            (
                MANIFEST_CHECKSUM_ANNOTATION.to_string(),
                format!("sha256:{}", hex::encode(Sha256::digest(&compressed))),
            ),
            (
                MANIFEST_POSITION_ANNOTATION.to_string(),
                format!(
                    "{offset}:{}:{}:{MANIFEST_TYPE_CRFS}",
                    compressed.len(),
                    manifest.len()
                ),
            ),
        ]))
    }

    /// containers/storage's TOC: every entry, a regular file's digest and the compressed
    /// range `[offset, endOffset)` of its frames.
    fn zstd_chunked_manifest(&self) -> std::io::Result<Vec<u8>> {
        let end_of = |member: usize| self.offsets.get(member).copied().unwrap_or(self.written);
        let entries: Vec<serde_json::Value> = self
            .entries
            .iter()
            .map(|entry| {
                let mut value = serde_json::json!({"type": entry.kind, "name": entry.name});
                let mut put = |key: &str, v: serde_json::Value| {
                    value[key] = v;
                };
                if !entry.link_name.is_empty() {
                    put("linkName", entry.link_name.clone().into());
                }
                for (key, n) in [
                    ("mode", entry.mode),
                    ("size", entry.size),
                    ("uid", entry.uid),
                    ("gid", entry.gid),
                    ("devMajor", entry.dev_major),
                    ("devMinor", entry.dev_minor),
                ] {
                    if n != 0 {
                        put(key, n.into());
                    }
                }
                if !entry.mod_time.is_empty() {
                    put("modtime", entry.mod_time.clone().into());
                }
                if let (Some(_), Some(end)) = (entry.member, entry.end_member) {
                    put("digest", entry.digest.clone().into());
                    put("offset", entry.offset.into());
                    put("endOffset", end_of(end).into());
                }
                value
            })
            .collect();
        let manifest = serde_json::json!({"version": 1, "entries": entries});
        serde_json::to_vec(&manifest).map_err(std::io::Error::other)
    }

    /// Each entry's compressed offset, and the chunk digests the jobs computed.
    fn fill_offsets(&mut self) {
        for entry in &mut self.entries {
            let Some(member) = entry.member else { continue };
            entry.offset = self.offsets[member];
            let digest = self.chunk_digests[member].clone().unwrap_or_default();
            if entry.kind == "reg" && entry.digest.is_empty() {
                entry.digest = digest.clone();
            }
            entry.chunk_digest = digest;
        }
    }

    fn toc_json(&self) -> std::io::Result<Vec<u8>> {
        let toc = Toc {
            version: 1,
            entries: &self.entries,
        };
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b"\t");
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        serde::Serialize::serialize(&toc, &mut serializer).map_err(std::io::Error::other)?;
        Ok(out)
    }
}

impl<W: Write> Write for SeekableWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The bytes of a job are held before its first byte is read; those a write adds
        // after a job is handed on in the same call are counted by the next write's.
        if self.reserved.is_none() {
            self.reserved = Some(self.reserve()?);
        }
        let taken = match &mut self.state {
            State::Header => {
                let take = (512 - self.header.len()).min(buf.len());
                self.header.extend_from_slice(&buf[..take]);
                if self.header.len() == 512 {
                    self.on_header()?;
                }
                take
            }
            State::Extension {
                remaining,
                long_link,
            } => {
                let take = (*remaining).min(buf.len() as u64) as usize;
                let long_link = *long_link;
                *remaining -= take as u64;
                let done = *remaining == 0;
                if long_link {
                    self.long_link.extend_from_slice(&buf[..take]);
                } else {
                    self.long_name.extend_from_slice(&buf[..take]);
                }
                self.emit(&buf[..take]);
                if done {
                    let size = if long_link {
                        self.long_link.len()
                    } else {
                        self.long_name.len()
                    } as u64;
                    self.state = padded((512 - size % 512) % 512);
                }
                take
            }
            State::File { remaining, padding } => {
                let take = (*remaining).min(buf.len() as u64) as usize;
                *remaining -= take as u64;
                let (done, padding) = (*remaining == 0, *padding);
                self.file_bytes(&buf[..take])?;
                if done {
                    self.state = padded(padding);
                }
                take
            }
            State::Padding { remaining } => {
                let take = (*remaining).min(buf.len() as u64) as usize;
                *remaining -= take as u64;
                if *remaining == 0 {
                    self.state = State::Header;
                }
                self.emit(&buf[..take]);
                take
            }
            // eStargz writes the end-of-archive blocks again after its TOC entry; zstd:chunked
            // keeps the tar as it is.
            State::End => {
                if self.format == Format::ZstdChunked {
                    self.emit(buf);
                }
                buf.len()
            }
        };
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What follows an entry's data: its padding, if any, else the next header.
fn padded(remaining: u64) -> State {
    if remaining == 0 {
        State::Header
    } else {
        State::Padding { remaining }
    }
}

/// The owner name only where it differs from the last one given for the id, as the
/// snapshotter's writer does.
fn name_if_changed(last: &mut BTreeMap<u64, String>, id: u64, name: String) -> String {
    if name.is_empty() || last.get(&id) == Some(&name) {
        return String::new();
    }
    last.insert(id, name.clone());
    name
}

/// RFC 3339 in UTC; empty for the epoch, as the snapshotter writes it.
fn modtime(seconds: u64) -> String {
    if seconds == 0 {
        return String::new();
    }
    jiff::Timestamp::from_second(seconds as i64)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// `data` as a zstd skippable frame.
fn skippable_frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + data.len());
    out.extend_from_slice(&SKIPPABLE_FRAME);
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// A landmark file: one byte, `0x0f`, as the snapshotter's builder writes it.
fn landmark_entry(name: &str) -> std::io::Result<Vec<u8>> {
    let mut header = tar::Header::new_gnu();
    header.set_path(name)?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(1);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.push(0x0f);
    out.resize(1024, 0);
    Ok(out)
}

/// The eStargz TOC as a tar entry, then the end of the archive.
fn toc_tar(json: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut header = tar::Header::new_ustar();
    header.set_path(TOC_TAR_NAME)?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_cksum();
    let mut out = Vec::with_capacity(512 + json.len() + 1536);
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(json);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0; 1024]);
    Ok(out)
}

/// The 51-byte footer: an empty gzip member (a stored block) whose extra field, subfield
/// `SG`, is `%016xSTARGZ` of the TOC member's offset.
pub fn footer(toc_offset: u64) -> [u8; 51] {
    let mut out = [0u8; 51];
    // ID1 ID2 CM=deflate FLG=FEXTRA MTIME=0 XFL=0 OS=unknown
    out[..10].copy_from_slice(&[0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff]);
    out[10..12].copy_from_slice(&26u16.to_le_bytes());
    out[12..14].copy_from_slice(b"SG");
    out[14..16].copy_from_slice(&22u16.to_le_bytes());
    out[16..38].copy_from_slice(format!("{toc_offset:016x}STARGZ").as_bytes());
    // A final stored block of length 0, then CRC32 and ISIZE of nothing.
    out[38..43].copy_from_slice(&[1, 0, 0, 0xff, 0xff]);
    out
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// A tar as the layer writer makes them: GNU headers, a long name, a directory, a
    /// symlink, an empty file, a small one and one of three chunks.
    fn sample_tar() -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut add = |path: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_mode(if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            header.set_mtime(1_700_000_000);
            header.set_uid(0);
            header.set_gid(0);
            header.set_size(data.len() as u64);
            match link {
                Some(target) => builder.append_link(&mut header, path, target).unwrap(),
                None => builder.append_data(&mut header, path, data).unwrap(),
            }
        };
        add("opt/", tar::EntryType::Directory, &[], None);
        add("opt/empty", tar::EntryType::Regular, &[], None);
        add("opt/small.txt", tar::EntryType::Regular, b"hello", None);
        let big: Vec<u8> = (0..(CHUNK as usize * 2 + 1000))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        add("opt/lib/big.so", tar::EntryType::Regular, &big, None);
        let long = format!("opt/{}/file", "d".repeat(120));
        add(&long, tar::EntryType::Regular, b"deep", None);
        add("opt/link", tar::EntryType::Symlink, &[], Some("small.txt"));
        builder.into_inner().unwrap()
    }

    fn estargz(tar: &[u8], threads: usize) -> (Vec<u8>, Seekable) {
        seekable(tar, threads, Format::Estargz)
    }

    fn seekable(tar: &[u8], threads: usize, format: Format) -> (Vec<u8>, Seekable) {
        let pool = CompressPool::new(threads).unwrap();
        let mut writer = SeekableWriter::new(Vec::new(), pool, format);
        writer.write_all(tar).unwrap();
        writer.finish().unwrap()
    }

    fn gunzip_one(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn the_same_bytes_for_any_thread_count() {
        let tar = sample_tar();
        let (one, a) = estargz(&tar, 1);
        let (four, b) = estargz(&tar, 4);
        assert_eq!(one, four);
        assert_eq!(a, b);
    }

    #[test]
    fn a_plain_gzip_reader_sees_the_tar_with_the_toc_before_its_end() {
        let tar = sample_tar();
        let (blob, summary) = estargz(&tar, 2);
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(blob.as_slice())
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(summary.uncompressed_size, plain.len() as u64);
        assert_eq!(
            summary.diff_id,
            format!("sha256:{}", hex::encode(Sha256::digest(&plain)))
        );
        let mut archive = tar::Archive::new(plain.as_slice());
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names.last().unwrap(), TOC_TAR_NAME);
        assert!(
            names.iter().any(|n| n.ends_with("/file") && n.len() > 120),
            "{names:?}"
        );
        // Everything before the input's end-of-archive blocks is the input, unchanged.
        let body = tar.len() - tar.iter().rev().take_while(|b| **b == 0).count();
        assert_eq!(&plain[..body], &tar[..body]);
    }

    #[test]
    fn the_footer_points_at_the_toc_and_each_chunk_at_its_member() {
        let tar = sample_tar();
        let (blob, summary) = estargz(&tar, 3);
        let footer_at = blob.len() - 51;
        let extra = &blob[footer_at + 16..footer_at + 38];
        assert!(extra.ends_with(b"STARGZ"));
        let toc_offset =
            u64::from_str_radix(std::str::from_utf8(&extra[..16]).unwrap(), 16).unwrap();
        assert_eq!(blob[footer_at..], footer(toc_offset));
        let toc_tar = gunzip_one(&blob[toc_offset as usize..footer_at]);
        let mut archive = tar::Archive::new(toc_tar.as_slice());
        let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
        let mut json = Vec::new();
        entry.read_to_end(&mut json).unwrap();
        assert_eq!(
            summary.annotations[TOC_DIGEST_ANNOTATION],
            format!("sha256:{}", hex::encode(Sha256::digest(&json)))
        );
        let toc: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let entries = toc["entries"].as_array().unwrap();
        let big: Vec<&serde_json::Value> = entries
            .iter()
            .filter(|e| e["name"] == "opt/lib/big.so")
            .collect();
        assert_eq!(big.len(), 3, "{big:?}");
        assert_eq!(big[0]["type"], "reg");
        assert_eq!(big[0]["chunkSize"], CHUNK);
        assert_eq!(big[1]["chunkOffset"], CHUNK);
        // The last chunk's size is implied.
        assert!(big[2].get("chunkSize").is_none());
        for chunk in &big {
            let offset = chunk["offset"].as_u64().unwrap() as usize;
            let data = gunzip_one(&blob[offset..]);
            let len = chunk["chunkSize"].as_u64().unwrap_or(1000) as usize;
            assert_eq!(
                chunk["chunkDigest"],
                format!("sha256:{}", hex::encode(Sha256::digest(&data[..len])))
            );
        }
        let small = entries
            .iter()
            .find(|e| e["name"] == "opt/small.txt")
            .unwrap();
        assert_eq!(
            gunzip_one(&blob[small["offset"].as_u64().unwrap() as usize..])[..5],
            *b"hello"
        );
        assert_eq!(small["digest"], small["chunkDigest"]);
        assert_eq!(small["modtime"], "2023-11-14T22:13:20Z");
        let link = entries.iter().find(|e| e["name"] == "opt/link").unwrap();
        assert_eq!(link["linkName"], "small.txt");
    }

    #[test]
    fn a_tar_cut_off_inside_an_entry_is_an_error() {
        let tar = sample_tar();
        let pool = CompressPool::new(1).unwrap();
        let mut writer = SeekableWriter::new(Vec::new(), pool, Format::Estargz);
        writer.write_all(&tar[..2000]).unwrap();
        assert!(writer.finish().is_err());
    }

    /// Reads a zstd:chunked blob's footer: the TOC's offset and lengths.
    fn zstd_chunked_footer(blob: &[u8]) -> (usize, usize, usize) {
        let frame = &blob[blob.len() - 48..];
        assert_eq!(frame[..4], SKIPPABLE_FRAME);
        assert_eq!(u32::from_le_bytes(frame[4..8].try_into().unwrap()), 40);
        let footer = &frame[8..];
        let n = |i: usize| u64::from_le_bytes(footer[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(n(3), MANIFEST_TYPE_CRFS);
        assert_eq!(&footer[32..], ZSTD_CHUNKED_MAGIC);
        (n(0) as usize, n(1) as usize, n(2) as usize)
    }

    #[test]
    fn zstd_chunked_is_the_tar_unchanged_to_zstd_readers_with_each_file_in_its_frames() {
        let tar = sample_tar();
        let (blob, summary) = seekable(&tar, 3, Format::ZstdChunked);
        assert_eq!(blob, seekable(&tar, 1, Format::ZstdChunked).0);
        // Skippable frames are skipped: the stream is exactly the layer's tar.
        let plain = zstd::stream::decode_all(blob.as_slice()).unwrap();
        assert!(plain == tar, "the tar comes back unchanged");
        assert_eq!(summary.uncompressed_size, tar.len() as u64);
        assert_eq!(
            summary.diff_id,
            format!("sha256:{}", hex::encode(Sha256::digest(&tar)))
        );

        let (offset, length, uncompressed) = zstd_chunked_footer(&blob);
        let compressed = &blob[offset..offset + length];
        assert_eq!(
            summary.annotations[MANIFEST_CHECKSUM_ANNOTATION],
            format!("sha256:{}", hex::encode(Sha256::digest(compressed)))
        );
        assert_eq!(
            summary.annotations[MANIFEST_POSITION_ANNOTATION],
            format!("{offset}:{length}:{uncompressed}:1")
        );
        let manifest = zstd::stream::decode_all(compressed).unwrap();
        assert_eq!(manifest.len(), uncompressed);
        let toc: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
        let entries = toc["entries"].as_array().unwrap();
        // One entry per tar entry: no chunk entries, no TOC entry in the tar.
        assert_eq!(entries.len(), 6, "{toc}");
        assert!(entries.iter().all(|e| e["type"] != "chunk"));
        for entry in entries.iter().filter(|e| e["offset"].is_u64()) {
            let start = entry["offset"].as_u64().unwrap() as usize;
            let end = entry["endOffset"].as_u64().unwrap() as usize;
            // The file's frames hold its bytes and nothing else.
            let bytes = zstd::stream::decode_all(&blob[start..end]).unwrap();
            assert_eq!(
                bytes.len() as u64,
                entry["size"].as_u64().unwrap(),
                "{entry}"
            );
            assert_eq!(
                entry["digest"],
                format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
            );
        }
        let big = entries
            .iter()
            .find(|e| e["name"] == "opt/lib/big.so")
            .unwrap();
        assert!(big["endOffset"].as_u64() > big["offset"].as_u64());
        let empty = entries.iter().find(|e| e["name"] == "opt/empty").unwrap();
        assert!(empty.get("offset").is_none(), "{empty}");
    }
}
