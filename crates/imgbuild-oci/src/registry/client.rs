//! A small OCI distribution client: one repository, bounded retries with backoff, and the
//! Basic and Bearer (token service) flows driven by the registry's `WWW-Authenticate`.
//!
//! A registry that accepts connections and then says nothing must not hold a build or push
//! forever: every attempt is abandoned once the registry has been silent for the timeout
//! (neither sending any of its answer nor taking any of our request body), and a request
//! stops retrying when another silent attempt would take it past its retry budget.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use reqwest::{Method, StatusCode, header};
use tokio::sync::Mutex;

use super::{auth::Credentials, realm::RealmRefusal, reference::Reference};

/// Attempts per request, first included.
const ATTEMPTS: u32 = 6;
/// First backoff; doubled each retry, capped at [`MAX_BACKOFF`].
const BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long a registry may stay silent, connecting or answering, when
/// [`ClientOptions::timeout`] does not say.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// A request's retry budget, in timeouts: attempts and backoff together never go past it, so
/// with the default a silent registry fails a request in 90 s.
const BUDGET_TIMEOUTS: u32 = 3;
/// Request bodies are handed to the connection in pieces of this size, so a slow upload
/// counts as activity while it goes.
const BODY_PIECE: usize = 64 << 10;
/// The environment variable (and flag `--registry-timeout`) that sets the timeout; named in
/// the timeout error.
pub const TIMEOUT_ENV: &str = "IMGBUILD_REGISTRY_TIMEOUT";

/// The most of an answer's body imgbuild reads, and what the answer is (for the error).
/// Every body but a blob's is read through [`RepositoryClient::read_body`] with one; a
/// blob is read through [`RepositoryClient::download`], to exactly its descriptor's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    pub what: &'static str,
}

/// Manifests and image indexes (a referrers answer is an index): 4 MiB, what distribution
/// accepts in a manifest PUT (`maxManifestBodySize = 4 << 20`,
/// registry/handlers/manifests.go) and about what containerd fetches
/// (`MaxManifestSize = 4 * 1048 * 1048`, core/remotes/resolver.go).
pub(crate) const MANIFEST_LIMIT: Limit = Limit {
    bytes: 4 << 20,
    what: "a manifest or index",
};
/// A token service's answer: a JWT is a few KiB; 1 MiB, as containers/image
/// (`iolimits.MaxAuthTokenBodySize`), leaves room for any real one.
pub(crate) const TOKEN_LIMIT: Limit = Limit {
    bytes: 1 << 20,
    what: "a token answer",
};
/// Any other answer (uploads, mounts, `GET /v2/`): registries send an empty body or a small
/// JSON one; the same 1 MiB.
pub(crate) const ANSWER_LIMIT: Limit = Limit {
    bytes: 1 << 20,
    what: "an answer",
};
/// How much of an error answer's body is read for its message; the rest is left unread.
const ERROR_BODY_LIMIT: usize = 16 << 10;

/// `4 MiB`, `1 MiB`, or bytes.
fn shown_size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// CA bundles larger than this are refused unread: the whole Mozilla bundle is ~220 KiB.
pub(crate) const MAX_CA_BUNDLE_BYTES: u64 = 4 << 20;

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Plain HTTP for registries on loopback (`localhost`, `127.0.0.0/8`, `[::1]`).
    pub insecure: bool,
    /// A PEM file with extra CA certificates to trust.
    pub ca_cert: Option<std::path::PathBuf>,
    /// How long the registry may stay silent before an attempt is abandoned (connecting, or
    /// between two pieces of an answer or of an upload); [`DEFAULT_TIMEOUT`] when `None`.
    /// A request's retries end within [`BUDGET_TIMEOUTS`] times this.
    pub timeout: Option<Duration>,
}

