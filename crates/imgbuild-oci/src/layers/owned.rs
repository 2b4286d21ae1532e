//! Layers whose entries carry their own owner and mode: the accounts layer (`/etc/passwd`,
//! `/etc/group`, home directories) and the recipe's `[[files]]`. Package layers are owned by
//! root with normalised modes ([`super::tar`]); these are what the recipe says they are.
//!
//! The tar is as deterministic as a package layer's: entries sorted by path, with explicit
//! parent directories (root-owned, 0755, unless the layer names them) or, for a layer
//! that must leave the owners of the directories above it alone, none; GNU headers without
//! PAX records or owner names, every entry stamped with the layer's one mtime. The cache key
//! is the sha256 of every entry whole (path, kind, owner, mode, link target and the sha256
//! of each file's bytes), so equal keys mean equal tars.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    path::PathBuf,
};

use sha2::{Digest, Sha256};
use tar::{Builder, EntryType, Header};

use super::{compress::Compression, plan::LayerKind, tar::TarError};
use crate::fs::context::ContextFile;

/// Bump when what an owned layer holds for the same entries changes.
const KEY_FORMAT: &str = "imgbuild-owned-layer-key/1";

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Directory,
    Symlink(PathBuf),
    /// A file made by the build (`/etc/passwd`).
    Bytes(Vec<u8>),
    /// A file of a build context, which had `size` bytes hashing to `sha256` when the
    /// layer was planned; opened again beneath the same context when it is written.
    File {
        source: ContextFile,
        size: u64,
        sha256: String,
    },
}

/// One entry of an owned layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedEntry {
    /// Relative to the image's `/`, without a leading or trailing `/`.
    pub path: String,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (`0o644`); links are always written 0777.
    pub mode: u32,
    pub content: Content,
}

impl OwnedEntry {
    /// A root-owned 0755 directory, as the parents the layer adds.
    pub(crate) fn root_directory(path: impl Into<String>) -> Self {
        OwnedEntry {
            path: path.into(),
            uid: 0,
            gid: 0,
            mode: 0o755,
            content: Content::Directory,
        }
    }
}

/// An owned layer, planned: its entries in tar order, parents included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedLayer {
    pub kind: LayerKind,
    /// For history and reports: `accounts`, `files /app`.
    pub name: String,
    pub entries: Vec<OwnedEntry>,
    /// Modification time of every entry, seconds since the epoch.
    pub mtime: u64,
}

impl OwnedLayer {
    /// A layer of `entries`, sorted by path, each path once (a later entry for a path
    /// replaces an earlier one), with every missing parent directory added root-owned.
    pub fn new(kind: LayerKind, name: String, entries: Vec<OwnedEntry>, mtime: u64) -> Self {
        let mut by_path = by_path(entries);
        let parents: Vec<String> = by_path
            .keys()
            .flat_map(|path| {
                let mut parents = Vec::new();
                let mut current = path.as_str();
                while let Some((parent, _)) = current.rsplit_once('/') {
                    parents.push(parent.to_string());
                    current = parent;
                }
                parents
            })
            .collect();
        for parent in parents {
            by_path
                .entry(parent.clone())
                .or_insert_with(|| OwnedEntry::root_directory(parent));
        }
        OwnedLayer {
            kind,
            name,
            entries: by_path.into_values().collect(),
            mtime,
        }
    }

    /// A layer of `entries`, sorted by path, each path once, and no directory it does not
    /// name: the parents above the entries keep the owners the layers below give them.
    pub fn without_parents(
        kind: LayerKind,
        name: String,
        entries: Vec<OwnedEntry>,
        mtime: u64,
    ) -> Self {
        OwnedLayer {
            kind,
            name,
            entries: by_path(entries).into_values().collect(),
            mtime,
        }
    }

    /// Bytes of file data, for reports.
    pub fn size(&self) -> u64 {
        self.entries
            .iter()
            .map(|entry| match &entry.content {
                Content::Bytes(bytes) => bytes.len() as u64,
                Content::File { size, .. } => *size,
                _ => 0,
            })
            .sum()
    }

    /// The layer cache key: everything that decides the tar's bytes.
    pub fn key(&self, compression: Compression) -> String {
        let head = serde_json::json!([
            KEY_FORMAT,
            env!("CARGO_PKG_VERSION"),
            compression.describe(),
            self.mtime
        ]);
        self.digest(Some(head), |entry| {
            serde_json::json!([
                entry.path,
                entry.uid,
                entry.gid,
                entry.mode,
                content_of(entry)
            ])
        })
    }

