//! File-system helpers with the guarantees a build needs: atomic replacement, so a reader or
//! a later run never sees half a file, and bounded reads of the files a stranger hands us.

use std::{io::Write, path::Path};

pub mod context;

/// Writes `bytes` to `path` through a temporary file in the same directory, synced and then
/// renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut file = tempfile::Builder::new()
        .prefix(".imgbuild-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    set_mode(file.path(), 0o644)?;
    file.persist(path).map_err(|err| err.error)?;
    Ok(())
}

/// Sets permission bits; tempfile creates files 0600, which a non-root reader cannot read.
pub fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Makes `to` hold the content-addressed file `from`: a hard link when both sit on one file
/// system (no bytes copied), else a copy under a temporary name renamed into place. A `to`
/// that already exists is left alone: content-addressed names hold the same bytes.
pub fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    if to.exists() {
        return Ok(());
    }
    match fs_err::hard_link(from, to) {
        Ok(()) => return Ok(()),
        // Another build linked it between the check and now.
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(err) => tracing::debug!(
            "cannot link `{}` to `{}` ({err}); copying",
            from.display(),
            to.display()
        ),
    }
    let dir = match to.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let temp = tempfile::Builder::new()
        .prefix(".imgbuild-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    std::io::copy(&mut fs_err::File::open(from)?, &mut temp.as_file())?;
    temp.as_file().sync_all()?;
    set_mode(temp.path(), 0o644)?;
    temp.persist(to).map_err(|err| err.error)?;
    Ok(())
}

/// Why [`read_input`] (or [`read_input_beneath`]) refused a file.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("is {0}, not a regular file")]
    NotAFile(&'static str),
    #[error("has {size} bytes; at most {max} are read")]
    TooLarge { size: u64, max: u64 },
    #[error("is reached through the symbolic link `{}`, which is not followed", .0.display())]
    Link(std::path::PathBuf),
    #[error("is not a plain relative path beneath its directory")]
    NotBeneath,
}

impl From<InputError> for std::io::Error {
    /// Keeps the kind of an I/O error (a missing file stays `NotFound`).
    fn from(err: InputError) -> Self {
        match err {
            InputError::Io(err) => err,
            other => std::io::Error::other(other),
        }
    }
}

impl InputError {
    /// Whether the file is simply not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, InputError::Io(err) if err.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Reads the regular file `path` of at most `max` bytes. Anything else is refused before it
/// is read: `/dev/zero` would be read until memory runs out, and a fifo with no writer
/// would wait for one (it is opened non-blocking, then refused by fstat).
pub fn read_input(path: &Path, max: u64) -> Result<Vec<u8>, InputError> {
    // Bounded as well: the file may grow between fstat and read.
    read_stream(open_input(path, max)?, max)
}

/// The regular file `path` of at most `max` bytes, opened for reading: what
/// [`read_input`] reads, for a caller that streams it (still bounding what it reads, since
/// the file may grow).
#[allow(
    clippy::disallowed_methods,
    reason = "the confined opener: custom flags need std OpenOptions; callers name the path"
)]
pub fn open_input(path: &Path, max: u64) -> Result<std::fs::File, InputError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let file = regular(file)?;
    let size = file.metadata()?.len();
    if size > max {
        return Err(InputError::TooLarge { size, max });
    }
    Ok(file)
}

/// [`read_input`] as UTF-8 text.
pub fn read_input_text(path: &Path, max: u64) -> Result<String, InputError> {
    utf8(read_input(path, max)?)
}

/// Reads at most `max` bytes of `reader` (a pipe, stdin): more is refused, so an endless
/// stream (`< /dev/zero`) ends the read instead of filling memory.
pub fn read_stream(reader: impl std::io::Read, max: u64) -> Result<Vec<u8>, InputError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    reader.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(InputError::TooLarge {
            size: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

/// Opens the regular file `relative` beneath the directory `root` without leaving it: the
/// path is plain names only (no `..`, not absolute), each directory on the way is opened
/// from the one before with `O_NOFOLLOW` (a symbolic link anywhere beneath `root` is
/// refused, never followed), and the file itself is opened non-blocking and must be a
/// regular file (a fifo, a device or a directory is refused before any read). `root` is
/// the directory the user named and is opened as named.
#[allow(
    clippy::disallowed_methods,
    reason = "the confined opener: custom flags need std OpenOptions; callers name the path"
)]
pub fn open_input_beneath(root: &Path, relative: &Path) -> Result<std::fs::File, InputError> {
    let mut names = Vec::new();
    for component in relative.components() {
        match component {
            std::path::Component::Normal(name) => names.push(name),
            _ => return Err(InputError::NotBeneath),
        }
    }
    let (last, parents) = names.split_last().ok_or(InputError::NotBeneath)?;
    let directory = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // O_DIRECTORY: a root that is a fifo fails at once instead of waiting for a writer.
    let mut dir = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(root)?
    };
    let mut walked = std::path::PathBuf::new();
    for name in parents {
        walked.push(name);
        dir = open_at(&dir, name, directory | libc::O_NOFOLLOW, &walked)?;
    }
    walked.push(last);
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    regular(open_at(&dir, last, flags, &walked)?)
}