impl ClientOptions {
    /// The silence after which an attempt is abandoned.
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("Cannot reach registry `{registry}` ({url}){}", if *attempts > 1 { format!(" after {attempts} attempts") } else { String::new() })]
    Unreachable {
        registry: String,
        url: String,
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "Registry `{registry}` answered in plain HTTP where imgbuild speaks HTTPS ({url}): for a registry on this machine's loopback pass --insecure; any other registry must serve HTTPS"
    )]
    PlainHttp { registry: String, url: String },
    #[error(
        "Registry `{registry}` timed out: nothing from it for {}s on {method} {url} ({attempts} {}, {}s in all); if it is only slow, allow more with --registry-timeout SECONDS or {TIMEOUT_ENV}",
        waited.as_secs_f64(),
        if *attempts == 1 { "attempt" } else { "attempts" },
        elapsed.as_secs(),
    )]
    TimedOut {
        registry: String,
        method: Method,
        url: String,
        /// The silence that ended the last attempt.
        waited: Duration,
        attempts: u32,
        /// From the first attempt to giving up.
        elapsed: Duration,
    },
    #[error(
        "Registry `{registry}` answered {status} to {method} {url}{}",
        body_hint(body)
    )]
    Status {
        registry: String,
        method: Method,
        url: String,
        status: StatusCode,
        body: String,
    },
    #[error("Registry `{registry}` refused the credentials{}", match user { Some(u) => format!(" of user `{u}`"), None => " (none were found; run `imgbuild login`)".to_string() })]
    Unauthorized {
        registry: String,
        user: Option<String>,
    },
    #[error(
        "Registry `{registry}` sent an authentication challenge imgbuild cannot follow: {challenge}"
    )]
    Challenge { registry: String, challenge: String },
    #[error("Cannot use CA certificate `{}`", path.display())]
    CaCert {
        path: std::path::PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("Failed to build the HTTP client")]
    Client(#[source] reqwest::Error),
    #[error(
        "Registry `{registry}` sent {what} that does not match digest {expected} (got {actual})"
    )]
    DigestMismatch {
        registry: String,
        what: String,
        expected: String,
        actual: String,
    },
    #[error("Registry `{registry}` sent an invalid {what}")]
    Invalid { registry: String, what: String },
    #[error(
        "Registry `{registry}` answered {method} {url} with {}, more than the {} imgbuild reads of {}",
        declared.map_or_else(|| "a longer body".to_string(), |n| format!("a body of {n} bytes (its Content-Length)")),
        shown_size(limit.bytes),
        limit.what,
    )]
    TooLarge {
        registry: String,
        method: Method,
        url: String,
        limit: Limit,
        /// The Content-Length that was refused before reading, if that was it.
        declared: Option<u64>,
    },
    #[error(
        "Registry `{registry}` took more than {}s to send its answer to {method} {url} (at most {} of {}); if it is only slow, allow more with --registry-timeout SECONDS or {TIMEOUT_ENV}",
        took.as_secs(),
        shown_size(limit.bytes),
        limit.what,
    )]
    TooSlow {
        registry: String,
        method: Method,
        url: String,
        took: Duration,
        limit: Limit,
    },
    #[error(
        "Registry `{registry}` sent {}, not the {size} bytes its descriptor gives for blob {digest} (GET {url}); nothing past {size} bytes was written",
        match got { Some(n) => format!("{n} bytes"), None => format!("more than {size} bytes") }
    )]
    BlobSize {
        registry: String,
        url: String,
        digest: String,
        size: u64,
        /// What arrived (or its Content-Length); `None` when more than `size` did.
        got: Option<u64>,
    },
    #[error(
        "Registry `{registry}` sends its token requests to `{realm}`, which is not HTTPS: imgbuild asks for tokens only over HTTPS (over plain HTTP only from a loopback registry under --insecure to a loopback realm)"
    )]
    InsecureRealm { registry: String, realm: String },
    #[error(
        "Registry `{registry}` sends its token requests to `{realm}`, another host: imgbuild did not send the credentials of user `{user}` there, and the anonymous token request was refused"
    )]
    CredentialsWithheld {
        registry: String,
        realm: String,
        user: String,
    },
    #[error("Failed to write `{}`", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether `err` or one of its sources says `needle`: rustls's errors reach us only as text
/// through hyper's and reqwest's.
fn chain_mentions(err: &reqwest::Error, needle: &str) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(err);
    while let Some(e) = source {
        if e.to_string().contains(needle) {
            return true;
        }
        source = e.source();
    }
    false
}

/// Whether a TLS handshake met a server speaking plain HTTP: rustls reads its first bytes
/// (`HTTP/1.1 400 …`) as a TLS record of no known type.
fn is_plain_http_answer(err: &reqwest::Error) -> bool {
    chain_mentions(err, "InvalidContentType")
}

