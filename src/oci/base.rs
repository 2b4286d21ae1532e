//! Base images from a local OCI image layout (`oci:PATH[:TAG]`).
//!
//! The base's layers are reused byte for byte (never recompressed); Docker media types are
//! renamed to their OCI equivalents, which name the same bytes.

use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use rattler_conda_types::Subdir;

use crate::recipe::{Base, oci_architecture};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

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

#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("Base image layout `{}` cannot be read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("Base image layout `{}` has no tag `{tag}`; it has: {}", path.display(), if available.is_empty() { "no tags".to_string() } else { available.join(", ") })]
    NoSuchTag {
        path: PathBuf,
        tag: String,
        available: Vec<String>,
    },
    #[error("Base image `{reference}` has no manifest for {os}/{architecture}")]
    NoPlatform {
        reference: String,
        os: String,
        architecture: String,
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
    }
}

fn open_layout(dir: &Path, tag: &str, platform: Subdir) -> Result<BaseImage, BaseError> {
    let reference = format!("oci:{}:{tag}", dir.display());
    let blobs_dir = dir.join("blobs").join("sha256");
    let blob = |descriptor: &Descriptor| blobs_dir.join(descriptor.digest().digest());
    let read_err = |path: PathBuf| move |source| BaseError::Read { path, source };

    let index_path = dir.join("index.json");
    let index = ImageIndex::from_file(&index_path).map_err(read_err(index_path.clone()))?;
    let tagged = index.manifests().iter().find(|d| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .is_some_and(|name| name == tag)
    });
    let Some(mut descriptor) = tagged.cloned() else {
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
        descriptor = nested
            .manifests()
            .iter()
            .find(|d| {
                d.platform().as_ref().is_some_and(|p| {
                    p.os().to_string() == "linux"
                        && p.architecture().to_string() == architecture
                        && (variant.is_none()
                            || p.variant().is_none()
                            || p.variant().as_deref() == variant)
                })
            })
            .cloned()
            .ok_or_else(|| BaseError::NoPlatform {
                reference: reference.clone(),
                os: "linux".into(),
                architecture: architecture.into(),
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

fn is_index(media_type: &MediaType) -> bool {
    matches!(media_type, MediaType::ImageIndex)
        || media_type.to_string() == "application/vnd.docker.distribution.manifest.list.v2+json"
}

fn is_manifest(media_type: &MediaType) -> bool {
    matches!(media_type, MediaType::ImageManifest)
        || media_type.to_string() == "application/vnd.docker.distribution.manifest.v2+json"
}

/// The OCI media type for a layer, mapping Docker's names for the same bytes.
fn oci_layer_media_type(media_type: &MediaType) -> Option<MediaType> {
    match media_type.to_string().as_str() {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(MediaType::ImageLayerGzip),
        "application/vnd.oci.image.layer.v1.tar+zstd" => Some(MediaType::ImageLayerZstd),
        "application/vnd.oci.image.layer.v1.tar" => Some(MediaType::ImageLayer),
        _ => None,
    }
}
