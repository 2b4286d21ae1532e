//! A registry repository as a layer cache shared by builders (`--cache-repo REGISTRY/REPO`):
//! CI runners and build pods that start empty take the layers another builder compressed.
//!
//! **The stored form.** The entry under layer key `K` (the local layer cache's key, see
//! [`crate::layers::cache`]) is an OCI image manifest tagged `layer-K` in the cache
//! repository. Its config, of media type [`ENTRY_MEDIA_TYPE`], is a small JSON document
//! ([`EntryConfig`]: the key, the compression, the layer's diff_id and tar size); its one
//! layer is the layer blob itself, with the layer's own annotations (an eStargz or
//! zstd:chunked TOC). A tagged manifest keeps its blobs from the registry's garbage
//! collector, and the form needs no referrers API, so distribution 2.8 stores it as an OCI
//! 1.1 registry does. The same layer gives the same manifest bytes on every builder, so two
//! builders writing one key write the same thing.
//!
//! **Trust.** The repository is the operator's choice (a flag or `IMGBUILD_CACHE_REPO`, never
//! the recipe or the lock), and still no entry is believed: the config and the blob are
//! checked against their digests as they arrive, and the layer cache then checks the blob
//! in full against the layer's tar before it enters an image ([`crate::layers::remote`]).
//!
//! **Failure.** A cache is an optimisation: an unreachable repository, a 401 or 403, or a
//! malformed entry is a warning and a cold build of the layer, never a failed build. The
//! first failure of the repository itself (not of one entry) stops its use for the build.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};

use base64::Engine as _;

use futures::StreamExt;
use reqwest::{Method, StatusCode, header};
use serde::{Deserialize, Serialize};

use super::{
    client::{Body, Limit, MANIFEST_LIMIT, RegistryError, RepositoryClient},
    push::{PushError, push_file, put_manifest},
    referrers::put_blob,
};
use crate::{
    layers::{
        Compression, LayerBlob,
        remote::{SharedCache, SharedEntry},
    },
    report::Reporter,
    sign::{Signer, Verifier},
};

/// The media type of an entry's config.
pub const ENTRY_MEDIA_TYPE: &str = "application/vnd.imgbuild.layer-cache.entry.v1+json";
/// What an entry's config says it is; bumped when the entry's meaning changes.
const ENTRY_FORMAT: &str = "imgbuild-layer-cache-entry/1";
/// The manifest annotation holding a signed entry's signature: base64 of an OpenPGP signed
/// message whose payload is the config's exact bytes.
pub const SIGNATURE_ANNOTATION: &str = "dev.imgbuild.cache.signature";
/// An entry is tagged this and the layer key.
pub const TAG_PREFIX: &str = "layer-";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// An entry's config: a key, a compression and two numbers; 64 KiB leaves room.
const ENTRY_LIMIT: Limit = Limit {
    bytes: 64 << 10,
    what: "a layer cache entry",
};
/// Entries written at once when the build is done.
const PARALLEL_STORES: usize = 4;

/// An entry's config: what the blob holds, beside what the manifest's descriptor says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntryConfig {
    format: String,
    key: String,
    compression: String,
    diff_id: String,
    tar_size: u64,
    /// The blob, as the manifest's one layer names it: so a signature over the config
    /// covers every claim of the entry.
    layer: EntryDescriptor,
}

/// The manifest of an entry, as far as it is read and written.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntryManifest {
    schema_version: u32,
    media_type: String,
    config: EntryDescriptor,
    layers: Vec<EntryDescriptor>,
    /// [`SIGNATURE_ANNOTATION`], when the writer signed the entry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EntryDescriptor {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

/// A layer offered to the cache, stored once the build is done.
#[derive(Debug, Clone)]
struct Offer {
    key: String,
    blob: LayerBlob,
    path: std::path::PathBuf,
    compression: Compression,
}