/// Whether an HTTP error comes from TLS certificate verification.
fn is_certificate_error(err: &reqwest::Error) -> bool {
    chain_mentions(err, "certificate")
}

fn body_hint(body: &str) -> String {
    let body = body.trim();
    if body.is_empty() {
        String::new()
    } else {
        let short: String = body.chars().take(300).collect();
        format!(": {short}")
    }
}

impl RegistryError {
    /// Whether trying again may help: dropped connections, 429 and 5xx.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            RegistryError::Status { status, .. } => {
                *status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
            }
            // A certificate the client does not trust stays untrusted: fail at once.
            RegistryError::Unreachable { source, .. } => !is_certificate_error(source),
            RegistryError::TimedOut { .. } => true,
            _ => false,
        }
    }

    /// Whether the request behind this error already spent its retries on silence: starting
    /// it over (a new upload session) would only wait the same budget again.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, RegistryError::TimedOut { .. })
    }

    /// Records how many attempts the request made and how long they took, once it gives up.
    fn after_attempts(mut self, made: u32, took: Duration) -> Self {
        match &mut self {
            RegistryError::TimedOut {
                attempts, elapsed, ..
            } => {
                *attempts = made;
                *elapsed = took;
            }
            RegistryError::Unreachable { attempts, .. } => *attempts = made,
            _ => {}
        }
        self
    }
}

/// When the registry last did something for an attempt: connected, sent part of its answer,
/// or took part of our request body.
#[derive(Clone)]
struct Activity(Arc<std::sync::Mutex<Instant>>);

impl Activity {
    fn new() -> Self {
        Activity(Arc::new(std::sync::Mutex::new(Instant::now())))
    }

    fn touch(&self) {
        // A poisoned lock only means another task panicked while storing an instant.
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs `future` to its end, or `None` once `activity` has been still for `idle`.
async fn unless_idle<F: Future>(
    future: F,
    activity: &Activity,
    idle: Duration,
) -> Option<F::Output> {
    tokio::pin!(future);
    loop {
        let deadline = activity.last() + idle;
        tokio::select! {
            output = &mut future => return Some(output),
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                if activity.last() + idle <= Instant::now() {
                    return None;
                }
            }
        }
    }
}

/// `bytes` as a request body that marks `activity` each time the connection takes a piece,
/// with its length declared (a streamed body would otherwise go chunked, which not every
/// registry accepts).
fn tracked_body(bytes: bytes::Bytes, activity: &Activity) -> reqwest::Body {
    let activity = activity.clone();
    let pieces: Vec<bytes::Bytes> = (0..bytes.len())
        .step_by(BODY_PIECE)
        .map(|start| bytes.slice(start..(start + BODY_PIECE).min(bytes.len())))
        .collect();
    reqwest::Body::wrap_stream(futures::stream::iter(pieces).map(move |piece| {
        activity.touch();
        Ok::<_, std::io::Error>(piece)
    }))
}

/// A request body that can be sent again on retry.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Empty,
    Bytes(bytes::Bytes, &'static str),
}

/// The outcome of a request: status, headers and body.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: StatusCode,
    pub headers: header::HeaderMap,
    pub body: bytes::Bytes,
}

/// A client for one repository of one registry.
#[derive(Clone)]
pub struct RepositoryClient {
    http: reqwest::Client,
    /// Silence after which an attempt is abandoned; also the connect timeout.
    timeout: Duration,
    pub reference: Reference,
    base: String,
    /// The registry's origin (`https://host:port`): the only one that gets `Authorization`.
    origin: url::Url,
    credentials: Option<Credentials>,
    /// The `Authorization` value that last worked (a Bearer token or Basic).
    authorization: Arc<Mutex<Option<String>>>,
    /// Counts requests sent, retries included: for reports and tests.
    pub requests: Arc<std::sync::atomic::AtomicUsize>,
    pub retries: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for RepositoryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepositoryClient")
            .field("reference", &self.reference.to_string())
            .finish_non_exhaustive()
    }
}

