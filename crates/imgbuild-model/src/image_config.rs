//! How an image runs: the `[image]` settings that go into its OCI config (env, entrypoint,
//! cmd, workdir, user, labels, ports, stop signal). Plain data, checked when the recipe is
//! read and written into the config by `imgbuild_oci::oci::image`: a leaf, so that writing an
//! image needs no recipe.

use std::collections::BTreeMap;

/// The `[image]` keys that say how the image runs, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `[image.env]`: set on top of the base's and the environment's activation.
    pub env: BTreeMap<String, String>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// `[image] ports`: exposed ports as the config writes them (`8888/tcp`), sorted, each
    /// once.
    pub ports: Vec<String>,
    /// `[image] stop-signal`: `SIGTERM`, `SIGRTMIN+3` or a signal number, as written.
    pub stop_signal: Option<String>,
}
