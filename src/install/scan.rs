//! Reading every entry of a package archive before its extracted copy is trusted.
//!
//! rattler's extractor is safe but quiet: it skips a tar entry whose name climbs out with
//! `..`, and it does not reproduce fifos or device files, so a package carrying them
//! extracts "fine" and the image silently lacks what the package claimed to hold. The
//! extracted directory can no longer tell, so the archive itself is read here, with the same
//! readers rattler uses (`.tar.bz2`: one bzip2 tar; `.conda`: a stored zip holding
//! `info-*.tar.zst` and `pkg-*.tar.zst`), and every entry of both parts is judged by its tar
//! header alone. Only data is read, nothing is written, so this is also what the fuzz target
//! drives with arbitrary bytes (`fuzz/fuzz_targets/package_reader.rs`).

use std::{
    borrow::Cow,
    io::{Read, Seek},
};

/// The two conda archive formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    TarBz2,
    Conda,
}

impl ArchiveKind {
    /// The format a package file name says it has (`.tar.bz2` or `.conda`).
    pub fn from_file_name(name: &str) -> Option<ArchiveKind> {
        if name.ends_with(".tar.bz2") {
            Some(ArchiveKind::TarBz2)
        } else if name.ends_with(".conda") {
            Some(ArchiveKind::Conda)
        } else {
            None
        }
    }
}

/// Why an archive is refused: the entry (or the archive itself) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{entry}` {reason}")]
pub struct Refusal {
    pub entry: String,
    pub reason: String,
}

impl Refusal {
    fn new(entry: impl Into<String>, reason: impl Into<String>) -> Self {
        Refusal {
            entry: entry.into(),
            reason: reason.into(),
        }
    }
}

/// What a scan saw, for the caller's log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    pub entries: u64,
}

/// Reads every entry of the archive `reader` (of kind `kind`, named `archive` in errors) and
/// refuses the first that a package must not hold: a name that is absolute or climbs out with
/// `..`, a symlink or hard link leading outside the prefix, a fifo or a device, an entry type
/// a package has no use for. An archive that cannot be read to its end (truncated, corrupt,
/// not an archive, a `.conda` without its parts) is refused too, naming the archive.
pub fn scan_archive(
    mut reader: impl Read + Seek,
    kind: ArchiveKind,
    archive: &str,
) -> Result<Scanned, Refusal> {
    let unreadable =
        |e: &dyn std::fmt::Display| Refusal::new(archive, format!("cannot be read: {e}"));
    let mut scanned = Scanned::default();
    match kind {
        ArchiveKind::TarBz2 => {
            let mut tar = rattler_package_streaming::read::stream_tar_bz2(&mut reader);
            scan_tar(&mut tar, archive, &mut scanned)?;
            // The tar reader stops at the end-of-archive marker; a bzip2 stream cut short or
            // corrupt after it must still be noticed.
            std::io::copy(&mut tar.into_inner(), &mut std::io::sink())
                .map_err(|e| unreadable(&e))?;
        }
        ArchiveKind::Conda => {
            reader.rewind().map_err(|e| unreadable(&e))?;
            let mut info = rattler_package_streaming::seek::stream_conda_info(&mut reader)
                .map_err(|e| unreadable(&e))?;
            scan_tar(&mut info, archive, &mut scanned)?;
            drop(info);
            reader.rewind().map_err(|e| unreadable(&e))?;
            let mut content = rattler_package_streaming::seek::stream_conda_content(&mut reader)
                .map_err(|e| unreadable(&e))?;
            scan_tar(&mut content, archive, &mut scanned)?;
            std::io::copy(&mut content.into_inner(), &mut std::io::sink())
                .map_err(|e| unreadable(&e))?;
        }
    }
    Ok(scanned)
}

fn scan_tar<R: Read>(
    tar: &mut tar::Archive<R>,
    archive: &str,
    scanned: &mut Scanned,
) -> Result<(), Refusal> {
    let unreadable = |e: std::io::Error| Refusal::new(archive, format!("cannot be read: {e}"));
    for entry in tar.entries().map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        check_entry(&entry)?;
        scanned.entries += 1;
    }
    Ok(())
}

