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