/// What the cache did for one build, for its summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheRepoSummary {
    /// `REGISTRY/REPO`.
    pub repository: String,
    /// Layers looked up after a local miss.
    pub looked_up: usize,
    /// Looked-up layers taken from the repository and checked here.
    pub hits: usize,
    /// Entries downloaded that failed their check here.
    pub rejected: usize,
    /// Layers written to the repository.
    pub stored: usize,
    /// Offered layers the repository already held.
    pub present: usize,
    pub bytes_downloaded: u64,
    pub bytes_uploaded: u64,
    pub readonly: bool,
    /// Why the repository stopped being used, when it did.
    pub unusable: Option<String>,
}

/// Why a request to the cache did not give what it asked for.
enum Problem {
    /// The repository cannot be used at all: unreachable, refusing us.
    Repository(String),
    /// This entry cannot be used.
    Entry(String),
}

impl Problem {
    fn of(err: &RegistryError) -> Problem {
        let repository_wide = match err {
            RegistryError::Status { status, .. } => {
                *status == StatusCode::UNAUTHORIZED || *status == StatusCode::FORBIDDEN
            }
            RegistryError::Unreachable { .. }
            | RegistryError::TimedOut { .. }
            | RegistryError::PlainHttp { .. }
            | RegistryError::Unauthorized { .. }
            | RegistryError::Challenge { .. }
            | RegistryError::InsecureRealm { .. }
            | RegistryError::CredentialsWithheld { .. } => true,
            _ => false,
        };
        let text = error_text(err);
        if repository_wide {
            Problem::Repository(text)
        } else {
            Problem::Entry(text)
        }
    }
}

/// An error with its causes, on one line.
fn error_text(err: &dyn std::error::Error) -> String {
    imgbuild_model::http::error_chain(err)
}

/// `--cache-sign-by` and `--cache-verify-key`: the key entries this build writes are signed
/// with, and the key entries it reads must be signed by.
#[derive(Clone, Default)]
pub struct EntryKeys {
    pub signer: Option<Arc<Signer>>,
    pub verifier: Option<Arc<Verifier>>,
}

impl std::fmt::Debug for EntryKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryKeys")
            .field("signer", &self.signer.as_ref().map(|s| s.fingerprint()))
            .field("verifier", &self.verifier.as_ref().map(|v| v.fingerprint()))
            .finish()
    }
}

/// The shared layer cache in one registry repository.
pub struct CacheRepo {
    client: RepositoryClient,
    readonly: bool,
    keys: EntryKeys,
    /// The build's runtime: the layer writer's threads are not its own, and block on it.
    runtime: tokio::runtime::Handle,
    /// Set, with its reason, once the repository cannot be used.
    unusable: Mutex<Option<String>>,
    offers: Mutex<Vec<Offer>>,
    looked_up: AtomicUsize,
    hits: AtomicUsize,
    rejected: AtomicUsize,
    bytes_downloaded: AtomicU64,
}

impl CacheRepo {
    /// The cache in `client`'s repository; `readonly` never writes it. Must be made on the
    /// build's runtime.
    pub fn new(client: RepositoryClient, readonly: bool, keys: EntryKeys) -> Self {
        CacheRepo {
            client,
            readonly,
            keys,
            runtime: tokio::runtime::Handle::current(),
            unusable: Mutex::default(),
            offers: Mutex::default(),
            looked_up: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
            bytes_downloaded: AtomicU64::new(0),
        }
    }

    fn repository(&self) -> String {
        format!(
            "{}/{}",
            self.client.reference.registry, self.client.reference.repository
        )
    }

    fn is_usable(&self) -> bool {
        self.unusable.lock().expect("not poisoned").is_none()
    }

    /// Records `problem`; the first problem of the repository itself is warned of and ends
    /// its use, a problem of one entry is warned of with the layer's `name`.
    fn note(&self, problem: Problem, name: &str, reporter: &dyn Reporter) {
        match problem {
            Problem::Repository(why) => {
                let mut unusable = self.unusable.lock().expect("not poisoned");
                if unusable.is_none() {
                    reporter.on_warning(&format!(
                        "layer cache repository `{}` cannot be used ({why}); building without it",
                        self.repository()
                    ));
                    *unusable = Some(why);
                }
            }
            Problem::Entry(why) => reporter.on_warning(&format!(
                "layer `{name}`: the entry in layer cache repository `{}` cannot be used ({why}); building the layer",
                self.repository()
            )),
        }
    }

