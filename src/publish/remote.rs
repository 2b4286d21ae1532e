//! Publishing about an image already in a registry: a document attached to it, and a
//! signature of the manifest it serves.

use crate::registry::{
    ClientOptions, Reference,
    pull::manifest_descriptor,
    referrers::{Attachment, Subject, attach},
};

use super::{PublishError, Signed, Signing, client_for};

/// A document attached to an image in a registry.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Attached {
    /// The artifact manifest's digest.
    pub digest: String,
    /// `referrers-api` or the fallback tag.
    pub found_by: String,
}

/// Attaches `attachment` to the manifest `subject_digest` of `reference`'s repository, as an
/// OCI 1.1 artifact whose `subject` is that manifest.
pub(crate) async fn attach_document(
    reference: &Reference,
    subject_digest: &str,
    attachment: Attachment,
    options: &ClientOptions,
) -> Result<Attached, PublishError> {
    let client = client_for(reference, options)?;
    let subject = manifest_descriptor(&client, Some(subject_digest)).await?;
    let created = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let subject = Subject {
        digest: &subject.digest,
        size: subject.size,
        media_type: &subject.media_type,
    };
    let (digests, found_by) = attach(&client, subject, &created, &[attachment]).await?;
    Ok(Attached {
        digest: digests.into_iter().next().unwrap_or_default(),
        found_by: found_by.name(),
    })
}

/// Signs the manifest `reference` (`registry/repository[:tag]`, `latest` by default, or
/// `…@sha256:…`) names in its registry, as that reference.
pub(crate) async fn sign_image(
    reference: &str,
    signing: &Signing,
    options: &ClientOptions,
) -> Result<Vec<Signed>, PublishError> {
    let mut parsed = Reference::parse(reference)?;
    if parsed.tag.is_none() && parsed.digest.is_none() {
        parsed.tag = Some("latest".to_string());
    }
    // The digest is the one the registry serves, from its bytes: a signature of a digest
    // nobody can pull would vouch for nothing.
    let client = client_for(&parsed, options)?;
    let digest = manifest_descriptor(&client, None).await?.digest;
    if let Some(asked) = &parsed.digest
        && *asked != digest
    {
        return Err(PublishError::Moved {
            reference: reference.to_string(),
            served: digest,
        });
    }
    let identity = Reference {
        digest: None,
        ..parsed
    };
    Ok(signing.sign(&[identity], &digest)?)
}
