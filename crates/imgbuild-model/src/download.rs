//! Resumable, verified downloads into a cache directory.
//!
//! The bytes go to `<dir>/<sha256>.partial`, named after what the finished file must hash
//! to, so that a failed attempt, or a later process after a crash, a kill or a network drop,
//! continues where the last one stopped (`Range: bytes=N-`, with `If-Range` when the server
//! gave a validator, so a file changed on the server restarts instead of being spliced). A
//! partial file proves nothing by itself: the finished file is checked against the expected
//! size and sha256 before it is handed out, and one that does not match is deleted. An
//! advisory lock (flock, released by the kernel however the process ends) on the partial
//! file keeps two processes, or two tasks, from writing it at once.

use std::{
    io,
    path::{Path, PathBuf},
    time::SystemTime,
};

use rattler_digest::Sha256Hash;
use rattler_networking::LazyClient;
use reqwest::{StatusCode, header};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use url::Url;

use crate::http::error_chain;

/// What the downloaded file must be.
#[derive(Debug, Clone, Copy)]
pub struct Expected {
    /// Names the partial file and is checked at the end. Without it a partial file left by
    /// an earlier process cannot be trusted, so it is started over (a transfer that drops
    /// in this process still resumes).
    pub sha256: Option<Sha256Hash>,
    pub size: Option<u64>,
}

/// The most bytes a download whose size nobody gave may have (a wheel pinned only by its
/// sha256): the largest wheels on real indexes are a few GB, and an endless answer must end
/// before the disk does.
pub(crate) const MAX_UNSIZED_BYTES: u64 = 16 << 30;

/// Sets another bound for downloads of unknown size (bytes): for an index of wheels larger
/// than [`MAX_UNSIZED_BYTES`], or a test that cannot wait for 16 GiB.
pub const MAX_UNSIZED_ENV: &str = "IMGBUILD_MAX_UNSIZED_DOWNLOAD";

impl Expected {
    /// The size, or the bound on a download of unknown size.
    fn most_bytes(&self) -> u64 {
        self.size.unwrap_or_else(unsized_bound)
    }
}

/// [`MAX_UNSIZED_BYTES`], or the bound [`MAX_UNSIZED_ENV`] sets when it is a positive
/// integer (anything else is warned of by the command line, as every limit is).
pub fn unsized_bound() -> u64 {
    crate::compression::bounded::env_u64(MAX_UNSIZED_ENV).unwrap_or(MAX_UNSIZED_BYTES)
}

/// Told how a download goes.
pub trait DownloadProgress: Send + Sync {
    /// `received`: body bytes that arrived over the network in this call so far, across
    /// attempts (a running total: bytes resumed from a partial file are not counted again);
    /// `on_disk` of `total` bytes of the file are now written.
    fn on_progress(&self, received: u64, on_disk: u64, total: Option<u64>);
}

impl DownloadProgress for () {
    fn on_progress(&self, _received: u64, _on_disk: u64, _total: Option<u64>) {}
}

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("`{url}` could not be downloaded ({attempts} attempts): {reason}")]
    Transfer {
        url: Url,
        attempts: u32,
        reason: String,
    },
    #[error("`{url}` {reason}")]
    Mismatch { url: Url, reason: String },
    #[error("`{}` {action}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_error(path: &Path, action: &'static str) -> impl FnOnce(io::Error) -> DownloadError {
    let path = path.to_path_buf();
    move |source| DownloadError::Io {
        path,
        action,
        source,
    }
}

