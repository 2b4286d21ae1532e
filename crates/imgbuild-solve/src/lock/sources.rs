//! The `[[files]]` sources a lock pins: one digest per entry of the recipe, in its order, in
//! a leading `# imgbuild-files:` comment after the base's (a JSON array, so any `src`
//! survives). Like the base, the sources are imgbuild's and not rattler's: a lock without
//! the header pins no sources, which is every lock of a recipe without `[[files]]`.
//!
//! The digest of a source is computed by the build (it walks the source); this module
//! writes, reads and compares them, so `--locked` and `verify --recipe` can say which
//! source changed.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Lock, LockError, Staleness};

const SOURCES_MARKER: &str = "# imgbuild-files: ";

/// One `[[files]]` source as a lock pins it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceDigest {
    /// `src` as the recipe writes it.
    pub src: String,
    /// `sha256:<hex>` of what the build takes from it: every entry's path, kind, mode, link
    /// target and file sha256.
    pub digest: String,
}

impl Lock {
    /// The lock text with the `sources` pinned (none: the text [`Lock::render`] gives).
    pub(crate) fn render_with_sources(
        &self,
        recipe_file: &str,
        lock_dir: &Path,
        sources: &[SourceDigest],
    ) -> Result<String, LockError> {
        let text = self.render(recipe_file, lock_dir)?;
        Ok(with_sources_header(&text, sources))
    }

    /// Writes the lock with the `sources` and the `models`' files pinned, atomically.
    pub fn write_pinned(
        &self,
        path: &Path,
        recipe_file: &str,
        sources: &[SourceDigest],
        models: &[super::ModelPin],
    ) -> Result<(), LockError> {
        let lock_dir = path.parent().unwrap_or(Path::new("."));
        let text = self.render_with_sources(recipe_file, lock_dir, sources)?;
        let text = super::models::with_models_header(&text, models);
        crate::fs::write_atomic(path, text.as_bytes()).map_err(|source| LockError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// `text` (a rendered lock) with the sources' header after the leading comments' base line.
fn with_sources_header(text: &str, sources: &[SourceDigest]) -> String {
    if sources.is_empty() {
        return text.to_string();
    }
    let header = format!(
        "{SOURCES_MARKER}{}\n",
        serde_json::to_string(sources).expect("strings serialize")
    );
    let mut out = String::with_capacity(text.len() + header.len());
    let mut placed = false;
    for line in text.split_inclusive('\n') {
        out.push_str(line);
        if !placed && line.starts_with("# imgbuild-base: ") {
            out.push_str(&header);
            placed = true;
        }
    }
    out
}

/// The sources the lock text pins; none without the header.
pub fn sources_in(text: &str, path: &Path) -> Result<Vec<SourceDigest>, LockError> {
    super::header::list_in(text, path, SOURCES_MARKER, "sources")
}

/// The sources the lock at `path` pins; none when there is no lock.
pub fn read_sources(path: &Path) -> Result<Vec<SourceDigest>, LockError> {
    super::header::read_list(path, SOURCES_MARKER, "sources")
}

/// Whether the `locked` sources are the `wanted` ones (the recipe's entries, in order, as
/// they are now); the first that differs is the reason.
pub fn check_files(locked: &[SourceDigest], wanted: &[SourceDigest]) -> Result<(), Staleness> {
    let count = locked.len().max(wanted.len());
    for i in 0..count {
        let (locked, wanted) = (locked.get(i), wanted.get(i));
        if locked != wanted {
            return Err(Staleness::Sources {
                src: wanted.or(locked).map(|s| s.src.clone()).unwrap_or_default(),
                locked: locked.map(|s| s.digest.clone()),
                wanted: wanted.map(|s| s.digest.clone()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{recipe, two_platform_lock};
    use super::*;

    fn source(src: &str, digest: char) -> SourceDigest {
        SourceDigest {
            src: src.into(),
            digest: format!("sha256:{}", digest.to_string().repeat(64)),
        }
    }

    #[test]
    fn sources_are_written_after_the_base_and_read_back() {
        let recipe = recipe("\"linux-64\", \"linux-aarch64\"");
        let lock = two_platform_lock(&recipe);
        let sources = [source("app", 'a'), source("odd \"name\"", 'b')];
        let text = lock
            .render_with_sources("x.toml", Path::new("/work/recipes"), &sources)
            .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].starts_with("# imgbuild-base: "), "{text}");
        assert!(
            lines[3].starts_with("# imgbuild-files: [{\"src\":\"app\""),
            "{text}"
        );
        let path = Path::new("/work/recipes/x.lock");
        assert_eq!(sources_in(&text, path).unwrap(), sources);
        // rattler_lock and the rest of the lock read it as before.
        assert_eq!(Lock::parse(&text, path).unwrap().platforms.len(), 2);
        let plain = lock.render("x.toml", Path::new("/work/recipes")).unwrap();
        assert_eq!(
            lock.render_with_sources("x.toml", Path::new("/work/recipes"), &[])
                .unwrap(),
            plain
        );
        assert!(sources_in(&plain, path).unwrap().is_empty());
        let broken = text.replace("# imgbuild-files: [", "# imgbuild-files: {");
        assert!(sources_in(&broken, path).is_err());
    }

    #[test]
    fn a_changed_added_or_removed_source_is_named() {
        let locked = [source("app", 'a'), source("conf", 'c')];
        assert!(check_files(&locked, &locked).is_ok());
        let changed = [source("app", 'b'), source("conf", 'c')];
        let reason = check_files(&locked, &changed).unwrap_err();
        assert_eq!(
            reason.to_string(),
            format!(
                "`[[files]]` source `app` changed (locked sha256:{}…, now sha256:{}…)",
                "a".repeat(12),
                "b".repeat(12)
            )
        );
        let fewer = check_files(&locked, &locked[..1]).unwrap_err();
        assert!(fewer.to_string().contains("`conf` is no longer"), "{fewer}");
        let more = check_files(&locked[..1], &locked).unwrap_err();
        assert!(
            more.to_string().contains("`conf` is not in the lock"),
            "{more}"
        );
    }
}
