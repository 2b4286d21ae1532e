//! OCI output: canonical JSON, the image layout on disk and reading images back from it,
//! base images from local layouts, and the image config and manifest.

pub mod archive;
pub mod base;
pub mod image;
pub mod json;
pub mod layout;
pub mod read;

/// The uncompressed tar stream of a layer blob, by its media type (gzip, which may be
/// multi-member; zstd; or plain tar). A compressed blob is read through a
/// [`Bounded`](crate::compression::bounded::Bounded) reader: it may unpack to
/// [`Bound::ratio`] times its size, and a read past that fails naming the layer.
pub fn layer_reader(
    path: &std::path::Path,
    media_type: &oci_spec::image::MediaType,
) -> std::io::Result<Box<dyn std::io::Read>> {
    use crate::compression::bounded::{Bound, Bounded};
    let file = fs_err::File::open(path)?;
    let size = file.metadata()?.len();
    let file = std::io::BufReader::with_capacity(1 << 20, file);
    let bound = || Bound::ratio(size, format!("layer `{}`", blob_digest(path)));
    Ok(match media_type.to_string().as_str() {
        m if m.ends_with("gzip") => Box::new(Bounded::new(
            flate2::read::MultiGzDecoder::new(file),
            bound(),
        )),
        m if m.ends_with("zstd") => Box::new(Bounded::new(zstd::Decoder::new(file)?, bound())),
        _ => Box::new(file),
    })
}

/// `sha256:<hex>` of the blob at `…/blobs/sha256/<hex>`.
fn blob_digest(path: &std::path::Path) -> String {
    let name = |p: Option<&std::path::Path>| {
        p.and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    format!("{}:{}", name(path.parent()), name(Some(path)))
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
