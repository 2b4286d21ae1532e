//! Step 3: what the build has to do, as plain data. Like rattler's transaction, the plan is
//! computed from what is wanted (the prepared platforms and the lock) and what is already
//! there (the build record of these inputs and the image the layout holds under the
//! recipe's tags), and only the driver in [`super`] acts on it: an unchanged image is
//! reported as it is, anything else is installed and written platform by platform.
//!
//! [`ImageInPlace::read`] is the plan's one contact with the disk, and it only reads, through
//! the layout reader ([`crate::oci::read`]);
//! [`BuildPlan::new`] is pure.

use super::{model::BuiltImage, prepare::PreparedPlatform};
use crate::{
    lock::{Lock, PlatformLock},
    oci::layout::{Layout, tagged},
    rebuild::BuildRecord,
};
use oci_spec::image::Descriptor;

/// What a build has to do.
pub(super) enum BuildPlan<'a> {
    /// The layout already holds the image these inputs make: nothing to install, nothing
    /// to compress.
    Unchanged(BuiltImage),
    /// Install and write these platforms, in the recipe's order: every platform of the
    /// image, as one image is written whole.
    Build(Vec<PlatformWork<'a>>),
}

/// One platform to install and write, with its inputs.
pub(super) struct PlatformWork<'a> {
    pub(super) prepared: &'a PreparedPlatform,
    /// What the lock pins for it.
    pub(super) locked: &'a PlatformLock,
    /// Its tree under the build's staging directory: one per platform, so a
    /// multi-platform build never mixes them.
    pub(super) rootfs: String,
}

/// What a plan is computed from: what is wanted (`'a`, which the plan's work borrows) and
/// what is there (`'r`, read only to decide).
pub(super) struct PlanInputs<'a, 'r> {
    /// Each platform of the recipe, prepared, in its order.
    pub(super) platforms: &'a [PreparedPlatform],
    /// The lock the build installs; it has each of the platforms.
    pub(super) lock: &'a Lock,
    /// What the last build with these inputs produced, if the build records hold it.
    pub(super) recorded: Option<&'r BuildRecord>,
    /// The image the layout holds under the recipe's tags (read only when there is a
    /// record).
    pub(super) in_place: Option<&'r ImageInPlace>,
}

impl<'a> BuildPlan<'a> {
    pub(super) fn new(inputs: &PlanInputs<'a, '_>) -> Self {
        let unchanged = match (inputs.recorded, inputs.in_place) {
            (Some(record), Some(image)) => unchanged(record, image, inputs.platforms),
            _ => None,
        };
        match unchanged {
            Some(image) => BuildPlan::Unchanged(image),
            None => BuildPlan::Build(work(inputs.platforms, inputs.lock)),
        }
    }
}

/// `image`, when it is the one `record` says these inputs made, whole: the tags name the
/// recorded digest, it has one manifest per platform, every blob is present, and its own
/// layers (those above each platform's base) are the recorded ones.
fn unchanged(
    record: &BuildRecord,
    image: &ImageInPlace,
    platforms: &[PreparedPlatform],
) -> Option<BuiltImage> {
    if image.digest != record.manifest_digest || image.manifests.len() != platforms.len() {
        return None;
    }
    let mut ours: Vec<&str> = Vec::new();
    for (manifest, platform) in image.manifests.iter().zip(platforms) {
        if !manifest.complete {
            return None;
        }
        let own = manifest.layers.get(platform.base_layers()..)?;
        ours.extend(own.iter().map(String::as_str));
    }
    let layers = record.reused_layers(&ours)?;
    // One platform: the tags name its manifest. Several: its index, listing theirs.
    let manifests = if platforms.len() > 1 {
        platforms
            .iter()
            .zip(&image.manifests)
            .map(|(p, m)| (p.platform, m.digest.clone()))
            .collect()
    } else {
        vec![(platforms[0].platform, image.digest.clone())]
    };
    Some(BuiltImage {
        digest: image.digest.clone(),
        manifests,
        layers,
    })
}

