//! OCI output: canonical JSON, the image layout on disk, base images from local layouts,
//! and the image config and manifest.

pub mod archive;
pub mod base;
pub mod image;
pub mod json;
pub mod layout;

/// The digest of bytes, `sha256:<hex>`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Annotation keys of our own, under a reverse-DNS namespace as the image spec asks.
pub mod annotations {
    pub const COMPRESSION: &str = "dev.imgbuild.compression";
    pub const CUDA_VERSION: &str = "dev.imgbuild.cuda.version";
    pub const CUDA_MIN_DRIVER: &str = "dev.imgbuild.cuda.min-driver";
    pub const PACKAGES: &str = "dev.imgbuild.layer.packages";
    pub const PLATFORM: &str = "dev.imgbuild.conda.platform";
    pub const PREFIX: &str = "dev.imgbuild.conda.prefix";
}
