//! Fetching every package into rattler's cache and checking it before rattler links anything.
//!
//! Three layers, cheapest first: the archive's size against the lock record (rattler checks
//! only the sha256); every entry of the archive read from its tar header ([`super::scan`]),
//! because the extractor silently drops what it will not write; and the extracted copy
//! against its `info/paths.json` ([`check_package`]). A package that passed all three is
//! marked ([`super::checked`]) so later builds skip the reading.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use rattler_cache::package_cache::{CacheReporter, PackageCache};
use rattler_conda_types::RepoDataRecord;
use rattler_digest::{Md5Hash, Sha256Hash};

use rattler_networking::LazyClient;
use tokio::sync::mpsc::UnboundedSender;

use super::{
    InstallError, checked, dist_name,
    forward_progress::{self, ArchiveBytes, Pass},
    scan::{self, ArchiveKind},
};

/// Fetches and checks every record, eight at a time; returns the extracted copy of each, in
/// the order of `records`. The records' archive sizes are the total of the bytes reported
/// as the archives are checked and extracted (a record without one adds its file's size
/// once the file is there).
pub(super) async fn fetch_and_check(
    records: &[RepoDataRecord],
    (cache, pkgs): (&PackageCache, &Path),
    cache_dir: &Path,
    client: &LazyClient,
    events: UnboundedSender<forward_progress::Event>,
) -> Result<Vec<PathBuf>, InstallError> {
    use futures::{StreamExt, TryStreamExt};
    let total = records.iter().filter_map(|r| r.package_record.size).sum();
    let _ = events.send(forward_progress::Event::ArchiveTotal(total));
    futures::stream::iter(records)
        .map(|record| fetch_one(record, (cache, pkgs), cache_dir, client, events.clone()))
        .buffered(8)
        .try_collect()
        .await
}

/// Where an archive comes from.
#[derive(Clone)]
enum Source {
    Local(PathBuf),
    Remote(url::Url),
}

/// What a fetch needs, cloned into rattler's `'static` fetch closure.
#[derive(Clone)]
struct Job {
    record: RepoDataRecord,
    package: String,
    /// The archive's file name, which is how errors about the archive as a whole name it.
    archive: String,
    kind: ArchiveKind,
    source: Source,
    downloads: PathBuf,
    client: LazyClient,
    reporter: Arc<dyn CacheReporter>,
    /// The archive's bytes, counted as they are read.
    bytes: Arc<ArchiveBytes>,
}

impl Job {
    fn refuse(&self, entry: &str, reason: String) -> InstallError {
        InstallError::Check {
            package: self.package.clone(),
            entry: scan::printable(entry),
            reason: scan::printable(&reason),
        }
    }

    fn refuse_archive(&self, reason: String) -> InstallError {
        self.refuse(&self.archive, reason)
    }

    fn refused(&self, refusal: scan::ArchiveRefusal) -> InstallError {
        self.refuse(&refusal.entry, refusal.reason)
    }
}

