//! Hostile and broken conda packages, written byte by byte the way bad packages in the wild
//! are: tar entries whose names climb out with `..` or are absolute, links that escape,
//! device files, `paths.json` that lies, archives cut short or corrupted.
//!
//! rattler's writers (and the `tar` crate's `set_path`) refuse to produce such packages, so
//! this module writes the tar headers itself and the `repodata.json` too: a channel whose
//! records are sane while the archives they point at are not (or, for the checksum cases,
//! the other way round).

use std::io::{Cursor, Write};
use std::path::Path;

use rattler_digest::{Md5, Sha256, compute_bytes_digest};
use serde_json::{Value, json};

/// The build time every hostile package claims (2023-10-01).
const TIMESTAMP_MS: u64 = 1_696_118_400_000;

/// One tar entry, name and link target written verbatim into the header.
pub(crate) enum Raw {
    File(String, Vec<u8>),
    Symlink(String, String),
    Hardlink(String, String),
    Fifo(String),
    CharDevice(String),
    BlockDevice(String),
}

impl Raw {
    pub(crate) fn file(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        Raw::File(path.into(), bytes.into())
    }

    fn path(&self) -> &str {
        match self {
            Raw::File(p, _)
            | Raw::Symlink(p, _)
            | Raw::Hardlink(p, _)
            | Raw::Fifo(p)
            | Raw::CharDevice(p)
            | Raw::BlockDevice(p) => p,
        }
    }
}

/// Copies `value` into a fixed-size header field, NUL-padded; no checks, by design.
fn put(field: &mut [u8], value: &str) {
    assert!(
        value.len() < field.len(),
        "`{value}` does not fit a tar header field"
    );
    field.fill(0);
    field[..value.len()].copy_from_slice(value.as_bytes());
}

/// A GNU tar of `entries` with names and link targets exactly as given.
pub(crate) fn tar(entries: &[Raw]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(TIMESTAMP_MS / 1000);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mode(0o644);
        header.set_size(0);
        let data: &[u8] = match entry {
            Raw::File(_, bytes) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(bytes.len() as u64);
                bytes
            }
            Raw::Symlink(_, target) | Raw::Hardlink(_, target) => {
                let kind = match entry {
                    Raw::Symlink(..) => tar::EntryType::Symlink,
                    _ => tar::EntryType::Link,
                };
                header.set_entry_type(kind);
                if target.len() >= 100 {
                    // A GNU long-link entry first, written by the tar crate, which leaves
                    // `..` in link targets alone (link chains need long ones).
                    builder
                        .append_link(&mut header, entry.path(), target)
                        .expect("writing to a Vec");
                    continue;
                }
                put(&mut header.as_gnu_mut().expect("gnu").linkname, target);
                &[]
            }
            Raw::Fifo(_) => {
                header.set_entry_type(tar::EntryType::Fifo);
                &[]
            }
            Raw::CharDevice(_) | Raw::BlockDevice(_) => {
                header.set_entry_type(match entry {
                    Raw::CharDevice(_) => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                });
                header.set_device_major(1).expect("gnu");
                header.set_device_minor(3).expect("gnu");
                &[]
            }
        };
        put(&mut header.as_gnu_mut().expect("gnu").name, entry.path());
        header.set_cksum();
        builder.append(&header, data).expect("writing to a Vec");
    }
    builder.into_inner().expect("writing to a Vec")
}

/// `index.json` of a linux-64 package (or a noarch python one).
pub(crate) fn index_json(name: &str, depends: &[&str], noarch_python: bool) -> Value {
    let mut index = json!({
        "build": "h0_0",
        "build_number": 0,
        "depends": depends,
        "license": "MIT",
        "name": name,
        "timestamp": TIMESTAMP_MS,
        "version": "1.0",
    });
    if noarch_python {
        index["noarch"] = "python".into();
        index["subdir"] = "noarch".into();
        index["build"] = "pyh0_0".into();
    } else {
        index["arch"] = "x86_64".into();
        index["platform"] = "linux".into();
        index["subdir"] = "linux-64".into();
    }
    index
}

/// The `paths.json` conda-build would write for `entries` (files as hardlinks with their
/// sha256 and size, symlinks as softlinks; anything else as a hardlink of size 0).
pub(crate) fn paths_json(entries: &[Raw]) -> Value {
    let records: Vec<Value> = entries
        .iter()
        .map(|entry| match entry {
            Raw::File(path, bytes) => json!({
                "_path": path,
                "path_type": "hardlink",
                "sha256": sha256_hex(bytes),
                "size_in_bytes": bytes.len(),
            }),
            Raw::Symlink(path, _) => json!({ "_path": path, "path_type": "softlink" }),
            other => json!({ "_path": other.path(), "path_type": "hardlink" }),
        })
        .collect();
    json!({ "paths": records, "paths_version": 1 })
}

/// What goes into a package: `info/` files (raw bytes, so they can be broken) and payload.
pub(crate) struct Package {
    /// `NAME-1.0-BUILD`, without extension.
    pub stem: String,
    pub info: Vec<(String, Vec<u8>)>,
    pub payload: Vec<Raw>,
}

