//! The models beside a pushed image ([`crate::models`]), pushed after it: model MODEL of an
//! image pushed to `REGISTRY/REPO:TAG` goes to `REGISTRY/REPO/models/MODEL`, its image form
//! under `TAG` and its ModelPack artifact under `TAG-modelpack` (and each `--tag` alike).
//! Every blob is checked with HEAD first, so a revision that changed one file of K sends one
//! layer and the two configs that name the layers.

use crate::{
    models::{MODELPACK_TAG_SUFFIX, ModelLayout},
    names::is_valid_tag,
    registry::{
        ClientOptions, Reference,
        push::{PushProgress, PushReport, push},
    },
};

use super::{PublishError, client_for, signing::Signed, signing::Signing};

/// Where a model of an image pushed to `image` goes: `REGISTRY/REPO/models/MODEL`, no tag.
fn model_repository(image: &Reference, model: &str) -> Reference {
    Reference {
        repository: format!("{}/models/{model}", image.repository),
        tag: None,
        digest: None,
        ..image.clone()
    }
}

/// One model as pushed: both forms, each `REF@sha256:…`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PushedModel {
    pub name: String,
    /// The image form, what `image` volumes and `--mount type=image` mount.
    pub image: PushReport,
    /// The ModelPack artifact.
    pub artifact: PushReport,
}

/// The model's forms in its layout (`tag`, `tag-modelpack`) and where each goes.
struct ModelPush<'a> {
    model: &'a ModelLayout,
    tag: &'a str,
    repository: Reference,
    target_tag: &'a str,
    extra_tags: &'a [String],
}

/// Pushes each of `models` beside the image pushed as `image` (`REF@sha256:…` under the
/// layout's `tag`, and `extra_tags`).
pub(crate) async fn push_models(
    models: &[ModelLayout],
    tag: &str,
    image: &Reference,
    extra_tags: &[String],
    registry: &ClientOptions,
    progress: &dyn PushProgress,
) -> Result<Vec<PushedModel>, PublishError> {
    let target_tag = image.tag.as_deref().unwrap_or(tag);
    let mut pushed = Vec::with_capacity(models.len());
    for model in models {
        let push = ModelPush {
            model,
            tag,
            repository: model_repository(image, &model.name),
            target_tag,
            extra_tags,
        };
        pushed.push(push.run(registry, progress).await?);
    }
    Ok(pushed)
}

impl ModelPush<'_> {
    async fn run(
        &self,
        registry: &ClientOptions,
        progress: &dyn PushProgress,
    ) -> Result<PushedModel, PublishError> {
        let image = self.push_form("", registry, progress).await?;
        let artifact = self
            .push_form(MODELPACK_TAG_SUFFIX, registry, progress)
            .await?;
        Ok(PushedModel {
            name: self.model.name.clone(),
            image,
            artifact,
        })
    }

    /// Pushes the form tagged `tag` + `suffix` to the same tags with the same suffix.
    async fn push_form(
        &self,
        suffix: &str,
        registry: &ClientOptions,
        progress: &dyn PushProgress,
    ) -> Result<PushReport, PublishError> {
        let suffixed = |tag: &str| {
            let tag = format!("{tag}{suffix}");
            match is_valid_tag(&tag) {
                true => Ok(tag),
                false => Err(PublishError::InvalidTag(tag)),
            }
        };
        let target = self.repository.with_tag(&suffixed(self.target_tag)?);
        let extra = self
            .extra_tags
            .iter()
            .map(|tag| suffixed(tag))
            .collect::<Result<Vec<_>, _>>()?;
        let client = client_for(&target, registry)?;
        let source_tag = format!("{}{suffix}", self.tag);
        Ok(push(
            &self.model.dir,
            &source_tag,
            &client,
            &extra,
            None,
            progress,
        )
        .await?)
    }
}

/// Signs both forms of each pushed model under every tag it was pushed as.
pub(crate) fn sign_models(
    signing: &Signing,
    models: &[PushedModel],
    extra_tags: &[String],
) -> Result<Vec<Signed>, super::SigningError> {
    let mut signed = Vec::new();
    let artifact_tags: Vec<String> = extra_tags
        .iter()
        .map(|tag| format!("{tag}{MODELPACK_TAG_SUFFIX}"))
        .collect();
    for model in models {
        let forms = [
            (&model.image, extra_tags),
            (&model.artifact, &artifact_tags[..]),
        ];
        for (form, tags) in forms {
            let identities = super::pushed_identities(form, tags);
            signed.extend(signing.sign(&identities, &form.digest)?);
        }
    }
    Ok(signed)
}
