//! `--build-job`: a ConfigMap with the recipe and its locks, and an Indexed Job whose pods
//! build and push one variant each; with `--shards N`, first an Indexed Job of N pods that
//! fill the layer cache, which the variant pods wait for (`shard_wait`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        batch::v1::{Job, JobSpec},
        core::v1::{
            ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar,
            EnvVarSource, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
            ResourceRequirements, SecretVolumeSource, Toleration, Volume, VolumeMount,
        },
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};

use crate::layers::shard::MAX_SHARDS;

use super::{
    BuildJobObjects, DEFAULT_UID, K8sError, ShardObjects, Workload, container_security,
    is_dns_label, labels, pod_security, pull_secrets, shard_wait::ShardWait, tolerations,
};

/// What `--build-job` builds: a recipe (with its `[matrix]`, if any) and the locks of every
/// variant, which pin what the pods build.
#[derive(Debug, Clone)]
pub(crate) struct BuildJobOptions {
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
    /// `--cache-repo`: the registry layer cache the pods share (`REGISTRY/REPO`): a layer
    /// that is there when a pod reaches it is not compressed again.
    pub cache_repo: Option<String>,
    /// `--shards N`: fill the cache first, each distinct layer compressed once.
    pub shards: Option<ShardOptions>,
}

/// `--shards N --kubectl-image REF`.
#[derive(Debug, Clone)]
pub(crate) struct ShardOptions {
    /// N, the shards Job's pods: `build --shard I/N` for I from 0.
    pub count: usize,
    /// The image of the init containers that wait for the shards Job.
    pub kubectl_image: String,
}

/// What a build pod's one container runs: a variant (the index is `VARIANT_INDEX`) or a
/// shard of the layers (`SHARD_INDEX`).
#[derive(Debug, Clone, Copy)]
enum Work {
    Variant,
    Shard { count: usize },
}

impl Work {
    /// The variable the pod's index in its Job comes in.
    fn index_variable(self) -> &'static str {
        match self {
            Work::Variant => "VARIANT_INDEX",
            Work::Shard { .. } => "SHARD_INDEX",
        }
    }
}

/// The ConfigMap holding the recipe and locks, and an Indexed Job with one pod per variant:
/// pod `i` runs `imgbuild build RECIPE --locked --variant i --push REPO`. imgbuild needs no
/// daemon and no privileges, so the pods are plain non-root pods with two scratch volumes.
/// With `--shards N`, also the shards Job (pod `i` runs `build RECIPE --locked --shard i/N`)
/// and what the variant pods need to wait for it.
pub(crate) fn build_job(options: &BuildJobOptions) -> Result<Workload, K8sError> {
    let name = &options.name;
    check_name(name)?;
    let config_name = format!("{name}-recipe");
    let labels = labels(name);
    let config = recipe_config_map(options, &config_name, &labels);
    let variants = i32::try_from(options.variants.max(1)).unwrap_or(i32::MAX);
    let mut assembly = builder_pod(options, &config_name, Work::Variant);
    let shards = match &options.shards {
        Some(shards) => Some(shard_objects(
            options,
            shards,
            &config_name,
            &labels,
            &mut assembly,
        )?),
        None => None,
    };
    Ok(Workload::BuildJob(Box::new(BuildJobObjects {
        config,
        shards,
        assembly: indexed_job(options, name, &labels, variants, assembly),
    })))
}

/// `--shards`: the Job `NAME-shards` of `shards.count` build pods, each compressing its shard
/// of the layers into the cache, and the ServiceAccount, Role and RoleBinding `NAME-builder`
/// that `assembly` (the variant pod) is given to wait for that Job with.
fn shard_objects(
    options: &BuildJobOptions,
    shards: &ShardOptions,
    config_name: &str,
    labels: &BTreeMap<String, String>,
    assembly: &mut PodSpec,
) -> Result<ShardObjects, K8sError> {
    let shards_job = format!("{}-shards", options.name);
    check_name(&shards_job)?;
    // `k8s` refuses both before this; a shard with nowhere to leave its layers does nothing.
    if options.cache_repo.is_none() || !(1..=MAX_SHARDS).contains(&shards.count) {
        return Err(K8sError::Shards {
            count: shards.count,
        });
    }
    let account = format!("{}-builder", options.name);
    let wait = ShardWait {
        account: &account,
        namespace: options.namespace.as_deref(),
        labels,
        shards_job: &shards_job,
        kubectl_image: &shards.kubectl_image,
    };
    assembly.init_containers = Some(wait.init_containers(&scratch_mount("work")));
    assembly.service_account_name = Some(account.clone());
    let work = Work::Shard {
        count: shards.count,
    };
    let pod = builder_pod(options, config_name, work);
    let pods = i32::try_from(shards.count).unwrap_or(i32::MAX);
    Ok(ShardObjects {
        service_account: wait.service_account(),
        role: wait.role(),
        role_binding: wait.role_binding(),
        job: indexed_job(options, &shards_job, labels, pods, pod),
    })
}

/// A Job or a name derived from it must be an RFC 1123 label.
fn check_name(name: &str) -> Result<(), K8sError> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(K8sError::Name {
            name: name.to_string(),
        })
    }
}

