//! Reading images back from an OCI image layout: the `DIR[:TAG]` a user writes
//! ([`LayoutRef`]), the image a tag names for a platform ([`Layout::image`]: manifest,
//! config and layers), and every manifest and index a tag or the layout reaches
//! ([`Layout::walk`]). Each blob read is checked against its descriptor (present, its size,
//! its digest) before it is parsed, and every failure is one [`ReadError`] naming the
//! layout, the tag or the blob.
//!
//! `inspect`, `verify`, `push`, the archives, `smoke` and local base images all read
//! through here; the write side of a layout is [`super::layout`].

use std::path::Path;

use super::{
    blobs::{BlobStore, MAX_JSON_BLOB},
    layout::{Layout, ref_name, tagged},
};
use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use rattler_conda_types::Subdir;

pub use super::read_error::ReadError;
pub use crate::reference::LayoutRef;

/// Reading what a [`LayoutRef`] names. A trait because the reference is a plain value of
/// `imgbuild-model`, below the layout reader.
pub trait ReadLayoutRef {
    /// The layout of the reference's directory.
    fn layout(&self) -> Layout;

    /// The image of the reference's tag for `platform` ([`Layout::image`]).
    fn image(&self, platform: Option<Subdir>) -> Result<LayoutImage, ReadError>;
}

impl ReadLayoutRef for LayoutRef {
    fn layout(&self) -> Layout {
        Layout::new(&self.dir)
    }

    fn image(&self, platform: Option<Subdir>) -> Result<LayoutImage, ReadError> {
        self.layout().image(self.tag(), platform)
    }
}

/// One platform's image of a tag.
#[derive(Debug, Clone)]
pub struct LayoutImage {
    /// `oci:DIR:TAG`, how messages and base annotations name it.
    pub reference: String,
    /// The image index the tag names, for a multi-platform image.
    pub index: Option<TagIndex>,
    /// Digest of the platform image's manifest, `sha256:<hex>`.
    pub manifest_digest: String,
    pub manifest: ImageManifest,
    pub config: ImageConfiguration,
    /// The manifest's layers, bottom first, with OCI media types: Docker's names for the
    /// same bytes are renamed, so a layer can be reused byte for byte.
    pub layers: Vec<Descriptor>,
}

/// The image index a tag names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagIndex {
    pub digest: String,
    /// The conda subdir of each platform image, in index order (entries whose platform a
    /// recipe cannot name are left out).
    pub platforms: Vec<Subdir>,
}

/// A manifest or an image index, read from a layout with its bytes checked.
#[derive(Debug, Clone)]
pub struct StoredManifest {
    pub descriptor: Descriptor,
    /// The exact bytes, which its digest names.
    pub bytes: Vec<u8>,
    pub content: ManifestContent,
}

#[derive(Debug, Clone)]
pub enum ManifestContent {
    // Boxed: both are large, and walks move them.
    Index(Box<ImageIndex>),
    Manifest(Box<ImageManifest>),
}

impl StoredManifest {
    pub fn digest(&self) -> String {
        self.descriptor.digest().to_string()
    }

    /// The blobs an image manifest names (config, then layers); none for an index.
    pub fn leaves(&self) -> Vec<String> {
        match &self.content {
            ManifestContent::Index(_) => Vec::new(),
            ManifestContent::Manifest(manifest) => std::iter::once(manifest.config())
                .chain(manifest.layers())
                .map(|d| d.digest().to_string())
                .collect(),
        }
    }
}

impl Layout {
    /// `index.json`: a regular file in the layout directory itself (not a link, not a fifo),
    /// of at most [`MAX_JSON_BLOB`]. The one read of it, for readers and writers alike; a
    /// writer takes a missing one ([`ReadError::is_not_found`]) as an empty layout.
    pub fn index(&self) -> Result<ImageIndex, ReadError> {
        let path = self.index_path();
        let bytes =
            crate::fs::read_input_beneath(&self.dir, Path::new("index.json"), MAX_JSON_BLOB)
                .map_err(|source| ReadError::Read {
                    path: path.clone(),
                    source: source.into(),
                })?;
        ImageIndex::from_reader(bytes.as_slice()).map_err(|source| ReadError::Json { path, source })
    }

    /// The entry of `index.json` tagged `tag`.
    pub fn entry(&self, tag: &str) -> Result<Descriptor, ReadError> {
        let index = self.index()?;
        if let Some(entry) = tagged(&index, tag) {
            return Ok(entry.clone());
        }
        let mut available: Vec<String> = index
            .manifests()
            .iter()
            .filter_map(|d| ref_name(d).map(str::to_string))
            .collect();
        available.sort();
        Err(ReadError::NoTag {
            layout: self.dir.clone(),
            tag: tag.to_string(),
            available,
        })
    }