async fn fetch_one(
    record: &RepoDataRecord,
    (cache, pkgs): (&PackageCache, &Path),
    cache_dir: &Path,
    client: &LazyClient,
    events: UnboundedSender<forward_progress::Event>,
) -> Result<PathBuf, InstallError> {
    let package = dist_name(record);
    let archive = record
        .url
        .path_segments()
        .and_then(|mut s| s.next_back())
        .unwrap_or_default()
        .to_string();
    let bad = |reason: &str| InstallError::Check {
        package: package.clone(),
        entry: record.url.to_string(),
        reason: reason.to_string(),
    };
    let kind = ArchiveKind::from_file_name(&archive)
        .ok_or_else(|| bad("is neither a `.conda` nor a `.tar.bz2` archive"))?;
    let source = if record.url.scheme() == "file" {
        Source::Local(
            record
                .url
                .to_file_path()
                .map_err(|()| bad("is not a local file path"))?,
        )
    } else {
        Source::Remote(record.url.clone())
    };
    let job = Job {
        record: record.clone(),
        package: package.clone(),
        archive,
        kind,
        source,
        downloads: cache_dir.join("downloads"),
        client: client.clone(),
        reporter: Arc::new(forward_progress::CacheForward::new(events.clone())),
        bytes: ArchiveBytes::new(events.clone(), record.package_record.size),
    };

    // rattler calls `fetch` only when the package is not in its cache yet; the closure's
    // error type is rattler's to wrap, so a refusal travels back beside it.
    let refusal: Arc<Mutex<Option<InstallError>>> = Arc::default();
    let extracted_here = Arc::new(AtomicBool::new(false));
    let fetch = {
        let (job, refusal, extracted_here) = (job.clone(), refusal.clone(), extracted_here.clone());
        move |destination: PathBuf| {
            let (job, refusal, extracted_here) =
                (job.clone(), refusal.clone(), extracted_here.clone());
            async move {
                extracted_here.store(true, Ordering::SeqCst);
                match extract_checked(&job, &destination).await {
                    Ok(sha256) => Ok(Some(sha256)),
                    Err(err) => {
                        *refusal.lock().expect("no panics while holding the lock") = Some(err);
                        Err(std::io::Error::other("refused by imgbuild's package check"))
                    }
                }
            }
        }
    };
    let fetched = cache
        .get_or_fetch(&record.package_record, fetch, Some(job.reporter.clone()))
        .await
        .map_err(|source| {
            let refused = refusal
                .lock()
                .expect("no panics while holding the lock")
                .take();
            match refused {
                Some(err) => {
                    forget(pkgs, &package, &events);
                    err
                }
                None => InstallError::Fetch {
                    package: package.clone(),
                    source,
                },
            }
        })?;
    let dir = fetched.path().to_path_buf();

    let sha256 = record.package_record.sha256.map(hex::encode);
    if let Some(sha256) = &sha256
        && checked::is_marked(cache_dir, sha256, &dir)
    {
        tracing::debug!("{package}: checked before (marker {sha256}), not read again");
        job.bytes.finish();
        return Ok(dir);
    }
    if let Err(err) = check_extracted(&job, &dir, !extracted_here.load(Ordering::SeqCst)).await {
        forget(pkgs, &package, &events);
        return Err(err);
    }
    if let Some(sha256) = &sha256
        && let Err(err) = checked::mark(cache_dir, sha256, &dir)
    {
        // Only costs the next build a full check.
        let warning = format!("could not record that {package} was checked: {err}");
        let _ = events.send(forward_progress::Event::Warning(warning));
    }
    job.bytes.finish();
    Ok(dir)
}

/// Removes what the cache holds of the refused package `package` (its extracted copy and
/// rattler's metadata file beside it), so nothing of it stays; the whole-cache lock is held.
/// What cannot be removed is a warning on `events`.
fn forget(pkgs: &Path, package: &str, events: &UnboundedSender<forward_progress::Event>) {
    let dir = pkgs.join(package);
    if dir.is_dir()
        && let Err(e) = fs_err::remove_dir_all(&dir)
    {
        let warning = format!("could not remove the refused package's copy: {e}");
        let _ = events.send(forward_progress::Event::Warning(warning));
    }
    let _ = fs_err::remove_file(pkgs.join(format!("{package}.lock")));
}

/// Checks the extracted copy `dir` against its record and `info/paths.json`; with `rescan`
/// (extracted by an earlier run, or another process, and not marked or changed since), the
/// archive is read again first: the copy alone cannot show what the extractor dropped.
async fn check_extracted(job: &Job, dir: &Path, rescan: bool) -> Result<(), InstallError> {
    if rescan {
        let archive = obtain(job).await?;
        let (job2, path) = (job.clone(), archive.path().to_path_buf());
        tokio::task::spawn_blocking(move || scan_file(&job2, &path, true))
            .await
            .map_err(|e| job.refuse_archive(format!("could not be checked: {e}")))??;
    }
    let (check_dir, record) = (dir.to_path_buf(), job.record.clone());
    tokio::task::spawn_blocking(move || check_package(&check_dir, &record))
        .await
        .map_err(|e| job.refuse_archive(format!("could not be checked: {e}")))?
}

