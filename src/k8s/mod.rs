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
            Capabilities, ConfigMap, Container, EmptyDirVolumeSource, EnvVar, HostPathVolumeSource,
            LocalObjectReference, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
            PodTemplateSpec, ResourceRequirements, SeccompProfile, SecurityContext, Service,
            ServiceAccount, Toleration, Volume, VolumeMount,
        },
        rbac::v1::{Role, RoleBinding},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta},
    },
};

use crate::inspect::ImageSummary;

mod build_job;
mod image_user;
mod jupyter;
mod scheduling;
mod shard_wait;
mod smoke_policy;
mod yaml;

pub(crate) use build_job::{BuildJobOptions, ShardOptions, build_job};
pub(crate) use image_user::numeric_user;
pub(crate) use jupyter::instructions as jupyter_instructions;
use scheduling::{affinity, targeted_compute_terms, tolerations};
pub(crate) use shard_wait::DEFAULT_KUBECTL_IMAGE;
pub(crate) use smoke_policy::{ClusterPolicy, GpuClass};

/// GPU feature discovery's labels for the host driver version (`535.104.05` → `535`, `104`,
/// `05`).
pub(crate) const DRIVER_MAJOR_LABEL: &str = "nvidia.com/cuda.driver.major";
pub(crate) const DRIVER_MINOR_LABEL: &str = "nvidia.com/cuda.driver.minor";
pub(crate) const DRIVER_REV_LABEL: &str = "nvidia.com/cuda.driver.rev";
/// GPU feature discovery's labels for the GPU's compute capability (`8.6` → `8`, `6`).
pub(crate) const COMPUTE_MAJOR_LABEL: &str = "nvidia.com/gpu.compute.major";
pub(crate) const COMPUTE_MINOR_LABEL: &str = "nvidia.com/gpu.compute.minor";
/// The extended resource NVIDIA's device plugin advertises.
pub(crate) const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The well-known node labels of the kubelet: a pod goes only to nodes that can run the
/// image's platforms (a mixed amd64/arm64 cluster would otherwise start an amd64-only image on
/// an arm64 node, to fail there with "exec format error" or a pull with no matching manifest).
pub(crate) const OS_LABEL: &str = "kubernetes.io/os";
pub(crate) const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The user a pod runs as when the image sets none: conda prefixes are world-readable, so
/// any unprivileged uid can run them.
pub(crate) const DEFAULT_UID: i64 = 1000;

/// The largest uid or gid Kubernetes takes for runAsUser, runAsGroup and fsGroup (its API
/// validation holds them to 0..2^31-1, though the fields are int64).
pub(crate) const MAX_ID: i64 = (1 << 31) - 1;

/// The rule of [`is_dns_label`], for errors.
const DNS_LABEL_RULE: &str = "lower-case letters, digits and `-`, starting and ending with a letter or digit, at most 63 characters (RFC 1123 label)";
/// The rule of [`is_dns_subdomain`], for errors.
const DNS_SUBDOMAIN_RULE: &str =
    "`.`-separated RFC 1123 labels (lower-case letters, digits and `-`), at most 253 characters";

/// Checks a namespace: an RFC 1123 label, as Kubernetes requires of namespaces.
pub(crate) fn check_namespace(value: &str) -> Result<(), K8sError> {
    if is_dns_label(value) {
        return Ok(());
    }
    Err(K8sError::ObjectName {
        what: "The namespace",
        value: value.to_string(),
        rule: DNS_LABEL_RULE,
    })
}

/// Checks the name of an object the pod refers to (a Secret, a RuntimeClass): an RFC 1123
/// subdomain, as Kubernetes requires of them.
pub(crate) fn check_object_name(what: &'static str, value: &str) -> Result<(), K8sError> {
    if is_dns_subdomain(value) {
        return Ok(());
    }
    Err(K8sError::ObjectName {
        what,
        value: value.to_string(),
        rule: DNS_SUBDOMAIN_RULE,
    })
}

