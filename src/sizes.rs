//! `imgbuild inspect IMAGE --sizes`: where an image's bytes are. Every layer of a local
//! layout is read once (digests checked, decompression bounded, as every layer read is),
//! and each file is put down to the package that owns it:
//!
//! - by the layer's `dev.imgbuild.layer.packages` annotation when the layer holds one
//!   package;
//! - in a layer several packages share, by the image's own records of which package
//!   installed which file: conda's `conda-meta/*.json` and the wheels' `.dist-info/RECORD`
//!   (each read at most [`MAX_RECORD_BYTES`]; one that cannot be parsed attributes nothing
//!   and its files stay with the layer's packages together);
//! - files of base layers to `(base)`, of the recipe's own layers to their kind.
//!
//! Shared libraries (regular `lib*.so*` files) are hashed as they stream past, so two copies
//! of a library are found by soname (from the file name: `libcublas.so.12.1.3.1` is
//! `libcublas.so.12`) or by bytes, whichever packages they came from.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    path::Path,
};

use oci_spec::image::Descriptor;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{
    compression::bounded::{Bound, read_to_end_bounded},
    cuda::fatbin::{ArchKind, Architectures, format_list},
    layers::LayerKind,
    oci::{
        annotations,
        base::BaseImage,
        read::{LayoutImage, ReadLayoutRef},
    },
};

/// The most bytes of one `conda-meta/*.json` or `RECORD` read for attribution; torch's
/// conda record, the largest seen, is about 12 MB.
pub(crate) const MAX_RECORD_BYTES: u64 = 64 << 20;

/// What the report is asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct SizeOptions {
    /// How many of the largest files to list.
    pub top: usize,
    /// The GPUs the image is for: SASS no one of them runs is counted.
    pub architectures: Option<Architectures>,
}

