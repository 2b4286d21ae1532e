//! Registries: references, credentials, an OCI distribution client, push and pull.

pub mod auth;
pub mod cache_repo;
pub mod client;
pub mod pull;
pub mod push;
pub(crate) mod realm;
pub mod referrers;

pub use client::{ClientOptions, RegistryError, RepositoryClient};
pub use imgbuild_model::reference::{self, Reference};
