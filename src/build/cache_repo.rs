//! `--cache-repo`: the registry repository this build shares layers through
//! ([`crate::registry::cache_repo`]). The operator names it; the recipe and the lock never
//! do, so it is no part of the image or of what decides its bytes.

use super::model::BuildSettings;
use crate::{
    registry::{RepositoryClient, auth, cache_repo::CacheRepo},
    report::Reporter,
};

/// The build's shared cache, or `None` (with a warning to `reporter` when one was asked
/// for and cannot be had: the build goes on without it).
pub(super) fn open(settings: &BuildSettings, reporter: &dyn Reporter) -> Option<CacheRepo> {
    let asked = settings.cache_repo.as_ref()?;
    let reference = &asked.repository;
    let client = auth::credentials_for(&reference.registry)
        .map_err(|e| e.to_string())
        .and_then(|credentials| {
            RepositoryClient::new(reference, credentials, &settings.registry)
                .map_err(|e| e.to_string())
        });
    match client {
        Ok(client) => Some(CacheRepo::new(client, asked.readonly, asked.keys.clone())),
        Err(why) => {
            reporter.on_warning(&format!(
                "layer cache repository `{reference}` cannot be used ({why}); building without it"
            ));
            None
        }
    }
}