/// What the report says about an image.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SizeReport {
    pub image: String,
    /// Sum of the layers' blob sizes.
    pub compressed: u64,
    /// Sum of the bytes of the files the layers hold.
    pub uncompressed: u64,
    pub layers: Vec<LayerSize>,
    /// Largest first.
    pub packages: Vec<PackageSize>,
    /// Largest first, as many as asked for.
    pub largest_files: Vec<FileSize>,
    /// Most bytes wasted first.
    pub duplicate_libraries: Vec<DuplicateLibrary>,
    /// With `--architectures`: the SASS none of those GPUs runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sass_outside: Option<SassOutside>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SassOutside {
    /// The GPUs asked about, `sm_80,sm_90`.
    pub architectures: String,
    pub bytes: u64,
    /// Most bytes first.
    pub libraries: Vec<SassLibrary>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SassLibrary {
    pub path: String,
    pub package: String,
    /// Bytes of fatbin payload (as stored, compressed where it is) for other GPUs.
    pub bytes: u64,
    /// Those GPUs' SASS, `sm_50,sm_60`.
    pub architectures: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct LayerSize {
    pub index: usize,
    pub digest: String,
    /// The layer's packages, or what else it is (`(base)`, `(image)`, `accounts`, …).
    pub holds: Vec<String>,
    /// Which part of its one package the layer is (`2/3`), when `[layers] split` split it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    pub compressed: u64,
    pub uncompressed: u64,
    pub files: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PackageSize {
    pub package: String,
    pub uncompressed: u64,
    /// Its share of its layers' blobs, by its share of their file bytes (exact for a
    /// package with layers of its own).
    pub compressed: u64,
    pub files: u64,
    pub layers: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FileSize {
    pub path: String,
    pub bytes: u64,
    pub package: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct DuplicateLibrary {
    /// `soname` or `bytes`.
    pub by: &'static str,
    /// The soname, or the bytes' `sha256:…`.
    pub key: String,
    /// Bytes beyond the largest copy.
    pub wasted: u64,
    pub copies: Vec<FileSize>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SizesError {
    #[error(
        "`inspect --sizes` reads every layer, so it takes a local OCI layout, not the registry image `{image}`: pull it with `skopeo copy docker://{image} oci:DIR:TAG` first"
    )]
    Registry { image: String },
    #[error("Cannot open image `{image}`")]
    Open {
        image: String,
        #[source]
        source: crate::oci::read::ReadError,
    },
    #[error("Cannot make a temporary directory to read libraries' fatbins in")]
    Scratch {
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to read layer `{digest}` of `{image}`")]
    Layer {
        image: String,
        digest: String,
        #[source]
        source: std::io::Error,
    },
}

/// One regular file as a layer holds it.
#[derive(Debug, Clone)]
struct Stored {
    layer: usize,
    bytes: u64,
    /// Of a shared library: its bytes' digest.
    sha256: Option<String>,
    /// Of a library with a fatbin, when architectures were asked about: the SASS for
    /// none of them, bytes and architectures.
    sass_outside: Option<SassBytes>,
}

/// Bytes of SASS, and for which architectures.
type SassBytes = (u64, Architectures);

/// What one pass over the layers gathers.
#[derive(Debug, Default)]
struct Walked {
    /// Every regular file of every layer, in order (a path again in a later layer is a
    /// second stored copy; the later one is what the container sees).
    stored: Vec<(String, Stored)>,
    /// Path → package, from conda-meta and RECORD files.
    owners: BTreeMap<String, String>,
    /// Paths a later layer removed (whiteouts), with the layer that removed them.
    removed: Vec<(String, usize)>,
    /// The GPUs asked about, and where a library is copied to have its fatbin read.
    architectures: Option<(Architectures, tempfile::TempDir)>,
}

/// The size report of `image`, a local layout `DIR[:TAG]` (its `platform`, as `inspect`
/// picks it).
pub(crate) fn sizes_of(
    image: &str,
    platform: Option<rattler_conda_types::Subdir>,
    options: &SizeOptions,
) -> Result<SizeReport, SizesError> {
    if let crate::smoke::ImageSource::Registry(_) = crate::smoke::ImageSource::of(image) {
        return Err(SizesError::Registry {
            image: image.to_string(),
        });
    }
    let reference = crate::reference::LayoutRef::parse(image);
    let opened = reference
        .image(platform)
        .map_err(|source| SizesError::Open {
            image: image.to_string(),
            source,
        })?;
    size_report(image, &reference.dir, opened, options)
}

/// The size report of `opened`, a local layout's image, read from `layout`.
fn size_report(
    image: &str,
    layout: &Path,
    opened: LayoutImage,
    options: &SizeOptions,
) -> Result<SizeReport, SizesError> {
    let prefix = opened
        .manifest
        .annotations()
        .as_ref()
        .and_then(|a| a.get(annotations::PREFIX))
        .map(|p| p.trim_matches('/').to_string());
    let descriptors = opened.layers.clone();
    let base = BaseImage::from_layout(&crate::oci::layout::Layout::new(layout), opened);
    let walked = walk(image, &base, prefix.as_deref(), options)?;
    let labels = layer_labels(&descriptors);
    let owner_of = |path: &str, layer: usize| owner(&walked.owners, &labels[layer], path);
    let layers = layer_sizes(&descriptors, &labels, &walked);
    let packages = package_sizes(&walked, &layers, &owner_of);
    let visible = visible_files(&walked);
    Ok(SizeReport {
        image: image.to_string(),
        compressed: layers.iter().map(|l| l.compressed).sum(),
        uncompressed: layers.iter().map(|l| l.uncompressed).sum(),
        largest_files: largest(&visible, options.top, &owner_of),
        duplicate_libraries: duplicates(&visible, &owner_of),
        sass_outside: options
            .architectures
            .as_ref()
            .map(|archs| sass_outside(archs, &visible, &owner_of)),
        packages,
        layers,
    })
}

/// Reads every layer once, bottom first.
fn walk(
    image: &str,
    base: &BaseImage,
    prefix: Option<&str>,
    options: &SizeOptions,
) -> Result<Walked, SizesError> {
    let scratch = |source| SizesError::Scratch { source };
    let architectures = match &options.architectures {
        Some(archs) => Some((archs.clone(), tempfile::tempdir().map_err(scratch)?)),
        None => None,
    };
    let mut walked = Walked {
        architectures,
        ..Walked::default()
    };
    let mut index_of: BTreeMap<String, usize> = BTreeMap::new();
    for (i, layer) in base.layers.iter().enumerate() {
        index_of.entry(layer.digest().to_string()).or_insert(i);
    }
    // The same blob twice in one image is read twice by `walk_layers`; count a layer by its
    // position, so the second read is the second layer.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut current = (String::new(), 0usize);
    let error = |digest: String, source| SizesError::Layer {
        image: image.to_string(),
        digest,
        source,
    };
    base.walk_layers(error, |digest, path, entry| {
        if current.0 != digest {
            let n = seen.entry(digest.to_string()).or_insert(0);
            let first = index_of[digest];
            current = (digest.to_string(), nth_position(base, digest, first, *n));
            *n += 1;
        }
        let path = path
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        let is_file = entry.header().entry_type().is_file();
        visit(&mut walked, current.1, path, is_file, entry, prefix)
            .map_err(|source| error(digest.to_string(), source))
    })?;
    Ok(walked)
}

/// The position of the `n`th occurrence of `digest` among the image's layers.
fn nth_position(base: &BaseImage, digest: &str, first: usize, n: usize) -> usize {
    base.layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.digest().as_ref() == digest)
        .nth(n)
        .map_or(first, |(i, _)| i)
}

/// Records one tar entry of layer `layer`: a whiteout, a regular file, or nothing.
fn visit(
    walked: &mut Walked,
    layer: usize,
    path: String,
    is_file: bool,
    entry: &mut impl Read,
    prefix: Option<&str>,
) -> std::io::Result<()> {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", &path));
    if let Some(hidden) = name.strip_prefix(".wh.") {
        // An opaque whiteout hides what lower layers put in its directory.
        let gone = if hidden == ".wh..opq" {
            dir.to_string()
        } else if dir.is_empty() {
            hidden.to_string()
        } else {
            format!("{dir}/{hidden}")
        };
        walked.removed.push((gone, layer));
        return Ok(());
    }
    if !is_file {
        return Ok(());
    }
    record_file(walked, layer, &path, entry, prefix)
}

/// Records a regular file: its size, a library's digest, and the owners a record names.
fn record_file(
    walked: &mut Walked,
    layer: usize,
    path: &str,
    entry: &mut impl Read,
    prefix: Option<&str>,
) -> std::io::Result<()> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let mut stored = Stored {
        layer,
        bytes: 0,
        sha256: None,
        sass_outside: None,
    };
    if is_library(name) {
        let (bytes, digest, sass) = read_library(walked, entry)?;
        stored.bytes = bytes;
        stored.sha256 = Some(digest);
        stored.sass_outside = sass;
    } else if let Some(kind) = record_kind(path, prefix) {
        let bound = Bound::new(
            MAX_RECORD_BYTES,
            format!("`{path}`"),
            "the most a package record may hold for `inspect --sizes`",
        );
        let text = read_to_end_bounded(&mut *entry, bound)?;
        stored.bytes = text.len() as u64;
        owners_from_record(kind, path, &text, prefix, &mut walked.owners);
    } else {
        stored.bytes = std::io::copy(entry, &mut std::io::sink())?;
    }
    walked.stored.push((path.to_string(), stored));
    Ok(())
}

/// A shared library's file name: `lib*.so` or `lib*.so.*`.
fn is_library(name: &str) -> bool {
    name.starts_with("lib") && (name.ends_with(".so") || name.contains(".so."))
}

/// The soname a library's file name gives: up to the first version number after `.so`.
fn soname(name: &str) -> String {
    let Some(at) = name.find(".so") else {
        return name.to_string();
    };
    let rest = &name[at + 3..];
    match rest.strip_prefix('.').and_then(|r| r.split('.').next()) {
        Some(major) => format!("{}.{major}", &name[..at + 3]),
        None => name[..at + 3].to_string(),
    }
}

/// A library's bytes, digest and, when architectures were asked about, the SASS of its
/// fatbin that none of them runs (read from a copy beneath the scratch directory; a
/// library whose fatbin cannot be read counts none).
fn read_library(
    walked: &Walked,
    entry: &mut impl Read,
) -> std::io::Result<(u64, String, Option<SassBytes>)> {
    let Some((archs, scratch)) = &walked.architectures else {
        let (bytes, digest) = hash_into(entry, &mut std::io::sink())?;
        return Ok((bytes, digest, None));
    };
    let copy = scratch.path().join("library");
    let mut file = fs_err::File::create(&copy)?;
    let (bytes, digest) = hash_into(entry, &mut file)?;
    drop(file);
    let entries = crate::cuda::fatbin::read_entries(&copy).ok().flatten();
    fs_err::remove_file(&copy)?;
    let sass = entries
        .map(|entries| sass_for_others(&entries, archs))
        .filter(|(bytes, _)| *bytes > 0);
    Ok((bytes, digest, sass))
}

/// The bytes and architectures of SASS in `entries` that no GPU of `archs` runs: SASS
/// `sm_XY` runs on the same major at minor Y or above.
fn sass_for_others(
    entries: &[crate::cuda::fatbin::FatbinEntry],
    archs: &Architectures,
) -> SassBytes {
    let runs = |sm: u32| archs.iter().any(|d| d.sm / 10 == sm / 10 && sm <= d.sm);
    entries
        .iter()
        .filter(|e| e.arch.kind == ArchKind::Sass && !runs(e.arch.sm))
        .fold((0, Architectures::new()), |(bytes, mut set), e| {
            set.insert(e.arch);
            (bytes + e.payload_size, set)
        })
}

/// The SASS for other GPUs than `archs` in the files the container sees.
fn sass_outside(
    archs: &Architectures,
    visible: &BTreeMap<&str, &Stored>,
    owner_of: &impl Fn(&str, usize) -> String,
) -> SassOutside {
    let mut libraries: Vec<SassLibrary> = visible
        .iter()
        .filter_map(|(path, stored)| {
            let (bytes, set) = stored.sass_outside.as_ref()?;
            Some(SassLibrary {
                path: format!("/{path}"),
                package: owner_of(path, stored.layer),
                bytes: *bytes,
                architectures: format_list(set),
            })
        })
        .collect();
    libraries.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.path.cmp(&b.path)));
    SassOutside {
        architectures: format_list(archs),
        bytes: libraries.iter().map(|l| l.bytes).sum(),
        libraries,
    }
}

