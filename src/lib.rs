//! imgbuild: daemonless, rootless, bit-reproducible OCI images for conda-based AI runtimes.
//!
//! A build is a straight pipeline; each module is one stage and passes plain data on:
//! [`recipe`] → [`resolve`] → [`lock`] → [`install`] → [`layers`] → [`oci`], driven by
//! [`build`].

pub(crate) mod annotations;
pub(crate) mod attest;
pub(crate) mod build;
pub mod cli;
pub(crate) mod compression;
pub mod cuda;
pub mod download;
pub(crate) mod fs;
pub mod http;
pub(crate) mod image_config;
pub mod init;
pub(crate) mod inspect;
pub mod install;
pub(crate) mod k8s;
pub mod layers;
pub mod lock;
pub(crate) mod names;
pub(crate) mod oci;
pub(crate) mod provenance;
pub(crate) mod publish;
pub mod pypi;
pub(crate) mod python;
pub(crate) mod rebuild;
pub mod recipe;
pub(crate) mod reference;
pub(crate) mod registry;
pub(crate) mod report;
pub mod resolve;
pub(crate) mod sbom;
pub(crate) mod sign;
pub(crate) mod slurm;
pub mod smoke;
pub(crate) mod staging;
pub(crate) mod verify;
