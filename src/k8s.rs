//! Kubernetes manifests for a built image, from typed objects (k8s-openapi, API 1.33): a Job
//! (run once, e.g. training) or a Deployment. The image is referenced by its registry digest,
//! never by a tag; a CUDA image asks for `nvidia.com/gpu` and is kept off nodes whose driver
//! is older than the image's minimum, using the labels NVIDIA's GPU feature discovery puts on
//! GPU nodes; the pod runs as a non-root user with no privilege escalation.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        batch::v1::{Job, JobSpec},
        core::v1::{
            Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container,
            EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource, LocalObjectReference,
            NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
            ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
            PodTemplateSpec, ResourceRequirements, SeccompProfile, SecretVolumeSource,
            SecurityContext, Toleration, Volume, VolumeMount,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta},
    },
};

use crate::{cuda::compat::DriverVersion, inspect::ImageSummary};

/// GPU feature discovery's labels for the host driver version (`535.104.05` → `535`, `104`,
/// `05`).
pub const DRIVER_MAJOR_LABEL: &str = "nvidia.com/cuda.driver.major";
pub const DRIVER_MINOR_LABEL: &str = "nvidia.com/cuda.driver.minor";
pub const DRIVER_REV_LABEL: &str = "nvidia.com/cuda.driver.rev";
/// GPU feature discovery's labels for the GPU's compute capability (`8.6` → `8`, `6`).
pub const COMPUTE_MAJOR_LABEL: &str = "nvidia.com/gpu.compute.major";
pub const COMPUTE_MINOR_LABEL: &str = "nvidia.com/gpu.compute.minor";
/// The newest compute capability major the requirement spells out one by one; above it
/// only PTX runs, so a node either runs everything there (every package has PTX) or nothing.
const NEWEST_KNOWN_MAJOR: u32 = 12;
/// The extended resource NVIDIA's device plugin advertises.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The well-known node labels of the kubelet: a pod goes only to nodes that can run the
/// image's platforms (a mixed amd64/arm64 cluster would otherwise start an amd64-only image on
/// an arm64 node, to fail there with "exec format error" or a pull with no matching manifest).
pub const OS_LABEL: &str = "kubernetes.io/os";
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The user a pod runs as when the image sets none: conda prefixes are world-readable, so
/// any unprivileged uid can run them.
pub const DEFAULT_UID: i64 = 1000;

/// The volume `--set shm=SIZE` mounts at `/dev/shm`.
pub const SHM_VOLUME: &str = "shm";
/// The effects a taint (and so a toleration) may have.
pub const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// How long a smoke Job may run before Kubernetes ends it.
const SMOKE_DEADLINE_SECONDS: i64 = 600;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Job,
    Deployment,
    /// A Job that runs the image's embedded smoke test (`[smoke] embed = true`) on one GPU.
    SmokeJob,
}

/// What the manifest says beyond the image: the `--set` keys and flags.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    pub kind: WorkloadKind,
    /// `REGISTRY/REPO`, where the image was pushed.
    pub repository: String,
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    pub cpu: Option<String>,
    pub memory: Option<String>,
    /// GPUs per pod; default 1 for a CUDA image, else 0.
    pub gpus: Option<u32>,
    pub replicas: i32,
    pub runtime_class: Option<String>,
    pub pull_secrets: Vec<String>,
    /// `--any-gpu-architecture`: do not require nodes whose compute capability the image's
    /// kernels run on.
    pub any_gpu_architecture: bool,
    /// Require GPU feature discovery's labels (driver and compute capability) of GPU nodes;
    /// `--no-gpu-feature-discovery` turns it off for clusters without GFD.
    pub gpu_feature_discovery: bool,
    /// Tolerate the `nvidia.com/gpu` taint of GPU node pools (a GPU pod only);
    /// `--no-gpu-toleration` turns it off.
    pub gpu_toleration: bool,
    /// `--toleration`: more taints the pod tolerates.
    pub tolerations: Vec<Toleration>,
    /// `--set shm=SIZE`: a memory-backed `/dev/shm` of at most SIZE.
    pub shm: Option<String>,
    /// `--env NAME=VALUE`, in the order given (a value may refer to an earlier `$(NAME)`).
    pub env: Vec<(String, String)>,
    /// `--volume`: PVCs and node directories mounted into the container.
    pub volumes: Vec<DataVolume>,
}

/// Where a `--volume`'s data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// A PersistentVolumeClaim by name (`pvc:CLAIM`).
    Claim(String),
    /// A directory of the node (`host:/DIR`).
    Host(String),
}