/// Downloads `url` into `dir`, resuming a partial download of the same file (by this or an
/// earlier process) and retrying failed attempts with rattler's default policy (a resumed
/// attempt counts as a retry). Returns the checked file, named `.download-XXXX-<file_name>`
/// in `dir` and removed when dropped unless the caller persists it.
pub async fn download_resumable(
    client: &LazyClient,
    url: &Url,
    dir: &Path,
    file_name: &str,
    expected: Expected,
    progress: &dyn DownloadProgress,
) -> Result<tempfile::TempPath, DownloadError> {
    use rattler_networking::retry_policies::{RetryDecision, RetryPolicy};
    fs_err::create_dir_all(dir).map_err(io_error(dir, "cannot be created"))?;
    let path = dir.join(partial_name(url, expected.sha256.as_ref()));
    let mut partial = Partial::open_locked(&path).await?;
    if expected.sha256.is_none() && partial.len().await? > 0 {
        tracing::debug!("{url}: no sha256 to check a partial download against; starting over");
        partial.truncate().await?;
    }
    let policy = rattler_networking::retry_policies::default_retry_policy();
    let started = SystemTime::now();
    let mut retries = 0;
    let mut session = Session {
        validator: None,
        received: 0,
    };
    loop {
        let reason =
            match attempt(client, url, &mut partial, expected, &mut session, progress).await {
                Ok(()) => break,
                Err(AttemptFailure::Fatal(err)) => return Err(err),
                // Nothing failed, the file just cannot be continued: deleted and fetched again at
                // once, not as a retry (a fresh transfer never starts over this way, so this
                // cannot loop).
                Err(AttemptFailure::StartOver(reason)) => {
                    tracing::debug!("{url}: {reason}; starting over");
                    partial.discard().await?;
                    continue;
                }
                Err(AttemptFailure::Transfer(reason)) => reason,
            };
        // What reached the disk stays for the next attempt to resume from.
        let _ = partial.file.flush().await;
        match policy.should_retry(started, retries) {
            RetryDecision::Retry { execute_after } => {
                tracing::debug!("{url}: {reason}; retrying");
                let wait = execute_after
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tokio::time::sleep(wait).await;
                retries += 1;
            }
            RetryDecision::DoNotRetry => {
                return Err(DownloadError::Transfer {
                    url: url.clone(),
                    attempts: retries + 1,
                    reason,
                });
            }
        }
    }
    let temp = tempfile::Builder::new()
        .prefix(".download-")
        // Extractors tell the format by the file name's ending.
        .suffix(&format!("-{file_name}"))
        .tempfile_in(dir)
        .map_err(io_error(dir, "cannot hold a new file"))?
        .into_temp_path();
    // Still under the lock: a process waiting for it sees the file gone and starts anew.
    fs_err::rename(&partial.path, &temp).map_err(io_error(&partial.path, "cannot be renamed"))?;
    Ok(temp)
}

/// `<sha256>.partial`; without a sha256, named after the URL (and never trusted across
/// processes, see [`Expected::sha256`]).
fn partial_name(url: &Url, sha256: Option<&Sha256Hash>) -> String {
    match sha256 {
        Some(sha256) => format!("{}.partial", hex::encode(sha256)),
        None => format!(
            "url-{}.partial",
            hex::encode(Sha256::digest(url.as_str().as_bytes()))
        ),
    }
}

/// Why one attempt did not finish the file.
enum AttemptFailure {
    /// The connection or the server failed: retried by the policy, resuming.
    Transfer(String),
    /// What is on disk cannot be continued: deleted, and fetched again from the start.
    StartOver(String),
    Fatal(DownloadError),
}

/// What lasts from one attempt to the next within one call.
struct Session {
    /// The `ETag` (strong only) or `Last-Modified` of the full response the file began with,
    /// sent as `If-Range` so a changed file comes back whole instead of as a range.
    validator: Option<header::HeaderValue>,
    received: u64,
}

