//! The local cache's upkeep, for `imgbuild cache`: how much each kind of file takes
//! ([`du`]), and evicting layer-cache entries by age and size ([`prune`]: a plan of plain
//! data, computed apart from the removals that carry it out).
//!
//! Nothing here follows a link: entries are described by `lstat`, a link is removed as a
//! link (its target is never touched), and a directory of the layer cache that is a link is
//! refused.

pub(crate) mod du;
pub(crate) mod prune;

use std::path::PathBuf;

/// What can go wrong sizing or pruning the cache; each names its subject.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheAdminError {
    #[error("Cannot read the cache directory `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Listing(#[from] crate::layers::cache::listing::LayerCacheListError),
    #[error("Cannot read the image layout `{}` (--keep-layout): its blobs cannot be kept", layout.display())]
    Layout {
        layout: PathBuf,
        #[source]
        source: crate::oci::read::ReadError,
    },
    #[error("Cannot remove `{}` from the layer cache", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl CacheAdminError {
    /// 1 when the input is at fault (a `--keep-layout` that is no layout, a directory of
    /// the layer cache that is a link or a file), 2 when the machine is (a directory or
    /// file the system refuses to read or remove), as `docs/src/reference/exit-codes.md`
    /// says.
    pub(crate) fn exit_code(&self) -> u8 {
        use crate::layers::cache::listing::LayerCacheListError;
        match self {
            CacheAdminError::Layout { .. }
            | CacheAdminError::Listing(
                LayerCacheListError::LinkedDirectory { .. }
                | LayerCacheListError::NotADirectory { .. },
            ) => 1,
            CacheAdminError::Listing(LayerCacheListError::Read { .. })
            | CacheAdminError::Read { .. }
            | CacheAdminError::Remove { .. } => 2,
        }
    }
}
