//! `imgbuild k8s`: arguments, `--set` parsing and printing the manifest.

use std::process::ExitCode;

use clap::Args;

use k8s_openapi::api::core::v1::Toleration;

use super::printer::{CommandFailure, Printer};

use crate::{
    k8s::{
        BuildJobOptions, DEFAULT_KUBECTL_IMAGE, DataVolume, ShardOptions, Workload, WorkloadKind,
        WorkloadOptions, build_job, check_namespace, check_object_name, check_quantity, check_user,
        jupyter_instructions, numeric_user, parse_env, parse_toleration, parse_volume,
        smoke_policy, workload,
    },
    layers::shard::MAX_SHARDS,
};

pub(super) const K8S_EXAMPLES: &str = "\
Examples:
  imgbuild push images/train registry.example/ml/train:v1
  imgbuild k8s images/train --repository registry.example/ml/train --job \\
      --set command='[\"python\",\"train.py\"]' --set memory=32Gi > train-job.yaml
  imgbuild k8s images/serve --repository registry.example/ml/serve --deployment \\
      --runtime-class nvidia --pull-secret regcred --set replicas=2 | kubectl apply -f -
  imgbuild k8s images/train --repository registry.example/ml/train --smoke-job \\
      --runtime-class nvidia | kubectl apply -f -
  imgbuild k8s images/train --repository registry.example/ml/train --set shm=16Gi \\
      --env HF_HOME=/cache --volume data=pvc:datasets:/data:ro \\
      --volume cache=host:/mnt/cache:/cache --toleration dedicated=ml:NoSchedule
  imgbuild k8s images/train --repository registry.example/ml/train \\
      --require-smoke-attestation > train-with-policy.yaml   # and a Kyverno ClusterPolicy
  imgbuild k8s images/jupyter --repository registry.example/ml/jupyter --jupyter > lab.yaml
  imgbuild k8s --build-job recipes/torch21-matrix.toml --repository registry.example/ml/torch \\
      --builder-image registry.example/tools/imgbuild:0.1.0 \\
      --cache-repo registry.example/ci/layers --shards 8 > build.yaml   # shards, then variants";

/// The keys `--set` takes.
const SET_KEYS: &[&str] = &[
    "name",
    "namespace",
    "command",
    "args",
    "cpu",
    "memory",
    "gpus",
    "replicas",
    "user",
    "shm",
];

