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
    pub(crate) fn from_file_name(name: &str) -> Option<ArchiveKind> {
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
pub struct ArchiveRefusal {
    pub entry: String,
    pub reason: String,
}

impl ArchiveRefusal {
    fn new(entry: impl Into<String>, reason: impl Into<String>) -> Self {
        ArchiveRefusal {
            entry: printable(&entry.into()),
            reason: printable(&reason.into()),
        }
    }
}

/// What a scan saw, for the caller's log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    pub entries: u64,
    /// Bytes the archive's tar entries unpack to (headers and contents).
    pub unpacked: u64,
}

/// How far an archive may expand: the ratio bound every decompression has
/// ([`crate::compression::bounded::Bound::ratio`]), [`MAX_RATIO`] times its own size (or
/// `$IMGBUILD_MAX_UNPACK_RATIO`) and never less than [`MIN_UNPACKED`]. Real packages stay far
/// below (CUDA libraries unpack to 3 to 5 times their archive, text-heavy ones to 10 to 20, a
/// package of nothing but empty files to under 100); a kilobyte of bzip2 that unpacks to a
/// gigabyte of zeros is a decompression bomb, refused at the first header past the bound,
/// before its bytes are decompressed. The scan counts headers' sizes rather than reading
/// through a `Bounded` reader, so that it refuses before decompressing the content.
pub use crate::compression::bounded::{MAX_RATIO, MIN_UNPACKED};
/// The most `info/paths.json` may hold; torch's, the largest seen, is 9 MiB.
const MAX_PATHS_JSON: u64 = 64 << 20;

/// What a scan of one archive knows as it goes.
struct Scan<'a> {
    archive: &'a str,
    limit: u64,
    scanned: Scanned,
    /// `info/paths.json`'s size of each declared file, once that entry has been read: a
    /// payload entry larger than its declaration is refused at its header.
    declared: Option<std::collections::HashMap<Vec<u8>, u64>>,
}

impl Scan<'_> {
    fn unreadable(&self, e: &dyn std::fmt::Display) -> ArchiveRefusal {
        ArchiveRefusal::new(self.archive, format!("cannot be read: {e}"))
    }

    /// Counts `bytes` more unpacked bytes, refusing the archive once past the bound.
    fn count(&mut self, bytes: u64) -> Result<(), ArchiveRefusal> {
        self.scanned.unpacked = self.scanned.unpacked.saturating_add(bytes);
        if self.scanned.unpacked > self.limit {
            return Err(ArchiveRefusal::new(
                self.archive,
                format!(
                    "unpacks to more than {} bytes, over {} times its size; refused as a decompression bomb",
                    self.limit,
                    crate::compression::bounded::ratio()
                ),
            ));
        }
        Ok(())
    }
}

/// Reads every entry of the archive `reader` (of kind `kind`, named `archive` in errors) and
/// refuses the first that a package must not hold: a name that is absolute or climbs out with
/// `..`, a symlink or hard link leading outside the prefix, a fifo or a device, an entry type
/// a package has no use for, a payload file larger than `info/paths.json` declares, or more
/// unpacked bytes than [`MAX_RATIO`] allows. An archive that cannot be read to its end
/// (truncated, corrupt, not an archive, a `.conda` without its parts or whose zip directory
/// and local headers disagree) is refused too, naming the archive.
pub fn scan_archive(
    mut reader: impl Read + Seek,
    kind: ArchiveKind,
    archive: &str,
) -> Result<Scanned, ArchiveRefusal> {
    let size = reader
        .seek(std::io::SeekFrom::End(0))
        .and_then(|size| reader.rewind().map(|()| size))
        .map_err(|e| ArchiveRefusal::new(archive, format!("cannot be read: {e}")))?;
    let mut scan = Scan {
        archive,
        limit: crate::compression::bounded::Bound::ratio(size, archive).max,
        scanned: Scanned::default(),
        declared: None,
    };
    match kind {
        ArchiveKind::TarBz2 => {
            let mut tar = rattler_package_streaming::read::stream_tar_bz2(&mut reader);
            scan_tar(&mut tar, &mut scan)?;
            // The tar reader stops at the end-of-archive marker; a bzip2 stream cut short or
            // corrupt after it must still be noticed (bounded: trailing bytes count too).
            drain(tar.into_inner(), &mut scan)?;
        }
        ArchiveKind::Conda => scan_conda(&mut reader, &mut scan)?,
    }
    Ok(scan.scanned)
}

/// Reads `reader` to its end, counting what it yields against the bound.
fn drain(mut reader: impl Read, scan: &mut Scan<'_>) -> Result<(), ArchiveRefusal> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = reader.read(&mut buf).map_err(|e| scan.unreadable(&e))?;
        if n == 0 {
            return Ok(());
        }
        scan.count(n as u64)?;
    }
}

