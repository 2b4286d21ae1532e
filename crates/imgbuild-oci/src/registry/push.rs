//! Pushing an image layout: every blob is checked with HEAD first and only what is missing
//! is sent (mounted from the base's repository when it lives in the same registry; one PUT
//! for small blobs, PATCH chunks for large ones), several at a time; manifests go last, as
//! the exact bytes of the layout, so the digest the registry computes is ours.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
};

use futures::{StreamExt, TryStreamExt};
use reqwest::{Method, StatusCode, header};
use sha2::{Digest, Sha256};

use crate::oci::{layout::Layout, read::ReadError};

use super::{
    client::{Body, RegistryError, RepositoryClient},
    reference::Reference,
};

/// Blobs up to this size go in one PUT; larger ones in PATCH chunks of this size.
pub(crate) const CHUNK: usize = 16 << 20;

/// Sets the chunk size, for registries or proxies that limit request bodies.
pub const CHUNK_ENV: &str = "IMGBUILD_PUSH_CHUNK_SIZE";

/// The chunk size: [`CHUNK`], or [`CHUNK_ENV`] bytes when it is a positive integer (anything
/// else is warned of by the command line, as every limit is), at least 1 KiB.
fn chunk_size() -> usize {
    crate::compression::bounded::env_u64(CHUNK_ENV).map_or(CHUNK, |n| {
        usize::try_from(n).unwrap_or(usize::MAX).max(1024)
    })
}
/// Blobs uploaded at once.
const PARALLEL_UPLOADS: usize = 4;

/// Hears about a push as it goes; the library never draws anything itself.
pub trait PushProgress: Send + Sync {
    /// `blobs` will be checked, holding `bytes` in all.
    fn start(&self, _blobs: usize, _bytes: u64) {}
    /// A blob is present now; `sent` says whether its bytes were uploaded.
    fn blob_done(&self, _digest: &str, _size: u64, _sent: bool) {}
    fn finish(&self) {}
}

