//! The build context: the one directory a recipe's own files (`[[files]]` sources and
//! their ignore files) are read from, and nothing outside it, as Docker's `COPY` reads its
//! context.
//!
//! Confined by construction, not by checking paths: the context is opened once as a
//! directory handle and every path is resolved beneath it by `cap-std` (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, or its component-by-component fallback on
//! kernels without it). `..` above the top, an absolute path, a link in any component
//! that leads out, and `/proc` magic links are refused by the kernel or by `cap-std`, so a
//! tree changed while it is read cannot lead a read outside either. What is read is the
//! opened descriptor, opened without following a last link and without blocking, then
//! checked (fstat) as a regular file: a fifo is refused, never waited on.

use std::{
    ffi::OsString,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
};

use cap_std::fs::{Dir, FileType, FileTypeExt, OpenOptions, OpenOptionsExt};

/// Why the build context refused a path, or could not read it.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("leads outside the build context `{}` (through `..`, an absolute path or a link)", .0.display())]
    Outside(PathBuf),
    #[error("is a symbolic link; links are not followed here")]
    Link,
    #[error("is {0}, not a regular file")]
    NotAFile(&'static str),
    #[error("has {size} bytes; at most {max} are read")]
    TooLarge { size: u64, max: u64 },
    #[error("has {size} bytes, not the {planned} it had when it was planned")]
    SizeChanged { size: u64, planned: u64 },
    #[error(transparent)]
    Io(std::io::Error),
}

impl ContextError {
    /// Whether the path does not exist (every component up to it resolved beneath).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ContextError::Io(err) if err.kind() == std::io::ErrorKind::NotFound)
    }
}

/// A directory opened once, beneath which every read resolves.
#[derive(Debug)]
pub struct BuildContext {
    dir: Dir,
    /// The directory as named when it was opened, for messages.
    root: PathBuf,
}

impl BuildContext {
    /// The context `root`, whatever it is: the recipe's own directory, which the caller
    /// named by naming the recipe.
    pub fn open(root: &Path) -> Result<Arc<Self>, ContextError> {
        let dir =
            Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(ContextError::Io)?;
        Ok(Arc::new(BuildContext {
            dir,
            root: root.to_path_buf(),
        }))
    }

    /// The context `root`, which must lie beneath `limit` (itself or below): opened through
    /// a handle on `limit`, so a link on the way cannot lead it out either.
    #[allow(
        clippy::disallowed_methods,
        reason = "ContextError names the build context itself"
    )]
    pub fn open_beneath(limit: &Path, root: &Path) -> Result<Arc<Self>, ContextError> {
        let outside = || ContextError::Outside(limit.to_path_buf());
        let real_limit = std::fs::canonicalize(limit).map_err(ContextError::Io)?;
        let real_root = std::fs::canonicalize(root).map_err(ContextError::Io)?;
        let rel = real_root.strip_prefix(&real_limit).map_err(|_| outside())?;
        let top = Dir::open_ambient_dir(&real_limit, cap_std::ambient_authority())
            .map_err(ContextError::Io)?;
        let dir = if rel.as_os_str().is_empty() {
            top
        } else {
            top.open_dir(rel).map_err(|e| classify(e, limit))?
        };
        Ok(Arc::new(BuildContext {
            dir,
            root: root.to_path_buf(),
        }))
    }

    /// The directory as named when it was opened.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` on the host, for messages only: never opened by this name.
    pub fn host_path(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// The kind of `rel`, not following a last link.
    pub fn file_type(&self, rel: &Path) -> Result<FileType, ContextError> {
        self.dir
            .symlink_metadata(here(rel))
            .map(|meta| meta.file_type())
            .map_err(|e| self.classify(e))
    }

    /// The entries of the directory `rel`, each name with its kind (links not followed),
    /// in no particular order.
    pub fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, FileType)>, ContextError> {
        let mut entries = Vec::new();
        for entry in self.dir.read_dir(here(rel)).map_err(|e| self.classify(e))? {
            let entry = entry.map_err(|e| self.classify(e))?;
            let kind = entry.file_type().map_err(|e| self.classify(e))?;
            entries.push((entry.file_name(), kind));
        }
        Ok(entries)
    }

    /// The target of the link `rel`, as written (it is not followed).
    pub fn read_link(&self, rel: &Path) -> Result<PathBuf, ContextError> {
        self.dir
            .read_link_contents(rel)
            .map_err(|e| self.classify(e))
    }

    /// The regular file `rel`, opened without following a last link and without blocking,
    /// with what fstat says of the descriptor.
    pub fn open_file(
        &self,
        rel: &Path,
    ) -> Result<(std::fs::File, std::fs::Metadata), ContextError> {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = self
            .dir
            .open_with(rel, &options)
            .map_err(|e| self.classify(e))?
            .into_std();
        let meta = file.metadata().map_err(ContextError::Io)?;
        if !meta.is_file() {
            return Err(ContextError::NotAFile(super::file_kind(&meta.file_type())));
        }
        Ok((file, meta))
    }

    /// The regular file `rel` whole, of at most `max` bytes.
    pub fn read_bounded(&self, rel: &Path, max: u64) -> Result<Vec<u8>, ContextError> {
        let (file, meta) = self.open_file(rel)?;
        let too_large = |size| ContextError::TooLarge { size, max };
        if meta.len() > max {
            return Err(too_large(meta.len()));
        }
        // Bounded as well: the file may grow between fstat and read.
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(ContextError::Io)?;
        if bytes.len() as u64 > max {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }

    fn classify(&self, err: std::io::Error) -> ContextError {
        classify(err, &self.root)
    }
}

