//! OCI output: canonical JSON, the image layout on disk and reading images back from it,
//! base images from local layouts, and the image config and manifest.

pub mod archive;
pub mod base;
pub mod blobs;
pub mod image;
pub mod json;
pub mod layout;
pub mod read;

/// The uncompressed tar stream of a layer blob's bytes, by its media type (gzip, which may
/// be multi-member; zstd; or plain tar). The blob is opened by
/// [`blobs::BlobStore::open_checked`], which checks what was read.
pub fn layer_reader(
    blob: impl std::io::Read + 'static,
    media_type: &oci_spec::image::MediaType,
) -> std::io::Result<Box<dyn std::io::Read>> {
    let file = std::io::BufReader::with_capacity(1 << 20, blob);
    Ok(match media_type.to_string().as_str() {
        m if m.ends_with("gzip") => Box::new(flate2::read::MultiGzDecoder::new(file)),
        m if m.ends_with("zstd") => Box::new(zstd::Decoder::new(file)?),
        _ => Box::new(file),
    })
}

/// The digest of bytes, `sha256:<hex>`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The layer `[smoke] embed = true` adds (`crate::smoke::embed`): the image's history and
/// its smoke settings name it.
pub mod smoke_layer {
    /// Where the executable lies in the image, relative to `/`: outside the environment, so
    /// it never collides with a package's files.
    pub const IN_IMAGE_PATH: &str = "opt/imgbuild/bin/imgbuild-smoke";
    /// [`IN_IMAGE_PATH`] as the absolute path a container sees.
    pub fn in_image_path() -> String {
        format!("/{IN_IMAGE_PATH}")
    }

    /// The name of its layer in plans, reports and history.
    pub const LAYER_NAME: &str = "imgbuild-smoke";
}

/// The annotation keys, at their old path for the readers of images.
pub use crate::annotations;
