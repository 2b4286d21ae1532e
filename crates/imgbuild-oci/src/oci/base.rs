//! Base images from a local OCI image layout (`oci:PATH[:TAG]`).
//!
//! The base's layers are reused byte for byte (never recompressed); Docker media types are
//! renamed to their OCI equivalents, which name the same bytes.

use oci_spec::image::{Descriptor, ImageConfiguration};
use rattler_conda_types::Subdir;

use crate::{
    compression::bounded::{Bound, read_to_end_bounded},
    reference::Base,
};

use super::{
    blobs::BlobStore,
    layout::Layout,
    read::{LayoutImage, ReadError},
};

/// A resolved base image.
#[derive(Debug, Clone)]
pub struct BaseImage {
    /// Where the base came from, as the recipe wrote it.
    pub reference: String,
    /// Digest of the base's manifest, `sha256:<hex>`.
    pub manifest_digest: String,
    pub config: ImageConfiguration,
    /// The base's layers, bottom first, with OCI media types.
    pub layers: Vec<Descriptor>,
    /// The base's blobs: its layout's, or the pull cache's.
    pub blobs: BlobStore,
}

impl BaseImage {
    /// A base read from a local layout.
    pub fn from_layout(layout: &Layout, image: LayoutImage) -> Self {
        Self {
            reference: image.reference,
            manifest_digest: image.manifest_digest,
            config: image.config,
            layers: image.layers,
            blobs: layout.blobs(),
        }
    }