async fn attempt(
    client: &LazyClient,
    url: &Url,
    partial: &mut Partial,
    expected: Expected,
    session: &mut Session,
    progress: &dyn DownloadProgress,
) -> Result<(), AttemptFailure> {
    let mut offset = partial.len().await.map_err(AttemptFailure::Fatal)?;
    if let Some(size) = expected.size
        && offset > size
    {
        return Err(AttemptFailure::StartOver(format!(
            "the partial download is {offset} bytes, longer than the {size} expected"
        )));
    }
    partial
        .catch_up_hash()
        .await
        .map_err(AttemptFailure::Fatal)?;
    // Whether every byte on disk came from one response in this attempt: then a mismatch is
    // the server's file, and fetching it again would only fetch it again.
    let mut fresh = offset == 0;
    if expected.size != Some(offset) || offset == 0 {
        let mut request = client.client().get(url.clone());
        if offset > 0 {
            request = request.header(header::RANGE, format!("bytes={offset}-"));
            if let Some(validator) = &session.validator {
                request = request.header(header::IF_RANGE, validator.clone());
            }
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| AttemptFailure::Transfer(error_chain(&e)))?;
        let content_range = response
            .headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok());
        match decide(offset, response.status(), content_range) {
            Decision::Append => {
                tracing::debug!("{url}: resuming at byte {offset}");
            }
            Decision::Whole => {
                if offset > 0 {
                    tracing::debug!("{url}: the server sent the whole file; starting over");
                    partial.truncate().await.map_err(AttemptFailure::Fatal)?;
                    offset = 0;
                    fresh = true;
                }
                session.validator = validator(response.headers());
            }
            Decision::StartOver(reason) => return Err(AttemptFailure::StartOver(reason)),
            Decision::Fail(reason) => return Err(AttemptFailure::Transfer(reason)),
        }
        let total = expected
            .size
            .or_else(|| response.content_length().map(|n| offset.saturating_add(n)));
        partial
            .file
            .seek(io::SeekFrom::Start(offset))
            .await
            .map_err(|e| AttemptFailure::Fatal(partial.io("cannot be written", e)))?;
        let mut on_disk = offset;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| AttemptFailure::Transfer(error_chain(&e)))?
        {
            let n = chunk.len() as u64;
            if on_disk + n > expected.most_bytes() {
                // A server sending more than the file can hold is not sending this file.
                let reason = match expected.size {
                    Some(size) => format!("sent more than the {size} bytes expected"),
                    None => format!(
                        "sent more than {} bytes, the most a download of unknown size may have ({MAX_UNSIZED_ENV} sets another bound)",
                        unsized_bound()
                    ),
                };
                return Err(mismatch(url, partial, fresh, reason).await);
            }
            partial
                .file
                .write_all(&chunk)
                .await
                .map_err(|e| AttemptFailure::Fatal(partial.io("cannot be written", e)))?;
            partial.hasher.update(&chunk);
            partial.hashed += n;
            on_disk += n;
            session.received += n;
            progress.on_progress(session.received, on_disk, total);
        }
        partial
            .file
            .flush()
            .await
            .map_err(|e| AttemptFailure::Fatal(partial.io("cannot be written", e)))?;
    }
    let len = partial.hashed;
    if let Some(size) = expected.size
        && len != size
    {
        let reason = format!("is {len} bytes, but {size} were expected");
        return Err(mismatch(url, partial, fresh, reason).await);
    }
    if let Some(sha256) = expected.sha256 {
        let actual = partial.hasher.clone().finalize();
        if actual != sha256 {
            let reason = format!(
                "has sha256 {}, but {} was expected",
                hex::encode(actual),
                hex::encode(sha256)
            );
            return Err(mismatch(url, partial, fresh, reason).await);
        }
    }
    Ok(())
}

/// A finished file that is not the expected one: a resumed one starts over, a fresh one is
/// the server's file and an error; either way the partial file goes.
#[allow(
    clippy::disallowed_methods,
    reason = "its error is wrapped with the path already; fs-err would name it twice"
)]
async fn mismatch(url: &Url, partial: &mut Partial, fresh: bool, reason: String) -> AttemptFailure {
    if !fresh {
        return AttemptFailure::StartOver(format!("the resumed download {reason}"));
    }
    // Removed under the lock, which goes with the handle when the caller returns.
    if let Err(err) = std::fs::remove_file(&partial.path) {
        return AttemptFailure::Fatal(partial.io("cannot be deleted", err));
    }
    AttemptFailure::Fatal(DownloadError::Mismatch {
        url: url.clone(),
        reason: format!("{reason} (the partial download was deleted)"),
    })
}

/// What to do with a response to a request for the file from byte `offset` (with a `Range`
/// header when `offset > 0`).
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// The body continues the file at `offset`.
    Append,
    /// The body is the whole file (the server ignored `Range`, or `If-Range` did not match).
    Whole,
    /// The body cannot be used and the file on disk cannot be continued.
    StartOver(String),
    /// A failed response: retry.
    Fail(String),
}

fn decide(offset: u64, status: StatusCode, content_range: Option<&str>) -> Decision {
    match status {
        StatusCode::OK => Decision::Whole,
        StatusCode::PARTIAL_CONTENT if offset > 0 => match content_range.map(ContentRange::parse) {
            Some(Some(range)) if range.first == offset => Decision::Append,
            Some(Some(range)) => Decision::StartOver(format!(
                "the server resumed at byte {} instead of {offset}",
                range.first
            )),
            _ => Decision::StartOver(format!(
                "the server answered a range without a usable Content-Range ({})",
                content_range.unwrap_or("none")
            )),
        },
        StatusCode::RANGE_NOT_SATISFIABLE if offset > 0 => {
            Decision::StartOver(format!("the server cannot resume at byte {offset} (416)"))
        }
        status => Decision::Fail(format!("HTTP status {status}")),
    }
}

/// A `Content-Range: bytes first-last/complete` header (RFC 9110 §14.4); `complete` may be
/// unknown (`*`).
#[derive(Debug, PartialEq, Eq)]
struct ContentRange {
    first: u64,
    last: u64,
    complete: Option<u64>,
}

