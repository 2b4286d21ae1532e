//! An HTTP/1.1 server on a loopback address whose every answer a test scripts: a handler
//! gets each request (method, target, headers) and returns the reply, whose body may be
//! bytes, endless, or dripped a byte at a time, with any `Content-Length` it likes. It
//! records every request it got, headers included, so a test can show what a client sent
//! (or did not send) where. One request per connection (`Connection: close`).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

/// One request as the server read it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The value of header `name` (any case), if sent.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path without the query.
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
}

/// A reply's body.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Bytes(Vec<u8>),
    /// `prefix`, then `x` for as long as the client reads.
    Endless {
        prefix: Vec<u8>,
    },
    /// `prefix`, then one `x` every `every`, for as long as the client reads.
    Drip {
        prefix: Vec<u8>,
        every: Duration,
    },
}

/// A scripted reply.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// The `Content-Length` to declare: the body's own length when `None` for bytes, none
    /// (the body ends when the connection does) for endless and dripped bodies.
    pub content_length: Option<u64>,
    /// Bytes sent with no `Content-Length`: the body ends when the connection does.
    pub close_delimited: bool,
}

impl Reply {
    pub(crate) fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Body::Bytes(Vec::new()),
            content_length: None,
            close_delimited: false,
        }
    }

    pub(crate) fn bytes(status: u16, bytes: impl Into<Vec<u8>>) -> Reply {
        Reply {
            body: Body::Bytes(bytes.into()),
            ..Reply::status(status)
        }
    }

    pub(crate) fn endless(status: u16, prefix: &str) -> Reply {
        Reply {
            body: Body::Endless {
                prefix: prefix.as_bytes().to_vec(),
            },
            ..Reply::status(status)
        }
    }

    pub(crate) fn drip(status: u16, prefix: &str, every: Duration) -> Reply {
        Reply {
            body: Body::Drip {
                prefix: prefix.as_bytes().to_vec(),
                every,
            },
            ..Reply::status(status)
        }
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Sends the bytes with no Content-Length.
    pub(crate) fn close_delimited(mut self) -> Reply {
        self.close_delimited = true;
        self
    }

    /// Declares `length` as the Content-Length whatever the body is.
    pub(crate) fn declaring(mut self, length: u64) -> Reply {
        self.content_length = Some(length);
        self
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// The server; stopped on drop.
pub(crate) struct Scripted {
    /// `ip:port`.
    pub host: String,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Scripted {
    /// Serves on `ip` (`127.0.0.1`, `127.0.0.2`…), a free port, answering with `handler`.
    pub(crate) fn start(
        ip: &str,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let host = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let (requests, stop, handler) =
                        (requests.clone(), stop.clone(), handler.clone());
                    std::thread::spawn(move || serve(stream, &*handler, &requests, &stop));
                }
            })
        };
        Scripted {
            host,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://ip:port`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.host)
    }

    /// Every request so far.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads the request head (and its body, if it declares a length), records it and writes
/// the reply.
fn serve(stream: TcpStream, handler: &Handler, requests: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    stream.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    let request = Request {
        method,
        target,
        headers,
    };
    if let Some(length) = request
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
    {
        let _ = std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
    }
    requests.lock().unwrap().push(request.clone());
    let reply = handler(&request);
    let _ = write_reply(stream, &request, &reply, stop);
}

fn write_reply(
    mut out: TcpStream,
    request: &Request,
    reply: &Reply,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} Scripted\r\nConnection: close\r\n",
        reply.status
    );
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let length = match (&reply.body, reply.content_length) {
        (_, Some(length)) => Some(length),
        (Body::Bytes(bytes), None) if !reply.close_delimited => Some(bytes.len() as u64),
        _ => None,
    };
    if let Some(length) = length {
        head.push_str(&format!("Content-Length: {length}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if request.method == "HEAD" {
        return Ok(());
    }
    match &reply.body {
        Body::Bytes(bytes) => out.write_all(bytes),
        Body::Endless { prefix } => {
            out.write_all(prefix)?;
            let piece = vec![b'x'; 64 << 10];
            while !stop.load(Ordering::Relaxed) {
                out.write_all(&piece)?;
            }
            Ok(())
        }
        Body::Drip { prefix, every } => {
            out.write_all(prefix)?;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(*every);
                out.write_all(b"x")?;
                out.flush()?;
            }
            Ok(())
        }
    }
}
