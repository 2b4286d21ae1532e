//! `--build-job`: a ConfigMap with the recipe and its locks, and an Indexed Job whose pods
//! build and push one variant each.

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

use super::{
    DEFAULT_UID, K8sError, Workload, container_security, is_dns_label, labels, pod_security,
    pull_secrets, tolerations,
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
}

/// The ConfigMap holding the recipe and locks, and an Indexed Job with one pod per variant:
/// pod `i` runs `imgbuild build RECIPE --locked --variant i --push REPO`. imgbuild needs no
/// daemon and no privileges, so the pods are plain non-root pods with two scratch volumes.
pub(crate) fn build_job(options: &BuildJobOptions) -> Result<Workload, K8sError> {
    if !is_dns_label(&options.name) {
        return Err(K8sError::Name {
            name: options.name.clone(),
        });
    }
    let config_name = format!("{}-recipe", options.name);
    let labels = labels(&options.name);
    let config = recipe_config_map(options, &config_name, &labels);
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
                    containers: vec![builder_container(options)],
                    restart_policy: Some("Never".into()),
                    volumes: Some(builder_volumes(
                        &config_name,
                        options.push_secret.as_deref(),
                    )),
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
/// the pod's variant, pushing to the repository.
fn builder_container(options: &BuildJobOptions) -> Container {
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
    if let Some(cache_repo) = &options.cache_repo {
        args.extend(["--cache-repo".to_string(), cache_repo.clone()]);
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
        env: Some(builder_env(push_secret)),
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

/// The builder's environment: its cache and home on the scratch volumes, the pod's variant,
/// and with a push secret, where the credentials are.
fn builder_env(push_secret: bool) -> Vec<EnvVar> {
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
    let mount = |name: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: format!("/{name}"),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    let mut mounts = vec![
        mount("recipes", true),
        mount("work", false),
        mount("cache", false),
    ];
    if push_secret {
        mounts.push(mount("auth", true));
    }
    mounts
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
