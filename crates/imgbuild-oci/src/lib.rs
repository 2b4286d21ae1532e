//! Layers and images: layer planning, writing and caching ([`layers`]), the OCI layout
//! ([`oci`]), the registry client ([`registry`]) and signing ([`sign`]). It names only
//! `imgbuild-model`, so it builds beside the recipe, solve and install crates.

// The lower crates' modules, by the names the code has always used (`crate::fs`, …).
use imgbuild_model::{annotations, compression, fs, image_config, names, reference, report};

pub mod layers;
pub mod oci;
pub mod registry;
pub mod sign;