impl ContentRange {
    fn parse(value: &str) -> Option<ContentRange> {
        let (unit, rest) = value.trim().split_once(' ')?;
        if !unit.eq_ignore_ascii_case("bytes") {
            return None;
        }
        let (range, complete) = rest.trim().split_once('/')?;
        let (first, last) = range.split_once('-')?;
        let number = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        let (first, last) = (number(first)?, number(last)?);
        let complete = match complete {
            "*" => None,
            n => Some(number(n)?),
        };
        let valid = first <= last && complete.is_none_or(|c| last < c);
        valid.then_some(ContentRange {
            first,
            last,
            complete,
        })
    }
}

/// A strong `ETag`, else `Last-Modified` (a weak `ETag` is not allowed in `If-Range`).
fn validator(headers: &header::HeaderMap) -> Option<header::HeaderValue> {
    headers
        .get(header::ETAG)
        .filter(|etag| !etag.as_bytes().starts_with(b"W/"))
        .or_else(|| headers.get(header::LAST_MODIFIED))
        .cloned()
}

/// The partial file, locked, and the hash of the bytes written to it so far.
struct Partial {
    path: PathBuf,
    file: tokio::fs::File,
    hasher: Sha256,
    /// How many of the file's bytes `hasher` has seen.
    hashed: u64,
}

impl Partial {
    /// Opens (or creates) `path` and locks it, waiting while another process holds it.
    #[allow(
        clippy::disallowed_methods,
        reason = "the partial file is a std::fs::File; the error is wrapped with the path"
    )]
    async fn open_locked(path: &Path) -> Result<Partial, DownloadError> {
        let failed = |action| io_error(path, action);
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(failed("cannot be opened"))?;
            let file = match file.try_lock() {
                Ok(()) => file,
                Err(std::fs::TryLockError::WouldBlock) => {
                    tracing::info!(
                        "waiting for another download of the same file ({})",
                        path.display()
                    );
                    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
                        .await
                        .map_err(io::Error::other)
                        .flatten()
                        .map_err(failed("cannot be locked"))?
                }
                Err(std::fs::TryLockError::Error(e)) => Err(failed("cannot be locked")(e))?,
            };
            // The holder may have finished (renamed the file into place) or deleted it while
            // we waited: then our handle is to a file no longer at `path`.
            if still_at(&file, path) {
                return Ok(Partial {
                    path: path.to_path_buf(),
                    file: tokio::fs::File::from_std(file),
                    hasher: Sha256::new(),
                    hashed: 0,
                });
            }
        }
    }

    fn io(&self, action: &'static str, source: io::Error) -> DownloadError {
        DownloadError::Io {
            path: self.path.clone(),
            action,
            source,
        }
    }

    async fn len(&self) -> Result<u64, DownloadError> {
        self.file
            .metadata()
            .await
            .map(|m| m.len())
            .map_err(|e| self.io("cannot be read", e))
    }

    async fn truncate(&mut self) -> Result<(), DownloadError> {
        self.file
            .set_len(0)
            .await
            .map_err(|e| self.io("cannot be truncated", e))?;
        self.hasher = Sha256::new();
        self.hashed = 0;
        Ok(())
    }

    /// Deletes the file and opens a new, empty one under the same name (still locked: the
    /// file is removed while its lock is held, so a waiting process opens it anew).
    async fn discard(&mut self) -> Result<(), DownloadError> {
        fs_err::remove_file(&self.path).map_err(io_error(&self.path, "cannot be deleted"))?;
        *self = Partial::open_locked(&self.path).await?;
        Ok(())
    }

    /// Hashes what the file holds beyond what was hashed: all of it when it was left by an
    /// earlier process, or again when a failed write left it other than the hash saw.
    async fn catch_up_hash(&mut self) -> Result<(), DownloadError> {
        let len = self.len().await?;
        if len == self.hashed {
            return Ok(());
        }
        let path = self.path.clone();
        let (hasher, hashed) = tokio::task::spawn_blocking(move || hash_file(&path))
            .await
            .map_err(io::Error::other)
            .flatten()
            .map_err(|e| self.io("cannot be read", e))?;
        self.hasher = hasher;
        self.hashed = hashed;
        Ok(())
    }
}

fn hash_file(path: &Path) -> io::Result<(Sha256, u64)> {
    let mut file = fs_err::File::open(path)?;
    let mut hasher = Sha256::new();
    let hashed = io::copy(&mut file, &mut HashWriter(&mut hasher))?;
    Ok((hasher, hashed))
}