    /// `sha256:<hex>` of what the entries hold, whoever owns them and whenever they are
    /// stamped: each one's path, mode, kind, link target and file sha256. What a lock pins
    /// of a `[[files]]` source, so it does not change with imgbuild's version.
    pub fn content_digest(&self) -> String {
        let digest = self.digest(None, |entry| {
            serde_json::json!([entry.path, entry.mode, content_of(entry)])
        });
        format!("sha256:{digest}")
    }

    /// The sha256 of `head` and one JSON line per entry.
    fn digest(
        &self,
        head: Option<serde_json::Value>,
        line_of: impl Fn(&OwnedEntry) -> serde_json::Value,
    ) -> String {
        let mut hasher = Sha256::new();
        for line in head.into_iter().chain(self.entries.iter().map(line_of)) {
            hasher.update(line.to_string().as_bytes());
            hasher.update(b"\n");
        }
        hex::encode(hasher.finalize())
    }
}

/// An entry's content as the cache key and the content digest name it.
fn content_of(entry: &OwnedEntry) -> serde_json::Value {
    match &entry.content {
        Content::Directory => serde_json::json!(["d"]),
        Content::Symlink(target) => serde_json::json!(["l", target.to_string_lossy()]),
        Content::Bytes(bytes) => {
            serde_json::json!(["f", bytes.len(), hex::encode(Sha256::digest(bytes))])
        }
        Content::File { size, sha256, .. } => serde_json::json!(["f", size, sha256]),
    }
}

/// `entries` by path, in tar order; a later entry for a path replaces an earlier one.
fn by_path(entries: Vec<OwnedEntry>) -> BTreeMap<String, OwnedEntry> {
    entries
        .into_iter()
        .map(|entry| (entry.path.clone(), entry))
        .collect()
}

/// Writes `layer` as a tar to `out`; returns `out` after the end-of-archive blocks. A file
/// whose bytes no longer hash to what was planned is an error: the layer would not be the
/// one its cache key names.
pub(crate) fn write_owned_tar<W: Write>(layer: &OwnedLayer, out: W) -> Result<W, TarError> {
    let mut builder = Builder::new(out);
    for entry in &layer.entries {
        let write_err = |source: std::io::Error| TarError::Write {
            path: entry.path.clone(),
            source,
        };
        let mut header = Header::new_gnu();
        header.set_uid(u64::from(entry.uid));
        header.set_gid(u64::from(entry.gid));
        header.set_mtime(layer.mtime);
        header.set_mode(entry.mode);
        header.set_size(0);
        let path = &entry.path;
        match &entry.content {
            Content::Directory => {
                header.set_entry_type(EntryType::Directory);
                builder
                    .append_data(&mut header, format!("{path}/"), std::io::empty())
                    .map_err(write_err)?;
            }
            Content::Symlink(target) => {
                header.set_entry_type(EntryType::Symlink);
                header.set_mode(0o777);
                builder
                    .append_link(&mut header, path, target)
                    .map_err(write_err)?;
            }
            Content::Bytes(bytes) => {
                header.set_entry_type(EntryType::Regular);
                header.set_size(bytes.len() as u64);
                builder
                    .append_data(&mut header, path, bytes.as_slice())
                    .map_err(write_err)?;
            }
            Content::File {
                source,
                size,
                sha256,
            } => {
                header.set_entry_type(EntryType::Regular);
                header.set_size(*size);
                let read_err = |e: std::io::Error| TarError::Read {
                    path: source.host_path(),
                    source: e,
                };
                // The same confined open as the walk's, and still a regular file of the
                // planned size: a file swapped for a fifo or a link since is refused, never
                // waited on or followed.
                let file = source
                    .open_sized(*size)
                    .map_err(|e| read_err(std::io::Error::other(e)))?;
                let mut reader = Checked {
                    inner: std::io::BufReader::with_capacity(1 << 20, file),
                    remaining: *size,
                    hasher: Sha256::new(),
                };
                builder
                    .append_data(&mut header, path, &mut reader)
                    .map_err(write_err)?;
                // A file changed since it was planned must not reach a layer under the old
                // key; the error drops the half-written blob.
                if hex::encode(reader.hasher.finalize()) != *sha256 {
                    return Err(read_err(std::io::Error::other(
                        "the file changed while the image was built",
                    )));
                }
            }
        }
    }
    builder.into_inner().map_err(|source| TarError::Write {
        path: "<end of archive>".into(),
        source,
    })
}

/// Reads exactly the size the header announced, hashing what passes: a file that shrank is
/// an error here, one whose bytes changed is an error once it is read.
struct Checked<R> {
    inner: R,
    remaining: u64,
    hasher: Sha256,
}

