//! OCI output: canonical JSON, the image layout on disk, base images from local layouts,
//! and the image config and manifest.

pub mod archive;
pub mod base;
pub mod image;
pub mod json;
pub mod layout;

/// The uncompressed tar stream of a layer blob, by its media type (gzip, which may be
/// multi-member; zstd; or plain tar).
pub fn layer_reader(
    path: &std::path::Path,
    media_type: &oci_spec::image::MediaType,
) -> std::io::Result<Box<dyn std::io::Read>> {
    let file = std::io::BufReader::with_capacity(1 << 20, fs_err::File::open(path)?);
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

/// Annotation keys of our own, under a reverse-DNS namespace as the image spec asks.
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

pub mod annotations {
    pub const COMPRESSION: &str = "dev.imgbuild.compression";
    pub const CUDA_VERSION: &str = "dev.imgbuild.cuda.version";
    pub const CUDA_MIN_DRIVER: &str = "dev.imgbuild.cuda.min-driver";
    /// The GPU architectures the environment's libraries carry kernels for, SASS then PTX
    /// (`sm_80,sm_90,compute_90`); see `crate::cuda::fatbin`.
    pub const CUDA_ARCHITECTURES: &str = "dev.imgbuild.cuda.architectures";
    /// The same per package: `package=sm_80,compute_90;…`, by package name.
    pub const CUDA_PACKAGE_ARCHITECTURES: &str = "dev.imgbuild.cuda.package-architectures";
    pub const PACKAGES: &str = "dev.imgbuild.layer.packages";
    pub const PLATFORM: &str = "dev.imgbuild.conda.platform";
    pub const PREFIX: &str = "dev.imgbuild.conda.prefix";
    /// In-image path of the embedded `imgbuild-smoke` executable (`[smoke] embed = true`),
    /// on the manifest and on the layer that holds it.
    pub const SMOKE: &str = "dev.imgbuild.smoke";
}