    /// The layout's blobs, each opened beneath the layout and held to its descriptor.
    pub fn blobs(&self) -> BlobStore {
        BlobStore::in_layout(&self.dir)
    }

    /// The bytes of the manifest, index or config blob `descriptor` names, checked; one
    /// larger than [`MAX_JSON_BLOB`] is refused unread.
    pub(crate) fn read_blob(&self, descriptor: &Descriptor) -> Result<Vec<u8>, ReadError> {
        self.blobs().read(descriptor, MAX_JSON_BLOB)
    }

    /// The bytes of a manifest or index blob, checked, and what they parse to.
    pub fn read_manifest(&self, descriptor: &Descriptor) -> Result<StoredManifest, ReadError> {
        let bytes = self.read_blob(descriptor)?;
        let json_err = |source| ReadError::Json {
            path: self.blobs_dir().join(descriptor.digest().digest()),
            source,
        };
        let content = if is_index(descriptor.media_type()) {
            ManifestContent::Index(Box::new(
                ImageIndex::from_reader(bytes.as_slice()).map_err(json_err)?,
            ))
        } else {
            ManifestContent::Manifest(Box::new(
                ImageManifest::from_reader(bytes.as_slice()).map_err(json_err)?,
            ))
        };
        Ok(StoredManifest {
            descriptor: descriptor.clone(),
            bytes,
            content,
        })
    }

    /// The image manifest `descriptor` names.
    pub fn manifest(&self, descriptor: &Descriptor) -> Result<ImageManifest, ReadError> {
        self.read_json(descriptor, |bytes| ImageManifest::from_reader(bytes))
    }

    /// The image index `descriptor` names (an entry of `index.json` that is one).
    pub(crate) fn nested_index(&self, descriptor: &Descriptor) -> Result<ImageIndex, ReadError> {
        self.read_json(descriptor, |bytes| ImageIndex::from_reader(bytes))
    }

    /// The config of `manifest`.
    pub fn config(&self, manifest: &ImageManifest) -> Result<ImageConfiguration, ReadError> {
        self.read_json(manifest.config(), |bytes| {
            ImageConfiguration::from_reader(bytes)
        })
    }

    fn read_json<T>(
        &self,
        descriptor: &Descriptor,
        parse: impl FnOnce(&[u8]) -> Result<T, oci_spec::OciSpecError>,
    ) -> Result<T, ReadError> {
        let bytes = self.read_blob(descriptor)?;
        parse(&bytes).map_err(|source| ReadError::Json {
            path: self.blobs_dir().join(descriptor.digest().digest()),
            source,
        })
    }

    /// The platform images an entry of `index.json` names, in index order: the entry itself
    /// when it is a manifest, else its index's entries.
    pub fn platform_manifests(
        &self,
        entry: &Descriptor,
    ) -> Result<Vec<(Descriptor, ImageManifest)>, ReadError> {
        let descriptors = if is_index(entry.media_type()) {
            self.nested_index(entry)?.manifests().clone()
        } else {
            vec![entry.clone()]
        };
        descriptors
            .into_iter()
            .map(|d| self.manifest(&d).map(|manifest| (d, manifest)))
            .collect()
    }