/// sha256 of what `entry` holds, and how many bytes, copied to `out` as it goes.
fn hash_into(
    entry: &mut impl Read,
    out: &mut impl std::io::Write,
) -> std::io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
    Ok((total, format!("sha256:{}", hex::encode(hasher.finalize()))))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecordKind {
    CondaMeta,
    WheelRecord,
}

/// Whether `path` is a record of which files a package installed.
fn record_kind(path: &str, prefix: Option<&str>) -> Option<RecordKind> {
    let (dir, name) = path.rsplit_once('/')?;
    if name == "RECORD" && dir.ends_with(".dist-info") {
        return Some(RecordKind::WheelRecord);
    }
    let meta = prefix.map_or_else(|| "conda-meta".to_string(), |p| format!("{p}/conda-meta"));
    (dir == meta && name.ends_with(".json")).then_some(RecordKind::CondaMeta)
}

/// Adds the paths a record names to `owners`, under the package it is the record of.
fn owners_from_record(
    kind: RecordKind,
    path: &str,
    text: &[u8],
    prefix: Option<&str>,
    owners: &mut BTreeMap<String, String>,
) {
    match kind {
        RecordKind::CondaMeta => conda_owners(text, prefix, owners),
        RecordKind::WheelRecord => wheel_owners(path, text, owners),
    }
}

