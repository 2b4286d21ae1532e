//! What can go wrong reading a layout: one error for the reader ([`super::read`]), the
//! blob store and the writer, which reads `index.json` back through the reader.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("OCI layout file `{}` cannot be read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is not valid OCI JSON", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("OCI layout `{}` has no tag `{tag}`; it has: {}", layout.display(), if available.is_empty() { "no tags".to_string() } else { crate::report::list_capped(available, 10) })]
    NoTag {
        layout: PathBuf,
        tag: String,
        /// The layout's tags, sorted.
        available: Vec<String>,
    },
    #[error("Blob {digest} in `{}` has {size} bytes by its descriptor; a manifest, index or config is read only up to {max}", layout.display())]
    TooLarge {
        layout: PathBuf,
        digest: String,
        size: u64,
        max: u64,
    },
    #[error("Blob {digest} is missing from `{}`", layout.display())]
    Missing { layout: PathBuf, digest: String },
    #[error("Blob {digest} has {actual} bytes in `{}`; its descriptor says {expected}", layout.display())]
    Size {
        layout: PathBuf,
        digest: String,
        expected: u64,
        actual: u64,
    },
    #[error("Blob {digest} does not match its digest: its bytes in `{}` hash to {actual}", layout.display())]
    Digest {
        layout: PathBuf,
        digest: String,
        actual: String,
    },
    #[error("Image `{reference}` has no manifest for {os}/{architecture}; it has {available}")]
    NoPlatform {
        /// `oci:DIR:TAG`.
        reference: String,
        os: String,
        architecture: String,
        /// The platforms the index lists ([`super::read::index_platforms`]).
        available: String,
    },
    #[error("Base image `{reference}` is for {found}, the recipe builds for {wanted}")]
    WrongPlatform {
        reference: String,
        found: String,
        wanted: String,
    },
    #[error("Base image `{reference}` has an unsupported {what} media type `{media_type}`")]
    MediaType {
        reference: String,
        what: &'static str,
        media_type: String,
    },
}

impl ReadError {
    /// Whether the file read is simply not there (a layout without `index.json` yet); a
    /// missing blob is [`ReadError::Missing`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}
