//! `imgbuild cache prune`: evicting layer-cache entries. An entry is a key file
//! (`layers/keys/<key>.json`) and the blob it names (`layers/blobs/<hex>`); it was last
//! used when its key file was last written or hit (its mtime). [`plan`] decides from a
//! listing what goes, as plain data: entries the cache would refuse anyway, entries unused
//! for longer than `--older-than`, then the least recently used until the layer cache fits
//! `--max-size`; blobs no remaining key file names; lock files of keys that are gone.
//! A blob an image of a `--keep-layout` layout uses stays, and so does every entry naming
//! it. [`execute`] carries a plan out: key files first, so a key file never names a removed
//! blob, and each entry under its key's lock, so no build is using it meanwhile.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde::Serialize;

use super::CacheAdminError;
use crate::layers::cache::listing::{self, KeyFileEntry, LayerCacheListing};

/// An orphan blob (no key file names it) younger than this is left: a build stores the blob
/// just before it writes the key file that names it.
const ORPHAN_GRACE: Duration = Duration::from_secs(60 * 60);

/// What may stay.
#[derive(Debug, Clone)]
pub(crate) struct PruneLimits {
    /// The most bytes the layer cache may hold afterwards.
    pub max_size: Option<u64>,
    /// Entries not used for longer than this go.
    pub older_than: Option<Duration>,
    /// The time the ages are measured from.
    pub now: SystemTime,
}

/// Why a file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RemovalReason {
    /// An entry the cache would refuse on use (a link, not a regular file, not a key file,
    /// its blob missing or of another size).
    Refused,
    /// Not used for longer than `--older-than`.
    OlderThan,
    /// Among the least recently used, over `--max-size`.
    MaxSize,
    /// A blob no key file names.
    Orphan,
    /// The lock file of a key that has no key file (any more).
    StaleLock,
}

/// What a removed file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RemovedFile {
    KeyFile,
    Blob,
    LockFile,
}

/// One file to remove.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Removal {
    pub path: PathBuf,
    pub file: RemovedFile,
    pub reason: RemovalReason,
    /// The key of the entry it belongs to (none for an orphan blob).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its apparent size.
    pub bytes: u64,
    /// Whether it is a symbolic link, removed as one.
    pub link: bool,
}

/// What a prune removes, decided before anything is.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PrunePlan {
    /// Key files first, then blobs, then lock files.
    pub removals: Vec<Removal>,
    /// The layer cache's bytes before.
    pub bytes_before: u64,
    /// The entries that stay because a `--keep-layout` image uses their blob.
    pub kept_for_layouts: usize,
}

impl PrunePlan {
    /// How many entries (key files) go.
    pub(crate) fn entries(&self) -> usize {
        self.count(RemovedFile::KeyFile)
    }

    pub(crate) fn count(&self, file: RemovedFile) -> usize {
        self.removals.iter().filter(|r| r.file == file).count()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.removals.iter().map(|r| r.bytes).sum()
    }
}

/// What [`execute`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PruneOutcome {
    pub removed: Vec<Removal>,
    /// Keys a build held while the prune ran: left, with their blobs.
    pub busy: Vec<String>,
}

impl PruneOutcome {
    pub(crate) fn count(&self, file: RemovedFile) -> usize {
        self.removed.iter().filter(|r| r.file == file).count()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.removed.iter().map(|r| r.bytes).sum()
    }
}

/// The blobs the images of each layout in `layouts` use; a layout that cannot be read is
/// an error naming it.
pub(crate) fn kept_blobs(layouts: &[PathBuf]) -> Result<HashSet<String>, CacheAdminError> {
    let mut kept = HashSet::new();
    for dir in layouts {
        let used = crate::oci::layout::Layout::new(dir)
            .reachable_blobs()
            .map_err(|source| CacheAdminError::Layout {
                layout: dir.clone(),
                source,
            })?;
        kept.extend(used);
    }
    Ok(kept)
}

/// The layer cache under `cache_dir`, listed; an empty listing when there is none.
pub(crate) fn list(cache_dir: &Path) -> Result<LayerCacheListing, CacheAdminError> {
    Ok(listing::list(cache_dir)?.unwrap_or_default())
}

/// The blob `entry` names, if the cache would use it: its digest when the blob is a
/// regular file of the size the key file says.
fn usable_blob<'a>(
    entry: &'a KeyFileEntry,
    blobs: &BTreeMap<&str, &listing::CacheBlobFile>,
) -> Option<&'a str> {
    let (digest, size) = entry.blob.as_ref().ok()?;
    let blob = blobs.get(digest.as_str())?;
    (blob.regular && blob.bytes == *size).then_some(digest.as_str())
}

