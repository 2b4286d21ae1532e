//! The one HTTP client for channels (repodata) and package downloads.
//!
//! reqwest's `Client::new()`, which rattler uses when it is given no client, panics when the
//! machine has no CA certificates (a distroless or scratch builder image without them, a
//! minimal container). A build from local channels needs no TLS at all, so instead of a
//! panic: use a client that trusts no certificate, so an https request fails with its own
//! clear error and everything else works; the build warns of it ([`missing_certificates`]).
//!
//! Channel answers are bounded ([`repodata`]): what a `repodata.json` decompresses to may
//! not pass `IMGBUILD_MAX_REPODATA_BYTES` (default 2 GiB). And no server can hold a build
//! forever: connecting, and every wait for the next bytes of an answer, give up after
//! [`TIMEOUT_ENV`] seconds.

pub mod repodata;

use std::time::Duration;

use rattler_networking::LazyClient;

pub mod body;

pub use body::{BodyError, read_bounded};

/// The environment variable that sets how long a channel or index may stay silent.
pub const TIMEOUT_ENV: &str = "IMGBUILD_HTTP_TIMEOUT";
/// The default silence allowed, in seconds. An idle limit, not a total one, as conda's
/// `remote_read_timeout_secs` (60 s) and uv's `UV_HTTP_TIMEOUT` (30 s) are: a 2 GB package on
/// a slow link still arrives, a server that stops sending does not hold the build.
const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// The largest silence one may allow: a day.
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// How long a server may stay silent: [`TIMEOUT_ENV`] seconds, else the default.
pub fn timeout() -> Result<Duration, HttpError> {
    let Some(value) = std::env::var_os(TIMEOUT_ENV).filter(|v| !v.is_empty()) else {
        return Ok(Duration::from_secs(DEFAULT_TIMEOUT_SECS));
    };
    value
        .to_str()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|secs| (1..=MAX_TIMEOUT_SECS).contains(secs))
        .map(Duration::from_secs)
        .ok_or_else(|| {
            HttpError(format!(
                "{TIMEOUT_ENV}=`{}` is not a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}",
                value.to_string_lossy()
            ))
        })
}

/// A client trusting the system's CA certificates (or `SSL_CERT_FILE`/`SSL_CERT_DIR`), else
/// one that trusts none, giving up on a server silent for [`timeout`]. Fails only when no
/// TLS backend can start at all or the timeout is not a number of seconds.
pub fn client() -> Result<LazyClient, HttpError> {
    let timeout = timeout()?;
    let builder = || {
        reqwest::Client::builder()
            .connect_timeout(timeout)
            .read_timeout(timeout)
    };
    let client = builder().build().or_else(|err| {
        tracing::debug!("no CA certificates: {}", error_chain(&err));
        builder().tls_certs_only(std::iter::empty()).build()
    });
    let client = client.map_err(|err| HttpError(error_chain(&err)))?;
    let client = reqwest_middleware::ClientBuilder::new(client)
        .with(repodata::RepodataBound::from_env())
        .build();
    Ok(LazyClient::from(client))
}

/// The warning for a machine whose CA certificates cannot be loaded, where [`client`] goes
/// on with none; `None` where they load. Plain data for the stage that reports.
pub fn missing_certificates() -> Option<String> {
    let err = reqwest::Client::builder().build().err()?;
    Some(format!(
        "no CA certificates could be loaded ({}): https channels cannot be reached; install CA certificates or set SSL_CERT_FILE",
        error_chain(&err)
    ))
}

/// The HTTP client could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("The HTTP client cannot be set up: {0}")]
pub struct HttpError(String);

/// An error and its causes on one line, `: `-separated.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