fn scan_tar<R: Read>(tar: &mut tar::Archive<R>, scan: &mut Scan<'_>) -> Result<(), ArchiveRefusal> {
    for entry in tar.entries().map_err(|e| scan.unreadable(&e))? {
        let mut entry = entry.map_err(|e| scan.unreadable(&e))?;
        check_entry(&entry)?;
        // A header is 512 bytes, the content is padded to the next 512.
        scan.count(512 + entry.size().div_ceil(512) * 512)?;
        check_declared_size(&entry, scan)?;
        if &*entry.path_bytes() == b"info/paths.json" {
            scan.declared = Some(read_declared_sizes(&mut entry, scan)?);
        }
        scan.scanned.entries += 1;
    }
    Ok(())
}

/// Refuses a payload file whose header says it is larger than `info/paths.json` declares.
fn check_declared_size<R: Read>(
    entry: &tar::Entry<'_, R>,
    scan: &Scan<'_>,
) -> Result<(), ArchiveRefusal> {
    let Some(declared) = &scan.declared else {
        return Ok(());
    };
    let name = entry.path_bytes();
    let name = name.strip_prefix(b"./").unwrap_or(&name);
    match declared.get(name) {
        Some(&size) if entry.header().entry_type().is_file() && entry.size() > size => {
            Err(ArchiveRefusal::new(
                String::from_utf8_lossy(name),
                format!(
                    "is {} bytes in the archive, but info/paths.json declares {size}",
                    entry.size()
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// The declared size of every file `info/paths.json` lists with one (read here with a bound;
/// what is wrong with it otherwise is for the extracted copy's check to say).
fn read_declared_sizes(
    entry: &mut impl Read,
    scan: &Scan<'_>,
) -> Result<std::collections::HashMap<Vec<u8>, u64>, ArchiveRefusal> {
    let mut text = Vec::new();
    entry
        .take(MAX_PATHS_JSON + 1)
        .read_to_end(&mut text)
        .map_err(|e| scan.unreadable(&e))?;
    if text.len() as u64 > MAX_PATHS_JSON {
        return Err(ArchiveRefusal::new(
            "info/paths.json",
            format!("is larger than {MAX_PATHS_JSON} bytes"),
        ));
    }
    let Ok(paths) = serde_json::from_slice::<rattler_conda_types::package::PathsJson>(&text) else {
        return Ok(Default::default());
    };
    Ok(paths
        .paths
        .into_iter()
        .filter_map(|p| {
            let size = p.size_in_bytes?;
            Some((p.relative_path.into_os_string().into_encoded_bytes(), size))
        })
        .collect())
}

/// A reader that knows how far it has read: where each local zip header starts.
struct Counting<R> {
    inner: R,
    at: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A `.conda` is scanned the way rattler's extractor reads it: local headers in stream order,
/// every `.tar.zst` member it would unpack. The zip's central directory (what `seek`-based
/// readers see) must list exactly the same members at the same offsets, or the archive is
/// refused: otherwise a member present only in the stream would be unpacked but never seen by
/// a reader of the directory, or the other way round.
fn scan_conda(reader: &mut (impl Read + Seek), scan: &mut Scan<'_>) -> Result<(), ArchiveRefusal> {
    let directory = central_directory(reader, scan)?;
    reader.rewind().map_err(|e| scan.unreadable(&e))?;
    let mut stream = Counting {
        inner: &mut *reader,
        at: 0,
    };
    let mut members = Vec::new();
    loop {
        let at = stream.at;
        let Some(mut file) =
            zip::read::read_zipfile_from_stream(&mut stream).map_err(|e| scan.unreadable(&e))?
        else {
            break;
        };
        let name = file.name_raw().to_vec();
        members.push((at, name.clone()));
        if name.ends_with(b".tar.zst") {
            let decoder =
                zstd::stream::read::Decoder::new(&mut file).map_err(|e| scan.unreadable(&e))?;
            let mut tar = tar::Archive::new(decoder);
            scan_tar(&mut tar, scan)?;
            drain(tar.into_inner(), scan)?;
        } else {
            drain(&mut file, scan)?;
        }
    }
    check_members(&members, scan)?;
    if members != directory {
        return Err(ArchiveRefusal::new(
            scan.archive,
            format!(
                "is a zip whose central directory ({}) and local headers ({}) disagree",
                member_list(&directory),
                member_list(&members)
            ),
        ));
    }
    Ok(())
}

/// The central directory's members by offset, after reading the declared sizes from the info
/// member (which may come after the payload in the stream).
fn central_directory(
    reader: &mut (impl Read + Seek),
    scan: &mut Scan<'_>,
) -> Result<Vec<(u64, Vec<u8>)>, ArchiveRefusal> {
    let mut zip = zip::ZipArchive::new(&mut *reader).map_err(|e| scan.unreadable(&e))?;
    let mut directory = Vec::with_capacity(zip.len());
    for index in 0..zip.len() {
        let file = zip.by_index_raw(index).map_err(|e| scan.unreadable(&e))?;
        directory.push((file.header_start(), file.name_raw().to_vec()));
    }
    directory.sort();
    let info = directory
        .iter()
        .find(|(_, name)| is_member(name, b"info-"))
        .map(|(_, name)| String::from_utf8_lossy(name).into_owned());
    if let Some(info) = info {
        let file = zip.by_name(&info).map_err(|e| scan.unreadable(&e))?;
        let decoder = zstd::stream::read::Decoder::new(file).map_err(|e| scan.unreadable(&e))?;
        let mut tar = tar::Archive::new(decoder);
        for entry in tar.entries().map_err(|e| scan.unreadable(&e))? {
            let mut entry = entry.map_err(|e| scan.unreadable(&e))?;
            if &*entry.path_bytes() == b"info/paths.json" && entry.size() <= MAX_PATHS_JSON {
                scan.declared = Some(read_declared_sizes(&mut entry, scan)?);
                break;
            }
        }
    }
    Ok(directory)
}

fn is_member(name: &[u8], kind: &[u8]) -> bool {
    name.starts_with(kind) && name.ends_with(b".tar.zst") && !name.contains(&b'/')
}

/// One info and one payload member, and no other archive the extractor would unpack.
fn check_members(members: &[(u64, Vec<u8>)], scan: &Scan<'_>) -> Result<(), ArchiveRefusal> {
    for kind in [&b"info-"[..], b"pkg-"] {
        let count = members.iter().filter(|(_, n)| is_member(n, kind)).count();
        if count != 1 {
            return Err(ArchiveRefusal::new(
                scan.archive,
                format!(
                    "holds {count} `{}*.tar.zst` members; a `.conda` has exactly one",
                    String::from_utf8_lossy(kind)
                ),
            ));
        }
    }
    if let Some((_, extra)) = members.iter().find(|(_, n)| {
        n.ends_with(b".tar.zst") && !is_member(n, b"info-") && !is_member(n, b"pkg-")
    }) {
        return Err(ArchiveRefusal::new(
            printable(&String::from_utf8_lossy(extra)),
            "is a third archive in the `.conda`, which the extractor would unpack too",
        ));
    }
    Ok(())
}

fn member_list(members: &[(u64, Vec<u8>)]) -> String {
    let names: Vec<String> = members
        .iter()
        .map(|(at, name)| format!("{} at {at}", printable(&String::from_utf8_lossy(name))))
        .collect();
    names.join(", ")
}

/// `text` with control characters and other invisible ones escaped, so a name or a message
/// taken from an archive prints as what it is and never as raw bytes on the terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}') {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Judges one tar entry by its header (names as raw bytes, so nothing is lost to decoding).
fn check_entry<R: Read>(entry: &tar::Entry<'_, R>) -> Result<(), ArchiveRefusal> {
    let name_bytes = entry.path_bytes();
    let name = String::from_utf8_lossy(&name_bytes).into_owned();
    let refuse = |reason: String| Err(ArchiveRefusal::new(name.clone(), reason));
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
        let seeds = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/seeds/package_reader/"
        );
        for (name, kind) in [
            ("tiny-1.0-h0_0.tar.bz2", ArchiveKind::TarBz2),
            ("tiny-1.0-h0_0.conda", ArchiveKind::Conda),
        ] {
            let bytes = fs_err::read(format!("{seeds}{name}")).unwrap();
            let scanned = scan_archive(std::io::Cursor::new(&bytes), kind, name).unwrap();
            // info/, info/index.json, info/paths.json, bin/, bin/hi, lib/, and lib's two
            // entries, in either format.
            assert_eq!(scanned.entries, 8, "{name}");
            assert!(scanned.unpacked >= 8 * 512, "{name}");
            let cut = &bytes[..bytes.len() - 40];
            assert!(
                scan_archive(std::io::Cursor::new(cut), kind, name).is_err(),
                "{name} cut"
            );
        }
    }

    #[test]
    fn a_member_only_the_stream_holds_is_refused() {
        // The tiny seed with a stored `notes.txt` put in front of it: the local headers hold
        // it, the central directory (at the end, unchanged) does not.
        let seeds = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/seeds/package_reader/"
        );
        let bytes = fs_err::read(format!("{seeds}hidden-member-1.0-h0_0.conda")).unwrap();
        let refusal =
            scan_archive(std::io::Cursor::new(&bytes), ArchiveKind::Conda, "h.conda").unwrap_err();
        assert_eq!(refusal.entry, "h.conda");
        assert!(refusal.reason.contains("disagree"), "{refusal}");
        assert!(refusal.reason.contains("notes.txt at 0"), "{refusal}");
    }

    #[test]
    fn bombs_are_refused_at_their_first_big_header() {
        let bombs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/bombs/");
        for (name, kind) in [
            ("bomb-1.0-h0_0.tar.bz2", ArchiveKind::TarBz2),
            ("bomb-1.0-h1_0.conda", ArchiveKind::Conda),
        ] {
            let bytes = fs_err::read(format!("{bombs}{name}")).unwrap();
            let refusal = scan_archive(std::io::Cursor::new(&bytes), kind, name).unwrap_err();
            assert!(
                refusal.reason.contains("decompression bomb"),
                "{name}: {refusal}"
            );
        }
    }

    #[test]
    fn names_from_archives_print_as_text() {
        assert_eq!(printable("lib/a\nb\u{202e}c"), "lib/a\\u{a}b\\u{202e}c");
        assert_eq!(printable("ok/name.txt"), "ok/name.txt");
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