    /// The entry under `key`, its blob downloaded into `dir`.
    async fn lookup(
        &self,
        key: &str,
        compression: Compression,
        dir: &Path,
    ) -> Result<Option<SharedEntry>, Problem> {
        let tag = format!("{TAG_PREFIX}{key}");
        let Some(manifest) = get_manifest(&self.client, &tag).await? else {
            return Ok(None);
        };
        let EntryManifest {
            config: config_descriptor,
            layers,
            annotations,
            ..
        } = check_manifest(manifest, compression)
            .map_err(|why| Problem::Entry(format!("its manifest {why}")))?;
        let [layer] = <[EntryDescriptor; 1]>::try_from(layers).expect("checked: one layer");
        let (config, config_bytes) = get_config(&self.client, &config_descriptor).await?;
        check_config(&config, key, compression)
            .map_err(|why| Problem::Entry(format!("its config {why}")))?;
        if config.layer != layer {
            return Err(Problem::Entry(
                "its config and its manifest name different blobs".into(),
            ));
        }
        let signed = match &self.keys.verifier {
            Some(verifier) => {
                check_signature(verifier, &annotations, &config_bytes).map_err(Problem::Entry)?;
                true
            }
            None => false,
        };
        let path = self.download(&layer, dir).await?;
        self.bytes_downloaded
            .fetch_add(layer.size, Ordering::Relaxed);
        let blob = LayerBlob {
            diff_id: config.diff_id,
            digest: layer.digest,
            size: layer.size,
            tar_size: config.tar_size,
            media_type: compression.media_type(),
            annotations: layer.annotations,
        };
        Ok(Some(SharedEntry { blob, path, signed }))
    }

    /// The blob `layer` names, streamed into a new file in `dir`, its size and digest
    /// checked as it arrives.
    async fn download(
        &self,
        layer: &EntryDescriptor,
        dir: &Path,
    ) -> Result<std::path::PathBuf, Problem> {
        let temp = tempfile::Builder::new()
            .prefix(".shared-")
            .tempfile_in(dir)
            .map_err(|e| Problem::Entry(format!("cannot make a file in `{}`: {e}", dir.display())))?
            .into_temp_path();
        let url = self.client.url(&format!("/blobs/{}", layer.digest));
        self.client
            .download(&url, &layer.digest, layer.size, &temp)
            .await
            .map_err(|e| Problem::of(&e))?;
        temp.keep()
            .map_err(|e| Problem::Entry(format!("cannot keep the download: {e}")))
    }

    /// Writes every layer offered and not yet in the repository: the blob, the config, then
    /// the tagged manifest, so a tag only ever names blobs that are there. Warns instead of
    /// failing; does nothing when read-only or unusable.
    pub async fn store_offered(&self, reporter: &dyn Reporter) -> CacheRepoSummary {
        let offers = std::mem::take(&mut *self.offers.lock().expect("not poisoned"));
        let mut seen = BTreeSet::new();
        let offers: Vec<Offer> = offers
            .into_iter()
            .filter(|offer| seen.insert(offer.key.clone()))
            .collect();
        let stored = AtomicUsize::new(0);
        let present = AtomicUsize::new(0);
        let uploaded = AtomicU64::new(0);
        if !self.readonly {
            futures::stream::iter(&offers)
                .for_each_concurrent(PARALLEL_STORES, |offer| async {
                    if !self.is_usable() {
                        return;
                    }
                    match self.store(offer).await {
                        Ok(None) => {
                            present.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Some(bytes)) => {
                            stored.fetch_add(1, Ordering::Relaxed);
                            uploaded.fetch_add(bytes, Ordering::Relaxed);
                        }
                        Err(problem) => self.note(problem, &offer.blob.digest, reporter),
                    }
                })
                .await;
        }
        CacheRepoSummary {
            repository: self.repository(),
            looked_up: self.looked_up.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            stored: stored.into_inner(),
            present: present.into_inner(),
            bytes_downloaded: self.bytes_downloaded.load(Ordering::Relaxed),
            bytes_uploaded: uploaded.into_inner(),
            readonly: self.readonly,
            unusable: self.unusable.lock().expect("not poisoned").clone(),
        }
    }

