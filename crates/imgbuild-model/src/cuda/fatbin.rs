//! GPU architectures a shared library's CUDA kernels are built for, read from its CUDA
//! fatbins (the `.nv_fatbin` ELF section): will its kernels run on a given GPU?
//!
//! A fatbin holds, per kernel module, one SASS cubin per real architecture (`sm_80`, run
//! as they are) and PTX for virtual ones (`compute_90`, JIT-compiled by the driver at first
//! use for that or any newer GPU). A device with no SASS for its architecture and no PTX
//! at or below it fails with "no kernel image is available for execution on the device".
//!
//! The layout (NVIDIA does not document it; it matches `cuobjdump` and was checked against
//! cuRAND 10.3.2.106 of CUDA 12.1, see the README): the section is a run of blobs, each a
//! 16-byte header (u32 magic `0xBA55ED50`, u16 version, u16 header size, u64 payload size)
//! and a payload of entries, each an entry header (u16 kind: 1 PTX, 2 SASS; u16; u32 header
//! size; u64 payload size; u32 compressed length at 16; u16 PTX ISA minor and major at 24
//! and 26; u32 arch at offset 28, `80` for `sm_80`; u64 flags at 40, `0x2000` for an
//! LZ4-compressed payload; u64 decompressed size at 56) and its payload. The headers are
//! read; a payload only where a PTX entry's header holds no ISA version, to read the
//! `.version` of its text ([`super::ptx`]).
//!
//! A library is a stranger's file: every size read is checked against what holds it, the
//! number of entries is bounded, and nothing is allocated from a size the file gives beyond
//! a bound ([`super::ptx::MAX_PTX`]).

use std::{
    collections::BTreeMap,
    fs::File,
    io::{Read, Seek, SeekFrom},
    path::Path,
};

pub use imgbuild_smoke::architectures::{
    Arch, ArchKind, ArchParseError, Architectures, Coverage, coverage, format_list, parse_list,
};

use super::{
    compat::PtxIsa,
    ptx::{self, PtxError},
};
use crate::annotations;
use object::{
    Endianness, FileKind, ReadCache,
    elf::{FileHeader32, FileHeader64, SHT_NOBITS},
    read::elf::{FileHeader, SectionHeader},
};

/// The magic number that starts each fatbin blob.
const MAGIC: u32 = 0xBA55_ED50;
const BLOB_HEADER: u64 = 16;
/// The entry header up to and including `arch`.
const ENTRY_FIELDS: u64 = 32;
/// The entry header up to and including the decompressed size, as every real one has it.
const ENTRY_FULL: u64 = 64;
/// Headers are 64 or 72 bytes in real libraries; a larger one is not a fatbin we know.
const MAX_HEADER: u64 = 4096;
/// Zero padding allowed between blobs (they are aligned, a few bytes apart at most).
const MAX_PADDING: u64 = 4096;
/// Headers (blob, entry and padding reads) read per library: cuBLAS has thousands, a forged
/// section could claim billions.
const MAX_ENTRIES: usize = 1 << 20;
const KIND_PTX: u16 = 1;
const KIND_SASS: u16 = 2;

/// Why a fatbin section could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FatbinError {
    #[error("reading the fatbin")]
    Io(#[from] std::io::Error),
    #[error("the fatbin at offset {offset} is malformed: {reason}")]
    Malformed { offset: u64, reason: &'static str },
    #[error("the fatbin has more than {MAX_ENTRIES} headers")]
    TooManyEntries,
    #[error("reading the ELF headers")]
    Elf(#[from] object::read::Error),
    #[error("the PTX entry at offset {offset} cannot be read")]
    Ptx {
        offset: u64,
        #[source]
        source: PtxError,
    },
}

/// One entry of a fatbin: SASS for a real architecture or PTX for a virtual one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FatbinEntry {
    pub arch: Arch,
    /// What the payload takes in the library (compressed, when it is).
    pub payload_size: u64,
    /// PTX's ISA version (`7.8`); `None` for SASS.
    pub ptx_isa: Option<PtxIsa>,
    /// Where the PTX text is, for a PTX entry.
    text: Option<PtxText>,
}

/// Where a PTX entry's text is and how it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PtxText {
    /// File offset of the entry's header, what errors name.
    entry: u64,
    /// File offset and length of the payload.
    offset: u64,
    payload: u64,
    /// `(compressed length, decompressed size)` of an LZ4 payload.
    lz4: Option<(u64, u64)>,
}

