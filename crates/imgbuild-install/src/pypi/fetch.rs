//! Wheels in the cache: `<cache>/wheels/<sha256>.whl`, named after their content, written
//! only once checked. A wheel is downloaded once for every image and platform that uses it.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use rattler_digest::Sha256Hash;
use rattler_networking::LazyClient;
use url::Url;

use crate::{
    download::{DownloadError, DownloadProgress, Expected, download_resumable},
    report::{Progress, Reporter},
};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("Failed to download `{file}`")]
    Download {
        file: String,
        #[source]
        source: Box<DownloadError>,
    },
    #[error("`{file}` does not match its pinned sha256: expected {expected}, got {actual}")]
    Mismatch {
        file: String,
        expected: String,
        actual: String,
    },
    #[error("Failed to store `{}` in the wheel cache", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn cached_path(cache_dir: &Path, sha256: &Sha256Hash) -> PathBuf {
    cache_dir
        .join("wheels")
        .join(format!("{}.whl", hex::encode(sha256)))
}

/// The wheel at `url` in the cache, downloaded (or copied, for `file://`) when missing, and
/// its sha256: `sha256` when given (and then checked), else computed. `reporter` is told
/// of the bytes as they arrive and of the wheel once it is fetched (not when it was cached).
pub async fn fetch_wheel(
    client: &LazyClient,
    cache_dir: &Path,
    url: &Url,
    file: &str,
    sha256: Option<Sha256Hash>,
    reporter: &dyn Reporter,
) -> Result<(PathBuf, Sha256Hash), FetchError> {
    if let Some(sha256) = &sha256 {
        let path = cached_path(cache_dir, sha256);
        if path.is_file() {
            return Ok((path, *sha256));
        }
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    let wheels = cache_dir.join("wheels");
    fs_err::create_dir_all(&wheels).map_err(io(&wheels))?;
    let fetched: tempfile::TempPath = if url.scheme() == "file" {
        let source = url.to_file_path().map_err(|()| FetchError::Io {
            path: PathBuf::from(url.path()),
            source: std::io::Error::other("not a local path"),
        })?;
        let mut temp = tempfile::NamedTempFile::new_in(&wheels).map_err(io(&wheels))?;
        let copied = copy_local(&source, temp.as_file_mut()).map_err(io(&source))?;
        reporter.on_progress(Progress::PypiBytes(copied));
        temp.into_temp_path()
    } else {
        download_resumable(
            client,
            url,
            &cache_dir.join("downloads"),
            file,
            Expected { sha256, size: None },
            &WheelBytes {
                reporter,
                seen: AtomicU64::new(0),
            },
        )
        .await
        .map_err(|source| FetchError::Download {
            file: file.to_string(),
            source: Box::new(source),
        })?
    };
    let actual = rattler_digest::compute_file_digest::<rattler_digest::Sha256>(&fetched)
        .map_err(io(&fetched))?;
    if let Some(expected) = sha256
        && expected != actual
    {
        return Err(FetchError::Mismatch {
            file: file.to_string(),
            expected: hex::encode(expected),
            actual: hex::encode(actual),
        });
    }
    let path = cached_path(cache_dir, &actual);
    // Another build may have put the same bytes there meanwhile: either copy is right.
    let bytes = fs_err::metadata(&fetched).map_or(0, |m| m.len());
    fetched.persist(&path).map_err(|e| FetchError::Io {
        path: path.clone(),
        source: e.error,
    })?;
    reporter.on_progress(Progress::PypiWheel {
        file,
        bytes,
        local: url.scheme() == "file",
    });
    Ok((path, actual))
}

/// Hands a wheel download's running total of bytes received to the reporter as deltas.
struct WheelBytes<'a> {
    reporter: &'a dyn Reporter,
    seen: AtomicU64,
}

impl DownloadProgress for WheelBytes<'_> {
    fn on_progress(&self, received: u64, _on_disk: u64, _total: Option<u64>) {
        let before = self.seen.fetch_max(received, Ordering::SeqCst);
        if received > before {
            self.reporter
                .on_progress(Progress::PypiBytes(received - before));
        }
    }
}

/// Copies the local wheel `source` into `to`: a regular file (a fifo would wait, a device
/// never end), at most the bound on downloads of unknown size.
fn copy_local(source: &Path, to: &mut std::fs::File) -> std::io::Result<u64> {
    use std::io::Read;
    let max = crate::download::unsized_bound();
    let file = crate::fs::open_input(source, max).map_err(std::io::Error::other)?;
    let copied = std::io::copy(&mut file.take(max + 1), to)?;
    if copied > max {
        return Err(std::io::Error::other(format!(
            "it grew past {max} bytes while it was copied"
        )));
    }
    Ok(copied)
}