#[derive(Debug, Args)]
pub(crate) struct K8sArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`
    #[arg(required_unless_present = "build_job")]
    pub image: Option<String>,
    /// Where the image was pushed (`REGISTRY/REPO`); the manifest references it as
    /// `REGISTRY/REPO@sha256:…`, never by tag. With `--build-job`: where the pods push
    #[arg(long, value_name = "REGISTRY/REPO")]
    pub repository: String,
    /// Instead of running an image: a ConfigMap with this recipe and its locks and an
    /// Indexed Job that builds each `[matrix]` variant in its own pod and pushes it
    #[arg(long, value_name = "RECIPE", conflicts_with_all = ["image", "deployment", "job", "smoke_job"])]
    pub build_job: Option<std::path::PathBuf>,
    /// The imgbuild image the build pods run (best by digest)
    #[arg(long, value_name = "REF", requires = "build_job")]
    pub builder_image: Option<String>,
    /// A `kubernetes.io/dockerconfigjson` Secret the build pods push with
    #[arg(long, value_name = "SECRET", requires = "build_job")]
    pub push_secret: Option<String>,
    /// The registry layer cache the build pods share (`REGISTRY/REPO`, see `build
    /// --cache-repo`): a layer already there when a pod reaches it is not compressed again
    #[arg(long, value_name = "REGISTRY/REPO", requires = "build_job", value_parser = super::build::parse_cache_repo)]
    pub cache_repo: Option<crate::registry::Reference>,
    /// With `--cache-repo`: first an Indexed Job `NAME-shards` of N pods (1 to 1000), pod I
    /// running `build --shard I/N`, so that each distinct package layer of the matrix is
    /// compressed once; the variant pods wait for it to complete (init containers running
    /// kubectl, under the ServiceAccount `NAME-builder`, which may only read that Job) and
    /// take every package layer from the cache
    #[arg(long, value_name = "N", requires = "build_job", requires = "cache_repo",
          value_parser = clap::value_parser!(u16).range(1..=MAX_SHARDS as i64))]
    pub shards: Option<u16>,
    /// With `--shards`: the image the variant pods wait for the shards Job with; kubectl on its
    /// PATH is all it needs (default: `registry.k8s.io/kubectl:v1.33.0`)
    #[arg(long, value_name = "REF", requires = "shards")]
    pub kubectl_image: Option<String>,
    /// A Job that runs the image once (the default)
    #[arg(long, conflicts_with = "deployment")]
    pub job: bool,
    /// A Deployment that keeps the image running
    #[arg(long, conflicts_with = "smoke_job")]
    pub deployment: bool,
    /// A Job that runs the image's embedded GPU smoke test (`[smoke] embed = true`) on one
    /// GPU; its exit code is the verdict (0 pass, 3 no GPU, 4 incompatible, 5 kernel failure)
    #[arg(long, conflicts_with = "job")]
    pub smoke_job: bool,
    /// The image's JupyterLab: a Deployment of one pod (as the image's non-root user, the
    /// token from the Secret `NAME-jupyter-token`) and a ClusterIP Service; prints on stderr
    /// how to create the Secret and reach the lab with `kubectl port-forward`
    #[arg(long, conflicts_with_all = ["job", "deployment", "smoke_job", "build_job"])]
    pub jupyter: bool,
    /// With `--jupyter`: the port on your laptop that `kubectl port-forward` listens on
    #[arg(long, value_name = "PORT", requires = "jupyter", default_value_t = 8888,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub local_port: u16,
    /// Also print a sample Kyverno ClusterPolicy that admits the image's pods only with signed
    /// imgbuild GPU smoke attestations (`imgbuild smoke --attest`) that pass on a GPU of the
    /// compute capabilities the node affinity targets; put your public key in its placeholder
    #[arg(long, conflicts_with_all = ["build_job", "smoke_job"])]
    pub require_smoke_attestation: bool,
    /// `runtimeClassName` of the pod (e.g. `nvidia`)
    #[arg(long, value_name = "NAME")]
    pub runtime_class: Option<String>,
    /// A Secret to pull the image with (repeatable)
    #[arg(long = "pull-secret", value_name = "SECRET")]
    pub pull_secrets: Vec<String>,
    /// Do not require GPU nodes whose compute capability the image's kernels run on (by the
    /// architectures its build read from the libraries, and GPU feature discovery's
    /// `nvidia.com/gpu.compute.major`/`minor` labels)
    #[arg(long)]
    pub any_gpu_architecture: bool,
    /// Require none of GPU feature discovery's node labels (driver version, compute
    /// capability), for clusters without GFD; the OS and architecture stay required
    #[arg(long)]
    pub no_gpu_feature_discovery: bool,
    /// Do not tolerate the `nvidia.com/gpu` taint of GPU node pools (tolerated by default
    /// for a pod that asks for a GPU)
    #[arg(long)]
    pub no_gpu_toleration: bool,
    /// A taint the pod tolerates (repeatable): `KEY` (any value) or `KEY=VALUE`, then
    /// optionally `:EFFECT` (NoSchedule, PreferNoSchedule, NoExecute; else every effect)
    #[arg(long = "toleration", value_name = "KEY[=VALUE][:EFFECT]", value_parser = parse_toleration)]
    pub tolerations: Vec<Toleration>,
    /// An environment variable of the container (repeatable, in this order)
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env, conflicts_with = "build_job")]
    pub env: Vec<(String, String)>,
    /// A volume for data (repeatable): `NAME=pvc:CLAIM:PATH` mounts a PersistentVolumeClaim,
    /// `NAME=host:DIR:PATH` a node's directory, at PATH; `:ro` after it read-only
    #[arg(long = "volume", value_name = "NAME=KIND:SOURCE:PATH[:ro]", value_parser = parse_volume, conflicts_with = "build_job")]
    pub volumes: Vec<DataVolume>,
    /// Overrides: name, namespace, command, args (JSON arrays or words), cpu, memory,
    /// gpus, replicas, user (`UID[:GID]`), shm (a memory-backed `/dev/shm` of this size)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct SetError {
    message: String,
}