/// The volume `--set shm=SIZE` mounts at `/dev/shm`.
pub(crate) const SHM_VOLUME: &str = "shm";
/// The effects a taint (and so a toleration) may have.
pub(crate) const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// How long a smoke Job may run before Kubernetes ends it.
const SMOKE_DEADLINE_SECONDS: i64 = 600;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkloadKind {
    Job,
    Deployment,
    /// A Job that runs the image's embedded smoke test (`[smoke] embed = true`) on one GPU.
    SmokeJob,
    /// The image's JupyterLab: a Deployment of one pod and a ClusterIP Service (`--jupyter`).
    Jupyter,
}

/// What the manifest says beyond the image: the `--set` keys and flags.
#[derive(Debug, Clone)]
pub(crate) struct WorkloadOptions {
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
pub(crate) enum DataSource {
    /// A PersistentVolumeClaim by name (`pvc:CLAIM`).
    Claim(String),
    /// A directory of the node (`host:/DIR`).
    Host(String),
}

/// A `--volume NAME=pvc:CLAIM:PATH[:ro]` or `NAME=host:DIR:PATH[:ro]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DataVolume {
    pub name: String,
    pub source: DataSource,
    pub mount_path: String,
    pub read_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum K8sError {
    #[error(
        "`{repository}` is not a repository like `registry.example/team/image` (no tag, no digest: the manifest adds the image's digest)"
    )]
    Repository { repository: String },
    #[error(
        "`{}` is not a valid Kubernetes name: lower-case letters, digits and `-`, starting and ending with a letter or digit, at most 63 characters",
        name.escape_debug()
    )]
    Name { name: String },
    #[error("The image's minimum driver `{value}` cannot be read: {message}")]
    Driver { value: String, message: String },
    #[error(
        "The image's user `{user}` is a name, which Kubernetes cannot check against runAsNonRoot; give the image a numeric `user` (e.g. `1000:1000`) or set `--set user=UID[:GID]`"
    )]
    NamedUser { user: String },
    #[error(
        "The user `{user}` of `{image}` is a name that cannot be resolved: {reason}; add it with `[accounts]`, or set `--set user=UID[:GID]`"
    )]
    ImageUser {
        image: String,
        user: String,
        reason: String,
    },
    #[error("Cannot read the /etc/passwd and /etc/group of `{image}` to resolve its user `{user}`")]
    ImageUserRead {
        image: String,
        user: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "`--set user={value}` must be `UID` or `UID:GID` with a non-zero UID, and IDs at most {MAX_ID}"
    )]
    User { value: String },
    #[error(
        "The image's user `{user}` has an ID above {MAX_ID}, which Kubernetes refuses as runAsUser or runAsGroup; set `--set user=UID[:GID]`"
    )]
    UserId { user: String },
    #[error("{what} {value:?} is not a Kubernetes name: {rule}")]
    ObjectName {
        what: &'static str,
        value: String,
        rule: &'static str,
    },
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
    #[error(
        "`--require-smoke-attestation` is for a pod with a GPU, and this one asks for none (`--set gpus=0`, or an image without `[cuda]`): a GPU smoke attestation says nothing about it"
    )]
    SmokePolicyWithoutGpu,
    #[error(
        "`--shards {count}` needs `--cache-repo`, where the shards leave the layers, and N from 1 to {}",
        crate::layers::shard::MAX_SHARDS
    )]
    Shards { count: usize },
    #[error("`--jupyter`: `{image}` {reason}")]
    Jupyter { image: String, reason: String },
    #[error("Failed to write YAML")]
    Yaml(#[source] serde_yaml::Error),
}

/// `--build-job`'s objects.
pub(crate) struct BuildJobObjects {
    /// The recipe and every variant's lock.
    pub config: ConfigMap,
    /// With `--shards`: the Job that fills the layer cache, and the identity the assembly
    /// waits for it with.
    pub shards: Option<ShardObjects>,
    /// The Job that builds and pushes each variant.
    pub assembly: Job,
}

/// `--shards`: the shards Job, and the ServiceAccount, Role and RoleBinding that let the
/// assembly pods read it.
pub(crate) struct ShardObjects {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub job: Job,
}

impl BuildJobObjects {
    /// The documents in the order `kubectl apply -f` creates them: what a pod mounts or runs
    /// as before the pod, and the shards Job before the assembly, whose pods look it up.
    fn documents(&self) -> Result<Vec<String>, serde_yaml::Error> {
        let mut documents = vec![yaml::to_string(&self.config)?];
        if let Some(shards) = &self.shards {
            documents.extend([
                yaml::to_string(&shards.service_account)?,
                yaml::to_string(&shards.role)?,
                yaml::to_string(&shards.role_binding)?,
                yaml::to_string(&shards.job)?,
            ]);
        }
        documents.push(yaml::to_string(&self.assembly)?);
        Ok(documents)
    }
}

