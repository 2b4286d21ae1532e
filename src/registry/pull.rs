//! Base images from registries: the manifest for the recipe's platform (through an image
//! index when there is one), its config and its layers, each checked against its digest and
//! kept in the cache by digest, so a base is downloaded once and its layers are reused byte
//! for byte.

use std::path::{Path, PathBuf};

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use reqwest::{Method, StatusCode, header};

use super::client::{Body, RegistryError, RepositoryClient};
use crate::oci::{
    base::BaseImage,
    read::{index_platforms, oci_layer_media_type, platform_manifest},
};

const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("Failed to pull base image `{reference}`")]
    Registry {
        reference: String,
        #[source]
        source: Box<RegistryError>,
    },
    #[error("Image `{reference}` has no manifest for linux/{architecture}; it has {available}")]
    NoPlatform {
        reference: String,
        architecture: String,
        /// The platforms of the index, or the one image's (`linux/arm64`).
        available: String,
    },
    #[error("Base image `{reference}` sent {what} that is not valid")]
    Invalid { reference: String, what: String },
    #[error("Base image `{reference}` has a layer of unsupported media type `{media_type}`")]
    MediaType {
        reference: String,
        media_type: String,
    },
    #[error(
        "Base image `{reference}` is pinned to {digest}, which is not in the cache; build once with the network"
    )]
    NotCached { reference: String, digest: String },
    #[error("Failed to write the blob cache `{}`", path.display())]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The blob cache shared by pulls: `<cache>/blobs/sha256/<hex>`.
pub fn blob_cache(cache_dir: &Path) -> PathBuf {
    cache_dir.join("blobs").join("sha256")
}

fn cached(cache: &Path, digest: &str) -> PathBuf {
    cache.join(digest.trim_start_matches("sha256:"))
}

fn sha256(bytes: &[u8]) -> String {
    crate::oci::sha256_digest(bytes)
}

/// Stores verified bytes in the cache under their digest.
fn store(cache: &Path, digest: &str, bytes: &[u8]) -> Result<(), PullError> {
    let path = cached(cache, digest);
    let err = |source| PullError::Cache {
        path: path.clone(),
        source,
    };
    fs_err::create_dir_all(cache).map_err(err)?;
    crate::fs::write_atomic(&path, bytes).map_err(err)
}

