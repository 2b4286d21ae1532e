//! A remote wheel's `METADATA` read with HTTP range requests, as uv does for an index without
//! PEP 658 metadata: the zip's end of central directory from the file's tail, then the
//! central directory, then the one member (each from the tail when it is there), instead of
//! the whole wheel (a CUDA wheel is gigabytes; its metadata a few kilobytes).
//!
//! Only a server whose `HEAD` says `Accept-Ranges: bytes` is asked. Every range is open-ended
//! (`bytes=N-`), which every server with ranges honours, and the body is read only as far as
//! needed: what a wheel holds after its
//! `*.dist-info` (the central directory) is small, as wheel builders write the dist-info
//! last. Anything this reader does not take on (no `206`, a zip64 directory out of the tail,
//! two `METADATA` members, a compression other than stored or deflate) gives `None`, and the
//! caller downloads the wheel whole, as before.

use rattler_networking::LazyClient;
use reqwest::{StatusCode, header};
use url::Url;

use crate::compression::bounded::{Bound, read_to_end_bounded};

/// The tail read first: the end of central directory record with the longest comment a zip
/// may have, which is where the record is found.
const TAIL: u64 = 22 + 0xFFFF;

/// Metadata is small; a huge one is a zip bomb, not metadata (as [`super::resolve`] bounds
/// it in a downloaded wheel).
const LIMIT: u64 = 64 << 20;

/// What the range requests read: the metadata's text and the body bytes received.
#[derive(Debug)]
pub(crate) struct RangeRead {
    pub text: String,
    pub received: u64,
}

/// Where a zip's central directory is.
#[derive(Debug, PartialEq, Eq)]
struct Directory {
    offset: u64,
    size: u64,
}

/// The `METADATA` member, as the central directory describes it.
#[derive(Debug, PartialEq, Eq)]
struct MetadataMember {
    method: u16,
    crc32: u32,
    compressed: u64,
    size: u64,
    /// Of its local header.
    offset: u64,
}

/// The metadata of the wheel at `url`, or `None` when it cannot be read by ranges (and the
/// wheel is to be downloaded whole). Why a read gave up is logged, not an error: the
/// download that follows reports what is wrong with the wheel, if anything is.
pub(crate) async fn read_metadata(client: &LazyClient, url: &Url) -> Option<RangeRead> {
    match read(client, url).await {
        Ok(read) => Some(read),
        Err(reason) => {
            tracing::debug!("{url}: METADATA not read by ranges ({reason}); downloading the wheel");
            None
        }
    }
}

async fn read(client: &LazyClient, url: &Url) -> Result<RangeRead, String> {
    let length = content_length(client, url).await?;
    let mut received = 0;
    let tail_start = length.saturating_sub(TAIL);
    let tail = Range::open(client, url, tail_start)
        .await?
        .take(length - tail_start, &mut received)
        .await?;
    let directory = end_of_directory(&tail, tail_start)?;
    let listing = match directory.offset.checked_sub(tail_start) {
        Some(at) => slice(&tail, at, directory.size)?.to_vec(),
        None => {
            Range::open(client, url, directory.offset)
                .await?
                .take(directory.size, &mut received)
                .await?
        }
    };
    let member = find_metadata(&listing)?;
    // Wheel builders write the dist-info last: its METADATA is most often in the tail too.
    let raw = match member.offset.checked_sub(tail_start) {
        Some(at) => {
            let data_at = at + local_data_offset(slice(&tail, at, 30)?)?;
            slice(&tail, data_at, member.compressed)?.to_vec()
        }
        None => member_by_range(client, url, &member, &mut received).await?,
    };
    let text = inflate(&member, &raw)?;
    Ok(RangeRead { text, received })
}

/// The member's data, by one range from its local header (which says how far the data
/// starts).
async fn member_by_range(
    client: &LazyClient,
    url: &Url,
    member: &MetadataMember,
    received: &mut u64,
) -> Result<Vec<u8>, String> {
    let mut range = Range::open(client, url, member.offset).await?;
    let header = range.take(30, received).await?;
    range
        .take(local_data_offset(&header)? - 30, received)
        .await?;
    range.take(member.compressed, received).await
}

/// The wheel's length, from a `HEAD`.
async fn content_length(client: &LazyClient, url: &Url) -> Result<u64, String> {
    let response = client
        .client()
        .head(url.clone())
        .send()
        .await
        .map_err(|e| crate::http::error_chain(&e))?;
    if response.status() != StatusCode::OK {
        return Err(format!("HEAD answered {}", response.status()));
    }
    // As uv: only a server that says it takes ranges is asked for them, so one that does not
    // costs a HEAD, not a whole body sent for nothing.
    let ranges = response.headers().get(header::ACCEPT_RANGES);
    if ranges.is_none_or(|v| v != "bytes") {
        return Err("the server does not say `Accept-Ranges: bytes`".into());
    }
    response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no Content-Length".to_string())
}

/// The file from a byte on, asked for as `bytes=START-` and answered `206` from there, read
/// only as far as it is taken: dropping it ends the transfer of the rest.
struct Range {
    response: reqwest::Response,
    /// Received but not taken yet.
    buffered: Vec<u8>,
}

