//! Reading what a stranger compressed with a bound on what comes out. A kilobyte of zstd can
//! be a terabyte of zeros: every decompression in imgbuild reads through [`Bounded`] (or
//! counts into [`BoundedSink`]), which refuses the stream with [`TooLarge`], naming its
//! subject and the limit, once more than the limit has come out.

use std::io::{Read, Write};

/// How far a compressed input may expand by default: [`MAX_RATIO`] times its own size, and
/// never less than [`MIN_UNPACKED`]. Real inputs stay far below: packages and layers of CUDA
/// libraries unpack to 3 to 5 times their size, text-heavy ones to 10 to 20, a layer of
/// nothing but empty files to under 100; gzip cannot pass 1032, so only zstd or bzip2 of
/// long runs of zeros (a bomb) do.
pub const MAX_RATIO: u64 = 1000;
/// The bound for small inputs, whose ratio says little (tar headers alone compress well).
pub const MIN_UNPACKED: u64 = 32 << 20;
/// Replaces [`MAX_RATIO`] (a positive integer), for an image that really holds a huge
/// file of zeros.
pub const RATIO_ENV: &str = "IMGBUILD_MAX_UNPACK_RATIO";

/// More bytes came out of `subject` than `max`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subject} unpacks to more than {max} bytes ({rule}); refused as a decompression bomb")]
pub struct TooLarge {
    pub subject: String,
    pub max: u64,
    /// Where the limit comes from and how to change it.
    pub rule: String,
}

impl TooLarge {
    /// The [`TooLarge`] an I/O error carries, as [`Bounded`] returns it.
    pub fn in_io(err: &std::io::Error) -> Option<&TooLarge> {
        err.get_ref()?.downcast_ref()
    }
}

/// The most bytes that may come out of one subject, and the names for its refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub max: u64,
    pub subject: String,
    pub rule: String,
}

impl Bound {
    pub fn new(max: u64, subject: impl Into<String>, rule: impl Into<String>) -> Self {
        Bound {
            max,
            subject: subject.into(),
            rule: rule.into(),
        }
    }

    /// [`MAX_RATIO`] (or `$IMGBUILD_MAX_UNPACK_RATIO`) times `compressed` bytes, at least
    /// [`MIN_UNPACKED`].
    pub fn ratio(compressed: u64, subject: impl Into<String>) -> Self {
        let ratio = ratio();
        Bound::new(
            compressed.saturating_mul(ratio).max(MIN_UNPACKED),
            subject,
            format!(
                "{ratio} times its {compressed} bytes, at least {MIN_UNPACKED}; {RATIO_ENV} sets the ratio"
            ),
        )
    }

    pub(crate) fn exceeded(&self) -> TooLarge {
        TooLarge {
            subject: self.subject.clone(),
            max: self.max,
            rule: self.rule.clone(),
        }
    }

    fn error(&self) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::FileTooLarge, self.exceeded())
    }
}

/// The ratio of [`Bound::ratio`]: `$IMGBUILD_MAX_UNPACK_RATIO` when it is a positive
/// integer, else [`MAX_RATIO`].
pub fn ratio() -> u64 {
    env_u64(RATIO_ENV).unwrap_or(MAX_RATIO)
}

/// A positive integer from the environment variable `name`; anything else is ignored (the
/// default applies), which [`env_u64_warning`] tells the user.
pub fn env_u64(name: &str) -> Option<u64> {
    positive(&std::env::var(name).ok()?)
}

/// The warning for `name` when it is set to something [`env_u64`] ignores.
pub fn env_u64_warning(name: &str) -> Option<String> {
    let value = std::env::var(name).ok()?;
    match positive(&value) {
        Some(_) => None,
        None => Some(format!(
            "{name}={value} is not a positive integer; using the default"
        )),
    }
}

fn positive(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok().filter(|n| *n > 0)
}

/// A reader that yields at most `bound.max` bytes of `inner` and fails with [`TooLarge`]
/// (kind `FileTooLarge`) when there are more. It asks `inner` for one byte past the bound
/// at most, so a bomb is decompressed no further than that.
#[derive(Debug)]
pub struct Bounded<R> {
    inner: R,
    bound: Bound,
    read: u64,
}

impl<R> Bounded<R> {
    pub fn new(inner: R, bound: Bound) -> Self {
        Bounded {
            inner,
            bound,
            read: 0,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.bound.max.saturating_sub(self.read).saturating_add(1);
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        let n = self.inner.read(&mut buf[..want])?;
        self.read += n as u64;
        if self.read > self.bound.max {
            return Err(self.bound.error());
        }
        Ok(n)
    }
}

/// Reads `reader` to its end into memory, refusing more than `bound.max` bytes.
pub fn read_to_end_bounded(reader: impl Read, bound: Bound) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    Bounded::new(reader, bound).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A writer that discards what it is given and fails with [`TooLarge`] once more than
/// `bound.max` bytes were written: the end of a chain of `write` decoders that measures what
/// a stream decompresses to without keeping it.
#[derive(Debug)]
pub(crate) struct BoundedSink {
    bound: Bound,
    written: u64,
}

impl BoundedSink {
    pub(crate) fn new(bound: Bound) -> Self {
        BoundedSink { bound, written: 0 }
    }
}

impl Write for BoundedSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written = self.written.saturating_add(buf.len() as u64);
        if self.written > self.bound.max {
            return Err(self.bound.error());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(max: u64) -> Bound {
        Bound::new(max, "`x`", "a test")
    }

    #[test]
    fn reads_up_to_the_bound_and_refuses_one_byte_more() {
        assert_eq!(
            read_to_end_bounded(&[7u8; 10][..], bound(10))
                .unwrap()
                .len(),
            10
        );
        let err = read_to_end_bounded(&[7u8; 11][..], bound(10)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
        let too_large = TooLarge::in_io(&err).unwrap();
        assert_eq!(too_large.max, 10);
        assert_eq!(
            too_large.to_string(),
            "`x` unpacks to more than 10 bytes (a test); refused as a decompression bomb"
        );
    }

    #[test]
    fn a_zstd_bomb_is_decompressed_no_further_than_the_bound() {
        let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 3).unwrap();
        let decoder = zstd::stream::read::Decoder::new(&bomb[..]).unwrap();
        let mut reader = Bounded::new(decoder, bound(1 << 20));
        let err = std::io::copy(&mut reader, &mut std::io::sink()).unwrap_err();
        assert!(TooLarge::in_io(&err).is_some());
        assert_eq!(reader.read, (1 << 20) + 1);
    }

    #[test]
    fn the_sink_counts_what_a_write_decoder_gives_it() {
        let bomb = zstd::bulk::compress(&vec![0u8; 8 << 20], 3).unwrap();
        let mut decoder =
            zstd::stream::write::Decoder::new(BoundedSink::new(bound(1 << 20))).unwrap();
        let err = decoder.write_all(&bomb).unwrap_err();
        assert!(TooLarge::in_io(&err).is_some());
        let mut fine = zstd::stream::write::Decoder::new(BoundedSink::new(bound(8 << 20))).unwrap();
        fine.write_all(&bomb).unwrap();
        fine.flush().unwrap();
    }

    #[test]
    fn the_ratio_bound_has_a_floor() {
        assert_eq!(Bound::ratio(10, "x").max, MIN_UNPACKED);
        assert_eq!(Bound::ratio(1 << 30, "x").max, (1 << 30) * MAX_RATIO);
    }
}
