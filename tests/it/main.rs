//! Integration tests: one binary that drives the real `imgbuild` CLI against a local
//! channel of real packages and checks the images with real consumers.

// Tests say on stderr when they skip.
#![allow(clippy::print_stderr)]

#[path = "../support/mod.rs"]
mod support;
// The token, range and fault-injecting servers.
#[path = "../support/servers/mod.rs"]
mod servers;

mod accounts;
mod archive;
mod book;
mod build;
mod builder;
mod cache_admin;
mod cache_repo;
mod channel_priority;
mod common;
mod containerd;
mod cuda_intent;
mod docs_examples;
mod download;
mod error_messages;
mod errors;
mod estargz;
mod fatbin;
mod files;
mod fixtures_smoke;
mod forward_compat;
mod hostile;
mod hostile_accounts;
mod hostile_base;
mod hostile_cache;
mod hostile_decompress;
mod hostile_files;
mod hostile_generated;
mod hostile_import;
mod hostile_init;
mod hostile_inputs;
mod hostile_lock;
mod hostile_models;
mod hostile_operator;
mod hostile_process;
mod hostile_pypi;
mod hostile_registry;
mod hostile_runtime;
mod hostile_silence;
mod hostile_unpack;
mod image_config;
mod import_locks;
mod init;
mod inspect;
mod inspect_sizes;
mod jupyter;
mod k8s;
mod k8s_jupyter;
mod layer_cache;
mod layer_split;
mod layering;
mod lazy_pull;
mod lock;
mod matrix;
mod meant;
mod model_push;
mod models;
mod names;
mod notebook;
mod partial_pull;
mod platforms;
mod progress;
mod provenance;
mod publish;
mod pypi;
mod pypi_index;
mod qualified_specs;
mod readers;
mod recipes;
mod registry;
mod reproducible;
mod resume;
mod runnable;
mod sbom;
mod shard;
mod signing;
mod slurm;
mod slurm_build;
mod slurm_jupyter;
mod smoke;
mod smoke_embed;
mod smoke_framework;
mod standalone;
mod torch_solve;
mod trust;
mod verify;
mod warnings;