/// What goes from `listing` under `limits`, keeping every blob in `kept` and the entries
/// that name one.
pub(crate) fn plan(
    listing: &LayerCacheListing,
    limits: &PruneLimits,
    kept: &HashSet<String>,
) -> PrunePlan {
    let blobs: BTreeMap<&str, &listing::CacheBlobFile> = listing
        .blobs
        .iter()
        .map(|b| (b.digest.as_str(), b))
        .collect();
    let locks: BTreeMap<&str, &listing::CacheLockFile> =
        listing.locks.iter().map(|l| (l.key.as_str(), l)).collect();
    let ever_named: HashSet<&str> = listing.keys.iter().filter_map(named).collect();
    let in_grace = |blob: &listing::CacheBlobFile| {
        !ever_named.contains(blob.digest.as_str()) && orphan_in_grace(blob, limits.now)
    };
    let protected = |entry: &KeyFileEntry| named(entry).is_some_and(|d| kept.contains(d));

    let mut gone: BTreeMap<&str, RemovalReason> = BTreeMap::new();
    for entry in &listing.keys {
        let age = limits.now.duration_since(entry.used).unwrap_or_default();
        if usable_blob(entry, &blobs).is_none() {
            gone.insert(&entry.key, RemovalReason::Refused);
        } else if !protected(entry) && limits.older_than.is_some_and(|max| age > max) {
            gone.insert(&entry.key, RemovalReason::OlderThan);
        }
    }

    // The size of what stays: key and lock files of the staying entries, the blobs they (or
    // the kept layouts) name, the files that are not the cache's own.
    let staying = |gone: &BTreeMap<&str, RemovalReason>| -> (u64, BTreeMap<String, usize>) {
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        let mut bytes = listing.other_bytes;
        for entry in listing
            .keys
            .iter()
            .filter(|e| !gone.contains_key(e.key.as_str()))
        {
            bytes += entry.bytes + locks.get(entry.key.as_str()).map_or(0, |l| l.bytes);
            if let Some(digest) = named(entry) {
                *names.entry(digest.to_string()).or_default() += 1;
            }
        }
        for blob in &listing.blobs {
            if names.contains_key(&blob.digest) || kept.contains(&blob.digest) || in_grace(blob) {
                bytes += blob.bytes;
            }
        }
        (bytes, names)
    };
    if let Some(max) = limits.max_size {
        let (mut bytes, mut names) = staying(&gone);
        let mut candidates: Vec<&KeyFileEntry> = listing
            .keys
            .iter()
            .filter(|e| !gone.contains_key(e.key.as_str()) && !protected(e))
            .collect();
        candidates.sort_by(|a, b| a.used.cmp(&b.used).then(a.key.cmp(&b.key)));
        for entry in candidates {
            if bytes <= max {
                break;
            }
            gone.insert(&entry.key, RemovalReason::MaxSize);
            bytes -= entry.bytes + locks.get(entry.key.as_str()).map_or(0, |l| l.bytes);
            if let Some(digest) = named(entry)
                && let Some(count) = names.get_mut(digest)
            {
                *count -= 1;
                if *count == 0 {
                    names.remove(digest);
                    if !kept.contains(digest) {
                        bytes -= blobs.get(digest).map_or(0, |b| b.bytes);
                    }
                }
            }
        }
    }

    let (_, names) = staying(&gone);
    let mut removals = Vec::new();
    for entry in listing.keys.iter() {
        if let Some(reason) = gone.get(entry.key.as_str()) {
            removals.push(Removal {
                path: entry.path.clone(),
                file: RemovedFile::KeyFile,
                reason: *reason,
                key: Some(entry.key.clone()),
                bytes: entry.bytes,
                link: entry.is_link,
            });
        }
    }
    // Each blob goes with the first removed entry naming it, else as an orphan.
    let removed_by: BTreeMap<&str, (&str, RemovalReason)> = listing
        .keys
        .iter()
        .rev()
        .filter_map(|e| Some((named(e)?, (e.key.as_str(), *gone.get(e.key.as_str())?))))
        .collect();
    for blob in &listing.blobs {
        if names.contains_key(&blob.digest) || kept.contains(&blob.digest) {
            continue;
        }
        let (key, reason) = match removed_by.get(blob.digest.as_str()) {
            Some((key, reason)) => (Some(key.to_string()), *reason),
            None if in_grace(blob) => continue,
            None => (None, RemovalReason::Orphan),
        };
        removals.push(Removal {
            path: blob.path.clone(),
            file: RemovedFile::Blob,
            reason,
            key,
            bytes: blob.bytes,
            link: blob.is_link,
        });
    }
    let keys: BTreeSet<&str> = listing.keys.iter().map(|e| e.key.as_str()).collect();
    for lock in &listing.locks {
        let reason = match gone.get(lock.key.as_str()) {
            Some(reason) => *reason,
            None if !keys.contains(lock.key.as_str()) => RemovalReason::StaleLock,
            None => continue,
        };
        removals.push(Removal {
            path: lock.path.clone(),
            file: RemovedFile::LockFile,
            reason,
            key: Some(lock.key.clone()),
            bytes: lock.bytes,
            link: lock.is_link,
        });
    }
    let bytes_before = listing.other_bytes
        + listing.keys.iter().map(|e| e.bytes).sum::<u64>()
        + listing.blobs.iter().map(|b| b.bytes).sum::<u64>()
        + listing.locks.iter().map(|l| l.bytes).sum::<u64>();
    PrunePlan {
        removals,
        bytes_before,
        kept_for_layouts: listing
            .keys
            .iter()
            .filter(|e| protected(e) && !gone.contains_key(e.key.as_str()))
            .count(),
    }
}

