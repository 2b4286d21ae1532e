//! An HTTP/1.1 file server on 127.0.0.1 for download tests: it answers `Range: bytes=N-`
//! with 206 and a `Content-Range` (honouring `If-Range` against its strong `ETag`), or
//! ignores `Range` like a server without range support; it can drop the connection half way
//! through the body of the first request for each package archive; and it logs what every
//! request asked for and how many body bytes it sent.

use std::{
    collections::HashSet,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use crate::support::hostile::sha256_hex;

/// How the server answers `Range: bytes=N-`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ranges {
    /// 206 from byte N with its `Content-Range` (or 200 when `If-Range` does not match).
    Honour,
    /// As a server without range support: 200 and the whole file.
    Ignore,
    /// A broken server: 206 with the whole file, `Content-Range: bytes 0-…`.
    FromZero,
    /// 416 Range Not Satisfiable, whatever N.
    Refuse,
}

/// Which requests for a package archive (`.conda`, `.tar.bz2`) are dropped half way through
/// their body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drops {
    Never,
    /// The first request for each archive.
    First,
    /// Every one: a download can only make progress by resuming.
    Always,
    /// The first request for each archive sends half its body, then nothing more while the
    /// server lives: a download hangs there, for a test to kill the process mid-body.
    StallFirst,
}

/// One request as the server saw and answered it.
#[derive(Debug, Clone)]
pub(crate) struct Logged {
    pub path: String,
    pub range: Option<String>,
    pub if_range: Option<String>,
    pub status: u16,
    /// Body bytes written before the response ended (or the connection was dropped).
    pub sent: usize,
    pub dropped: bool,
}

#[derive(Default)]
struct Shared {
    log: Mutex<Vec<Logged>>,
    /// Archives already requested once (the drop applies to the first request only).
    seen: Mutex<HashSet<String>>,
}

pub(crate) struct RangeServer {
    pub url: String,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RangeServer {
    /// Serves files under `root`.
    pub(crate) fn serve(root: PathBuf, ranges: Ranges, drops: Drops) -> RangeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || {
                // Bounded: the server lives at most as long as the test that made it.
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (shared, root, stop) = (shared.clone(), root.clone(), stop.clone());
                            std::thread::spawn(move || {
                                let _ = handle(stream, &root, ranges, drops, &shared, &stop);
                            });
                        }
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    }
                }
            })
        };
        RangeServer {
            url,
            shared,
            stop,
            thread: Some(thread),
        }
    }

    /// The requests for paths ending with `suffix`, in the order they were answered.
    pub(crate) fn requests_for(&self, suffix: &str) -> Vec<Logged> {
        self.shared
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.path.ends_with(suffix))
            .cloned()
            .collect()
    }
}

impl Drop for RangeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn is_archive(path: &str) -> bool {
    path.ends_with(".conda") || path.ends_with(".tar.bz2")
}

fn handle(
    stream: TcpStream,
    root: &Path,
    ranges: Ranges,
    drops: Drops,
    shared: &Shared,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let (mut range, mut if_range) = (None, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = Some(value.trim().to_string());
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => range = value,
                "if-range" => if_range = value,
                _ => {}
            }
        }
    }
    let mut parts = request.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts
        .next()
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_string();
    let file = root.join(path.trim_start_matches('/'));
    let mut out = stream;
    let mut logged = Logged {
        path: path.clone(),
        range: range.clone(),
        if_range: if_range.clone(),
        status: 404,
        sent: 0,
        dropped: false,
    };
    let body = match fs_err::read(&file) {
        Ok(body) if !path.contains("..") && file.is_file() => body,
        _ => {
            shared.log.lock().unwrap().push(logged);
            write!(
                out,
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
            return out.flush();
        }
    };
    let etag = format!("\"{}\"", &sha256_hex(&body)[..16]);
    let len = body.len();
    // `bytes=N-` only: that is all imgbuild asks for.
    let start = range
        .as_deref()
        .filter(|_| ranges != Ranges::Ignore && method == "GET")
        .filter(|_| if_range.as_deref().is_none_or(|v| v == etag))
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok())
        .map(|n| match ranges {
            Ranges::FromZero => 0,
            Ranges::Refuse => len,
            _ => n,
        });
    let (status, extra, part) = match start {
        Some(n) if n >= len => {
            logged.status = 416;
            shared.log.lock().unwrap().push(logged);
            write!(
                out,
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
            return out.flush();
        }
        Some(n) => (
            "206 Partial Content",
            format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1),
            &body[n..],
        ),
        None => ("200 OK", String::new(), &body[..]),
    };
    logged.status = status[..3].parse().unwrap();
    // Every request is logged before its last byte goes out: the client may act on the
    // answer (and the test read the log) the moment it has it.
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nETag: {etag}\r\nAccept-Ranges: {}\r\n{extra}Connection: close\r\n\r\n",
        part.len(),
        if ranges == Ranges::Ignore {
            "none"
        } else {
            "bytes"
        },
    );
    if method == "HEAD" {
        shared.log.lock().unwrap().push(logged);
        out.write_all(head.as_bytes())?;
        return out.flush();
    }
    let first = is_archive(&path) && shared.seen.lock().unwrap().insert(path.clone());
    let drop = match drops {
        Drops::Never => false,
        Drops::First | Drops::StallFirst => first,
        Drops::Always => is_archive(&path),
    };
    if drop {
        let half = part.len() / 2;
        logged.sent = half;
        logged.dropped = true;
        shared.log.lock().unwrap().push(logged);
        out.write_all(head.as_bytes())?;
        out.write_all(&part[..half])?;
        out.flush()?;
        // A stalled connection stays open, silent, until the server stops.
        while drops == Drops::StallFirst && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Dropping the stream closes the connection with the body half sent.
        return Ok(());
    }
    logged.sent = part.len();
    shared.log.lock().unwrap().push(logged);
    out.write_all(head.as_bytes())?;
    out.write_all(part)?;
    out.flush()
}