/// A file of a build context, as a layer plans it: opened again, beneath the same handle,
/// when the layer is written.
#[derive(Debug, Clone)]
pub struct ContextFile {
    pub context: Arc<BuildContext>,
    /// Relative to the context's top.
    pub path: PathBuf,
}

impl ContextFile {
    /// The file on the host, for messages.
    pub fn host_path(&self) -> PathBuf {
        self.context.host_path(&self.path)
    }

    /// The file, which must still be a regular file of `size` bytes.
    pub fn open_sized(&self, size: u64) -> Result<std::fs::File, ContextError> {
        let (file, meta) = self.context.open_file(&self.path)?;
        if meta.len() != size {
            return Err(ContextError::SizeChanged {
                size: meta.len(),
                planned: size,
            });
        }
        Ok(file)
    }
}

/// Two plans of one file are equal whichever handle they hold.
impl PartialEq for ContextFile {
    fn eq(&self, other: &Self) -> bool {
        self.context.root == other.context.root && self.path == other.path
    }
}

impl Eq for ContextFile {}

/// What a file that is not a regular file, a directory or a link is, for a message.
pub fn special_kind(kind: &FileType) -> &'static str {
    if kind.is_fifo() {
        "a named pipe"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "a special file"
    }
}

/// `rel`, with the top itself as `.` (an empty path names nothing).
fn here(rel: &Path) -> &Path {
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

/// An escape is said as one, whichever way it was caught: `cap-std`'s own error, the
/// kernel's `EXDEV` from `RESOLVE_BENEATH`; a last link under `O_NOFOLLOW` is `ELOOP`.
fn classify(err: std::io::Error, root: &Path) -> ContextError {
    let escape = err.kind() == std::io::ErrorKind::PermissionDenied
        && err.get_ref().is_some()
        && err.to_string().contains("outside");
    if escape || err.raw_os_error() == Some(libc::EXDEV) {
        ContextError::Outside(root.to_path_buf())
    } else if err.raw_os_error() == Some(libc::ELOOP) {
        ContextError::Link
    } else {
        ContextError::Io(err)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn reads_stay_beneath_the_context() {
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("secret"), "s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("ctx");
        fs_err::create_dir_all(top.join("sub")).unwrap();
        fs_err::write(top.join("sub/ok"), "ok").unwrap();
        symlink(outside.path(), top.join("out")).unwrap();
        symlink("/proc/self/root", top.join("proc")).unwrap();
        symlink("sub", top.join("inside")).unwrap();
        let context = BuildContext::open(&top).unwrap();
        assert_eq!(context.read_bounded(Path::new("sub/ok"), 9).unwrap(), b"ok");
        // A link in the middle that stays beneath is followed, as `COPY` follows it.
        assert_eq!(
            context.read_bounded(Path::new("inside/ok"), 9).unwrap(),
            b"ok"
        );
        for rel in [
            "../ctx/sub/ok",
            "/etc/hostname",
            "out/secret",
            "proc/etc/hostname",
            "sub/../../ctx/sub/ok",
        ] {
            let err = context.read_bounded(Path::new(rel), 9).unwrap_err();
            assert!(matches!(err, ContextError::Outside(_)), "{rel}: {err:?}");
            assert!(context.read_dir(Path::new(rel)).is_err(), "{rel}");
        }
        // A last link is never followed, even one that stays beneath.
        assert!(matches!(
            context.open_file(Path::new("inside")),
            Err(ContextError::Link)
        ));
        assert!(context.file_type(Path::new("out")).unwrap().is_symlink());
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        mkfifo(&dir.path().join("fifo"));
        let context = BuildContext::open(dir.path()).unwrap();
        assert!(matches!(
            context.open_file(Path::new("fifo")),
            Err(ContextError::NotAFile("a fifo"))
        ));
        assert!(matches!(
            context.open_file(Path::new(".")),
            Err(ContextError::NotAFile("a directory"))
        ));
        let dev = BuildContext::open(Path::new("/dev")).unwrap();
        assert!(matches!(
            dev.read_bounded(Path::new("zero"), 9),
            Err(ContextError::NotAFile("a character device"))
        ));
    }

    #[test]
    fn a_widened_context_stays_beneath_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let limit = dir.path().join("repo");
        fs_err::create_dir_all(limit.join("recipes")).unwrap();
        symlink(dir.path(), limit.join("up")).unwrap();
        assert!(BuildContext::open_beneath(&limit, &limit).is_ok());
        assert!(BuildContext::open_beneath(&limit, &limit.join("recipes")).is_ok());
        for root in [dir.path().to_path_buf(), limit.join("up")] {
            let err = BuildContext::open_beneath(&limit, &root).unwrap_err();
            assert!(matches!(err, ContextError::Outside(_)), "{err:?}");
        }
    }
}
