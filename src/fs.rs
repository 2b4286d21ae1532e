//! File-system helpers with the guarantees a build needs: atomic replacement, so a reader or
//! a later run never sees half a file.

use std::{io::Write, path::Path};

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
