//! A layer cache that many builders share (a registry repository, `--cache-repo`), behind
//! the local one ([`super::cache`]). The writer asks it only after a local miss, and hands
//! what it gets to the local cache as an entry not yet verified here, so a shared entry is
//! checked exactly as a local one from another machine is: its blob decompressed must be the
//! layer's tar, byte for byte, before it enters an image.
//!
//! The layers code names only this trait; the registry's side is
//! `crate::registry::cache_repo`.

use std::path::{Path, PathBuf};

use super::{built::LayerBlob, compress::Compression};
use crate::report::Reporter;

/// An entry of the shared cache, downloaded: what it claims and where its blob now lies.
#[derive(Debug)]
pub struct SharedEntry {
    /// The entry's claims about the blob (digest and size already checked on download).
    pub blob: LayerBlob,
    /// The downloaded blob: a file in the directory [`SharedCache::fetch`] was given.
    pub path: PathBuf,
    /// Its claims carry a signature by a key this build trusts (`--cache-verify-key`): a
    /// seekable layer's TOC may rest on it instead of a rebuild.
    pub signed: bool,
}

/// A layer cache shared by builders. Every failure is the implementation's to warn of: to
/// the writer, a shared cache only ever has an entry or not.
pub trait SharedCache: Send + Sync {
    /// Whether entries of layers compressed as `compression` are looked up. An entry of a
    /// seekable layer (eStargz, zstd:chunked) can only be checked by building the layer
    /// again, which is what the cache should save, so by default those are only offered.
    fn serves(&self, compression: Compression) -> bool {
        compression.seekable().is_none()
    }

    /// The entry under `key` for layer `name`, its blob downloaded into `dir`; `None` when
    /// there is none or it cannot be had.
    fn fetch(
        &self,
        name: &str,
        key: &str,
        compression: Compression,
        dir: &Path,
        reporter: &dyn Reporter,
    ) -> Option<SharedEntry>;

    /// The entry fetched under `key` failed its check here (the local cache evicted it).
    fn rejected(&self, key: &str);

    /// Layer `name`, built under `key` into `path`, is to be shared once the build is done.
    fn offer(&self, key: &str, blob: &LayerBlob, path: &Path, compression: Compression);
}