/// A manifest ready to print.
pub(crate) enum Workload {
    Job(Box<Job>),
    Deployment(Box<Deployment>),
    /// `--build-job`: the recipe and its locks, and the Indexed Jobs that build them.
    BuildJob(Box<BuildJobObjects>),
    /// `--jupyter`: the Deployment and the Service in front of it.
    Jupyter(Box<Deployment>, Box<Service>),
}

impl Workload {
    /// YAML, one document per object.
    pub(crate) fn to_yaml(&self) -> Result<String, K8sError> {
        match self {
            Workload::Job(job) => yaml::to_string(job),
            Workload::Deployment(deployment) => yaml::to_string(deployment),
            Workload::BuildJob(objects) => objects.documents().map(|d| d.join("---\n")),
            Workload::Jupyter(deployment, service) => yaml::to_string(deployment)
                .and_then(|d| yaml::to_string(service).map(|s| format!("{d}---\n{s}"))),
        }
        .map_err(K8sError::Yaml)
    }
}

/// Builds the manifest of `image` (read from its layout) with `options`, and the warnings to
/// print; `user` overrides the image's user (`UID` or `UID:GID`).
pub(crate) fn workload(
    image: &ImageSummary,
    options: &WorkloadOptions,
    user: Option<&str>,
) -> Result<(Workload, Vec<String>), K8sError> {
    let image_ref = image_reference(&options.repository, image)?;
    let smoke = match options.kind {
        WorkloadKind::SmokeJob => {
            Some(image.smoke.as_deref().ok_or_else(|| K8sError::NoSmoke {
                image: image.image.clone(),
            })?)
        }
        _ => None,
    };
    let name = workload_name(image, options)?;

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
    if options.kind == WorkloadKind::Jupyter {
        jupyter::check(image, options, uid)?;
    }
    let gpus = gpu_count(image, options);

    let (volumes, mounts) = data_volumes(options)?;
    let (command, args) = command_and_args(image, options, smoke);
    let mut container = Container {
        name: name.clone(),
        image: Some(image_ref),
        command,
        args,
        resources: resources(gpus, options),
        security_context: Some(container_security()),
        env: env_vars(&options.env)?,
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    if options.kind == WorkloadKind::Jupyter {
        jupyter::serve(&mut container, image, &name);
    }
    let pod = PodSpec {
        containers: vec![container],
        restart_policy: Some(
            match options.kind {
                WorkloadKind::Job | WorkloadKind::SmokeJob => "Never",
                WorkloadKind::Deployment | WorkloadKind::Jupyter => "Always",
            }
            .to_string(),
        ),
        runtime_class_name: options.runtime_class.clone(),
        image_pull_secrets: pull_secrets(&options.pull_secrets),
        security_context: Some(pod_security(uid, gid)),
        affinity: Some(affinity(image, options, gpus)?),
        tolerations: tolerations(&options.tolerations, gpus > 0 && options.gpu_toleration),
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..Default::default()
    };
    let workload = wrap_pod(options, name, pod, smoke.is_some());
    Ok((workload, warnings))
}

/// The workload's name: `--set name`, else the layout's (with `-smoke` for the smoke Job).
fn workload_name(image: &ImageSummary, options: &WorkloadOptions) -> Result<String, K8sError> {
    let name = options.name.clone().unwrap_or_else(|| match options.kind {
        WorkloadKind::SmokeJob => format!("{}-smoke", image_name(&image.image)),
        _ => image_name(&image.image),
    });
    if !is_dns_label(&name) {
        return Err(K8sError::Name { name });
    }
    Ok(name)
}

/// GPUs per pod: `--set gpus`, else one for a CUDA image or the smoke test (which needs a
/// GPU even in an image that does not say it is a CUDA image), else none.
fn gpu_count(image: &ImageSummary, options: &WorkloadOptions) -> u32 {
    options.gpus.unwrap_or(
        if image.cuda.is_some() || options.kind == WorkloadKind::SmokeJob {
            1
        } else {
            0
        },
    )
}

/// `--require-smoke-attestation`: the sample Kyverno policy that admits the workload's pods
/// only with a passing GPU smoke attestation of their image for the GPU class their node
/// affinity targets (see `src/k8s/smoke_policy.rs`), and the warnings to print: a workload that
/// targets no compute capability gets a policy that checks none.
pub(crate) fn smoke_policy(
    image: &ImageSummary,
    options: &WorkloadOptions,
) -> Result<(ClusterPolicy, Vec<String>), K8sError> {
    image_reference(&options.repository, image)?;
    let name = workload_name(image, options)?;
    let gpus = gpu_count(image, options);
    if gpus == 0 {
        return Err(K8sError::SmokePolicyWithoutGpu);
    }
    let class = targeted_compute_terms(image, options, gpus)?.map(|terms| {
        let terms: Vec<_> = terms.into_iter().map(|(term, _)| term).collect();
        GpuClass::of_terms(&terms)
    });
    let mut warnings = Vec::new();
    if class.is_none() {
        let why = if !options.gpu_feature_discovery {
            "`--no-gpu-feature-discovery`".to_string()
        } else if options.any_gpu_architecture {
            "`--any-gpu-architecture`".to_string()
        } else {
            format!(
                "`{}` records no GPU architectures (`dev.imgbuild.cuda.architectures`)",
                image.image
            )
        };
        warnings.push(format!(
            "the workload targets no GPU class ({why}), so the policy admits a passing smoke attestation from any GPU"
        ));
    }
    let repository = options.repository.trim_end_matches('/');
    let policy = smoke_policy::cluster_policy(&smoke_policy::SmokePolicyOptions {
        name: &name,
        namespace: options.namespace.as_deref(),
        repository,
        gpu_class: class.as_ref(),
    });
    Ok((policy, warnings))
}

/// The image as the manifest references it, `REPOSITORY@DIGEST`: by its digest (an index's,
/// for a multi-platform image, so each node pulls its own platform), never by a tag.
fn image_reference(repository: &str, image: &ImageSummary) -> Result<String, K8sError> {
    let trimmed = repository.trim_end_matches('/');
    let last = trimmed.rsplit('/').next().unwrap_or_default();
    if trimmed.is_empty() || trimmed.contains('@') || last.contains(':') || !trimmed.contains('/') {
        return Err(K8sError::Repository {
            repository: repository.to_string(),
        });
    }
    Ok(format!("{trimmed}@{}", image.image_digest()))
}

/// The container's command and arguments: the overrides, else the image's own (none in the
/// manifest), or for the smoke test its executable, which finds the image's CUDA libraries
/// under the environment's prefix.
fn command_and_args(
    image: &ImageSummary,
    options: &WorkloadOptions,
    smoke: Option<&str>,
) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let Some(smoke) = smoke else {
        return (options.command.clone(), options.args.clone());
    };
    let command = options
        .command
        .clone()
        .or_else(|| Some(vec![smoke.to_string()]));
    let args = options.args.clone().or_else(|| {
        let prefix = image.conda.as_ref().and_then(|c| c.prefix.clone());
        Some(vec![
            "--prefix".to_string(),
            prefix.unwrap_or_else(|| "/opt/conda".to_string()),
        ])
    });
    (command, args)
}

