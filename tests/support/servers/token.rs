//! A small bearer-token service for the registry tests: it checks Basic credentials and
//! answers with a JWT (RS256, certificate in `x5c`) granting pull and push on the asked
//! repository, the way distribution's token auth expects.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
};

use base64::Engine;
use ring::{rand::SystemRandom, signature};

use crate::common::run_tool;

pub(crate) struct TokenServer {
    pub realm: String,
    pub cert: PathBuf,
    pub tokens_issued: Arc<AtomicUsize>,
    pub refused: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl TokenServer {
    /// Starts the service; keys are made with the real `openssl` CLI in `dir`.
    pub(crate) fn start(dir: &Path, user: &str, password: &str) -> TokenServer {
        let key_pem = dir.join("token.key");
        let cert = dir.join("token.crt");
        let key_der = dir.join("token.key.der");
        let cert_der = dir.join("token.crt.der");
        run_tool(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=imgbuild-test-token",
                "-keyout",
                key_pem.to_str().unwrap(),
                "-out",
                cert.to_str().unwrap(),
            ],
        );
        run_tool(
            "openssl",
            &[
                "pkcs8",
                "-topk8",
                "-nocrypt",
                "-in",
                key_pem.to_str().unwrap(),
                "-outform",
                "DER",
                "-out",
                key_der.to_str().unwrap(),
            ],
        );
        run_tool(
            "openssl",
            &[
                "x509",
                "-in",
                cert.to_str().unwrap(),
                "-outform",
                "DER",
                "-out",
                cert_der.to_str().unwrap(),
            ],
        );
        let key = signature::RsaKeyPair::from_pkcs8(&fs_err::read(&key_der).unwrap()).unwrap();
        let header = serde_json::json!({
            "alg": "RS256",
            "typ": "JWT",
            "x5c": [base64::engine::general_purpose::STANDARD.encode(fs_err::read(&cert_der).unwrap())],
        });
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let realm = format!("http://{}/token", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let tokens_issued = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, issued, refused) = (stop.clone(), tokens_issued.clone(), refused.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((stream, _)) = listener.accept() else {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        continue;
                    };
                    stream.set_nonblocking(false).unwrap();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut request_line = String::new();
                    let _ = reader.read_line(&mut request_line);
                    let mut authorization = None;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("authorization")
                        {
                            authorization = Some(value.trim().to_string());
                        }
                    }
                    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
                    let url = url::Url::parse(&format!("http://x{target}")).unwrap();
                    let scope = url
                        .query_pairs()
                        .find(|(k, _)| k == "scope")
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default();
                    let mut out = stream;
                    if authorization.as_deref() != Some(expected.as_str()) {
                        refused.fetch_add(1, Ordering::Relaxed);
                        let _ = write!(
                            out,
                            "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        continue;
                    }
                    // scope = repository:NAME:ACTIONS
                    let mut parts = scope.splitn(3, ':');
                    let (_, name) = (parts.next(), parts.next().unwrap_or_default());
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs();
                    let claims = serde_json::json!({
                        "iss": "imgbuild-test-issuer",
                        "sub": "ci",
                        "aud": "imgbuild-test",
                        "exp": now + 600,
                        "nbf": now - 60,
                        "iat": now,
                        "jti": format!("token-{}", issued.load(Ordering::Relaxed)),
                        "access": [{"type": "repository", "name": name, "actions": ["pull", "push"]}],
                    });
                    let signing_input = format!(
                        "{}.{}",
                        b64url(header.to_string().as_bytes()),
                        b64url(claims.to_string().as_bytes())
                    );
                    let mut signature = vec![0u8; key.public().modulus_len()];
                    key.sign(
                        &signature::RSA_PKCS1_SHA256,
                        &SystemRandom::new(),
                        signing_input.as_bytes(),
                        &mut signature,
                    )
                    .unwrap();
                    let body = serde_json::json!({"token": format!("{signing_input}.{}", b64url(&signature))}).to_string();
                    issued.fetch_add(1, Ordering::Relaxed);
                    let _ = write!(
                        out,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            })
        };
        TokenServer {
            realm,
            cert,
            tokens_issued,
            refused,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
