//! What is in a built image, read back from its OCI layout: `imgbuild inspect` and
//! `imgbuild diff`.
//!
//! Everything comes from the layout alone (index, manifest, config and the annotations a
//! build writes), never from the recipe or the lock, so an image copied to another machine
//! or made by an older imgbuild is described the same way. Layer contents are not read: the
//! packages of a layer are its `dev.imgbuild.layer.packages` annotation.

use crate::oci::read::ReadLayoutRef;
use std::collections::{BTreeMap, BTreeSet};

use oci_spec::image::Descriptor;
use serde::Serialize;

use rattler_conda_types::Subdir;

use crate::{
    layers::{LayerKind, LayerPart},
    oci::{
        annotations,
        read::{LayoutImage, LayoutRef, ReadError},
    },
};

const BASE_NAME: &str = "org.opencontainers.image.base.name";
const BASE_DIGEST: &str = "org.opencontainers.image.base.digest";

/// An image as `inspect` shows it. Serialized as the `--json` output.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct ImageSummary {
    /// The reference as given (`images/x:latest`).
    pub image: String,
    /// The image index the tag names, for a multi-platform image; the rest of the summary
    /// describes one of its platform images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<String>,
    /// The platforms of a multi-platform image (`linux/arm64/v8`), in index order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub platforms: Vec<String>,
    pub manifest_digest: String,
    pub config_digest: String,
    pub created: Option<String>,
    pub os: String,
    pub architecture: String,
    pub config: RuntimeConfig,
    /// The base image, from the manifest's `org.opencontainers.image.base.*` annotations.
    pub base: Option<BaseReference>,
    /// The conda platform and prefix the image was built for, when imgbuild built it.
    pub conda: Option<CondaTarget>,
    pub cuda: Option<CudaNeeds>,
    /// The GPU architectures the image's libraries carry kernels for, when any does.
    pub gpu: Option<GpuArchitectures>,
    /// In-image path of the embedded smoke executable (`[smoke] embed = true`).
    pub smoke: Option<String>,
    /// Bottom first.
    pub layers: Vec<LayerSummary>,
    /// Sum of the compressed layer sizes: what a pull with no cached layer downloads.
    pub total_size: u64,
    /// Every package of every layer (`name-version-build`), sorted.
    pub packages: Vec<String>,
}

/// How the image runs: the parts of the config a user sets.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub(crate) struct RuntimeConfig {
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub user: Option<String>,
    pub workdir: Option<String>,
    /// `KEY=value`, in the image's order.
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Exposed ports (`8080/tcp`), sorted; absent from the JSON when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// The signal that stops a container (`SIGTERM`, `SIGRTMIN+3`, `9`); absent from the
    /// JSON when the image sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct BaseReference {
    pub name: Option<String>,
    pub digest: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct CondaTarget {
    pub platform: Option<String>,
    pub prefix: Option<String>,
}

/// What the image needs from the host to run its CUDA code.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct CudaNeeds {
    /// `dev.imgbuild.cuda.version`: the CUDA runtime the image targets.
    pub version: Option<String>,
    /// `dev.imgbuild.cuda.min-driver`: the oldest driver it was built to run on.
    pub min_driver: Option<String>,
    /// `NVIDIA_REQUIRE_CUDA` from the config, which the NVIDIA container toolkit enforces.
    pub require_cuda: Option<String>,
    /// `CUDA_VERSION` from the config.
    pub cuda_version: Option<String>,
}

/// Which GPUs the image's kernels run on, from the annotations a build writes after reading
/// the libraries' CUDA fatbins (see [`crate::cuda::fatbin`]).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct GpuArchitectures {
    /// `dev.imgbuild.cuda.architectures`: every library's together, SASS (`sm_80`) then PTX
    /// (`compute_90`).
    pub architectures: Vec<String>,
    /// `dev.imgbuild.cuda.package-architectures`: each package's, by name.
    pub packages: Vec<PackageGpuArchitectures>,
}

/// One package's GPU architectures, as the annotation records them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct PackageGpuArchitectures {
    pub package: String,
    pub architectures: Vec<String>,
    /// `dev.imgbuild.cuda.ptx-isa`: the PTX ISA of each of its PTX architectures
    /// (`compute_90:8.1`); absent for a package without PTX and images of older versions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ptx_isa: Vec<String>,
}