impl RepositoryClient {
    pub fn new(
        reference: &Reference,
        credentials: Option<Credentials>,
        options: &ClientOptions,
    ) -> Result<Self, RegistryError> {
        let scheme = if options.insecure && reference.is_loopback() {
            "http"
        } else {
            "https"
        };
        let timeout = options.timeout();
        // No total timeout: a large blob may take long over a slow link, and silence is
        // what ends an attempt (see `unless_idle`).
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("imgbuild/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(timeout);
        if let Some(path) = &options.ca_cert {
            for cert in ca_certificates(path)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let origin =
            url::Url::parse(&format!("{scheme}://{}/", reference.api_host())).map_err(|_| {
                RegistryError::Invalid {
                    registry: reference.registry.clone(),
                    what: "registry host".into(),
                }
            })?;
        Ok(RepositoryClient {
            http: builder.build().map_err(RegistryError::Client)?,
            timeout,
            reference: reference.clone(),
            base: format!(
                "{scheme}://{}/v2/{}",
                reference.api_host(),
                reference.repository
            ),
            origin,
            credentials,
            authorization: Arc::new(Mutex::new(None)),
            requests: Arc::default(),
            retries: Arc::default(),
        })
    }

    /// The URL of `path` under this repository (`/blobs/…`, `/manifests/…`), or an absolute
    /// or registry-relative `Location` as registries return them.
    pub(crate) fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else if path.starts_with("/v2/") {
            let origin = self.base.split("/v2/").next().unwrap_or_default();
            format!("{origin}{path}")
        } else {
            format!("{}{path}", self.base)
        }
    }

    /// Checks that the registry accepts these credentials (`GET /v2/`, following its
    /// challenge for this repository).
    pub async fn check_login(&self) -> Result<(), RegistryError> {
        let origin = self
            .base
            .split("/v2/")
            .next()
            .unwrap_or_default()
            .to_string();
        self.send(
            Method::GET,
            &format!("{origin}/v2/"),
            &[],
            Body::Empty,
            &[StatusCode::OK],
        )
        .await
        .map(|_| ())
    }

    /// Streams `url`, the blob `digest` of `size` bytes, into `dest`, never holding it in
    /// memory: an answer whose Content-Length is not `size` is refused before reading, the
    /// stream is stopped before a byte past `size` is written, one that ends short is
    /// refused, and so is one whose sha256 is not `digest`. A HEAD through [`Self::send`]
    /// first settles authentication; the GET is retried like any request, from the start.
    pub(crate) async fn download(
        &self,
        url: &str,
        digest: &str,
        size: u64,
        dest: &std::path::Path,
    ) -> Result<(), RegistryError> {
        self.send(Method::HEAD, url, &[], Body::Empty, &[StatusCode::OK])
            .await?;
        let blob = Blob { url, digest, size };
        self.with_retries(&Method::GET, url, || self.download_once(&blob, dest))
            .await
    }

    /// The `Authorization` to send to `url`: the one that last worked, only to the
    /// registry's own origin (an upload `Location` on another host gets none; redirects to
    /// another host lose it in reqwest, `redirect::remove_sensitive_headers`).
    async fn authorization_for(&self, url: &str) -> Option<String> {
        let same_origin = url::Url::parse(url).is_ok_and(|u| u.origin() == self.origin.origin());
        if !same_origin {
            return None;
        }
        self.authorization.lock().await.clone()
    }

    /// Runs `attempt` until it succeeds, fails in a way retrying cannot fix, has been made
    /// [`ATTEMPTS`] times, or another silent attempt would end past the retry budget.
    async fn with_retries<T, F, Fut>(
        &self,
        method: &Method,
        url: &str,
        mut attempt: F,
    ) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RegistryError>>,
    {
        let started = Instant::now();
        let budget = self.timeout * BUDGET_TIMEOUTS;
        let mut backoff = BACKOFF;
        let mut made = 0;
        loop {
            made += 1;
            let err = match attempt().await {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let within_budget = started.elapsed() + backoff + self.timeout <= budget;
            if !err.is_retryable() || made >= ATTEMPTS || !within_budget {
                return Err(err.after_attempts(made, started.elapsed()));
            }
            self.retries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!("retrying {method} {url} after: {err}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The error for an attempt the registry left silent for the timeout.
    fn timed_out(&self, method: &Method, url: &str) -> RegistryError {
        RegistryError::TimedOut {
            registry: self.reference.registry.clone(),
            method: method.clone(),
            url: url.to_string(),
            waited: self.timeout,
            attempts: 1,
            elapsed: self.timeout,
        }
    }

    /// Sends `request` and waits for the answer's head, abandoning it after the timeout's
    /// silence. A connection that timed out inside reqwest reads as silence too.
    async fn send_guarded(
        &self,
        request: reqwest::RequestBuilder,
        method: &Method,
        url: &str,
        activity: &Activity,
    ) -> Result<reqwest::Response, RegistryError> {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match unless_idle(request.send(), activity, self.timeout).await {
            None => Err(self.timed_out(method, url)),
            Some(Err(source)) if source.is_timeout() => Err(self.timed_out(method, url)),
            Some(Err(source)) => Err(self.unreachable(url, source)),
            Some(Ok(response)) => {
                activity.touch();
                Ok(response)
            }
        }
    }

    /// The next piece of an answer's body (`None` at its end), abandoned after the
    /// timeout's silence.
    async fn next_piece(
        &self,
        response: &mut reqwest::Response,
        method: &Method,
        url: &str,
        activity: &Activity,
    ) -> Result<Option<bytes::Bytes>, RegistryError> {
        match unless_idle(response.chunk(), activity, self.timeout).await {
            None => Err(self.timed_out(method, url)),
            Some(Err(source)) if source.is_timeout() => Err(self.timed_out(method, url)),
            Some(Err(source)) => Err(self.unreachable(url, source)),
            Some(Ok(piece)) => {
                activity.touch();
                Ok(piece)
            }
        }
    }

    /// THE way an answer's body (any but a blob's) is read: at most `limit` bytes (a
    /// Content-Length over it is refused before reading), and within the retry budget as a
    /// whole, so a body dripped a byte at a time cannot hold the request forever.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        method: &Method,
        url: &str,
        activity: &Activity,
        limit: Limit,
    ) -> Result<bytes::Bytes, RegistryError> {
        let too_large = |declared| RegistryError::TooLarge {
            registry: self.reference.registry.clone(),
            method: method.clone(),
            url: url.to_string(),
            limit,
            declared,
        };
        // A HEAD answer has no body; its Content-Length is the resource's (a blob's), and
        // over HTTP/2 reqwest reports it as this answer's.
        if *method == Method::HEAD {
            return Ok(bytes::Bytes::new());
        }
        if let Some(declared) = response.content_length()
            && declared > limit.bytes
        {
            return Err(too_large(Some(declared)));
        }
        let whole = self.timeout * BUDGET_TIMEOUTS;
        let reading = async {
            let mut body = bytes::BytesMut::new();
            while let Some(piece) = self
                .next_piece(&mut response, method, url, activity)
                .await?
            {
                if (body.len() + piece.len()) as u64 > limit.bytes {
                    return Err(too_large(None));
                }
                body.extend_from_slice(&piece);
            }
            Ok(body.freeze())
        };
        tokio::time::timeout(whole, reading)
            .await
            .unwrap_or_else(|_| {
                Err(RegistryError::TooSlow {
                    registry: self.reference.registry.clone(),
                    method: method.clone(),
                    url: url.to_string(),
                    took: whole,
                    limit,
                })
            })
    }

    /// The start of an error answer's body, for its message: at most [`ERROR_BODY_LIMIT`]
    /// bytes, within one timeout; whatever arrived by then (the rest is never read).
    async fn read_error_body(
        &self,
        mut response: reqwest::Response,
        method: &Method,
        url: &str,
        activity: &Activity,
    ) -> String {
        let mut body = Vec::new();
        let reading = async {
            while body.len() < ERROR_BODY_LIMIT {
                match self.next_piece(&mut response, method, url, activity).await {
                    Ok(Some(piece)) => body.extend_from_slice(&piece),
                    _ => break,
                }
            }
        };
        let _ = tokio::time::timeout(self.timeout, reading).await;
        body.truncate(ERROR_BODY_LIMIT);
        String::from_utf8_lossy(&body).into_owned()
    }

    /// One GET of `blob` into `dest`; see [`Self::download`].
    async fn download_once(
        &self,
        blob: &Blob<'_>,
        dest: &std::path::Path,
    ) -> Result<(), RegistryError> {
        use sha2::Digest;
        use std::io::Write;
        let url = blob.url;
        let mut request = self.http.get(url);
        if let Some(authorization) = self.authorization_for(url).await {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        let activity = Activity::new();
        let mut response = self
            .send_guarded(request, &Method::GET, url, &activity)
            .await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = self
                .read_error_body(response, &Method::GET, url, &activity)
                .await;
            return Err(self.status_error(&Method::GET, url, status, body));
        }
        if let Some(declared) = response.content_length()
            && declared != blob.size
        {
            return Err(self.blob_size(blob, Some(declared)));
        }
        let io = |source| RegistryError::Io {
            path: dest.to_path_buf(),
            source,
        };
        let mut file =
            std::io::BufWriter::with_capacity(1 << 20, fs_err::File::create(dest).map_err(io)?);
        let mut hasher = sha2::Sha256::new();
        let mut written = 0u64;
        while let Some(chunk) = self
            .next_piece(&mut response, &Method::GET, url, &activity)
            .await?
        {
            if written + chunk.len() as u64 > blob.size {
                return Err(self.blob_size(blob, None));
            }
            written += chunk.len() as u64;
            hasher.update(&chunk);
            file.write_all(&chunk).map_err(io)?;
        }
        file.flush().map_err(io)?;
        if written != blob.size {
            return Err(self.blob_size(blob, Some(written)));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != blob.digest {
            return Err(RegistryError::DigestMismatch {
                registry: self.reference.registry.clone(),
                what: format!("blob {url}"),
                expected: blob.digest.to_string(),
                actual,
            });
        }
        Ok(())
    }

    fn blob_size(&self, blob: &Blob<'_>, got: Option<u64>) -> RegistryError {
        RegistryError::BlobSize {
            registry: self.reference.registry.clone(),
            url: blob.url.to_string(),
            digest: blob.digest.to_string(),
            size: blob.size,
            got,
        }
    }

    fn status_error(
        &self,
        method: &Method,
        url: &str,
        status: StatusCode,
        body: String,
    ) -> RegistryError {
        RegistryError::Status {
            registry: self.reference.registry.clone(),
            method: method.clone(),
            url: url.to_string(),
            status,
            body,
        }
    }

    /// Sends a request, following auth challenges and retrying what may succeed later.
    /// `ok` lists the statuses the caller handles; anything else is an error. The answer's
    /// body is read up to [`ANSWER_LIMIT`]; see [`Self::send_reading`] for manifests.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(header::HeaderName, String)],
        body: Body,
        ok: &[StatusCode],
    ) -> Result<Response, RegistryError> {
        self.send_reading(method, url, headers, body, ok, ANSWER_LIMIT)
            .await
    }

    /// [`Self::send`], reading at most `limit` of the answer's body.
    pub(crate) async fn send_reading(
        &self,
        method: Method,
        url: &str,
        headers: &[(header::HeaderName, String)],
        body: Body,
        ok: &[StatusCode],
        limit: Limit,
    ) -> Result<Response, RegistryError> {
        let request = Request {
            method: &method,
            url,
            headers,
            body: &body,
            ok,
            limit,
        };
        self.with_retries(&method, url, || self.send_once(&request))
            .await
    }

    async fn send_once(&self, request: &Request<'_>) -> Result<Response, RegistryError> {
        let Request {
            method,
            url,
            headers,
            body,
            ok,
            limit,
        } = *request;
        let mut authenticated_once = false;
        loop {
            let mut request = self.http.request(method.clone(), url);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            if let Some(authorization) = self.authorization_for(url).await {
                request = request.header(header::AUTHORIZATION, authorization);
            }
            let activity = Activity::new();
            request = match body {
                Body::Empty => request.header(header::CONTENT_LENGTH, "0"),
                Body::Bytes(bytes, content_type) => request
                    .header(header::CONTENT_TYPE, *content_type)
                    .header(header::CONTENT_LENGTH, bytes.len().to_string())
                    .body(tracked_body(bytes.clone(), &activity)),
            };
            let response = self.send_guarded(request, method, url, &activity).await?;
            let status = response.status();
            let response_headers = response.headers().clone();
            if ok.contains(&status) {
                let body = self
                    .read_body(response, method, url, &activity, limit)
                    .await?;
                return Ok(Response {
                    status,
                    headers: response_headers,
                    body,
                });
            }
            let body = self.read_error_body(response, method, url, &activity).await;
            if status == StatusCode::UNAUTHORIZED && !authenticated_once {
                authenticated_once = true;
                let challenge = response_headers
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                self.authenticate(&challenge).await?;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                return Err(RegistryError::Unauthorized {
                    registry: self.reference.registry.clone(),
                    user: self.credentials.as_ref().map(|c| c.username.clone()),
                });
            }
            return Err(self.status_error(method, url, status, body));
        }
    }

    fn unreachable(&self, url: &str, source: reqwest::Error) -> RegistryError {
        // Not retried: a plain-HTTP server stays one (`is_retryable`).
        if is_plain_http_answer(&source) {
            return RegistryError::PlainHttp {
                registry: self.reference.registry.clone(),
                url: url.to_string(),
            };
        }
        RegistryError::Unreachable {
            registry: self.reference.registry.clone(),
            url: url.to_string(),
            // Set to the attempts made once the request gives up (`after_attempts`).
            attempts: 1,
            source: source.without_url(),
        }
    }

    /// Answers a `WWW-Authenticate` challenge: Basic with the stored credentials, or Bearer
    /// by fetching a token for this repository's pull and push scope.
    async fn authenticate(&self, challenge: &str) -> Result<(), RegistryError> {
        let registry = self.reference.registry.clone();
        let cannot_follow = || RegistryError::Challenge {
            registry: registry.clone(),
            challenge: challenge.to_string(),
        };
        let (scheme, params) = parse_challenge(challenge).ok_or_else(cannot_follow)?;
        let value = match scheme.to_ascii_lowercase().as_str() {
            "basic" => match &self.credentials {
                Some(credentials) => credentials.basic(),
                None => {
                    return Err(RegistryError::Unauthorized {
                        registry,
                        user: None,
                    });
                }
            },
            "bearer" => {
                let realm = params
                    .iter()
                    .find(|(k, _)| k == "realm")
                    .map(|(_, v)| v.clone())
                    .ok_or_else(cannot_follow)?;
                let service = params.iter().find(|(k, _)| k == "service").cloned();
                format!("Bearer {}", self.fetch_token(&realm, service).await?)
            }
            _ => return Err(cannot_follow()),
        };
        *self.authorization.lock().await = Some(value);
        Ok(())
    }

    /// A token from `realm` for this repository's pull and push scope. The realm must be
    /// HTTPS and gets the user's credentials only on the registry's own host (see
    /// [`super::realm`]); its answer is read up to [`TOKEN_LIMIT`].
    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<(String, String)>,
    ) -> Result<String, RegistryError> {
        let registry = self.reference.registry.clone();
        let judged = super::realm::judge(&self.origin, realm).map_err(|refusal| match refusal {
            RealmRefusal::NotHttps => RegistryError::InsecureRealm {
                registry: registry.clone(),
                realm: realm.to_string(),
            },
            RealmRefusal::Invalid => RegistryError::Challenge {
                registry: registry.clone(),
                challenge: format!("realm `{realm}`"),
            },
        })?;
        let mut query: Vec<(String, String)> = service.into_iter().collect();
        query.push((
            "scope".to_string(),
            format!("repository:{}:pull,push", self.reference.repository),
        ));
        let mut request = self.http.get(judged.url.clone()).query(&query);
        let sent = self.credentials.as_ref().filter(|_| judged.credentials);
        if let Some(credentials) = sent {
            request = request.header(header::AUTHORIZATION, credentials.basic());
        }
        let activity = Activity::new();
        let response = self
            .send_guarded(request, &Method::GET, realm, &activity)
            .await?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(match (&self.credentials, sent) {
                (Some(withheld), None) => RegistryError::CredentialsWithheld {
                    registry,
                    realm: realm.to_string(),
                    user: withheld.username.clone(),
                },
                _ => RegistryError::Unauthorized {
                    registry,
                    user: self.credentials.as_ref().map(|c| c.username.clone()),
                },
            });
        }
        if !status.is_success() {
            let body = self
                .read_error_body(response, &Method::GET, realm, &activity)
                .await;
            return Err(self.status_error(&Method::GET, realm, status, body));
        }
        let bytes = self
            .read_body(response, &Method::GET, realm, &activity, TOKEN_LIMIT)
            .await?;
        self.parse_token(&bytes)
    }

    /// The token of a token service's answer (`token`, or OAuth's `access_token`).
    fn parse_token(&self, bytes: &[u8]) -> Result<String, RegistryError> {
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let invalid = |what: &str| RegistryError::Invalid {
            registry: self.reference.registry.clone(),
            what: what.into(),
        };
        let token: Token = serde_json::from_slice(bytes).map_err(|_| invalid("token response"))?;
        token
            .token
            .or(token.access_token)
            .ok_or_else(|| invalid("token response (no token)"))
    }
}

/// A blob to download: where, and what its descriptor says.
struct Blob<'a> {
    url: &'a str,
    digest: &'a str,
    size: u64,
}

/// One request as [`RepositoryClient::send_reading`] was asked to make it.
#[derive(Clone, Copy)]
struct Request<'a> {
    method: &'a Method,
    url: &'a str,
    headers: &'a [(header::HeaderName, String)],
    body: &'a Body,
    ok: &'a [StatusCode],
    limit: Limit,
}