/// What a push did, for the report and the tests.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushReport {
    /// `REF@sha256:…` of what the tag now points at.
    pub pushed: String,
    pub digest: String,
    pub blobs_total: usize,
    pub blobs_uploaded: usize,
    pub blobs_mounted: usize,
    pub bytes_uploaded: u64,
    pub requests: usize,
    pub retries: usize,
    /// Digests of the SBOM artifacts attached to the image.
    pub sboms: Vec<String>,
    /// Where the SBOMs and the provenance can be found: `referrers-api` or the fallback tag.
    pub sboms_found_by: Option<String>,
    /// Digest of the provenance artifact attached to the image.
    pub provenance: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Layout(#[from] ReadError),
    #[error("Cannot read blob `{}`", path.display())]
    Blob {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to push to `{reference}`")]
    Registry {
        reference: String,
        // Boxed: registry errors are large and travel through every upload task.
        #[source]
        source: Box<RegistryError>,
    },
}

/// One blob to make present in the repository.
#[derive(Debug, Clone)]
struct BlobToPush {
    digest: String,
    size: u64,
    path: PathBuf,
}

/// A manifest to push: digest, exact bytes, media type.
type ManifestBlob = (String, Vec<u8>, String);

/// The manifests a tag of a layout consists of, children first, and the blobs they name.
fn manifests_of(
    layout: &Layout,
    tag: &str,
) -> Result<(Vec<ManifestBlob>, BTreeSet<String>), ReadError> {
    let mut manifests = Vec::new();
    let mut blobs = BTreeSet::new();
    for stored in layout.tag_manifests(tag)? {
        blobs.extend(stored.leaves());
        let media_type = stored.descriptor.media_type().to_string();
        manifests.push((stored.digest(), stored.bytes, media_type));
    }
    // Children before the index that names them.
    manifests.reverse();
    Ok((manifests, blobs))
}

/// Pushes tag `tag` of the layout at `layout` to `target` (whose tag or digest-less name
/// receives it), and to each of `extra_tags`.
pub async fn push(
    layout: &Path,
    tag: &str,
    client: &RepositoryClient,
    extra_tags: &[String],
    mount_from: Option<&Reference>,
    progress: &dyn PushProgress,
) -> Result<PushReport, PushError> {
    let target = &client.reference;
    let registry_err = |source| PushError::Registry {
        reference: target.to_string(),
        source: Box::new(source),
    };
    let layout = Layout::new(layout);
    let (manifests, blob_digests) = manifests_of(&layout, tag)?;
    let blobs = blobs_to_push(&layout, &blob_digests)?;
    progress.start(blobs.len(), blobs.iter().map(|b| b.size).sum());
    let mount_repo = mount_from
        .filter(|from| from.registry == target.registry && from.repository != target.repository)
        .map(|from| from.repository.clone());
    let sent = ensure_blobs(client, &blobs, mount_repo.as_deref(), progress).await?;

    // Manifests last: children by digest, then the top one under each tag.
    let (top_digest, top_bytes, top_type) =
        manifests.last().cloned().expect("a tag has a manifest");
    for (digest, bytes, media_type) in &manifests[..manifests.len() - 1] {
        put_manifest(client, digest, bytes, media_type, digest)
            .await
            .map_err(registry_err)?;
    }
    let target_tag = target.tag.clone().unwrap_or_else(|| tag.to_string());
    let mut tags = vec![target_tag.clone()];
    tags.extend(extra_tags.iter().filter(|t| **t != target_tag).cloned());
    for tag in &tags {
        put_manifest(client, tag, &top_bytes, &top_type, &top_digest)
            .await
            .map_err(registry_err)?;
    }

    progress.finish();
    Ok(PushReport {
        pushed: format!("{}@{top_digest}", target.with_tag(&target_tag)),
        digest: top_digest,
        blobs_total: blobs.len(),
        blobs_uploaded: sent.uploaded.into_inner(),
        blobs_mounted: sent.mounted.into_inner(),
        bytes_uploaded: sent.bytes.into_inner(),
        requests: client.requests.load(Ordering::Relaxed),
        retries: client.retries.load(Ordering::Relaxed),
        sboms: Vec::new(),
        sboms_found_by: None,
        provenance: None,
    })
}

/// The blobs `digests` name in `layout`, with their sizes on disk.
fn blobs_to_push(
    layout: &Layout,
    digests: &BTreeSet<String>,
) -> Result<Vec<BlobToPush>, PushError> {
    digests
        .iter()
        .map(|digest| {
            let path = layout.blob_path(digest);
            let size = fs_err::metadata(&path)
                .map_err(|source| PushError::Blob {
                    path: path.clone(),
                    source,
                })?
                .len();
            Ok(BlobToPush {
                digest: digest.clone(),
                size,
                path,
            })
        })
        .collect()
}

/// What [`ensure_blobs`] had to send: blobs uploaded and mounted, and the bytes uploaded.
#[derive(Default)]
struct Sent {
    uploaded: AtomicUsize,
    mounted: AtomicUsize,
    bytes: AtomicU64,
}

/// Makes every blob present in the repository, [`PARALLEL_UPLOADS`] at a time.
async fn ensure_blobs(
    client: &RepositoryClient,
    blobs: &[BlobToPush],
    mount_repo: Option<&str>,
    progress: &dyn PushProgress,
) -> Result<Sent, PushError> {
    let sent = Sent::default();
    futures::stream::iter(blobs.iter())
        .map(|blob| {
            let sent = &sent;
            async move {
                let outcome = ensure_blob(client, blob, mount_repo).await?;
                match outcome {
                    BlobOutcome::Present => {}
                    BlobOutcome::Mounted => {
                        sent.mounted.fetch_add(1, Ordering::Relaxed);
                    }
                    BlobOutcome::Uploaded => {
                        sent.uploaded.fetch_add(1, Ordering::Relaxed);
                        sent.bytes.fetch_add(blob.size, Ordering::Relaxed);
                    }
                }
                progress.blob_done(
                    &blob.digest,
                    blob.size,
                    matches!(outcome, BlobOutcome::Uploaded),
                );
                Ok::<_, PushError>(())
            }
        })
        .buffer_unordered(PARALLEL_UPLOADS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(sent)
}

enum BlobOutcome {
    Present,
    Mounted,
    Uploaded,
}

/// Makes one blob present, restarting its upload from scratch when a step fails in a way
/// a new session can fix (a chunk applied but its answer lost, a session the registry forgot).
async fn ensure_blob(
    client: &RepositoryClient,
    blob: &BlobToPush,
    mount_repo: Option<&str>,
) -> Result<BlobOutcome, PushError> {
    let registry_err = |source| PushError::Registry {
        reference: client.reference.to_string(),
        source: Box::new(source),
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        match try_blob(client, blob, mount_repo).await {
            Ok(outcome) => return Ok(outcome),
            Err(BlobError::Registry(err)) => {
                // A request that timed out has spent its retry budget on silence; a new
                // session would wait that long again.
                let restartable = !err.is_timeout() && err.is_retryable()
                    || matches!(
                        &err,
                        RegistryError::Status { status, .. }
                            if *status == StatusCode::NOT_FOUND || *status == StatusCode::RANGE_NOT_SATISFIABLE
                    );
                if !restartable || attempt >= 3 {
                    return Err(registry_err(err));
                }
                client.retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("restarting the upload of {}: {err}", blob.digest);
            }
            Err(BlobError::Read(source)) => {
                return Err(PushError::Blob {
                    path: blob.path.clone(),
                    source,
                });
            }
        }
    }
}

enum BlobError {
    Registry(RegistryError),
    Read(std::io::Error),
}

impl From<RegistryError> for BlobError {
    fn from(err: RegistryError) -> Self {
        BlobError::Registry(err)
    }
}

fn with_query(url: &str, query: &str) -> String {
    if url.contains('?') {
        format!("{url}&{query}")
    } else {
        format!("{url}?{query}")
    }
}

fn location(
    client: &RepositoryClient,
    response: &super::client::Response,
) -> Result<String, RegistryError> {
    response
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(|l| client.url(l))
        .ok_or_else(|| RegistryError::Invalid {
            registry: client.reference.registry.clone(),
            what: "upload response (no Location)".into(),
        })
}

/// Makes the file at `path`, blob `digest` of `size` bytes, present in the repository;
/// says whether its bytes were sent.
pub(crate) async fn push_file(
    client: &RepositoryClient,
    digest: &str,
    size: u64,
    path: &Path,
) -> Result<bool, PushError> {
    let blob = BlobToPush {
        digest: digest.to_string(),
        size,
        path: path.to_path_buf(),
    };
    let outcome = ensure_blob(client, &blob, None).await?;
    Ok(matches!(outcome, BlobOutcome::Uploaded))
}

/// Whether the repository already has blob `digest` (HEAD).
pub(crate) async fn blob_exists(
    client: &RepositoryClient,
    digest: &str,
) -> Result<bool, RegistryError> {
    let head = client
        .send(
            Method::HEAD,
            &client.url(&format!("/blobs/{digest}")),
            &[],
            Body::Empty,
            &[StatusCode::OK, StatusCode::NOT_FOUND],
        )
        .await?;
    Ok(head.status == StatusCode::OK)
}

/// Starts an upload of blob `digest`, asking for a mount from `mount_repo` first; `None`
/// when the registry mounted it, else the session URL.
pub(super) async fn start_upload(
    client: &RepositoryClient,
    digest: &str,
    mount_repo: Option<&str>,
) -> Result<Option<String>, RegistryError> {
    // A mount that the registry cannot do starts a normal upload session instead (202).
    let start_url = match mount_repo {
        Some(repo) => client.url(&format!("/blobs/uploads/?mount={digest}&from={repo}")),
        None => client.url("/blobs/uploads/"),
    };
    let started = client
        .send(
            Method::POST,
            &start_url,
            &[],
            Body::Empty,
            &[StatusCode::CREATED, StatusCode::ACCEPTED],
        )
        .await?;
    if started.status == StatusCode::CREATED {
        return Ok(None);
    }
    location(client, &started).map(Some)
}

/// Completes upload session `upload` with the whole blob in one PUT.
pub(super) async fn put_whole(
    client: &RepositoryClient,
    upload: &str,
    digest: &str,
    bytes: bytes::Bytes,
) -> Result<(), RegistryError> {
    client
        .send(
            Method::PUT,
            &with_query(upload, &format!("digest={digest}")),
            &[],
            Body::Bytes(bytes, "application/octet-stream"),
            &[StatusCode::CREATED],
        )
        .await
        .map(|_| ())
}

async fn try_blob(
    client: &RepositoryClient,
    blob: &BlobToPush,
    mount_repo: Option<&str>,
) -> Result<BlobOutcome, BlobError> {
    if blob_exists(client, &blob.digest).await? {
        return Ok(BlobOutcome::Present);
    }
    let Some(mut upload) = start_upload(client, &blob.digest, mount_repo).await? else {
        return Ok(BlobOutcome::Mounted);
    };

    // A regular file of the layout no larger than its descriptor says (a fifo swapped in
    // would wait, a grown file would be read on).
    let mut file =
        crate::fs::open_input(&blob.path, blob.size).map_err(|e| BlobError::Read(e.into()))?;
    let mut hasher = Sha256::new();
    let octets = "application/octet-stream";
    let chunk = chunk_size();
    if blob.size as usize <= chunk {
        let mut bytes = Vec::with_capacity(blob.size as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, blob.size), &mut bytes)
            .map_err(BlobError::Read)?;
        hasher.update(&bytes);
        check_local_digest(client, blob, hasher)?;
        put_whole(client, &upload, &blob.digest, bytes.into()).await?;
        return Ok(BlobOutcome::Uploaded);
    }
    let mut offset = 0u64;
    let mut buffer = vec![0u8; chunk];
    loop {
        let n = read_full(&mut file, &mut buffer).map_err(BlobError::Read)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        let range = format!("{}-{}", offset, offset + n as u64 - 1);
        let response = client
            .send(
                Method::PATCH,
                &upload,
                &[(header::CONTENT_RANGE, range)],
                Body::Bytes(bytes::Bytes::copy_from_slice(&buffer[..n]), octets),
                &[StatusCode::ACCEPTED, StatusCode::NO_CONTENT],
            )
            .await?;
        upload = location(client, &response)?;
        offset += n as u64;
    }
    check_local_digest(client, blob, hasher)?;
    client
        .send(
            Method::PUT,
            &with_query(&upload, &format!("digest={}", blob.digest)),
            &[],
            Body::Empty,
            &[StatusCode::CREATED],
        )
        .await?;
    Ok(BlobOutcome::Uploaded)
}

/// A blob whose bytes on disk no longer match its name must not be sent under that name.
fn check_local_digest(
    client: &RepositoryClient,
    blob: &BlobToPush,
    hasher: Sha256,
) -> Result<(), BlobError> {
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual != blob.digest {
        return Err(BlobError::Registry(RegistryError::DigestMismatch {
            registry: client.reference.registry.clone(),
            what: format!("local blob `{}`", blob.path.display()),
            expected: blob.digest.clone(),
            actual,
        }));
    }
    Ok(())
}

fn read_full(file: &mut impl std::io::Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        let n = std::io::Read::read(file, &mut buffer[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// PUTs a manifest or index as its exact bytes and checks the digest the registry returns.
pub(crate) async fn put_manifest(
    client: &RepositoryClient,
    reference: &str,
    bytes: &[u8],
    media_type: &str,
    digest: &str,
) -> Result<(), RegistryError> {
    let content_type: &'static str = match media_type {
        "application/vnd.oci.image.index.v1+json" => "application/vnd.oci.image.index.v1+json",
        _ => "application/vnd.oci.image.manifest.v1+json",
    };
    let response = client
        .send(
            Method::PUT,
            &client.url(&format!("/manifests/{reference}")),
            &[],
            Body::Bytes(bytes::Bytes::copy_from_slice(bytes), content_type),
            &[StatusCode::CREATED, StatusCode::OK],
        )
        .await?;
    if let Some(returned) = response
        .headers
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        && returned != digest
    {
        return Err(RegistryError::DigestMismatch {
            registry: client.reference.registry.clone(),
            what: "a manifest digest".into(),
            expected: digest.to_string(),
            actual: returned.to_string(),
        });
    }
    Ok(())
}