    /// Calls `visit(layer digest, path, entry)` for every tar entry of every layer, bottom
    /// layer first, so a later call for a path overrides an earlier one as in the container.
    /// An error reading a layer becomes `E` through `read_error(layer digest, error)`.
    ///
    /// Each layer is hashed as it is read and held to its descriptor before the next is
    /// read and before this returns, so what a visitor gathered counts only once the bytes
    /// proved to be the base's; a layer that is not (its digest, its size) is that error,
    /// whatever else went wrong reading it.
    pub fn walk_layers<E>(
        &self,
        read_error: impl Fn(String, std::io::Error) -> E,
        mut visit: impl FnMut(&str, &str, &mut tar::Entry<'_, Box<dyn std::io::Read>>) -> Result<(), E>,
    ) -> Result<(), E> {
        for layer in &self.layers {
            let digest = layer.digest().to_string();
            let err = |source| read_error(digest.clone(), source);
            let (reader, check) = self
                .blobs
                .open_checked(layer)
                .map_err(|e| err(std::io::Error::other(e)))?;
            let walked = walk_tar(reader, layer, &mut visit, &err);
            check.finish().map_err(|e| err(std::io::Error::other(e)))?;
            walked?;
        }
        Ok(())
    }
}

/// Calls `visit` for each entry of the layer `reader` reads.
fn walk_tar<E>(
    reader: super::blobs::HashingReader,
    layer: &Descriptor,
    visit: &mut impl FnMut(&str, &str, &mut tar::Entry<'_, Box<dyn std::io::Read>>) -> Result<(), E>,
    err: &impl Fn(std::io::Error) -> E,
) -> Result<(), E> {
    let digest = layer.digest().to_string();
    let reader = super::layer_reader(reader, layer).map_err(err)?;
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(err)? {
        let mut entry = entry.map_err(err)?;
        let path = entry.path().map_err(err)?.to_string_lossy().into_owned();
        visit(&digest, &path, &mut entry)?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("Base image `{reference}` is in a registry and must be pulled")]
    Remote { reference: String },
    #[error(transparent)]
    Layout(#[from] ReadError),
}

/// Opens the base image of a recipe for `platform`; `None` for `scratch`.
pub fn open_base(base: &Base, platform: Subdir) -> Result<Option<BaseImage>, BaseError> {
    match base {
        Base::Scratch => Ok(None),
        Base::OciLayout { path, tag } => {
            let layout = Layout::new(path);
            let image = layout.image(tag, Some(platform))?;
            Ok(Some(BaseImage::from_layout(&layout, image)))
        }
        // Pulling needs the network and credentials: `registry::pull` does it.
        Base::Registry(reference) => Err(BaseError::Remote {
            reference: reference.to_string(),
        }),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GlibcError {
    #[error("Failed to read layer `{digest}` of the base image")]
    Layer {
        digest: String,
        #[source]
        source: std::io::Error,
    },
}

/// The most `libc.so.6` is read into memory for its version.
const MAX_LIBC: u64 = 64 << 20;

/// The glibc version the base image ships, found by reading its layers: the version string
/// inside `libc.so.6` (`… release version 2.36.`) or the name `libc-2.31.so` of older
/// glibcs. `None` when the base has no glibc (scratch, busybox, musl).
pub fn detect_glibc(base: &BaseImage) -> Result<Option<rattler_conda_types::Version>, GlibcError> {
    let mut found = None;
    let layer_error = |digest, source| GlibcError::Layer { digest, source };
    // Later layers override earlier ones, so the last find wins.
    base.walk_layers(layer_error, |digest, path, entry| {
        let Some(name) = path.rsplit('/').next() else {
            return Ok(());
        };
        if !is_library_dir(path) {
            return Ok(());
        }
        if let Some(version) = name
            .strip_prefix("libc-")
            .and_then(|rest| rest.strip_suffix(".so"))
        {
            found = version.parse().ok().or(found.take());
        } else if name == "libc.so.6" && entry.header().entry_type().is_file() {
            // libc.so.6 is 2 MB; 64 MiB of it is no libc but a bomb held in memory.
            let bound = Bound::new(
                MAX_LIBC,
                format!("`{path}` in layer `{digest}`"),
                "the most a libc.so.6 may hold",
            );
            let bytes = read_to_end_bounded(entry, bound)
                .map_err(|source| layer_error(digest.to_string(), source))?;
            found = glibc_version_in(&bytes).or(found.take());
        }
        Ok(())
    })?;
    Ok(found)
}

/// Whether `path` (a tar entry name) is in a directory the dynamic loader searches.
fn is_library_dir(path: &str) -> bool {
    let path = path.trim_start_matches("./").trim_start_matches('/');
    let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
    matches!(dir, "lib" | "lib64" | "usr/lib" | "usr/lib64")
        || dir
            .strip_prefix("lib/")
            .is_some_and(|d| d.ends_with("-linux-gnu"))
        || dir
            .strip_prefix("usr/lib/")
            .is_some_and(|d| d.ends_with("-linux-gnu"))
}

/// Finds `release version X.Y` in the bytes of a `libc.so.6`.
fn glibc_version_in(bytes: &[u8]) -> Option<rattler_conda_types::Version> {
    const MARK: &[u8] = b"GNU C Library";
    let start = bytes.windows(MARK.len()).position(|w| w == MARK)?;
    let tail = &bytes[start..bytes.len().min(start + 200)];
    const VERSION: &[u8] = b"release version ";
    let at = tail.windows(VERSION.len()).position(|w| w == VERSION)? + VERSION.len();
    let digits: String = tail[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .map(|b| *b as char)
        .collect();
    digits.trim_end_matches('.').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_banner_of_libc() {
        let bytes = b"\0\0GNU C Library (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.\nCopyright";
        assert_eq!(glibc_version_in(bytes).unwrap().to_string(), "2.36");
        assert!(glibc_version_in(b"musl libc").is_none());
    }

    #[test]
    fn library_directories() {
        for yes in [
            "lib/libc.so.6",
            "usr/lib/x86_64-linux-gnu/libc.so.6",
            "./lib64/libc-2.17.so",
            "lib/aarch64-linux-gnu/libc.so.6",
        ] {
            assert!(is_library_dir(yes), "{yes}");
        }
        for no in [
            "opt/conda/lib/libc.so.6",
            "usr/share/doc/libc.so.6",
            "libc.so.6",
        ] {
            assert!(!is_library_dir(no), "{no}");
        }
    }
}