/// The digest of the blob `entry` names, if its key file could be read.
fn named(entry: &KeyFileEntry) -> Option<&str> {
    entry.blob.as_ref().ok().map(|(digest, _)| digest.as_str())
}

/// Whether `blob`, when no key file names it, is a regular file young enough that a build
/// may be about to write the key file naming it.
fn orphan_in_grace(blob: &listing::CacheBlobFile, now: SystemTime) -> bool {
    blob.regular && now.duration_since(blob.modified).unwrap_or_default() < ORPHAN_GRACE
}

/// Carries `plan` out. Each entry's key file goes while its lock is held (an entry a build
/// holds now is left, with its blob and lock); then the blobs, then the lock files. Each
/// file is unlinked, a link as a link; a directory is never removed.
pub(crate) fn execute(plan: &PrunePlan) -> Result<PruneOutcome, CacheAdminError> {
    let mut outcome = PruneOutcome::default();
    let lock_of = |key: &str| {
        plan.removals
            .iter()
            .find(|r| r.file == RemovedFile::LockFile && r.key.as_deref() == Some(key))
    };
    let mut busy: BTreeSet<String> = BTreeSet::new();
    // Held until every removal is done: a build waiting on one finds its entry gone.
    let mut held = Vec::new();
    for removal in plan
        .removals
        .iter()
        .filter(|r| r.file == RemovedFile::KeyFile)
    {
        let key = removal.key.clone().unwrap_or_default();
        if let Some(lock) = lock_of(&key).filter(|l| !l.link) {
            match listing::hold_lock(&lock.path) {
                Ok(Some(file)) => held.push(file),
                Ok(None) => {
                    busy.insert(key);
                    continue;
                }
                // Gone since it was listed, or not a regular file: nobody holds it.
                Err(_) => {}
            }
        }
        if remove(&removal.path)? {
            outcome.removed.push(removal.clone());
        }
    }
    // A blob goes only when no entry naming it was left busy; every entry naming it was
    // planned to go (or it would not be in the plan).
    let busy_blobs: HashSet<&Path> = plan
        .removals
        .iter()
        .filter(|r| r.file == RemovedFile::Blob)
        .filter(|r| r.key.as_ref().is_some_and(|k| busy.contains(k)))
        .map(|r| r.path.as_path())
        .collect();
    for removal in plan
        .removals
        .iter()
        .filter(|r| r.file != RemovedFile::KeyFile)
    {
        let left = match removal.file {
            RemovedFile::Blob => busy_blobs.contains(removal.path.as_path()),
            _ => removal.key.as_ref().is_some_and(|k| busy.contains(k)),
        };
        if !left && remove(&removal.path)? {
            outcome.removed.push(removal.clone());
        }
    }
    drop(held);
    outcome.busy = busy.into_iter().collect();
    Ok(outcome)
}

