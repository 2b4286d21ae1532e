//! An HTTP proxy for fault injection between imgbuild and the registry: it answers 500 to
//! or drops the connection of a fixed share of requests, and can play a registry that is
//! down. One request per connection (it answers `Connection: close`), forwarded as is, so
//! the registry builds its `Location`s from the proxy's address.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
};

#[derive(Default)]
pub(crate) struct Counters {
    pub requests: AtomicUsize,
    pub errors_500: AtomicUsize,
    pub dropped: AtomicUsize,
    pub forwarded: AtomicUsize,
}

pub(crate) struct FaultProxy {
    pub host: String,
    pub counters: Arc<Counters>,
    /// While set, every connection is dropped: the registry is down.
    pub down: Arc<AtomicBool>,
    /// Once this many requests were forwarded, the registry goes down (by itself, so a
    /// test does not race the push it watches).
    pub down_after: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Answers 500 to every `error_every`-th request and drops every `drop_every`-th
    /// connection (0 turns a fault off).
    pub(crate) fn start(upstream: &str, error_every: usize, drop_every: usize) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let counters = Arc::new(Counters::default());
        let down = Arc::new(AtomicBool::new(false));
        let down_after = Arc::new(AtomicUsize::new(usize::MAX));
        let stop = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let thread = {
            let (counters, down, down_after, stop) = (
                counters.clone(),
                down.clone(),
                down_after.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        continue;
                    };
                    let (counters, down, down_after, upstream) = (
                        counters.clone(),
                        down.clone(),
                        down_after.clone(),
                        upstream.clone(),
                    );
                    std::thread::spawn(move || {
                        if counters.forwarded.load(Ordering::Relaxed)
                            >= down_after.load(Ordering::Relaxed)
                        {
                            down.store(true, Ordering::Relaxed);
                        }
                        let _ =
                            handle(client, &upstream, &counters, &down, error_every, drop_every);
                    });
                }
            })
        };
        FaultProxy {
            host,
            counters,
            down,
            down_after,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn handle(
    client: TcpStream,
    upstream: &str,
    counters: &Counters,
    down: &AtomicBool,
    error_every: usize,
    drop_every: usize,
) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = String::new();
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().unwrap_or(0);
            }
            if name.eq_ignore_ascii_case("connection") {
                continue;
            }
        }
        if line == "\r\n" {
            head.push_str("Connection: close\r\n\r\n");
            break;
        }
        head.push_str(&line);
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body)?;
    let n = counters.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let mut client = client;
    if down.load(Ordering::Relaxed) || (drop_every > 0 && n.is_multiple_of(drop_every)) {
        counters.dropped.fetch_add(1, Ordering::Relaxed);
        return client.shutdown(std::net::Shutdown::Both);
    }
    if error_every > 0 && n.is_multiple_of(error_every) {
        counters.errors_500.fetch_add(1, Ordering::Relaxed);
        return client.write_all(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
    let mut server = TcpStream::connect(upstream)?;
    server.write_all(head.as_bytes())?;
    server.write_all(&body)?;
    let mut response = Vec::new();
    server.read_to_end(&mut response)?;
    counters.forwarded.fetch_add(1, Ordering::Relaxed);
    client.write_all(&response)
}
