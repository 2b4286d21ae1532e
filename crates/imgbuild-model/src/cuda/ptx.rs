//! The PTX ISA version of a fatbin's PTX entry: which driver can JIT-compile it
//! ([`crate::cuda::compat::ptx_minimum_driver`]).
//!
//! The entry header says it (u16 minor at offset 24, u16 major at 26: `7.8` in CUDA 11.8's
//! cuRAND, `8.8` in 12.9's), and so does the PTX text itself, whose first statement is the
//! `.version 7.8` directive. The header is read first; the text only where the header holds
//! no plausible version. The text is usually LZ4-compressed (flag [`FLAG_COMPRESSED`]): a
//! raw LZ4 block of the header's compressed length (u32 at 16) that decompresses to the
//! header's size (u64 at 56), as `cuobjdump -ptx` shows it.
//!
//! A library is a stranger's file: the decompressed size is bounded ([`MAX_PTX`], and by
//! LZ4's own ratio), decoding is bounds-checked (lz4_flex's safe, checked decoder), and
//! every failure is an error, never a panic.

use crate::cuda::compat::PtxIsa;

/// Entry flag: the payload is an LZ4 block.
pub(crate) const FLAG_COMPRESSED: u64 = 0x2000;
/// The most one PTX entry may decompress to. cuRAND's largest is 3.5 MB; a claim beyond this
/// is a forged header, not a module.
pub(crate) const MAX_PTX: u64 = 64 << 20;
/// What LZ4 can at most expand to: every sequence of a block is at least one byte and yields
/// at most 255 bytes per length byte, so no honest block grows more than this.
const LZ4_MAX_RATIO: u64 = 255;
/// The most an LZ4 block of [`MAX_PTX`] bytes of text takes: incompressible input grows by a
/// length byte per 255 literals and a token. A larger block is not read (its length is a u32
/// of the header: up to 4 GiB).
const MAX_BLOCK: u64 = MAX_PTX + MAX_PTX / 255 + 16;
/// How much of the text the `.version` directive is looked for in: it is the first
/// statement, behind a few comment lines at most.
pub(crate) const VERSION_WINDOW: usize = 64 << 10;

/// Why a PTX entry's ISA could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    #[error("its compressed length {compressed} is more than its payload of {payload} bytes")]
    CompressedLength { compressed: u64, payload: u64 },
    #[error(
        "it claims {size} bytes of PTX from {compressed} compressed, more than LZ4 or the {MAX_PTX}-byte bound allows"
    )]
    TooLarge { size: u64, compressed: u64 },
    #[error("its LZ4 block does not decode: {0}")]
    Lz4(#[from] lz4_flex::block::DecompressError),
    #[error("its text does not start with a `.version` directive")]
    NoVersion,
}

/// The ISA the entry header gives, when it is a plausible one (ISA 1.0 to 99.99): an entry
/// whose fields are zero or odd says nothing, and the text is asked instead.
pub(crate) fn header_isa(minor: u16, major: u16) -> Option<PtxIsa> {
    ((1..=99).contains(&major) && minor <= 99)
        .then(|| PtxIsa::new(u32::from(major), u32::from(minor)))
}

/// Checks that `size` bytes may honestly come out of `compressed` bytes of LZ4, and that
/// neither is beyond the bounds, before anything of either size is allocated.
pub(crate) fn check_decompressed_size(size: u64, compressed: u64) -> Result<(), PtxError> {
    let most = compressed.saturating_mul(LZ4_MAX_RATIO).min(MAX_PTX);
    if size > most || compressed > MAX_BLOCK {
        return Err(PtxError::TooLarge { size, compressed });
    }
    Ok(())
}

/// Decompresses the raw LZ4 block `compressed` into at most `size` bytes, `size` first
/// checked by [`check_decompressed_size`]. Output past `size`, a match reaching before the
/// start and a truncated block are errors.
pub fn decompress(compressed: &[u8], size: u64) -> Result<Vec<u8>, PtxError> {
    check_decompressed_size(size, compressed.len() as u64)?;
    let mut out = vec![0u8; usize::try_from(size).expect("bounded by MAX_PTX")];
    let written = lz4_flex::block::decompress_into(compressed, &mut out)?;
    out.truncate(written);
    Ok(out)
}

/// The ISA of the `.version X.Y` directive that starts `text` (after white space and `//`
/// or `/* */` comments), looked for in its first [`VERSION_WINDOW`] bytes.
pub fn version_directive(text: &[u8]) -> Result<PtxIsa, PtxError> {
    let text = &text[..text.len().min(VERSION_WINDOW)];
    let rest = skip_comments(text).ok_or(PtxError::NoVersion)?;
    let rest = rest.strip_prefix(b".version").ok_or(PtxError::NoVersion)?;
    let blank = rest
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t'))
        .count();
    if blank == 0 {
        return Err(PtxError::NoVersion);
    }
    let rest = &rest[blank..];
    let token = rest
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .count();
    std::str::from_utf8(&rest[..token])
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(PtxError::NoVersion)
}

