//! `imgbuild k8s`: arguments, `--set` parsing and printing the manifest.

use std::process::ExitCode;

use clap::Args;

use super::fail;
use crate::k8s::{WorkloadKind, WorkloadOptions, check_user, workload};

pub(super) const K8S_EXAMPLES: &str = "\
Examples:
  imgbuild push images/train registry.example/ml/train:v1
  imgbuild k8s images/train --repository registry.example/ml/train --job \\
      --set command='[\"python\",\"train.py\"]' --set memory=32Gi > train-job.yaml
  imgbuild k8s images/serve --repository registry.example/ml/serve --deployment \\
      --runtime-class nvidia --pull-secret regcred --set replicas=2 | kubectl apply -f -";

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
];

#[derive(Debug, Args)]
pub struct K8sArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`
    pub image: String,
    /// Where the image was pushed (`REGISTRY/REPO`); the manifest references it as
    /// `REGISTRY/REPO@sha256:…`, never by tag
    #[arg(long, value_name = "REGISTRY/REPO")]
    pub repository: String,
    /// A Job that runs the image once (the default)
    #[arg(long, conflicts_with = "deployment")]
    pub job: bool,
    /// A Deployment that keeps the image running
    #[arg(long)]
    pub deployment: bool,
    /// `runtimeClassName` of the pod (e.g. `nvidia`)
    #[arg(long, value_name = "NAME")]
    pub runtime_class: Option<String>,
    /// A Secret to pull the image with (repeatable)
    #[arg(long = "pull-secret", value_name = "SECRET")]
    pub pull_secrets: Vec<String>,
    /// Overrides: name, namespace, command, args (JSON arrays or words), cpu, memory,
    /// gpus, replicas, user (`UID[:GID]`)
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
        kind: if args.deployment {
            WorkloadKind::Deployment
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
    };
    let mut user = None;
    for set in &args.sets {
        let Some((key, value)) = set.split_once('=') else {
            return Err(set_error(format!("`--set {set}` must be KEY=VALUE")));
        };
        match key {
            "name" => options.name = Some(value.to_string()),
            "namespace" => options.namespace = Some(value.to_string()),
            "command" => options.command = Some(words(value)?),
            "args" => options.args = Some(words(value)?),
            "cpu" => options.cpu = Some(value.to_string()),
            "memory" => options.memory = Some(value.to_string()),
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

#[allow(clippy::print_stdout)]
pub(super) fn run_k8s(args: &K8sArgs) -> ExitCode {
    let (options, user) = match options(args) {
        Ok(parsed) => parsed,
        Err(err) => return fail(&err, 1),
    };
    let image = match crate::inspect::inspect(&args.image) {
        Ok(image) => image,
        Err(err) => return fail(&err, 1),
    };
    let yaml = match workload(&image, &options, user.as_deref()).and_then(|w| w.to_yaml()) {
        Ok(yaml) => yaml,
        Err(err) => return fail(&err, 1),
    };
    print!("{yaml}");
    ExitCode::SUCCESS
}