/// `conda-meta/NAME-VERSION-BUILD.json`: its `files`, relative to the prefix.
fn conda_owners(text: &[u8], prefix: Option<&str>, owners: &mut BTreeMap<String, String>) {
    #[derive(serde::Deserialize)]
    struct CondaMetaFiles {
        name: String,
        version: String,
        build: String,
        #[serde(default)]
        files: Vec<String>,
    }
    let Ok(record) = serde_json::from_slice::<CondaMetaFiles>(text) else {
        return;
    };
    let label = format!("{}-{}-{}", record.name, record.version, record.build);
    for file in record.files {
        let file = file.trim_start_matches('/');
        let path = prefix.map_or_else(|| file.to_string(), |p| format!("{p}/{file}"));
        owners.insert(path, label.clone());
    }
}

/// `…/site-packages/NAME-VERSION.dist-info/RECORD`: its first column, relative to the
/// directory holding the `.dist-info`. Paths that climb out of it are skipped.
fn wheel_owners(path: &str, text: &[u8], owners: &mut BTreeMap<String, String>) {
    let Some((dist_info, _)) = path.rsplit_once('/') else {
        return;
    };
    let (root, stem) = dist_info.rsplit_once('/').unwrap_or(("", dist_info));
    let label = format!("pypi:{}", stem.trim_end_matches(".dist-info"));
    for line in String::from_utf8_lossy(text).lines() {
        let file = line.split(',').next().unwrap_or("").trim_matches('"');
        if file.is_empty() || file.split('/').any(|part| part == "..") {
            continue;
        }
        let path = if root.is_empty() {
            file.to_string()
        } else {
            format!("{root}/{file}")
        };
        owners.insert(path, label.clone());
    }
}