/// rattler's fetch: the archive is obtained, its size checked, then scanned to its end, and
/// only then extracted (the extractor writes into rattler's temporary destination, which
/// rattler discards on error) and its sha256 compared with the lock. Scanning first costs a
/// second decompression in sequence rather than beside the extraction, but a bomb or a
/// hostile entry is refused before a single byte of it is written.
async fn extract_checked(job: &Job, destination: &Path) -> Result<Sha256Hash, InstallError> {
    let archive = obtain(job).await?;
    let path = archive.path().to_path_buf();
    check_size(job, &path)?;
    let (scan_job, scan_path) = (job.clone(), path.clone());
    tokio::task::spawn_blocking(move || scan_file(&scan_job, &scan_path, false))
        .await
        .map_err(|e| job.refuse_archive(format!("could not be checked: {e}")))??;
    let result = extract(job, &path, destination).await.map_err(|e| {
        // A full cache disk is the machine's fault, not the package's (exit 2).
        if crate::fs::is_disk_full(&e) {
            return InstallError::DiskFull {
                path: destination.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            };
        }
        job.refuse_archive(format!("cannot be extracted: {e}"))
    })?;
    check_sha256(job, result.sha256)?;
    check_md5(job, result.md5)?;
    Ok(result.sha256)
}

/// rattler's extraction of the archive at `path`, on a blocking thread as rattler's own
/// `tokio::fs::extract` runs it, reading through a counter so the bytes are reported.
#[allow(
    clippy::disallowed_methods,
    reason = "the extractor takes a std::fs::File; the error is wrapped with the archive"
)]
async fn extract(
    job: &Job,
    path: &Path,
    destination: &Path,
) -> Result<rattler_package_streaming::ExtractResult, rattler_package_streaming::ExtractError> {
    use rattler_package_streaming::read;
    let (bytes, kind) = (job.bytes.clone(), job.kind);
    let (path, destination) = (path.to_path_buf(), destination.to_path_buf());
    let extracting = tokio::task::spawn_blocking(move || {
        let file = std::io::BufReader::new(std::fs::File::open(&path)?);
        let reader = bytes.reader(file, Pass::Extract);
        match kind {
            ArchiveKind::TarBz2 => read::extract_tar_bz2(reader, &destination),
            ArchiveKind::Conda => read::extract_conda_via_streaming(reader, &destination),
        }
    });
    match extracting.await {
        Ok(result) => result,
        Err(err) => match err.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(rattler_package_streaming::ExtractError::Cancelled),
        },
    }
}

fn check_size(job: &Job, path: &Path) -> Result<(), InstallError> {
    let actual = fs_err::metadata(path)
        .map_err(|e| job.refuse_archive(format!("cannot be read: {e}")))?
        .len();
    job.bytes.learn_size(actual);
    match job.record.package_record.size {
        Some(expected) if expected != actual => Err(job.refuse_archive(format!(
            "is {actual} bytes, but its record (repodata or lock) says size {expected}"
        ))),
        _ => Ok(()),
    }
}

fn check_sha256(job: &Job, actual: Sha256Hash) -> Result<(), InstallError> {
    match job.record.package_record.sha256 {
        Some(expected) if expected != actual => Err(job.refuse_archive(format!(
            "has sha256 {}, but its record (repodata or lock) says {}",
            hex::encode(actual),
            hex::encode(expected)
        ))),
        _ => Ok(()),
    }
}

/// A record without a sha256 (some old repodata) is pinned by its md5 instead, which must
/// then match: a lock is a claim, and every package it names is checked against a digest.
fn check_md5(job: &Job, actual: Md5Hash) -> Result<(), InstallError> {
    let record = &job.record.package_record;
    match (record.sha256, record.md5) {
        (None, Some(expected)) if expected != actual => Err(job.refuse_archive(format!(
            "has md5 {}, but its record (repodata or lock), which has no sha256, says {}",
            hex::encode(actual),
            hex::encode(expected)
        ))),
        _ => Ok(()),
    }
}

