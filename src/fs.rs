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
    match std::fs::hard_link(from, to) {
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

/// Why [`read_input`] refused a file.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("is {0}, not a regular file")]
    NotAFile(&'static str),
    #[error("has {size} bytes; at most {max} are read")]
    TooLarge { size: u64, max: u64 },
}

/// Reads the regular file `path` of at most `max` bytes. Anything else is refused before it
/// is read: `/dev/zero` would be read until memory runs out, and a fifo with no writer
/// would wait for one (it is opened non-blocking, then refused by fstat).
pub fn read_input(path: &Path, max: u64) -> Result<Vec<u8>, InputError> {
    use std::io::Read;
    let file = open_input(path, max)?;
    // Bounded as well: the file may grow between fstat and read.
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(InputError::TooLarge {
            size: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

/// The regular file `path` of at most `max` bytes, opened for reading: what
/// [`read_input`] reads, for a caller that streams it (still bounding what it reads, since
/// the file may grow).
pub fn open_input(path: &Path, max: u64) -> Result<std::fs::File, InputError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(InputError::NotAFile(file_kind(&metadata.file_type())));
    }
    if metadata.len() > max {
        return Err(InputError::TooLarge {
            size: metadata.len(),
            max,
        });
    }
    Ok(file)
}

/// [`read_input`] as UTF-8 text.
pub fn read_input_text(path: &Path, max: u64) -> Result<String, InputError> {
    String::from_utf8(read_input(path, max)?).map_err(|_| {
        InputError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })
}

/// What a file that is not a regular file is, for the message that refuses it.
pub fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
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
        std::fs::write(&file, "12345").unwrap();
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
}
