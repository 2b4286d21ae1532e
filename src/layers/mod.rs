//! Layers: a staged prefix → a plan of layers ([`plan`]) → compressed, content-addressed
//! blobs ([`write`]), each a deterministic tar ([`tar`]) through a deterministic parallel
//! compressor ([`compress`]), reused across builds through the layer cache ([`cache`]).
//! The recipe's accounts and files are layers of entries with their own owners ([`owned`]).

mod blob_file;
pub mod built;
pub mod cache;
pub mod compress;
pub mod owned;
pub mod plan;
pub mod seekable;
pub mod tar;
pub mod write;

pub use crate::compression::Compression;
pub use built::{BuiltLayer, LayerBlob};
pub use owned::{OwnedEntry, OwnedLayer};
pub use plan::{LayerKind, LayerPlan, PlannedLayer, plan_layers};
