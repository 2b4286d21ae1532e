//! Registries: references, credentials, an OCI distribution client, push and pull.

pub(crate) mod auth;
pub(crate) mod client;
pub(crate) mod pull;
pub(crate) mod push;
pub(crate) mod realm;
pub(crate) mod referrers;

pub(crate) use crate::reference::{self, Reference};
pub(crate) use client::{ClientOptions, RegistryError, RepositoryClient};
