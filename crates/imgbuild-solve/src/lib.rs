//! Solving and locking: the conda solve ([`resolve`]) and the lock file ([`lock`]).

// The lower crates' modules, by the names the code has always used (`crate::fs`, …).
use imgbuild_model::{cuda, fs, http, python};
use imgbuild_recipe::recipe;

pub mod lock;
pub mod resolve;
