//! imgbuild's bottom level: plain values and leaf utilities that every stage shares
//! (names, image references, compression, annotations, the progress reporter, CUDA rules,
//! confined file access and bounded HTTP). It names no other imgbuild crate but
//! `imgbuild-smoke`.

pub mod annotations;
pub mod attest;
pub mod compression;
pub mod cuda;
pub mod download;
pub mod fs;
pub mod http;
pub mod image_config;
pub mod names;
pub mod python;
pub mod reference;
pub mod report;
pub mod staging;