/// [`open_input_beneath`], then at most `max` bytes of it.
pub fn read_input_beneath(root: &Path, relative: &Path, max: u64) -> Result<Vec<u8>, InputError> {
    read_bounded(open_input_beneath(root, relative)?, max)
}

/// `openat(dir, name, flags)`; a symbolic link (ELOOP under `O_NOFOLLOW`) is named by
/// `walked`, its path beneath the root.
fn open_at(
    dir: &std::fs::File,
    name: &std::ffi::OsStr,
    flags: libc::c_int,
    walked: &Path,
) -> Result<std::fs::File, InputError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let name =
        std::ffi::CString::new(name.as_encoded_bytes()).map_err(|_| InputError::NotBeneath)?;
    // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated string; the returned
    // descriptor, if any, is owned by the File made from it and nothing else.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        // With O_DIRECTORY a link says ENOTDIR, not ELOOP: ask what the name is.
        let link = match err.raw_os_error() {
            Some(libc::ELOOP) => true,
            Some(libc::ENOTDIR) => is_link_at(dir, &name),
            _ => false,
        };
        return Err(match link {
            true => InputError::Link(walked.to_path_buf()),
            false => InputError::Io(err),
        });
    }
    // SAFETY: `fd` was just opened and is owned by no one else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Whether `name` in `dir` is a symbolic link itself (`fstatat` without following it).
fn is_link_at(dir: &std::fs::File, name: &std::ffi::CStr) -> bool {
    use std::os::fd::AsRawFd;
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `dir` is open, `name` NUL-terminated, and `stat` is written by the call
    // before it is read (only when the call succeeds).
    let found = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            stat.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    // SAFETY: fstatat returned 0, so it filled `stat`.
    found == 0 && unsafe { stat.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// `file` when fstat says it is a regular file.
fn regular(file: std::fs::File) -> Result<std::fs::File, InputError> {
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(InputError::NotAFile(file_kind(&metadata.file_type())));
    }
    Ok(file)
}

/// The bytes of the regular file `file`, refused when fstat says it has more than `max`,
/// and bounded as well: the file may grow between fstat and read.
fn read_bounded(file: std::fs::File, max: u64) -> Result<Vec<u8>, InputError> {
    let size = file.metadata()?.len();
    if size > max {
        return Err(InputError::TooLarge { size, max });
    }
    read_stream(file, max)
}

fn utf8(bytes: Vec<u8>) -> Result<String, InputError> {
    String::from_utf8(bytes).map_err(|_| {
        InputError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })
}

/// What kind of file `kind` is, for the message that refuses it.
pub fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_file() {
        "a regular file"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a fifo"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// Whether `err` or one of its causes is a full disk or an exhausted quota (ENOSPC, EDQUOT):
/// the machine's fault whichever stage was writing (layers, layout, staging, caches), where
/// the same error kind elsewhere would not say so. The message names the path: every write
/// error on the way carries it.
pub fn is_disk_full(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_regular_files_of_bounded_size() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs_err::write(&file, "12345").unwrap();
        assert_eq!(read_input(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_input(&file, 4),
            Err(InputError::TooLarge { size: 5, max: 4 })
        ));
        assert!(matches!(
            read_input(dir.path(), 5),
            Err(InputError::NotAFile("a directory"))
        ));
        assert!(matches!(
            read_input(Path::new("/dev/zero"), 5),
            Err(InputError::NotAFile("a character device"))
        ));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_input(&fifo, 5),
            Err(InputError::NotAFile("a fifo"))
        ));
    }

    #[test]
    fn inputs_beneath_a_directory_never_leave_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs_err::create_dir_all(root.join("a/b")).unwrap();
        fs_err::write(root.join("a/b/f"), "ok").unwrap();
        fs_err::write(dir.path().join("outside"), "secret").unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("a/link")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("up")).unwrap();
        std::os::unix::fs::symlink("a", root.join("via")).unwrap();
        let read = |rel: &str| read_input_beneath(&root, Path::new(rel), 10);
        assert_eq!(read("a/b/f").unwrap(), b"ok");
        assert!(matches!(read("a/link"), Err(InputError::Link(p)) if p == Path::new("a/link")));
        assert!(matches!(read("via/b/f"), Err(InputError::Link(p)) if p == Path::new("via")));
        assert!(matches!(read("up"), Err(InputError::Link(_))));
        assert!(matches!(read("../outside"), Err(InputError::NotBeneath)));
        assert!(matches!(read("/etc/passwd"), Err(InputError::NotBeneath)));
        assert!(matches!(
            read("a"),
            Err(InputError::NotAFile("a directory"))
        ));
        assert!(read("a/missing").unwrap_err().is_not_found());
        assert!(matches!(
            read_stream(std::io::repeat(0), 5),
            Err(InputError::TooLarge { size: 6, max: 5 })
        ));
    }
}