/// The newest PTX ISA of each PTX architecture (by its number, `90` for `compute_90`).
pub type PtxIsas = BTreeMap<u32, PtxIsa>;

/// The architectures of `entries`.
pub fn entry_architectures(entries: &[FatbinEntry]) -> Architectures {
    entries.iter().map(|e| e.arch).collect()
}

/// The newest ISA of each PTX architecture of `entries`.
pub fn entry_ptx_isas(entries: &[FatbinEntry]) -> PtxIsas {
    let mut isas = PtxIsas::new();
    for entry in entries {
        if let Some(isa) = entry.ptx_isa {
            let newest = isas.entry(entry.arch.sm).or_insert(isa);
            *newest = (*newest).max(isa);
        }
    }
    isas
}

fn malformed(offset: u64, reason: &'static str) -> FatbinError {
    FatbinError::Malformed { offset, reason }
}

/// Counts one more header read, refusing a fatbin that needs more than [`MAX_ENTRIES`]: each
/// read is small, but a forged section could ask for billions of them.
fn count(reads: &mut usize) -> Result<(), FatbinError> {
    *reads += 1;
    if *reads > MAX_ENTRIES {
        return Err(FatbinError::TooManyEntries);
    }
    Ok(())
}

/// Reads `N` bytes at `offset` of `reader`, a short read being a malformed fatbin.
fn read_at<const N: usize, R: Read + Seek>(
    reader: &mut R,
    offset: u64,
) -> Result<[u8; N], FatbinError> {
    let mut buf = [0u8; N];
    reader.seek(SeekFrom::Start(offset))?;
    reader
        .read_exact(&mut buf)
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::UnexpectedEof => malformed(offset, "it ends before the file does"),
            _ => FatbinError::Io(err),
        })?;
    Ok(buf)
}

fn u16_at(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads `len` bytes at `offset`, `len` bounded by the caller.
fn read_vec_at<R: Read + Seek>(
    reader: &mut R,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, FatbinError> {
    let mut buf = vec![0u8; usize::try_from(len).expect("a bounded length")];
    reader.seek(SeekFrom::Start(offset))?;
    reader
        .read_exact(&mut buf)
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::UnexpectedEof => malformed(offset, "it ends before the file does"),
            _ => FatbinError::Io(err),
        })?;
    Ok(buf)
}

/// A PTX entry's text: decompressed whole when it is LZ4, else its first
/// [`ptx::VERSION_WINDOW`] bytes (all the `.version` directive needs).
fn read_text<R: Read + Seek>(reader: &mut R, at: &PtxText) -> Result<Vec<u8>, FatbinError> {
    let ptx_err = |source| FatbinError::Ptx {
        offset: at.entry,
        source,
    };
    let Some((compressed, size)) = at.lz4 else {
        return read_vec_at(
            reader,
            at.offset,
            at.payload.min(ptx::VERSION_WINDOW as u64),
        );
    };
    if compressed > at.payload {
        return Err(ptx_err(PtxError::CompressedLength {
            compressed,
            payload: at.payload,
        }));
    }
    // Checked before the compressed bytes are read, so a forged size reads nothing.
    ptx::check_decompressed_size(size, compressed).map_err(ptx_err)?;
    let block = read_vec_at(reader, at.offset, compressed)?;
    ptx::decompress(&block, size).map_err(ptx_err)
}

/// The ISA of a PTX entry: its header's, else its text's `.version`.
fn entry_isa<R: Read + Seek>(
    reader: &mut R,
    header: &[u8],
    at: &PtxText,
) -> Result<PtxIsa, FatbinError> {
    if let Some(isa) = ptx::header_isa(u16_at(header, 24), u16_at(header, 26)) {
        return Ok(isa);
    }
    let text = read_text(reader, at)?;
    ptx::version_directive(&text).map_err(|source| FatbinError::Ptx {
        offset: at.entry,
        source,
    })
}

/// The text of the PTX `entry` of the library `reader` reads, as [`read_entries`] listed it
/// (its first [`ptx::VERSION_WINDOW`] bytes when stored uncompressed); `None` for SASS.
pub fn read_ptx_text<R: Read + Seek>(
    reader: &mut R,
    entry: &FatbinEntry,
) -> Result<Option<Vec<u8>>, FatbinError> {
    let Some(at) = &entry.text else {
        return Ok(None);
    };
    read_text(reader, at).map(Some)
}