/// Every platform's work: the platform with its part of the lock and its staging tree.
pub(super) fn work<'a>(platforms: &'a [PreparedPlatform], lock: &'a Lock) -> Vec<PlatformWork<'a>> {
    let multi = platforms.len() > 1;
    platforms
        .iter()
        .map(|prepared| PlatformWork {
            prepared,
            locked: lock
                .platform(prepared.platform)
                .expect("a lock that satisfies the recipe has each of its platforms"),
            rootfs: match multi {
                true => format!("rootfs-{}", prepared.platform),
                false => "rootfs".to_string(),
            },
        })
        .collect()
}

/// The image a layout holds under a recipe's tags, as read from it.
#[derive(Debug, Clone)]
pub(super) struct ImageInPlace {
    /// What every one of the tags names: a manifest, or an image index.
    pub(super) digest: String,
    /// Its platform manifests in the index's order; itself when it is one manifest.
    pub(super) manifests: Vec<ManifestInPlace>,
}

/// One manifest of an [`ImageInPlace`].
#[derive(Debug, Clone)]
pub(super) struct ManifestInPlace {
    pub(super) digest: String,
    /// Its layers' digests, base layers first.
    pub(super) layers: Vec<String>,
    /// Whether its config and every layer are present, each at its size.
    pub(super) complete: bool,
}

impl ImageInPlace {
    /// The image `layout` holds under every one of `tags` (other images may be there too);
    /// `None` when a tag is missing, the tags name different images, or a manifest or index
    /// is missing or does not match its digest.
    pub(super) fn read(layout: &Layout, tags: &[String]) -> Option<Self> {
        // Other entries of the layout (other images' tags) are kept by every build, so only
        // the recipe's own tags decide.
        let index = layout.index().ok()?;
        let mut top: Option<&Descriptor> = None;
        for tag in tags {
            let descriptor = tagged(&index, tag)?;
            if top.is_some_and(|top| top.digest() != descriptor.digest()) {
                return None;
            }
            top = Some(descriptor);
        }
        let top = top?;
        // Through the layout reader: each manifest and index held to its descriptor, and a
        // blob present only as a reader would open it.
        let blobs = layout.blobs();
        let present = |descriptor: &Descriptor| blobs.open(descriptor).is_ok();
        let manifests = layout
            .platform_manifests(top)
            .ok()?
            .into_iter()
            .map(|(descriptor, manifest)| ManifestInPlace {
                digest: descriptor.digest().to_string(),
                layers: manifest
                    .layers()
                    .iter()
                    .map(|d| d.digest().to_string())
                    .collect(),
                complete: present(manifest.config()) && manifest.layers().iter().all(present),
            })
            .collect();
        Some(ImageInPlace {
            digest: top.digest().to_string(),
            manifests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        layers::{BuiltLayer, Compression, LayerBlob, LayerKind},
        lock::LockedBase,
        resolve::Target,
    };
    use rattler_conda_types::Subdir;

    const X86: Subdir = Subdir::Linux64;
    const ARM: Subdir = Subdir::LinuxAarch64;

    fn prepared(platform: Subdir) -> PreparedPlatform {
        PreparedPlatform {
            platform,
            base: None,
            target: target(platform),
            locked_base: LockedBase::Scratch,
            smoke: None,
            tables: None,
        }
    }

    fn target(platform: Subdir) -> Target {
        Target {
            platform,
            virtual_packages: Vec::new(),
        }
    }

    fn lock(platforms: &[Subdir]) -> Lock {
        Lock {
            channels: vec!["https://conda.anaconda.org/conda-forge/".to_string()],
            channel_priority: Default::default(),
            platforms: platforms
                .iter()
                .map(|&p| PlatformLock {
                    target: target(p),
                    base: LockedBase::Scratch,
                    records: Vec::new(),
                    wheels: Vec::new(),
                })
                .collect(),
            pypi: None,
        }
    }

    fn digest(name: &str) -> String {
        format!("sha256:{name:0>64}")
    }

    fn layer(name: &str) -> BuiltLayer {
        BuiltLayer {
            kind: LayerKind::Conda,
            name: name.to_string(),
            packages: vec![format!("{name}-1.0-0")],
            part: None,
            blob: LayerBlob {
                diff_id: digest(&format!("d{name}")),
                digest: digest(name),
                size: 10,
                tar_size: 20,
                media_type: Compression::Gzip.media_type(),
                annotations: Default::default(),
            },
            reused: false,
        }
    }

    fn manifest(name: &str, layers: &[&str]) -> ManifestInPlace {
        ManifestInPlace {
            digest: digest(name),
            layers: layers.iter().map(|l| digest(l)).collect(),
            complete: true,
        }
    }

    /// The plan of `platforms` given the record and the image in place.
    fn plan<'a>(
        platforms: &'a [PreparedPlatform],
        lock: &'a Lock,
        recorded: Option<&'a BuildRecord>,
        in_place: Option<&'a ImageInPlace>,
    ) -> BuildPlan<'a> {
        BuildPlan::new(&PlanInputs {
            platforms,
            lock,
            recorded,
            in_place,
        })
    }