/// The GPU architectures the manifest's annotations record, if any.
fn gpu_architectures(
    union: Option<&String>,
    per_package: Option<&String>,
    ptx_isa: Option<&String>,
) -> Option<GpuArchitectures> {
    let ptx = ptx_isa
        .map(|value| crate::cuda::fatbin::parse_ptx_annotation(value))
        .unwrap_or_default();
    let ptx_of = |package: &str| -> Vec<String> {
        ptx.iter()
            .find(|(name, _)| name == package)
            .map(|(_, isas)| {
                isas.iter()
                    .map(|(sm, isa)| format!("compute_{sm}:{isa}"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let names = |archs: &crate::cuda::fatbin::Architectures| {
        archs.iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    // The union as written; an item this imgbuild cannot read is shown as it is.
    let architectures: Vec<String> = union?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let packages = per_package
        .map(|value| crate::cuda::fatbin::parse_package_annotation(value))
        .unwrap_or_default()
        .iter()
        .map(|(package, archs)| PackageGpuArchitectures {
            package: package.clone(),
            architectures: names(archs),
            ptx_isa: ptx_of(package),
        })
        .collect();
    Some(GpuArchitectures {
        architectures,
        packages,
    })
}

/// What a layer is in the image read back: a base's, or one of the build's, by the
/// [`LayerKind`] its annotation names (conda and wheel layers both hold packages).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LayerRole {
    /// A layer of the base image, reused as it is.
    Base,
    /// One or more conda packages.
    Packages,
    /// The image's own files: what no package owns.
    ImageFiles,
    /// The `imgbuild-smoke` executable (`[smoke] embed = true`), on top.
    Smoke,
    /// `[accounts]`: `/etc/passwd`, `/etc/group`, home directories and the user's workdir.
    Accounts,
    /// One `[[files]]` entry of the recipe.
    Files,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct LayerSummary {
    pub digest: String,
    /// Compressed size in bytes.
    pub size: u64,
    pub media_type: String,
    #[serde(rename = "kind")]
    pub role: LayerRole,
    /// `name-version-build` of each package in the layer.
    pub packages: Vec<String>,
    /// Which part of its one package the layer is (`2/3`), when `[layers] split` split it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum InspectError {
    #[error("Cannot open image `{image}`")]
    Open {
        image: String,
        #[source]
        source: ReadError,
    },
    #[error("Cannot read the registry image `{image}`")]
    Pull {
        image: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// [`inspect_platform`] of a layout, or of a registry reference that names its registry
/// (as `smoke` takes them): then only its manifest and config are fetched (into the cache
/// under `cache_dir`, digests checked), never its layers.
pub(crate) async fn inspect_any(
    image: &str,
    platform: Option<Subdir>,
    cache_dir: &std::path::Path,
    options: &crate::registry::ClientOptions,
) -> Result<ImageSummary, InspectError> {
    let crate::smoke::ImageSource::Registry(reference) = crate::smoke::ImageSource::of(image)
    else {
        return inspect_platform(image, platform);
    };
    let pull = |source: Box<dyn std::error::Error + Send + Sync>| InspectError::Pull {
        image: image.to_string(),
        source,
    };
    let credentials =
        crate::registry::auth::credentials_for(&reference.registry).map_err(|e| pull(e.into()))?;
    let client = crate::registry::RepositoryClient::new(&reference, credentials, options)
        .map_err(|e| pull(e.into()))?;
    let subdir = platform.or_else(Subdir::current).unwrap_or(Subdir::Linux64);
    let (architecture, variant) =
        crate::recipe::oci_architecture(subdir).unwrap_or(("amd64", None));
    let platform = crate::registry::pull::Platform {
        architecture,
        variant,
    };
    let remote = crate::registry::pull::pull_config(&client, platform, cache_dir)
        .await
        .map_err(|e| pull(e.into()))?;
    let opened = LayoutImage {
        reference: remote.reference,
        index: None,
        manifest_digest: remote.manifest_digest,
        layers: remote.manifest.layers().clone(),
        manifest: remote.manifest,
        config: remote.config,
    };
    Ok(summarize(image, &opened))
}

/// Reads the image `LAYOUT[:TAG]` (tag `latest` by default); of a multi-platform image, the
/// build host's platform when it has it, else its first.
pub(crate) fn inspect(image: &str) -> Result<ImageSummary, InspectError> {
    inspect_platform(image, None)
}

/// [`inspect`] of the image of `platform`, when given.
pub(crate) fn inspect_platform(
    image: &str,
    platform: Option<Subdir>,
) -> Result<ImageSummary, InspectError> {
    let opened = LayoutRef::parse(image)
        .image(platform)
        .map_err(|source| InspectError::Open {
            image: image.to_string(),
            source,
        })?;
    let mut summary = summarize(image, &opened);
    if let Some(index) = &opened.index {
        summary.platforms = index
            .platforms
            .iter()
            .filter_map(|p| crate::recipe::OciPlatform::of(*p))
            .map(|p| p.to_string())
            .collect();
        summary.index_digest = Some(index.digest.clone());
    }
    Ok(summary)
}

impl ImageSummary {
    /// Whether a conda package (`jupyterlab-4.3.8-pyhd8ed1ab_0`) or a wheel
    /// (`pypi:jupyterlab-4.3.8`) of the image is JupyterLab.
    pub(crate) fn has_jupyterlab(&self) -> bool {
        self.packages.iter().any(|label| {
            let package = crate::layers::plan::wheel_of_label(label).unwrap_or(label);
            package
                .strip_prefix("jupyterlab-")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
    }

    /// The digest that names the whole image: its index's for a multi-platform image, so a
    /// node of any of its platforms pulls its own; else its manifest's.
    pub(crate) fn image_digest(&self) -> &str {
        self.index_digest
            .as_deref()
            .unwrap_or(&self.manifest_digest)
    }
}

fn summarize(image: &str, opened: &LayoutImage) -> ImageSummary {
    let manifest = &opened.manifest;
    let manifest_annotations = manifest.annotations().clone().unwrap_or_default();
    let annotation = |key: &str| manifest_annotations.get(key).cloned();
    let config = opened.config.config().clone().unwrap_or_default();
    let env = config.env().clone().unwrap_or_default();
    let env_var = |key: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };

    let cuda = CudaNeeds {
        version: annotation(annotations::CUDA_VERSION),
        min_driver: annotation(annotations::CUDA_MIN_DRIVER),
        require_cuda: env_var("NVIDIA_REQUIRE_CUDA"),
        cuda_version: env_var("CUDA_VERSION"),
    };
    let has_cuda = cuda.version.is_some()
        || cuda.min_driver.is_some()
        || cuda.require_cuda.is_some()
        || cuda.cuda_version.is_some();
    let base = (annotation(BASE_NAME).is_some() || annotation(BASE_DIGEST).is_some()).then(|| {
        BaseReference {
            name: annotation(BASE_NAME),
            digest: annotation(BASE_DIGEST),
        }
    });
    let conda = (annotation(annotations::PLATFORM).is_some()
        || annotation(annotations::PREFIX).is_some())
    .then(|| CondaTarget {
        platform: annotation(annotations::PLATFORM),
        prefix: annotation(annotations::PREFIX),
    });

    let built_by_imgbuild = conda.is_some();
    let layers = classify_layers(&opened.layers, built_by_imgbuild);
    let packages: BTreeSet<String> = layers
        .iter()
        .flat_map(|l| l.packages.iter().cloned())
        .collect();
    ImageSummary {
        image: image.to_string(),
        index_digest: None,
        platforms: Vec::new(),
        manifest_digest: opened.manifest_digest.clone(),
        config_digest: manifest.config().digest().to_string(),
        created: opened.config.created().clone(),
        os: opened.config.os().to_string(),
        architecture: opened.config.architecture().to_string(),
        config: RuntimeConfig {
            entrypoint: config.entrypoint().clone(),
            cmd: config.cmd().clone(),
            user: config.user().clone(),
            workdir: config.working_dir().clone(),
            env: env.clone(),
            labels: config
                .labels()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            ports: config
                .exposed_ports()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            stop_signal: config.stop_signal().clone(),
        },
        base,
        conda,
        cuda: has_cuda.then_some(cuda),
        gpu: gpu_architectures(
            manifest_annotations.get(annotations::CUDA_ARCHITECTURES),
            manifest_annotations.get(annotations::CUDA_PACKAGE_ARCHITECTURES),
            manifest_annotations.get(annotations::CUDA_PTX_ISA),
        ),
        smoke: annotation(annotations::SMOKE),
        total_size: layers.iter().map(|l| l.size).sum(),
        layers,
        packages: packages.into_iter().collect(),
    }
}

fn layer_packages(layer: &Descriptor) -> Vec<String> {
    layer
        .annotations()
        .as_ref()
        .and_then(|a| a.get(annotations::PACKAGES))
        .map(|list| {
            list.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The kind of one of the build's layers, from its annotation.
fn layer_kind(layer: &Descriptor) -> Option<LayerKind> {
    layer
        .annotations()
        .as_ref()
        .and_then(LayerKind::from_annotations)
}

/// How many layers on top are not the image-files layer or below it: the smoke executable
/// and the recipe's accounts and files layers.
fn top_layers(layers: &[Descriptor]) -> usize {
    layers
        .iter()
        .rev()
        .take_while(|l| {
            matches!(
                layer_kind(l),
                Some(LayerKind::Smoke | LayerKind::Accounts | LayerKind::Files)
            )
        })
        .count()
}

/// Where the layers an imgbuild build added begin. An imgbuild image is the base's layers,
/// then package layers, then one layer of the image's own files (then, with `[smoke] embed`,
/// the smoke executable's, and the recipe's accounts and files layers); so its own layers
/// are the run of package layers under the image-files layer. A base that is itself an
/// imgbuild image ends in its own image-files (or smoke, accounts, files) layer, which has
/// no packages, so the run stops there.
pub(crate) fn own_layers_start(layers: &[Descriptor]) -> usize {
    let image_files = layers.len() - top_layers(layers);
    if image_files == 0 {
        return 0;
    }
    let mut start = image_files - 1;
    while start > 0 && !layer_packages(&layers[start - 1]).is_empty() {
        start -= 1;
    }
    start
}

/// Names what each layer holds (see [`own_layers_start`]). A base that is itself an imgbuild
/// image keeps its package annotations, and its packages are listed.
fn classify_layers(layers: &[Descriptor], built_by_imgbuild: bool) -> Vec<LayerSummary> {
    let image_files = layers.len() - top_layers(layers);
    let own_start = if built_by_imgbuild {
        own_layers_start(layers)
    } else {
        layers.len()
    };
    layers
        .iter()
        .enumerate()
        .map(|(position, layer)| {
            let packages = layer_packages(layer);
            let role = match layer_kind(layer) {
                Some(LayerKind::Conda | LayerKind::Wheels) => LayerRole::Packages,
                Some(LayerKind::Smoke) => LayerRole::Smoke,
                Some(LayerKind::Accounts) => LayerRole::Accounts,
                Some(LayerKind::Files) => LayerRole::Files,
                Some(LayerKind::Image) | None
                    if built_by_imgbuild && position + 1 == image_files =>
                {
                    LayerRole::ImageFiles
                }
                Some(LayerKind::Image) | None => LayerRole::Base,
            };
            debug_assert!(role != LayerRole::Base || position < own_start);
            LayerSummary {
                digest: layer.digest().to_string(),
                size: layer.size(),
                media_type: layer.media_type().to_string(),
                role,
                packages,
                part: layer_part(layer),
            }
        })
        .collect()
}

/// The part of its package a layer is, from its annotation, as `2/3`.
pub(crate) fn layer_part(layer: &Descriptor) -> Option<String> {
    let text = layer.annotations().as_ref()?.get(annotations::LAYER_PART)?;
    LayerPart::parse(text).map(|part| part.to_string())
}

/// A package as a layer annotation names it: `name-version-build`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PackageId {
    pub name: String,
    pub version: String,
    pub build: String,
}

impl PackageId {
    /// Splits `name-version-build`. Conda forbids `-` in versions and build strings, so the
    /// last two dashes separate the three (names may hold dashes: `cuda-cudart`).
    pub(crate) fn parse(text: &str) -> Option<PackageId> {
        let (rest, build) = text.rsplit_once('-')?;
        let (name, version) = rest.rsplit_once('-')?;
        (!name.is_empty() && !version.is_empty() && !build.is_empty()).then(|| PackageId {
            name: name.to_string(),
            version: version.to_string(),
            build: build.to_string(),
        })
    }

    /// `version-build`, how a change shows one side.
    pub(crate) fn version_build(&self) -> String {
        format!("{}-{}", self.version, self.build)
    }
}

/// A package in both images with a different version or build.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct PackageChange {
    pub name: String,
    /// `version-build` in the first image.
    pub from: String,
    /// `version-build` in the second image.
    pub to: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct LayerRef {
    pub digest: String,
    pub size: u64,
    /// The layer's packages, or `base` / `image files`.
    pub holds: String,
}

/// What changed from image A to image B. Serialized as the `diff --json` output.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct ImageDiff {
    pub from: DiffSide,
    pub to: DiffSide,
    /// Packages in B only, sorted by name.
    pub added: Vec<PackageId>,
    /// Packages in A only, sorted by name.
    pub removed: Vec<PackageId>,
    /// Packages in both with a different version or build, sorted by name.
    pub changed: Vec<PackageChange>,
    /// How the image runs, where it differs (see [`config_changes`]).
    pub config: Vec<ConfigChange>,
    /// Layers of B that A also has (by digest): a node holding A pulls none of them.
    pub shared_layers: Vec<LayerRef>,
    /// Layers of B that A does not have: what a node holding A downloads to run B.
    pub new_layers: Vec<LayerRef>,
    /// Layers of A that B no longer has.
    pub dropped_layers: Vec<LayerRef>,
    /// Sum of the sizes of `new_layers`.
    pub new_bytes: u64,
    /// `to.total_size - from.total_size`.
    pub size_delta: i64,
}

/// One setting of the config that differs: `entrypoint`, `cmd`, `user`, `workdir`, `ports`,
/// `stop-signal`, or one variable (`env NAME`) or label (`label KEY`); `None` where a side does not set it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct ConfigChange {
    pub field: String,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// The settings of [`RuntimeConfig`] that differ from `from` to `to`, in the order the config
/// shows them: an image switched to root with a new entrypoint is a different image even
/// with the same packages. Lists are compared as JSON arrays; env and labels by name, so
/// one changed variable is one change.
pub(crate) fn config_changes(from: &RuntimeConfig, to: &RuntimeConfig) -> Vec<ConfigChange> {
    let list = |l: &Option<Vec<String>>| {
        l.as_ref()
            .map(|l| serde_json::to_string(l).unwrap_or_default())
    };
    let ports = |p: &[String]| (!p.is_empty()).then(|| p.join(" "));
    let mut changes = Vec::new();
    let mut compare = |field: String, from: Option<String>, to: Option<String>| {
        if from != to {
            changes.push(ConfigChange { field, from, to });
        }
    };
    compare(
        "entrypoint".into(),
        list(&from.entrypoint),
        list(&to.entrypoint),
    );
    compare("cmd".into(), list(&from.cmd), list(&to.cmd));
    compare("user".into(), from.user.clone(), to.user.clone());
    compare("workdir".into(), from.workdir.clone(), to.workdir.clone());
    let (old_env, new_env) = (env_by_name(&from.env), env_by_name(&to.env));
    for name in old_env
        .keys()
        .chain(new_env.keys())
        .collect::<BTreeSet<_>>()
    {
        compare(
            format!("env {name}"),
            old_env.get(name).map(|v| v.to_string()),
            new_env.get(name).map(|v| v.to_string()),
        );
    }
    for key in from
        .labels
        .keys()
        .chain(to.labels.keys())
        .collect::<BTreeSet<_>>()
    {
        compare(
            format!("label {key}"),
            from.labels.get(key).cloned(),
            to.labels.get(key).cloned(),
        );
    }
    compare("ports".into(), ports(&from.ports), ports(&to.ports));
    compare(
        "stop-signal".into(),
        from.stop_signal.clone(),
        to.stop_signal.clone(),
    );
    changes
}

/// `KEY=value` entries by name (an entry without `=` is a name with an empty value).
fn env_by_name(env: &[String]) -> BTreeMap<&str, &str> {
    env.iter()
        .map(|entry| entry.split_once('=').unwrap_or((entry.as_str(), "")))
        .collect()
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct DiffSide {
    pub image: String,
    pub manifest_digest: String,
    pub total_size: u64,
    pub layers: usize,
}

/// Compares two images by their package annotations and layer digests.
pub(crate) fn diff(from: &ImageSummary, to: &ImageSummary) -> ImageDiff {
    // A name can appear more than once only in a broken image; the last one wins.
    let by_name = |summary: &ImageSummary| -> BTreeMap<String, PackageId> {
        summary
            .packages
            .iter()
            .filter_map(|p| PackageId::parse(p))
            .map(|p| (p.name.clone(), p))
            .collect()
    };
    let (old, new) = (by_name(from), by_name(to));
    let added = new
        .iter()
        .filter(|(name, _)| !old.contains_key(*name))
        .map(|(_, p)| p.clone())
        .collect();
    let removed = old
        .iter()
        .filter(|(name, _)| !new.contains_key(*name))
        .map(|(_, p)| p.clone())
        .collect();
    let changed = new
        .iter()
        .filter_map(|(name, to)| {
            let from = old.get(name)?;
            (from != to).then(|| PackageChange {
                name: name.clone(),
                from: from.version_build(),
                to: to.version_build(),
            })
        })
        .collect();

    let digests = |summary: &ImageSummary| -> BTreeSet<String> {
        summary.layers.iter().map(|l| l.digest.clone()).collect()
    };
    let (old_digests, new_digests) = (digests(from), digests(to));
    let layer_ref = |layer: &LayerSummary| LayerRef {
        digest: layer.digest.clone(),
        size: layer.size,
        holds: describe_layer(layer),
    };
    let shared_layers = to
        .layers
        .iter()
        .filter(|l| old_digests.contains(&l.digest))
        .map(layer_ref)
        .collect();
    let new_layers: Vec<LayerRef> = to
        .layers
        .iter()
        .filter(|l| !old_digests.contains(&l.digest))
        .map(layer_ref)
        .collect();
    let dropped_layers = from
        .layers
        .iter()
        .filter(|l| !new_digests.contains(&l.digest))
        .map(layer_ref)
        .collect();
    let new_bytes = new_layers.iter().map(|l| l.size).sum();
    let side = |summary: &ImageSummary| DiffSide {
        image: summary.image.clone(),
        manifest_digest: summary.manifest_digest.clone(),
        total_size: summary.total_size,
        layers: summary.layers.len(),
    };
    ImageDiff {
        from: side(from),
        to: side(to),
        added,
        removed,
        changed,
        config: config_changes(&from.config, &to.config),
        shared_layers,
        new_layers,
        dropped_layers,
        new_bytes,
        size_delta: to.total_size as i64 - from.total_size as i64,
    }
}

/// What a layer holds, in words: its packages, `base`, `image files` or `smoke test`.
pub(crate) fn describe_layer(layer: &LayerSummary) -> String {
    match layer.role {
        LayerRole::Packages => match &layer.part {
            Some(part) => format!("{} (part {part})", layer.packages.join(", ")),
            None => layer.packages.join(", "),
        },
        LayerRole::Base => "base".to_string(),
        LayerRole::ImageFiles => "image files".to_string(),
        LayerRole::Smoke => "smoke test executable".to_string(),
        LayerRole::Accounts => "accounts".to_string(),
        LayerRole::Files => "files".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_ids_split_at_the_last_two_dashes() {
        let id = PackageId::parse("cuda-cudart-11.8.89-h0_0").unwrap();
        assert_eq!(
            (id.name.as_str(), id.version.as_str(), id.build.as_str()),
            ("cuda-cudart", "11.8.89", "h0_0")
        );
        assert_eq!(id.version_build(), "11.8.89-h0_0");
        assert_eq!(
            PackageId::parse("_r-mutex-1.0.1-anacondar_1").unwrap().name,
            "_r-mutex"
        );
        assert!(PackageId::parse("hello-1.0").is_none());
        assert!(PackageId::parse("nodash").is_none());
    }

    fn layer(digest: &str, size: u64, role: LayerRole, packages: &[&str]) -> LayerSummary {
        LayerSummary {
            digest: digest.into(),
            size,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            role,
            packages: packages.iter().map(|p| p.to_string()).collect(),
            part: None,
        }
    }

    fn summary(image: &str, layers: Vec<LayerSummary>) -> ImageSummary {
        let mut packages: Vec<String> = layers
            .iter()
            .flat_map(|l| l.packages.iter().cloned())
            .collect();
        packages.sort();
        ImageSummary {
            image: image.into(),
            index_digest: None,
            platforms: Vec::new(),
            manifest_digest: format!("sha256:{image}"),
            config_digest: "sha256:c".into(),
            created: None,
            os: "linux".into(),
            architecture: "amd64".into(),
            config: RuntimeConfig::default(),
            base: None,
            conda: None,
            cuda: None,
            gpu: None,
            smoke: None,
            total_size: layers.iter().map(|l| l.size).sum(),
            layers,
            packages,
        }
    }

    #[test]
    fn diff_sorts_packages_into_added_removed_changed() {
        let a = summary(
            "a",
            vec![
                layer("sha256:b0", 100, LayerRole::Base, &[]),
                layer("sha256:p1", 10, LayerRole::Packages, &["zlib-1.2-h0_0"]),
                layer("sha256:p2", 20, LayerRole::Packages, &["hello-1.0-h0_0"]),
                layer("sha256:i1", 1, LayerRole::ImageFiles, &[]),
            ],
        );
        let b = summary(
            "b",
            vec![
                layer("sha256:b0", 100, LayerRole::Base, &[]),
                layer("sha256:p3", 30, LayerRole::Packages, &["hello-2.0-h0_0"]),
                layer(
                    "sha256:p4",
                    40,
                    LayerRole::Packages,
                    &["cuda-cudart-11.8.89-h0_0"],
                ),
                layer("sha256:i2", 2, LayerRole::ImageFiles, &[]),
            ],
        );
        let d = diff(&a, &b);
        assert_eq!(
            d.added.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["cuda-cudart"]
        );
        assert_eq!(
            d.removed
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["zlib"]
        );
        assert_eq!(
            d.changed,
            [PackageChange {
                name: "hello".into(),
                from: "1.0-h0_0".into(),
                to: "2.0-h0_0".into()
            }]
        );
        assert_eq!(d.shared_layers.len(), 1);
        assert_eq!(d.shared_layers[0].holds, "base");
        assert_eq!(d.new_layers.len(), 3);
        assert_eq!(d.new_bytes, 72);
        assert_eq!(d.dropped_layers.len(), 3);
        assert_eq!(d.size_delta, 172 - 131);
        assert!(diff(&a, &a).changed.is_empty());
        assert_eq!(diff(&a, &a).new_bytes, 0);
        assert!(diff(&a, &a).config.is_empty());
    }

    #[test]
    fn config_changes_name_each_setting_that_differs() {
        let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let from = RuntimeConfig {
            entrypoint: Some(strings(&["/opt/conda/bin/python"])),
            cmd: Some(strings(&["-c", "1"])),
            user: Some("1000".into()),
            workdir: Some("/work".into()),
            env: strings(&["PATH=/opt/conda/bin", "KEEP=1", "GONE=x"]),
            labels: [("team".to_string(), "ml".to_string())].into(),
            ports: strings(&["8080/tcp"]),
            stop_signal: None,
        };
        let to = RuntimeConfig {
            entrypoint: Some(strings(&["/bin/sh"])),
            cmd: Some(strings(&["-c", "1"])),
            user: Some("0".into()),
            workdir: Some("/work".into()),
            env: strings(&["KEEP=1", "PATH=/usr/bin", "NEW=y"]),
            labels: [("team".to_string(), "infra".to_string())].into(),
            ports: strings(&["8080/tcp", "9000/udp"]),
            stop_signal: Some("SIGINT".into()),
        };
        let change = |field: &str, from: Option<&str>, to: Option<&str>| ConfigChange {
            field: field.into(),
            from: from.map(Into::into),
            to: to.map(Into::into),
        };
        assert_eq!(
            config_changes(&from, &to),
            [
                change(
                    "entrypoint",
                    Some("[\"/opt/conda/bin/python\"]"),
                    Some("[\"/bin/sh\"]")
                ),
                change("user", Some("1000"), Some("0")),
                change("env GONE", Some("x"), None),
                change("env NEW", None, Some("y")),
                change("env PATH", Some("/opt/conda/bin"), Some("/usr/bin")),
                change("label team", Some("ml"), Some("infra")),
                change("ports", Some("8080/tcp"), Some("8080/tcp 9000/udp")),
                change("stop-signal", None, Some("SIGINT")),
            ]
        );
        assert!(config_changes(&from, &from).is_empty());
    }
}
