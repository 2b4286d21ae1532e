//! `imgbuild::download::download_resumable`, the download other modules reuse, called
//! directly against [`RangeServer`]: what the build tests cannot set up through the CLI
//! (a server that drops every request, a complete partial file, two downloads of one file at
//! once, a server sending too much).

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use imgbuild::download::{DownloadError, DownloadProgress, Expected, download_resumable};
use rattler_digest::{Sha256, compute_bytes_digest};

use crate::servers::range::{Drops, RangeServer, Ranges};

const NAME: &str = "pkg-1.0-h0_0.tar.bz2";

/// `len` bytes that are not all alike (a repeated pattern would hide a misplaced range).
fn bytes(len: usize) -> Vec<u8> {
    crate::common::noise(0x2545_f491, len)
}

/// A file served as `/NAME`, and a cache directory to download it into.
struct Setup {
    served: tempfile::TempDir,
    cache: tempfile::TempDir,
    bytes: Vec<u8>,
}

impl Setup {
    fn new(len: usize) -> Setup {
        let served = tempfile::tempdir().unwrap();
        let bytes = bytes(len);
        fs_err::write(served.path().join(NAME), &bytes).unwrap();
        Setup {
            served,
            cache: tempfile::tempdir().unwrap(),
            bytes,
        }
    }

    fn serve(&self, ranges: Ranges, drops: Drops) -> RangeServer {
        RangeServer::serve(self.served.path().to_path_buf(), ranges, drops)
    }

    fn expected(&self) -> Expected {
        Expected {
            sha256: Some(compute_bytes_digest::<Sha256>(&self.bytes)),
            size: Some(self.bytes.len() as u64),
        }
    }

    fn dir(&self) -> &Path {
        self.cache.path()
    }

    fn partial(&self) -> PathBuf {
        let sha256 = hex::encode(compute_bytes_digest::<Sha256>(&self.bytes));
        self.dir().join(format!("{sha256}.partial"))
    }

    fn download(
        &self,
        server: &RangeServer,
        expected: Expected,
        progress: &dyn DownloadProgress,
    ) -> Result<tempfile::TempPath, DownloadError> {
        let url = url::Url::parse(&format!("{}{NAME}", server.url)).unwrap();
        let client = imgbuild::http::client().unwrap();
        runtime().block_on(download_resumable(
            &client,
            &url,
            self.dir(),
            NAME,
            expected,
            progress,
        ))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The running total of bytes received that the download last reported.
#[derive(Default)]
struct Received(AtomicU64);

impl DownloadProgress for Received {
    fn on_progress(&self, received: u64, _on_disk: u64, _total: Option<u64>) {
        self.0.store(received, Ordering::Relaxed);
    }
}

#[test]
fn retries_exhausted_keep_the_partial_file_for_the_next_call_to_resume() {
    let setup = Setup::new(64 * 1024);
    let len = setup.bytes.len();
    let dropping = setup.serve(Ranges::Honour, Drops::Always);
    let err = setup
        .download(&dropping, setup.expected(), &())
        .unwrap_err();
    // rattler's default policy: the first attempt and three retries, each resuming.
    assert!(
        matches!(err, DownloadError::Transfer { attempts: 4, .. }),
        "{err}"
    );
    assert!(err.to_string().contains(NAME), "{err}");
    let requests = dropping.requests_for(NAME);
    assert_eq!(requests.len(), 4, "{requests:#?}");
    let mut have = 0;
    for (i, request) in requests.iter().enumerate() {
        if i == 0 {
            assert_eq!(request.range, None);
        } else {
            assert_eq!(request.range, Some(format!("bytes={have}-")), "{request:?}");
            assert!(request.if_range.is_some(), "{request:?}");
            assert_eq!(request.status, 206);
        }
        have += request.sent;
    }
    let kept = fs_err::read(setup.partial()).unwrap();
    assert_eq!(kept.len(), have);
    assert_eq!(kept, setup.bytes[..have]);
    drop(dropping);

    // Another call (as a later process would), from another server of the same file: it
    // asks only for the rest, and counts only the bytes it received.
    let server = setup.serve(Ranges::Honour, Drops::Never);
    let received = Received::default();
    let file = setup
        .download(&server, setup.expected(), &received)
        .unwrap();
    assert_eq!(fs_err::read(&file).unwrap(), setup.bytes);
    assert!(file.file_name().unwrap().to_str().unwrap().ends_with(NAME));
    let requests = server.requests_for(NAME);
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0].range, Some(format!("bytes={have}-")));
    assert_eq!(requests[0].sent, len - have);
    assert_eq!(received.0.load(Ordering::Relaxed), (len - have) as u64);
    assert!(!setup.partial().exists());
}