/// The container's GPUs, CPU and memory; none when nothing is asked for.
fn resources(gpus: u32, options: &WorkloadOptions) -> Option<ResourceRequirements> {
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
    (!limits.is_empty()).then(|| ResourceRequirements {
        limits: Some(limits),
        requests: (!requests.is_empty()).then_some(requests),
        ..Default::default()
    })
}

/// The Job or Deployment named `name` that runs `pod`; `smoke` for the smoke test's Job.
fn wrap_pod(options: &WorkloadOptions, name: String, pod: PodSpec, smoke: bool) -> Workload {
    let labels = labels(&name);
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
    match options.kind {
        WorkloadKind::Job | WorkloadKind::SmokeJob => Workload::Job(Box::new(Job {
            metadata,
            spec: Some(JobSpec {
                // A failed training run is looked at, not retried in a loop.
                backoff_limit: Some(0),
                // The smoke test takes seconds; one that hangs (a wedged GPU) must end.
                active_deadline_seconds: smoke.then_some(SMOKE_DEADLINE_SECONDS),
                template,
                ..Default::default()
            }),
            ..Default::default()
        })),
        WorkloadKind::Deployment => {
            Workload::Deployment(Box::new(deployment(metadata, labels, template, options)))
        }
        WorkloadKind::Jupyter => {
            let name = metadata.name.clone().unwrap_or_default();
            let service = jupyter::service(&name, options.namespace.as_deref(), &labels);
            // One server per token and workdir: replicas would each have their own kernels.
            let one = WorkloadOptions {
                replicas: 1,
                ..options.clone()
            };
            let deployment = deployment(metadata, labels, template, &one);
            Workload::Jupyter(Box::new(deployment), Box::new(service))
        }
    }
}