    /// Writes one entry unless its tag is there already; the bytes of the blob sent, or
    /// `None` when it was there. An entry is never replaced by an unsigned one (a reader that
    /// trusts a key would lose it); a signing builder replaces any other than its own bytes.
    async fn store(&self, offer: &Offer) -> Result<Option<u64>, Problem> {
        let signer = self.keys.signer.as_deref();
        let (manifest, config) = entry_documents(offer, signer).map_err(Problem::Entry)?;
        let digest = crate::oci::sha256_digest(&manifest);
        let tag = format!("{TAG_PREFIX}{}", offer.key);
        match self.tagged(&tag).await? {
            Some(present) if present == digest || signer.is_none() => return Ok(None),
            _ => {}
        }
        let sent = push_file(
            &self.client,
            &offer.blob.digest,
            offer.blob.size,
            &offer.path,
        )
        .await
        .map_err(|e| match e {
            PushError::Registry { source, .. } => Problem::of(&source),
            other => Problem::Entry(error_text(&other)),
        })?;
        put_blob(&self.client, &config)
            .await
            .map_err(|e| Problem::of(&e))?;
        put_manifest(&self.client, &tag, &manifest, MANIFEST_MEDIA_TYPE, &digest)
            .await
            .map_err(|e| Problem::of(&e))?;
        Ok(Some(if sent { offer.blob.size } else { 0 }))
    }

    /// The digest of the manifest `tag` names, if any (a HEAD: the registry's digest, or
    /// none it gives).
    async fn tagged(&self, tag: &str) -> Result<Option<String>, Problem> {
        let answer = self
            .client
            .send(
                Method::HEAD,
                &self.client.url(&format!("/manifests/{tag}")),
                &[(header::ACCEPT, MANIFEST_MEDIA_TYPE.to_string())],
                Body::Empty,
                &[StatusCode::OK, StatusCode::NOT_FOUND],
            )
            .await
            .map_err(|e| Problem::of(&e))?;
        if answer.status != StatusCode::OK {
            return Ok(None);
        }
        let named = answer
            .headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok());
        Ok(Some(named.unwrap_or_default().to_string()))
    }
}

impl SharedCache for CacheRepo {
    fn serves(&self, compression: Compression) -> bool {
        compression.seekable().is_none() || self.keys.verifier.is_some()
    }

    fn fetch(
        &self,
        name: &str,
        key: &str,
        compression: Compression,
        dir: &Path,
        reporter: &dyn Reporter,
    ) -> Option<SharedEntry> {
        if !self.is_usable() {
            return None;
        }
        self.looked_up.fetch_add(1, Ordering::Relaxed);
        // The writer's threads are plain threads (or, for a one-layer build, a worker of
        // this runtime, which `block_in_place` hands its other tasks from).
        let found = tokio::task::block_in_place(|| {
            self.runtime.block_on(self.lookup(key, compression, dir))
        });
        match found {
            Ok(Some(entry)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(entry)
            }
            Ok(None) => None,
            Err(problem) => {
                self.note(problem, name, reporter);
                None
            }
        }
    }

    fn rejected(&self, _key: &str) {
        self.hits.fetch_sub(1, Ordering::Relaxed);
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    fn offer(&self, key: &str, blob: &LayerBlob, path: &Path, compression: Compression) {
        if self.readonly {
            return;
        }
        self.offers.lock().expect("not poisoned").push(Offer {
            key: key.to_string(),
            blob: blob.clone(),
            path: path.to_path_buf(),
            compression,
        });
    }
}

/// One entry of a cache repository, as `imgbuild cache ls` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedEntry {
    pub key: String,
    pub compression: String,
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    pub diff_id: String,
    pub tar_size: u64,
}

/// An entry that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnreadEntry {
    pub tag: String,
    pub problem: String,
}