impl Range {
    async fn open(client: &LazyClient, url: &Url, start: u64) -> Result<Range, String> {
        let response = client
            .client()
            .get(url.clone())
            .header(header::RANGE, format!("bytes={start}-"))
            .send()
            .await
            .map_err(|e| crate::http::error_chain(&e))?;
        if response.status() != StatusCode::PARTIAL_CONTENT {
            return Err(format!("a range answered {}", response.status()));
        }
        let from = response
            .headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<u64>().ok());
        if from != Some(start) {
            return Err(format!("a range from {start} answered from {from:?}"));
        }
        Ok(Range {
            response,
            buffered: Vec::new(),
        })
    }

    /// The next `count` bytes, counting what arrives in `received`.
    async fn take(&mut self, count: u64, received: &mut u64) -> Result<Vec<u8>, String> {
        if count > LIMIT {
            return Err(format!("{count} bytes to read for the metadata"));
        }
        while (self.buffered.len() as u64) < count {
            let chunk = self
                .response
                .chunk()
                .await
                .map_err(|e| crate::http::error_chain(&e))?
                .ok_or("a range ended early")?;
            *received += chunk.len() as u64;
            self.buffered.extend_from_slice(&chunk);
        }
        let rest = self.buffered.split_off(count as usize);
        Ok(std::mem::replace(&mut self.buffered, rest))
    }
}

