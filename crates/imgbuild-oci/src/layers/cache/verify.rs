//! The full check of a cached gzip or zstd blob: it must decompress to exactly the tar a
//! cold build writes for the layer, and be the bytes its key file names.
//!
//! The expected tar is written again from the staged files (no compression, so a fraction of
//! a build's cost) and compared, byte for byte, with the blob decompressed. That holds every
//! entry's path, kind, mode, owner, size, link target and content to what the key was made
//! from, and also every header field and padding byte no entry list names. Decompression is
//! bounded by the expected tar: the comparison never reads more than one byte past it.

use std::{
    fs::File,
    io::{BufReader, Read, Seek, Write},
};

use sha2::{Digest, Sha256};

use super::CachedBlob;
use crate::layers::{compress::Compression, tar::TarError};

/// Why a cached entry is not what its key says.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    #[error("its tar differs from the layer's at byte {0}")]
    Content(u64),
    #[error("its tar is longer than the layer's {0} bytes")]
    Longer(u64),
    #[error("it does not decompress: {0}")]
    Corrupt(std::io::Error),
    #[error("its blob is not the one its key file names ({0})")]
    Blob(&'static str),
    #[error("the layer's expected tar cannot be written: {0}")]
    Expected(TarError),
}

/// Checks the gzip or zstd blob `file` against `cached` and the tar `write_tar` makes.
pub fn plain(
    file: &mut File,
    cached: &CachedBlob,
    compression: Compression,
    write_tar: &dyn Fn(&mut dyn Write) -> Result<(), TarError>,
) -> Result<(), Mismatch> {
    if !cached.annotations.is_empty() {
        return Err(Mismatch::Blob("annotations on a plain layer"));
    }
    file.rewind().map_err(Mismatch::Corrupt)?;
    let compressed = BufReader::with_capacity(1 << 20, &*file);
    let mut decoder: Box<dyn Read + '_> = match compression {
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(compressed).map_err(Mismatch::Corrupt)?,
        ),
        _ => Box::new(flate2::bufread::MultiGzDecoder::new(compressed)),
    };
    let mut compare = Comparing {
        actual: &mut decoder,
        buf: vec![0; 1 << 16],
        hasher: Sha256::new(),
        offset: 0,
        differs: None,
    };
    let written = write_tar(&mut compare);
    let (offset, differs, diff_id) = (
        compare.offset,
        compare.differs.take(),
        compare.hasher.finalize(),
    );
    if let Some(why) = differs {
        return Err(why);
    }
    written.map_err(Mismatch::Expected)?;
    if decoder.read(&mut [0u8; 1]).map_err(Mismatch::Corrupt)? != 0 {
        return Err(Mismatch::Longer(offset));
    }
    drop(decoder);
    check_claims(
        file,
        cached,
        offset,
        &format!("sha256:{}", hex::encode(diff_id)),
    )
}

/// The blob's own digest and size, and the key file's diff_id and tar size, against what
/// was read and compared.
fn check_claims(
    file: &mut File,
    cached: &CachedBlob,
    tar_size: u64,
    diff_id: &str,
) -> Result<(), Mismatch> {
    if cached.tar_size != tar_size || cached.diff_id != diff_id {
        return Err(Mismatch::Blob("its diff_id or tar size"));
    }
    let (digest, size) = super::digest_of(file).map_err(Mismatch::Corrupt)?;
    if size != cached.size || digest != cached.digest {
        return Err(Mismatch::Blob("its digest or size"));
    }
    Ok(())
}

/// A writer that compares what is written with what `actual` reads, and hashes it.
struct Comparing<'a> {
    actual: &'a mut dyn Read,
    buf: Vec<u8>,
    hasher: Sha256,
    offset: u64,
    differs: Option<Mismatch>,
}

impl Write for Comparing<'_> {
    fn write(&mut self, expected: &[u8]) -> std::io::Result<usize> {
        if self.differs.is_some() {
            return Err(std::io::Error::other("the cached tar differs"));
        }
        let n = expected.len().min(self.buf.len());
        let got = &mut self.buf[..n];
        if let Err(err) = self.actual.read_exact(got) {
            self.differs = Some(match err.kind() {
                std::io::ErrorKind::UnexpectedEof => Mismatch::Content(self.offset),
                _ => Mismatch::Corrupt(err),
            });
            return Err(std::io::Error::other("the cached tar differs"));
        }
        // Slices compare as one memcmp; the byte is looked for only once they differ.
        if *got != expected[..n] {
            let at = got.iter().zip(expected).take_while(|(a, b)| a == b).count();
            self.differs = Some(Mismatch::Content(self.offset + at as u64));
            return Err(std::io::Error::other("the cached tar differs"));
        }
        self.hasher.update(&expected[..n]);
        self.offset += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