/// Pulls `reference` for `architecture` (`amd64`, `arm64`…) into the cache. With
/// `offline`, only a digest-pinned reference whose blobs are all cached works.
pub async fn pull_base(
    client: &RepositoryClient,
    architecture: &str,
    variant: Option<&str>,
    cache_dir: &Path,
    offline: bool,
) -> Result<BaseImage, PullError> {
    let reference = &client.reference;
    let shown = reference.to_string();
    let cache = blob_cache(cache_dir);
    let registry_err = |source| PullError::Registry {
        reference: shown.clone(),
        source: Box::new(source),
    };
    let invalid = |what: &str| PullError::Invalid {
        reference: shown.clone(),
        what: what.to_string(),
    };

    // The manifest (or index) the reference names.
    let mut digest = reference.digest.clone();
    let mut bytes = match &digest {
        Some(d) if cached(&cache, d).is_file() => {
            fs_err::read(cached(&cache, d)).map_err(|source| PullError::Cache {
                path: cached(&cache, d),
                source,
            })?
        }
        Some(d) if offline => {
            return Err(PullError::NotCached {
                reference: shown.clone(),
                digest: d.clone(),
            });
        }
        _ => {
            let bytes = get_manifest(client, &reference.manifest_reference())
                .await
                .map_err(registry_err)?;
            let actual = sha256(&bytes);
            if let Some(expected) = &digest
                && *expected != actual
            {
                return Err(invalid(&format!(
                    "a manifest whose digest is {actual}, not {expected}"
                )));
            }
            digest = Some(actual);
            bytes
        }
    };
    let mut digest = digest.expect("set above");
    store(&cache, &digest, &bytes)?;

    // An index: choose our platform's manifest.
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| invalid("manifest JSON"))?;
    if value.get("manifests").is_some() {
        let index =
            ImageIndex::from_reader(bytes.as_slice()).map_err(|_| invalid("image index"))?;
        let chosen = platform_manifest(&index, architecture, variant).ok_or_else(|| {
            PullError::NoPlatform {
                reference: shown.clone(),
                architecture: architecture.to_string(),
                available: index_platforms(&index),
            }
        })?;
        digest = chosen.digest().to_string();
        bytes = if cached(&cache, &digest).is_file() {
            fs_err::read(cached(&cache, &digest)).map_err(|source| PullError::Cache {
                path: cached(&cache, &digest),
                source,
            })?
        } else if offline {
            return Err(PullError::NotCached {
                reference: shown.clone(),
                digest,
            });
        } else {
            let bytes = get_manifest(client, &digest).await.map_err(registry_err)?;
            if sha256(&bytes) != digest {
                return Err(invalid(
                    "a platform manifest that does not match its digest",
                ));
            }
            store(&cache, &digest, &bytes)?;
            bytes
        };
    }
    let manifest =
        ImageManifest::from_reader(bytes.as_slice()).map_err(|_| invalid("image manifest"))?;

    // Config and layers, each once.
    let mut blobs = vec![manifest.config().digest().to_string()];
    blobs.extend(manifest.layers().iter().map(|l| l.digest().to_string()));
    for blob in &blobs {
        if cached(&cache, blob).is_file() {
            continue;
        }
        if offline {
            return Err(PullError::NotCached {
                reference: shown.clone(),
                digest: blob.clone(),
            });
        }
        download_blob(client, blob, &cache)
            .await
            .map_err(|e| match e {
                DownloadError::Registry(err) => registry_err(err),
                DownloadError::Mismatch(actual) => {
                    invalid(&format!("blob {blob} whose content hashes to {actual}"))
                }
                DownloadError::Io(source) => PullError::Cache {
                    path: cached(&cache, blob),
                    source,
                },
            })?;
    }
    let config_path = cached(&cache, &blobs[0]);
    let config =
        ImageConfiguration::from_file(&config_path).map_err(|_| invalid("image config"))?;
    if config.architecture().to_string() != architecture {
        return Err(PullError::NoPlatform {
            reference: shown.clone(),
            architecture: architecture.to_string(),
            available: format!("{}/{}", config.os(), config.architecture()),
        });
    }
    let layers = manifest
        .layers()
        .iter()
        .map(|layer| {
            let media_type =
                oci_layer_media_type(layer.media_type()).ok_or_else(|| PullError::MediaType {
                    reference: shown.clone(),
                    media_type: layer.media_type().to_string(),
                })?;
            let mut layer = layer.clone();
            layer.set_media_type(media_type);
            Ok(layer)
        })
        .collect::<Result<Vec<_>, PullError>>()?;
    Ok(BaseImage {
        reference: reference.with_digest(&digest).to_string(),
        manifest_digest: digest,
        config,
        layers,
        blobs_dir: cache,
    })
}

async fn get_manifest(
    client: &RepositoryClient,
    reference: &str,
) -> Result<Vec<u8>, RegistryError> {
    let response = client
        .send(
            Method::GET,
            &client.url(&format!("/manifests/{reference}")),
            &[(header::ACCEPT, ACCEPT.to_string())],
            Body::Empty,
            &[StatusCode::OK],
        )
        .await?;
    Ok(response.body.to_vec())
}

enum DownloadError {
    Registry(RegistryError),
    Mismatch(String),
    Io(std::io::Error),
}

/// Downloads a blob into the cache, streaming, checking its digest; the cache never holds a
/// partial or wrong blob under a digest's name.
async fn download_blob(
    client: &RepositoryClient,
    digest: &str,
    cache: &Path,
) -> Result<(), DownloadError> {
    fs_err::create_dir_all(cache).map_err(DownloadError::Io)?;
    let temp = tempfile::Builder::new()
        .prefix(".download-")
        .tempfile_in(cache)
        .map_err(DownloadError::Io)?;
    let actual = client
        .download(&client.url(&format!("/blobs/{digest}")), temp.path())
        .await
        .map_err(DownloadError::Registry)?;
    if actual != digest {
        return Err(DownloadError::Mismatch(actual));
    }
    crate::fs::set_mode(temp.path(), 0o644).map_err(DownloadError::Io)?;
    temp.persist(cached(cache, digest))
        .map_err(|e| DownloadError::Io(e.error))?;
    Ok(())
}
