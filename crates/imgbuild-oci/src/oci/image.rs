//! The image config, manifest and index of a build: base config merged with the
//! environment's activation, the checked [`ImageConfig`], and one history entry per layer.

use std::collections::{BTreeMap, HashMap};

use indexmap::IndexMap;
use oci_spec::image::{
    Arch, Config, ConfigBuilder, Descriptor, DescriptorBuilder, HistoryBuilder, ImageConfiguration,
    ImageConfigurationBuilder, ImageIndexBuilder, ImageManifest, ImageManifestBuilder, MediaType,
    Os, Platform, PlatformBuilder, RootFsBuilder, SCHEMA_VERSION,
};
use rattler_conda_types::Subdir;

use super::{
    annotations,
    base::BaseImage,
    layout::{Layout, LayoutError},
};
use crate::{
    compression::Compression,
    image_config::ImageConfig,
    layers::{BuiltLayer, LayerKind},
    names::oci_architecture,
};

/// `PATH` of an image whose base does not set one (Docker's default).
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Environment variables that activating the conda environment sets, in the image's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activation {
    /// Directories to put in front of `PATH` (e.g. `/opt/conda/bin`).
    pub path: Vec<String>,
    /// Variables in the order activation sets them.
    pub variables: IndexMap<String, String>,
}