    fn built(plan: &BuildPlan<'_>) -> Vec<(Subdir, String)> {
        match plan {
            BuildPlan::Build(work) => work
                .iter()
                .map(|w| (w.prepared.platform, w.rootfs.clone()))
                .collect(),
            BuildPlan::Unchanged(image) => panic!("unchanged: {image:?}"),
        }
    }

    fn one_platform() -> (Vec<PreparedPlatform>, Lock, BuildRecord, ImageInPlace) {
        let layers = [layer("a"), layer("b")];
        let record = BuildRecord::new(&digest("m"), &layers, Compression::Gzip);
        let image = ImageInPlace {
            digest: digest("m"),
            manifests: vec![manifest("m", &["a", "b"])],
        };
        (vec![prepared(X86)], lock(&[X86]), record, image)
    }

    #[test]
    fn unchanged_inputs_are_the_image_in_place() {
        let (platforms, lock, record, image) = one_platform();
        let BuildPlan::Unchanged(unchanged) = plan(&platforms, &lock, Some(&record), Some(&image))
        else {
            panic!("not unchanged");
        };
        assert_eq!(unchanged.digest, digest("m"));
        assert_eq!(unchanged.manifests, vec![(X86, digest("m"))]);
        let names: Vec<&str> = unchanged.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(unchanged.layers.iter().all(|l| l.reused));
        assert_eq!(unchanged.layers[1].blob.diff_id, digest("db"));
    }

    #[test]
    fn inputs_without_a_record_are_built() {
        // A changed lock gives another inputs key (see `rebuild`), which has no record.
        let (platforms, lock, _, image) = one_platform();
        let plan = plan(&platforms, &lock, None, Some(&image));
        assert_eq!(built(&plan), [(X86, "rootfs".to_string())]);
    }

    #[test]
    fn a_record_without_its_image_in_place_is_built() {
        let (platforms, lock, record, mut image) = one_platform();
        assert!(matches!(
            plan(&platforms, &lock, Some(&record), None),
            BuildPlan::Build(_)
        ));
        // The tags name another image: the layout was built from other inputs since.
        image.digest = digest("other");
        assert_eq!(
            built(&plan(&platforms, &lock, Some(&record), Some(&image))).len(),
            1
        );
    }

    #[test]
    fn a_missing_blob_is_built() {
        let (platforms, lock, record, mut image) = one_platform();
        image.manifests[0].complete = false;
        assert_eq!(
            built(&plan(&platforms, &lock, Some(&record), Some(&image))),
            [(X86, "rootfs".to_string())]
        );
    }

    #[test]
    fn layers_other_than_the_recorded_ones_are_built() {
        let (platforms, lock, record, mut image) = one_platform();
        image.manifests[0].layers = vec![digest("a"), digest("c")];
        assert!(matches!(
            plan(&platforms, &lock, Some(&record), Some(&image)),
            BuildPlan::Build(_)
        ));
        image.manifests[0].layers = vec![digest("a")];
        assert!(matches!(
            plan(&platforms, &lock, Some(&record), Some(&image)),
            BuildPlan::Build(_)
        ));
    }

