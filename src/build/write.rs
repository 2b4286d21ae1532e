//! Step 5: the image into the layout. The bases' blobs are imported, every platform's
//! planned layers are compressed (or taken from the layer cache), then each platform's
//! config and manifest are written, and last `index.json` switches the recipe's tags to
//! them, so a build that fails before leaves the image that was there. Unreferenced blobs
//! are collected after.

use std::time::{Duration, Instant};

use super::{
    error::BuildError,
    model::{BuiltImage, Context, counted},
    stage::StagedPlatform,
};
use crate::{
    layers::{
        BuiltLayer, LayerKind, LayerPlan, PlannedLayer, budget::layer_memory_from_env,
        cache::LayerCache, compress::CompressPool, remote::SharedCache, write::LayerWriter,
    },
    oci::{
        base::BaseError,
        image::{ImageInputs, WrittenImage, index_of, tag_entries, write_image},
        layout::Layout,
    },
    registry::cache_repo::CacheRepo,
    report::Stage,
};

/// A package layer of a staged platform's plan, with the key the layer caches file it under.
pub(super) struct KeyedLayer<'p> {
    pub(super) key: String,
    pub(super) layer: &'p PlannedLayer,
    /// The index of its platform among the staged ones.
    pub(super) platform: usize,
}

/// What the layers of one build share: the layer cache (none when it cannot be used) and
/// the compression pool.
struct Tools {
    cache: Option<LayerCache>,
    pool: CompressPool,
}

/// The staged platforms into one layout.
pub(super) struct Writer<'a> {
    cx: &'a Context<'a>,
    layout: &'a Layout,
    shared: Option<&'a dyn SharedCache>,
}

impl<'a> Writer<'a> {
    pub(super) fn new(cx: &'a Context<'a>, layout: &'a Layout) -> Self {
        Writer {
            cx,
            layout,
            shared: None,
        }
    }

    /// Looks layers up in, and offers them to, `shared` too.
    pub(super) fn sharing(mut self, shared: Option<&'a CacheRepo>) -> Self {
        self.shared = shared.map(|s| s as &dyn SharedCache);
        self
    }