/// What each layer holds by its annotations: its packages, else what kind of layer it is.
fn layer_labels(layers: &[Descriptor]) -> Vec<Vec<String>> {
    let own_start = crate::inspect::own_layers_start(layers);
    layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let annotations = layer.annotations().clone().unwrap_or_default();
            let packages: Vec<String> = annotations
                .get(annotations::PACKAGES)
                .map(|p| {
                    p.split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if !packages.is_empty() {
                return packages;
            }
            let kind = LayerKind::from_annotations(&annotations);
            vec![match kind {
                _ if i < own_start => "(base)".to_string(),
                Some(LayerKind::Smoke) => "(smoke executable)".to_string(),
                Some(LayerKind::Accounts) => "(accounts)".to_string(),
                Some(LayerKind::Files) => "(files)".to_string(),
                _ => "(image)".to_string(),
            }]
        })
        .collect()
}

/// The package of `path` in a layer holding `labels`: the one package, or the record's
/// owner, or all of them together.
fn owner(owners: &BTreeMap<String, String>, labels: &[String], path: &str) -> String {
    if let [only] = labels {
        return only.clone();
    }
    owners
        .get(path)
        .filter(|o| labels.contains(o))
        .cloned()
        .unwrap_or_else(|| labels.join("+"))
}

fn layer_sizes(layers: &[Descriptor], labels: &[Vec<String>], walked: &Walked) -> Vec<LayerSize> {
    let mut sizes: Vec<LayerSize> = layers
        .iter()
        .enumerate()
        .map(|(index, layer)| LayerSize {
            index,
            digest: layer.digest().to_string(),
            holds: labels[index].clone(),
            part: crate::inspect::layer_part(layer),
            compressed: layer.size(),
            uncompressed: 0,
            files: 0,
        })
        .collect();
    for (_, stored) in &walked.stored {
        sizes[stored.layer].uncompressed += stored.bytes;
        sizes[stored.layer].files += 1;
    }
    sizes
}

