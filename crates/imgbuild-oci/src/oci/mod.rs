//! OCI output: canonical JSON, the image layout on disk and reading images back from it,
//! base images from local layouts, and the image config and manifest.

pub mod accounts;
pub mod archive;
pub mod base;
pub mod blobs;
pub mod image;
pub(crate) mod json;
pub mod layout;
pub mod read;
pub(crate) mod read_error;
pub mod rootfs;

/// The uncompressed tar stream of the blob of `layer`, by its media type (gzip, which may be
/// multi-member; zstd; or plain tar). The blob is opened by
/// [`blobs::BlobStore::open_checked`], which checks what was read; a compressed one is read
/// through a [`Bounded`](crate::compression::bounded::Bounded) reader: it may unpack to
/// [`Bound::ratio`] times its descriptor's size, and a read past that fails naming the layer.
pub fn layer_reader(
    blob: impl std::io::Read + 'static,
    layer: &oci_spec::image::Descriptor,
) -> std::io::Result<Box<dyn std::io::Read>> {
    use crate::compression::bounded::{Bound, Bounded};
    let file = std::io::BufReader::with_capacity(1 << 20, blob);
    let bound = || Bound::ratio(layer.size(), format!("layer `{}`", layer.digest()));
    Ok(match layer.media_type().to_string().as_str() {
        m if m.ends_with("gzip") => Box::new(Bounded::new(
            flate2::read::MultiGzDecoder::new(file),
            bound(),
        )),
        m if m.ends_with("zstd") => Box::new(Bounded::new(zstd::Decoder::new(file)?, bound())),
        _ => Box::new(file),
    })
}

/// The digest of bytes, `sha256:<hex>`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The annotation keys, at their old path for the readers of images.
pub use imgbuild_model::annotations;
