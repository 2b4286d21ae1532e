//! What a written layer is: its blob in the blob store and what it holds. Plain data that
//! the writer makes and the cache records, so neither names the other for it.

use std::collections::BTreeMap;

use super::{plan::LayerKind, split::LayerPart};

/// A layer written to the blob store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBlob {
    /// sha256 of the uncompressed tar, `sha256:<hex>`.
    pub diff_id: String,
    /// sha256 of the compressed blob, `sha256:<hex>`.
    pub digest: String,
    /// Size of the compressed blob in bytes.
    pub size: u64,
    /// Size of the uncompressed tar in bytes.
    pub tar_size: u64,
    pub media_type: &'static str,
    /// Annotations the manifest gives this layer's descriptor: where an eStargz or
    /// zstd:chunked layer's TOC is, for lazy and partial pulls.
    pub annotations: BTreeMap<String, String>,
}

/// A layer of the image as built: what it holds and its blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltLayer {
    pub kind: LayerKind,
    /// As [`PlannedLayer::name`].
    pub name: String,
    /// The packages in the layer, named as [`LayerKind`] says, empty for the image layer.
    pub packages: Vec<String>,
    /// Which part of its package the layer is, when the package was split.
    pub part: Option<LayerPart>,
    pub blob: LayerBlob,
    /// Taken from the layer cache (or an unchanged image) instead of compressed.
    pub reused: bool,
}
