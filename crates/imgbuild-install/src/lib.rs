//! Installing: conda packages ([`install`]) and PyPI wheels ([`pypi`]) into a prefix,
//! read from confined, bounded archives.

// The lower crates' modules, by the names the code has always used (`crate::fs`, …).
use imgbuild_model::{compression, download, fs, http, names, python, report};
use imgbuild_recipe::recipe;
use imgbuild_solve::{lock, resolve};

pub mod install;
pub mod pypi;