/// The tags answer of `GET /v2/<name>/tags/list`.
#[derive(Debug, Deserialize)]
struct TagList {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

/// Tag lists are read to at most this: 64-hex tags, about 200,000 of them.
const TAG_LIST_LIMIT: Limit = Limit {
    bytes: 16 << 20,
    what: "a tag list",
};
/// Every compression an entry may be of.
const COMPRESSIONS: [Compression; 4] = [
    Compression::Gzip,
    Compression::Zstd,
    Compression::Estargz,
    Compression::ZstdChunked,
];
/// Entries read at once by [`list`].
const PARALLEL_READS: usize = 8;

/// Every entry of the cache repository `client` names, by key; the tags that look like
/// entries but cannot be read are returned apart, with why. A repository nothing was
/// stored in has none.
pub async fn list(
    client: &RepositoryClient,
) -> Result<(Vec<ListedEntry>, Vec<UnreadEntry>), RegistryError> {
    let answer = client
        .send_reading(
            Method::GET,
            &client.url("/tags/list"),
            &[],
            Body::Empty,
            &[StatusCode::OK, StatusCode::NOT_FOUND],
            TAG_LIST_LIMIT,
        )
        .await?;
    if answer.status == StatusCode::NOT_FOUND {
        return Ok((Vec::new(), Vec::new()));
    }
    let tags: TagList =
        serde_json::from_slice(&answer.body).map_err(|_| RegistryError::Invalid {
            registry: client.reference.registry.clone(),
            what: "tag list".into(),
        })?;
    let mut tags: Vec<String> = tags
        .tags
        .unwrap_or_default()
        .into_iter()
        .filter(|tag| tag.starts_with(TAG_PREFIX))
        .collect();
    tags.sort();
    let read: Vec<Result<ListedEntry, UnreadEntry>> = futures::stream::iter(tags)
        .map(|tag| async move {
            read_entry(client, &tag)
                .await
                .map_err(|problem| UnreadEntry { tag, problem })
        })
        .buffered(PARALLEL_READS)
        .collect()
        .await;
    let (listed, unread): (Vec<_>, Vec<_>) = read.into_iter().partition(Result::is_ok);
    Ok((
        listed.into_iter().filter_map(Result::ok).collect(),
        unread.into_iter().filter_map(Result::err).collect(),
    ))
}

/// The manifest tagged `tag`, read to at most [`MANIFEST_LIMIT`] and parsed; `None` when
/// the tag is not there.
async fn get_manifest(
    client: &RepositoryClient,
    tag: &str,
) -> Result<Option<EntryManifest>, Problem> {
    let answer = client
        .send_reading(
            Method::GET,
            &client.url(&format!("/manifests/{tag}")),
            &[(header::ACCEPT, MANIFEST_MEDIA_TYPE.to_string())],
            Body::Empty,
            &[StatusCode::OK, StatusCode::NOT_FOUND],
            MANIFEST_LIMIT,
        )
        .await
        .map_err(|e| Problem::of(&e))?;
    if answer.status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    serde_json::from_slice(&answer.body)
        .map(Some)
        .map_err(|e| Problem::Entry(format!("its manifest is not an OCI manifest: {e}")))
}

/// The entry's config, read to at most [`ENTRY_LIMIT`] and checked against its digest,
/// with its bytes (what a signature covers).
async fn get_config(
    client: &RepositoryClient,
    descriptor: &EntryDescriptor,
) -> Result<(EntryConfig, bytes::Bytes), Problem> {
    let answer = client
        .send_reading(
            Method::GET,
            &client.url(&format!("/blobs/{}", descriptor.digest)),
            &[],
            Body::Empty,
            &[StatusCode::OK],
            ENTRY_LIMIT,
        )
        .await
        .map_err(|e| Problem::of(&e))?;
    let actual = crate::oci::sha256_digest(&answer.body);
    if actual != descriptor.digest {
        return Err(Problem::Entry(format!(
            "its config is {actual}, not {} as its manifest says",
            descriptor.digest
        )));
    }
    let config = serde_json::from_slice(&answer.body)
        .map_err(|e| Problem::Entry(format!("its config is not an entry: {e}")))?;
    Ok((config, answer.body))
}

/// The entry tagged `tag`, read as a build would read it (any compression).
async fn read_entry(client: &RepositoryClient, tag: &str) -> Result<ListedEntry, String> {
    let text = |problem| match problem {
        Problem::Repository(why) | Problem::Entry(why) => why,
    };
    let key = tag.trim_start_matches(TAG_PREFIX);
    let manifest = get_manifest(client, tag)
        .await
        .map_err(text)?
        .ok_or("its tag names no manifest")?;
    if manifest.config.media_type != ENTRY_MEDIA_TYPE || !is_sha256(&manifest.config.digest) {
        return Err("its manifest's config is not an entry".into());
    }
    let (config, _) = get_config(client, &manifest.config).await.map_err(text)?;
    // The media type does not tell gzip from eStargz: the config's compressor does.
    let compression = COMPRESSIONS
        .into_iter()
        .find(|c| c.describe() == config.compression)
        .ok_or_else(|| format!("its config names compression `{}`", config.compression))?;
    let manifest =
        check_manifest(manifest, compression).map_err(|why| format!("its manifest {why}"))?;
    check_config(&config, key, compression).map_err(|why| format!("its config {why}"))?;
    let layer = &manifest.layers[0];
    Ok(ListedEntry {
        key: key.to_string(),
        compression: compression.name().to_string(),
        media_type: layer.media_type.clone(),
        digest: layer.digest.clone(),
        size: layer.size,
        diff_id: config.diff_id,
        tar_size: config.tar_size,
    })
}

/// `manifest`, once it is the shape an entry has for layers compressed as `compression`:
/// an OCI image manifest of an entry config and exactly one layer of that compression.
fn check_manifest(
    manifest: EntryManifest,
    compression: Compression,
) -> Result<EntryManifest, String> {
    if manifest.schema_version != 2 || manifest.media_type != MANIFEST_MEDIA_TYPE {
        return Err("is not an OCI image manifest".into());
    }
    if manifest.config.media_type != ENTRY_MEDIA_TYPE {
        return Err(format!(
            "has a config of media type `{}`, not `{ENTRY_MEDIA_TYPE}`",
            manifest.config.media_type
        ));
    }
    let [layer] = manifest.layers.as_slice() else {
        return Err(format!("names {} layers, not 1", manifest.layers.len()));
    };
    if layer.media_type != compression.media_type() {
        return Err(format!(
            "names a layer of media type `{}`, not `{}`",
            layer.media_type,
            compression.media_type()
        ));
    }
    for digest in [&manifest.config.digest, &layer.digest] {
        if !is_sha256(digest) {
            return Err(format!("names `{digest}`, not a `sha256:<hex>` digest"));
        }
    }
    if manifest.config.size > ENTRY_LIMIT.bytes {
        return Err(format!("gives its config {} bytes", manifest.config.size));
    }
    Ok(manifest)
}

/// Whether `config` is the entry of `key` for layers compressed as `compression`.
fn check_config(config: &EntryConfig, key: &str, compression: Compression) -> Result<(), String> {
    if config.format != ENTRY_FORMAT {
        return Err(format!("is `{}`, not `{ENTRY_FORMAT}`", config.format));
    }
    if config.key != key {
        return Err(format!("is the entry of key {}, not {key}", config.key));
    }
    if config.compression != compression.describe() {
        return Err(format!(
            "is of compression `{}`, not `{}`",
            config.compression,
            compression.describe()
        ));
    }
    if !is_sha256(&config.diff_id) {
        return Err(format!("names diff_id `{}`", config.diff_id));
    }
    Ok(())
}

/// The manifest and config bytes of `offer`'s entry: the same on every builder (and signed by
/// `signer`, when given).
fn entry_documents(offer: &Offer, signer: Option<&Signer>) -> Result<(Vec<u8>, Vec<u8>), String> {
    let layer = EntryDescriptor {
        media_type: offer.compression.media_type().into(),
        digest: offer.blob.digest.clone(),
        size: offer.blob.size,
        annotations: offer.blob.annotations.clone(),
    };
    let config = EntryConfig {
        format: ENTRY_FORMAT.into(),
        key: offer.key.clone(),
        compression: offer.compression.describe(),
        diff_id: offer.blob.diff_id.clone(),
        tar_size: offer.blob.tar_size,
        layer: layer.clone(),
    };
    let config = serde_json::to_vec(&config).expect("an entry serializes");
    let annotations = match signer {
        Some(signer) => {
            let signature = signer.sign(&config).map_err(|e| error_text(&e))?;
            let encoded = base64::engine::general_purpose::STANDARD.encode(signature);
            BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), encoded)])
        }
        None => BTreeMap::new(),
    };
    let manifest = EntryManifest {
        schema_version: 2,
        media_type: MANIFEST_MEDIA_TYPE.into(),
        config: EntryDescriptor {
            media_type: ENTRY_MEDIA_TYPE.into(),
            digest: crate::oci::sha256_digest(&config),
            size: config.len() as u64,
            annotations: BTreeMap::new(),
        },
        layers: vec![layer],
        annotations,
    };
    let manifest = serde_json::to_vec(&manifest).expect("a manifest serializes");
    Ok((manifest, config))
}