fn set_error(message: impl Into<String>) -> SetError {
    SetError {
        message: message.into(),
    }
}

/// `["python", "-c", "x"]` as JSON, or words split on whitespace.
fn words(value: &str) -> Result<Vec<String>, SetError> {
    if value.trim_start().starts_with('[') {
        serde_json::from_str(value)
            .map_err(|e| set_error(format!("`{value}` is not a JSON array of strings: {e}")))
    } else {
        Ok(value.split_whitespace().map(str::to_string).collect())
    }
}

fn options(args: &K8sArgs) -> Result<(WorkloadOptions, Option<String>), SetError> {
    let mut options = WorkloadOptions {
        kind: if args.jupyter {
            WorkloadKind::Jupyter
        } else if args.deployment {
            WorkloadKind::Deployment
        } else if args.smoke_job {
            WorkloadKind::SmokeJob
        } else {
            WorkloadKind::Job
        },
        repository: args.repository.clone(),
        name: None,
        namespace: None,
        command: None,
        args: None,
        cpu: None,
        memory: None,
        gpus: None,
        replicas: 1,
        runtime_class: args.runtime_class.clone(),
        pull_secrets: args.pull_secrets.clone(),
        any_gpu_architecture: args.any_gpu_architecture,
        gpu_feature_discovery: !args.no_gpu_feature_discovery,
        gpu_toleration: !args.no_gpu_toleration,
        tolerations: args.tolerations.clone(),
        shm: None,
        env: args.env.clone(),
        volumes: args.volumes.clone(),
    };
    let named =
        |what, value: &str| check_object_name(what, value).map_err(|e| set_error(e.to_string()));
    if let Some(class) = &args.runtime_class {
        named("`--runtime-class`", class)?;
    }
    for secret in args.pull_secrets.iter().chain(&args.push_secret) {
        named("The Secret", secret)?;
    }
    let mut user = None;
    for set in &args.sets {
        let Some((key, value)) = set.split_once('=') else {
            return Err(set_error(format!("`--set {set}` must be KEY=VALUE")));
        };
        match key {
            "name" => options.name = Some(value.to_string()),
            "namespace" => {
                check_namespace(value).map_err(|e| set_error(e.to_string()))?;
                options.namespace = Some(value.to_string());
            }
            "command" => options.command = Some(words(value)?),
            "args" => options.args = Some(words(value)?),
            "cpu" | "memory" | "shm" => {
                check_quantity(key, value).map_err(|e| set_error(e.to_string()))?;
                let slot = match key {
                    "cpu" => &mut options.cpu,
                    "memory" => &mut options.memory,
                    _ => &mut options.shm,
                };
                *slot = Some(value.to_string());
            }
            "gpus" => {
                options.gpus = Some(value.parse().map_err(|_| {
                    set_error(format!("`--set gpus={value}` must be a whole number"))
                })?);
            }
            "replicas" => {
                options.replicas = value.parse().ok().filter(|n| *n >= 0).ok_or_else(|| {
                    set_error(format!("`--set replicas={value}` must be a whole number"))
                })?;
            }
            "user" => {
                check_user(value).map_err(|e| set_error(e.to_string()))?;
                user = Some(value.to_string());
            }
            other => {
                let hint = SET_KEYS
                    .iter()
                    .min_by_key(|k| strsim::damerau_levenshtein(k, other))
                    .filter(|k| strsim::damerau_levenshtein(k, other) <= 2)
                    .map(|k| format!("; did you mean `{k}`?"))
                    .unwrap_or_default();
                return Err(set_error(format!(
                    "`--set` has no key `{other}` (keys: {}){hint}",
                    SET_KEYS.join(", ")
                )));
            }
        }
    }
    Ok((options, user))
}

