//! The recipe: its TOML schema, loading and checks. It names only `imgbuild-model`.

// The lower crates' modules, by the names the code has always used (`crate::fs`, …).
use imgbuild_model::{compression, cuda, fs, image_config, names, python, reference};

pub mod recipe;