/// Whether an entry manifest's `annotations` carry a signature by `verifier`'s key whose
/// payload is exactly `config`.
fn check_signature(
    verifier: &Verifier,
    annotations: &BTreeMap<String, String>,
    config: &[u8],
) -> Result<(), String> {
    let encoded = annotations.get(SIGNATURE_ANNOTATION).ok_or_else(|| {
        format!(
            "it is not signed, and --cache-verify-key asks for {}",
            verifier.fingerprint()
        )
    })?;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| format!("its signature is not base64: {e}"))?;
    let payload = verifier
        .payload(&signature)
        .map_err(|why| format!("its signature is {why}"))?;
    if payload != config {
        return Err("its signature is of another config".into());
    }
    Ok(())
}

fn is_sha256(digest: &str) -> bool {
    crate::names::is_sha256_digest(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(compression: Compression) -> Offer {
        Offer {
            key: "ab".repeat(32),
            blob: LayerBlob {
                diff_id: format!("sha256:{}", "1".repeat(64)),
                digest: format!("sha256:{}", "2".repeat(64)),
                size: 10,
                tar_size: 2048,
                media_type: compression.media_type(),
                annotations: BTreeMap::new(),
            },
            path: "/nonexistent".into(),
            compression,
        }
    }

    /// `bytes` parsed and checked as a build reads an entry manifest.
    fn entry_manifest(bytes: &[u8], compression: Compression) -> Result<EntryManifest, String> {
        let manifest = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        check_manifest(manifest, compression)
    }

    #[test]
    fn an_entry_written_is_the_entry_read() {
        let offer = offer(Compression::Zstd);
        let (manifest, config_bytes) = entry_documents(&offer, None).unwrap();
        let read = entry_manifest(&manifest, Compression::Zstd).unwrap();
        assert_eq!(read.config.digest, crate::oci::sha256_digest(&config_bytes));
        assert_eq!(read.layers[0].digest, offer.blob.digest);
        let config: EntryConfig = serde_json::from_slice(&config_bytes).unwrap();
        check_config(&config, &offer.key, Compression::Zstd).unwrap();
        // Another key or compression is not this entry.
        assert!(check_config(&config, &"cd".repeat(32), Compression::Zstd).is_err());
        assert!(check_config(&config, &offer.key, Compression::Gzip).is_err());
        assert!(entry_manifest(&manifest, Compression::Gzip).is_err());
    }

    #[test]
    fn the_same_layer_gives_the_same_entry_bytes() {
        assert_eq!(
            entry_documents(&offer(Compression::Gzip), None).unwrap(),
            entry_documents(&offer(Compression::Gzip), None).unwrap()
        );
    }

    #[test]
    fn malformed_manifests_are_refused_with_a_reason() {
        let cases: [&[u8]; 4] = [
            b"not json",
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:00","size":2},"layers":[]}"#,
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.imgbuild.layer-cache.entry.v1+json","digest":"sha256:00","size":2},"layers":[]}"#,
            br#"{"schemaVersion":1,"mediaType":"x","config":{"mediaType":"x","digest":"x","size":1},"layers":[]}"#,
        ];
        for case in cases {
            let refused = entry_manifest(case, Compression::Zstd);
            assert!(refused.is_err(), "{}", String::from_utf8_lossy(case));
        }
    }
}
