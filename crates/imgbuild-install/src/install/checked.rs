//! Remembering that a package was checked, so a build does not re-read every byte of every
//! package it has seen before (hashing a 2 GB CUDA package takes seconds on each build).
//!
//! A marker `<cache>/checked/<archive sha256>` is written (temp file + rename, so a marker
//! cut short by a crash never counts) once the archive was scanned and its extracted copy
//! matched `info/paths.json`. It is keyed by the sha256 of the archive, so a different
//! archive under the same name is always checked, and it holds a fingerprint of the extracted
//! copy: the path, type, size, mtime, inode and mode of every entry. Reusing a marker costs
//! one `stat` per file instead of reading the files.
//!
//! The trade-off, stated: a change to the extracted copy that keeps every file's size, mtime
//! and inode (an in-place rewrite of equal length followed by resetting the mtime) goes
//! unnoticed until the marker is removed. That takes someone with write access to the cache
//! who is trying to hide; every accidental change (a truncated write, an edited or replaced
//! file, a re-extraction) alters the fingerprint and brings back the full check. The version
//! line retires every marker when the checks themselves change.

use std::{
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

/// Bumped whenever the checks behind a marker change, so older markers no longer count.
const VERSION: &str = "imgbuild-checked 2";

/// The marker of the archive with sha256 `archive_sha256`.
pub(super) fn marker_path(cache_dir: &Path, archive_sha256: &str) -> PathBuf {
    cache_dir.join("checked").join(archive_sha256)
}

/// Whether `dir` (the extracted copy) is exactly as it was when the marker was written.
pub(super) fn is_marked(cache_dir: &Path, archive_sha256: &str, dir: &Path) -> bool {
    // A marker is a few hundred bytes; one that is not a regular file (a fifo would wait)
    // or is larger is not imgbuild's, and counts for nothing.
    let Ok(text) = crate::fs::read_input_text(&marker_path(cache_dir, archive_sha256), 64 << 10)
    else {
        return false;
    };
    let Ok(fingerprint) = fingerprint(dir) else {
        return false;
    };
    text == marker_text(dir, &fingerprint)
}

/// Records that the archive `archive_sha256`, extracted at `dir`, passed every check.
pub(super) fn mark(cache_dir: &Path, archive_sha256: &str, dir: &Path) -> std::io::Result<()> {
    let path = marker_path(cache_dir, archive_sha256);
    fs_err::create_dir_all(path.parent().expect("under checked/"))?;
    crate::fs::write_atomic(&path, marker_text(dir, &fingerprint(dir)?).as_bytes())
}

fn marker_text(dir: &Path, fingerprint: &str) -> String {
    format!("{VERSION}\n{}\n{fingerprint}\n", dir.display())
}

/// sha256 over every entry's path and metadata (not its content), in a sorted walk.
fn fingerprint(dir: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut line = Vec::new();
    for entry in walkdir::WalkDir::new(dir)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.map_err(std::io::Error::other)?;
        let meta = entry.metadata().map_err(std::io::Error::other)?;
        let relative = entry.path().strip_prefix(dir).unwrap_or(entry.path());
        line.clear();
        line.extend_from_slice(relative.as_os_str().as_encoded_bytes());
        // Fields are separated by NUL, which no path holds.
        write!(
            line,
            "\0{:o}\0{}\0{}.{}\0{}\0",
            meta.mode(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ino()
        )?;
        hasher.update(&line);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_stops_counting_when_a_file_changes() {
        let cache = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        fs_err::write(dir.path().join("a.txt"), "one\n").unwrap();
        assert!(!is_marked(cache.path(), "abc", dir.path()));
        mark(cache.path(), "abc", dir.path()).unwrap();
        assert!(is_marked(cache.path(), "abc", dir.path()));
        // Another archive's sha256 never borrows this marker.
        assert!(!is_marked(cache.path(), "abd", dir.path()));
        fs_err::write(dir.path().join("a.txt"), "one!\n").unwrap();
        assert!(!is_marked(cache.path(), "abc", dir.path()));
    }

    #[test]
    fn a_half_written_marker_never_counts() {
        let cache = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        fs_err::write(dir.path().join("a.txt"), "one\n").unwrap();
        mark(cache.path(), "abc", dir.path()).unwrap();
        let path = marker_path(cache.path(), "abc");
        let full = fs_err::read_to_string(&path).unwrap();
        fs_err::write(&path, &full[..full.len() - 10]).unwrap();
        assert!(!is_marked(cache.path(), "abc", dir.path()));
    }
}