/// `Bearer realm="https://auth/token",service="registry",scope="…"` → (`Bearer`, params).
fn parse_challenge(challenge: &str) -> Option<(String, Vec<(String, String)>)> {
    let challenge = challenge.trim();
    let (scheme, rest) = challenge.split_once(' ').unwrap_or((challenge, ""));
    if scheme.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, remainder) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        params.push((key.trim().to_ascii_lowercase(), value.to_string()));
        rest = remainder.trim_start().trim_start_matches(',').trim_start();
    }
    Some((scheme.to_string(), params))
}

/// Whether `registry`'s API answers `GET /v2/` with 200 to a request that carries no
/// credentials and follows no challenge: such a registry asks for none, so `login` has
/// nothing to store. Any other answer, or none at all, is `false`: this is asked only after
/// the check with credentials passed, which has already reported what went wrong.
pub async fn asks_for_no_credentials(reference: &Reference, options: &ClientOptions) -> bool {
    let scheme = if options.insecure && reference.is_loopback() {
        "http"
    } else {
        "https"
    };
    let Some(http) = anonymous_client(options) else {
        return false;
    };
    let url = format!("{scheme}://{}/v2/", reference.api_host());
    http.get(&url)
        .send()
        .await
        .is_ok_and(|response| response.status() == reqwest::StatusCode::OK)
}

