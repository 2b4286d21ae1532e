//! Base images from registries: the manifest for the recipe's platform (through an image
//! index when there is one), its config and its layers, each checked against its digest and
//! kept in the cache by digest, so a base is downloaded once and its layers are reused byte
//! for byte.

use std::path::{Path, PathBuf};

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use reqwest::{Method, StatusCode, header};

use super::client::{Body, MANIFEST_LIMIT, RegistryError, RepositoryClient};
use crate::{
    oci::{
        base::BaseImage,
        read::{index_platforms, oci_layer_media_type, platform_manifest},
    },
    report::{Progress, Reporter},
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
pub(crate) fn blob_cache(cache_dir: &Path) -> PathBuf {
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
    let platform = Platform {
        architecture,
        variant,
    };
    pull_base_reporting(client, platform, cache_dir, offline, &crate::report::Silent).await
}

/// The platform a base is pulled for: an OCI architecture and its variant.
#[derive(Debug, Clone, Copy)]
pub struct Platform<'a> {
    pub architecture: &'a str,
    pub variant: Option<&'a str>,
}

impl std::fmt::Display for Platform<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "linux/{}", self.architecture)?;
        match self.variant {
            Some(variant) => write!(f, "/{variant}"),
            None => Ok(()),
        }
    }
}

/// [`pull_base`], telling `reporter` of the blobs and their bytes.
pub async fn pull_base_reporting(
    client: &RepositoryClient,
    platform: Platform<'_>,
    cache_dir: &Path,
    offline: bool,
    reporter: &dyn Reporter,
) -> Result<BaseImage, PullError> {
    let pull = Puller {
        client,
        shown: client.reference.to_string(),
        cache: blob_cache(cache_dir),
        offline,
    };
    let (digest, manifest) = pull.manifest(platform).await?;
    pull.blobs(&manifest, platform, reporter).await?;
    pull.base_image(digest, &manifest, platform.architecture)
}

/// The most bytes of an image config [`pull_config`] reads, as for a layout's JSON.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// A registry image described without its layers: what `inspect` reads of it.
#[derive(Debug, Clone)]
pub struct RemoteImage {
    /// `REGISTRY/REPO@sha256:…` of the platform manifest.
    pub reference: String,
    /// The platform manifest's digest, `sha256:<hex>`.
    pub manifest_digest: String,
    pub manifest: ImageManifest,
    pub config: ImageConfiguration,
}

/// The manifest for `platform` (through the index the reference names, if it does) and its
/// config, each checked against its digest and kept in the cache under `cache_dir`; no layer
/// is downloaded.
pub async fn pull_config(
    client: &RepositoryClient,
    platform: Platform<'_>,
    cache_dir: &Path,
) -> Result<RemoteImage, PullError> {
    let pull = Puller {
        client,
        shown: client.reference.to_string(),
        cache: blob_cache(cache_dir),
        offline: false,
    };
    let (digest, manifest) = pull.manifest(platform).await?;
    let config = manifest.config();
    // The size is the manifest's claim: a config is a few kilobytes of JSON.
    if config.size() > MAX_CONFIG_BYTES {
        return Err(pull.invalid(&format!(
            "an image config of {} bytes (at most {MAX_CONFIG_BYTES} are read)",
            config.size()
        )));
    }
    pull.blob(
        config.digest().as_ref(),
        config.size(),
        &crate::report::Silent,
    )
    .await?;
    let config = ImageConfiguration::from_file(cached(&pull.cache, config.digest().as_ref()))
        .map_err(|_| pull.invalid("image config"))?;
    Ok(RemoteImage {
        reference: client.reference.with_digest(&digest).to_string(),
        manifest_digest: digest,
        manifest,
        config,
    })
}

/// One pull: where it reads from and writes to, and how it names the image in errors.
struct Puller<'a> {
    client: &'a RepositoryClient,
    shown: String,
    cache: PathBuf,
    offline: bool,
}