    /// Every manifest and index reachable from `roots` (entries of `index.json`), each read
    /// when the iteration reaches it, so a caller checking what it is given stops at the
    /// first bad blob. The order is a stack's: the last root first, and an index's entries
    /// (last first) right after it. A blob reached twice is read twice; the first error
    /// ends the walk.
    pub fn walk(&self, roots: Vec<Descriptor>) -> Walk<'_> {
        Walk {
            layout: self,
            pending: roots,
        }
    }

    /// What tag `tag` reaches: its entry, then (for an index) what the index names, as
    /// [`Self::walk`] orders them.
    pub(crate) fn tag_manifests(&self, tag: &str) -> Result<Vec<StoredManifest>, ReadError> {
        let entry = self.entry(tag)?;
        self.walk(vec![entry]).collect()
    }

    /// The image of tag `tag` for `platform`. Without a platform: of a multi-platform image,
    /// the build host's platform when it has it, else its first; of a one-platform image,
    /// its own. The config must be for the platform's architecture.
    pub fn image(&self, tag: &str, platform: Option<Subdir>) -> Result<LayoutImage, ReadError> {
        let reference = format!("oci:{}:{tag}", self.dir.display());
        let entry = self.entry(tag)?;
        let (index, descriptor, chosen) = if is_index(entry.media_type()) {
            let nested = self.nested_index(&entry)?;
            let index = TagIndex {
                digest: entry.digest().to_string(),
                platforms: index_subdirs(&nested),
            };
            let wanted = platform.unwrap_or_else(|| choose(&index.platforms));
            let descriptor = pick_platform(&nested, wanted, &reference)?;
            (Some(index), descriptor, Some(wanted))
        } else {
            (None, entry, platform)
        };
        if !is_manifest(descriptor.media_type()) {
            return Err(ReadError::MediaType {
                reference,
                what: "manifest",
                media_type: descriptor.media_type().to_string(),
            });
        }
        let manifest = self.manifest(&descriptor)?;
        let config = self.config(&manifest)?;
        // Unasked, a one-platform image is held to its own platform (the host's, when its
        // own is one a recipe cannot name).
        let wanted = chosen.unwrap_or_else(|| choose(config_subdir(&config).as_slice()));
        check_architecture(&config, wanted, &reference)?;
        Ok(LayoutImage {
            layers: oci_layers(&manifest, &reference)?,
            reference,
            index,
            manifest_digest: descriptor.digest().to_string(),
            manifest,
            config,
        })
    }
}

/// The iterator of [`Layout::walk`].
pub struct Walk<'a> {
    layout: &'a Layout,
    pending: Vec<Descriptor>,
}

impl Iterator for Walk<'_> {
    type Item = Result<StoredManifest, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let descriptor = self.pending.pop()?;
        let stored = self.layout.read_manifest(&descriptor);
        match &stored {
            Ok(StoredManifest {
                content: ManifestContent::Index(index),
                ..
            }) => self.pending.extend(index.manifests().iter().cloned()),
            Ok(_) => {}
            Err(_) => self.pending.clear(),
        }
        Some(stored)
    }
}

/// `wanted`'s manifest of `index`, or an error naming the platforms it has.
fn pick_platform(
    index: &ImageIndex,
    wanted: Subdir,
    reference: &str,
) -> Result<Descriptor, ReadError> {
    let (architecture, variant) =
        crate::names::oci_architecture(wanted).expect("recipe platforms map to OCI");
    platform_manifest(index, architecture, variant)
        .cloned()
        .ok_or_else(|| ReadError::NoPlatform {
            reference: reference.to_string(),
            os: "linux".into(),
            architecture: architecture.into(),
            available: index_platforms(index),
        })
}

/// The build host's platform when `platforms` has it, else the first of them.
fn choose(platforms: &[Subdir]) -> Subdir {
    let host = Subdir::current().unwrap_or(Subdir::Linux64);
    if platforms.contains(&host) {
        host
    } else {
        platforms.first().copied().unwrap_or(host)
    }
}

fn check_architecture(
    config: &ImageConfiguration,
    wanted: Subdir,
    reference: &str,
) -> Result<(), ReadError> {
    let (architecture, _) =
        crate::names::oci_architecture(wanted).expect("recipe platforms map to OCI");
    if config.architecture().to_string() != architecture {
        return Err(ReadError::WrongPlatform {
            reference: reference.to_string(),
            found: format!("{}/{}", config.os(), config.architecture()),
            wanted: format!("linux/{architecture}"),
        });
    }
    Ok(())
}

/// The layers of `manifest` with OCI media types ([`oci_layer_media_type`]).
fn oci_layers(manifest: &ImageManifest, reference: &str) -> Result<Vec<Descriptor>, ReadError> {
    manifest
        .layers()
        .iter()
        .map(|layer| {
            let media_type =
                oci_layer_media_type(layer.media_type()).ok_or_else(|| ReadError::MediaType {
                    reference: reference.to_string(),
                    what: "layer",
                    media_type: layer.media_type().to_string(),
                })?;
            let mut layer = layer.clone();
            layer.set_media_type(media_type);
            Ok(layer)
        })
        .collect()
}

/// The conda subdir of `linux/architecture[/variant]`, if a recipe can name it.
fn linux_subdir(architecture: &str, variant: Option<&str>) -> Option<Subdir> {
    let text = match variant {
        Some(variant) => format!("linux/{architecture}/{variant}"),
        None => format!("linux/{architecture}"),
    };
    crate::names::OciPlatform::parse_subdir(&text)
}

/// The subdirs of an index's platform entries, in index order.
fn index_subdirs(index: &ImageIndex) -> Vec<Subdir> {
    index
        .manifests()
        .iter()
        .filter_map(|d| {
            let p = d.platform().as_ref()?;
            linux_subdir(&p.architecture().to_string(), p.variant().as_deref())
        })
        .collect()
}

