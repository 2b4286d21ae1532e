//! Deterministic tar: sorted entries, explicit parent directories, uid/gid 0, no owner
//! names, fixed times, no PAX records, symlinks kept as links.
//!
//! Files that share an inode are written as separate files. The staging tree is linked
//! from the package cache when it can be (no bytes copied) and copied when it cannot, so
//! inode sharing says how the installer worked, not what the packages hold: conda's
//! `paths.json` has no hard links between files (its `hardlink` path type is a plain file).
//!
//! Modes are normalised to 0755 (anything executable) or 0644 and directories to 0755, so
//! the builder's umask never reaches the image; conda packages carry nothing else.

use std::{
    collections::BTreeSet,
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use tar::{Builder, EntryType, Header};

#[derive(Debug, thiserror::Error)]
pub enum TarError {
    #[error("Failed to read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to write the tar entry `{path}`")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is a {kind}; an image layer may hold only files, directories and links")]
    Unsupported { path: String, kind: &'static str },
}

/// Every ancestor directory of `paths`, plus the paths themselves, in tar order.
fn with_parents(paths: &[String]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for path in paths {
        let mut current = path.as_str();
        all.insert(current.to_string());
        while let Some((parent, _)) = current.rsplit_once('/') {
            if !all.insert(parent.to_string()) {
                break;
            }
            current = parent;
        }
    }
    all
}

/// `entries` with those `patterns` match (and the directories above them) first, each group
/// in its own order; and how many come first. An eStargz layer puts its prefetch landmark
/// after them, so the stargz snapshotter fetches exactly these before a container starts.
pub(crate) fn prefetch_first(
    entries: Vec<Entry>,
    patterns: &[glob::Pattern],
) -> (Vec<Entry>, usize) {
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    let matched: Vec<&str> = entries
        .iter()
        .map(Entry::path)
        .filter(|path| patterns.iter().any(|p| p.matches_with(path, options)))
        .collect();
    let parents = with_parents(&matched.iter().map(|p| p.to_string()).collect::<Vec<_>>());
    let (mut first, rest): (Vec<Entry>, Vec<Entry>) = entries
        .into_iter()
        .partition(|entry| parents.contains(entry.path()));
    let count = first.len();
    first.extend(rest);
    (first, count)
}

/// One tar entry, as the layer will hold it: everything of the entry but a file's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Directory {
        path: String,
    },
    Symlink {
        path: String,
        target: PathBuf,
    },
    /// A regular file: `source` is where its bytes are read from.
    File {
        path: String,
        mode: u32,
        size: u64,
        source: PathBuf,
    },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::Directory { path } | Entry::Symlink { path, .. } | Entry::File { path, .. } => {
                path
            }
        }
    }
}

/// The entries of a tar of `paths` (relative to `root`) and their parent directories, in
/// tar order. Reads metadata only, never file contents.
#[allow(
    clippy::disallowed_methods,
    reason = "its error is wrapped with the path already; fs-err would name it twice"
)]
pub fn entries(root: &Path, paths: &[String]) -> Result<Vec<Entry>, TarError> {
    let explicit: BTreeSet<&str> = paths.iter().map(String::as_str).collect();
    let mut entries = Vec::with_capacity(paths.len());

    for path in with_parents(paths) {
        let source = root.join(&path);
        let meta = match std::fs::symlink_metadata(&source) {
            Ok(meta) => meta,
            // A parent we added ourselves always exists; an explicit path may be missing
            // when a package lists a file it does not ship. The image cannot hold it either.
            Err(err)
                if err.kind() == std::io::ErrorKind::NotFound
                    && explicit.contains(path.as_str()) =>
            {
                tracing::debug!("skipping `{path}`: listed by its package but not installed");
                continue;
            }
            Err(source_err) => {
                return Err(TarError::Read {
                    path: source,
                    source: source_err,
                });
            }
        };
        let file_type = meta.file_type();
        if file_type.is_dir() {
            entries.push(Entry::Directory { path });
        } else if file_type.is_symlink() {
            let target = std::fs::read_link(&source).map_err(|e| TarError::Read {
                path: source.clone(),
                source: e,
            })?;
            entries.push(Entry::Symlink { path, target });
        } else if file_type.is_file() {
            let mode = normal_mode(meta.mode());
            entries.push(Entry::File {
                path,
                mode,
                size: meta.len(),
                source,
            });
        } else {
            use std::os::unix::fs::FileTypeExt;
            let kind = if file_type.is_fifo() {
                "named pipe"
            } else if file_type.is_socket() {
                "socket"
            } else if file_type.is_block_device() || file_type.is_char_device() {
                "device file"
            } else {
                "special file"
            };
            return Err(TarError::Unsupported { path, kind });
        }
    }
    Ok(entries)
}

/// Writes a tar of `paths` (relative to `root`) and their parent directories to `out`.
/// Returns `out` after the end-of-archive blocks. Only the tests write a tar from paths;
/// builds plan their entries first ([`entries`], [`write_entries`]).
#[cfg(test)]
pub(crate) fn write_tar<W: Write>(
    root: &Path,
    paths: &[String],
    mtime: u64,
    out: W,
) -> Result<W, TarError> {
    write_entries(&entries(root, paths)?, mtime, out)
}

