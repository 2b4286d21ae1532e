//! A named image user (`jovyan`, `app:staff`) as the uid and gid a pod needs: Kubernetes
//! checks `runAsNonRoot` only against a number, so the name is resolved through the image's
//! own `/etc/passwd` and `/etc/group` (the accounts layer a build wrote, or the base's), as
//! the container runtime would resolve it on the node.

use crate::{
    inspect::ImageSummary,
    names::OciPlatform,
    oci::{
        accounts::{read_account_files, resolve_user},
        base::BaseImage,
        read::ReadLayoutRef,
    },
    reference::LayoutRef,
};

use super::K8sError;

/// `user` as `UID:GID`: as it is when it is numeric (or `root`), else resolved through the
/// files of `image`'s layout, for the platform `image` describes.
pub(crate) fn numeric_user(image: &ImageSummary, user: &str) -> Result<String, K8sError> {
    let numeric = |id: &str| id == "root" || id.parse::<u32>().is_ok();
    if user.split(':').all(numeric) {
        return Ok(user.to_string());
    }
    let unreadable = |source: Box<dyn std::error::Error + Send + Sync>| K8sError::ImageUserRead {
        image: image.image.clone(),
        user: user.to_string(),
        source,
    };
    let reference = LayoutRef::parse(&image.image);
    let platform = OciPlatform::parse_subdir(&format!("{}/{}", image.os, image.architecture));
    let opened = reference
        .image(platform)
        .map_err(|e| unreadable(e.into()))?;
    let files = read_account_files(&BaseImage::from_layout(&reference.layout(), opened))
        .map_err(|e| unreadable(e.into()))?;
    let (uid, gid) = resolve_user(
        files.passwd.as_deref().unwrap_or_default(),
        files.group.as_deref().unwrap_or_default(),
        user,
    )
    .map_err(|unknown| K8sError::ImageUser {
        image: image.image.clone(),
        user: user.to_string(),
        reason: format!(
            "the {} `{}` is not in the image's {}",
            unknown.kind, unknown.name, unknown.file
        ),
    })?;
    Ok(format!("{uid}:{gid}"))
}