fn package_sizes(
    walked: &Walked,
    layers: &[LayerSize],
    owner_of: &impl Fn(&str, usize) -> String,
) -> Vec<PackageSize> {
    // (package, layer) → bytes, files.
    let mut shares: BTreeMap<(String, usize), (u64, u64)> = BTreeMap::new();
    for (path, stored) in &walked.stored {
        let share = shares
            .entry((owner_of(path, stored.layer), stored.layer))
            .or_default();
        share.0 += stored.bytes;
        share.1 += 1;
    }
    let mut packages: BTreeMap<String, PackageSize> = BTreeMap::new();
    for ((package, layer), (bytes, files)) in shares {
        let l = &layers[layer];
        let compressed = if l.uncompressed == 0 {
            0
        } else {
            (u128::from(l.compressed) * u128::from(bytes) / u128::from(l.uncompressed)) as u64
        };
        let p = packages
            .entry(package.clone())
            .or_insert_with(|| PackageSize {
                package,
                uncompressed: 0,
                compressed: 0,
                files: 0,
                layers: Vec::new(),
            });
        p.uncompressed += bytes;
        p.compressed += compressed;
        p.files += files;
        p.layers.push(layer);
    }
    let mut packages: Vec<PackageSize> = packages.into_values().collect();
    packages.sort_by(|a, b| {
        b.uncompressed
            .cmp(&a.uncompressed)
            .then(a.package.cmp(&b.package))
    });
    packages
}

/// The files the container sees: each path's last stored copy, unless a later layer
/// removed it.
fn visible_files(walked: &Walked) -> BTreeMap<&str, &Stored> {
    let mut visible: BTreeMap<&str, &Stored> = BTreeMap::new();
    for (path, stored) in &walked.stored {
        visible.insert(path.as_str(), stored);
    }
    for (gone, layer) in &walked.removed {
        let prefix = format!("{gone}/");
        visible.retain(|path, stored| {
            stored.layer >= *layer || (*path != gone.as_str() && !path.starts_with(&prefix))
        });
    }
    visible
}

fn largest(
    visible: &BTreeMap<&str, &Stored>,
    top: usize,
    owner_of: &impl Fn(&str, usize) -> String,
) -> Vec<FileSize> {
    let mut files: Vec<(&str, &Stored)> = visible.iter().map(|(p, s)| (*p, *s)).collect();
    files.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
    files
        .into_iter()
        .take(top)
        .map(|(path, stored)| file_size(path, stored, owner_of))
        .collect()
}

fn file_size(path: &str, stored: &Stored, owner_of: &impl Fn(&str, usize) -> String) -> FileSize {
    FileSize {
        path: format!("/{path}"),
        bytes: stored.bytes,
        package: owner_of(path, stored.layer),
    }
}

/// Libraries the container holds twice: one soname from two packages, or the same bytes at
/// two paths.
fn duplicates(
    visible: &BTreeMap<&str, &Stored>,
    owner_of: &impl Fn(&str, usize) -> String,
) -> Vec<DuplicateLibrary> {
    let mut by_soname: BTreeMap<String, Vec<FileSize>> = BTreeMap::new();
    let mut by_bytes: BTreeMap<String, Vec<FileSize>> = BTreeMap::new();
    for (path, stored) in visible {
        let Some(digest) = &stored.sha256 else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or(path);
        let file = file_size(path, stored, owner_of);
        by_soname
            .entry(soname(name))
            .or_default()
            .push(file.clone());
        by_bytes.entry(digest.clone()).or_default().push(file);
    }
    let mut found = Vec::new();
    for (key, copies) in by_soname {
        let packages: BTreeSet<&str> = copies.iter().map(|c| c.package.as_str()).collect();
        if packages.len() > 1 {
            found.push(duplicate("soname", key, copies));
        }
    }
    for (key, copies) in by_bytes {
        let covered = found
            .iter()
            .any(|d| copies.iter().all(|c| d.copies.contains(c)));
        if copies.len() > 1 && !covered && copies[0].bytes > 0 {
            found.push(duplicate("bytes", key, copies));
        }
    }
    found.sort_by(|a, b| b.wasted.cmp(&a.wasted).then(a.key.cmp(&b.key)));
    found
}