/// Scans the archive at `path`; with `whole`, also its size and sha256 (when rattler's
/// extraction did not just compute them).
fn scan_file(job: &Job, path: &Path, whole: bool) -> Result<(), InstallError> {
    if whole {
        check_size(job, path)?;
        let sha256 = rattler_digest::compute_file_digest::<rattler_digest::Sha256>(path)
            .map_err(|e| job.refuse_archive(format!("cannot be read: {e}")))?;
        check_sha256(job, sha256)?;
        if job.record.package_record.sha256.is_none() {
            let md5 = rattler_digest::compute_file_digest::<rattler_digest::Md5>(path)
                .map_err(|e| job.refuse_archive(format!("cannot be read: {e}")))?;
            check_md5(job, md5)?;
        }
    }
    let file = std::io::BufReader::new(
        fs_err::File::open(path).map_err(|e| job.refuse_archive(format!("cannot be read: {e}")))?,
    );
    let file = job.bytes.reader(file, Pass::Scan);
    let scanned = scan::scan_archive(file, job.kind, &job.archive).map_err(|r| job.refused(r))?;
    tracing::debug!(
        "{}: {} archive entries scanned",
        job.package,
        scanned.entries
    );
    Ok(())
}

/// An archive on disk: the channel's own file, or a download removed when dropped.
enum ArchiveFile {
    Local(PathBuf),
    Downloaded(tempfile::TempPath),
}

impl ArchiveFile {
    fn path(&self) -> &Path {
        match self {
            ArchiveFile::Local(path) => path,
            ArchiveFile::Downloaded(temp) => temp,
        }
    }
}

async fn obtain(job: &Job) -> Result<ArchiveFile, InstallError> {
    match &job.source {
        Source::Local(path) => Ok(ArchiveFile::Local(path.clone())),
        Source::Remote(url) => download(job, url).await.map(ArchiveFile::Downloaded),
    }
}

/// Downloads `url` into `<cache>/downloads`, resuming what an earlier attempt or process left
/// there ([`crate::download`]); the size and sha256 are checked there against the record.
async fn download(job: &Job, url: &url::Url) -> Result<tempfile::TempPath, InstallError> {
    let expected = crate::download::Expected {
        sha256: job.record.package_record.sha256,
        size: job.record.package_record.size,
    };
    let progress = DownloadForward {
        reporter: job.reporter.as_ref(),
        index: job.reporter.on_download_start(),
    };
    let file = crate::download::download_resumable(
        &job.client,
        url,
        &job.downloads,
        &job.archive,
        expected,
        &progress,
    )
    .await
    .map_err(|source| InstallError::Download {
        package: job.package.clone(),
        source: Box::new(source),
    })?;
    job.reporter.on_download_completed(progress.index);
    Ok(file)
}

/// Hands a download's running total of bytes received to rattler's cache reporter (ours
/// turns it into deltas, so bytes resumed from a partial file are not counted twice).
struct DownloadForward<'a> {
    reporter: &'a dyn CacheReporter,
    index: usize,
}

impl crate::download::DownloadProgress for DownloadForward<'_> {
    fn on_progress(&self, received: u64, _on_disk: u64, total: Option<u64>) {
        self.reporter
            .on_download_progress(self.index, received, total);
    }
}

/// The metadata files rattler reads from an extracted package: each must be a plain file in
/// a plain `info/` directory, so no read of them follows a link.
const METADATA_FILES: &[&str] = &[
    "info/index.json",
    "info/paths.json",
    "info/link.json",
    "info/files",
    "info/has_prefix",
    "info/no_link",
    "info/about.json",
    "info/run_exports.json",
];