impl Package {
    /// A package whose `info/` is consistent with `payload` (unless changed afterwards).
    pub(crate) fn new(
        name: &str,
        depends: &[&str],
        noarch_python: bool,
        payload: Vec<Raw>,
    ) -> Self {
        let index = index_json(name, depends, noarch_python);
        let stem = format!("{name}-1.0-{}", index["build"].as_str().unwrap());
        let paths = paths_json(&payload);
        Package {
            stem,
            info: vec![
                ("info/index.json".into(), json_bytes(&index)),
                ("info/paths.json".into(), json_bytes(&paths)),
            ],
            payload,
        }
    }

    /// Replaces (or adds) one `info/` file.
    pub(crate) fn with_info(mut self, name: &str, bytes: impl Into<Vec<u8>>) -> Self {
        let name = format!("info/{name}");
        self.info.retain(|(n, _)| *n != name);
        self.info.push((name, bytes.into()));
        self
    }

    fn info_entries(&self) -> Vec<Raw> {
        self.info
            .iter()
            .map(|(name, bytes)| Raw::File(name.clone(), bytes.clone()))
            .collect()
    }

    /// A `.tar.bz2`: info and payload in one bzip2-compressed tar.
    pub(crate) fn tar_bz2(&self) -> Vec<u8> {
        let mut entries = self.info_entries();
        entries.extend(self.payload.iter().map(clone_raw));
        bzip2_bytes(&tar(&entries))
    }

    /// A `.conda`: a stored zip of `metadata.json`, `pkg-STEM.tar.zst` and `info-STEM.tar.zst`
    /// (`with_pkg` false leaves the payload member out).
    pub(crate) fn conda(&self, with_pkg: bool) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let mut member = |name: &str, bytes: &[u8]| {
            zip.start_file(name, options).expect("zip member");
            zip.write_all(bytes).expect("zip member");
        };
        member("metadata.json", br#"{"conda_pkg_format_version": 2}"#);
        if with_pkg {
            member(
                &format!("pkg-{}.tar.zst", self.stem),
                &zstd_bytes(&tar(&self.payload)),
            );
        }
        member(
            &format!("info-{}.tar.zst", self.stem),
            &zstd_bytes(&tar(&self.info_entries())),
        );
        zip.finish().expect("zip").into_inner()
    }
}

fn clone_raw(raw: &Raw) -> Raw {
    match raw {
        Raw::File(p, b) => Raw::File(p.clone(), b.clone()),
        Raw::Symlink(p, t) => Raw::Symlink(p.clone(), t.clone()),
        Raw::Hardlink(p, t) => Raw::Hardlink(p.clone(), t.clone()),
        Raw::Fifo(p) => Raw::Fifo(p.clone()),
        Raw::CharDevice(p) => Raw::CharDevice(p.clone()),
        Raw::BlockDevice(p) => Raw::BlockDevice(p.clone()),
    }
}

pub(crate) fn json_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("JSON")
}

pub(crate) fn bzip2_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    encoder.write_all(bytes).expect("bzip2");
    encoder.finish().expect("bzip2")
}

pub(crate) fn zstd_bytes(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 3).expect("zstd")
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(compute_bytes_digest::<Sha256>(bytes))
}

/// A channel being written: archives go to `<dir>/<subdir>/`, and [`Channel::finish`]
/// writes `repodata.json` for both subdirs from the records collected.
pub(crate) struct Channel<'a> {
    pub dir: &'a Path,
    records: Vec<(String, String, Value)>,
}

impl<'a> Channel<'a> {
    pub(crate) fn new(dir: &'a Path) -> Self {
        Channel {
            dir,
            records: Vec::new(),
        }
    }

    /// Adds `bytes` as `<subdir>/<file>` with a record made from `index` and the bytes'
    /// real sha256, md5 and size; `edit` may then falsify the record.
    pub(crate) fn add(
        &mut self,
        file: &str,
        index: &Value,
        bytes: &[u8],
        edit: impl FnOnce(&mut Value),
    ) {
        let subdir = index["subdir"].as_str().unwrap_or("linux-64").to_string();
        fs_err::create_dir_all(self.dir.join(&subdir)).unwrap();
        fs_err::write(self.dir.join(&subdir).join(file), bytes).unwrap();
        let mut record = index.clone();
        record["sha256"] = sha256_hex(bytes).into();
        record["md5"] = hex::encode(compute_bytes_digest::<Md5>(bytes)).into();
        record["size"] = bytes.len().into();
        edit(&mut record);
        self.records.push((subdir, file.to_string(), record));
    }

    pub(crate) fn finish(self) {
        for subdir in ["linux-64", "noarch"] {
            let mut tar_bz2 = serde_json::Map::new();
            let mut conda = serde_json::Map::new();
            for (s, file, record) in &self.records {
                if s == subdir {
                    let map = if file.ends_with(".conda") {
                        &mut conda
                    } else {
                        &mut tar_bz2
                    };
                    map.insert(file.clone(), record.clone());
                }
            }
            let repodata = json!({
                "info": { "subdir": subdir },
                "packages": tar_bz2,
                "packages.conda": conda,
                "repodata_version": 1,
            });
            fs_err::create_dir_all(self.dir.join(subdir)).unwrap();
            fs_err::write(
                self.dir.join(subdir).join("repodata.json"),
                json_bytes(&repodata),
            )
            .unwrap();
        }
    }
}