fn duplicate(by: &'static str, key: String, copies: Vec<FileSize>) -> DuplicateLibrary {
    let total: u64 = copies.iter().map(|c| c.bytes).sum();
    let largest = copies.iter().map(|c| c.bytes).max().unwrap_or(0);
    DuplicateLibrary {
        by,
        key,
        wasted: total - largest,
        copies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sonames_come_from_the_file_name() {
        assert_eq!(soname("libcublas.so.12.1.3.1"), "libcublas.so.12");
        assert_eq!(soname("libcublas.so.12"), "libcublas.so.12");
        assert_eq!(soname("libcudnn.so"), "libcudnn.so");
        assert!(is_library("libnvrtc.so.11.2"));
        assert!(!is_library("libfoo.a"));
        assert!(!is_library("notalib.so"));
    }

    #[test]
    fn records_attribute_their_files_and_nothing_outside() {
        let mut owners = BTreeMap::new();
        conda_owners(
            br#"{"name":"libcublas","version":"12.1.3.1","build":"0","files":["lib/libcublas.so.12.1.3.1"]}"#,
            Some("opt/conda"),
            &mut owners,
        );
        wheel_owners(
            "opt/conda/lib/python3.9/site-packages/nvidia_cublas_cu12-12.1.3.1.dist-info/RECORD",
            b"nvidia/cublas/lib/libcublas.so.12,sha256=x,1\n../../../etc/passwd,,\n",
            &mut owners,
        );
        assert_eq!(
            owners["opt/conda/lib/libcublas.so.12.1.3.1"],
            "libcublas-12.1.3.1-0"
        );
        assert_eq!(
            owners["opt/conda/lib/python3.9/site-packages/nvidia/cublas/lib/libcublas.so.12"],
            "pypi:nvidia_cublas_cu12-12.1.3.1"
        );
        assert_eq!(owners.len(), 2, "the climbing path is skipped: {owners:?}");
        // A record that is not one attributes nothing.
        conda_owners(b"{not json", None, &mut owners);
        assert_eq!(owners.len(), 2);
    }

    #[test]
    fn a_shared_layer_attributes_by_record_and_falls_back_to_all() {
        let owners = BTreeMap::from([("a/x".to_string(), "p-1-0".to_string())]);
        let labels = vec!["p-1-0".to_string(), "q-1-0".to_string()];
        assert_eq!(owner(&owners, &labels, "a/x"), "p-1-0");
        assert_eq!(owner(&owners, &labels, "a/y"), "p-1-0+q-1-0");
        assert_eq!(owner(&owners, &["r-1-0".to_string()], "a/x"), "r-1-0");
    }

    #[test]
    fn duplicates_by_soname_across_packages_and_by_bytes() {
        let lib = |layer, bytes, sha: &str| Stored {
            layer,
            bytes,
            sha256: Some(sha.to_string()),
            sass_outside: None,
        };
        let (a, b, c) = (
            lib(0, 100, "sha256:1"),
            lib(1, 90, "sha256:2"),
            lib(1, 40, "sha256:3"),
        );
        let d = lib(1, 40, "sha256:3");
        let visible = BTreeMap::from([
            ("opt/conda/lib/libcublas.so.12.1.3.1", &a),
            (
                "opt/conda/lib/python3.9/site-packages/nvidia/cublas/lib/libcublas.so.12",
                &b,
            ),
            ("x/libz.so.1", &c),
            ("y/libz.so.1.2.13", &d),
        ]);
        let owner_of =
            |_: &str, layer: usize| ["libcublas-12-0", "pypi:nvidia_cublas"][layer].to_string();
        let found = duplicates(&visible, &owner_of);
        assert_eq!(found[0].by, "soname");
        assert_eq!(found[0].key, "libcublas.so.12");
        assert_eq!(found[0].wasted, 90);
        // The two libz copies are one package's: not a soname duplicate, but the same bytes.
        assert_eq!(found[1].by, "bytes");
        assert_eq!(found[1].wasted, 40);
        assert_eq!(found.len(), 2);
    }
}