/// Checks an extracted package against its record and its `info/paths.json`: it is the
/// package the record names, every declared path stays in the prefix and is what paths.json
/// says it is (a file, a link, a directory, reached through directories only, so reading it
/// never follows a link out of the copy), every payload file is declared, every declared file
/// has its sha256, and a file marked for binary prefix replacement holds its placeholder
/// (rattler would otherwise leave the build-time path in it without a word, and the image
/// would carry a broken binary).
pub(super) fn check_package(dir: &Path, record: &RepoDataRecord) -> Result<(), InstallError> {
    use rattler_conda_types::package::PathsJson;
    let package = dist_name(record);
    let bad = |entry: &str, reason: &str| InstallError::Check {
        package: package.clone(),
        entry: scan::printable(entry),
        reason: scan::printable(reason),
    };
    check_metadata_files(dir).map_err(|(entry, reason)| bad(&entry, &reason))?;
    check_identity(dir, record).map_err(|reason| bad("info/index.json", &reason))?;
    let paths = PathsJson::from_package_directory_with_deprecated_fallback(dir)
        .map_err(|e| bad("info/paths.json", &format!("cannot be read: {e}")))?;
    let mut declared = std::collections::BTreeSet::new();
    let mut plain_dirs = std::collections::HashSet::new();
    for entry in &paths.paths {
        let path = &entry.relative_path;
        let shown = path.display().to_string();
        if path.is_absolute()
            || !path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(bad(&shown, "is declared outside the prefix"));
        }
        declared.insert(path.clone());
        check_entry_type(dir, entry, &mut plain_dirs).map_err(|reason| bad(&shown, &reason))?;
        check_content(dir, entry).map_err(|reason| bad(&shown, &reason))?;
    }
    check_all_declared(dir, &declared).map_err(|(entry, reason)| bad(&entry, &reason))
}

fn check_metadata_files(dir: &Path) -> Result<(), (String, String)> {
    let info = fs_err::symlink_metadata(dir.join("info"));
    if !info.is_ok_and(|m| m.is_dir()) {
        return Err(("info".into(), "is not a directory".into()));
    }
    for name in METADATA_FILES {
        if let Ok(meta) = fs_err::symlink_metadata(dir.join(name))
            && !meta.is_file()
        {
            return Err((name.to_string(), "is not a plain file".into()));
        }
    }
    Ok(())
}

/// The archive's `info/index.json` must name the package its record names: rattler files the
/// package, and writes its `conda-meta` record, under the record's name.
fn check_identity(dir: &Path, record: &RepoDataRecord) -> Result<(), String> {
    use rattler_conda_types::package::{IndexJson, PackageFile};
    let index =
        IndexJson::from_package_directory(dir).map_err(|e| format!("cannot be read: {e}"))?;
    let ours = &record.package_record;
    let theirs = (
        index.name.as_normalized(),
        index.version.to_string(),
        &index.build,
    );
    let expected = (
        ours.name.as_normalized(),
        ours.version.to_string(),
        &ours.build,
    );
    if theirs != expected {
        return Err(format!(
            "names the package `{}-{}-{}`, but its record (repodata or lock) is for `{}-{}-{}`",
            theirs.0, theirs.1, theirs.2, expected.0, expected.1, expected.2
        ));
    }
    Ok(())
}

/// The entry is of the type paths.json declares, and every directory above it in the copy is
/// a real directory: rattler reads files through these paths (to copy them, or to replace a
/// placeholder) and must never be led out of the copy by a link.
fn check_entry_type(
    dir: &Path,
    entry: &rattler_conda_types::package::PathsEntry,
    plain_dirs: &mut std::collections::HashSet<PathBuf>,
) -> Result<(), String> {
    use rattler_conda_types::package::PathType;
    for parent in entry.relative_path.ancestors().skip(1) {
        if parent.as_os_str().is_empty() || plain_dirs.contains(parent) {
            break;
        }
        match fs_err::symlink_metadata(dir.join(parent)) {
            Ok(meta) if meta.is_dir() => {
                plain_dirs.insert(parent.to_path_buf());
            }
            // A declared file that is missing is reported by the linker, naming it.
            Err(_) => return Ok(()),
            Ok(_) => {
                return Err(format!(
                    "lies below `{}`, which is a link or a file in the package, not a directory",
                    parent.display()
                ));
            }
        }
    }
    let Ok(meta) = fs_err::symlink_metadata(dir.join(&entry.relative_path)) else {
        return Ok(());
    };
    let (expected, ok) = match entry.path_type {
        PathType::HardLink => ("a file", meta.is_file()),
        PathType::SoftLink => ("a symlink", meta.file_type().is_symlink()),
        PathType::Directory => ("a directory", meta.is_dir()),
    };
    if !ok {
        return Err(format!(
            "is declared as {expected} in info/paths.json, but the package holds something else there"
        ));
    }
    Ok(())
}

