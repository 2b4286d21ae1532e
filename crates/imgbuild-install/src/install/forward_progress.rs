//! Install progress. rattler's installer reports through a `'static`
//! [`rattler::install::Reporter`]; this forwards its events over a channel to the build's
//! borrowed [`crate::report::Reporter`], with the bytes of the package archives as
//! imgbuild's own check and extraction read them ([`ArchiveBytes`]).

use std::{
    collections::HashMap,
    future::Future,
    io::{Read, Seek, SeekFrom},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use rattler::install::{Reporter, Transaction};
use rattler_conda_types::{PrefixRecord, RepoDataRecord};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::report::{Progress, Stage};

pub(super) enum Event {
    Total(usize),
    Downloaded(u64),
    Linked(String),
    /// Archive bytes added to the install's total.
    ArchiveTotal(u64),
    /// Archive bytes checked and extracted.
    Archive(u64),
    /// Something the user should hear of that does not stop the install.
    Warning(String),
}

pub(super) struct Forward {
    tx: UnboundedSender<Event>,
    /// Bytes seen so far per download, to turn rattler's running totals into deltas.
    downloads: Mutex<HashMap<usize, u64>>,
    /// Package name per link index.
    links: Mutex<HashMap<usize, String>>,
}

impl Forward {
    pub(super) fn new(tx: UnboundedSender<Event>) -> Self {
        Forward {
            tx,
            downloads: Mutex::default(),
            links: Mutex::default(),
        }
    }
}

impl Reporter for Forward {
    fn on_transaction_start(&self, transaction: &Transaction<PrefixRecord, RepoDataRecord>) {
        let _ = self.tx.send(Event::Total(transaction.operations.len()));
    }
    fn on_transaction_operation_start(&self, _operation: usize) {}
    fn on_populate_cache_start(&self, operation: usize, _record: &RepoDataRecord) -> usize {
        operation
    }
    fn on_validate_start(&self, cache_entry: usize) -> usize {
        cache_entry
    }
    fn on_validate_complete(&self, _validate_idx: usize) {}
    fn on_download_start(&self, cache_entry: usize) -> usize {
        cache_entry
    }
    fn on_download_progress(&self, download_idx: usize, progress: u64, _total: Option<u64>) {
        let mut seen = self
            .downloads
            .lock()
            .expect("no panics while holding the lock");
        let last = seen.entry(download_idx).or_default();
        if progress > *last {
            let _ = self.tx.send(Event::Downloaded(progress - *last));
            *last = progress;
        }
    }
    fn on_download_completed(&self, _download_idx: usize) {}
    fn on_populate_cache_complete(&self, _cache_entry: usize) {}
    fn on_unlink_start(&self, operation: usize, _record: &PrefixRecord) -> usize {
        operation
    }
    fn on_unlink_complete(&self, _index: usize) {}
    fn on_link_start(&self, operation: usize, record: &RepoDataRecord) -> usize {
        self.links
            .lock()
            .expect("no panics while holding the lock")
            .insert(
                operation,
                record.package_record.name.as_normalized().to_string(),
            );
        operation
    }
    fn on_link_complete(&self, index: usize) {
        let name = self
            .links
            .lock()
            .expect("no panics while holding the lock")
            .remove(&index)
            .unwrap_or_default();
        let _ = self.tx.send(Event::Linked(name));
    }
    fn on_transaction_operation_complete(&self, _operation: usize) {}
    fn on_transaction_complete(&self) {}
    fn on_post_link_start(&self, _package_name: &str, _script_path: &str) -> usize {
        0
    }
    fn on_post_link_complete(&self, _index: usize, _success: bool) {}
    fn on_pre_unlink_start(&self, _package_name: &str, _script_path: &str) -> usize {
        0
    }
    fn on_pre_unlink_complete(&self, _index: usize, _success: bool) {}
}

/// Download progress of a package fetched into the cache before the install.
pub(super) struct CacheForward {
    tx: UnboundedSender<Event>,
    seen: Mutex<u64>,
}

impl CacheForward {
    pub(super) fn new(tx: UnboundedSender<Event>) -> Self {
        CacheForward {
            tx,
            seen: Mutex::new(0),
        }
    }
}

impl rattler_cache::package_cache::CacheReporter for CacheForward {
    fn on_validate_start(&self) -> usize {
        0
    }
    fn on_validate_complete(&self, _index: usize) {}
    fn on_download_start(&self) -> usize {
        0
    }
    fn on_download_progress(&self, _index: usize, progress: u64, _total: Option<u64>) {
        let mut seen = self.seen.lock().expect("no panics while holding the lock");
        if progress > *seen {
            let _ = self.tx.send(Event::Downloaded(progress - *seen));
            *seen = progress;
        }
    }
    fn on_download_completed(&self, _index: usize) {}
}

fn deliver(event: Event, reporter: &dyn crate::report::Reporter) {
    match event {
        Event::Total(total) => reporter.on_stage_total(Stage::Install, total),
        Event::Downloaded(bytes) => reporter.on_download_bytes(bytes),
        Event::Linked(name) => reporter.on_item_done(Stage::Install, &name, 0),
        Event::ArchiveTotal(bytes) => reporter.on_progress(Progress::PackageBytesTotal(bytes)),
        Event::Archive(bytes) => reporter.on_progress(Progress::PackageBytes(bytes)),
        Event::Warning(message) => reporter.on_warning(&message),
    }
}

/// Drives `installing` while handing its events to `reporter`, then the ones left.
pub(super) async fn forward_until_done<T>(
    installing: impl Future<Output = T>,
    events: &mut UnboundedReceiver<Event>,
    reporter: &dyn crate::report::Reporter,
) -> T {
    let mut installing = std::pin::pin!(installing);
    let result = loop {
        tokio::select! {
            result = &mut installing => break result,
            Some(event) = events.recv() => deliver(event, reporter),
        }
    };
    while let Ok(event) = events.try_recv() {
        deliver(event, reporter);
    }
    result
}

/// Archive bytes are sent once this many have gathered, not on every read: a 2 GB package
/// is then a few thousand events, each redrawing at most one bar.
const REPORT_EVERY: u64 = 1 << 20;

/// The two reads of an archive that is extracted: the scan (which refuses a hostile
/// archive before anything is written), then the extraction itself.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pass {
    Scan,
    Extract,
}

