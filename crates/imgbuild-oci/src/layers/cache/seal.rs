//! The per-machine key that seals layer cache entries this machine has verified.
//!
//! A cache directory is shared by branches, restored from CI caches and copied between
//! machines, so what it says about itself is evidence, not authority. An entry is verified in
//! full the first time this machine uses it ([`super::verify`]); then its key file gets a
//! seal: HMAC-SHA256, under a key that never lives in the cache directory, of everything the
//! entry claims. A later hit checks the seal and the blob's digest instead of decompressing
//! it. A copied or restored cache carries no seal this machine made, so it is verified once.
//!
//! The key is 32 random bytes in `$IMGBUILD_CACHE_KEY_FILE`, else
//! `$XDG_STATE_HOME/imgbuild/cache-key`, else `~/.local/state/imgbuild/cache-key`, created
//! 0600 on first use. When it cannot be read or made (no HOME, a read-only home, a file that
//! is not ours), nothing is sealed and every entry is verified on every use.

use std::{
    io::{Read, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The environment variable naming the key file (tests, CI runners with a state volume).
pub(crate) const KEY_FILE_ENV: &str = "IMGBUILD_CACHE_KEY_FILE";
/// Bytes of key.
const KEY_LEN: usize = 32;
/// Bump when what a seal covers changes, so older seals no longer count.
const SEAL_FORMAT: &str = "imgbuild-layer-seal/1";

/// The machine's sealing key.
pub struct SealKey([u8; KEY_LEN]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// Where the key lives, or `None` when neither the override nor a home directory says.
pub(crate) fn key_path() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = non_empty(KEY_FILE_ENV) {
        return Some(PathBuf::from(path));
    }
    let state = non_empty("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".local/state")))?;
    Some(state.join("imgbuild/cache-key"))
}

impl SealKey {
    /// The key at `path`, made when missing. Refused (with the reason) when it lies in the
    /// cache directory, is not a regular file of ours readable by us alone, or is not 32
    /// bytes: a key others can read or plant seals nothing.
    pub(crate) fn load_or_create(path: &Path, cache_dir: &Path) -> Result<Self, String> {
        if is_within(path, cache_dir) {
            return Err("it lies inside the cache directory".to_string());
        }
        match read_key(path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                create_key(path).map_err(|e| format!("it cannot be created: {e}"))?;
                read_key(path).map_err(|e| e.to_string())
            }
            other => other.map_err(|e| e.to_string()),
        }
    }

    /// The seal of `fields` (the entry's claims, in a fixed order).
    pub fn seal(&self, fields: &serde_json::Value) -> String {
        hex::encode(self.mac(fields).finalize().into_bytes())
    }

    /// Whether `seal` is this key's seal of `fields` (compared in constant time).
    pub(crate) fn is_seal_of(&self, seal: &str, fields: &serde_json::Value) -> bool {
        let Ok(bytes) = hex::decode(seal) else {
            return false;
        };
        self.mac(fields).verify_slice(&bytes).is_ok()
    }

    fn mac(&self, fields: &serde_json::Value) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        mac.update(SEAL_FORMAT.as_bytes());
        mac.update(b"\n");
        mac.update(fields.to_string().as_bytes());
        mac
    }
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// The key file's 32 bytes: opened without following a link, a regular file of this user,
/// with no permission for group or others.
fn read_key(path: &Path) -> std::io::Result<SealKey> {
    let file = super::open_regular(path).map_err(|err| match err.kind() {
        // A missing key is made (see `load_or_create`).
        std::io::ErrorKind::NotFound => err,
        _ => invalid(format!("`{}` {err}", path.display())),
    })?;
    let meta = file.metadata()?;
    if meta.uid() != unsafe { libc::geteuid() } || meta.mode() & 0o077 != 0 {
        return Err(invalid(format!(
            "`{}` must belong to this user with mode 0600",
            path.display()
        )));
    }
    let mut key = [0u8; KEY_LEN];
    let mut rest = Vec::new();
    let mut reader = file.take(KEY_LEN as u64 + 1);
    reader.read_exact(&mut key)?;
    reader.read_to_end(&mut rest)?;
    if !rest.is_empty() || meta.len() != KEY_LEN as u64 {
        return Err(invalid(format!(
            "`{}` is not {KEY_LEN} bytes",
            path.display()
        )));
    }
    Ok(SealKey(key))
}

/// A new random key at `path`: written 0600 under a temporary name, then linked into place
/// so a concurrent build's key is never replaced (the loser reads the winner's).
fn create_key(path: &Path) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut key = [0u8; KEY_LEN];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut key);
    let mut temp = tempfile::Builder::new()
        .prefix(".cache-key-")
        .tempfile_in(dir)?;
    temp.write_all(&key)?;
    temp.as_file().sync_all()?;
    match fs_err::hard_link(temp.path(), path) {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => Err(err),
        _ => Ok(()),
    }
}

/// Whether `path` would lie under `dir` (both resolved as far as they exist).
fn is_within(path: &Path, dir: &Path) -> bool {
    let resolve = |p: &Path| {
        p.ancestors()
            .find_map(|a| {
                let rest = p.strip_prefix(a).ok()?;
                Some(fs_err::canonicalize(a).ok()?.join(rest))
            })
            .unwrap_or_else(|| p.to_path_buf())
    };
    resolve(path).starts_with(resolve(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_seals_only_what_it_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let path = dir.path().join("state/cache-key");
        let key = SealKey::load_or_create(&path, &cache).unwrap();
        assert_eq!(fs_err::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let again = SealKey::load_or_create(&path, &cache).unwrap();
        let fields = serde_json::json!(["k", "sha256:ab", 1]);
        let seal = key.seal(&fields);
        assert!(again.is_seal_of(&seal, &fields));
        assert!(!again.is_seal_of(&seal, &serde_json::json!(["k", "sha256:ab", 2])));
        let other = SealKey::load_or_create(&dir.path().join("other"), &cache).unwrap();
        assert!(!other.is_seal_of(&seal, &fields), "another machine's key");
    }

    #[test]
    fn a_key_in_the_cache_or_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("cache/layers/cache-key");
        assert!(SealKey::load_or_create(&inside, &dir.path().join("cache")).is_err());
        let path = dir.path().join("key");
        fs_err::write(&path, [7u8; KEY_LEN]).unwrap();
        crate::fs::set_mode(&path, 0o644).unwrap();
        assert!(SealKey::load_or_create(&path, &dir.path().join("cache")).is_err());
        crate::fs::set_mode(&path, 0o600).unwrap();
        assert!(SealKey::load_or_create(&path, &dir.path().join("cache")).is_ok());
        fs_err::write(&path, [7u8; KEY_LEN + 1]).unwrap();
        assert!(SealKey::load_or_create(&path, &dir.path().join("cache")).is_err());
    }
}