/// The sha256 paths.json declares, and the binary placeholder, of a declared file.
fn check_content(
    dir: &Path,
    entry: &rattler_conda_types::package::PathsEntry,
) -> Result<(), String> {
    use rattler_conda_types::package::{FileMode, PathType};
    if entry.path_type != PathType::HardLink {
        return Ok(());
    }
    let file = dir.join(&entry.relative_path);
    let Ok(meta) = fs_err::symlink_metadata(&file) else {
        return Ok(());
    };
    let placeholder = entry
        .prefix_placeholder
        .as_ref()
        .filter(|p| p.file_mode == FileMode::Binary)
        .map(|p| p.placeholder.as_bytes());
    if let Some(placeholder) = placeholder
        && placeholder.len() as u64 > meta.len()
    {
        return Err(format!(
            "declares a binary prefix placeholder of {} bytes, longer than the file itself ({} bytes)",
            placeholder.len(),
            meta.len()
        ));
    }
    if entry.sha256.is_none() && placeholder.is_none() {
        return Ok(());
    }
    let read = read_file(&file, placeholder).map_err(|e| e.to_string())?;
    if let Some(expected) = entry.sha256
        && read.sha256.as_slice() != expected.as_slice()
    {
        return Err("does not match the sha256 info/paths.json declares".into());
    }
    if let Some(placeholder) = placeholder
        && !read.found_placeholder
    {
        return Err(format!(
            "is marked for binary prefix replacement, but its placeholder `{}` is not in the file",
            String::from_utf8_lossy(placeholder)
        ));
    }
    Ok(())
}

/// Every payload entry of the copy is declared in paths.json.
fn check_all_declared(
    dir: &Path,
    declared: &std::collections::BTreeSet<PathBuf>,
) -> Result<(), (String, String)> {
    for entry in walkdir::WalkDir::new(dir).min_depth(1).follow_links(false) {
        let entry = entry.map_err(|e| ("(payload)".to_string(), e.to_string()))?;
        if entry.file_type().is_dir() {
            continue;
        }
        let relative = entry.path().strip_prefix(dir).expect("under the package");
        if relative.starts_with("info") || declared.contains(relative) {
            continue;
        }
        // rattler's cache keeps its own bookkeeping next to the payload.
        if relative.components().count() == 1 && relative.to_string_lossy().starts_with('.') {
            continue;
        }
        return Err((
            relative.display().to_string(),
            "is in the package but not declared in info/paths.json".into(),
        ));
    }
    Ok(())
}

struct FileRead {
    sha256: Sha256Hash,
    found_placeholder: bool,
}

/// Hashes a file and looks for `placeholder` in it, in one streaming pass (the tail of each
/// chunk is kept, so a placeholder across a chunk boundary is found).
fn read_file(path: &Path, placeholder: Option<&[u8]>) -> std::io::Result<FileRead> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file = fs_err::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut window: Vec<u8> = Vec::new();
    let mut found = placeholder.is_none_or(<[u8]>::is_empty);
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        if let (false, Some(needle)) = (found, placeholder) {
            window.extend_from_slice(&buf[..n]);
            found = window.windows(needle.len()).any(|w| w == needle);
            let keep = needle.len() - 1;
            if window.len() > keep {
                window.drain(..window.len() - keep);
            }
        }
    }
    Ok(FileRead {
        sha256: hasher.finalize(),
        found_placeholder: found,
    })
}

#[cfg(test)]
mod tests {
    use super::read_file;

    #[test]
    fn a_placeholder_across_chunks_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut bytes = vec![0u8; (1 << 20) - 3];
        bytes.extend_from_slice(b"/opt/placeholder\0tail");
        fs_err::write(&path, &bytes).unwrap();
        assert!(
            read_file(&path, Some(b"/opt/placeholder"))
                .unwrap()
                .found_placeholder
        );
        assert!(
            !read_file(&path, Some(b"/opt/elsewhere"))
                .unwrap()
                .found_placeholder
        );
    }
}