/// The entries of the fatbin section at `offset`, `size` bytes long, in `reader`.
pub(crate) fn parse_section<R: Read + Seek>(
    reader: &mut R,
    offset: u64,
    size: u64,
) -> Result<Vec<FatbinEntry>, FatbinError> {
    let end = offset
        .checked_add(size)
        .ok_or_else(|| malformed(offset, "its size overflows"))?;
    let mut archs = Vec::new();
    let mut entries = 0usize;
    let mut pos = offset;
    let mut padding = 0u64;
    while end - pos >= BLOB_HEADER {
        count(&mut entries)?;
        let header: [u8; 16] = read_at(reader, pos)?;
        if u32_at(&header, 0) != MAGIC {
            // Blobs are aligned: zeros may sit between them, anything else is not a fatbin.
            let zeros = (0..4).take_while(|&i| u32_at(&header, i * 4) == 0).count() as u64;
            if zeros == 0 || padding >= MAX_PADDING {
                return Err(malformed(pos, "no fatbin header where one should start"));
            }
            padding += zeros * 4;
            pos += zeros * 4;
            continue;
        }
        padding = 0;
        let header_size = u64::from(u16_at(&header, 6));
        let payload = u64_at(&header, 8);
        if !(BLOB_HEADER..=MAX_HEADER).contains(&header_size) {
            return Err(malformed(pos, "a blob header size out of range"));
        }
        let blob_end = pos
            .checked_add(header_size)
            .and_then(|p| p.checked_add(payload))
            .filter(|&e| e <= end)
            .ok_or_else(|| malformed(pos, "a blob larger than its section"))?;
        parse_entries(
            reader,
            pos + header_size,
            blob_end,
            &mut archs,
            &mut entries,
        )?;
        pos = blob_end;
    }
    Ok(archs)
}

/// Adds the entries between `pos` and `end` (one blob's payload).
fn parse_entries<R: Read + Seek>(
    reader: &mut R,
    mut pos: u64,
    end: u64,
    archs: &mut Vec<FatbinEntry>,
    entries: &mut usize,
) -> Result<(), FatbinError> {
    while pos < end {
        count(entries)?;
        if end - pos < ENTRY_FIELDS {
            return Err(malformed(pos, "an entry header cut short by its blob"));
        }
        let header: [u8; ENTRY_FIELDS as usize] = read_at(reader, pos)?;
        let kind = u16_at(&header, 0);
        let header_size = u64::from(u32_at(&header, 4));
        let payload = u64_at(&header, 8);
        let sm = u32_at(&header, 28);
        if !(ENTRY_FIELDS..=MAX_HEADER).contains(&header_size) {
            return Err(malformed(pos, "an entry header size out of range"));
        }
        let next = pos
            .checked_add(header_size)
            .and_then(|p| p.checked_add(payload))
            .filter(|&n| n <= end)
            .ok_or_else(|| malformed(pos, "an entry larger than its blob"))?;
        // Other kinds (none known) carry no architecture a device runs.
        let entry = match kind {
            KIND_SASS => Some(FatbinEntry {
                arch: Arch {
                    kind: ArchKind::Sass,
                    sm,
                },
                payload_size: payload,
                ptx_isa: None,
                text: None,
            }),
            KIND_PTX => Some(ptx_entry(reader, pos, header_size, payload, sm)?),
            _ => None,
        };
        archs.extend(entry);
        pos = next;
    }
    Ok(())
}

/// The PTX entry whose header of `header_size` bytes is at `pos`, its ISA read.
fn ptx_entry<R: Read + Seek>(
    reader: &mut R,
    pos: u64,
    header_size: u64,
    payload: u64,
    sm: u32,
) -> Result<FatbinEntry, FatbinError> {
    // A header shorter than real ones has no flags: its payload is read as plain text.
    let header: [u8; ENTRY_FULL as usize] = if header_size >= ENTRY_FULL {
        read_at(reader, pos)?
    } else {
        let short: [u8; ENTRY_FIELDS as usize] = read_at(reader, pos)?;
        let mut header = [0u8; ENTRY_FULL as usize];
        header[..short.len()].copy_from_slice(&short);
        header
    };
    let lz4 = (u64_at(&header, 40) & ptx::FLAG_COMPRESSED != 0)
        .then(|| (u64::from(u32_at(&header, 16)), u64_at(&header, 56)));
    let text = PtxText {
        entry: pos,
        offset: pos + header_size,
        payload,
        lz4,
    };
    Ok(FatbinEntry {
        arch: Arch {
            kind: ArchKind::Ptx,
            sm,
        },
        payload_size: payload,
        ptx_isa: Some(entry_isa(reader, &header, &text)?),
        text: Some(text),
    })
}

