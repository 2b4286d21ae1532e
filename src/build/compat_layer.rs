//! The forward-compatibility link of a `[cuda] compat = true` image: `/usr/local/cuda/compat`
//! naming the environment's `cuda-compat` directory, the place NVIDIA's container toolkit
//! looks for an image's compat libraries. The toolkit, not the image, then decides at
//! container start whether they come before the host driver's: only on a driver of an older
//! branch (see `imgbuild_smoke::forward_compat`). A path that put them first always would
//! give error 803 on every newer driver.

use crate::{
    layers::{LayerKind, OwnedEntry, OwnedLayer, owned::Content},
    recipe::Recipe,
};

/// The link's path in the image, without the leading `/`.
const COMPAT_LINK: &str = "usr/local/cuda/compat";

/// The layer holding the link, for a recipe whose `[cuda]` sets `compat`. Only the link:
/// its parents come from the base when it has them (an NVIDIA base's `/usr/local/cuda` is
/// itself a link, which a directory entry here would replace).
pub(super) fn compat_layer(recipe: &Recipe, mtime: u64) -> Option<OwnedLayer> {
    recipe.cuda.as_ref().filter(|cuda| cuda.compat)?;
    let target = format!("{}/cuda-compat", recipe.prefix.trim_end_matches('/'));
    let link = OwnedEntry {
        path: COMPAT_LINK.to_string(),
        uid: 0,
        gid: 0,
        mode: 0o777,
        content: Content::Symlink(target.into()),
    };
    Some(OwnedLayer::without_parents(
        LayerKind::Files,
        format!("cuda compat /{COMPAT_LINK}"),
        vec![link],
        mtime,
    ))
}
