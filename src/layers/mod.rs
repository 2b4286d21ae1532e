//! Layers: a staged prefix → a plan of layers ([`plan`]) → compressed, content-addressed
//! blobs ([`write`]), each a deterministic tar ([`tar`]).

pub mod plan;
pub mod tar;
pub mod write;

pub use plan::{LayerPlan, PlannedLayer, plan_layers};
pub use write::{Compression, LayerBlob, write_layers};
