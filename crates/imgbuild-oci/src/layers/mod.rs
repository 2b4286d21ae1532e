//! Layers: a staged prefix → a plan of layers ([`plan`]) → compressed, content-addressed
//! blobs ([`write`]), each a deterministic tar ([`tar`]) through a deterministic parallel
//! compressor ([`compress`]), reused across builds through the layer cache ([`cache`]).
//! The recipe's accounts and files are layers of entries with their own owners ([`owned`]);
//! a large package may be split by file into several layers ([`split`]), and a sharded build
//! splits the distinct layers between its workers ([`shard`]).

mod blob_file;
pub mod budget;
mod buffers;
pub mod built;
pub mod cache;
pub mod compress;
pub mod owned;
pub mod plan;
pub mod remote;
pub mod seekable;
pub mod shard;
pub mod split;
pub mod tar;
pub mod write;

pub use crate::compression::Compression;
pub use built::{BuiltLayer, LayerBlob};
pub use owned::{OwnedEntry, OwnedLayer};
pub use plan::{
    LayerKind, LayerLimits, LayerPlan, PlannedLayer, PlannedPart, StagedTree, StagedUnit,
    plan_layers,
};
pub use split::LayerPart;

/// The layer `[smoke] embed = true` adds (`crate::smoke::embed`): the image's history and
/// its smoke settings name it.
pub mod smoke_layer {
    /// Where the executable lies in the image, relative to `/`: outside the environment, so
    /// it never collides with a package's files.
    pub const IN_IMAGE_PATH: &str = "opt/imgbuild/bin/imgbuild-smoke";
    /// [`IN_IMAGE_PATH`] as the absolute path a container sees.
    pub fn in_image_path() -> String {
        format!("/{IN_IMAGE_PATH}")
    }

    /// The name of its layer in plans, reports and history.
    pub const LAYER_NAME: &str = "imgbuild-smoke";
}