/// Writes `entries` as a tar to `out`, every entry stamped with `mtime`.
pub(crate) fn write_entries<W: Write>(
    entries: &[Entry],
    mtime: u64,
    out: W,
) -> Result<W, TarError> {
    let mut builder = Builder::new(out);
    for entry in entries {
        let write_err = |source: std::io::Error| TarError::Write {
            path: entry.path().to_string(),
            source,
        };
        let mut header = Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        header.set_size(0);
        match entry {
            Entry::Directory { path } => {
                header.set_entry_type(EntryType::Directory);
                header.set_mode(0o755);
                builder
                    .append_data(&mut header, format!("{path}/"), std::io::empty())
                    .map_err(write_err)?;
            }
            Entry::Symlink { path, target } => {
                header.set_entry_type(EntryType::Symlink);
                header.set_mode(0o777);
                builder
                    .append_link(&mut header, path, target)
                    .map_err(write_err)?;
            }
            Entry::File {
                path,
                mode,
                size,
                source,
            } => {
                header.set_entry_type(EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(*size);
                let file = fs_err::File::open(source).map_err(|e| TarError::Read {
                    path: source.clone(),
                    source: e,
                })?;
                // No bigger than the file: the buffer is zeroed before its first read, and
                // most files are far smaller than a MiB.
                let buffer = usize::try_from(*size)
                    .unwrap_or(usize::MAX)
                    .clamp(1, 1 << 20);
                let reader = Exact {
                    inner: std::io::BufReader::with_capacity(buffer, file),
                    remaining: *size,
                };
                builder
                    .append_data(&mut header, path, reader)
                    .map_err(write_err)?;
            }
        }
    }
    builder.into_inner().map_err(|source| TarError::Write {
        path: "<end of archive>".into(),
        source,
    })
}

/// Reads exactly the size the header announced: a file that changed size since its
/// metadata was read would otherwise make a corrupt tar (the tar crate pads by what it read).
struct Exact<R> {
    inner: R,
    remaining: u64,
}

impl<R: std::io::Read> std::io::Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let limit = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..limit])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "the file shrank while it was read ({} bytes missing)",
                    self.remaining
                ),
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// 0755 for anything executable, 0644 otherwise.
fn normal_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 { 0o755 } else { 0o644 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_come_first_and_once() {
        let paths = vec![
            "opt/conda/lib/b".to_string(),
            "opt/conda/lib/a".to_string(),
            "opt/conda-x".to_string(),
        ];
        let all: Vec<String> = with_parents(&paths).into_iter().collect();
        assert_eq!(
            all,
            [
                "opt",
                "opt/conda",
                "opt/conda-x",
                "opt/conda/lib",
                "opt/conda/lib/a",
                "opt/conda/lib/b"
            ]
        );
    }

    #[test]
    fn same_tree_same_bytes_whatever_the_host_metadata() {
        let make = |umask_mode: u32| {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            fs_err::create_dir_all(root.join("p/bin")).unwrap();
            fs_err::write(root.join("p/bin/tool"), "#!/bin/sh\n").unwrap();
            fs_err::write(root.join("p/data"), "x").unwrap();
            std::os::unix::fs::symlink("tool", root.join("p/bin/alias")).unwrap();
            fs_err::hard_link(root.join("p/data"), root.join("p/data2")).unwrap();
            crate::fs::set_mode(&root.join("p/bin/tool"), 0o700 & umask_mode | 0o100).unwrap();
            crate::fs::set_mode(&root.join("p/data"), 0o666 & umask_mode).unwrap();
            let paths = ["p/bin/tool", "p/bin/alias", "p/data", "p/data2"].map(String::from);
            write_tar(root, &paths, 42, Vec::new()).unwrap()
        };
        let a = make(0o777);
        let b = make(0o700);
        assert_eq!(a, b);

        let mut archive = tar::Archive::new(a.as_slice());
        let entries: Vec<(String, EntryType, u32, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            entries,
            vec![
                ("p/".into(), EntryType::Directory, 0o755, 42),
                ("p/bin/".into(), EntryType::Directory, 0o755, 42),
                ("p/bin/alias".into(), EntryType::Symlink, 0o777, 42),
                ("p/bin/tool".into(), EntryType::Regular, 0o755, 42),
                ("p/data".into(), EntryType::Regular, 0o644, 42),
                // A hard link in the staging tree is a file of its own in the layer.
                ("p/data2".into(), EntryType::Regular, 0o644, 42),
            ]
        );
    }

    #[test]
    fn long_names_and_link_targets_survive() {
        let dir = tempfile::tempdir().unwrap();
        let deep = format!("p/{}/{}", "d".repeat(120), "f".repeat(120));
        let link = format!("p/{}", "l".repeat(150));
        fs_err::create_dir_all(dir.path().join(&deep).parent().unwrap()).unwrap();
        fs_err::write(dir.path().join(&deep), "x").unwrap();
        std::os::unix::fs::symlink(format!("../{deep}"), dir.path().join(&link)).unwrap();
        let bytes = write_tar(dir.path(), &[deep.clone(), link.clone()], 0, Vec::new()).unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let entries: Vec<(String, Option<String>)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.link_name()
                        .unwrap()
                        .map(|l| l.to_string_lossy().into_owned()),
                )
            })
            .filter(|(path, _)| path == &deep || path == &link)
            .collect();
        assert_eq!(
            entries,
            vec![(deep.clone(), None), (link, Some(format!("../{deep}")))]
        );
    }

    #[test]
    fn refuses_special_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let err = write_tar(dir.path(), &["pipe".to_string()], 0, Vec::new()).unwrap_err();
        assert!(err.to_string().contains("named pipe"), "{err}");
    }
}