/// The `--build-job` inputs: the recipe, every variant's lock, distinct push tags.
fn build_job_options(
    args: &K8sArgs,
    recipe_path: &std::path::Path,
    options: &WorkloadOptions,
    printer: &Printer,
) -> Result<BuildJobOptions, Box<dyn std::error::Error>> {
    let builder_image = args
        .builder_image
        .clone()
        .ok_or("`--build-job` needs `--builder-image REF`: the imgbuild image the pods run")?;
    let (text, variants) = crate::locked_variants::locked_variants(recipe_path)?;
    for variant in &variants {
        warn_of_local_channels(&variant.recipe, printer);
    }
    let base_name = variants[0].base_name();
    let matrix_variants = match variants[0].variant {
        Some(_) => variants.len(),
        None => 0,
    };
    let locks: Vec<(String, String)> = variants
        .into_iter()
        .map(|v| (v.lock_file, v.lock_text))
        .collect();
    Ok(BuildJobOptions {
        name: options
            .name
            .clone()
            .unwrap_or_else(|| format!("{base_name}-build")),
        namespace: options.namespace.clone(),
        builder_image,
        repository: options.repository.clone(),
        recipe_file_name: recipe_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        recipe_text: text,
        locks,
        variants: matrix_variants,
        pull_secrets: options.pull_secrets.clone(),
        push_secret: args.push_secret.clone(),
        cpu: options.cpu.clone(),
        memory: options.memory.clone(),
        tolerations: options.tolerations.clone(),
        cache_repo: args.cache_repo.as_ref().map(ToString::to_string),
        shards: args.shards.map(|count| ShardOptions {
            count: count.into(),
            kubectl_image: args
                .kubectl_image
                .clone()
                .unwrap_or_else(|| DEFAULT_KUBECTL_IMAGE.to_string()),
        }),
    })
}

/// Warns of channels on this machine's disk, which the pods see only if mounted alike.
fn warn_of_local_channels(recipe: &crate::recipe::Recipe, printer: &Printer) {
    for channel in &recipe.channels {
        if channel.base_url.url().scheme() == "file" {
            printer.warning(&format!(
                "channel `{}` is on this machine; the build pods must see it at the same path",
                channel.base_url
            ));
        }
    }
}

pub(super) fn run_k8s(args: &K8sArgs, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let (options, user) = options(args).map_err(|err| CommandFailure::new(err, 1))?;
    if let Some(recipe) = &args.build_job {
        let yaml = build_job_options(args, recipe, &options, printer)
            .and_then(|o| {
                build_job(&o)
                    .and_then(|w| w.to_yaml())
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
            })
            .map_err(|err| CommandFailure::new(err, 1))?;
        printer.document(&yaml);
        return Ok(ExitCode::SUCCESS);
    }
    let image_ref = args.image.as_deref().unwrap_or_default();
    let image = crate::inspect::inspect(image_ref).map_err(|err| CommandFailure::new(err, 1))?;
    // A named image user becomes the uid and gid its own /etc/passwd gives it.
    let user = match user.or_else(|| image.config.user.clone()) {
        Some(user) if !user.is_empty() => {
            Some(numeric_user(&image, &user).map_err(|err| CommandFailure::new(err, 1))?)
        }
        _ => None,
    };
    let (manifest, warnings) =
        workload(&image, &options, user.as_deref()).map_err(|err| CommandFailure::new(err, 1))?;
    let mut yaml = manifest
        .to_yaml()
        .map_err(|err| CommandFailure::new(err, 1))?;
    for warning in &warnings {
        printer.warning(warning);
    }
    if let Workload::Jupyter(deployment, _) = &manifest {
        let name = deployment.metadata.name.as_deref().unwrap_or_default();
        let namespace = deployment.metadata.namespace.as_deref();
        for line in jupyter_instructions(name, namespace, args.local_port) {
            printer.status("Then", line);
        }
    }
    if args.require_smoke_attestation {
        let (policy, warnings) =
            smoke_policy(&image, &options).map_err(|err| CommandFailure::new(err, 1))?;
        for warning in &warnings {
            printer.warning(warning);
        }
        let policy = policy
            .to_yaml()
            .map_err(|err| CommandFailure::new(err, 1))?;
        // First, so that `kubectl apply -f` creates the policy before the workload it guards.
        yaml = format!("{policy}---\n{yaml}");
    }
    printer.document(&yaml);
    Ok(ExitCode::SUCCESS)
}