/// The architectures of the library at `path`, or `None` when it is not an ELF file or has
/// no fatbin (most libraries). See [`read_entries`].
pub fn read_library(path: &Path) -> Result<Option<Architectures>, FatbinError> {
    Ok(read_entries(path)?.map(|entries| entry_architectures(&entries)))
}

/// The fatbin entries of the library at `path`, in their order, or `None` when it is not an
/// ELF file or has no fatbin. Reads the ELF section headers, the fatbin's headers and only
/// the text of PTX entries whose header gives no ISA.
#[allow(
    clippy::disallowed_methods,
    reason = "the caller names the library in its error"
)]
pub fn read_entries(path: &Path) -> Result<Option<Vec<FatbinEntry>>, FatbinError> {
    let cache = ReadCache::new(File::open(path)?);
    let range = match FileKind::parse(&cache) {
        Ok(FileKind::Elf64) => fatbin_range::<FileHeader64<Endianness>>(&cache)?,
        Ok(FileKind::Elf32) => fatbin_range::<FileHeader32<Endianness>>(&cache)?,
        // Not an object file (a linker script named `libc.so`, say): no kernels.
        _ => None,
    };
    let Some((offset, size)) = range else {
        return Ok(None);
    };
    let mut file = cache.into_inner();
    parse_section(&mut file, offset, size).map(Some)
}

/// The file range of the `.nv_fatbin` section, if there is one with contents.
fn fatbin_range<H: FileHeader<Endian = Endianness>>(
    data: &ReadCache<File>,
) -> Result<Option<(u64, u64)>, FatbinError> {
    let header = H::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    let Some((_, section)) = sections.section_by_name(endian, b".nv_fatbin") else {
        return Ok(None);
    };
    if section.sh_type(endian) == SHT_NOBITS {
        return Ok(None);
    }
    Ok(section.file_range(endian))
}

/// The architectures of one package's libraries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageArchitectures {
    /// As layer annotations name it (`libcublas-12.1.3.1-0`, `pypi:nvidia_curand_cu12-…`).
    pub package: String,
    /// Prefix-relative library path → its architectures; libraries without a fatbin left out.
    pub libraries: BTreeMap<String, Architectures>,
    /// Prefix-relative library path → the newest ISA of each of its PTX architectures;
    /// libraries without PTX left out.
    pub ptx_isas: BTreeMap<String, PtxIsas>,
}

impl PackageArchitectures {
    /// What all its libraries carry together.
    pub fn union(&self) -> Architectures {
        self.libraries.values().flatten().copied().collect()
    }

    /// The newest ISA of each PTX architecture over all its libraries.
    pub fn ptx_union(&self) -> PtxIsas {
        let mut isas = PtxIsas::new();
        for (&sm, &isa) in self.ptx_isas.values().flatten() {
            let newest = isas.entry(sm).or_insert(isa);
            *newest = (*newest).max(isa);
        }
        isas
    }
}

/// A shared library, by its name: `libx.so`, `libx.so.12`, `x.cpython-311-x86_64-linux-gnu.so`.
fn is_shared_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so") || name.contains(".so.")
}

/// Reads the fatbins of every package's shared libraries under `prefix_dir`. `packages`
/// are (name, prefix-relative files). A library whose fatbin cannot be read is left out
/// with a warning, which is returned: its kernels are unknown, not absent.
pub fn scan_packages<'a>(
    prefix_dir: &Path,
    packages: impl IntoIterator<Item = (String, &'a [String])>,
) -> (Vec<PackageArchitectures>, Vec<String>) {
    let mut found = Vec::new();
    let mut warnings = Vec::new();
    for (package, files) in packages {
        let mut libraries = BTreeMap::new();
        let mut ptx_isas = BTreeMap::new();
        for rel in files.iter().filter(|f| is_shared_library(f)) {
            let path = prefix_dir.join(rel);
            // Symlinks (`libx.so` → `libx.so.12`) would count a library twice.
            if !fs_err::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                continue;
            }
            match read_entries(&path) {
                Ok(Some(entries)) if !entries.is_empty() => {
                    libraries.insert(rel.clone(), entry_architectures(&entries));
                    let isas = entry_ptx_isas(&entries);
                    if !isas.is_empty() {
                        ptx_isas.insert(rel.clone(), isas);
                    }
                }
                Ok(_) => {}
                Err(err) => warnings.push(format!(
                    "the CUDA fatbin of `{rel}` ({package}) cannot be read, its GPU architectures are unknown: {}",
                    error_chain(&err)
                )),
            }
        }
        if !libraries.is_empty() {
            found.push(PackageArchitectures {
                package,
                libraries,
                ptx_isas,
            });
        }
    }
    (found, warnings)
}