/// Everything that goes into the image's JSON.
#[derive(Debug)]
pub struct ImageInputs<'a> {
    /// The image's name, its title annotation.
    pub name: &'a str,
    /// The in-image path of the conda environment.
    pub prefix: &'a str,
    /// How the image runs, on top of the base's config.
    pub config: &'a ImageConfig,
    /// The platform of this image (one of the recipe's).
    pub platform: Subdir,
    pub base: Option<&'a BaseImage>,
    /// The base as the recipe wrote it (`oci:../base:v1`, no path of the build host), the
    /// `base.name` annotation when there is a base.
    pub base_name: &'a str,
    pub activation: &'a Activation,
    /// Our layers, bottom first, with the blob written for each.
    pub layers: &'a [BuiltLayer],
    /// RFC 3339 creation time.
    pub created: String,
    pub compression: Compression,
    /// More manifest annotations (e.g. the CUDA version and minimum driver).
    pub annotations: IndexMap<String, String>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct WrittenImage {
    pub manifest: Descriptor,
    /// The OCI platform the manifest is for, as index entries name it.
    pub platform: Platform,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("Failed to assemble the image {what}")]
    Spec {
        what: &'static str,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

fn spec_err(what: &'static str) -> impl FnOnce(oci_spec::OciSpecError) -> ImageError {
    move |source| ImageError::Spec { what, source }
}

/// Merges `base` env, the activation and the recipe's `env`, later ones winning, and
/// returns `KEY=value` strings. The base's order is kept; new keys follow in order.
pub fn merge_env(
    base: &[String],
    activation: &Activation,
    recipe_env: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut env: IndexMap<String, String> = base
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let base_path = env
        .get("PATH")
        .cloned()
        .unwrap_or_else(|| DEFAULT_PATH.to_string());
    let mut path: Vec<String> = activation.path.clone();
    path.extend(
        base_path
            .split(':')
            .filter(|p| !p.is_empty() && !activation.path.iter().any(|a| a == p))
            .map(str::to_string),
    );
    env.insert("PATH".to_string(), path.join(":"));
    for (key, value) in &activation.variables {
        // Library search paths add to the base's, in front.
        let value = match (key.as_str(), env.get(key)) {
            ("LD_LIBRARY_PATH", Some(base)) if !base.is_empty() => format!("{value}:{base}"),
            _ => value.clone(),
        };
        env.insert(key.clone(), value);
    }
    for (key, value) in recipe_env {
        env.insert(key.clone(), value.clone());
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Writes config and manifest blobs into `layout` and returns the index entries to commit.
/// The documents are built first ([`image_config`], [`image_manifest`]), then written.
pub fn write_image(layout: &Layout, inputs: &ImageInputs<'_>) -> Result<WrittenImage, ImageError> {
    let config = image_config(inputs)?;
    let (config_descriptor, _) =
        layout.write_json_blob(&config, MediaType::ImageConfig, "the image config")?;
    let manifest = image_manifest(inputs, config_descriptor.clone())?;
    let (manifest_descriptor, _) =
        layout.write_json_blob(&manifest, MediaType::ImageManifest, "the image manifest")?;
    Ok(WrittenImage {
        manifest: manifest_descriptor,
        platform: oci_platform(inputs.platform)?,
    })
}

/// The image config: the base's runtime config with the recipe's settings, and the base's
/// diff ids and history followed by ours.
pub(crate) fn image_config(inputs: &ImageInputs<'_>) -> Result<ImageConfiguration, ImageError> {
    let (architecture, variant) = oci_architecture(inputs.platform).expect("validated platform");
    let mut diff_ids: Vec<String> = inputs
        .base
        .map(|b| b.config.rootfs().diff_ids().clone())
        .unwrap_or_default();
    let mut history = inputs
        .base
        .and_then(|b| b.config.history().clone())
        .unwrap_or_default();
    for layer in inputs.layers {
        diff_ids.push(layer.blob.diff_id.clone());
        history.push(
            HistoryBuilder::default()
                .created(inputs.created.clone())
                .created_by(history_line(layer))
                .build()
                .map_err(spec_err("history"))?,
        );
    }
    let mut image_config = ImageConfigurationBuilder::default()
        .created(inputs.created.clone())
        .architecture(Arch::from(architecture))
        .os(Os::Linux)
        .config(runtime_config(inputs)?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(diff_ids)
                .build()
                .map_err(spec_err("rootfs"))?,
        )
        .history(history)
        .build()
        .map_err(spec_err("config"))?;
    if let Some(variant) = variant {
        image_config.set_variant(Some(variant.to_string()));
    }
    Ok(image_config)
}

/// The config a container runs with: the base's, with the environment's activation and the
/// image config's env, entrypoint, cmd, workdir, user, ports, stop signal and labels on top.
fn runtime_config(inputs: &ImageInputs<'_>) -> Result<Config, ImageError> {
    let image = inputs.config;
    let base_config = inputs.base.and_then(|b| b.config.config().clone());
    let mut config: Config = match base_config {
        Some(config) => config,
        None => ConfigBuilder::default()
            .build()
            .map_err(spec_err("config"))?,
    };
    let base_env = config.env().clone().unwrap_or_default();
    config.set_env(Some(merge_env(&base_env, inputs.activation, &image.env)));
    if let Some(entrypoint) = &image.entrypoint {
        config.set_entrypoint(Some(entrypoint.clone()));
        // As in a Dockerfile: a new entrypoint drops the base's command.
        config.set_cmd(image.cmd.clone());
    } else if let Some(cmd) = &image.cmd {
        config.set_cmd(Some(cmd.clone()));
    }
    if let Some(workdir) = &image.workdir {
        config.set_working_dir(Some(workdir.clone()));
    }
    if let Some(user) = &image.user {
        config.set_user(Some(user.clone()));
    }
    // As Dockerfile's EXPOSE: the recipe's ports add to the base's. Left untouched when the
    // recipe names none, so such an image's config is what it always was.
    if !image.ports.is_empty() {
        let mut ports: Vec<String> = config.exposed_ports().clone().unwrap_or_default();
        ports.extend(image.ports.iter().cloned());
        ports.sort();
        ports.dedup();
        config.set_exposed_ports(Some(ports));
    }
    if let Some(signal) = &image.stop_signal {
        config.set_stop_signal(Some(signal.clone()));
    }
    let mut labels: HashMap<String, String> = config.labels().clone().unwrap_or_default();
    labels.extend(image.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    config.set_labels((!labels.is_empty()).then_some(labels));
    Ok(config)
}

/// The manifest of the image whose config blob is `config`: the base's layers, then ours.
pub(crate) fn image_manifest(
    inputs: &ImageInputs<'_>,
    config: Descriptor,
) -> Result<ImageManifest, ImageError> {
    let mut layers: Vec<Descriptor> = inputs.base.map(|b| b.layers.clone()).unwrap_or_default();
    layers.extend(inputs.layers.iter().map(layer_descriptor));
    ImageManifestBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(layers)
        .annotations(manifest_annotations(inputs))
        .build()
        .map_err(spec_err("manifest"))
}

/// The manifest's descriptor of one of our layers, with its annotation.
fn layer_descriptor(layer: &BuiltLayer) -> Descriptor {
    let blob = &layer.blob;
    let mut descriptor = Descriptor::new(
        MediaType::from(blob.media_type),
        blob.size,
        blob.digest
            .parse::<oci_spec::image::Digest>()
            .expect("sha256 digest"),
    );
    let mut annotations: HashMap<String, String> = layer_annotations(layer).collect();
    // Where a lazy or partial pull finds the layer's TOC (eStargz, zstd:chunked).
    annotations.extend(blob.annotations.clone());
    if !annotations.is_empty() {
        descriptor.set_annotations(Some(annotations));
    }
    descriptor
}

/// The manifest's annotations: when and what it is, how its layers are compressed, its
/// conda platform and prefix, the base it is built on, and the caller's (CUDA) ones.
fn manifest_annotations(inputs: &ImageInputs<'_>) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (
            "org.opencontainers.image.created".to_string(),
            inputs.created.clone(),
        ),
        (
            "org.opencontainers.image.title".to_string(),
            inputs.name.to_string(),
        ),
        (
            annotations::COMPRESSION.to_string(),
            inputs.compression.describe(),
        ),
        (
            annotations::PLATFORM.to_string(),
            inputs.platform.to_string(),
        ),
        (annotations::PREFIX.to_string(), inputs.prefix.to_string()),
    ]);
    annotations.extend(inputs.annotations.clone());
    if let Some(base) = inputs.base {
        annotations.insert(
            "org.opencontainers.image.base.name".to_string(),
            inputs.base_name.to_string(),
        );
        annotations.insert(
            "org.opencontainers.image.base.digest".to_string(),
            base.manifest_digest.clone(),
        );
    }
    annotations
}

/// The OCI platform of a conda subdir, as index entries name it.
fn oci_platform(subdir: Subdir) -> Result<Platform, ImageError> {
    let (architecture, variant) = oci_architecture(subdir).expect("validated platform");
    let mut platform = PlatformBuilder::default()
        .architecture(Arch::from(architecture))
        .os(Os::Linux);
    if let Some(variant) = variant {
        platform = platform.variant(variant.to_string());
    }
    platform.build().map_err(spec_err("platform"))
}

/// The `index.json` entries of image `name`, one per tag: the platform image itself when
/// there is one platform (what single-platform tools expect), else an image index of the
/// platform images, written into `layout`, in the recipe's platform order.
pub fn tag_entries(
    layout: &Layout,
    name: &str,
    tags: &[String],
    created: &str,
    images: &[WrittenImage],
) -> Result<Vec<Descriptor>, ImageError> {
    // A one-platform entry names its platform, as it always has; an index has none.
    let (target, platform) = match images {
        [image] => (image.manifest.clone(), Some(image.platform.clone())),
        _ => {
            let manifests = images
                .iter()
                .map(|image| {
                    DescriptorBuilder::default()
                        .media_type(MediaType::ImageManifest)
                        .size(image.manifest.size())
                        .digest(image.manifest.digest().clone())
                        .platform(image.platform.clone())
                        .build()
                        .map_err(spec_err("index entry"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut index = index_of(manifests)?;
            // As on each manifest: what pushes (SBOM artifacts) and readers take the
            // image's time and name from.
            index.set_annotations(Some(HashMap::from([
                (
                    "org.opencontainers.image.created".to_string(),
                    created.to_string(),
                ),
                (
                    "org.opencontainers.image.title".to_string(),
                    name.to_string(),
                ),
            ])));
            let (descriptor, _) =
                layout.write_json_blob(&index, MediaType::ImageIndex, "the image index")?;
            (descriptor, None)
        }
    };
    tags.iter()
        .map(|tag| {
            let mut builder = DescriptorBuilder::default()
                .media_type(target.media_type().clone())
                .size(target.size())
                .digest(target.digest().clone());
            if let Some(platform) = &platform {
                builder = builder.platform(platform.clone());
            }
            builder
                .annotations(HashMap::from([(
                    "org.opencontainers.image.ref.name".to_string(),
                    tag.clone(),
                )]))
                .build()
                .map_err(spec_err("index entry"))
        })
        .collect()
}

/// The `index.json` that lists `manifests`.
pub fn index_of(manifests: Vec<Descriptor>) -> Result<oci_spec::image::ImageIndex, ImageError> {
    ImageIndexBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageIndex)
        .manifests(manifests)
        .build()
        .map_err(spec_err("index"))
}

/// The history line of one of our layers: what it holds, as `imgbuild: conda a b`.
fn history_line(layer: &BuiltLayer) -> String {
    match layer.kind {
        LayerKind::Smoke => "imgbuild: smoke test executable".to_string(),
        LayerKind::Image => "imgbuild: image files".to_string(),
        LayerKind::Conda => format!(
            "imgbuild: conda {}{}",
            layer.packages.join(" "),
            part(layer)
        ),
        LayerKind::Wheels => format!("imgbuild: pypi {}{}", layer.packages.join(" "), part(layer)),
        LayerKind::Accounts | LayerKind::Files => format!("imgbuild: {}", layer.name),
    }
}

/// ` (part 2/3)` for a part of a split package, else nothing.
fn part(layer: &BuiltLayer) -> String {
    layer
        .part
        .map(|part| format!(" (part {part})"))
        .unwrap_or_default()
}

/// The annotations a layer carries: its kind's ([`LayerKind::annotation`]), and which part
/// of its package it is when the package was split.
fn layer_annotations(layer: &BuiltLayer) -> impl Iterator<Item = (String, String)> {
    let kind = layer.kind.annotation(&layer.packages);
    let part = layer.part.map(|part| part.to_string());
    kind.map(|(key, value)| (key.to_string(), value))
        .into_iter()
        .chain(part.map(|part| (annotations::LAYER_PART.to_string(), part)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(digest_char: char, architecture: &str, variant: Option<&str>) -> WrittenImage {
        let mut platform = PlatformBuilder::default()
            .architecture(Arch::from(architecture))
            .os(Os::Linux);
        if let Some(variant) = variant {
            platform = platform.variant(variant.to_string());
        }
        WrittenImage {
            manifest: Descriptor::new(
                MediaType::ImageManifest,
                1234,
                format!("sha256:{}", digest_char.to_string().repeat(64))
                    .parse::<oci_spec::image::Digest>()
                    .unwrap(),
            ),
            platform: platform.build().unwrap(),
        }
    }

    #[test]
    fn one_platform_tags_name_the_manifest_and_several_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("image"));
        layout.prepare().unwrap();
        let tags = ["latest", "v1"].map(String::from);
        let created = "2023-10-01T00:00:00Z";

        let arm = written('a', "arm64", Some("v8"));
        let single = tag_entries(&layout, "x", &tags, created, std::slice::from_ref(&arm)).unwrap();
        assert_eq!(single.len(), 2);
        for entry in &single {
            assert_eq!(*entry.media_type(), MediaType::ImageManifest);
            assert_eq!(entry.digest(), arm.manifest.digest());
            assert_eq!(entry.platform().as_ref(), Some(&arm.platform));
        }

        let both = [written('b', "amd64", None), arm.clone()];
        let entries = tag_entries(&layout, "x", &tags, created, &both).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].digest(), entries[1].digest());
        let entry = &entries[0];
        assert_eq!(*entry.media_type(), MediaType::ImageIndex);
        assert!(entry.platform().is_none());
        let bytes = fs_err::read(layout.blob_path(entry.digest().as_ref())).unwrap();
        assert_eq!(
            super::super::sha256_digest(&bytes),
            entry.digest().to_string()
        );
        let index: oci_spec::image::ImageIndex = serde_json::from_slice(&bytes).unwrap();
        let platforms: Vec<String> = index
            .manifests()
            .iter()
            .map(|m| {
                let p = m.platform().as_ref().unwrap();
                format!("{}/{}/{:?}", p.os(), p.architecture(), p.variant())
            })
            .collect();
        assert_eq!(platforms, ["linux/amd64/None", "linux/arm64/Some(\"v8\")"]);
        let annotations = index.annotations().as_ref().unwrap();
        assert_eq!(annotations["org.opencontainers.image.created"], created);
        assert_eq!(annotations["org.opencontainers.image.title"], "x");
        // Canonical: the same images give the same index bytes.
        let again = tag_entries(&layout, "x", &tags, created, &both).unwrap();
        assert_eq!(again[0].digest(), entry.digest());
    }

    #[test]
    fn env_merge_prepends_path_and_lets_the_recipe_win() {
        let activation = Activation {
            path: vec!["/opt/conda/bin".into()],
            variables: IndexMap::from([
                ("CONDA_PREFIX".to_string(), "/opt/conda".to_string()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
            ]),
        };
        let base = vec!["PATH=/usr/bin:/bin".to_string(), "LANG=C".to_string()];
        let recipe = BTreeMap::from([("LANG".to_string(), "en_US.UTF-8".to_string())]);
        assert_eq!(
            merge_env(&base, &activation, &recipe),
            vec![
                "PATH=/opt/conda/bin:/usr/bin:/bin",
                "LANG=en_US.UTF-8",
                "CONDA_PREFIX=/opt/conda"
            ]
        );
        assert_eq!(
            merge_env(&[], &activation, &BTreeMap::new())[0],
            format!("PATH=/opt/conda/bin:{DEFAULT_PATH}")
        );
        let cuda = Activation {
            path: vec![],
            variables: IndexMap::from([(
                "LD_LIBRARY_PATH".to_string(),
                "/usr/local/nvidia/lib64".to_string(),
            )]),
        };
        let base = vec!["LD_LIBRARY_PATH=/usr/lib/extra".to_string()];
        assert_eq!(
            merge_env(&base, &cuda, &BTreeMap::new())[0],
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/lib/extra"
        );
    }

    /// The recipe's ports add to the base's (sorted, each once) and its stop signal replaces
    /// the base's; a recipe without either leaves the base's config as it was.
    #[test]
    fn ports_add_to_the_bases_and_the_stop_signal_is_set() {
        let base_config: ImageConfiguration = serde_json::from_value(serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"ExposedPorts": {"22/tcp": {}, "8888/tcp": {}}, "StopSignal": "SIGQUIT"},
            "rootfs": {"type": "layers", "diff_ids": []}
        }))
        .unwrap();
        let base = BaseImage {
            reference: "oci:base".into(),
            manifest_digest: format!("sha256:{}", "b".repeat(64)),
            config: base_config,
            layers: Vec::new(),
            blobs: crate::oci::blobs::BlobStore::flat(std::path::Path::new("/nowhere")),
        };
        let config_of = |config: &ImageConfig, base: Option<&BaseImage>| {
            let inputs = ImageInputs {
                name: "x",
                prefix: "/opt/conda",
                config,
                platform: Subdir::Linux64,
                base,
                base_name: "oci:base",
                activation: &Activation::default(),
                layers: &[],
                created: "2023-10-01T00:00:00Z".into(),
                compression: Compression::Gzip,
                annotations: IndexMap::new(),
            };
            runtime_config(&inputs).unwrap()
        };
        let set = ImageConfig {
            ports: vec!["53/udp".into(), "8888/tcp".into()],
            stop_signal: Some("SIGINT".into()),
            ..ImageConfig::default()
        };
        let config = config_of(&set, Some(&base));
        assert_eq!(
            config.exposed_ports().as_deref(),
            Some(&["22/tcp", "53/udp", "8888/tcp"].map(String::from)[..])
        );
        assert_eq!(config.stop_signal().as_deref(), Some("SIGINT"));
        let unset = ImageConfig::default();
        let config = config_of(&unset, Some(&base));
        assert_eq!(config.exposed_ports().as_ref().map(Vec::len), Some(2));
        assert_eq!(config.stop_signal().as_deref(), Some("SIGQUIT"));
        let config = config_of(&unset, None);
        assert!(config.exposed_ports().is_none());
        assert!(config.stop_signal().is_none());
        let json = serde_json::to_value(config_of(&set, None)).unwrap();
        assert_eq!(
            json["ExposedPorts"],
            serde_json::json!({"53/udp": {}, "8888/tcp": {}})
        );
        assert_eq!(json["StopSignal"], "SIGINT");
    }
}
