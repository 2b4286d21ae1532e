//! `imgbuild verify`: an image layout checked from its bytes up. Every blob the index reaches
//! is re-hashed and its size compared with its descriptor; every layer is decompressed and its
//! diff_id compared with the config; with the recipe, the packages in the layers are compared
//! with the lock, and `--rebuild` builds the lock again elsewhere and compares digests, naming
//! the first file that differs. `--provenance` compares the build's SLSA provenance with the
//! image (its subject) and the lock (its digest and every material).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use oci_spec::image::{Descriptor, ImageManifest};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{
    build::{BuildError, BuildSettings, LockMode, Silent},
    install::dist_name,
    lock::{Lock, LockedBase, SourceDigest},
    oci::{
        annotations,
        blobs::BlobStore,
        layout::Layout,
        read::{ManifestContent, ReadError},
    },
    report::list_capped,
};

/// What was checked.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct VerifyReport {
    pub image: String,
    pub manifests: Vec<String>,
    /// The image indexes the tags point to (a multi-platform image), if any.
    pub indexes: Vec<String>,
    pub blobs_checked: usize,
    pub bytes_checked: u64,
    pub layers_checked: usize,
    /// The lock the layers were compared with, if any.
    pub lock: Option<PathBuf>,
    /// The digest a rebuild from the lock produced, if asked.
    pub rebuilt: Option<String>,
    /// The provenance found to match the image and its lock, if asked.
    pub provenance: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    #[error("`{}` holds no image: there is no index.json", path.display())]
    NoImage { path: PathBuf },
    #[error("Cannot read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A blob that is missing, of the wrong size or digest, or not the JSON it should be.
    #[error(transparent)]
    Layout(#[from] ReadError),
    #[error(
        "Layer {index} ({digest}) decompresses to diff_id {actual}; the config says {expected}"
    )]
    DiffId {
        index: usize,
        digest: String,
        expected: String,
        actual: String,
    },
    #[error("The config lists {config} diff_ids for {layers} layers")]
    DiffIdCount { config: usize, layers: usize },
    #[error("Layer {digest} cannot be decompressed")]
    Decompress {
        digest: String,
        #[source]
        source: std::io::Error,
    },
    #[error("The image does not match the lock `{}`: {reason}", lock.display())]
    Lock { lock: PathBuf, reason: String },
    #[error(transparent)]
    LockRead(#[from] crate::lock::LockError),
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    #[error("Rebuilding from the lock failed")]
    Rebuild(#[source] Box<BuildError>),
    #[error("The provenance `{}` does not match: {reason}", path.display())]
    Provenance { path: PathBuf, reason: String },
    #[error(transparent)]
    ProvenanceRead(#[from] crate::provenance::ProvenanceError),
    #[error("A rebuild from the lock gives {rebuilt}, not {original}: {difference}")]
    RebuildDiffers {
        original: String,
        rebuilt: String,
        difference: String,
    },
}

/// The diff_id of the layer `layer` of `layout`: its blob decompressed and hashed, in one
/// read that also holds the blob to its descriptor. A blob that is not its descriptor's is
/// that error, whatever the decompression made of it.
fn diff_id(layout: &Layout, layer: &Descriptor) -> Result<String, VerifyError> {
    let (blob, check) = layout.blobs().open_checked(layer)?;
    let decompressed = crate::oci::layer_reader(blob, layer).and_then(|mut reader| {
        let mut hasher = Sha256::new();
        std::io::copy(&mut reader, &mut HashSink(&mut hasher))?;
        Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
    });
    check.finish()?;
    decompressed.map_err(|source| VerifyError::Decompress {
        digest: layer.digest().to_string(),
        source,
    })
}

struct HashSink<'a>(&'a mut Sha256);

impl std::io::Write for HashSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks the layout at `dir`; with the recipe of `recipe` (its path, channel alias and
/// variant), also that its lock pins only packages from the recipe's sources and that the
/// image holds exactly those packages and the locked base.
pub(crate) fn verify(
    dir: &Path,
    recipe: Option<&BuildSettings>,
) -> Result<VerifyReport, VerifyError> {
    let recipe = recipe.map(load_recipe).transpose()?;
    let lock = recipe.as_ref().map(|r| r.lock_path());
    let layout = Layout::new(dir);
    if !layout.index_path().is_file() {
        return Err(VerifyError::NoImage {
            path: dir.to_path_buf(),
        });
    }
    let index = layout.index()?;
    let mut report = VerifyReport {
        image: dir.display().to_string(),
        manifests: Vec::new(),
        indexes: Vec::new(),
        blobs_checked: 0,
        bytes_checked: 0,
        layers_checked: 0,
        lock: lock.clone(),
        rebuilt: None,
        provenance: None,
    };
    let mut tally = Tally::default();
    // What each platform image holds, to compare with that platform's lock.
    let mut images: Vec<ImageContents> = Vec::new();
    // Every manifest and index is checked as the walk reads it.
    for stored in layout.walk(index.manifests().clone()) {
        let stored = stored?;
        tally.count(&stored.descriptor);
        let digest = stored.digest();
        match &stored.content {
            ManifestContent::Index(_) => {
                if !report.indexes.contains(&digest) {
                    report.indexes.push(digest);
                }
            }
            // Another tag of an image already checked.
            ManifestContent::Manifest(_) if report.manifests.contains(&digest) => {}
            ManifestContent::Manifest(manifest) => {
                report.manifests.push(digest.clone());
                images.push(check_image(&layout, digest, manifest, &mut tally)?);
            }
        }
    }
    report.blobs_checked = tally.blobs;
    report.bytes_checked = tally.bytes;
    report.layers_checked = tally.layers;

    if let (Some(recipe), Some(lock_path)) = (&recipe, &lock) {
        check_against_lock(&images, recipe, lock_path)?;
    }
    Ok(report)
}

fn load_recipe(settings: &BuildSettings) -> Result<crate::recipe::Recipe, VerifyError> {
    let options = crate::recipe::RecipeOptions {
        channel_alias: settings.channel_alias.clone(),
        variant: settings.variant.clone(),
    };
    Ok(crate::recipe::Recipe::load(
        &settings.recipe_path,
        &options,
    )?)
}

/// The blobs checked so far, each counted once however many images share it.
#[derive(Default)]
struct Tally {
    seen: BTreeSet<String>,
    blobs: usize,
    bytes: u64,
    layers: usize,
}

impl Tally {
    fn count(&mut self, descriptor: &Descriptor) {
        if self.seen.insert(descriptor.digest().to_string()) {
            self.blobs += 1;
            self.bytes += descriptor.size();
        }
    }
}

/// Checks one platform image below its manifest: the config's bytes, and each layer's bytes
/// and diff_id. Returns what the image holds.
fn check_image(
    layout: &Layout,
    digest: String,
    manifest: &ImageManifest,
    tally: &mut Tally,
) -> Result<ImageContents, VerifyError> {
    let config = layout.config(manifest)?;
    tally.count(manifest.config());
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != manifest.layers().len() {
        return Err(VerifyError::DiffIdCount {
            config: diff_ids.len(),
            layers: manifest.layers().len(),
        });
    }
    for (index, (layer, expected)) in manifest.layers().iter().zip(diff_ids).enumerate() {
        let actual = diff_id(layout, layer)?;
        tally.count(layer);
        if actual != *expected {
            return Err(VerifyError::DiffId {
                index,
                digest: layer.digest().to_string(),
                expected: expected.clone(),
                actual,
            });
        }
        tally.layers += 1;
    }
    let annotation = |key: &str| manifest.annotations().as_ref()?.get(key).cloned();
    // The packages of the layers this image's build added: a base that is itself an
    // imgbuild image keeps its package annotations, but its packages are not this lock's.
    let own = crate::inspect::own_layers_start(manifest.layers());
    let packages = manifest.layers()[own..]
        .iter()
        .filter_map(|layer| layer.annotations().as_ref()?.get(annotations::PACKAGES))
        .flat_map(|list| list.split(',').map(str::to_string))
        .collect();
    Ok(ImageContents {
        digest,
        platform: annotation(annotations::PLATFORM),
        base: annotation("org.opencontainers.image.base.digest"),
        packages,
    })
}

/// `pypi:NAME-VERSION` with NAME normalized, for a wheel's layer label.
fn normalized_wheel_label(label: &str) -> Option<String> {
    let stem = crate::layers::plan::wheel_of_label(label)?;
    let (name, version) = stem.rsplit_once('-')?;
    let name = pep508_rs::PackageName::new(name.to_string()).ok()?;
    let version: pep440_rs::Version = version.parse().ok()?;
    Some(crate::layers::plan::wheel_label(&format!(
        "{name}-{version}"
    )))
}

/// What one platform image of a layout holds, as its manifest and layers say.
struct ImageContents {
    digest: String,
    /// The conda platform annotation, on images imgbuild built.
    platform: Option<String>,
    base: Option<String>,
    packages: BTreeSet<String>,
}

/// The lock pins only packages from the recipe's sources, each platform image holds exactly
/// its platform's locked packages on its locked base, and every locked platform has an image.
fn check_against_lock(
    images: &[ImageContents],
    recipe: &crate::recipe::Recipe,
    lock_path: &Path,
) -> Result<(), VerifyError> {
    let mismatch = |reason: String| VerifyError::Lock {
        lock: lock_path.to_path_buf(),
        reason,
    };
    let lock = Lock::read(lock_path)?.ok_or_else(|| mismatch("there is no lock file".into()))?;
    lock.check_sources(recipe, lock_path)?;
    // The recipe's `[[files]]` sources as they are now, against the digests the lock pins.
    let files = crate::build::source_digests(recipe).map_err(|e| mismatch(e.to_string()))?;
    crate::lock::check_files(&crate::lock::read_sources(lock_path)?, &files)
        .map_err(|stale| mismatch(stale.to_string()))?;
    // And its models' files, against their pins.
    let models = crate::models::pins(recipe).map_err(|e| mismatch(e.to_string()))?;
    crate::lock::check_models(&crate::lock::read_models(lock_path)?, &models)
        .map_err(|stale| mismatch(stale.to_string()))?;
    for locked in &lock.platforms {
        let platform = locked.target.platform.to_string();
        let matching: Vec<&ImageContents> = images
            .iter()
            .filter(|image| match &image.platform {
                Some(p) => *p == platform,
                // An image without the annotation can only be a one-platform lock's.
                None => lock.platforms.len() == 1,
            })
            .collect();
        let image = match matching.as_slice() {
            [image] => image,
            [] => return Err(mismatch(format!("the image has no {platform} manifest"))),
            _ => {
                return Err(mismatch(format!(
                    "the image has {} {platform} manifests",
                    matching.len()
                )));
            }
        };
        // One-platform messages stay as they were; several name the platform.
        let on = |message: String| {
            if lock.platforms.len() == 1 {
                message
            } else {
                format!("{platform} ({}): {message}", image.digest)
            }
        };
        let mut locked_names: BTreeSet<String> = locked.records.iter().map(dist_name).collect();
        locked_names.extend(
            locked
                .wheels
                .iter()
                .map(|w| crate::layers::plan::wheel_label(&format!("{}-{}", w.name, w.version))),
        );
        // A wheel's layer names its `.dist-info` stem (`python_dateutil-2.9.0.post0`):
        // compared by normalized name and version.
        let image_packages: BTreeSet<String> = image
            .packages
            .iter()
            .map(|p| normalized_wheel_label(p).unwrap_or_else(|| p.clone()))
            .collect();

        if let Some(missing) = locked_names.difference(&image_packages).next() {
            return Err(mismatch(on(format!(
                "locked package `{missing}` is in no layer"
            ))));
        }
        if let Some(extra) = image_packages.difference(&locked_names).next() {
            return Err(mismatch(on(format!(
                "the image holds `{extra}`, which the lock does not"
            ))));
        }
        match (&locked.base, &image.base) {
            (LockedBase::Scratch, None) => {}
            (LockedBase::Digest(pinned), Some(actual)) if pinned == actual => {}
            (pinned, actual) => {
                return Err(mismatch(on(format!(
                    "the lock pins base {pinned}, the image was built on {}",
                    actual.as_deref().unwrap_or("scratch")
                ))));
            }
        }
    }
    if let Some(extra) = images.iter().find(|image| {
        image.platform.as_deref().is_some_and(|p| {
            !lock
                .platforms
                .iter()
                .any(|l| l.target.platform.as_str() == p)
        })
    }) {
        return Err(mismatch(format!(
            "the image has a {} manifest, which the lock does not lock",
            extra.platform.as_deref().unwrap_or_default()
        )));
    }
    Ok(())
}

/// The lock a provenance is checked against: always one the user named, never the path the
/// provenance records (the document being checked would choose what is read and hashed).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockSource<'a> {
    /// The recipe's lock; the recipe's digest is checked too.
    Recipe(&'a BuildSettings),
    /// A lock file named as such (`--lock`).
    Lock(&'a Path),
}

/// Checks the provenance at `file` (default: the one beside the layout) against the image
/// at `dir` (after [`verify`] has checked it) and against the lock `against` names.
/// Returns the provenance's path.
pub(crate) fn check_provenance(
    dir: &Path,
    file: Option<&Path>,
    against: LockSource<'_>,
) -> Result<PathBuf, VerifyError> {
    use crate::provenance::{compare_dependencies, dependencies};
    let path = file.map_or_else(|| crate::provenance::path_beside(dir), Path::to_path_buf);
    let mismatch = |reason: String| VerifyError::Provenance {
        path: path.clone(),
        reason,
    };
    let recorded = read_provenance(&path)?;

    // The image the layout's tags name: a manifest, or the index of several platforms.
    let tagged = tagged_digests(dir)?;
    if !tagged.contains(&recorded.subject) {
        return Err(mismatch(format!(
            "the provenance names {} but the layout's image is {}",
            recorded.subject,
            list_capped(&tagged, 10)
        )));
    }

    let lock_path = match against {
        LockSource::Recipe(settings) => {
            let recipe = load_recipe(settings)?;
            let now = crate::provenance::InputFile::read(&settings.recipe_path)?;
            if now.sha256 != recorded.recipe.sha256 {
                return Err(mismatch(format!(
                    "it was built from recipe `{}` sha256:{}, and `{}` is now sha256:{}",
                    recorded.recipe.path, recorded.recipe.sha256, now.path, now.sha256
                )));
            }
            recipe.lock_path()
        }
        LockSource::Lock(path) => path.to_path_buf(),
    };
    let now = crate::provenance::InputFile::read(&lock_path)?;
    if now.sha256 != recorded.lock.sha256 {
        return Err(mismatch(format!(
            "it was built from lock `{}` sha256:{}, and `{}` is now sha256:{}: the lock changed since the build",
            recorded.lock.path, recorded.lock.sha256, now.path, now.sha256
        )));
    }
    let lock = Lock::read(&lock_path)?.ok_or_else(|| mismatch("there is no lock file".into()))?;
    let pinned = crate::lock::read_sources(&lock_path)?;
    if recorded.files != pinned {
        return Err(mismatch(files_difference(&recorded.files, &pinned)));
    }
    let models = crate::lock::read_models(&lock_path)?;
    if let Some(difference) = models_difference(&recorded.models, &models) {
        return Err(mismatch(difference));
    }

    let locked: BTreeSet<String> = lock
        .platforms
        .iter()
        .map(|p| p.target.platform.to_string())
        .collect();
    let listed: BTreeSet<String> = recorded.platforms.iter().cloned().collect();
    if locked != listed {
        return Err(mismatch(format!(
            "it names platforms {}, the lock locks {}",
            list_capped(&listed.into_iter().collect::<Vec<_>>(), 10),
            list_capped(&locked.into_iter().collect::<Vec<_>>(), 10)
        )));
    }
    let expected = dependencies(&lock, recorded.base_reference.as_deref());
    if let Some(difference) = compare_dependencies(&recorded.dependencies, &expected) {
        return Err(mismatch(difference.to_string()));
    }
    Ok(path)
}

/// How the `[[files]]` sources a provenance lists differ from the lock's pins (they do).
fn files_difference(listed: &[SourceDigest], pinned: &[SourceDigest]) -> String {
    let show = |files: &[SourceDigest]| {
        let shown: Vec<String> = files
            .iter()
            .map(|f| format!("`{}` {}", f.src, f.digest))
            .collect();
        if shown.is_empty() {
            "none".to_string()
        } else {
            list_capped(&shown, 10)
        }
    };
    format!(
        "it lists `[[files]]` sources {}, and the lock pins {}",
        show(listed),
        show(pinned)
    )
}

/// The first model file the provenance lists otherwise than the lock pins it, if any.
fn models_difference(
    listed: &[crate::lock::ModelPin],
    pinned: &[crate::lock::ModelPin],
) -> Option<String> {
    let name = |pin: &crate::lock::ModelPin| format!("`{}` of model `{}`", pin.path, pin.model);
    let shown =
        |pin: &crate::lock::ModelPin| format!("{} ({} bytes, {})", name(pin), pin.size, pin.sha256);
    if let Some(pin) = listed.iter().find(|p| !pinned.contains(p)) {
        return Some(
            match pinned
                .iter()
                .find(|q| q.model == pin.model && q.path == pin.path)
            {
                Some(now) => format!(
                    "it lists {}, the lock pins {} bytes, {}",
                    shown(pin),
                    now.size,
                    now.sha256
                ),
                None => format!("it lists {}, which the lock does not pin", shown(pin)),
            },
        );
    }
    let pin = pinned.iter().find(|p| !listed.contains(p))?;
    Some(format!(
        "the lock pins {}, which it does not list",
        shown(pin)
    ))
}

/// The provenance at `path`, read with a bound: it lists what the lock lists, so it is no
/// larger than a lock may be.
fn read_provenance(path: &Path) -> Result<crate::provenance::Recorded, VerifyError> {
    let bytes = crate::fs::read_input(path, crate::lock::MAX_LOCK_BYTES).map_err(|source| {
        VerifyError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::other(source),
        }
    })?;
    let statement: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|err| VerifyError::Provenance {
            path: path.to_path_buf(),
            reason: format!("it is not JSON: {err}"),
        })?;
    Ok(crate::provenance::Recorded::parse(&statement, path)?)
}

/// The digests of `index.json`'s entries, each once, in its order.
fn tagged_digests(dir: &Path) -> Result<Vec<String>, VerifyError> {
    let mut digests: Vec<String> = Vec::new();
    for entry in Layout::new(dir).index()?.manifests() {
        let digest = entry.digest().to_string();
        if !digests.contains(&digest) {
            digests.push(digest);
        }
    }
    Ok(digests)
}

/// Rebuilds `settings`' recipe from its lock into a temporary directory and compares the
/// result with the image at `dir`, which `original` is the [`verify`] report of.
pub(crate) async fn rebuild_and_compare(
    dir: &Path,
    original: &VerifyReport,
    settings: &BuildSettings,
) -> Result<String, VerifyError> {
    let temp = tempfile::Builder::new()
        .prefix("imgbuild-verify-")
        .tempdir()
        .map_err(|source| VerifyError::Read {
            path: std::env::temp_dir(),
            source,
        })?;
    let rebuilt_dir = temp.path().join("image");
    let settings = BuildSettings {
        output: Some(rebuilt_dir.clone()),
        lock_mode: LockMode::Locked,
        ..settings.clone()
    };
    let report = crate::build::build(&settings, &Silent)
        .await
        .map_err(|e| VerifyError::Rebuild(Box::new(e)))?;
    let original_digest = original
        .indexes
        .first()
        .or(original.manifests.first())
        .cloned()
        .unwrap_or_default();
    if original.manifests.contains(&report.manifest_digest)
        || original.indexes.contains(&report.manifest_digest)
    {
        return Ok(report.manifest_digest);
    }
    Err(VerifyError::RebuildDiffers {
        difference: first_difference(dir, &rebuilt_dir),
        original: original_digest,
        rebuilt: report.manifest_digest,
    })
}

/// Describes the first difference between two layouts of the same recipe: in the first
/// platform image that differs, the first layer whose digest differs and, inside it, the
/// first entry that differs; or the config.
fn first_difference(a: &Path, b: &Path) -> String {
    // The platform images of the first tag, in index order.
    let open = |dir: &Path| -> Option<(Vec<(String, ImageManifest)>, BlobStore)> {
        let layout = Layout::new(dir);
        let entry = layout.index().ok()?.manifests().first()?.clone();
        let manifests = layout
            .platform_manifests(&entry)
            .ok()?
            .into_iter()
            .map(|(d, manifest)| {
                let platform = d
                    .platform()
                    .as_ref()
                    .map(|p| format!("{}/{}", p.os(), p.architecture()))
                    .unwrap_or_default();
                (platform, manifest)
            })
            .collect();
        Some((manifests, layout.blobs()))
    };
    let (Some((ma, ba)), Some((mb, bb))) = (open(a), open(b)) else {
        return "one of the images cannot be read".to_string();
    };
    if ma.len() != mb.len() {
        return format!("{} platform images against {}", ma.len(), mb.len());
    }
    let several = ma.len() > 1;
    for ((platform, ma), (_, mb)) in ma.iter().zip(&mb) {
        if ma == mb {
            continue;
        }
        let difference = manifest_difference(ma, &ba, mb, &bb);
        return if several {
            format!("{platform}: {difference}")
        } else {
            difference
        };
    }
    "the platform images are identical; the image index differs".to_string()
}

/// The first difference between two manifests whose blobs are in `ba` and `bb`.
fn manifest_difference(
    ma: &ImageManifest,
    ba: &BlobStore,
    mb: &ImageManifest,
    bb: &BlobStore,
) -> String {
    for (index, (la, lb)) in ma.layers().iter().zip(mb.layers()).enumerate() {
        if la.digest() == lb.digest() {
            continue;
        }
        let entries = |blobs: &BlobStore, layer: &Descriptor| -> Vec<(String, Vec<u8>)> {
            let Ok(reader) = blobs
                .open(layer)
                .map_err(std::io::Error::other)
                .and_then(|blob| crate::oci::layer_reader(blob, layer))
            else {
                return Vec::new();
            };
            let mut archive = tar::Archive::new(reader);
            let Ok(entries) = archive.entries() else {
                return Vec::new();
            };
            entries
                .filter_map(Result::ok)
                .map(|mut entry| {
                    let path = entry
                        .path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    // The header and the sha256 of the content: two layers are compared
                    // without holding either in memory (the layer reader bounds the rest).
                    let mut data = entry.header().as_bytes().to_vec();
                    let mut hasher = Sha256::new();
                    let _ = std::io::copy(&mut entry, &mut HashSink(&mut hasher));
                    data.extend_from_slice(&hasher.finalize());
                    (path, data)
                })
                .collect()
        };
        let (ea, eb) = (entries(ba, la), entries(bb, lb));
        for (x, y) in ea.iter().zip(&eb) {
            if x != y {
                return if x.0 == y.0 {
                    format!("layer {index}: `{}` differs", x.0)
                } else {
                    format!("layer {index}: `{}` where the rebuild has `{}`", x.0, y.0)
                };
            }
        }
        return format!(
            "layer {index}: {} entries against {} (the same up to there)",
            ea.len(),
            eb.len()
        );
    }
    if ma.layers().len() != mb.layers().len() {
        return format!("{} layers against {}", ma.layers().len(), mb.layers().len());
    }
    "the layers are identical; the image config or manifest differs".to_string()
}