/// A `--volume NAME=pvc:CLAIM:PATH[:ro]` or `NAME=host:DIR:PATH[:ro]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataVolume {
    pub name: String,
    pub source: DataSource,
    pub mount_path: String,
    pub read_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    #[error(
        "`{repository}` is not a repository like `registry.example/team/image` (no tag, no digest: the manifest adds the image's digest)"
    )]
    Repository { repository: String },
    #[error(
        "`{name}` is not a valid Kubernetes name: lower-case letters, digits and `-`, starting and ending with a letter or digit, at most 63 characters"
    )]
    Name { name: String },
    #[error("The image's minimum driver `{value}` cannot be read: {message}")]
    Driver { value: String, message: String },
    #[error(
        "The image's user `{user}` is a name, which Kubernetes cannot check against runAsNonRoot; give the image a numeric `user` (e.g. `1000:1000`) or set `--set user=UID[:GID]`"
    )]
    NamedUser { user: String },
    #[error("`--set user={value}` must be `UID` or `UID:GID` with a non-zero UID")]
    User { value: String },
    #[error(
        "`{image}` has no embedded smoke test: build it with `[smoke] embed = true` in the recipe (see `imgbuild smoke` for testing on this machine instead)"
    )]
    NoSmoke { image: String },
    #[error(
        "No GPU runs the kernels of every package of `{image}` (their architectures: {packages}), so no node would match; rebuild with packages for one GPU generation, or pass `--any-gpu-architecture` to leave the compute capability out"
    )]
    NoGpuArchitecture { image: String, packages: String },
    #[error(
        "`{value}` is not a volume: {reason} (the form is `NAME=pvc:CLAIM:PATH[:ro]` or `NAME=host:DIR:PATH[:ro]`)"
    )]
    Volume { value: String, reason: String },
    #[error(
        "`{value}` is not a toleration: {reason} (the form is `KEY[=VALUE][:EFFECT]`, EFFECT one of NoSchedule, PreferNoSchedule, NoExecute)"
    )]
    Toleration { value: String, reason: String },
    #[error("`{value}` is not an environment variable: {reason} (the form is `NAME=VALUE`)")]
    Env { value: String, reason: String },
    #[error("`--set {key}={value}` is not a Kubernetes quantity like `16Gi`, `512Mi` or `500m`")]
    Quantity { key: String, value: String },
    #[error("{what} `{value}` is given twice")]
    Duplicate { what: &'static str, value: String },
    #[error("Failed to write YAML")]
    Yaml(#[source] serde_yaml::Error),
}

/// A manifest ready to print.
pub enum Workload {
    Job(Box<Job>),
    Deployment(Box<Deployment>),
    /// `--build-job`: the recipe and its locks, and the Indexed Job that builds them.
    BuildJob(Box<ConfigMap>, Box<Job>),
}

impl Workload {
    /// YAML, one document per object.
    pub fn to_yaml(&self) -> Result<String, K8sError> {
        match self {
            Workload::Job(job) => serde_yaml::to_string(job),
            Workload::Deployment(deployment) => serde_yaml::to_string(deployment),
            Workload::BuildJob(config, job) => serde_yaml::to_string(config)
                .and_then(|c| serde_yaml::to_string(job).map(|j| format!("{c}---\n{j}"))),
        }
        .map_err(K8sError::Yaml)
    }
}

/// What `--build-job` builds: a recipe (with its `[matrix]`, if any) and the locks of every
/// variant, which pin what the pods build.
#[derive(Debug, Clone)]
pub struct BuildJobOptions {
    pub name: String,
    pub namespace: Option<String>,
    /// The imgbuild image the pods run.
    pub builder_image: String,
    /// Where each pod pushes its image (`REGISTRY/REPO`; the tag is the variant's own).
    pub repository: String,
    pub recipe_file_name: String,
    pub recipe_text: String,
    /// `(file name, text)` of every variant's lock.
    pub locks: Vec<(String, String)>,
    /// Number of variants; 0 for a recipe without a matrix (one pod).
    pub variants: usize,
    pub pull_secrets: Vec<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret with the credentials to push.
    pub push_secret: Option<String>,
    pub cpu: Option<String>,
    pub memory: Option<String>,
    /// `--toleration`: taints the build pods tolerate (e.g. of dedicated build nodes).
    pub tolerations: Vec<Toleration>,
}

/// The ConfigMap holding the recipe and locks, and an Indexed Job with one pod per variant:
/// pod `i` runs `imgbuild build RECIPE --locked --variant i --push REPO`. imgbuild needs no
/// daemon and no privileges, so the pods are plain non-root pods with two scratch volumes.
pub fn build_job(options: &BuildJobOptions) -> Result<Workload, K8sError> {
    if !is_dns_label(&options.name) {
        return Err(K8sError::Name {
            name: options.name.clone(),
        });
    }
    let config_name = format!("{}-recipe", options.name);
    let mut data = BTreeMap::from([(
        options.recipe_file_name.clone(),
        options.recipe_text.clone(),
    )]);
    data.extend(options.locks.iter().cloned());
    let labels = labels(&options.name);
    let config = ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_name.clone()),
            namespace: options.namespace.clone(),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };

    let mut args = vec![
        "build".to_string(),
        format!("/recipes/{}", options.recipe_file_name),
        "--locked".to_string(),
        "--push".to_string(),
        options.repository.clone(),
    ];
    if options.variants > 0 {
        args.extend(["--variant".to_string(), "$(VARIANT_INDEX)".to_string()]);
    }
    let mut env = vec![
        EnvVar {
            name: "IMGBUILD_CACHE_DIR".into(),
            value: Some("/cache".into()),
            ..Default::default()
        },
        EnvVar {
            name: "HOME".into(),
            value: Some("/work".into()),
            ..Default::default()
        },
        // The pod's index in the Job, through the downward API, so `$(VARIANT_INDEX)` in
        // the arguments is expanded by the kubelet.
        EnvVar {
            name: "VARIANT_INDEX".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                        .into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut mounts = vec![
        VolumeMount {
            name: "recipes".into(),
            mount_path: "/recipes".into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: "work".into(),
            mount_path: "/work".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "cache".into(),
            mount_path: "/cache".into(),
            ..Default::default()
        },
    ];
    let mut volumes = vec![
        Volume {
            name: "recipes".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_name,
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "work".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "cache".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    ];
    if let Some(secret) = &options.push_secret {
        env.push(EnvVar {
            name: "REGISTRY_AUTH_FILE".into(),
            value: Some("/auth/.dockerconfigjson".into()),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "auth".into(),
            mount_path: "/auth".into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "auth".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let mut limits = BTreeMap::new();
    if let Some(cpu) = &options.cpu {
        limits.insert("cpu".to_string(), Quantity(cpu.clone()));
    }
    if let Some(memory) = &options.memory {
        limits.insert("memory".to_string(), Quantity(memory.clone()));
    }
    let container = Container {
        name: "imgbuild".into(),
        image: Some(options.builder_image.clone()),
        args: Some(args),
        env: Some(env),
        working_dir: Some("/work".into()),
        volume_mounts: Some(mounts),
        resources: (!limits.is_empty()).then(|| ResourceRequirements {
            requests: Some(limits.clone()),
            limits: Some(limits),
            ..Default::default()
        }),
        security_context: Some(container_security()),
        ..Default::default()
    };
    let pods = i32::try_from(options.variants.max(1)).unwrap_or(i32::MAX);
    let job = Job {
        metadata: ObjectMeta {
            name: Some(options.name.clone()),
            namespace: options.namespace.clone(),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(pods),
            parallelism: Some(pods),
            // One retry per variant: a flaky registry should not fail the matrix, a broken
            // variant should not be rebuilt in a loop.
            backoff_limit_per_index: Some(1),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    restart_policy: Some("Never".into()),
                    volumes: Some(volumes),
                    image_pull_secrets: pull_secrets(&options.pull_secrets),
                    tolerations: tolerations(&options.tolerations, false),
                    // fsGroup: the scratch volumes are the builder's to write.
                    security_context: Some(PodSecurityContext {
                        fs_group: Some(DEFAULT_UID),
                        ..pod_security(DEFAULT_UID, DEFAULT_UID)
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Workload::BuildJob(Box::new(config), Box::new(job)))
}

/// Builds the manifest of `image` (read from its layout) with `options`, and the warnings to
/// print; `user` overrides the image's user (`UID` or `UID:GID`).
pub fn workload(
    image: &ImageSummary,
    options: &WorkloadOptions,
    user: Option<&str>,
) -> Result<(Workload, Vec<String>), K8sError> {
    let repository = options.repository.trim_end_matches('/');
    let last = repository.rsplit('/').next().unwrap_or_default();
    if repository.is_empty()
        || repository.contains('@')
        || last.contains(':')
        || !repository.contains('/')
    {
        return Err(K8sError::Repository {
            repository: options.repository.clone(),
        });
    }
    // A multi-platform image by its index: each node pulls its own platform.
    let image_ref = format!("{repository}@{}", image.image_digest());
    let smoke = match options.kind {
        WorkloadKind::SmokeJob => {
            Some(image.smoke.as_deref().ok_or_else(|| K8sError::NoSmoke {
                image: image.image.clone(),
            })?)
        }
        _ => None,
    };
    let name = options.name.clone().unwrap_or_else(|| match smoke {
        Some(_) => format!("{}-smoke", image_name(&image.image)),
        None => image_name(&image.image),
    });
    if !is_dns_label(&name) {
        return Err(K8sError::Name { name });
    }

    let (uid, gid) = run_as(user.or(image.config.user.as_deref()))?;
    let mut warnings = Vec::new();
    if uid == 0 {
        // Kept as the image says: an image built to run as root may need it (a prefix only
        // root can write), and changing the user silently hides that.
        warnings.push(format!(
            "`{}` runs as root (uid 0), so the pod does too, without runAsNonRoot; give the image a non-root `user` or pass `--set user=UID[:GID]`",
            image.image
        ));
    }
    let cuda = image.cuda.as_ref();
    // The smoke test needs a GPU even in an image that does not say it is a CUDA image.
    let gpus = options
        .gpus
        .unwrap_or(if cuda.is_some() || smoke.is_some() {
            1
        } else {
            0
        });
    // The smoke test finds the image's CUDA libraries under the environment's prefix.
    let (command, args) = match smoke {
        Some(smoke) => (
            options
                .command
                .clone()
                .or_else(|| Some(vec![smoke.to_string()])),
            options.args.clone().or_else(|| {
                let prefix = image.conda.as_ref().and_then(|c| c.prefix.clone());
                Some(vec![
                    "--prefix".to_string(),
                    prefix.unwrap_or_else(|| "/opt/conda".to_string()),
                ])
            }),
        ),
        None => (options.command.clone(), options.args.clone()),
    };

    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if gpus > 0 {
        // Extended resources are set as limits; requests default to them.
        limits.insert(GPU_RESOURCE.to_string(), Quantity(gpus.to_string()));
    }
    if let Some(cpu) = &options.cpu {
        requests.insert("cpu".to_string(), Quantity(cpu.clone()));
        limits.insert("cpu".to_string(), Quantity(cpu.clone()));
    }
    if let Some(memory) = &options.memory {
        requests.insert("memory".to_string(), Quantity(memory.clone()));
        limits.insert("memory".to_string(), Quantity(memory.clone()));
    }

    let (volumes, mounts) = data_volumes(options)?;
    let container = Container {
        name: name.clone(),
        image: Some(image_ref),
        command,
        args,
        resources: (!limits.is_empty()).then(|| ResourceRequirements {
            limits: Some(limits),
            requests: (!requests.is_empty()).then_some(requests),
            ..Default::default()
        }),
        security_context: Some(container_security()),
        env: env_vars(&options.env)?,
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };

    let min_driver = match cuda.and_then(|c| c.min_driver.as_deref()) {
        Some(text) => Some(
            text.parse::<DriverVersion>()
                .map_err(|message| K8sError::Driver {
                    value: text.to_string(),
                    message,
                })?,
        ),
        None => None,
    };
    // Without GPU feature discovery no node carries its labels: only the kubelet's remain.
    let gfd = gpus > 0 && options.gpu_feature_discovery;
    let mut terms = node_terms(&architectures(image), min_driver.as_ref().filter(|_| gfd));
    if gfd && !options.any_gpu_architecture {
        terms = with_compute_capability(terms, image)?;
    }
    let affinity = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };

    let labels = labels(&name);
    let pod = PodSpec {
        containers: vec![container],
        restart_policy: Some(
            match options.kind {
                WorkloadKind::Job | WorkloadKind::SmokeJob => "Never",
                WorkloadKind::Deployment => "Always",
            }
            .to_string(),
        ),
        runtime_class_name: options.runtime_class.clone(),
        image_pull_secrets: pull_secrets(&options.pull_secrets),
        security_context: Some(pod_security(uid, gid)),
        affinity: Some(affinity),
        tolerations: tolerations(&options.tolerations, gpus > 0 && options.gpu_toleration),
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..Default::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            ..Default::default()
        }),
        spec: Some(pod),
    };
    let metadata = ObjectMeta {
        name: Some(name),
        namespace: options.namespace.clone(),
        labels: Some(labels.clone()),
        ..Default::default()
    };
    let workload = match options.kind {
        WorkloadKind::Job | WorkloadKind::SmokeJob => Workload::Job(Box::new(Job {
            metadata,
            spec: Some(JobSpec {
                // A failed training run is looked at, not retried in a loop.
                backoff_limit: Some(0),
                // The smoke test takes seconds; one that hangs (a wedged GPU) must end.
                active_deadline_seconds: smoke.map(|_| SMOKE_DEADLINE_SECONDS),
                template,
                ..Default::default()
            }),
            ..Default::default()
        })),
        WorkloadKind::Deployment => Workload::Deployment(Box::new(Deployment {
            metadata,
            spec: Some(DeploymentSpec {
                replicas: Some(options.replicas),
                selector: LabelSelector {
                    match_labels: Some(labels),
                    ..Default::default()
                },
                template,
                ..Default::default()
            }),
            ..Default::default()
        })),
    };
    Ok((workload, warnings))
}

/// The container's environment, in the order given (a value may use an earlier `$(NAME)`).
fn env_vars(env: &[(String, String)]) -> Result<Option<Vec<EnvVar>>, K8sError> {
    let mut seen = std::collections::BTreeSet::new();
    for (name, _) in env {
        if !seen.insert(name) {
            return Err(K8sError::Duplicate {
                what: "`--env`",
                value: name.clone(),
            });
        }
    }
    Ok((!env.is_empty()).then(|| {
        env.iter()
            .map(|(name, value)| EnvVar {
                name: name.clone(),
                value: Some(value.clone()),
                ..Default::default()
            })
            .collect()
    }))
}

/// The pod's volumes (sorted by name) and the container's mounts (sorted by path, so a
/// directory is mounted before one inside it): `--volume`s and the `/dev/shm` of `shm`.
fn data_volumes(options: &WorkloadOptions) -> Result<(Vec<Volume>, Vec<VolumeMount>), K8sError> {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    if let Some(size) = &options.shm {
        check_quantity("shm", size)?;
        // Kubernetes gives a container a 64 MiB /dev/shm, where PyTorch's DataLoader
        // workers die with "Bus error"; a memory-backed emptyDir lifts that.
        volumes.push(Volume {
            name: SHM_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(size.clone())),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: SHM_VOLUME.into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        });
    }
    for data in &options.volumes {
        let mut volume = Volume {
            name: data.name.clone(),
            ..Default::default()
        };
        match &data.source {
            DataSource::Claim(claim) => {
                volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: data.read_only.then_some(true),
                });
            }
            DataSource::Host(path) => {
                volume.host_path = Some(HostPathVolumeSource {
                    path: path.clone(),
                    type_: None,
                });
            }
        }
        volumes.push(volume);
        mounts.push(VolumeMount {
            name: data.name.clone(),
            mount_path: data.mount_path.clone(),
            read_only: data.read_only.then_some(true),
            ..Default::default()
        });
    }
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    mounts.sort_by(|a, b| a.mount_path.cmp(&b.mount_path));
    if let Some(pair) = volumes.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(K8sError::Duplicate {
            what: "The volume name",
            value: pair[0].name.clone(),
        });
    }
    if let Some(pair) = mounts
        .windows(2)
        .find(|w| w[0].mount_path == w[1].mount_path)
    {
        return Err(K8sError::Duplicate {
            what: "The mount path",
            value: pair[0].mount_path.clone(),
        });
    }
    Ok((volumes, mounts))
}

/// The GPU node pools' taint `nvidia.com/gpu` (any value, NoSchedule: what GKE, EKS's
/// guides and the GPU operator's examples put on GPU nodes) when `gpu`, and `extra`;
/// sorted and without repeats, since their order means nothing.
fn tolerations(extra: &[Toleration], gpu: bool) -> Option<Vec<Toleration>> {
    let mut all = extra.to_vec();
    if gpu {
        all.push(Toleration {
            key: Some(GPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        });
    }
    let order = |t: &Toleration| {
        (
            t.key.clone(),
            t.operator.clone(),
            t.value.clone(),
            t.effect.clone(),
        )
    };
    all.sort_by_key(order);
    all.dedup_by(|a, b| order(a) == order(b));
    (!all.is_empty()).then_some(all)
}

/// Parses `--toleration KEY[=VALUE][:EFFECT]`: without a value the taint's key alone
/// matches (`Exists`), without an effect every effect is tolerated.
pub fn parse_toleration(text: &str) -> Result<Toleration, K8sError> {
    let error = |reason: &str| K8sError::Toleration {
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let (taint, effect) = match text.split_once(':') {
        Some((taint, effect)) => (taint, Some(effect)),
        None => (text, None),
    };
    if let Some(effect) = effect.filter(|e| !TAINT_EFFECTS.contains(e)) {
        return Err(error(&format!("unknown effect `{effect}`")));
    }
    let (key, value) = match taint.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (taint, None),
    };
    if !is_qualified_name(key) {
        return Err(error(&format!(
            "`{key}` is not a taint key like `nvidia.com/gpu`"
        )));
    }
    if let Some(value) = value.filter(|v| !is_label_value(v)) {
        return Err(error(&format!(
            "`{value}` is not a taint value (1 to 63 letters, digits, `-`, `_`, `.`; leave out `=VALUE` for any value)"
        )));
    }
    Ok(Toleration {
        key: Some(key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_string()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
        ..Default::default()
    })
}

/// Parses `--volume NAME=pvc:CLAIM:PATH[:ro]` or `NAME=host:DIR:PATH[:ro]`.
pub fn parse_volume(text: &str) -> Result<DataVolume, K8sError> {
    let error = |reason: String| K8sError::Volume {
        value: text.to_string(),
        reason,
    };
    let Some((name, spec)) = text.split_once('=') else {
        return Err(error("no `NAME=`".into()));
    };
    if !is_dns_label(name) || name == SHM_VOLUME {
        return Err(error(format!(
            "`{name}` is not a volume name (lower-case letters, digits and `-`, at most 63; not `{SHM_VOLUME}`, which `--set shm` uses)"
        )));
    }
    let parts: Vec<&str> = spec.split(':').collect();
    let (kind, source, mount_path, read_only) = match parts[..] {
        [kind, source, path] => (kind, source, path, false),
        [kind, source, path, "ro"] => (kind, source, path, true),
        [kind, source, path, "rw"] => (kind, source, path, false),
        [_, _, _, mode] => return Err(error(format!("`{mode}` is neither `ro` nor `rw`"))),
        _ => return Err(error("not three or four `:`-separated parts".into())),
    };
    let source = match kind {
        "pvc" if is_dns_subdomain(source) => DataSource::Claim(source.to_string()),
        "pvc" => return Err(error(format!("`{source}` is not a claim name"))),
        "host" if source.starts_with('/') => DataSource::Host(source.to_string()),
        "host" => return Err(error(format!("`{source}` is not an absolute path"))),
        other => return Err(error(format!("unknown kind `{other}` (pvc or host)"))),
    };
    if !mount_path.starts_with('/') {
        return Err(error(format!(
            "the mount path `{mount_path}` is not absolute"
        )));
    }
    Ok(DataVolume {
        name: name.to_string(),
        source,
        mount_path: mount_path.to_string(),
        read_only,
    })
}

/// Parses `--env NAME=VALUE` (the value may be empty and hold `=`).
pub fn parse_env(text: &str) -> Result<(String, String), K8sError> {
    let error = |reason: &str| K8sError::Env {
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let Some((name, value)) = text.split_once('=') else {
        return Err(error("no `=`"));
    };
    // The rule Kubernetes has long held names to: a C identifier, plus `-` and `.`.
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || "-._".contains(c))
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    if !valid {
        return Err(error(&format!(
            "`{name}` is not a variable name (letters, digits, `_`, `-`, `.`, not starting with a digit)"
        )));
    }
    Ok((name.to_string(), value.to_string()))
}

/// Checks a `--set` quantity (`16Gi`, `0.5`, `500m`): the schema takes any string, the API
/// server refuses a malformed one only at apply time.
pub fn check_quantity(key: &str, value: &str) -> Result<(), K8sError> {
    const SUFFIXES: &[&str] = &[
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E", "",
    ];
    let (number, suffix) = SUFFIXES
        .iter()
        .find_map(|suffix| {
            let number = value.strip_suffix(suffix).filter(|n| !n.is_empty())?;
            Some((number, *suffix))
        })
        .unwrap_or_default();
    // A decimal exponent (`1e3`, `5E-2`) instead of a suffix, never beside one.
    let (mantissa, exponent) = match number.split_once(['e', 'E']).filter(|_| suffix.is_empty()) {
        Some((mantissa, exponent)) => {
            let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            (mantissa, unsigned)
        }
        None => (number, "0"),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, "0"));
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if digits(whole) && digits(fraction) && digits(exponent) {
        Ok(())
    } else {
        Err(K8sError::Quantity {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

/// The OCI architectures of the image: each platform's of a multi-platform image (a node of
/// any of them pulls its own), else the one image's.
fn architectures(image: &ImageSummary) -> Vec<String> {
    if image.platforms.is_empty() {
        return vec![image.architecture.clone()];
    }
    let mut arches: Vec<String> = image
        .platforms
        .iter()
        .filter_map(|p| p.split('/').nth(1).map(str::to_string))
        .collect();
    arches.dedup();
    arches
}

/// The pod's required node terms: Linux nodes of one of `arches`, and, for a GPU pod of an
/// image with a minimum driver, a driver at least that ([`driver_terms`]; the platform
/// requirements are ANDed into each of its ORed terms).
pub fn node_terms(arches: &[String], driver: Option<&DriverVersion>) -> Vec<NodeSelectorTerm> {
    let platform = [
        NodeSelectorRequirement {
            key: OS_LABEL.to_string(),
            operator: "In".to_string(),
            values: Some(vec!["linux".to_string()]),
        },
        NodeSelectorRequirement {
            key: ARCH_LABEL.to_string(),
            operator: "In".to_string(),
            values: Some(arches.to_vec()),
        },
    ];
    let Some(driver) = driver else {
        return vec![NodeSelectorTerm {
            match_expressions: Some(platform.to_vec()),
            ..Default::default()
        }];
    };
    driver_terms(driver)
        .into_iter()
        .map(|mut term| {
            term.match_expressions
                .get_or_insert_with(Vec::new)
                .extend(platform.iter().cloned());
            term
        })
        .collect()
}

/// `terms` ANDed with [`compute_terms`] for the architectures the image records (each
/// package's, else all together); `terms` as they are when it records none.
fn with_compute_capability(
    terms: Vec<NodeSelectorTerm>,
    image: &ImageSummary,
) -> Result<Vec<NodeSelectorTerm>, K8sError> {
    use crate::cuda::fatbin::{Architectures, format_list, parse_list};
    let Some(gpu) = &image.gpu else {
        return Ok(terms);
    };
    let parse = |names: &[String]| parse_list(&names.join(",")).unwrap_or_default();
    let mut packages: Vec<Architectures> = gpu
        .packages
        .iter()
        .map(|p| parse(&p.architectures))
        .filter(|a| !a.is_empty())
        .collect();
    if packages.is_empty() {
        packages.push(parse(&gpu.architectures));
    }
    if packages.iter().all(Architectures::is_empty) {
        return Ok(terms);
    }
    let compute = compute_terms(&packages);
    if compute.is_empty() {
        return Err(K8sError::NoGpuArchitecture {
            image: image.image.clone(),
            packages: packages
                .iter()
                .map(format_list)
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    // (a or b) and (c or d): every pair, each requirement list ANDed.
    Ok(terms
        .iter()
        .flat_map(|term| {
            compute.iter().map(move |extra| {
                let mut term = term.clone();
                term.match_expressions
                    .get_or_insert_with(Vec::new)
                    .extend(extra.iter().cloned());
                term
            })
        })
        .collect())
}

/// The requirement lists (ORed) matching GPUs, by GPU feature discovery's compute capability
/// labels, on which every one of `packages` runs its kernels (SASS of the major at or below
/// the minor, or PTX at or below the capability). Empty when no GPU does.
///
/// Within a major, what runs is every minor from some minor up (SASS and PTX alike), so each
/// major needs one `minor > m - 1`; majors that run from minor 0 share one `In`, and past
/// [`NEWEST_KNOWN_MAJOR`] only PTX runs, the same for every major there.
pub fn compute_terms(
    packages: &[crate::cuda::fatbin::Architectures],
) -> Vec<Vec<NodeSelectorRequirement>> {
    use crate::cuda::fatbin::{Coverage, coverage};
    let runs = |sm: u32| {
        packages
            .iter()
            .all(|archs| coverage(archs, sm) != Coverage::None)
    };
    let newest = packages
        .iter()
        .flatten()
        .map(|a| a.sm / 10)
        .max()
        .unwrap_or(0)
        .max(NEWEST_KNOWN_MAJOR);
    let requirement = |label: &str, operator: &str, values: Vec<String>| NodeSelectorRequirement {
        key: label.to_string(),
        operator: operator.to_string(),
        values: Some(values),
    };
    let mut whole_majors = Vec::new();
    let mut terms = Vec::new();
    for major in 1..=newest {
        match (0..=9).find(|minor| runs(major * 10 + minor)) {
            Some(0) => whole_majors.push(major.to_string()),
            Some(minor) => terms.push(vec![
                requirement(COMPUTE_MAJOR_LABEL, "In", vec![major.to_string()]),
                requirement(COMPUTE_MINOR_LABEL, "Gt", vec![(minor - 1).to_string()]),
            ]),
            None => {}
        }
    }
    if !whole_majors.is_empty() {
        terms.insert(
            0,
            vec![requirement(COMPUTE_MAJOR_LABEL, "In", whole_majors)],
        );
    }
    if runs((newest + 1) * 10) {
        terms.push(vec![requirement(
            COMPUTE_MAJOR_LABEL,
            "Gt",
            vec![newest.to_string()],
        )]);
    }
    terms
}

/// Node selector terms (ORed; requirements within a term ANDed) matching nodes whose driver
/// is at least `driver`: `Gt` compares integers, so `≥ 520.61.05` becomes major > 520, or
/// major 520 and minor > 61, or 520.61 and rev > 4.
pub fn driver_terms(driver: &DriverVersion) -> Vec<NodeSelectorTerm> {
    let text = driver.to_string();
    let parts: Vec<u32> = text.split('.').filter_map(|p| p.parse().ok()).collect();
    let labels = [DRIVER_MAJOR_LABEL, DRIVER_MINOR_LABEL, DRIVER_REV_LABEL];
    let requirement = |label: &str, operator: &str, value: String| NodeSelectorRequirement {
        key: label.to_string(),
        operator: operator.to_string(),
        values: Some(vec![value]),
    };
    let mut terms = Vec::new();
    for depth in 0..parts.len() {
        let mut expressions: Vec<NodeSelectorRequirement> = (0..depth)
            .map(|i| requirement(labels[i], "In", label_value(i, parts[i])))
            .collect();
        // The last part may equal the minimum: "> n - 1".
        let last = depth == parts.len() - 1;
        let bound = if last {
            i64::from(parts[depth]) - 1
        } else {
            i64::from(parts[depth])
        };
        expressions.push(requirement(labels[depth], "Gt", bound.to_string()));
        terms.push(NodeSelectorTerm {
            match_expressions: Some(expressions),
            ..Default::default()
        });
    }
    terms
}

/// GPU feature discovery writes minor versions as the driver does (`104`), and the
/// revision zero-padded to two digits (`05`).
fn label_value(index: usize, value: u32) -> String {
    if index == 2 {
        format!("{value:02}")
    } else {
        value.to_string()
    }
}

/// The uid and gid the pod runs as: the image's numeric user (root, `0` or `root`,
/// included), else [`DEFAULT_UID`].
fn run_as(user: Option<&str>) -> Result<(i64, i64), K8sError> {
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        return Ok((DEFAULT_UID, DEFAULT_UID));
    };
    let (uid, gid) = match user.split_once(':') {
        Some((uid, gid)) => (uid, Some(gid)),
        None => (user, None),
    };
    // `root` is uid and gid 0 on every Linux; other names need the image's /etc/passwd.
    let number = |id: &str| {
        if id == "root" {
            Ok(0)
        } else {
            id.parse::<i64>()
        }
    };
    let Ok(uid) = number(uid) else {
        return Err(K8sError::NamedUser {
            user: user.to_string(),
        });
    };
    let gid = match gid {
        Some(gid) => number(gid).map_err(|_| K8sError::NamedUser {
            user: user.to_string(),
        })?,
        None => uid,
    };
    Ok((uid, gid))
}

/// Parses `--set user=UID[:GID]`.
pub fn check_user(value: &str) -> Result<(), K8sError> {
    let (uid, gid) = value.split_once(':').unwrap_or((value, "0"));
    match (uid.parse::<i64>(), gid.parse::<i64>()) {
        (Ok(uid), Ok(_)) if uid > 0 => Ok(()),
        _ => Err(K8sError::User {
            value: value.to_string(),
        }),
    }
}

/// The image's name from its reference (`images/py39-torch21:latest` → `py39-torch21`).
fn image_name(reference: &str) -> String {
    let (path, _) = crate::inspect::split_reference(reference);
    let base = std::path::Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    base.to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_string()
}

/// The labels of every object and pod imgbuild writes.
fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), name.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "imgbuild".to_string(),
        ),
    ])
}

/// No privilege escalation, no capabilities: nothing imgbuild builds or runs needs them.
fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod that runs as `uid:gid`, never as root unless `uid` is 0 (an image's own root user),
/// with the runtime's default seccomp profile.
fn pod_security(uid: i64, gid: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(uid != 0),
        run_as_user: Some(uid),
        run_as_group: Some(gid),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pull_secrets(secrets: &[String]) -> Option<Vec<LocalObjectReference>> {
    (!secrets.is_empty()).then(|| {
        secrets
            .iter()
            .map(|secret| LocalObjectReference {
                name: secret.clone(),
            })
            .collect()
    })
}

/// RFC 1123 subdomain: what Kubernetes accepts as a PVC name or a key's prefix.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// A label (or taint) value: 1 to 63 letters, digits, `-`, `_` and `.`, starting and ending
/// with a letter or digit.
fn is_label_value(value: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.len() <= 63
        && edge(value.chars().next())
        && edge(value.chars().last())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A qualified name (`nvidia.com/gpu`, `dedicated`): an optional subdomain prefix and `/`,
/// then a name of a label value's form.
fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_value(name),
        None => is_label_value(key),
    }
}

/// RFC 1123 label: what Kubernetes accepts as a Job, Deployment or container name.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(driver: &str) -> Vec<Vec<(String, String, String)>> {
        driver_terms(&driver.parse().unwrap())
            .into_iter()
            .map(|t| {
                t.match_expressions
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.key, r.operator, r.values.unwrap()[0].clone()))
                    .collect()
            })
            .collect()
    }

    /// [`compute_terms`] of packages given as `sm_80,compute_80`, as `label op values`.
    fn compute(packages: &[&str]) -> Vec<String> {
        let packages: Vec<_> = packages
            .iter()
            .map(|p| crate::cuda::fatbin::parse_list(p).unwrap())
            .collect();
        compute_terms(&packages)
            .into_iter()
            .map(|term| {
                term.iter()
                    .map(|r| {
                        let key = r.key.trim_start_matches("nvidia.com/gpu.compute.");
                        format!(
                            "{key} {} {}",
                            r.operator,
                            r.values.as_ref().unwrap().join(",")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" & ")
            })
            .collect()
    }

    #[test]
    fn compute_capability_terms_are_the_gpus_every_package_runs_on() {
        // CUDA 12.1's cuRAND: SASS from 5.0 to 9.0, PTX compute_90 for anything newer.
        assert_eq!(
            compute(&["sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_89,sm_90,compute_90"]),
            ["major In 5,6,7,8,9,10,11,12", "major Gt 12"]
        );
        // SASS alone: its major only, from its minor (8.6 and 8.9, not 8.0 or 9.0).
        assert_eq!(compute(&["sm_86"]), ["major In 8 & minor Gt 5"]);
        // Every package must run: 8.x by SASS of one and PTX of the other, 9.0 and newer by
        // PTX of both; 6.x and 7.x run only the second.
        assert_eq!(
            compute(&["sm_80,sm_86,compute_86", "sm_60,compute_60"]),
            ["major In 8,9,10,11,12", "major Gt 12"]
        );
        // A minor threshold beside whole majors.
        assert_eq!(
            compute(&["sm_75,sm_80"]),
            ["major In 8", "major In 7 & minor Gt 4"]
        );
        // Hopper-only and Ampere-only packages: no GPU runs both.
        assert!(compute(&["sm_90", "sm_80"]).is_empty());
    }

    #[test]
    fn every_term_asks_for_linux_nodes_of_the_image_architectures() {
        let arches = vec!["amd64".to_string(), "arm64".to_string()];
        let platform = vec![
            (
                OS_LABEL.to_string(),
                "In".to_string(),
                vec!["linux".to_string()],
            ),
            (ARCH_LABEL.to_string(), "In".to_string(), arches.clone()),
        ];
        let of = |terms: Vec<NodeSelectorTerm>| -> Vec<Vec<(String, String, Vec<String>)>> {
            terms
                .into_iter()
                .map(|t| {
                    t.match_expressions
                        .unwrap()
                        .into_iter()
                        .map(|r| (r.key, r.operator, r.values.unwrap()))
                        .collect()
                })
                .collect()
        };
        assert_eq!(of(node_terms(&arches, None)), vec![platform.clone()]);
        let with_driver = of(node_terms(&arches, Some(&"520.61.05".parse().unwrap())));
        assert_eq!(with_driver.len(), 3);
        for term in &with_driver {
            assert_eq!(term[term.len() - 2..], platform[..], "{term:?}");
        }
        assert_eq!(with_driver[0][0].0, DRIVER_MAJOR_LABEL);
    }

    #[test]
    fn driver_minimum_becomes_ored_terms() {
        let t = terms("520.61.05");
        assert_eq!(t.len(), 3);
        assert_eq!(
            t[0],
            vec![(DRIVER_MAJOR_LABEL.into(), "Gt".into(), "520".into())]
        );
        assert_eq!(
            t[1],
            vec![
                (DRIVER_MAJOR_LABEL.into(), "In".into(), "520".into()),
                (DRIVER_MINOR_LABEL.into(), "Gt".into(), "61".into()),
            ]
        );
        assert_eq!(
            t[2],
            vec![
                (DRIVER_MAJOR_LABEL.into(), "In".into(), "520".into()),
                (DRIVER_MINOR_LABEL.into(), "In".into(), "61".into()),
                (DRIVER_REV_LABEL.into(), "Gt".into(), "4".into()),
            ]
        );
        // A bare major: major > 579 (that is, ≥ 580).
        assert_eq!(
            terms("580"),
            vec![vec![(DRIVER_MAJOR_LABEL.into(), "Gt".into(), "579".into())]]
        );
    }

    #[test]
    fn users() {
        assert_eq!(run_as(None).unwrap(), (DEFAULT_UID, DEFAULT_UID));
        // The image's root is kept (the caller warns), never silently made 1000.
        assert_eq!(run_as(Some("0")).unwrap(), (0, 0));
        assert_eq!(run_as(Some("root")).unwrap(), (0, 0));
        assert_eq!(run_as(Some("root:100")).unwrap(), (0, 100));
        assert_eq!(run_as(Some("1001:root")).unwrap(), (1001, 0));
        assert!(run_as(Some("1001:staff")).is_err());
        assert_eq!(run_as(Some("1001")).unwrap(), (1001, 1001));
        assert_eq!(run_as(Some("1001:100")).unwrap(), (1001, 100));
        assert!(run_as(Some("jovyan")).is_err());
        assert!(check_user("0").is_err());
        assert!(check_user("1000:1000").is_ok());
    }

    #[test]
    fn tolerations_parse_and_sort() {
        let t = parse_toleration("dedicated=ml:NoExecute").unwrap();
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.value.as_deref()),
            (Some("dedicated"), Some("Equal"), Some("ml"))
        );
        assert_eq!(t.effect.as_deref(), Some("NoExecute"));
        let any = parse_toleration("example.com/spot").unwrap();
        assert_eq!(any.operator.as_deref(), Some("Exists"));
        assert_eq!((any.value, any.effect), (None, None));
        for bad in [
            "",
            "x:NoScheduled",
            "-x",
            "x=",
            "x=a b",
            "a/b/c",
            "x:NoSchedule:y",
        ] {
            assert!(parse_toleration(bad).is_err(), "{bad}");
        }
        // The GPU taint once, sorted by key, whatever order and repeats they came in.
        let extra = [
            parse_toleration("zone=a").unwrap(),
            parse_toleration("nvidia.com/gpu:NoSchedule").unwrap(),
            parse_toleration("zone=a").unwrap(),
        ];
        let keys: Vec<_> = tolerations(&extra, true)
            .unwrap()
            .into_iter()
            .map(|t| t.key.unwrap())
            .collect();
        assert_eq!(keys, ["nvidia.com/gpu", "zone"]);
        assert!(tolerations(&[], false).is_none());
    }

    #[test]
    fn volumes_env_and_quantities_parse() {
        assert_eq!(
            parse_volume("data=pvc:datasets:/data").unwrap(),
            DataVolume {
                name: "data".into(),
                source: DataSource::Claim("datasets".into()),
                mount_path: "/data".into(),
                read_only: false,
            }
        );
        let cache = parse_volume("cache=host:/mnt/cache:/cache:ro").unwrap();
        assert_eq!(cache.source, DataSource::Host("/mnt/cache".into()));
        assert!(cache.read_only);
        for bad in [
            "data",
            "Data=pvc:d:/data",
            "shm=pvc:d:/data",
            "data=nfs:d:/data",
            "data=pvc:D_S:/data",
            "data=host:mnt:/data",
            "data=pvc:d:data",
            "data=pvc:d:/data:rx",
            "data=pvc:d",
        ] {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_env("OPTS=a=b").unwrap(),
            ("OPTS".to_string(), "a=b".to_string())
        );
        assert_eq!(parse_env("EMPTY=").unwrap().1, "");
        for bad in ["NOVALUE", "=x", "1X=y", "A B=c"] {
            assert!(parse_env(bad).is_err(), "{bad}");
        }
        for good in ["16Gi", "512Mi", "500m", "2", "1.5G", "1e3", "5E-2", "1E"] {
            assert!(check_quantity("shm", good).is_ok(), "{good}");
        }
        for bad in [
            "", "16GB", "Gi", "1.Gi", "-1Gi", "16 Gi", "1e", "1e3Gi", "1e--3",
        ] {
            assert!(check_quantity("shm", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(image_name("images/Py39_torch21:latest"), "py39-torch21");
        assert!(is_dns_label("py39-torch21"));
        assert!(!is_dns_label("-x"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }
}
