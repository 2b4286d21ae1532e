//! Publishing a built image: its layout pushed to a registry ([`crate::registry::push`],
//! go-containerregistry's `remote.Write`), the SBOMs and provenance beside it attached as
//! referrers (its `remote.Put` of an artifact), and what was pushed signed
//! ([`crate::sign`]). The command line only parses arguments and prints the
//! [`PublishReport`]; every failure is one [`PublishError`] with its exit code.

mod attach;
mod error;
mod fault;
mod models;
mod remote;
mod signing;

use crate::oci::read::ReadLayoutRef;
use std::path::PathBuf;

use crate::{
    oci::read::LayoutRef,
    registry::{
        ClientOptions, Reference, RepositoryClient, auth,
        push::{PushProgress, PushReport, push},
    },
};

pub(crate) use error::PublishError;
pub(crate) use models::PushedModel;
pub(crate) use remote::{attach_document, sign_image};
pub(crate) use signing::{Signed, Signing, SigningError, load_key_file};

/// How to publish: the extra tags, a repository to mount shared blobs from, the signing
/// (prepared before anything is pushed), and whether to attach the documents beside the
/// layout.
pub(crate) struct PublishOptions<'a> {
    pub tags: &'a [String],
    pub mount_from: Option<&'a Reference>,
    pub signing: Option<&'a Signing>,
    pub attach: bool,
    /// Whether to push the models beside the layout too ([`models`]).
    pub models: bool,
    pub registry: &'a ClientOptions,
}

/// What a publish did: the push (with the documents attached to it) and the signatures.
#[derive(Debug, Clone)]
pub(crate) struct PublishReport {
    pub push: PushReport,
    pub signed: Vec<Signed>,
    /// Documents beside the layout left out: they describe another image of it.
    pub not_attached: Vec<PathBuf>,
    /// The models beside the layout, pushed after the image.
    pub models: Vec<PushedModel>,
}

/// Pushes `image` to `target` (`registry/repository[:tag]`), attaches the documents beside
/// its layout, pushes the models beside it, then signs what was pushed.
pub(crate) async fn publish(
    image: &LayoutRef,
    target: &str,
    options: &PublishOptions<'_>,
    progress: &dyn PushProgress,
) -> Result<PublishReport, PublishError> {
    let target = push_target(target, options.tags)?;
    let layout = image.layout();
    // Read first: a corrupted manifest is refused before the registry changes.
    let documents = match options.attach {
        true => Some(attach::Documents::beside(&layout, image.tag())?),
        false => None,
    };
    let models = match options.models {
        true => crate::models::beside(&image.dir)?,
        false => Vec::new(),
    };
    let client = client_for(&target, options.registry)?;
    let mut push = push(
        &image.dir,
        image.tag(),
        &client,
        options.tags,
        options.mount_from,
        progress,
    )
    .await?;
    if let Some(documents) = &documents {
        documents.attach(&client, &mut push).await?;
    }
    let pushed_image = Reference::parse(&push.pushed)?;
    let models = models::push_models(
        &models,
        image.tag(),
        &Reference {
            digest: None,
            ..pushed_image
        },
        options.tags,
        options.registry,
        progress,
    )
    .await?;
    let signed = match options.signing {
        Some(signing) => sign_all(signing, &push, &models, options.tags).map_err(|source| {
            PublishError::NotSigned {
                pushed: push.pushed.clone(),
                digest: push.digest.clone(),
                source,
            }
        })?,
        None => Vec::new(),
    };
    Ok(PublishReport {
        push,
        signed,
        not_attached: documents.map(|d| d.skipped).unwrap_or_default(),
        models,
    })
}

/// Signs the image and its documents ([`sign_pushed`]), then the models pushed beside it.
fn sign_all(
    signing: &Signing,
    push: &PushReport,
    models: &[PushedModel],
    tags: &[String],
) -> Result<Vec<Signed>, SigningError> {
    let mut signed = sign_pushed(signing, push, tags)?;
    signed.extend(models::sign_models(signing, models, tags)?);
    Ok(signed)
}

/// `target` parsed, naming a tag (or none: the layout's), with every extra tag valid.
fn push_target(target: &str, tags: &[String]) -> Result<Reference, PublishError> {
    let parsed = Reference::parse(target)?;
    if parsed.digest.is_some() {
        return Err(PublishError::DigestTarget(crate::reference::redacted(
            target,
        )));
    }
    if let Some(invalid) = tags.iter().find(|tag| !crate::names::is_valid_tag(tag)) {
        return Err(PublishError::InvalidTag(invalid.clone()));
    }
    Ok(parsed)
}

/// A client for `reference` with the credentials on file for its registry.
pub(crate) fn client_for(
    reference: &Reference,
    options: &ClientOptions,
) -> Result<RepositoryClient, PublishError> {
    let credentials = auth::credentials_for(&reference.registry)?;
    Ok(RepositoryClient::new(reference, credentials, options)?)
}

/// Signs the pushed image as each of its tags, and each document attached to it (the
/// artifacts are untagged: their signatures claim the repository).
fn sign_pushed(
    signing: &Signing,
    report: &PushReport,
    tags: &[String],
) -> Result<Vec<Signed>, SigningError> {
    let identities = pushed_identities(report, tags);
    let mut signed = signing.sign(&identities, &report.digest)?;
    if let Some(image) = identities.first() {
        for artifact in report.sboms.iter().chain(&report.provenance) {
            signed.extend(signing.sign_artifact(image, artifact)?);
        }
    }
    Ok(signed)
}

/// The references a push made point at its image: the target's tag and each `--tag`; what
/// signatures of the push claim.
fn pushed_identities(report: &PushReport, tags: &[String]) -> Vec<Reference> {
    let Ok(pushed) = Reference::parse(&report.pushed) else {
        return Vec::new();
    };
    let target = Reference {
        digest: None,
        ..pushed
    };
    let mut identities = vec![target.clone()];
    identities.extend(tags.iter().map(|tag| target.with_tag(tag)));
    identities
}

/// The registry base an image was built on (its `org.opencontainers.image.base.name`), for
/// cross-repository mounts.
pub(crate) fn base_of(image: &LayoutRef) -> Option<Reference> {
    let layout = image.layout();
    // Every platform of a multi-platform image is built on the same base repository.
    let (_, manifest) = layout
        .platform_manifests(&layout.entry(image.tag()).ok()?)
        .ok()?
        .into_iter()
        .next()?;
    let name = manifest
        .annotations()
        .as_ref()?
        .get("org.opencontainers.image.base.name")?;
    Reference::parse(name).ok()
}