impl Puller<'_> {
    fn registry_err(&self, source: RegistryError) -> PullError {
        PullError::Registry {
            reference: self.shown.clone(),
            source: Box::new(source),
        }
    }

    fn invalid(&self, what: &str) -> PullError {
        PullError::Invalid {
            reference: self.shown.clone(),
            what: what.to_string(),
        }
    }

    fn not_cached(&self, digest: &str) -> PullError {
        PullError::NotCached {
            reference: self.shown.clone(),
            digest: digest.to_string(),
        }
    }

    fn read_cached(&self, digest: &str) -> Result<Vec<u8>, PullError> {
        fs_err::read(cached(&self.cache, digest)).map_err(|source| PullError::Cache {
            path: cached(&self.cache, digest),
            source,
        })
    }

    /// The manifest for `platform` and its digest: the one the reference names, or, through
    /// the index it names, the platform's.
    pub(crate) async fn manifest(
        &self,
        platform: Platform<'_>,
    ) -> Result<(String, ImageManifest), PullError> {
        let reference = &self.client.reference;
        let mut digest = reference.digest.clone();
        let mut bytes = match &digest {
            Some(d) if cached(&self.cache, d).is_file() => self.read_cached(d)?,
            Some(d) if self.offline => return Err(self.not_cached(d)),
            _ => {
                let bytes = get_manifest(self.client, &reference.manifest_reference())
                    .await
                    .map_err(|e| self.registry_err(e))?;
                let actual = sha256(&bytes);
                if let Some(expected) = &digest
                    && *expected != actual
                {
                    return Err(self.invalid(&format!(
                        "a manifest whose digest is {actual}, not {expected}"
                    )));
                }
                digest = Some(actual);
                bytes
            }
        };
        let mut digest = digest.expect("set above");
        store(&self.cache, &digest, &bytes)?;

        // An index: choose our platform's manifest.
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|_| self.invalid("manifest JSON"))?;
        if value.get("manifests").is_some() {
            digest = self.platform_manifest(&bytes, platform)?;
            bytes = self.platform_manifest_bytes(&digest).await?;
        }
        let manifest = ImageManifest::from_reader(bytes.as_slice())
            .map_err(|_| self.invalid("image manifest"))?;
        Ok((digest, manifest))
    }

    /// The digest of `platform`'s manifest in the index `bytes`.
    pub(crate) fn platform_manifest(
        &self,
        bytes: &[u8],
        platform: Platform<'_>,
    ) -> Result<String, PullError> {
        let index = ImageIndex::from_reader(bytes).map_err(|_| self.invalid("image index"))?;
        let chosen = platform_manifest(&index, platform.architecture, platform.variant)
            .ok_or_else(|| PullError::NoPlatform {
                reference: self.shown.clone(),
                architecture: platform.architecture.to_string(),
                available: index_platforms(&index),
            })?;
        Ok(chosen.digest().to_string())
    }

    /// The platform manifest `digest` names: cached, or fetched, checked and stored.
    async fn platform_manifest_bytes(&self, digest: &str) -> Result<Vec<u8>, PullError> {
        if cached(&self.cache, digest).is_file() {
            return self.read_cached(digest);
        }
        if self.offline {
            return Err(self.not_cached(digest));
        }
        let bytes = get_manifest(self.client, digest)
            .await
            .map_err(|e| self.registry_err(e))?;
        if sha256(&bytes) != digest {
            return Err(self.invalid("a platform manifest that does not match its digest"));
        }
        store(&self.cache, digest, &bytes)?;
        Ok(bytes)
    }

    /// The config and the layers into the cache, each once, reported blob by blob.
    async fn blobs(
        &self,
        manifest: &ImageManifest,
        platform: Platform<'_>,
        reporter: &dyn Reporter,
    ) -> Result<(), PullError> {
        let mut blobs = vec![(
            manifest.config().digest().to_string(),
            manifest.config().size(),
        )];
        blobs.extend(
            manifest
                .layers()
                .iter()
                .map(|l| (l.digest().to_string(), l.size())),
        );
        let platform = platform.to_string();
        reporter.on_progress(Progress::PullStarted {
            reference: &self.shown,
            platform: &platform,
            blobs: blobs.len(),
            bytes: blobs.iter().map(|(_, size)| size).sum(),
        });
        for (blob, size) in &blobs {
            let downloaded = self.blob(blob, *size, reporter).await?;
            reporter.on_progress(Progress::PullBlob {
                bytes: *size,
                downloaded,
            });
        }
        reporter.on_progress(Progress::PullFinished);
        Ok(())
    }

    /// The blob `digest` of `size` bytes into the cache unless it is there; whether it was
    /// downloaded.
    async fn blob(
        &self,
        digest: &str,
        size: u64,
        reporter: &dyn Reporter,
    ) -> Result<bool, PullError> {
        if cached(&self.cache, digest).is_file() {
            return Ok(false);
        }
        if self.offline {
            return Err(self.not_cached(digest));
        }
        download_blob(self.client, digest, size, &self.cache, reporter)
            .await
            .map_err(|e| match e {
                BlobDownloadError::Registry(err) => self.registry_err(err),
                BlobDownloadError::Io(source) => PullError::Cache {
                    path: cached(&self.cache, digest),
                    source,
                },
            })?;
        Ok(true)
    }

    /// The pulled base: its config (for the architecture asked) and its layers with OCI
    /// media types, read from the cache.
    fn base_image(
        &self,
        digest: String,
        manifest: &ImageManifest,
        architecture: &str,
    ) -> Result<BaseImage, PullError> {
        let config_path = cached(&self.cache, manifest.config().digest().as_ref());
        let config = ImageConfiguration::from_file(&config_path)
            .map_err(|_| self.invalid("image config"))?;
        if config.architecture().to_string() != architecture {
            return Err(PullError::NoPlatform {
                reference: self.shown.clone(),
                architecture: architecture.to_string(),
                available: format!("{}/{}", config.os(), config.architecture()),
            });
        }
        let layers = manifest
            .layers()
            .iter()
            .map(|layer| {
                let media_type = oci_layer_media_type(layer.media_type()).ok_or_else(|| {
                    PullError::MediaType {
                        reference: self.shown.clone(),
                        media_type: layer.media_type().to_string(),
                    }
                })?;
                let mut layer = layer.clone();
                layer.set_media_type(media_type);
                Ok(layer)
            })
            .collect::<Result<Vec<_>, PullError>>()?;
        Ok(BaseImage {
            reference: self.client.reference.with_digest(&digest).to_string(),
            manifest_digest: digest,
            config,
            layers,
            blobs: crate::oci::blobs::BlobStore::flat(&self.cache),
        })
    }
}

