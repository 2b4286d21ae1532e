//! imgbuild: daemonless, rootless, bit-reproducible OCI images for conda-based AI runtimes.
//!
//! A build is a straight pipeline; each module is one stage and passes plain data on:
//! [`recipe`] → [`resolve`] → [`lock`] → [`install`] → [`layers`] → [`oci`], driven by
//! [`build`].

pub mod annotations;
pub mod attest;
pub mod build;
pub mod cli;
pub mod compression;
pub mod cuda;
pub mod download;
pub mod fs;
pub mod http;
pub mod image_config;
pub mod init;
pub mod inspect;
pub mod install;
pub mod k8s;
pub mod layers;
pub mod lock;
pub mod names;
pub mod oci;
pub mod provenance;
pub mod publish;
pub mod pypi;
pub mod python;
pub mod rebuild;
pub mod recipe;
pub mod reference;
pub mod registry;
pub mod report;
pub mod resolve;
pub mod sbom;
pub mod sign;
pub mod slurm;
pub mod smoke;
pub mod staging;
pub mod verify;
