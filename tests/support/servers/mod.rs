//! Local servers the integration tests put between imgbuild and what it talks to: a bearer
//! token service for registry auth, a file server with (or without) range support that can
//! drop connections, a proxy that injects registry faults, and a server whose every answer a
//! test scripts.
//!
//! Mounted by the `it` test binary (`tests/it/main.rs`), whose `common` and `support`
//! modules they use.

pub(crate) mod fault_proxy;
pub(crate) mod range;
pub(crate) mod scripted;
pub(crate) mod token;