struct HashWriter<'a>(&'a mut Sha256);

impl io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(unix)]
fn still_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs_err::metadata(path)) {
        (Ok(ours), Ok(there)) => ours.dev() == there.dev() && ours.ino() == there.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_at(_file: &std::fs::File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_is_parsed() {
        assert_eq!(
            ContentRange::parse("bytes 100-999/1000"),
            Some(ContentRange {
                first: 100,
                last: 999,
                complete: Some(1000)
            })
        );
        assert_eq!(
            ContentRange::parse("bytes 5-9/*"),
            Some(ContentRange {
                first: 5,
                last: 9,
                complete: None
            })
        );
        assert_eq!(ContentRange::parse("BYTES 0-0/1").map(|r| r.first), Some(0));
    }

    #[test]
    fn bad_content_ranges_are_refused() {
        for value in [
            "",
            "bytes",
            "bytes */1000",
            "bytes 10-5/1000",
            "bytes 0-1000/1000",
            "bytes -1-5/10",
            "bytes +1-5/10",
            "items 0-5/10",
            "bytes 0-5",
            "bytes 0-99999999999999999999999/*",
        ] {
            assert_eq!(ContentRange::parse(value), None, "{value:?}");
        }
    }

    #[test]
    fn responses_decide_append_or_start_over() {
        let range = |v| decide(100, StatusCode::PARTIAL_CONTENT, Some(v));
        assert_eq!(range("bytes 100-199/200"), Decision::Append);
        assert_eq!(range("bytes 100-199/*"), Decision::Append);
        assert!(matches!(range("bytes 0-199/200"), Decision::StartOver(_)));
        assert!(matches!(range("nonsense"), Decision::StartOver(_)));
        assert!(matches!(
            decide(100, StatusCode::PARTIAL_CONTENT, None),
            Decision::StartOver(_)
        ));
        // A server that ignores Range, or an If-Range that did not match: the whole file.
        assert_eq!(decide(100, StatusCode::OK, None), Decision::Whole);
        assert_eq!(decide(0, StatusCode::OK, None), Decision::Whole);
        assert!(matches!(
            decide(100, StatusCode::RANGE_NOT_SATISFIABLE, None),
            Decision::StartOver(_)
        ));
        // Without a Range sent, a 206 or 416 is the server's failure: retried, never a loop
        // of starting over.
        assert!(matches!(
            decide(0, StatusCode::PARTIAL_CONTENT, Some("bytes 0-9/10")),
            Decision::Fail(_)
        ));
        assert!(matches!(
            decide(0, StatusCode::RANGE_NOT_SATISFIABLE, None),
            Decision::Fail(_)
        ));
        assert!(matches!(
            decide(100, StatusCode::INTERNAL_SERVER_ERROR, None),
            Decision::Fail(_)
        ));
    }

    #[test]
    fn if_range_uses_a_strong_etag_else_last_modified() {
        let mut headers = header::HeaderMap::new();
        assert_eq!(validator(&headers), None);
        headers.insert(
            header::LAST_MODIFIED,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        headers.insert(header::ETAG, "W/\"weak\"".parse().unwrap());
        assert_eq!(
            validator(&headers).unwrap(),
            "Wed, 21 Oct 2015 07:28:00 GMT"
        );
        headers.insert(header::ETAG, "\"strong\"".parse().unwrap());
        assert_eq!(validator(&headers).unwrap(), "\"strong\"");
    }

    #[test]
    fn partial_files_are_named_after_the_sha256() {
        let url = Url::parse("http://example.org/a.conda").unwrap();
        let sha256 = Sha256::digest(b"archive");
        assert_eq!(
            partial_name(&url, Some(&sha256)),
            format!("{}.partial", hex::encode(sha256))
        );
        assert!(partial_name(&url, None).starts_with("url-"));
    }

    #[tokio::test]
    async fn a_second_open_waits_for_the_first_and_sees_a_renamed_file_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.partial");
        let first = Partial::open_locked(&path).await.unwrap();
        let waiting = tokio::spawn({
            let path = path.clone();
            async move { Partial::open_locked(&path).await.unwrap() }
        });
        tokio::task::yield_now().await;
        fs_err::write(&path, b"done").unwrap();
        fs_err::rename(&path, dir.path().join("finished")).unwrap();
        drop(first);
        let second = waiting.await.unwrap();
        // A new, empty file: not the one the first renamed into place.
        assert_eq!(second.len().await.unwrap(), 0);
        assert_eq!(fs_err::read(dir.path().join("finished")).unwrap(), b"done");
    }
}