    #[test]
    fn multi_platform_images_are_unchanged_or_built_whole() {
        let platforms = [prepared(X86), prepared(ARM)];
        let lock = lock(&[ARM, X86]);
        let layers = [layer("x1"), layer("x2"), layer("r1")];
        let record = BuildRecord::new(&digest("index"), &layers, Compression::Gzip);
        let mut image = ImageInPlace {
            digest: digest("index"),
            manifests: vec![manifest("mx", &["x1", "x2"]), manifest("mr", &["r1"])],
        };
        let BuildPlan::Unchanged(unchanged) = plan(&platforms, &lock, Some(&record), Some(&image))
        else {
            panic!("not unchanged");
        };
        assert_eq!(unchanged.digest, digest("index"));
        assert_eq!(
            unchanged.manifests,
            vec![(X86, digest("mx")), (ARM, digest("mr"))]
        );
        assert_eq!(unchanged.layers.len(), 3);

        // One platform's missing blob rebuilds both, each from its own platform's lock.
        image.manifests[1].complete = false;
        let plan = plan(&platforms, &lock, Some(&record), Some(&image));
        assert_eq!(
            built(&plan),
            [
                (X86, "rootfs-linux-64".to_string()),
                (ARM, "rootfs-linux-aarch64".to_string())
            ]
        );
        let BuildPlan::Build(work) = &plan else {
            unreachable!()
        };
        assert!(
            work.iter()
                .all(|w| w.locked.target.platform == w.prepared.platform)
        );

        // An index of another number of platforms is not this image.
        let mut image = image.clone();
        image.manifests[1].complete = true;
        image.manifests.pop();
        assert!(matches!(
            BuildPlan::new(&PlanInputs {
                platforms: &platforms,
                lock: &lock,
                recorded: Some(&record),
                in_place: Some(&image),
            }),
            BuildPlan::Build(_)
        ));
    }

    /// A layout holding one manifest, with a config and `layers` as blobs, under `tags`.
    fn layout_with(dir: &std::path::Path, layers: &[&[u8]], tags: &[&str]) -> (Layout, String) {
        use oci_spec::image::{ImageIndexBuilder, ImageManifestBuilder, MediaType};
        let layout = Layout::new(dir.join("image"));
        layout.prepare().unwrap();
        let blob = |bytes: &[u8], media_type: MediaType| {
            let digest = layout.write_blob(bytes).unwrap();
            Descriptor::new(
                media_type,
                bytes.len() as u64,
                digest.parse::<oci_spec::image::Digest>().unwrap(),
            )
        };
        let manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(blob(b"{}", MediaType::ImageConfig))
            .layers(
                layers
                    .iter()
                    .map(|l| blob(l, MediaType::ImageLayerGzip))
                    .collect::<Vec<_>>(),
            )
            .build()
            .unwrap();
        let (descriptor, _) = layout
            .write_json_blob(&manifest, MediaType::ImageManifest, "manifest")
            .unwrap();
        let entries = tags.iter().map(|tag| {
            let mut entry = descriptor.clone();
            entry.set_annotations(Some(
                [(crate::oci::layout::REF_NAME.to_string(), tag.to_string())].into(),
            ));
            entry
        });
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .manifests(entries.collect::<Vec<_>>())
            .build()
            .unwrap();
        layout.commit_index(&index).unwrap();
        (layout, descriptor.digest().to_string())
    }

    #[test]
    fn the_image_in_place_is_read_from_the_layout_under_every_tag() {
        let dir = tempfile::tempdir().unwrap();
        let (layout, manifest) = layout_with(dir.path(), &[b"one", b"two"], &["latest", "v1"]);
        let tags = ["latest".to_string(), "v1".to_string()];
        let image = ImageInPlace::read(&layout, &tags).unwrap();
        assert_eq!(image.digest, manifest);
        assert_eq!(image.manifests.len(), 1);
        assert_eq!(image.manifests[0].digest, manifest);
        assert_eq!(image.manifests[0].layers.len(), 2);
        assert!(image.manifests[0].complete);
        // A tag the layout does not have: not this recipe's image.
        assert!(ImageInPlace::read(&layout, &["other".to_string()]).is_none());

        // A layer blob gone (or cut short): the image is there, but not whole.
        let layer = image.manifests[0].layers[1].clone();
        fs_err::write(layout.blob_path(&layer), b"tw").unwrap();
        let image = ImageInPlace::read(&layout, &tags).unwrap();
        assert!(!image.manifests[0].complete);
        fs_err::remove_file(layout.blob_path(&layer)).unwrap();
        assert!(!ImageInPlace::read(&layout, &tags).unwrap().manifests[0].complete);

        // A manifest that does not match its digest is not read at all.
        fs_err::write(layout.blob_path(&manifest), b"{}").unwrap();
        assert!(ImageInPlace::read(&layout, &tags).is_none());
    }
}