    /// Writes every platform's layers and image, then switches `index.json` to them. A
    /// layout this build created is removed again when that fails.
    pub(super) fn write(
        &self,
        platforms: &[StagedPlatform<'_>],
        timings: &mut Vec<(Stage, Duration)>,
    ) -> Result<BuiltImage, BuildError> {
        let created_dir = self.layout.prepare()?;
        let result = self.write_output(platforms, timings);
        if result.is_err() && created_dir {
            // Nothing was there before this build: leave nothing behind.
            let _ = fs_err::remove_dir_all(&self.layout.dir);
        }
        result
    }

    fn write_output(
        &self,
        platforms: &[StagedPlatform<'_>],
        timings: &mut Vec<(Stage, Duration)>,
    ) -> Result<BuiltImage, BuildError> {
        let started = Instant::now();
        self.import_base_blobs(platforms)?;
        let layers = self.write_layers(platforms)?;
        timings.push((Stage::Layers, started.elapsed()));

        let started = Instant::now();
        let layout = self.layout;
        self.cx
            .reporter
            .on_stage(Stage::Write, &layout.dir.display().to_string());
        let (digest, images) = self.write_images(platforms, &layers)?;
        let removed = layout.collect_garbage(self.cx.reporter)?;
        tracing::debug!("removed {removed} unreferenced blobs");
        timings.push((Stage::Write, started.elapsed()));
        let manifests = platforms
            .iter()
            .zip(&images)
            .map(|(p, image)| {
                (
                    p.work.prepared.platform,
                    image.manifest.digest().to_string(),
                )
            })
            .collect();
        Ok(BuiltImage {
            digest,
            manifests,
            layers: layers.into_iter().flatten().collect(),
        })
    }

    /// The bases' layers, which the images name, from the cache into the layout.
    fn import_base_blobs(&self, platforms: &[StagedPlatform<'_>]) -> Result<(), BuildError> {
        for platform in platforms {
            if let Some(base) = &platform.work.prepared.base {
                for layer in &base.layers {
                    // Opened beneath the base's directory as a regular file of the
                    // descriptor's size; its digest is checked as it is copied.
                    let file = base.blobs.open(layer).map_err(BaseError::from)?;
                    let digest = layer.digest().to_string();
                    self.layout
                        .import_blob(file, &base.blobs.path(&digest), &digest)?;
                }
            }
        }
        Ok(())
    }

    /// Every platform's planned layers as blobs, as one `Layers` stage; each platform's
    /// layers in its plan's order, then the recipe's own (accounts, files).
    fn write_layers(
        &self,
        platforms: &[StagedPlatform<'_>],
    ) -> Result<Vec<Vec<BuiltLayer>>, BuildError> {
        let reporter = self.cx.reporter;
        let total: usize = platforms
            .iter()
            .map(|p| p.plan.layers.len() + p.owned.len())
            .sum();
        reporter.on_stage(Stage::Layers, &counted(total, "layer"));
        reporter.on_stage_total(Stage::Layers, total);
        let blobs_dir = self.layout.blobs_dir();
        let tools = self.tools()?;
        let mut platform_layers = Vec::with_capacity(platforms.len());
        for platform in platforms {
            let writer = self.layer_writer(platform, &tools, &blobs_dir);
            let mut layers = writer.write_all(&platform.plan)?;
            // The recipe's own layers are small next to the environment's: one at a time.
            for owned in &platform.owned {
                let layer = writer.write_owned(owned)?;
                reporter.on_item_done(Stage::Layers, &layer.blob.digest, layer.blob.size);
                layers.push(layer);
            }
            platform_layers.push(layers);
        }
        Ok(platform_layers)
    }

    /// Every package layer of `platforms` (the layers the caches share) with its cache key,
    /// for a sharded build to assign; none without a layer cache.
    pub(super) fn package_layers<'p>(
        &self,
        platforms: &'p [StagedPlatform<'_>],
    ) -> Result<Vec<KeyedLayer<'p>>, BuildError> {
        let tools = self.tools()?;
        let blobs_dir = self.layout.blobs_dir();
        let mut keyed = Vec::new();
        for (index, platform) in platforms.iter().enumerate() {
            let writer = self.layer_writer(platform, &tools, &blobs_dir);
            for layer in &platform.plan.layers {
                if !matches!(layer.kind, LayerKind::Conda | LayerKind::Wheels) {
                    continue;
                }
                if let Some(key) = writer.key(layer)? {
                    keyed.push(KeyedLayer {
                        key,
                        layer,
                        platform: index,
                    });
                }
            }
        }
        Ok(keyed)
    }

    /// The `picked` package layers of `platforms` (from [`Self::package_layers`]), written
    /// into the layout's blobs and so into the layer caches, as one `Layers` stage; with
    /// their keys.
    pub(super) fn write_picked(
        &self,
        platforms: &[StagedPlatform<'_>],
        picked: &[&KeyedLayer<'_>],
    ) -> Result<Vec<(String, BuiltLayer)>, BuildError> {
        let reporter = self.cx.reporter;
        reporter.on_stage(Stage::Layers, &counted(picked.len(), "layer"));
        reporter.on_stage_total(Stage::Layers, picked.len());
        let tools = self.tools()?;
        let blobs_dir = self.layout.blobs_dir();
        let mut written = Vec::with_capacity(picked.len());
        for (index, platform) in platforms.iter().enumerate() {
            let mine: Vec<&KeyedLayer> = picked
                .iter()
                .copied()
                .filter(|l| l.platform == index)
                .collect();
            let plan = LayerPlan {
                layers: mine.iter().map(|l| l.layer.clone()).collect(),
            };
            let writer = self.layer_writer(platform, &tools, &blobs_dir);
            let layers = writer.write_all(&plan)?;
            written.extend(mine.iter().map(|l| l.key.clone()).zip(layers));
        }
        Ok(written)
    }

    /// The layer cache and the compression pool the layers of one build share.
    fn tools(&self) -> Result<Tools, BuildError> {
        let (settings, reporter) = (self.cx.settings, self.cx.reporter);
        let cache = match LayerCache::open(&settings.cache_dir, reporter) {
            Ok(cache) => Some(cache),
            // A cache directory that is a link or a file is not written through: the build
            // goes on without it.
            Err(err) if err.kind() == std::io::ErrorKind::InvalidData => {
                reporter.on_warning(&format!("not using the layer cache: {err}"));
                None
            }
            Err(source) => {
                return Err(BuildError::Staging {
                    path: settings.cache_dir.join("layers"),
                    source,
                });
            }
        };
        let staging = |source| BuildError::Staging {
            path: settings.cache_dir.clone(),
            source,
        };
        let memory = layer_memory_from_env()
            .map_err(|e| staging(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        let pool = CompressPool::new(settings.jobs)
            .map_err(staging)?
            .with_memory(memory);
        Ok(Tools { cache, pool })
    }

    /// The writer of one platform's layers into `blobs_dir`.
    fn layer_writer<'w>(
        &'w self,
        platform: &'w StagedPlatform<'_>,
        tools: &'w Tools,
        blobs_dir: &'w std::path::Path,
    ) -> LayerWriter<'w> {
        LayerWriter {
            root: &platform.root,
            compression: self.cx.recipe.compression,
            blobs_dir,
            pool: tools.pool.clone(),
            cache: tools.cache.as_ref(),
            shared: self.shared,
            prefetch: &self.cx.recipe.prefetch,
            reporter: self.cx.reporter,
        }
    }

    /// Each platform's config and manifest, then `index.json` naming them under the
    /// recipe's tags (through an image index for several platforms). Returns what the tags
    /// name and the images.
    fn write_images(
        &self,
        platforms: &[StagedPlatform<'_>],
        layers: &[Vec<BuiltLayer>],
    ) -> Result<(String, Vec<WrittenImage>), BuildError> {
        let (layout, recipe) = (self.layout, self.cx.recipe);
        let created = rfc3339_utc(self.cx.created_seconds);
        let mut images = Vec::with_capacity(platforms.len());
        for (platform, layers) in platforms.iter().zip(layers) {
            images.push(write_image(
                layout,
                &ImageInputs {
                    name: &recipe.name,
                    prefix: &recipe.prefix,
                    config: &recipe.config,
                    platform: platform.work.prepared.platform,
                    base: platform.work.prepared.base.as_ref(),
                    base_name: &recipe.base_reference,
                    activation: &platform.activation,
                    layers,
                    created: created.clone(),
                    compression: recipe.compression,
                    annotations: platform.annotations.clone(),
                },
            )?);
        }
        let entries = tag_entries(layout, &recipe.name, &recipe.tags, &created, &images)?;
        let digest = entries
            .first()
            .map(|e| e.digest().to_string())
            .expect("a recipe has at least one tag");
        layout.commit_tags(&index_of(entries)?)?;
        Ok((digest, images))
    }
}

/// `seconds` since the epoch as an RFC 3339 UTC time, for `created`. Civil time, because
/// jiff's `Timestamp` ends a day before 9999-12-31T23:59:59Z (the last `SOURCE_DATE_EPOCH`
/// accepted), where the image would silently say 1970.
pub(super) fn rfc3339_utc(seconds: i64) -> String {
    let epoch = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0);
    epoch
        .checked_add(jiff::SignedDuration::from_secs(seconds.max(0)))
        .unwrap_or(epoch)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
