//! What every hostile case of the input-surface register (README, "Input surfaces") checks
//! besides its refusal: no host secret reached an output, nothing was written outside the
//! outputs, and the previous image survived.
//!
//! A [`Canary`] is a directory outside every project holding files with a random secret:
//! the hostile input aims at them, and the test then searches every file the run wrote
//! (layers decompressed) for the secret, and checks that the canary directory is as it was.

use std::{
    collections::BTreeMap,
    io::Read,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

/// A directory of secret files that no output may ever carry.
pub(crate) struct Canary {
    dir: tempfile::TempDir,
    /// The secret, written in every canary file.
    pub secret: String,
    before: Tree,
}

impl Canary {
    /// `secret.txt` and `secrets/inner.txt` under a fresh directory, each holding the secret.
    pub(crate) fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("imgbuild-canary-")
            .tempdir()
            .expect("a canary dir");
        let secret = format!("CANARY-{:032x}", rand::random::<u128>());
        fs_err::write(dir.path().join("secret.txt"), format!("token={secret}\n")).unwrap();
        fs_err::create_dir_all(dir.path().join("secrets")).unwrap();
        fs_err::write(dir.path().join("secrets/inner.txt"), &secret).unwrap();
        let before = Tree::of(dir.path());
        Canary {
            dir,
            secret,
            before,
        }
    }

    /// The canary directory.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The secret file.
    pub(crate) fn file(&self) -> PathBuf {
        self.dir.path().join("secret.txt")
    }

    /// No file under `root` holds the secret, as it is or decompressed (gzip, zstd).
    #[track_caller]
    pub(crate) fn assert_not_in(&self, root: &Path) {
        for (path, bytes) in files_under(root) {
            assert!(
                !contains(&bytes, self.secret.as_bytes()),
                "the canary's secret reached {}",
                path.display()
            );
        }
    }

    /// Nothing in the canary directory was added, removed or changed.
    #[track_caller]
    pub(crate) fn assert_untouched(&self) {
        assert_eq!(
            Tree::of(self.dir.path()),
            self.before,
            "a run wrote into the canary directory"
        );
    }
}

/// Every file under a directory by path: its kind, mode and, for a file, its sha256. Two
/// trees are equal when nothing under them was written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Tree(BTreeMap<PathBuf, String>);

impl Tree {
    /// The tree of `root` as it is now; empty when `root` does not exist.
    pub(crate) fn of(root: &Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        let mut entries = BTreeMap::new();
        if !root.exists() {
            return Tree(entries);
        }
        for entry in walkdir::WalkDir::new(root).sort_by_file_name() {
            let entry = entry.expect("walking a tree");
            let meta = entry.path().symlink_metadata().unwrap();
            let what = if meta.is_file() {
                let bytes = fs_err::read(entry.path()).unwrap();
                format!(
                    "file {:o} {}",
                    meta.mode(),
                    hex::encode(Sha256::digest(&bytes))
                )
            } else if meta.file_type().is_symlink() {
                let target = fs_err::read_link(entry.path()).unwrap();
                format!("link {}", target.display())
            } else {
                format!("other {:o}", meta.mode())
            };
            let rel = entry.path().strip_prefix(root).unwrap().to_path_buf();
            entries.insert(rel, what);
        }
        Tree(entries)
    }
}

/// The bytes of every file under `dir` (0 when it is not there): how much a run wrote.
pub(crate) fn bytes_under(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// Every regular file under `root` with its bytes, and, where it is gzip or zstd, its
/// decompressed bytes as well (test outputs are small).
fn files_under(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    if !root.exists() {
        return out;
    }
    for entry in walkdir::WalkDir::new(root) {
        let entry = entry.expect("walking outputs");
        if !entry.file_type().is_file() {
            continue;
        }
        let bytes = fs_err::read(entry.path()).unwrap();
        if let Some(plain) = decompressed(&bytes) {
            out.push((entry.path().to_path_buf(), plain));
        }
        out.push((entry.path().to_path_buf(), bytes));
    }
    out
}

/// The bytes decompressed, when they start with a gzip or zstd magic number.
fn decompressed(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut plain = Vec::new();
    let read = if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut plain)
    } else if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || bytes.starts_with(&[0x50, 0x2a, 0x4d, 0x18])
    {
        zstd::stream::read::Decoder::new(bytes)
            .and_then(|mut decoder| decoder.read_to_end(&mut plain))
    } else {
        return None;
    };
    // A truncated or odd stream still yields what was decoded before the error.
    let _ = read;
    Some(plain)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[test]
fn the_canary_is_found_in_a_compressed_copy_and_a_write_is_seen() {
    use std::io::Write;
    let canary = Canary::new();
    let out = tempfile::tempdir().unwrap();
    canary.assert_not_in(out.path());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(format!("padding {} padding", canary.secret).as_bytes())
        .unwrap();
    fs_err::write(out.path().join("layer"), gz.finish().unwrap()).unwrap();
    let found = std::panic::catch_unwind(|| canary.assert_not_in(out.path()));
    assert!(found.is_err(), "a gzip copy of the secret must be found");
    canary.assert_untouched();
    fs_err::write(canary.dir().join("new"), "x").unwrap();
    let seen = std::panic::catch_unwind(|| canary.assert_untouched());
    assert!(seen.is_err(), "a file added to the canary dir must be seen");
}
