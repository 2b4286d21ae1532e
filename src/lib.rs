//! imgbuild: daemonless, rootless, bit-reproducible OCI images for conda-based AI runtimes.
//!
//! A build is a straight pipeline; each module is one stage and passes plain data on:
//! [`recipe`] → [`resolve`] → [`lock`] → [`install`] → [`layers`] → [`oci`], driven by
//! [`build`].

// The lower crates of the workspace, bottom first. Their modules keep the paths they had
// before the split (`crate::fs`, `imgbuild::recipe`), so callers read the same.
pub use imgbuild_install::{install, pypi};
use imgbuild_model::{attest, compression, fs, names, python, reference, report, staging};
pub use imgbuild_model::{cuda, download, http};
pub use imgbuild_oci::layers;
use imgbuild_oci::{oci, registry, sign};
pub use imgbuild_recipe::recipe;
pub use imgbuild_solve::{lock, resolve};

pub(crate) mod build;
pub(crate) mod cache_admin;
pub mod cli;
pub mod init;
pub(crate) mod inspect;
pub(crate) mod k8s;
pub(crate) mod locked_variants;
pub(crate) mod models;
pub(crate) mod notebook;
pub(crate) mod provenance;
pub(crate) mod publish;
pub(crate) mod rebuild;
pub(crate) mod sbom;
pub(crate) mod sizes;
pub(crate) mod slurm;
pub mod smoke;
pub(crate) mod verify;
