//! The blobs of an image layout (`DIR/blobs/sha256/<hex>`) or of the pull cache
//! (`CACHE/<hex>`), opened only as what their descriptor says they are: a regular file
//! beneath the store's directory (no symbolic link on the way, no fifo or device, opened
//! without blocking: [`crate::fs::open_input_beneath`]), exactly the descriptor's size, and
//! hashing to its digest before anything read from it counts. A base image layout comes
//! from strangers as much as a recipe does.

use std::{
    cell::RefCell,
    io::Read,
    path::{Path, PathBuf},
    rc::Rc,
};

use oci_spec::image::Descriptor;
use sha2::{Digest, Sha256};

use super::read_error::ReadError;

/// Manifests, indexes, configs and `index.json` larger than this are refused unread, as
/// containerd refuses them (its 4 MiB manifest limit): a real one is a few KiB.
pub const MAX_JSON_BLOB: u64 = 4 << 20;

/// Where a layout's (or the cache's) blobs are: `root/prefix/<hex>`.
#[derive(Debug, Clone)]
pub struct BlobStore {
    /// The directory nothing is read outside of: the layout, or the cache.
    root: PathBuf,
    /// The blobs' directory beneath it (`blobs/sha256`, or nothing for the cache).
    prefix: PathBuf,
}

impl BlobStore {
    /// The blobs of the image layout at `dir`.
    pub(crate) fn in_layout(dir: &Path) -> Self {
        BlobStore {
            root: dir.to_path_buf(),
            prefix: PathBuf::from("blobs/sha256"),
        }
    }

    /// Blobs stored flat, by hex digest, in `dir` (the pull cache).
    pub(crate) fn flat(dir: &Path) -> Self {
        BlobStore {
            root: dir.to_path_buf(),
            prefix: PathBuf::new(),
        }
    }

    /// The path of blob `sha256:<hex>`, for messages and writers.
    pub fn path(&self, digest: &str) -> PathBuf {
        self.root.join(self.relative(digest))
    }

    fn relative(&self, digest: &str) -> PathBuf {
        self.prefix.join(digest.trim_start_matches("sha256:"))
    }

    /// Opens the blob `descriptor` names, refused unless it is a regular file beneath the
    /// store of exactly the descriptor's size (a blob larger than it says would be read on
    /// and on; a shorter one is damaged). Its digest is checked by whoever reads it.
    pub fn open(&self, descriptor: &Descriptor) -> Result<std::fs::File, ReadError> {
        let digest = descriptor.digest().to_string();
        let path = self.path(&digest);
        let file = match crate::fs::open_input_beneath(&self.root, &self.relative(&digest)) {
            Ok(file) => file,
            Err(err) if err.is_not_found() => {
                return Err(ReadError::Missing {
                    layout: self.root.clone(),
                    digest,
                });
            }
            Err(err) => {
                return Err(ReadError::Read {
                    path,
                    source: err.into(),
                });
            }
        };
        let size = file
            .metadata()
            .map_err(|source| ReadError::Read { path, source })?
            .len();
        if size != descriptor.size() {
            return Err(self.size_error(descriptor, size));
        }
        Ok(file)
    }

    /// The blob `descriptor` names as it is read, hashed on the way, and the check that
    /// holds what was read to the descriptor once the reader is done with it.
    pub fn open_checked(
        &self,
        descriptor: &Descriptor,
    ) -> Result<(HashingReader, BlobCheck), ReadError> {
        let file = self.open(descriptor)?;
        let path = self.path(descriptor.digest().as_ref());
        // A second descriptor of the same open file shares its offset: the check reads on
        // from wherever the reader stopped.
        let rest = file.try_clone().map_err(|source| ReadError::Read {
            path: path.clone(),
            source,
        })?;
        let state = Rc::new(RefCell::new((Sha256::new(), 0u64)));
        let reader = HashingReader {
            file,
            state: state.clone(),
        };
        let check = BlobCheck {
            rest: HashingReader { file: rest, state },
            store: self.clone(),
            descriptor: descriptor.clone(),
            path,
        };
        Ok((reader, check))
    }

