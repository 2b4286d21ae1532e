//! SBOMs attached to a pushed image as OCI artifacts (image-spec 1.1): an artifact manifest
//! whose `subject` is the image. Registries with the referrers API index it themselves; for
//! the others (distribution 2.8, as in Debian) the referrers tag scheme is kept up to date:
//! an image index under the tag `sha256-<hex of the image digest>` listing the artifacts.

use reqwest::{Method, StatusCode, header};

use super::{
    client::{Body, MANIFEST_LIMIT, RegistryError, RepositoryClient},
    push::{blob_exists, put_manifest, put_whole, start_upload},
};
use crate::oci::json::canonical_json;

/// The empty config artifacts use (`{}`), and its digest.
const EMPTY_CONFIG: &[u8] = b"{}";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// One document to attach: its media type (the artifact type) and bytes, and for an in-toto
/// statement its `predicateType`, which the artifact carries as the annotation
/// [`PREDICATE_TYPE`] so clients pick attestations from the referrers list without fetching
/// each.
pub struct Attachment {
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
    pub predicate_type: Option<&'static str>,
}

/// The annotation naming an attached statement's predicate type.
pub(crate) const PREDICATE_TYPE: &str = "in-toto.io/predicate-type";

/// How the artifacts were made discoverable.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Discovery {
    /// The registry answers the referrers API for the image.
    ReferrersApi,
    /// The fallback tag `sha256-…` holds an index of the referrers.
    Tag(String),
}

impl Discovery {
    /// As reports name it: `referrers-api`, or the fallback tag.
    pub fn name(self) -> String {
        match self {
            Discovery::ReferrersApi => "referrers-api".to_string(),
            Discovery::Tag(tag) => tag,
        }
    }
}

fn sha256(bytes: &[u8]) -> String {
    crate::oci::sha256_digest(bytes)
}

/// Makes `bytes` a blob of the repository (unless it is there already); returns its digest.
pub(crate) async fn put_blob(
    client: &RepositoryClient,
    bytes: &[u8],
) -> Result<String, RegistryError> {
    let digest = sha256(bytes);
    if !blob_exists(client, &digest).await?
        && let Some(upload) = start_upload(client, &digest, None).await?
    {
        put_whole(
            client,
            &upload,
            &digest,
            bytes::Bytes::copy_from_slice(bytes),
        )
        .await?;
    }
    Ok(digest)
}

/// The image artifacts are attached to: a manifest, or the image index of a multi-platform
/// image.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub digest: &'a str,
    pub size: u64,
    pub media_type: &'a str,
}

/// Attaches `attachments` to the image `subject` in the client's repository; returns the
/// artifacts' digests and how they can be found.
pub async fn attach(
    client: &RepositoryClient,
    subject: Subject<'_>,
    created: &str,
    attachments: &[Attachment],
) -> Result<(Vec<String>, Discovery), RegistryError> {
    let config = put_blob(client, EMPTY_CONFIG).await?;
    let mut artifacts = Vec::new();
    for attachment in attachments {
        let blob = put_blob(client, &attachment.bytes).await?;
        let mut annotations = serde_json::json!({"org.opencontainers.image.created": created});
        if let Some(predicate_type) = attachment.predicate_type {
            annotations[PREDICATE_TYPE] = predicate_type.into();
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "artifactType": attachment.media_type,
            "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": config, "size": EMPTY_CONFIG.len()},
            "layers": [{"mediaType": attachment.media_type, "digest": blob, "size": attachment.bytes.len()}],
            "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": subject.size},
            "annotations": annotations,
        });
        let bytes = canonical_json(&manifest).expect("JSON serializes");
        let digest = sha256(&bytes);
        put_manifest(client, &digest, &bytes, MANIFEST, &digest).await?;
        let size = bytes.len();
        artifacts.push((digest, size, attachment));
    }

    // A registry with the referrers API lists them by itself.
    let referrers = client
        .send_reading(
            Method::GET,
            &client.url(&format!("/referrers/{}", subject.digest)),
            &[(header::ACCEPT, INDEX.to_string())],
            Body::Empty,
            &[StatusCode::OK, StatusCode::NOT_FOUND],
            MANIFEST_LIMIT,
        )
        .await?;
    let digests: Vec<String> = artifacts.iter().map(|(d, _, _)| d.clone()).collect();
    if referrers.status == StatusCode::OK {
        return Ok((digests, Discovery::ReferrersApi));
    }

    // The tag scheme: merge ours into the index under `sha256-<hex>`.
    let tag = subject.digest.replace(':', "-");
    let existing = client
        .send_reading(
            Method::GET,
            &client.url(&format!("/manifests/{tag}")),
            &[(header::ACCEPT, INDEX.to_string())],
            Body::Empty,
            &[StatusCode::OK, StatusCode::NOT_FOUND],
            MANIFEST_LIMIT,
        )
        .await?;
    let mut manifests: Vec<serde_json::Value> = if existing.status == StatusCode::OK {
        serde_json::from_slice::<serde_json::Value>(&existing.body)
            .ok()
            .and_then(|v| v.get("manifests").and_then(|m| m.as_array().cloned()))
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    for (digest, size, attachment) in &artifacts {
        if !manifests.iter().any(|m| m["digest"] == *digest) {
            let mut entry = serde_json::json!({
                "mediaType": MANIFEST,
                "digest": digest,
                "size": size,
                "artifactType": attachment.media_type,
            });
            if let Some(predicate_type) = attachment.predicate_type {
                entry["annotations"] = serde_json::json!({PREDICATE_TYPE: predicate_type});
            }
            manifests.push(entry);
        }
    }
    manifests.sort_by(|a, b| a["digest"].as_str().cmp(&b["digest"].as_str()));
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests});
    let bytes = canonical_json(&index).expect("JSON serializes");
    put_manifest(client, &tag, &bytes, INDEX, &sha256(&bytes)).await?;
    Ok((digests, Discovery::Tag(tag)))
}