fn config_subdir(config: &ImageConfiguration) -> Option<Subdir> {
    linux_subdir(
        &config.architecture().to_string(),
        config.variant().as_deref(),
    )
}

/// The manifest of an image index for `linux/architecture[/variant]`; a manifest without
/// a variant matches any variant.
pub(crate) fn platform_manifest<'a>(
    index: &'a ImageIndex,
    architecture: &str,
    variant: Option<&str>,
) -> Option<&'a Descriptor> {
    index.manifests().iter().find(|d| {
        d.platform().as_ref().is_some_and(|p| {
            p.os().to_string() == "linux"
                && p.architecture().to_string() == architecture
                && (variant.is_none() || p.variant().is_none() || p.variant().as_deref() == variant)
        })
    })
}

/// The platforms an index lists, for messages: `linux/amd64, linux/arm64/v8`. Entries
/// without a platform, or for `unknown/unknown` (the attestations buildx adds), are left out.
pub(crate) fn index_platforms(index: &ImageIndex) -> String {
    let platforms: Vec<String> = index
        .manifests()
        .iter()
        .filter_map(|d| d.platform().as_ref())
        .filter(|p| p.os().to_string() != "unknown")
        .map(|p| {
            let mut text = format!("{}/{}", p.os(), p.architecture());
            if let Some(variant) = p.variant() {
                text = format!("{text}/{variant}");
            }
            text
        })
        .collect();
    if platforms.is_empty() {
        "no platform manifests".into()
    } else {
        crate::report::list_capped(&platforms, 10)
    }
}

