//! Staging trees under `<cache>/staging/`: one per build, removed when the build ends, and
//! removed by a later build when the process that made it was killed.
//!
//! Each tree `build-XXXX/` has a lock file `build-XXXX.lock` beside it, held (an OS file
//! lock, released by the kernel however the process ends) for as long as the tree is in
//! use. A new build first sweeps: every `build-*.lock` it can lock belongs to a dead build,
//! so its tree and the lock file go. The lock file is locked under a temporary name and only
//! then linked into place, and the tree made after it, so a sweeping build never finds a
//! fresh tree unlocked. A `build-*` tree with no lock file at all was left by an imgbuild
//! from before these locks and is removed too.

use std::{
    fs::File,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::report::Reporter;

/// A build's staging tree, removed (with its lock file) when dropped; `reporter` is warned
/// when it cannot be.
pub struct Staging<'r> {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
    reporter: &'r dyn Reporter,
}

impl<'r> Staging<'r> {
    /// Removes stale trees in `parent`, then makes and locks a new one.
    pub fn create(parent: &Path, reporter: &'r dyn Reporter) -> std::io::Result<Staging<'r>> {
        fs_err::create_dir_all(parent)?;
        sweep(parent);
        loop {
            let temp = temporary_lock_file(parent)?;
            temp.as_file().lock()?;
            let stem = temp
                .path()
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(".new-"))
                .and_then(|n| n.strip_suffix(".lock"))
                .expect("named by us")
                .to_string();
            let dir = parent.join(format!("build-{stem}"));
            let lock_path = parent.join(format!("build-{stem}.lock"));
            // A hard link never replaces an existing file, so the locked inode appears under
            // its real name atomically or not at all; the temporary name then goes.
            match fs_err::hard_link(temp.path(), &lock_path) {
                // Taken by another build; or our temporary file was swept by a build that
                // locked it in the instant before we did: try a new name.
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotFound
                    ) =>
                {
                    continue;
                }
                result => result?,
            }
            let lock = temp.into_file();
            match fs_err::create_dir(&dir) {
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                    let _ = fs_err::remove_file(&lock_path);
                    continue;
                }
                result => result?,
            }
            return Ok(Staging {
                dir,
                lock_path,
                _lock: lock,
                reporter,
            });
        }
    }

    /// The tree's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging<'_> {
    /// When an install fails, rattler returns the first error while its other link tasks may
    /// still be writing into the tree for a moment, so removal is retried until the tree
    /// stays gone. The lock file goes last, while still locked.
    fn drop(&mut self) {
        for _ in 0..40 {
            let _ = fs_err::remove_dir_all(&self.dir);
            std::thread::sleep(Duration::from_millis(25));
            if !self.dir.exists() {
                let _ = fs_err::remove_file(&self.lock_path);
                return;
            }
        }
        self.reporter.on_warning(&format!(
            "could not remove the staging tree `{}`",
            self.dir.display()
        ));
    }
}

/// A lock file under the temporary name that [`sweep`] recognises as a dead build's when
/// nobody holds it.
fn temporary_lock_file(parent: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".new-")
        .suffix(".lock")
        .rand_bytes(12)
        .tempfile_in(parent)
}

/// Removes the trees of dead builds; anything it cannot remove is left for the next sweep.
#[allow(
    clippy::disallowed_methods,
    reason = "errors only mean skip; try_lock needs a std::fs::File"
)]
pub fn sweep(parent: &Path) {
    let Ok(entries) = fs_err::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(".new-") && name.ends_with(".lock") {
            // The temporary name of a lock file whose build died before renaming it.
            if let Ok(file) = File::options().write(true).open(&path)
                && file.try_lock().is_ok()
            {
                let _ = fs_err::remove_file(&path);
            }
            continue;
        }
        if !name.starts_with("build-") {
            continue;
        }
        if let Some(stem) = name.strip_suffix(".lock") {
            let Ok(file) = File::options().write(true).open(&path) else {
                continue;
            };
            if file.try_lock().is_ok() {
                let dir = parent.join(stem);
                tracing::debug!(
                    "removing the staging tree of a dead build: {}",
                    dir.display()
                );
                if fs_err::remove_dir_all(&dir).is_ok() || !dir.exists() {
                    let _ = fs_err::remove_file(&path);
                }
            }
        } else if path.is_dir() && !parent.join(format!("{name}.lock")).exists() {
            tracing::debug!("removing an unlocked staging tree: {}", path.display());
            let _ = fs_err::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_tree_is_kept_and_a_dead_one_removed() {
        let parent = tempfile::tempdir().unwrap();
        let live = Staging::create(parent.path(), &crate::report::Silent).unwrap();
        fs_err::write(live.dir().join("file"), "x").unwrap();
        // A dead build: its lock file exists but nobody holds it.
        fs_err::create_dir(parent.path().join("build-dead")).unwrap();
        fs_err::write(parent.path().join("build-dead.lock"), "").unwrap();
        // An older imgbuild's tree, with no lock file.
        fs_err::create_dir(parent.path().join("build-old")).unwrap();
        // A build killed before its lock file got its real name.
        temporary_lock_file(parent.path())
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();

        let other = Staging::create(parent.path(), &crate::report::Silent).unwrap();
        assert!(live.dir().join("file").exists(), "a live tree is kept");
        assert!(!parent.path().join("build-dead").exists());
        assert!(!parent.path().join("build-dead.lock").exists());
        assert!(!parent.path().join("build-old").exists());

        drop(live);
        drop(other);
        assert_eq!(fs_err::read_dir(parent.path()).unwrap().count(), 0);
    }
}