/// The manifest annotations of what [`scan_packages`] found: the union of every library's
/// architectures ([`annotations::CUDA_ARCHITECTURES`]) and each package's
/// ([`annotations::CUDA_PACKAGE_ARCHITECTURES`], `package=sm_80,compute_90;…` by name).
/// None when no library has a fatbin.
pub fn annotations(found: &[PackageArchitectures]) -> Vec<(String, String)> {
    if found.is_empty() {
        return Vec::new();
    }
    let union: Architectures = found.iter().flat_map(PackageArchitectures::union).collect();
    let by_package: BTreeMap<&str, Architectures> = found
        .iter()
        .map(|p| (p.package.as_str(), p.union()))
        .collect();
    let per_package = by_package
        .iter()
        .map(|(name, archs)| format!("{name}={}", format_list(archs)))
        .collect::<Vec<_>>()
        .join(";");
    let mut pairs = vec![
        (
            annotations::CUDA_ARCHITECTURES.to_string(),
            format_list(&union),
        ),
        (
            annotations::CUDA_PACKAGE_ARCHITECTURES.to_string(),
            per_package,
        ),
    ];
    let ptx: BTreeMap<&str, PtxIsas> = found
        .iter()
        .map(|p| (p.package.as_str(), p.ptx_union()))
        .filter(|(_, isas)| !isas.is_empty())
        .collect();
    if !ptx.is_empty() {
        let value = ptx
            .iter()
            .map(|(name, isas)| format!("{name}={}", format_ptx_isas(isas)))
            .collect::<Vec<_>>()
            .join(";");
        pairs.push((annotations::CUDA_PTX_ISA.to_string(), value));
    }
    pairs
}