/// The Indexed Job `name` of `pods` pods, all at once, each running `pod` with its index.
fn indexed_job(
    options: &BuildJobOptions,
    name: &str,
    labels: &BTreeMap<String, String>,
    pods: i32,
    pod: PodSpec,
) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: options.namespace.clone(),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(pods),
            parallelism: Some(pods),
            // One retry per index: a flaky registry should not fail the matrix, a broken
            // variant (or shard) should not be rebuilt in a loop.
            backoff_limit_per_index: Some(1),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A build pod: one imgbuild container doing `work`, the recipe and scratch volumes, and the
/// same security context, pull secrets and tolerations for a variant and a shard alike.
fn builder_pod(options: &BuildJobOptions, config_name: &str, work: Work) -> PodSpec {
    PodSpec {
        containers: vec![builder_container(options, work)],
        restart_policy: Some("Never".into()),
        volumes: Some(builder_volumes(config_name, options.push_secret.as_deref())),
        image_pull_secrets: pull_secrets(&options.pull_secrets),
        tolerations: tolerations(&options.tolerations, false),
        // fsGroup: the scratch volumes are the builder's to write.
        security_context: Some(PodSecurityContext {
            fs_group: Some(DEFAULT_UID),
            ..pod_security(DEFAULT_UID, DEFAULT_UID)
        }),
        ..Default::default()
    }
}

/// The ConfigMap `config_name` the build pods mount at `/recipes`: the recipe and the lock
/// of every variant, by file name.
fn recipe_config_map(
    options: &BuildJobOptions,
    config_name: &str,
    labels: &BTreeMap<String, String>,
) -> ConfigMap {
    let mut data = BTreeMap::from([(
        options.recipe_file_name.clone(),
        options.recipe_text.clone(),
    )]);
    data.extend(options.locks.iter().cloned());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_name.to_string()),
            namespace: options.namespace.clone(),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// The build pod's one container: `imgbuild build` of the mounted recipe, `--locked`, for
/// the pod's variant, pushing to the repository, or for the pod's shard of the layers.
fn builder_container(options: &BuildJobOptions, work: Work) -> Container {
    let recipe = format!("/recipes/{}", options.recipe_file_name);
    let mut args = vec!["build".to_string(), recipe, "--locked".to_string()];
    match work {
        Work::Variant => {
            args.extend(["--push".to_string(), options.repository.clone()]);
            if options.variants > 0 {
                args.extend(["--variant".to_string(), "$(VARIANT_INDEX)".to_string()]);
            }
        }
        // `I/N` in one argument: the kubelet expands `$(SHARD_INDEX)` inside it.
        Work::Shard { count } => {
            args.extend(["--shard".to_string(), format!("$(SHARD_INDEX)/{count}")])
        }
    }
    if let Some(cache_repo) = &options.cache_repo {
        args.extend(["--cache-repo".to_string(), cache_repo.clone()]);
    }
    if let Work::Shard { .. } = work {
        // One `shard` event per pod in its log: the layers it compressed and stored.
        args.push("--json".to_string());
    }
    let mut limits = BTreeMap::new();
    if let Some(cpu) = &options.cpu {
        limits.insert("cpu".to_string(), Quantity(cpu.clone()));
    }
    if let Some(memory) = &options.memory {
        limits.insert("memory".to_string(), Quantity(memory.clone()));
    }
    let push_secret = options.push_secret.is_some();
    Container {
        name: "imgbuild".into(),
        image: Some(options.builder_image.clone()),
        args: Some(args),
        env: Some(builder_env(push_secret, work.index_variable())),
        working_dir: Some("/work".into()),
        volume_mounts: Some(builder_mounts(push_secret)),
        resources: (!limits.is_empty()).then(|| ResourceRequirements {
            requests: Some(limits.clone()),
            limits: Some(limits),
            ..Default::default()
        }),
        security_context: Some(container_security()),
        ..Default::default()
    }
}

/// The builder's environment: its cache and home on the scratch volumes, the pod's index (as
/// `index_variable`), and with a push secret, where the credentials are.
fn builder_env(push_secret: bool, index_variable: &str) -> Vec<EnvVar> {
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
        // The pod's index in the Job, through the downward API, so `$(VARIANT_INDEX)` (or
        // `$(SHARD_INDEX)`) in the arguments is expanded by the kubelet.
        EnvVar {
            name: index_variable.into(),
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
    if push_secret {
        env.push(EnvVar {
            name: "REGISTRY_AUTH_FILE".into(),
            value: Some("/auth/.dockerconfigjson".into()),
            ..Default::default()
        });
    }
    env
}

/// Where the builder sees [`builder_volumes`]: the recipe read-only, the scratch volumes,
/// and the push secret read-only.
fn builder_mounts(push_secret: bool) -> Vec<VolumeMount> {
    let read_only = |name: &str| VolumeMount {
        read_only: Some(true),
        ..scratch_mount(name)
    };
    let mut mounts = vec![
        read_only("recipes"),
        scratch_mount("work"),
        scratch_mount("cache"),
    ];
    if push_secret {
        mounts.push(read_only("auth"));
    }
    mounts
}

/// The volume `name` mounted read-write at `/NAME`.
fn scratch_mount(name: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: format!("/{name}"),
        ..Default::default()
    }
}

/// The build pod's volumes: the recipe's ConfigMap, two scratch directories (the build's
/// home and its cache), and the push secret if any.
fn builder_volumes(config_name: &str, push_secret: Option<&str>) -> Vec<Volume> {
    let scratch = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let mut volumes = vec![
        Volume {
            name: "recipes".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_name.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        },
        scratch("work"),
        scratch("cache"),
    ];
    if let Some(secret) = push_secret {
        volumes.push(Volume {
            name: "auth".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    volumes
}
