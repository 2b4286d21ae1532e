//! The lock file: `recipes/<name>.lock`, next to its recipe.
//!
//! It is a rattler/pixi lock file (format v7), so pixi and rattler tools can read it, with
//! one imgbuild addition kept in a leading comment: the digest of the base image. A lock
//! pins every package by URL and sha256, the target's virtual packages and the channels.
//!
//! `model` is what a lock holds, `file` reads and writes it, and `check` says whether it
//! still fits its recipe (staleness) and comes only from the recipe's sources (provenance).
//! `sources` pins the recipe's `[[files]]` sources in a second leading comment.

mod check;
mod file;
mod header;
mod model;
mod models;
mod sources;

// Test values, for this crate's tests and (through the `fixtures` feature) the crates
// above it.
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;

pub use check::Staleness;
pub use file::{LockError, MAX_LOCK_BYTES};
pub use model::{Lock, LockedBase, PlatformLock, ResolvedWheel};
pub use models::{ModelPin, check_models, models_in, read_models};
pub use sources::{SourceDigest, check_files, read_sources, sources_in};

/// A lock written, read back and checked against the recipe it was written for.
#[cfg(test)]
mod tests {
    use std::path::Path;

    use rattler_conda_types::{RepoDataRecord, Subdir};
    use rattler_solve::ChannelPriority;

    use super::fixtures::{platform_lock, recipe, two_platform_lock, wanted};
    use super::*;

    #[test]
    fn a_two_platform_lock_reads_back_with_each_platforms_base() {
        let recipe = recipe("\"linux-64\", \"linux-aarch64\"");
        let lock = two_platform_lock(&recipe);
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(
            text.contains(&format!(
                "# imgbuild-base: linux-64=sha256:{} linux-aarch64=sha256:{}\n",
                "a".repeat(64),
                "b".repeat(64)
            )),
            "{text}"
        );
        let read = Lock::parse(&text, Path::new("/work/recipes/x.lock")).unwrap();
        assert_eq!(read.platforms.len(), 2);
        for platform in [Subdir::Linux64, Subdir::LinuxAarch64] {
            let (locked, original) = (
                read.platform(platform).unwrap(),
                lock.platform(platform).unwrap(),
            );
            assert_eq!(locked.base, original.base);
            assert_eq!(locked.target, original.target);
            assert_eq!(locked.records.len(), 2);
        }
        // The noarch `lib` is locked for both platforms but is one package.
        assert_eq!(read.all_records().count(), 4);
        assert_eq!(read.distinct_records().len(), 3);
        assert_eq!(read.common_base(), None);
        assert!(read.check(&recipe, &wanted(&lock)).is_ok());
    }

    /// `record` as some old repodata has it: no sha256, with or without an md5.
    fn without_sha256(mut record: RepoDataRecord, md5: bool) -> RepoDataRecord {
        record.package_record.sha256 = None;
        record.package_record.md5 = md5.then(|| {
            rattler_digest::parse_digest_from_hex::<rattler_digest::Md5>(&"ab".repeat(16))
                .expect("an md5 in hex")
        });
        record
    }

    #[test]
    fn a_record_without_sha256_is_written_and_read_back() {
        let recipe = recipe("\"linux-64\"");
        for md5 in [true, false] {
            let mut lock = two_platform_lock(&recipe);
            lock.platforms.truncate(1);
            let records = &mut lock.platforms[0].records;
            records[0] = without_sha256(records[0].clone(), md5);
            let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
            let read = Lock::parse(&text, Path::new("/work/recipes/x.lock"))
                .unwrap_or_else(|e| panic!("md5 {md5}: {e}\n{text}"));
            let app = &read.platforms[0].records[0].package_record;
            assert_eq!(app.name.as_normalized(), "app");
            assert_eq!(app.sha256, None, "{text}");
            assert_eq!(app.md5, lock.platforms[0].records[0].package_record.md5);
            assert!(read.check(&recipe, &wanted(&lock)).is_ok());
        }
    }

    #[test]
    fn a_one_platform_lock_keeps_its_one_line_base_pin() {
        let recipe = recipe("\"linux-aarch64\"");
        let lock = Lock {
            channels: vec!["file:///ch/".to_string()],
            channel_priority: ChannelPriority::Strict,
            pypi: None,
            platforms: vec![platform_lock(
                &recipe,
                Subdir::LinuxAarch64,
                LockedBase::Scratch,
                2,
            )],
        };
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(text.contains("\n# imgbuild-base: scratch\n"), "{text}");
        let read = Lock::parse(&text, Path::new("/work/recipes/x.lock")).unwrap();
        assert_eq!(read.common_base(), Some(&LockedBase::Scratch));
        assert!(read.check(&recipe, &wanted(&lock)).is_ok());
    }

    #[test]
    fn a_changed_channel_priority_makes_the_lock_stale_and_survives_the_file() {
        let strict = recipe("\"linux-64\", \"linux-aarch64\"");
        let mut disabled = strict.clone();
        disabled.channel_priority = ChannelPriority::Disabled;
        let mut lock = two_platform_lock(&strict);
        assert_eq!(lock.check(&strict, &wanted(&lock)), Ok(()));
        // Not one platform's reason: the priority is the recipe's.
        assert_eq!(
            lock.check(&disabled, &wanted(&lock)),
            Err(Staleness::ChannelPriority {
                locked: ChannelPriority::Strict,
                wanted: ChannelPriority::Disabled,
            })
        );
        assert_eq!(
            lock.check(&disabled, &wanted(&lock))
                .unwrap_err()
                .to_string(),
            "the channel priority changed: locked `strict`, the recipe has `disabled`"
        );

        // A strict lock is written as before the key existed (rattler omits its default).
        let path = Path::new("/work/recipes/x.lock");
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(!text.contains("channel-priority"), "{text}");
        assert_eq!(
            Lock::parse(&text, path).unwrap().channel_priority,
            ChannelPriority::Strict
        );
        lock.channel_priority = ChannelPriority::Disabled;
        let text = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert!(text.contains("channel-priority: disabled"), "{text}");
        let read = Lock::parse(&text, path).unwrap();
        assert_eq!(read.channel_priority, ChannelPriority::Disabled);
        assert_eq!(read.check(&disabled, &wanted(&read)), Ok(()));
    }
}