/// `text` from its first statement on: white space and comments skipped. `None` when a
/// block comment does not end.
fn skip_comments(mut text: &[u8]) -> Option<&[u8]> {
    loop {
        text = text.trim_ascii_start();
        if let Some(rest) = text.strip_prefix(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            text = &rest[end..];
        } else if let Some(rest) = text.strip_prefix(b"/*") {
            let end = rest.windows(2).position(|w| w == b"*/")?;
            text = &rest[end + 2..];
        } else {
            return Some(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &[u8] = b"//\n// Generated by NVIDIA NVVM Compiler\n/* a block\ncomment */\n.version 8.5\n.target sm_90\n.address_size 64\n";

    #[test]
    fn the_version_directive_after_comments() {
        assert_eq!(version_directive(MODULE).unwrap(), PtxIsa::new(8, 5));
        assert_eq!(
            version_directive(b".version 7.8\n").unwrap(),
            PtxIsa::new(7, 8)
        );
        assert_eq!(
            version_directive(b"\n\t.version\t10.0 // x").unwrap(),
            PtxIsa::new(10, 0)
        );
        for bad in [
            &b""[..],
            b".target sm_90\n.version 8.5\n",
            b".versions 8.5",
            b".version8.5",
            b".version 8",
            b".version 8.5.1",
            b"/* never closed .version 8.5",
            b".version 123.0",
        ] {
            assert!(
                version_directive(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Beyond the window it is not looked for.
        let mut late = vec![b' '; VERSION_WINDOW];
        late.extend_from_slice(b".version 8.5\n");
        assert!(version_directive(&late).is_err());
    }

    #[test]
    fn the_header_isa_only_when_plausible() {
        assert_eq!(header_isa(8, 7), Some(PtxIsa::new(7, 8)));
        assert_eq!(header_isa(0, 0), None);
        assert_eq!(header_isa(1, 100), None);
        assert_eq!(header_isa(100, 8), None);
    }

    #[test]
    fn lz4_round_trip_and_its_bounds() {
        let text: Vec<u8> = MODULE.iter().copied().cycle().take(10_000).collect();
        let block = lz4_flex::block::compress(&text);
        assert!(block.len() < text.len());
        let out = decompress(&block, text.len() as u64).unwrap();
        assert_eq!(out, text);
        assert_eq!(version_directive(&out).unwrap(), PtxIsa::new(8, 5));
        // A header that claims a little more (padding) is fine: the output is what decodes.
        assert_eq!(decompress(&block, text.len() as u64 + 8).unwrap(), text);
    }

    #[test]
    fn hostile_lz4_is_an_error_never_a_panic_or_a_large_allocation() {
        let text: Vec<u8> = MODULE.iter().copied().cycle().take(10_000).collect();
        let block = lz4_flex::block::compress(&text);
        // Truncated: every cut of the block.
        for cut in 0..block.len() {
            let got = decompress(&block[..cut], text.len() as u64);
            assert!(got.as_ref().map_or(true, |o| o != &text), "cut {cut}");
        }
        // Over-long: more output than the header says.
        assert!(matches!(
            decompress(&block, text.len() as u64 - 1),
            Err(PtxError::Lz4(_))
        ));
        // A match reaching before the start of the output.
        assert!(matches!(
            decompress(
                &[0x10, b'a', 0x08, 0x00, 0x50, b'x', b'x', b'x', b'x', b'x'],
                64
            ),
            Err(PtxError::Lz4(_))
        ));
        // A literal length running past the input.
        assert!(matches!(
            decompress(&[0xf0, 0xff, 0xff, 0x10], 1000),
            Err(PtxError::Lz4(_))
        ));
        // Sizes no honest block has are refused before anything is allocated.
        assert!(matches!(
            decompress(&block, u64::MAX),
            Err(PtxError::TooLarge { .. })
        ));
        assert!(matches!(
            decompress(&[0u8; 4], 4 * LZ4_MAX_RATIO + 1),
            Err(PtxError::TooLarge { .. })
        ));
        assert!(check_decompressed_size(MAX_PTX + 1, MAX_PTX).is_err());
        assert!(check_decompressed_size(MAX_PTX, MAX_PTX).is_ok());
        // A block of 4 GiB (the header's u32) is not read, whatever size it claims.
        assert!(check_decompressed_size(16, u64::from(u32::MAX)).is_err());
        assert!(check_decompressed_size(MAX_PTX, MAX_BLOCK).is_ok());
        // Random bytes: an error or some output, within the bound, never a panic.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let junk: Vec<u8> = (0..64)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if let Ok(out) = decompress(&junk, 4096) {
                assert!(out.len() <= 4096);
            }
        }
    }
}