fn deployment(
    metadata: ObjectMeta,
    labels: BTreeMap<String, String>,
    template: PodTemplateSpec,
    options: &WorkloadOptions,
) -> Deployment {
    Deployment {
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
    }
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

/// Parses `--toleration KEY[=VALUE][:EFFECT]`: without a value the taint's key alone
/// matches (`Exists`), without an effect every effect is tolerated.
pub(crate) fn parse_toleration(text: &str) -> Result<Toleration, K8sError> {
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
pub(crate) fn parse_volume(text: &str) -> Result<DataVolume, K8sError> {
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
        "host" => match normal_path(source) {
            Some(path) => DataSource::Host(path),
            None => {
                return Err(error(format!(
                    "the node directory `{}` is not an absolute path without `..`",
                    source.escape_debug()
                )));
            }
        },
        other => return Err(error(format!("unknown kind `{other}` (pvc or host)"))),
    };
    let Some(mount_path) = normal_path(mount_path) else {
        return Err(error(format!(
            "the mount path `{}` is not an absolute path without `..`",
            mount_path.escape_debug()
        )));
    };
    Ok(DataVolume {
        name: name.to_string(),
        source,
        mount_path,
        read_only,
    })
}

/// `path` normalized (`.` and empty components dropped), or `None` when it is not absolute,
/// has a `..` (a node directory or mount point must say where it is, not climb to it; a
/// kubelet resolves a hostPath's `..` on the node) or a control character.
pub(crate) fn normal_path(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.chars().any(char::is_control) {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            part => parts.push(part),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Parses `--env NAME=VALUE` (the value may be empty and hold `=`).
pub(crate) fn parse_env(text: &str) -> Result<(String, String), K8sError> {
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
pub(crate) fn check_quantity(key: &str, value: &str) -> Result<(), K8sError> {
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
    if !(0..=MAX_ID).contains(&uid) || !(0..=MAX_ID).contains(&gid) {
        return Err(K8sError::UserId {
            user: user.to_string(),
        });
    }
    Ok((uid, gid))
}

/// Parses `--set user=UID[:GID]`.
pub(crate) fn check_user(value: &str) -> Result<(), K8sError> {
    let (uid, gid) = value.split_once(':').unwrap_or((value, "0"));
    match (uid.parse::<i64>(), gid.parse::<i64>()) {
        (Ok(uid), Ok(gid)) if (1..=MAX_ID).contains(&uid) && (0..=MAX_ID).contains(&gid) => Ok(()),
        _ => Err(K8sError::User {
            value: value.to_string(),
        }),
    }
}

/// The image's name from its reference (`images/py39-torch21:latest` → `py39-torch21`).
fn image_name(reference: &str) -> String {
    let (path, _) = crate::reference::split_layout(reference);
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
        assert!(check_user("2147483647:0").is_ok());
        for bad in [
            "2147483648",
            "4294967296",
            "1000:-1",
            "1000:2147483648",
            "-5",
        ] {
            assert!(check_user(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            run_as(Some("4294967296")),
            Err(K8sError::UserId { .. })
        ));
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
            "data=host:/mnt/../etc:/data",
            "data=pvc:d:/data/../etc",
            "data=host:/mnt/..:/data",
            "data=host:/mnt\n:/data",
        ] {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
        let tidy = parse_volume("data=host://mnt/./d/:/data//x/").unwrap();
        assert_eq!(tidy.source, DataSource::Host("/mnt/d".into()));
        assert_eq!(tidy.mount_path, "/data/x");
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