/// One package's archive bytes, reported as imgbuild reads the archive: half its size while
/// the scan reads it, half while the extraction does, and whatever is left when the package
/// is ready ([`ArchiveBytes::finish`]), so every package adds exactly its size to the count,
/// whether it was extracted now, checked again or found checked in the cache.
pub(super) struct ArchiveBytes {
    tx: UnboundedSender<Event>,
    /// The archive's size: its record's, or the file's once obtained (0 until known).
    size: AtomicU64,
    /// What was sent so far.
    reported: AtomicU64,
    /// What was counted so far, sent once [`REPORT_EVERY`] bytes gather.
    counted: AtomicU64,
}

impl ArchiveBytes {
    /// The bytes of an archive of `size` (from its record), already in the total.
    pub(super) fn new(tx: UnboundedSender<Event>, size: Option<u64>) -> Arc<Self> {
        Arc::new(ArchiveBytes {
            tx,
            size: AtomicU64::new(size.unwrap_or(0)),
            reported: AtomicU64::new(0),
            counted: AtomicU64::new(0),
        })
    }

    /// The size of an archive whose record has none, once the file is there: added to the
    /// total now.
    pub(super) fn learn_size(&self, size: u64) {
        if self
            .size
            .compare_exchange(0, size, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let _ = self.tx.send(Event::ArchiveTotal(size));
        }
    }

    /// `done` bytes of the archive are through; sent when enough have gathered, or `now`.
    fn advance_to(&self, done: u64, now: bool) {
        let done = done.min(self.size.load(Ordering::SeqCst));
        let counted = self.counted.fetch_max(done, Ordering::SeqCst).max(done);
        let reported = self.reported.load(Ordering::SeqCst);
        if counted > reported && (now || counted - reported >= REPORT_EVERY) {
            let before = self.reported.fetch_max(counted, Ordering::SeqCst);
            if counted > before {
                let _ = self.tx.send(Event::Archive(counted - before));
            }
        }
    }

    /// The package is ready: the rest of its bytes are counted.
    pub(super) fn finish(&self) {
        self.advance_to(u64::MAX, true);
    }

    /// `inner`, the archive, counting what `pass` reads of it.
    pub(super) fn reader<R>(self: &Arc<Self>, inner: R, pass: Pass) -> Counted<R> {
        let half = self.size.load(Ordering::SeqCst) / 2;
        Counted {
            inner,
            read: 0,
            base: match pass {
                Pass::Scan => 0,
                Pass::Extract => half,
            },
            half,
            bytes: self.clone(),
        }
    }
}

/// A reader of an archive that counts the bytes read through it (seeks move, but count
/// nothing: a `.conda` is read from its zip directory at the end, then member by member).
pub(super) struct Counted<R> {
    inner: R,
    read: u64,
    /// Where this pass's half starts in the package's count.
    base: u64,
    half: u64,
    bytes: Arc<ArchiveBytes>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        self.bytes
            .advance_to(self.base + (self.read / 2).min(self.half), false);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counted<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Read};

    use super::*;

    fn sum(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> u64 {
        let mut total = 0;
        while let Ok(event) = rx.try_recv() {
            if let Event::Archive(bytes) = event {
                total += bytes;
            }
        }
        total
    }

    #[test]
    fn a_package_counts_its_size_once_over_both_reads() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let size = 5 * REPORT_EVERY + 3;
        let bytes = ArchiveBytes::new(tx, Some(size));
        let archive = vec![7u8; size as usize];
        std::io::copy(
            &mut bytes.reader(Cursor::new(&archive), Pass::Scan),
            &mut std::io::sink(),
        )
        .unwrap();
        let after_scan = sum(&mut rx);
        // Half of it, give or take what has not gathered to a report yet.
        assert!(after_scan <= size / 2 && after_scan + REPORT_EVERY >= size / 2);
        let mut extract = bytes.reader(Cursor::new(&archive), Pass::Extract);
        extract.read_exact(&mut [0u8; 100]).unwrap();
        std::io::copy(&mut extract, &mut std::io::sink()).unwrap();
        bytes.finish();
        bytes.finish();
        assert_eq!(after_scan + sum(&mut rx), size);
    }

    #[test]
    fn a_package_found_in_the_cache_counts_at_once_and_an_unknown_size_adds_to_the_total() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        ArchiveBytes::new(tx.clone(), Some(10)).finish();
        assert_eq!(sum(&mut rx), 10);
        let unknown = ArchiveBytes::new(tx, None);
        unknown.learn_size(20);
        unknown.learn_size(30);
        unknown.finish();
        let events: Vec<Event> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert!(matches!(
            events.as_slice(),
            [Event::ArchiveTotal(20), Event::Archive(20)]
        ));
    }
}
