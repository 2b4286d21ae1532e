//! Registries: references, credentials, an OCI distribution client, push and pull.

pub mod auth;
pub mod client;
pub mod pull;
pub mod push;
pub mod realm;
pub mod referrers;

pub use crate::reference::{self, Reference};
pub use client::{ClientOptions, RegistryError, RepositoryClient};