/// Judges one tar entry by its header (names as raw bytes, so nothing is lost to decoding).
fn check_entry<R: Read>(entry: &tar::Entry<'_, R>) -> Result<(), Refusal> {
    let name_bytes = entry.path_bytes();
    let name = String::from_utf8_lossy(&name_bytes).into_owned();
    let refuse = |reason: String| Err(Refusal::new(name.clone(), reason));
    let Some(depth) = inside_depth(&name_bytes) else {
        return refuse(where_it_goes(&name_bytes).to_string());
    };
    let link = || {
        entry
            .link_name_bytes()
            .unwrap_or(Cow::Borrowed(&b""[..]))
            .into_owned()
    };
    use tar::EntryType as T;
    match entry.header().entry_type() {
        T::Regular | T::Continuous | T::Directory | T::XGlobalHeader => Ok(()),
        T::Symlink => {
            let target = link();
            // A symlink is resolved from the directory that holds it.
            let from = depth.saturating_sub(1);
            if target.is_empty() || target.starts_with(b"/") || climbs_above(&target, from) {
                return refuse(format!(
                    "is a symlink to `{}`, outside the prefix",
                    String::from_utf8_lossy(&target)
                ));
            }
            Ok(())
        }
        T::Link => {
            // A hard link names another entry of the archive, from the archive's root.
            let target = link();
            if inside_depth(&target).is_none_or(|d| d == 0) {
                return refuse(format!(
                    "is a hard link to `{}`, outside the prefix",
                    String::from_utf8_lossy(&target)
                ));
            }
            Ok(())
        }
        T::Fifo => refuse(special("a fifo (named pipe)")),
        T::Char => refuse(special("a character device")),
        T::Block => refuse(special("a block device")),
        other => refuse(format!(
            "has tar entry type {} ({other:?}), which a conda package has no use for",
            other.as_byte()
        )),
    }
}

fn special(what: &str) -> String {
    format!(
        "is {what}; a conda package may hold only files, directories and links, and the image would silently lack it"
    )
}

/// How many directory levels below the root `path` sits (0 for the root itself), or `None`
/// when it is absolute or any `..` appears in it. `..` is refused even where it would stay
/// inside (`a/../b`): no packaging tool writes it, and the extractor drops such entries.
fn inside_depth(path: &[u8]) -> Option<usize> {
    if path.starts_with(b"/") {
        return None;
    }
    let mut depth = 0;
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            _ => depth += 1,
        }
    }
    Some(depth)
}

fn where_it_goes(path: &[u8]) -> &'static str {
    if path.starts_with(b"/") {
        "is an absolute path; every entry must stay inside the prefix"
    } else {
        "climbs out with `..`; every entry must stay inside the prefix"
    }
}

/// Whether following the relative `target` from a directory `depth` levels below the root
/// ever rises above the root.
fn climbs_above(target: &[u8], depth: usize) -> bool {
    let mut level = depth as isize;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                level -= 1;
                if level < 0 {
                    return true;
                }
            }
            _ => level += 1,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_refuses_absolute_and_dotdot() {
        assert_eq!(inside_depth(b"lib/libz.so"), Some(2));
        assert_eq!(inside_depth(b"./lib/"), Some(1));
        assert_eq!(inside_depth(b"/etc/passwd"), None);
        assert_eq!(inside_depth(b"lib/../../x"), None);
        assert_eq!(inside_depth(b"a/../b"), None);
    }

    #[test]
    fn symlink_targets_are_resolved_from_their_directory() {
        // lib/python3.9/config/libpython.a -> ../../libpython.a stays inside.
        assert!(!climbs_above(b"../../libpython.a", 3));
        assert!(climbs_above(b"../../../x", 2));
        assert!(!climbs_above(b"libz.so.1", 0));
        assert!(climbs_above(b"..", 0));
        assert!(!climbs_above(b"a/../b", 0));
    }

    #[test]
    fn real_archives_pass_entry_by_entry() {
        // The fuzz seeds: `tar` + `bzip2` and `zip -0` + `zstd` made, holding a file, a
        // script with a text placeholder and a symlink.
        let seeds = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/package_reader/");
        for (name, kind) in [
            ("tiny-1.0-h0_0.tar.bz2", ArchiveKind::TarBz2),
            ("tiny-1.0-h0_0.conda", ArchiveKind::Conda),
        ] {
            let bytes = fs_err::read(format!("{seeds}{name}")).unwrap();
            let scanned = scan_archive(std::io::Cursor::new(&bytes), kind, name).unwrap();
            // info/, info/index.json, info/paths.json, bin/, bin/hi, lib/, and lib's two
            // entries, in either format.
            assert_eq!(scanned.entries, 8, "{name}");
            let cut = &bytes[..bytes.len() - 40];
            assert!(
                scan_archive(std::io::Cursor::new(cut), kind, name).is_err(),
                "{name} cut"
            );
        }
    }

    #[test]
    fn garbage_is_refused_naming_the_archive() {
        for kind in [ArchiveKind::TarBz2, ArchiveKind::Conda] {
            let refusal =
                scan_archive(std::io::Cursor::new(b"<html>404</html>"), kind, "x.pkg").unwrap_err();
            assert_eq!(refusal.entry, "x.pkg");
            assert!(refusal.reason.starts_with("cannot be read"), "{refusal}");
        }
    }
}
