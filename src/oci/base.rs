//! Base images from a local OCI image layout (`oci:PATH[:TAG]`).
//!
//! The base's layers are reused byte for byte (never recompressed); Docker media types are
//! renamed to their OCI equivalents, which name the same bytes.

use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use rattler_conda_types::Subdir;

use crate::recipe::{Base, oci_architecture};

use super::layout::REF_NAME;

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
    /// Directory holding the base's blobs (`…/blobs/sha256`).
    pub blobs_dir: PathBuf,
}

impl BaseImage {
    /// Calls `visit(layer digest, path, entry)` for every tar entry of every layer, bottom
    /// layer first, so a later call for a path overrides an earlier one as in the container.
    /// An error reading a layer becomes `E` through `read_error(layer digest, error)`.
    pub fn walk_layers<E>(
        &self,
        read_error: impl Fn(String, std::io::Error) -> E,
        mut visit: impl FnMut(&str, &str, &mut tar::Entry<'_, Box<dyn std::io::Read>>) -> Result<(), E>,
    ) -> Result<(), E> {
        for layer in &self.layers {
            let digest = layer.digest().to_string();
            let err = |source| read_error(digest.clone(), source);
            let reader = super::layer_reader(
                &self.blobs_dir.join(layer.digest().digest()),
                layer.media_type(),
            )
            .map_err(err)?;
            let mut archive = tar::Archive::new(reader);
            for entry in archive.entries().map_err(err)? {
                let mut entry = entry.map_err(err)?;
                let path = entry.path().map_err(err)?.to_string_lossy().into_owned();
                visit(&digest, &path, &mut entry)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("OCI layout file `{}` cannot be read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("OCI layout `{}` has no tag `{tag}`; it has: {}", path.display(), if available.is_empty() { "no tags".to_string() } else { available.join(", ") })]
    NoSuchTag {
        path: PathBuf,
        tag: String,
        available: Vec<String>,
    },
    #[error("Base image `{reference}` is in a registry and must be pulled")]
    Remote { reference: String },
    #[error("Image `{reference}` has no manifest for {os}/{architecture}; it has {available}")]
    NoPlatform {
        reference: String,
        os: String,
        architecture: String,
        /// The platforms the index lists ([`index_platforms`]).
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

/// Opens the base image of a recipe for `platform`; `None` for `scratch`.
pub fn open_base(base: &Base, platform: Subdir) -> Result<Option<BaseImage>, BaseError> {
    match base {
        Base::Scratch => Ok(None),
        Base::OciLayout { path, tag } => open_layout(path, tag, platform).map(Some),
        // Pulling needs the network and credentials: `registry::pull` does it.
        Base::Registry(reference) => Err(BaseError::Remote {
            reference: reference.to_string(),
        }),
    }
}

/// The platform images a tag of a layout holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagPlatforms {
    /// The image index the tag names, for a multi-platform image.
    pub index_digest: Option<String>,
    /// The conda subdir of each platform image, in index order; one for a plain manifest
    /// (none when its architecture is not one a recipe can name).
    pub platforms: Vec<Subdir>,
}

impl TagPlatforms {
    /// `wanted`, else the build host's platform when the image has it, else its first.
    pub fn choose(&self, wanted: Option<Subdir>) -> Subdir {
        let host = Subdir::current().unwrap_or(Subdir::Linux64);
        wanted
            .or_else(|| self.platforms.contains(&host).then_some(host))
            .or_else(|| self.platforms.first().copied())
            .unwrap_or(host)
    }
}

/// What platforms tag `tag` of the layout at `dir` holds.
pub fn tag_platforms(dir: &Path, tag: &str) -> Result<TagPlatforms, BaseError> {
    let blobs_dir = dir.join("blobs").join("sha256");
    let read_err = |path: PathBuf| move |source| BaseError::Read { path, source };
    let index_path = dir.join("index.json");
    let index = ImageIndex::from_file(&index_path).map_err(read_err(index_path.clone()))?;
    let Some(descriptor) = super::layout::tagged(&index, tag) else {
        // `open_base` says which tags there are.
        return Ok(TagPlatforms {
            index_digest: None,
            platforms: Vec::new(),
        });
    };
    let subdir = |architecture: &str, variant: Option<&str>| {
        let text = match variant {
            Some(variant) => format!("linux/{architecture}/{variant}"),
            None => format!("linux/{architecture}"),
        };
        crate::recipe::OciPlatform::parse_subdir(&text)
    };
    let path = blobs_dir.join(descriptor.digest().digest());
    if is_index(descriptor.media_type()) {
        let nested = ImageIndex::from_file(&path).map_err(read_err(path))?;
        return Ok(TagPlatforms {
            index_digest: Some(descriptor.digest().to_string()),
            platforms: nested
                .manifests()
                .iter()
                .filter_map(|d| {
                    let p = d.platform().as_ref()?;
                    subdir(&p.architecture().to_string(), p.variant().as_deref())
                })
                .collect(),
        });
    }
    let manifest = ImageManifest::from_file(&path).map_err(read_err(path))?;
    let config_path = blobs_dir.join(manifest.config().digest().digest());
    let config = ImageConfiguration::from_file(&config_path).map_err(read_err(config_path))?;
    Ok(TagPlatforms {
        index_digest: None,
        platforms: subdir(
            &config.architecture().to_string(),
            config.variant().as_deref(),
        )
        .into_iter()
        .collect(),
    })
}

fn open_layout(dir: &Path, tag: &str, platform: Subdir) -> Result<BaseImage, BaseError> {
    let reference = format!("oci:{}:{tag}", dir.display());
    let blobs_dir = dir.join("blobs").join("sha256");
    let blob = |descriptor: &Descriptor| blobs_dir.join(descriptor.digest().digest());
    let read_err = |path: PathBuf| move |source| BaseError::Read { path, source };

    let index_path = dir.join("index.json");
    let index = ImageIndex::from_file(&index_path).map_err(read_err(index_path.clone()))?;
    let Some(mut descriptor) = super::layout::tagged(&index, tag).cloned() else {
        let mut available: Vec<String> = index
            .manifests()
            .iter()
            .filter_map(|d| d.annotations().as_ref()?.get(REF_NAME).cloned())
            .collect();
        available.sort();
        return Err(BaseError::NoSuchTag {
            path: dir.to_path_buf(),
            tag: tag.to_string(),
            available,
        });
    };

    let (architecture, variant) = oci_architecture(platform).expect("recipe platforms map to OCI");
    // An image index: pick the manifest of our platform.
    if is_index(descriptor.media_type()) {
        let path = blob(&descriptor);
        let nested = ImageIndex::from_file(&path).map_err(read_err(path))?;
        descriptor = platform_manifest(&nested, architecture, variant)
            .cloned()
            .ok_or_else(|| BaseError::NoPlatform {
                reference: reference.clone(),
                os: "linux".into(),
                architecture: architecture.into(),
                available: index_platforms(&nested),
            })?;
    }
    if !is_manifest(descriptor.media_type()) {
        return Err(BaseError::MediaType {
            reference,
            what: "manifest",
            media_type: descriptor.media_type().to_string(),
        });
    }
    let manifest_path = blob(&descriptor);
    let manifest = ImageManifest::from_file(&manifest_path).map_err(read_err(manifest_path))?;
    let config_path = blob(manifest.config());
    let config = ImageConfiguration::from_file(&config_path).map_err(read_err(config_path))?;
    if config.architecture().to_string() != architecture {
        return Err(BaseError::WrongPlatform {
            reference,
            found: format!("{}/{}", config.os(), config.architecture()),
            wanted: format!("linux/{architecture}"),
        });
    }
    let layers = manifest
        .layers()
        .iter()
        .map(|layer| {
            let media_type =
                oci_layer_media_type(layer.media_type()).ok_or_else(|| BaseError::MediaType {
                    reference: reference.clone(),
                    what: "layer",
                    media_type: layer.media_type().to_string(),
                })?;
            let mut layer = layer.clone();
            layer.set_media_type(media_type);
            Ok(layer)
        })
        .collect::<Result<Vec<_>, BaseError>>()?;
    Ok(BaseImage {
        reference,
        manifest_digest: descriptor.digest().to_string(),
        config,
        layers,
        blobs_dir,
    })
}

/// The manifest of an image index for `linux/architecture[/variant]`; a manifest without
/// a variant matches any variant.
pub fn platform_manifest<'a>(
    index: &'a ImageIndex,
    architecture: &str,
    variant: Option<&str>,
) -> Option<&'a Descriptor> {
    index.manifests().iter().find(|d| {
        d.platform().as_ref().is_some_and(|p| {
            p.os().to_string() == "linux"
                && p.architecture().to_string() == architecture
                && (variant.is_none() || p.variant().is_none() || p.variant().as_deref() == variant)
        })
    })
}

/// The platforms an index lists, for messages: `linux/amd64, linux/arm64/v8`. Entries
/// without a platform, or for `unknown/unknown` (the attestations buildx adds), are left out.
pub fn index_platforms(index: &ImageIndex) -> String {
    let platforms: Vec<String> = index
        .manifests()
        .iter()
        .filter_map(|d| d.platform().as_ref())
        .filter(|p| p.os().to_string() != "unknown")
        .map(|p| {
            let mut text = format!("{}/{}", p.os(), p.architecture());
            if let Some(variant) = p.variant() {
                text = format!("{text}/{variant}");
            }
            text
        })
        .collect();
    if platforms.is_empty() {
        "no platform manifests".into()
    } else {
        platforms.join(", ")
    }
}

fn is_index(media_type: &MediaType) -> bool {
    matches!(media_type, MediaType::ImageIndex)
        || media_type.to_string() == "application/vnd.docker.distribution.manifest.list.v2+json"
}

fn is_manifest(media_type: &MediaType) -> bool {
    matches!(media_type, MediaType::ImageManifest)
        || media_type.to_string() == "application/vnd.docker.distribution.manifest.v2+json"
}

/// The OCI media type for a layer, mapping Docker's names for the same bytes.
pub fn oci_layer_media_type(media_type: &MediaType) -> Option<MediaType> {
    match media_type.to_string().as_str() {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(MediaType::ImageLayerGzip),
        "application/vnd.oci.image.layer.v1.tar+zstd" => Some(MediaType::ImageLayerZstd),
        "application/vnd.oci.image.layer.v1.tar" => Some(MediaType::ImageLayer),
        _ => None,
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
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(entry, &mut bytes)
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