/// Unlinks `path` (a link as a link); `false` when it is already gone. A directory in its
/// place is an error.
fn remove(path: &Path) -> Result<bool, CacheAdminError> {
    let err = |source| CacheAdminError::Remove {
        path: path.to_path_buf(),
        source,
    };
    match fs_err::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(err(e)),
        Ok(meta) if meta.is_dir() => {
            return Err(err(std::io::Error::other("is a directory now; left")));
        }
        Ok(_) => {}
    }
    match fs_err::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use listing::{CacheBlobFile, CacheLockFile};

    const DAY: Duration = Duration::from_secs(86_400);

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn key(name: &str, blob: u8, size: u64, days_ago: u64, now: SystemTime) -> KeyFileEntry {
        KeyFileEntry {
            key: name.to_string(),
            path: PathBuf::from(format!("keys/{name}.json")),
            bytes: 100,
            used: now - DAY * days_ago as u32,
            is_link: false,
            blob: Ok((digest(blob), size)),
        }
    }

    fn blob(n: u8, bytes: u64, now: SystemTime) -> CacheBlobFile {
        CacheBlobFile {
            digest: digest(n),
            path: PathBuf::from(format!("blobs/{n}")),
            bytes,
            modified: now - DAY * 30,
            regular: true,
            is_link: false,
            id: (1, n.into()),
        }
    }

    fn removed(plan: &PrunePlan, file: RemovedFile) -> Vec<(String, RemovalReason)> {
        plan.removals
            .iter()
            .filter(|r| r.file == file)
            .map(|r| (r.path.display().to_string(), r.reason))
            .collect()
    }

    #[test]
    fn least_recently_used_go_first_and_a_shared_blob_stays_while_named() {
        let now = SystemTime::now();
        let listing = LayerCacheListing {
            keys: vec![
                key("a", 1, 1000, 5, now),
                key("b", 2, 1000, 4, now),
                key("c", 2, 1000, 1, now),
                key("d", 3, 1000, 2, now),
            ],
            blobs: vec![
                blob(1, 1000, now),
                blob(2, 1000, now),
                blob(3, 1000, now),
                blob(9, 50, now),
            ],
            locks: vec![CacheLockFile {
                key: "a".into(),
                path: "keys/a.lock".into(),
                bytes: 0,
                is_link: false,
            }],
            other_bytes: 0,
        };
        let limits = PruneLimits {
            max_size: Some(2250),
            older_than: None,
            now,
        };
        let plan = plan(&listing, &limits, &HashSet::new());
        // a, then b (its blob stays: c names it); d and c fit: 2 blobs and 2 key files.
        assert_eq!(
            removed(&plan, RemovedFile::KeyFile),
            [
                ("keys/a.json".to_string(), RemovalReason::MaxSize),
                ("keys/b.json".to_string(), RemovalReason::MaxSize)
            ]
        );
        assert_eq!(
            removed(&plan, RemovedFile::Blob),
            [
                ("blobs/1".to_string(), RemovalReason::MaxSize),
                ("blobs/9".to_string(), RemovalReason::Orphan)
            ]
        );
        assert_eq!(
            removed(&plan, RemovedFile::LockFile),
            [("keys/a.lock".to_string(), RemovalReason::MaxSize)]
        );
        assert_eq!(plan.bytes_before - plan.bytes(), 2200);

        // Kept by a layout: b and c stay whatever their age, and so does blob 2.
        let limits = PruneLimits {
            max_size: None,
            older_than: Some(DAY / 2),
            now,
        };
        let plan = plan_with(&listing, &limits, &[digest(2)]);
        assert_eq!(plan.entries(), 2, "{:?}", plan.removals);
        assert_eq!(plan.kept_for_layouts, 2);
        assert!(
            !removed(&plan, RemovedFile::Blob)
                .iter()
                .any(|(p, _)| p == "blobs/2")
        );
    }

    fn plan_with(listing: &LayerCacheListing, limits: &PruneLimits, kept: &[String]) -> PrunePlan {
        plan(listing, limits, &kept.iter().cloned().collect())
    }

    #[test]
    fn refused_entries_go_and_young_orphans_stay() {
        let now = SystemTime::now();
        let mut young = blob(4, 10, now);
        young.modified = now;
        let mut linked = key("l", 5, 10, 0, now);
        linked.is_link = true;
        linked.blob = Err("the key file is a symbolic link".into());
        let listing = LayerCacheListing {
            keys: vec![key("m", 6, 10, 0, now), linked],
            blobs: vec![young],
            locks: Vec::new(),
            other_bytes: 7,
        };
        let limits = PruneLimits {
            max_size: Some(u64::MAX),
            older_than: None,
            now,
        };
        let plan = plan(&listing, &limits, &HashSet::new());
        assert_eq!(
            removed(&plan, RemovedFile::KeyFile),
            [
                ("keys/m.json".to_string(), RemovalReason::Refused),
                ("keys/l.json".to_string(), RemovalReason::Refused)
            ]
        );
        assert!(removed(&plan, RemovedFile::Blob).is_empty());
        assert!(plan.removals.iter().any(|r| r.link));
    }
}
