//! The one HTTP client for channels (repodata) and package downloads.
//!
//! reqwest's `Client::new()`, which rattler uses when it is given no client, panics when the
//! machine has no CA certificates (a distroless or scratch builder image without them, a
//! minimal container). A build from local channels needs no TLS at all, so instead of a
//! panic: use a client that trusts no certificate, so an https request fails with its own
//! clear error and everything else works; the build warns of it ([`missing_certificates`]).
//!
//! Channel answers are bounded ([`repodata`]): what a `repodata.json` decompresses to may
//! not pass `IMGBUILD_MAX_REPODATA_BYTES` (default 2 GiB).

pub mod repodata;

use rattler_networking::LazyClient;

pub mod body;

pub use body::{BodyError, read_bounded};

/// A client trusting the system's CA certificates (or `SSL_CERT_FILE`/`SSL_CERT_DIR`), else
/// one that trusts none. Fails only when no TLS backend can start at all.
pub fn client() -> Result<LazyClient, HttpError> {
    let client = reqwest::Client::builder().build().or_else(|err| {
        tracing::debug!("no CA certificates: {}", error_chain(&err));
        reqwest::Client::builder()
            .tls_certs_only(std::iter::empty())
            .build()
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
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
