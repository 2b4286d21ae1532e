//! An HTTP server on 127.0.0.1 whose every answer a test scripts: a closure maps each
//! request to an [`Answer`], which may be endless, lie about its length, or redirect. It is
//! how hostile indexes and channels are played. One request per connection (`Connection:
//! close`); every request is logged before it is answered. Stops when dropped.

use std::{
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
}

/// What the server sends back.
pub enum Answer {
    /// A status, extra headers, and a body sent with its true `Content-Length`.
    Body(u16, Vec<(String, String)>, Vec<u8>),
    /// 200 with no `Content-Length`, and bytes until the client hangs up.
    Endless,
    /// 200 claiming `declared` bytes in `Content-Length`, then sending `body`.
    Lying { declared: u64, body: Vec<u8> },
}

impl Answer {
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Answer {
        Answer::Body(
            200,
            vec![("Content-Type".into(), content_type.into())],
            body.into(),
        )
    }

    pub fn not_found() -> Answer {
        Answer::Body(404, Vec::new(), b"not found".to_vec())
    }
}

type Handler = dyn Fn(&Request) -> Answer + Send + Sync;

pub struct Scripted {
    pub url: String,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Scripted {
    pub fn start(handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (log, handler) = (log.clone(), handler.clone());
                            std::thread::spawn(move || serve(stream, &log, &*handler));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Scripted {
            url,
            log,
            stop,
            thread: Some(thread),
        }
    }

    /// The requests so far whose path starts with `prefix`.
    pub fn requests(&self, prefix: &str) -> Vec<Request> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path.starts_with(prefix))
            .cloned()
            .collect()
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

fn serve(stream: TcpStream, log: &Mutex<Vec<Request>>, handler: &Handler) {
    stream.set_nonblocking(false).unwrap();
    let Some(request) = read_request(&stream) else {
        return;
    };
    log.lock().unwrap().push(request.clone());
    let _ = answer(stream, handler(&request));
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    // The headers, read to the blank line that ends them; no answer depends on them.
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        if line.trim_end().is_empty() {
            break;
        }
    }
    Some(Request { path })
}

fn answer(mut stream: TcpStream, answer: Answer) -> std::io::Result<()> {
    match answer {
        Answer::Body(status, headers, body) => {
            let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("Connection: close\r\n\r\n");
            stream.write_all(head.as_bytes())?;
            stream.write_all(&body)
        }
        Answer::Endless => {
            stream.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
            let chunk = vec![b'a'; 64 << 10];
            // Until the client hangs up: the write then fails.
            loop {
                stream.write_all(&chunk)?;
            }
        }
        Answer::Lying { declared, body } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes())?;
            stream.write_all(&body)
        }
    }
}