/// A manifest (or index) as the registry serves it: what a signature names and what an
/// attached artifact's `subject` describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestDescriptor {
    /// `sha256:<hex>` of the bytes served.
    pub digest: String,
    pub size: u64,
    pub media_type: String,
}

/// The manifest `reference` (a tag or digest of `client`'s repository; the client's own
/// when `None`) names now, from the bytes the registry serves, never from its headers.
pub async fn manifest_descriptor(
    client: &RepositoryClient,
    reference: Option<&str>,
) -> Result<ManifestDescriptor, RegistryError> {
    let reference = reference.map_or_else(|| client.reference.manifest_reference(), str::to_string);
    let bytes = get_manifest(client, &reference).await?;
    let media_type = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["mediaType"].as_str().map(str::to_string))
        .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".to_string());
    Ok(ManifestDescriptor {
        digest: crate::oci::sha256_digest(&bytes),
        size: bytes.len() as u64,
        media_type,
    })
}

async fn get_manifest(
    client: &RepositoryClient,
    reference: &str,
) -> Result<Vec<u8>, RegistryError> {
    let response = client
        .send_reading(
            Method::GET,
            &client.url(&format!("/manifests/{reference}")),
            &[(header::ACCEPT, ACCEPT.to_string())],
            Body::Empty,
            &[StatusCode::OK],
            MANIFEST_LIMIT,
        )
        .await?;
    Ok(response.body.to_vec())
}

enum BlobDownloadError {
    Registry(RegistryError),
    Io(std::io::Error),
}

/// Downloads a blob of `size` bytes into the cache, streaming, checking its size and digest
/// ([`RepositoryClient::download`]); the cache never holds a partial or wrong blob under a
/// digest's name, nor a temporary file past `size`. Its bytes are reported as they arrive.
async fn download_blob(
    client: &RepositoryClient,
    digest: &str,
    size: u64,
    cache: &Path,
    reporter: &dyn Reporter,
) -> Result<(), BlobDownloadError> {
    fs_err::create_dir_all(cache).map_err(BlobDownloadError::Io)?;
    let temp = tempfile::Builder::new()
        .prefix(".download-")
        .tempfile_in(cache)
        .map_err(BlobDownloadError::Io)?;
    let url = client.url(&format!("/blobs/{digest}"));
    let downloading = client.download(&url, digest, size, temp.path());
    watch_growth(downloading, temp.path(), reporter)
        .await
        .map_err(BlobDownloadError::Registry)?;
    crate::fs::set_mode(temp.path(), 0o644).map_err(BlobDownloadError::Io)?;
    temp.persist(cached(cache, digest))
        .map_err(|e| BlobDownloadError::Io(e.error))?;
    Ok(())
}

/// How often a download's file is looked at for its bytes.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// Drives `downloading` (which writes `path`), reporting the file's growth as bytes
/// received, and once it is done, the rest of its length. The registry client streams into
/// the file and knows nothing of progress; the file's length is what arrived (a retry
/// starts the file again, and its bytes are counted once they pass what was counted).
async fn watch_growth<T>(
    downloading: impl std::future::Future<Output = T>,
    path: &Path,
    reporter: &dyn Reporter,
) -> T {
    let mut downloading = std::pin::pin!(downloading);
    let mut tick = tokio::time::interval(WATCH_EVERY);
    let mut counted = 0;
    let report = |counted: &mut u64| {
        let length = fs_err::metadata(path).map_or(0, |m| m.len());
        if length > *counted {
            reporter.on_progress(Progress::PullBytes(length - *counted));
            *counted = length;
        }
    };
    let result = loop {
        tokio::select! {
            result = &mut downloading => break result,
            _ = tick.tick() => report(&mut counted),
        }
    };
    report(&mut counted);
    result
}