fn slice(bytes: &[u8], at: u64, len: u64) -> Result<&[u8], String> {
    let end = at.checked_add(len).ok_or("an offset past the file")?;
    bytes
        .get(at as usize..end as usize)
        .ok_or_else(|| "a record past what was read".to_string())
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, String> {
    let b = bytes.get(at..at + 2).ok_or("a record cut short")?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, String> {
    let b = bytes.get(at..at + 4).ok_or("a record cut short")?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, String> {
    let b = bytes.get(at..at + 8).ok_or("a record cut short")?;
    Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// The central directory the end of central directory record in `tail` (which starts at
/// `tail_start` in the file) points to; zip64 when the record says so and its zip64 record
/// is in the tail.
fn end_of_directory(tail: &[u8], tail_start: u64) -> Result<Directory, String> {
    let at = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..].starts_with(b"PK\x05\x06"))
        .ok_or("no end of central directory record")?;
    let size = u32_at(tail, at + 12)?;
    let offset = u32_at(tail, at + 16)?;
    if size != u32::MAX && offset != u32::MAX {
        return Ok(Directory {
            offset: offset.into(),
            size: size.into(),
        });
    }
    // The zip64 locator sits right before the record and says where the zip64 record is.
    let locator = at.checked_sub(20).ok_or("no zip64 locator")?;
    if !tail[locator..].starts_with(b"PK\x06\x07") {
        return Err("no zip64 locator".into());
    }
    let record = u64_at(tail, locator + 8)?
        .checked_sub(tail_start)
        .ok_or("a zip64 record before the tail")? as usize;
    if !tail
        .get(record..)
        .is_some_and(|r| r.starts_with(b"PK\x06\x06"))
    {
        return Err("no zip64 end of central directory record".into());
    }
    Ok(Directory {
        size: u64_at(tail, record + 40)?,
        offset: u64_at(tail, record + 48)?,
    })
}

/// The one `NAME.dist-info/METADATA` at the top of the wheel, in the central directory
/// `listing`.
fn find_metadata(listing: &[u8]) -> Result<MetadataMember, String> {
    let mut found = None;
    let mut at = 0;
    while listing.len() >= at + 46 && listing[at..].starts_with(b"PK\x01\x02") {
        let name_len = u16_at(listing, at + 28)? as usize;
        let extra_len = u16_at(listing, at + 30)? as usize;
        let comment_len = u16_at(listing, at + 32)? as usize;
        let name = listing
            .get(at + 46..at + 46 + name_len)
            .ok_or("an entry cut short")?;
        if is_metadata(name) {
            if found.is_some() {
                return Err("two METADATA members".into());
            }
            let extra = listing
                .get(at + 46 + name_len..at + 46 + name_len + extra_len)
                .ok_or("an entry cut short")?;
            found = Some(member(&listing[at..], extra)?);
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    found.ok_or_else(|| "no *.dist-info/METADATA".to_string())
}

/// The rule [`super::resolve::wheel_metadata`] reads a downloaded wheel by.
fn is_metadata(name: &[u8]) -> bool {
    std::str::from_utf8(name)
        .ok()
        .and_then(|n| n.strip_suffix("/METADATA"))
        .is_some_and(|dir| dir.ends_with(".dist-info") && !dir.contains('/'))
}

/// A central directory entry's member, its zip64 sizes and offset taken from `extra`.
fn member(entry: &[u8], extra: &[u8]) -> Result<MetadataMember, String> {
    let mut zip64 = zip64_fields(extra)?.into_iter();
    let mut wide = |narrow: u32| match narrow {
        u32::MAX => zip64.next().ok_or("a zip64 field missing"),
        n => Ok(u64::from(n)),
    };
    // The zip64 extra holds the sizes, then the offset, of those that overflowed.
    let size = wide(u32_at(entry, 24)?)?;
    let compressed = wide(u32_at(entry, 20)?)?;
    let offset = wide(u32_at(entry, 42)?)?;
    Ok(MetadataMember {
        method: u16_at(entry, 10)?,
        crc32: u32_at(entry, 16)?,
        compressed,
        size,
        offset,
    })
}

/// The values of the zip64 extended information field (id 1) of `extra`, in order.
fn zip64_fields(extra: &[u8]) -> Result<Vec<u64>, String> {
    let mut at = 0;
    while at + 4 <= extra.len() {
        let (id, len) = (u16_at(extra, at)?, u16_at(extra, at + 2)? as usize);
        let body = extra
            .get(at + 4..at + 4 + len)
            .ok_or("an extra field cut short")?;
        if id == 1 {
            return Ok(body
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect());
        }
        at += 4 + len;
    }
    Ok(Vec::new())
}

/// Where a member's data starts after its local header (whose name and extra field may be
/// longer than the central directory's).
fn local_data_offset(header: &[u8]) -> Result<u64, String> {
    if !header.starts_with(b"PK\x03\x04") {
        return Err("no local header where the directory points".into());
    }
    Ok(30 + u64::from(u16_at(header, 26)?) + u64::from(u16_at(header, 28)?))
}

/// The member's bytes, stored or deflated, checked against its size and CRC-32.
fn inflate(member: &MetadataMember, raw: &[u8]) -> Result<String, String> {
    if member.size > LIMIT {
        return Err("METADATA larger than 64 MiB".into());
    }
    let bytes = match member.method {
        0 => raw.to_vec(),
        // Bounded by the size the directory declares: more is no METADATA of this wheel.
        8 => read_to_end_bounded(
            flate2::read::DeflateDecoder::new(raw),
            Bound::new(
                member.size,
                "METADATA",
                "the size the zip directory declares",
            ),
        )
        .map_err(|e| format!("METADATA does not inflate: {e}"))?,
        method => return Err(format!("METADATA compressed by method {method}")),
    };
    let mut crc = flate2::Crc::new();
    crc.update(&bytes);
    if bytes.len() as u64 != member.size || crc.sum() != member.crc32 {
        return Err("METADATA does not match its size or CRC-32".into());
    }
    String::from_utf8(bytes).map_err(|_| "METADATA is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A zip of `members`, deflated, with `padding` stored bytes in front of them.
    fn zip(members: &[(&str, &str)], padding: usize) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let stored = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        zip.start_file("pad/blob.bin", stored).unwrap();
        zip.write_all(&vec![7u8; padding]).unwrap();
        let deflated = zip::write::SimpleFileOptions::default();
        for (name, body) in members {
            zip.start_file(*name, deflated).unwrap();
            zip.write_all(body.as_bytes()).unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    /// The steps of [`read`] over bytes in memory, the tail as [`TAIL`] cuts it.
    fn read_local(file: &[u8]) -> Result<String, String> {
        let tail_start = (file.len() as u64).saturating_sub(TAIL);
        let directory = end_of_directory(&file[tail_start as usize..], tail_start)?;
        let listing = slice(file, directory.offset, directory.size)?;
        let member = find_metadata(listing)?;
        let data_at = member.offset + local_data_offset(&file[member.offset as usize..])?;
        inflate(&member, slice(file, data_at, member.compressed)?)
    }

    const METADATA: &str = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n";

    #[test]
    fn the_metadata_is_found_through_the_directory_at_the_end() {
        for padding in [0, 200 << 10] {
            let file = zip(
                &[
                    ("demo.py", "x = 1\n"),
                    ("demo-1.0.dist-info/METADATA", METADATA),
                ],
                padding,
            );
            assert_eq!(read_local(&file).unwrap(), METADATA);
        }
    }

    #[test]
    fn what_the_reader_does_not_take_on_is_left_to_the_whole_download() {
        let nested = zip(&[("pkg/demo-1.0.dist-info/METADATA", METADATA)], 0);
        assert!(read_local(&nested).unwrap_err().contains("no *.dist-info"));
        let twice = zip(
            &[
                ("a-1.0.dist-info/METADATA", METADATA),
                ("b-1.0.dist-info/METADATA", METADATA),
            ],
            0,
        );
        assert!(read_local(&twice).unwrap_err().contains("two METADATA"));
        assert!(end_of_directory(b"not a zip at all, just bytes", 0).is_err());
        let mut corrupt = zip(&[("demo-1.0.dist-info/METADATA", METADATA)], 0);
        // The last directory entry is METADATA's (the padding comes first).
        let at = corrupt
            .windows(4)
            .rposition(|w| w == b"PK\x01\x02")
            .unwrap();
        corrupt[at + 16] ^= 0xFF; // the CRC-32 the directory gives
        assert!(read_local(&corrupt).unwrap_err().contains("CRC-32"));
    }
}
