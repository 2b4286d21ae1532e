//! `imgbuild cache du`: the cache directory's size by kind. A kind is a top-level directory
//! of the cache as the code uses it ([`KINDS`]); anything else at the top is `other`. Sizes
//! are the apparent sizes of regular files, a file with several hard links counted once (by
//! device and inode); links are not followed and count nothing.

use std::{
    collections::{BTreeMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::CacheAdminError;

/// A kind of cache content: its name, what it is, and the top-level names it takes (an
/// entry ending in `*` is a prefix).
struct CacheKind {
    name: &'static str,
    description: &'static str,
    dirs: &'static [&'static str],
}

/// The top-level directories of the cache, as the code names them.
const KINDS: &[CacheKind] = &[
    CacheKind {
        name: "layers",
        description: "layer cache: compressed layer blobs and their key files (`cache prune` evicts them)",
        dirs: &["layers"],
    },
    CacheKind {
        name: "builds",
        description: "build records: the inputs key and layers of each build, for no-op rebuilds",
        dirs: &["builds"],
    },
    CacheKind {
        name: "pkgs",
        description: "conda packages, extracted (rattler's package cache; pkgs-SUBDIR for other platforms)",
        dirs: &["pkgs", "pkgs-*"],
    },
    CacheKind {
        name: "checked",
        description: "markers of extracted packages whose files were checked",
        dirs: &["checked"],
    },
    CacheKind {
        name: "downloads",
        description: "package and wheel downloads in progress, kept to resume",
        dirs: &["downloads"],
    },
    CacheKind {
        name: "repodata",
        description: "channel repodata (rattler's repodata cache)",
        dirs: &["repodata"],
    },
    CacheKind {
        name: "wheels",
        description: "PyPI wheels, by sha256",
        dirs: &["wheels"],
    },
    CacheKind {
        name: "base",
        description: "base image blobs pulled from registries: manifests, configs and layers",
        dirs: &["blobs"],
    },
    CacheKind {
        name: "staging",
        description: "staging trees of builds running now (or killed, removed by the next build)",
        dirs: &["staging"],
    },
    CacheKind {
        name: "standalone",
        description: "the fresh clone of the checkout that .ci/run tests in",
        dirs: &["standalone"],
    },
    CacheKind {
        name: "ci",
        description: "what .ci/run and the tests keep here: cargo's target directory, the tests' downloads, fuzz corpora",
        dirs: &["target", "target-*", "test-cache", "fuzz-*"],
    },
];

/// The kind of what is not one of [`KINDS`].
const OTHER: &str = "other";

/// The size of one kind.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KindUsage {
    pub kind: &'static str,
    pub description: &'static str,
    /// The top-level names of the cache that hold it.
    pub dirs: Vec<String>,
    pub bytes: u64,
    pub files: u64,
}

/// The cache's size by kind, largest first, and in all.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CacheUsage {
    pub cache_dir: PathBuf,
    pub kinds: Vec<KindUsage>,
    pub bytes: u64,
    pub files: u64,
}

/// The kind of the top-level name `name`.
fn kind_of(name: &str) -> Option<&'static CacheKind> {
    KINDS.iter().find(|kind| {
        kind.dirs.iter().any(|dir| match dir.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *dir,
        })
    })
}

/// What the cache under `cache_dir` holds, by kind; an empty report when there is no cache.
pub(crate) fn usage(cache_dir: &Path) -> Result<CacheUsage, CacheAdminError> {
    let mut seen = HashSet::new();
    let mut kinds: BTreeMap<&'static str, KindUsage> = BTreeMap::new();
    for (name, path, meta) in entries(cache_dir)? {
        let kind = kind_of(&name);
        let usage = kinds
            .entry(kind.map_or(OTHER, |k| k.name))
            .or_insert_with(|| KindUsage {
                kind: kind.map_or(OTHER, |k| k.name),
                description: kind.map_or("what imgbuild does not write", |k| k.description),
                dirs: Vec::new(),
                bytes: 0,
                files: 0,
            });
        usage.dirs.push(name);
        let (bytes, files) = tree_size(&path, &meta, &mut seen)?;
        usage.bytes += bytes;
        usage.files += files;
    }
    let mut kinds: Vec<KindUsage> = kinds.into_values().collect();
    kinds.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.kind.cmp(b.kind)));
    Ok(CacheUsage {
        cache_dir: cache_dir.to_path_buf(),
        bytes: kinds.iter().map(|k| k.bytes).sum(),
        files: kinds.iter().map(|k| k.files).sum(),
        kinds,
    })
}

/// The bytes and number of the regular files at or under `path` (whose `lstat` is `meta`)
/// not in `seen` yet, which they are added to.
fn tree_size(
    path: &Path,
    meta: &std::fs::Metadata,
    seen: &mut HashSet<(u64, u64)>,
) -> Result<(u64, u64), CacheAdminError> {
    let (mut bytes, mut files) = (0, 0);
    let mut count = |meta: &std::fs::Metadata| {
        if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
            bytes += meta.len();
            files += 1;
        }
    };
    count(meta);
    if !meta.is_dir() {
        return Ok((bytes, files));
    }
    let mut pending = vec![path.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for (_, path, meta) in entries(&dir)? {
            count(&meta);
            if meta.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok((bytes, files))
}

/// The entries of `dir` with their `lstat`, by name; none when `dir` is gone (a staging
/// tree removed while it was measured).
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf, std::fs::Metadata)>, CacheAdminError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CacheAdminError::Read { path, source }
    };
    let listed = match fs_err::read_dir(dir) {
        Ok(listed) => listed,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(err(dir)(source)),
    };
    let mut out = Vec::new();
    for entry in listed {
        let entry = entry.map_err(err(dir))?;
        let path = entry.path();
        match fs_err::symlink_metadata(&path) {
            Ok(meta) => out.push((entry.file_name().to_string_lossy().into_owned(), path, meta)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(err(&path)(source)),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_names_map_to_kinds() {
        assert_eq!(kind_of("layers").map(|k| k.name), Some("layers"));
        assert_eq!(kind_of("pkgs-linux-aarch64").map(|k| k.name), Some("pkgs"));
        assert_eq!(kind_of("blobs").map(|k| k.name), Some("base"));
        assert!(kind_of("layer").is_none());
        let names: HashSet<&str> = KINDS.iter().map(|k| k.name).collect();
        assert_eq!(names.len(), KINDS.len(), "one name per kind");
        assert!(!names.contains(OTHER));
    }
}