    /// The bytes of the blob `descriptor` names, at most `max` (its descriptor's size is
    /// held to that before anything is opened), checked against its digest.
    pub fn read(&self, descriptor: &Descriptor, max: u64) -> Result<Vec<u8>, ReadError> {
        if descriptor.size() > max {
            return Err(ReadError::TooLarge {
                layout: self.root.clone(),
                digest: descriptor.digest().to_string(),
                size: descriptor.size(),
                max,
            });
        }
        let (mut reader, check) = self.open_checked(descriptor)?;
        let mut bytes = Vec::with_capacity(descriptor.size() as usize);
        (&mut reader)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| ReadError::Read {
                path: check.path.clone(),
                source,
            })?;
        check.finish()?;
        Ok(bytes)
    }

    /// The bytes of blob `digest` where no descriptor gives its size (a manifest known by
    /// digest alone): at most `max`, opened as [`Self::open`] opens blobs, checked against
    /// the digest.
    pub fn read_named(&self, digest: &str, max: u64) -> Result<Vec<u8>, ReadError> {
        let path = self.path(digest);
        let bytes = crate::fs::read_input_beneath(&self.root, &self.relative(digest), max)
            .map_err(|source| ReadError::Read {
                path,
                source: source.into(),
            })?;
        let actual = super::sha256_digest(&bytes);
        if actual != digest {
            return Err(ReadError::Digest {
                layout: self.root.clone(),
                digest: digest.to_string(),
                actual,
            });
        }
        Ok(bytes)
    }

    fn size_error(&self, descriptor: &Descriptor, actual: u64) -> ReadError {
        ReadError::Size {
            layout: self.root.clone(),
            digest: descriptor.digest().to_string(),
            expected: descriptor.size(),
            actual,
        }
    }
}

/// A blob's bytes, hashed as they are read.
pub struct HashingReader {
    file: std::fs::File,
    /// The hash and count of every byte read through either descriptor of the file.
    state: Rc<RefCell<(Sha256, u64)>>,
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        let mut state = self.state.borrow_mut();
        state.0.update(&buf[..n]);
        state.1 += n as u64;
        Ok(n)
    }
}

/// Holds what a [`HashingReader`] read to its descriptor.
pub struct BlobCheck {
    rest: HashingReader,
    store: BlobStore,
    descriptor: Descriptor,
    path: PathBuf,
}

impl BlobCheck {
    /// Reads what the reader left (a tar stream ends before its blob does), then checks
    /// that the blob was the descriptor's size and hashes to its digest. Call it before
    /// anything read from the blob is used.
    pub fn finish(mut self) -> Result<(), ReadError> {
        let left = self
            .descriptor
            .size()
            .saturating_sub(self.rest.state.borrow().1);
        // One byte past the size, so a blob that grew since it was opened is seen.
        std::io::copy(&mut (&mut self.rest).take(left + 1), &mut std::io::sink()).map_err(
            |source| ReadError::Read {
                path: self.path.clone(),
                source,
            },
        )?;
        let (hasher, size) = self.rest.state.replace((Sha256::new(), 0));
        if size != self.descriptor.size() {
            return Err(self.store.size_error(&self.descriptor, size));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        let digest = self.descriptor.digest().to_string();
        if actual != digest {
            return Err(ReadError::Digest {
                layout: self.store.root.clone(),
                digest,
                actual,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(bytes: &[u8]) -> Descriptor {
        Descriptor::new(
            oci_spec::image::MediaType::ImageLayer,
            bytes.len() as u64,
            super::super::sha256_digest(bytes)
                .parse::<oci_spec::image::Digest>()
                .unwrap(),
        )
    }

    #[test]
    fn a_blob_is_read_only_as_its_descriptor_says() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::flat(dir.path());
        let good = descriptor(b"hello world");
        fs_err::write(store.path(good.digest().as_ref()), b"hello world").unwrap();
        assert_eq!(store.read(&good, 100).unwrap(), b"hello world");
        assert!(matches!(
            store.read(&good, 5),
            Err(ReadError::TooLarge { .. })
        ));

        // Read in part, the rest is hashed by the check.
        let (mut reader, check) = store.open_checked(&good).unwrap();
        let mut head = [0u8; 5];
        reader.read_exact(&mut head).unwrap();
        check.finish().unwrap();

        // Same size, other bytes.
        let other = descriptor(b"hello there");
        fs_err::write(store.path(other.digest().as_ref()), b"hello world").unwrap();
        assert!(matches!(
            store.open_checked(&other).unwrap().1.finish(),
            Err(ReadError::Digest { .. })
        ));
        // Longer than its descriptor: refused before it is read.
        let short = descriptor(b"hi");
        fs_err::write(store.path(short.digest().as_ref()), b"hi and more").unwrap();
        assert!(matches!(
            store.open(&short),
            Err(ReadError::Size {
                expected: 2,
                actual: 11,
                ..
            })
        ));
        let missing = descriptor(b"nowhere");
        assert!(matches!(
            store.open(&missing),
            Err(ReadError::Missing { .. })
        ));
    }
}
