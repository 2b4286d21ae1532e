//! Small locks and recipes the lock's unit tests share.

use std::path::Path;

use rattler_conda_types::{RepoDataRecord, Subdir};
use rattler_solve::ChannelPriority;

use super::{Lock, LockedBase, PlatformLock};
use crate::{
    recipe::{Recipe, RecipeOptions},
    resolve::Target,
};

pub fn record(name: &str, subdir: &str, sha: u8) -> RepoDataRecord {
    let file = format!("{name}-1.0-0.conda");
    serde_json::from_value(serde_json::json!({
        "name": name,
        "version": "1.0",
        "build": "0",
        "build_number": 0,
        "depends": if name == "app" { vec!["lib", "__glibc >=2.17"] } else { vec![] },
        "subdir": subdir,
        "fn": file,
        "url": format!("file:///ch/{subdir}/{file}"),
        "channel": "file:///ch/",
        "sha256": format!("{sha:02x}").repeat(32),
    }))
    .unwrap()
}

pub fn recipe(platforms: &str) -> Recipe {
    Recipe::from_str_at(
        &format!(
            "[image]\nname = \"x\"\nplatforms = [{platforms}]\n[conda]\nchannels = [\"file:///ch\"]\ndependencies = [\"app\"]\n"
        ),
        Path::new("/work/recipes/x.toml"),
        &RecipeOptions::default(),
    )
    .unwrap()
}

pub(crate) fn platform_lock(
    recipe: &Recipe,
    platform: Subdir,
    base: LockedBase,
    sha: u8,
) -> PlatformLock {
    PlatformLock {
        target: Target::for_recipe(recipe, platform, None),
        base,
        records: vec![
            record("app", platform.as_str(), sha),
            record("lib", "noarch", 9),
        ],
        wheels: Vec::new(),
    }
}

pub fn two_platform_lock(recipe: &Recipe) -> Lock {
    Lock {
        channels: vec!["file:///ch/".to_string()],
        channel_priority: ChannelPriority::Strict,
        pypi: None,
        platforms: vec![
            platform_lock(
                recipe,
                Subdir::Linux64,
                LockedBase::Digest(format!("sha256:{}", "a".repeat(64))),
                1,
            ),
            platform_lock(
                recipe,
                Subdir::LinuxAarch64,
                LockedBase::Digest(format!("sha256:{}", "b".repeat(64))),
                2,
            ),
        ],
    }
}

pub fn wanted(lock: &Lock) -> Vec<(Target, LockedBase)> {
    lock.platforms
        .iter()
        .map(|p| (p.target.clone(), p.base.clone()))
        .collect()
}