#[test]
fn a_complete_partial_file_is_checked_without_a_request() {
    let setup = Setup::new(4096);
    fs_err::write(setup.partial(), &setup.bytes).unwrap();
    let server = setup.serve(Ranges::Honour, Drops::Never);
    let file = setup.download(&server, setup.expected(), &()).unwrap();
    assert_eq!(fs_err::read(&file).unwrap(), setup.bytes);
    assert!(server.requests_for(NAME).is_empty());
    assert!(!setup.partial().exists());
}

#[test]
fn two_downloads_of_one_file_at_once_take_turns() {
    let setup = Setup::new(4 << 20);
    let server = setup.serve(Ranges::Honour, Drops::Never);
    let url = url::Url::parse(&format!("{}{NAME}", server.url)).unwrap();
    let client = imgbuild::http::client().unwrap();
    let download = || download_resumable(&client, &url, setup.dir(), NAME, setup.expected(), &());
    let (a, b) = runtime().block_on(async { tokio::join!(download(), download()) });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.to_path_buf(), b.to_path_buf());
    assert_eq!(fs_err::read(&a).unwrap(), setup.bytes);
    assert_eq!(fs_err::read(&b).unwrap(), setup.bytes);
    // The second waited for the first's lock, found its file gone into place, and began
    // its own: never a range of the first's file.
    let requests = server.requests_for(NAME);
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert!(requests.iter().all(|r| r.range.is_none()), "{requests:#?}");
    assert!(!setup.partial().exists());
}

#[test]
fn a_server_sending_more_than_the_expected_size_is_cut_off() {
    let setup = Setup::new(4096);
    let server = setup.serve(Ranges::Honour, Drops::Never);
    let expected = Expected {
        size: Some(1000),
        ..setup.expected()
    };
    let err = setup.download(&server, expected, &()).unwrap_err();
    assert!(matches!(err, DownloadError::Mismatch { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("more than the 1000 bytes expected"),
        "{err}"
    );
    assert!(!setup.partial().exists());
    assert_eq!(server.requests_for(NAME).len(), 1);
}

#[test]
fn without_a_sha256_a_partial_file_of_an_earlier_process_is_not_trusted() {
    let setup = Setup::new(4096);
    let server = setup.serve(Ranges::Honour, Drops::Never);
    let expected = Expected {
        sha256: None,
        size: Some(setup.bytes.len() as u64),
    };
    // Whatever an earlier process left under the URL's name.
    let first = setup.download(&server, expected, &()).unwrap();
    drop(first);
    let partial = fs_err::read_dir(setup.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "partial"));
    assert_eq!(partial, None, "a finished download leaves no partial file");
    let name = {
        // The name is `url-<sha256 of the URL>.partial`.
        let url = format!("{}{NAME}", server.url);
        format!(
            "url-{}.partial",
            hex::encode(compute_bytes_digest::<Sha256>(url.as_bytes()))
        )
    };
    fs_err::write(setup.dir().join(&name), vec![b'x'; 100]).unwrap();
    let file = setup.download(&server, expected, &()).unwrap();
    assert_eq!(fs_err::read(&file).unwrap(), setup.bytes);
    let requests = server.requests_for(NAME);
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r.range.is_none()), "{requests:#?}");
}

/// A server that cannot continue the partial file (416) or continues it from the wrong byte
/// (a 206 from byte 0): the partial file is dropped and the file fetched whole, at once and
/// not as a retry.
#[test]
fn a_refused_or_misplaced_range_starts_over() {
    for ranges in [Ranges::Refuse, Ranges::FromZero] {
        let setup = Setup::new(4096);
        let half = setup.bytes.len() / 2;
        fs_err::write(setup.partial(), &setup.bytes[..half]).unwrap();
        let server = setup.serve(ranges, Drops::Never);
        let file = setup.download(&server, setup.expected(), &()).unwrap();
        assert_eq!(fs_err::read(&file).unwrap(), setup.bytes, "{ranges:?}");
        let requests = server.requests_for(NAME);
        assert_eq!(requests.len(), 2, "{ranges:?}: {requests:#?}");
        assert_eq!(requests[0].range, Some(format!("bytes={half}-")));
        let status = if ranges == Ranges::Refuse { 416 } else { 206 };
        assert_eq!(requests[0].status, status);
        assert_eq!(requests[1].range, None);
        assert_eq!(requests[1].status, 200);
        assert!(!setup.partial().exists());
    }
}