/// A client trusting what the registry client trusts, with the same timeout as a whole
/// (one short request, so a registry that never answers cannot hold `login`).
fn anonymous_client(options: &ClientOptions) -> Option<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("imgbuild/", env!("CARGO_PKG_VERSION")))
        .timeout(options.timeout());
    if let Some(path) = &options.ca_cert {
        for cert in ca_certificates(path).ok()? {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().ok()
}

/// The certificates of the CA bundle at `path`, read bounded.
fn ca_certificates(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, RegistryError> {
    let error = |source| RegistryError::CaCert {
        path: path.to_path_buf(),
        source,
    };
    let pem = crate::fs::read_input(path, MAX_CA_BUNDLE_BYTES).map_err(|e| error(Box::new(e)))?;
    reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| error(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="http://127.0.0.1:1/token",service="registry.test",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(scheme, "Bearer");
        assert_eq!(
            params,
            [
                ("realm".to_string(), "http://127.0.0.1:1/token".to_string()),
                ("service".to_string(), "registry.test".to_string()),
                ("scope".to_string(), "repository:a/b:pull".to_string()),
            ]
        );
        let (scheme, params) = parse_challenge(r#"Basic realm="basic-realm""#).unwrap();
        assert_eq!((scheme.as_str(), params.len()), ("Basic", 1));
    }

    #[test]
    fn locations() {
        let reference = Reference::parse("127.0.0.1:5000/ml/x:v1").unwrap();
        let client = RepositoryClient::new(
            &reference,
            None,
            &ClientOptions {
                insecure: true,
                ..ClientOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            client.url("/blobs/uploads/"),
            "http://127.0.0.1:5000/v2/ml/x/blobs/uploads/"
        );
        assert_eq!(
            client.url("/v2/ml/x/blobs/uploads/abc?_state=1"),
            "http://127.0.0.1:5000/v2/ml/x/blobs/uploads/abc?_state=1"
        );
        let remote = RepositoryClient::new(
            &Reference::parse("ghcr.io/a/b").unwrap(),
            None,
            &ClientOptions {
                insecure: true,
                ..ClientOptions::default()
            },
        )
        .unwrap();
        assert!(remote.url("").starts_with("https://ghcr.io/v2/a/b"));
    }
}