/// An OCI image index, or Docker's manifest list.
pub(crate) fn is_index(media_type: &MediaType) -> bool {
    matches!(media_type, MediaType::ImageIndex)
        || media_type.to_string() == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// An OCI image manifest, or Docker's.
pub(crate) fn is_manifest(media_type: &MediaType) -> bool {
    matches!(media_type, MediaType::ImageManifest)
        || media_type.to_string() == "application/vnd.docker.distribution.manifest.v2+json"
}

/// The OCI media type for a layer, mapping Docker's names for the same bytes.
pub(crate) fn oci_layer_media_type(media_type: &MediaType) -> Option<MediaType> {
    match media_type.to_string().as_str() {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(MediaType::ImageLayerGzip),
        "application/vnd.oci.image.layer.v1.tar+zstd" => Some(MediaType::ImageLayerZstd),
        "application/vnd.oci.image.layer.v1.tar" => Some(MediaType::ImageLayer),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use oci_spec::image::{ImageIndexBuilder, Platform};

    use super::*;
    use crate::oci::layout::REF_NAME;

    #[test]
    fn layout_references() {
        let parsed = |text: &str| {
            let r = LayoutRef::parse(text);
            (r.dir.display().to_string(), r.tag().to_string())
        };
        assert_eq!(parsed("images/x"), ("images/x".into(), "latest".into()));
        assert_eq!(parsed("images/x:v1"), ("images/x".into(), "v1".into()));
        // A colon followed by a path, or with nothing before it, is part of the path.
        assert_eq!(parsed("/a:b/x"), ("/a:b/x".into(), "latest".into()));
        assert_eq!(parsed(":v1"), (":v1".into(), "latest".into()));
        assert_eq!(LayoutRef::parse("images/x").tag, None);
        assert_eq!(
            crate::reference::split_layout("images/x:v1"),
            ("images/x", Some("v1"))
        );
    }

    /// Writes `value` as a blob; returns its descriptor.
    fn json_blob(layout: &Layout, media_type: MediaType, value: serde_json::Value) -> Descriptor {
        let bytes = serde_json::to_vec(&value).unwrap();
        let digest = layout.write_blob(&bytes).unwrap();
        Descriptor::new(
            media_type,
            bytes.len() as u64,
            digest.parse::<oci_spec::image::Digest>().unwrap(),
        )
    }

    fn tagged_as(mut descriptor: Descriptor, tag: &str) -> Descriptor {
        descriptor.set_annotations(Some(HashMap::from([(
            REF_NAME.to_string(),
            tag.to_string(),
        )])));
        descriptor
    }

    /// The manifest of a one-layer `architecture` image, whose layer has Docker's media type.
    fn image_manifest(layout: &Layout, architecture: &str) -> Descriptor {
        let layer = layout.write_blob(architecture.as_bytes()).unwrap();
        let config = json_blob(
            layout,
            MediaType::ImageConfig,
            serde_json::json!({
                "architecture": architecture,
                "os": "linux",
                "rootfs": {"type": "layers", "diff_ids": [layer]},
            }),
        );
        json_blob(
            layout,
            MediaType::ImageManifest,
            serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config,
                "layers": [{
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "digest": layer,
                    "size": architecture.len(),
                }],
            }),
        )
    }

    /// A layout whose tag `one` is an amd64 image and `multi` an index of amd64 and arm64.
    fn layout() -> (tempfile::TempDir, Layout) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("l"));
        layout.prepare().unwrap();
        let one = image_manifest(&layout, "amd64");
        let mut platform_entries = Vec::new();
        for (architecture, variant) in [("amd64", None), ("arm64", Some("v8"))] {
            let mut entry = image_manifest(&layout, architecture);
            let mut platform = Platform::default();
            platform.set_architecture(architecture.into());
            platform.set_variant(variant.map(str::to_string));
            entry.set_platform(Some(platform));
            platform_entries.push(entry);
        }
        let multi = json_blob(
            &layout,
            MediaType::ImageIndex,
            serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": platform_entries,
            }),
        );
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .manifests(vec![tagged_as(one, "one"), tagged_as(multi, "multi")])
            .build()
            .unwrap();
        layout.commit_index(&index).unwrap();
        (dir, layout)
    }

    #[test]
    fn an_image_is_its_manifest_config_and_layers() {
        let (_dir, layout) = layout();
        let one = layout.image("one", None).unwrap();
        assert!(one.index.is_none());
        assert_eq!(one.reference, format!("oci:{}:one", layout.dir.display()));
        assert_eq!(
            one.manifest_digest,
            layout.entry("one").unwrap().digest().to_string()
        );
        assert_eq!(one.config.architecture().to_string(), "amd64");
        assert_eq!(*one.layers[0].media_type(), MediaType::ImageLayerGzip);

        let arm = layout.image("multi", Some(Subdir::LinuxAarch64)).unwrap();
        let index = arm.index.as_ref().unwrap();
        assert_eq!(index.platforms, [Subdir::Linux64, Subdir::LinuxAarch64]);
        assert_eq!(arm.config.architecture().to_string(), "arm64");
    }

    #[test]
    fn read_errors_name_the_layout_tag_and_blob() {
        let (_dir, layout) = layout();
        let message = |err: ReadError| err.to_string();
        assert_eq!(
            message(layout.image("two", None).unwrap_err()),
            format!(
                "OCI layout `{}` has no tag `two`; it has: multi, one",
                layout.dir.display()
            )
        );
        let wrong = layout.image("one", Some(Subdir::LinuxAarch64)).unwrap_err();
        assert!(message(wrong).contains("is for linux/amd64, the recipe builds for linux/arm64"));
        let none = layout
            .image("multi", Some(Subdir::LinuxPpc64le))
            .unwrap_err();
        assert!(
            message(none)
                .ends_with("has no manifest for linux/ppc64le; it has linux/amd64, linux/arm64/v8"),
        );

        // A manifest whose bytes changed is refused before it is parsed.
        let entry = layout.entry("one").unwrap();
        let path = layout.blob_path(entry.digest().as_ref());
        let mut bytes = fs_err::read(&path).unwrap();
        bytes[0] = b' ';
        fs_err::write(&path, &bytes).unwrap();
        assert!(
            message(layout.image("one", None).unwrap_err()).starts_with(&format!(
                "Blob {} does not match its digest: its bytes in `{}` hash to sha256:",
                entry.digest(),
                layout.dir.display()
            ))
        );
        fs_err::remove_file(&path).unwrap();
        assert_eq!(
            message(layout.tag_manifests("one").unwrap_err()),
            format!(
                "Blob {} is missing from `{}`",
                entry.digest(),
                layout.dir.display()
            )
        );
    }

    #[test]
    fn a_walk_reads_an_index_before_what_it_names() {
        let (_dir, layout) = layout();
        let kinds: Vec<&str> = layout
            .tag_manifests("multi")
            .unwrap()
            .iter()
            .map(|stored| match &stored.content {
                ManifestContent::Index(_) => "index",
                ManifestContent::Manifest(_) => "manifest",
            })
            .collect();
        assert_eq!(kinds, ["index", "manifest", "manifest"]);
        let all = layout.walk(layout.index().unwrap().manifests().clone());
        assert_eq!(all.count(), 4);
        let one = layout.tag_manifests("one").unwrap();
        assert_eq!(one[0].leaves().len(), 2);
    }
}