impl<R: Read> Read for Checked<R> {
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
                "the file shrank while the image was built",
            ));
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, uid: u32, content: Content) -> OwnedEntry {
        OwnedEntry {
            path: path.into(),
            uid,
            gid: uid,
            mode: 0o644,
            content,
        }
    }

    #[test]
    fn entries_are_sorted_with_their_parents_and_keep_their_owners() {
        let layer = OwnedLayer::new(
            LayerKind::Accounts,
            "accounts".into(),
            vec![
                entry("home/app", 1000, Content::Directory),
                entry(
                    "etc/passwd",
                    0,
                    Content::Bytes(b"root:x:0:0::/root:/bin/sh\n".to_vec()),
                ),
            ],
            42,
        );
        let paths: Vec<&str> = layer.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["etc", "etc/passwd", "home", "home/app"]);
        let tar = write_owned_tar(&layer, Vec::new()).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let headers: Vec<(String, u64, u64, u32, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            headers,
            [
                ("etc/".to_string(), 0, 0, 0o755, 42),
                ("etc/passwd".to_string(), 0, 0, 0o644, 42),
                ("home/".to_string(), 0, 0, 0o755, 42),
                ("home/app/".to_string(), 1000, 1000, 0o644, 42),
            ]
        );
        // The same entries give the same bytes and key; another owner another key.
        assert_eq!(write_owned_tar(&layer, Vec::new()).unwrap(), tar);
        let mut other = layer.clone();
        other.entries[3].uid = 1001;
        assert_ne!(other.key(Compression::Gzip), layer.key(Compression::Gzip));
        // The content digest leaves owners (and the time) out.
        other.mtime = 43;
        assert_eq!(other.content_digest(), layer.content_digest());
        other.entries[1].mode = 0o600;
        assert_ne!(other.content_digest(), layer.content_digest());
    }

    /// A layer of the one file `f` of a context at `dir`, planned as holding `one`.
    fn planned(dir: &std::path::Path) -> OwnedLayer {
        let planned = Content::File {
            source: ContextFile {
                context: crate::fs::context::BuildContext::open(dir).unwrap(),
                path: "f".into(),
            },
            size: 3,
            sha256: hex::encode(Sha256::digest(b"one")),
        };
        OwnedLayer::new(
            LayerKind::Files,
            "f".into(),
            vec![entry("f", 0, planned)],
            0,
        )
    }

    #[test]
    fn a_file_changed_since_it_was_planned_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("f");
        fs_err::write(&source, b"one").unwrap();
        let layer = planned(dir.path());
        assert!(write_owned_tar(&layer, Vec::new()).is_ok());
        fs_err::write(&source, b"two").unwrap();
        let err = write_owned_tar(&layer, Vec::new()).unwrap_err();
        assert!(format!("{:?}", err).contains("changed"), "{err:?}");
    }

    /// The file swapped, between the walk and the tar writer, for a fifo with no writer
    /// (which a blocking open would wait on for ever), a link out, or a larger file: each
    /// refused, naming the file. The thread's deadline guards against a hang only.
    #[test]
    fn a_file_swapped_since_it_was_planned_is_refused_without_waiting() {
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("secret"), b"one").unwrap();
        type Swap = fn(&std::path::Path, &std::path::Path);
        let swaps: [(Swap, &str); 3] = [
            (
                |f, _| {
                    let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                },
                "is a fifo, not a regular file",
            ),
            (
                |f, out| std::os::unix::fs::symlink(out.join("secret"), f).unwrap(),
                "is a symbolic link",
            ),
            (
                |f, _| fs_err::write(f, b"one and more").unwrap(),
                "not the 3 it had",
            ),
        ];
        for (swap, needle) in swaps {
            let dir = tempfile::tempdir().unwrap();
            let source = dir.path().join("f");
            fs_err::write(&source, b"one").unwrap();
            let layer = planned(dir.path());
            fs_err::remove_file(&source).unwrap();
            swap(&source, outside.path());
            let (done, wait) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = done.send(write_owned_tar(&layer, Vec::new()).map(drop));
            });
            let result = wait
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("the tar writer hung on a swapped file ({needle})"));
            let err = result.unwrap_err();
            let mut cause: Option<&dyn std::error::Error> = Some(&err);
            let mut err = String::new();
            while let Some(e) = cause {
                err += &format!("{e}: ");
                cause = e.source();
            }
            assert!(err.contains(needle) && err.contains("/f"), "{err}");
        }
    }
}