/// `compute_90:8.1,compute_121:8.8`: each PTX architecture with its newest ISA.
pub fn format_ptx_isas(isas: &PtxIsas) -> String {
    isas.iter()
        .map(|(sm, isa)| format!("compute_{sm}:{isa}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`annotations::CUDA_PTX_ISA`] back: (package, its PTX ISAs), by name. An item that
/// does not parse is left out, as in [`parse_package_annotation`].
pub fn parse_ptx_annotation(value: &str) -> Vec<(String, PtxIsas)> {
    let isas = |list: &str| -> Option<PtxIsas> {
        list.split(',')
            .map(|item| {
                let (arch, isa) = item.split_once(':')?;
                let arch: Arch = arch.parse().ok()?;
                (arch.kind == ArchKind::Ptx).then_some(())?;
                Some((arch.sm, isa.parse().ok()?))
            })
            .collect()
    };
    value
        .split(';')
        .filter_map(|item| {
            let (name, list) = item.split_once('=')?;
            Some((name.to_string(), isas(list)?))
        })
        .collect()
}

/// Reads [`annotations::CUDA_PACKAGE_ARCHITECTURES`] back: (package, architectures), by
/// name. An item that does not parse is left out: the annotation may come from a newer
/// imgbuild, and describing the rest beats refusing the image.
pub fn parse_package_annotation(value: &str) -> Vec<(String, Architectures)> {
    value
        .split(';')
        .filter_map(|item| {
            let (name, list) = item.split_once('=')?;
            Some((name.to_string(), parse_list(list).ok()?))
        })
        .collect()
}

/// Libraries with no kernel that runs on any of the recipe's `[cuda] architectures`.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} on none of `[cuda] architectures` ({}): {}. The kernels would fail there with \"no kernel image is available for execution on the device\". Install builds of the packages for these GPUs, or change `[cuda] architectures`",
    if .libraries.len() == 1 { "A library runs".to_string() } else { format!("{} libraries run", .libraries.len()) },
    format_list(.wanted),
    .libraries.iter().map(|l| format!("`{}` ({}) carries {}", l.library, l.package, format_list(&l.carries))).collect::<Vec<_>>().join("; ")
)]
pub struct NotCovered {
    /// The devices asked for, as `sm_XX`.
    pub wanted: Architectures,
    pub libraries: Vec<UncoveredLibrary>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncoveredLibrary {
    /// Prefix-relative path.
    pub library: String,
    pub package: String,
    pub carries: Architectures,
}

/// Refuses libraries none of whose kernels runs on any device of `wanted` (`sm_XX`, the
/// recipe's `[cuda] architectures`): by SASS, or by PTX the driver JIT-compiles. A library
/// that runs on one of them is kept; the others may be GPUs it was never meant for.
pub fn check_architectures(
    found: &[PackageArchitectures],
    wanted: &Architectures,
) -> Result<(), Box<NotCovered>> {
    let libraries: Vec<UncoveredLibrary> = found
        .iter()
        .flat_map(|p| p.libraries.iter().map(move |(lib, archs)| (p, lib, archs)))
        .filter(|(_, _, archs)| {
            wanted
                .iter()
                .all(|device| coverage(archs, device.sm) == Coverage::None)
        })
        .map(|(p, lib, archs)| UncoveredLibrary {
            library: lib.clone(),
            package: p.package.clone(),
            carries: archs.clone(),
        })
        .collect();
    if libraries.is_empty() {
        return Ok(());
    }
    Err(Box::new(NotCovered {
        wanted: wanted.clone(),
        libraries,
    }))
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// An entry header as real libraries have it: 64 bytes, `arch` at 28.
    fn entry(kind: u16, sm: u32, payload: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[2..4].copy_from_slice(&0x101u16.to_le_bytes());
        e[4..8].copy_from_slice(&64u32.to_le_bytes());
        e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        e[28..32].copy_from_slice(&sm.to_le_bytes());
        if kind == KIND_PTX {
            // ISA 8.1, as CUDA 12.1 writes it.
            e[24..26].copy_from_slice(&1u16.to_le_bytes());
            e[26..28].copy_from_slice(&8u16.to_le_bytes());
        }
        e.extend_from_slice(payload);
        e
    }

    fn blob(entries: &[Vec<u8>]) -> Vec<u8> {
        let payload: Vec<u8> = entries.concat();
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        b.extend_from_slice(&payload);
        b
    }

    fn parse(section: &[u8]) -> Result<Architectures, FatbinError> {
        entries(section).map(|e| entry_architectures(&e))
    }

    fn entries(section: &[u8]) -> Result<Vec<FatbinEntry>, FatbinError> {
        parse_section(&mut Cursor::new(section), 0, section.len() as u64)
    }

    #[test]
    fn the_architectures_of_every_blob_sass_then_ptx_in_order() {
        let mut section = blob(&[entry(2, 80, b"cubin"), entry(1, 90, b"ptx text")]);
        // Zero padding to the next blob's alignment.
        section.extend_from_slice(&[0; 4]);
        section.extend_from_slice(&blob(&[entry(2, 50, &[1; 10]), entry(2, 90, &[])]));
        let archs = parse(&section).unwrap();
        assert_eq!(format_list(&archs), "sm_50,sm_80,sm_90,compute_90");
        assert_eq!(parse_list("sm_50,sm_80,sm_90,compute_90").unwrap(), archs);
    }

    #[test]
    fn sizes_beyond_what_holds_them_are_malformed_not_read() {
        let good = blob(&[entry(2, 80, b"cubin")]);
        // An entry claiming an exabyte of payload.
        let mut huge = good.clone();
        huge[16 + 8..16 + 16].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert!(matches!(parse(&huge), Err(FatbinError::Malformed { .. })));
        // A blob larger than its section.
        let mut long = good.clone();
        long[8..16].copy_from_slice(&1_000_000u64.to_le_bytes());
        assert!(matches!(parse(&long), Err(FatbinError::Malformed { .. })));
        // A section that claims more than the file holds.
        let err = parse_section(&mut Cursor::new(&good), 0, 1 << 40).unwrap_err();
        assert!(matches!(err, FatbinError::Malformed { .. }), "{err}");
        // An entry header size of zero would loop forever.
        let mut zero = good.clone();
        zero[16 + 4..16 + 8].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(parse(&zero), Err(FatbinError::Malformed { .. })));
        // Not a fatbin at all.
        assert!(matches!(
            parse(&[0xff; 64]),
            Err(FatbinError::Malformed { .. })
        ));
        // Padding longer than any alignment.
        let mut padded = vec![0u8; 2 * MAX_PADDING as usize];
        padded.extend_from_slice(&good);
        assert!(matches!(parse(&padded), Err(FatbinError::Malformed { .. })));
        // A little padding is fine.
        let mut aligned = vec![0u8; 8];
        aligned.extend_from_slice(&good);
        assert_eq!(format_list(&parse(&aligned).unwrap()), "sm_80");
        // Blobs without entries, each a read, still count: the reads are bounded.
        let empty = blob(&[]);
        let many: Vec<u8> = std::iter::repeat_n(&empty[..], MAX_ENTRIES + 1)
            .flatten()
            .copied()
            .collect();
        assert!(matches!(parse(&many), Err(FatbinError::TooManyEntries)));
    }

    /// A PTX entry whose header holds no ISA (zero at 24 and 26), its text `payload`, LZ4
    /// when `lz4` gives (compressed length, decompressed size).
    fn bare_ptx(payload: &[u8], lz4: Option<(u32, u64)>) -> Vec<u8> {
        let mut e = entry(KIND_PTX, 90, payload);
        e[24..28].copy_from_slice(&[0; 4]);
        if let Some((compressed, size)) = lz4 {
            e[16..20].copy_from_slice(&compressed.to_le_bytes());
            e[40..48].copy_from_slice(&(0x2011u64).to_le_bytes());
            e[56..64].copy_from_slice(&size.to_le_bytes());
        }
        e
    }

    fn isas(section: &[u8]) -> Result<Vec<Option<String>>, FatbinError> {
        Ok(entries(section)?
            .iter()
            .map(|e| e.ptx_isa.map(|i| i.to_string()))
            .collect())
    }

    #[test]
    fn the_ptx_isa_from_the_header_else_from_the_text() {
        let text =
            b"//\n// Generated by NVIDIA NVVM Compiler\n.version 7.8\n.target sm_90\n".repeat(40);
        let block = lz4_flex::block::compress(&text);
        let section = blob(&[
            entry(KIND_SASS, 80, b"cubin"),
            entry(KIND_PTX, 90, b"ignored: the header says 8.1"),
            bare_ptx(b".version 8.5\n.target sm_90\n", None),
            bare_ptx(&block, Some((block.len() as u32, text.len() as u64))),
        ]);
        assert_eq!(
            isas(&section).unwrap(),
            [
                None,
                Some("8.1".into()),
                Some("8.5".into()),
                Some("7.8".into())
            ]
        );
        let found = entries(&section).unwrap();
        assert_eq!(
            format_ptx_isas(&entry_ptx_isas(&found)),
            "compute_90:8.5",
            "the newest ISA of each architecture"
        );
        let text_back = read_text(&mut Cursor::new(&section), found[3].text.as_ref().unwrap());
        assert_eq!(text_back.unwrap(), text);
    }

    #[test]
    fn hostile_ptx_entries_are_errors_naming_the_entry() {
        let text = b".version 7.8\n.target sm_90\n".repeat(40);
        let block = lz4_flex::block::compress(&text);
        let n = block.len() as u32;
        let cases: [(&str, Vec<u8>); 5] = [
            ("no .version", bare_ptx(b".target sm_90\n", None)),
            (
                "a compressed length past the payload",
                bare_ptx(&block, Some((n + 1, text.len() as u64))),
            ),
            (
                "an exabyte decompressed",
                bare_ptx(&block, Some((n, 1 << 60))),
            ),
            (
                "a truncated block",
                bare_ptx(&block[..block.len() / 2], Some((n / 2, text.len() as u64))),
            ),
            (
                "a size too small for the text",
                bare_ptx(&block, Some((n, 16))),
            ),
        ];
        for (case, ptx) in cases {
            let err = entries(&blob(&[ptx])).unwrap_err();
            assert!(
                matches!(err, FatbinError::Ptx { offset: 16, .. }),
                "{case}: {err}"
            );
        }
        // A 4 GiB block in a section (and blob, and entry) that claims a terabyte: refused
        // before anything is read or allocated.
        let mut huge = blob(&[bare_ptx(&block, Some((u32::MAX, 1 << 20)))]);
        huge[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        huge[16 + 8..16 + 16].copy_from_slice(&(1u64 << 39).to_le_bytes());
        let err = parse_section(&mut Cursor::new(&huge), 0, 1 << 41).unwrap_err();
        assert!(
            matches!(
                err,
                FatbinError::Ptx {
                    source: PtxError::TooLarge { .. },
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn the_ptx_annotation_reads_back() {
        let isas = PtxIsas::from([(90, PtxIsa::new(8, 1)), (121, PtxIsa::new(8, 8))]);
        assert_eq!(format_ptx_isas(&isas), "compute_90:8.1,compute_121:8.8");
        let back =
            parse_ptx_annotation("a=compute_90:8.1,compute_121:8.8;b=sm_90:8.1;c=compute_90:x;d");
        assert_eq!(back, [("a".to_string(), isas)]);
    }

    #[test]
    fn the_annotations_hold_the_union_and_each_package_in_order() {
        let package = |name: &str, libs: &[(&str, &str)]| PackageArchitectures {
            package: name.to_string(),
            libraries: libs
                .iter()
                .map(|(l, a)| (l.to_string(), parse_list(a).unwrap()))
                .collect(),
            ptx_isas: BTreeMap::new(),
        };
        let found = [
            package("pypi:b-1", &[("l/b.so", "sm_90,compute_90")]),
            package(
                "a-1-0",
                &[("lib/a.so", "sm_80"), ("lib/a2.so", "sm_70,sm_80")],
            ),
        ];
        let annotations = annotations(&found);
        assert_eq!(
            annotations,
            [
                (
                    "dev.imgbuild.cuda.architectures".to_string(),
                    "sm_70,sm_80,sm_90,compute_90".to_string()
                ),
                (
                    "dev.imgbuild.cuda.package-architectures".to_string(),
                    "a-1-0=sm_70,sm_80;pypi:b-1=sm_90,compute_90".to_string()
                ),
            ]
        );
        let back = parse_package_annotation(&annotations[1].1);
        assert_eq!(back[0], ("a-1-0".to_string(), found[1].union()));
        assert_eq!(back[1], ("pypi:b-1".to_string(), found[0].union()));
        assert!(super::annotations(&[]).is_empty());
        // An item that does not parse is left out, not an error.
        assert_eq!(parse_package_annotation("x=sm_80;y=gfx90a;z").len(), 1);
    }

    #[test]
    fn a_library_that_runs_on_none_of_the_wanted_devices_is_refused_naming_it() {
        let found = [PackageArchitectures {
            package: "libold-1.0-h0_0".into(),
            libraries: BTreeMap::from([
                (
                    "lib/old.so".to_string(),
                    parse_list("sm_60,compute_60").unwrap(),
                ),
                ("lib/new.so".to_string(), parse_list("sm_90").unwrap()),
            ]),
            ptx_isas: BTreeMap::new(),
        }];
        // 9.0 runs `new.so` by SASS, `old.so` by PTX.
        assert!(check_architectures(&found, &parse_list("sm_90").unwrap()).is_ok());
        // 5.0 runs neither.
        let err = check_architectures(&found, &parse_list("sm_50,sm_52").unwrap()).unwrap_err();
        assert_eq!(err.libraries.len(), 2);
        let message = err.to_string();
        assert!(
            message.contains("2 libraries run on none of `[cuda] architectures` (sm_50,sm_52)")
                && message.contains("`lib/old.so` (libold-1.0-h0_0) carries sm_60,compute_60"),
            "{message}"
        );
        // One of two devices is enough: neither library runs on 5.2.
        let err = check_architectures(&found, &parse_list("sm_52,sm_90").unwrap());
        assert!(err.is_ok());
        // 7.0 JIT-compiles `old.so`'s PTX but runs nothing of `new.so`.
        let only_new = check_architectures(&found, &parse_list("sm_70").unwrap()).unwrap_err();
        assert_eq!(only_new.libraries[0].library, "lib/new.so");
        assert!(
            only_new.to_string().starts_with("A library runs on none"),
            "{only_new}"
        );
    }

    #[test]
    fn libraries_are_told_by_name() {
        assert!(is_shared_library("lib/libcublas.so.12"));
        assert!(is_shared_library(
            "lib/python3.11/site-packages/x.cpython-311-x86_64-linux-gnu.so"
        ));
        assert!(!is_shared_library("lib/libcublas.a"));
        assert!(!is_shared_library("share/doc/some.sources"));
    }
}
