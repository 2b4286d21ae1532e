//! `imgbuild slurm`: arguments, `--set` parsing and printing the sbatch script.

use std::process::ExitCode;

use clap::Args;

use super::printer::{CommandFailure, Printer};

use crate::slurm::{
    BuildOptions, Builder, JobOptions, Jupyter, Runner, SlurmError, Volume, build_script,
    check_constraint, check_login_host, check_login_user, check_name, check_time, parse_count,
    parse_cpus, parse_gpus, parse_memory, parse_switch, parse_volume, sbatch_script,
};

pub(super) const SLURM_EXAMPLES: &str = "\
Examples:
  imgbuild push images/train registry.example/ml/train:v1
  imgbuild slurm images/train --repository registry.example/ml/train \\
      --set partition=gpu --set time=4:00:00 --set cpus=16 --set memory=64G --set gpus=2 \\
      --set args='[\"train.py\",\"--epochs\",\"10\"]' > train.sbatch
  imgbuild slurm images/train --repository registry.example/ml/train --runner podman \\
      --env HF_HOME=/scratch/hf | sbatch
  imgbuild slurm images/train --repository registry.example/ml/train \\
      --set nodes=4 --set ntasks-per-node=1 --set gpus-per-node=h100:8 \\
      --volume /scratch/datasets:/data:ro > multi.sbatch
  imgbuild slurm images/jupyter --repository registry.example/ml/jupyter --jupyter \\
      --set partition=gpu --set time=8:00:00 --login-host login.cluster.example > lab.sbatch
  imgbuild slurm --build recipes/torch21-matrix.toml --repository registry.example/ml/torch \\
      --cache-repo registry.example/ci/layers --shards 8 --set cpus=16 > build.sh && bash build.sh";

/// The keys `--set` takes.
const SET_KEYS: &[&str] = &[
    "name",
    "partition",
    "account",
    "time",
    "cpus",
    "cpus-per-task",
    "memory",
    "gpus",
    "nodes",
    "ntasks-per-node",
    "gpus-per-node",
    "qos",
    "constraint",
    "exclusive",
    "command",
    "args",
];

#[derive(Debug, Args)]
pub(crate) struct SlurmArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`
    #[arg(required_unless_present = "build")]
    pub image: Option<String>,
    /// Where the image was pushed (`REGISTRY/REPO`); the script runs it as
    /// `REGISTRY/REPO@sha256:…`, never by tag. With `--build`: where each variant is
    /// pushed, under its own tag
    #[arg(long, value_name = "REGISTRY/REPO")]
    pub repository: String,
    /// Instead of running an image, write a driver script that builds RECIPE's variants on
    /// the cluster: a job array of `--shards` tasks, each compressing its share of the
    /// distinct layers into the `--cache-repo`, then a job after them all (`afterok`) that
    /// builds each variant `--locked` from that cache and pushes it. Run it with `bash`
    #[arg(long, value_name = "RECIPE", conflicts_with_all = ["image", "jupyter", "volumes"])]
    pub build: Option<std::path::PathBuf>,
    /// With `--build`: the tasks of the array
    #[arg(long, value_name = "N", requires = "build", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub shards: u32,
    /// With `--build`: the registry layer cache the tasks share (`REGISTRY/REPO`)
    #[arg(long, value_name = "REGISTRY/REPO", requires = "build",
          value_parser = super::build::parse_cache_repo)]
    pub cache_repo: Option<crate::registry::Reference>,
    /// With `--build`: run imgbuild's own image (`recipes/imgbuild-builder.toml`) through
    /// the `--runner`, instead of the imgbuild on the nodes
    #[arg(long, value_name = "REF", requires = "build")]
    pub builder_image: Option<String>,
    /// With `--build`: the imgbuild the nodes run [default: this one, by its absolute path]
    #[arg(
        long,
        value_name = "PATH",
        requires = "build",
        conflicts_with = "builder_image"
    )]
    pub imgbuild: Option<std::path::PathBuf>,
    /// What runs the container: Pyxis (`srun --container-image`, enroot) or podman
    #[arg(long, value_enum, default_value = "pyxis")]
    pub runner: Runner,
    /// Pull without TLS (a plain-HTTP or self-signed registry): podman's
    /// `--tls-verify=false`, enroot's `ENROOT_ALLOW_HTTP=yes`
    #[arg(long)]
    pub insecure_registry: bool,
    /// An environment variable of the container (repeatable, in this order)
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = crate::k8s::parse_env)]
    pub env: Vec<(String, String)>,
    /// A host path mounted into the container (repeatable): Pyxis's `--container-mounts`,
    /// podman's `--volume`; both paths absolute, without `..`, `,` or `:`; the job checks
    /// the host path is there before it starts the container
    #[arg(long = "volume", value_name = "SRC:DST[:ro]", value_parser = parse_volume)]
    pub volumes: Vec<Volume>,
    /// Serve the image's JupyterLab as the job, on a port free on the node and behind a
    /// fresh token; the job's output file (`jupyter-JOBID.out`, readable by you alone) gives
    /// the `ssh -N -L` tunnel command and the URL to open
    #[arg(long)]
    pub jupyter: bool,
    /// With `--jupyter`: the host your laptop reaches by SSH (default: the host `sbatch` ran
    /// on, Slurm's `SLURM_SUBMIT_HOST`)
    #[arg(long, value_name = "HOST", requires = "jupyter", value_parser = login_host)]
    pub login_host: Option<String>,
    /// With `--jupyter`: your user on the login host (default: the job's user,
    /// `SLURM_JOB_USER`)
    #[arg(long, value_name = "USER", requires = "jupyter", value_parser = login_user)]
    pub login_user: Option<String>,
    /// With `--jupyter`: the port on your laptop the tunnel listens on
    #[arg(long, value_name = "PORT", requires = "jupyter", default_value_t = 8888,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub local_port: u16,
    /// Overrides: name (the job's), partition, account, qos, time (`4:00:00`,
    /// `2-00:00:00`), cpus or cpus-per-task, memory (`64G`), gpus (`N` or `TYPE:N`, for the
    /// job), nodes and ntasks-per-node (a multi-node job: `srun` runs the image once per task),
    /// gpus-per-node, constraint (`a100&ib`), exclusive (`true`), command, args (JSON arrays
    /// or words)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

fn login_host(value: &str) -> Result<String, String> {
    check_login_host(value).map(|()| value.to_string())
}

fn login_user(value: &str) -> Result<String, String> {
    check_login_user(value).map(|()| value.to_string())
}

/// `["python", "-c", "x"]` as JSON, or words split on whitespace.
fn words(key: &str, value: &str) -> Result<Vec<String>, String> {
    let words: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value)
            .map_err(|e| format!("`--set {key}={value}` is not a JSON array of strings: {e}"))?
    } else {
        value.split_whitespace().map(str::to_string).collect()
    };
    if key == "command" && words.is_empty() {
        return Err(format!("`--set command={value}` names no program"));
    }
    Ok(words)
}

/// The key of `--set` nearest to `key`, as a hint, when one is close.
fn did_you_mean(key: &str) -> String {
    let distance = |k: &str| strsim::damerau_levenshtein(k, key);
    SET_KEYS
        .iter()
        .copied()
        .min_by_key(|k| distance(k))
        .filter(|k| distance(k) <= 2)
        .map(|k| format!("; did you mean `{k}`?"))
        .unwrap_or_default()
}

/// Applies one `--set KEY=VALUE` to `options`, checking the value.
fn apply_set(options: &mut JobOptions, set: &str) -> Result<(), String> {
    let Some((key, value)) = set.split_once('=') else {
        return Err(format!("`--set {set}` must be KEY=VALUE"));
    };
    let checked = |result: Result<(), SlurmError>| {
        result
            .map(|()| Some(value.to_string()))
            .map_err(|e| e.to_string())
    };
    match key {
        "name" => options.name = checked(check_name("name", value))?,
        "partition" => options.partition = checked(check_name("partition", value))?,
        "account" => options.account = checked(check_name("account", value))?,
        "time" => options.time = checked(check_time(value))?,
        "memory" => options.memory = Some(parse_memory(value).map_err(|e| e.to_string())?),
        // `cpus-per-task` is sbatch's own name for it.
        "cpus" | "cpus-per-task" => {
            options.cpus = Some(parse_cpus(value).map_err(|e| e.to_string())?);
        }
        "gpus" => options.gpus = Some(parse_gpus("gpus", value).map_err(|e| e.to_string())?),
        "nodes" => options.nodes = Some(parse_count("nodes", value).map_err(|e| e.to_string())?),
        "ntasks-per-node" => {
            options.ntasks_per_node =
                Some(parse_count("ntasks-per-node", value).map_err(|e| e.to_string())?);
        }
        "gpus-per-node" => {
            options.gpus_per_node =
                Some(parse_gpus("gpus-per-node", value).map_err(|e| e.to_string())?);
        }
        "qos" => options.qos = checked(check_name("qos", value))?,
        "constraint" => options.constraint = checked(check_constraint(value))?,
        "exclusive" => {
            options.exclusive = parse_switch("exclusive", value).map_err(|e| e.to_string())?;
        }
        "command" => options.command = Some(words(key, value)?),
        "args" => options.args = Some(words(key, value)?),
        other => {
            return Err(format!(
                "`--set` has no key `{other}` (keys: {}){}",
                SET_KEYS.join(", "),
                did_you_mean(other)
            ));
        }
    }
    Ok(())
}

fn options(args: &SlurmArgs) -> Result<JobOptions, String> {
    let mut options = JobOptions {
        env: args.env.clone(),
        volumes: args.volumes.clone(),
        insecure_registry: args.insecure_registry,
        jupyter: args.jupyter.then(|| Jupyter {
            login_host: args.login_host.clone(),
            login_user: args.login_user.clone(),
            local_port: args.local_port,
        }),
        ..JobOptions::new(args.runner, args.repository.clone())
    };
    for set in &args.sets {
        apply_set(&mut options, set)?;
    }
    Ok(options)
}

pub(super) fn run_slurm(args: &SlurmArgs, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let options = options(args).map_err(|err| CommandFailure::new(err, 1))?;
    if let Some(recipe) = &args.build {
        let script = build_options(args, recipe, options)
            .and_then(|o| build_script(&o).map_err(Into::into))
            .map_err(|err| CommandFailure::new(err, 1))?;
        printer.document(&script);
        return Ok(ExitCode::SUCCESS);
    }
    let image_arg = args
        .image
        .as_deref()
        .expect("clap requires IMAGE without --build");
    let image = crate::inspect::inspect(image_arg).map_err(|err| CommandFailure::new(err, 1))?;
    let script = sbatch_script(&image, &options).map_err(|err| CommandFailure::new(err, 1))?;
    printer.document(&script);
    if options.jupyter.is_some() {
        printer.status(
            "Note",
            "submit it with `sbatch`; the job writes the `ssh -N -L` tunnel command and the URL with its token to `jupyter-JOBID.out` in the directory you submit from",
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a `--set` key was given.
type IsSet = fn(&JobOptions) -> bool;

/// The `--set` keys of a job that runs an image, not of a build: a build job is one task
/// on one node, with no GPU, running imgbuild.
const RUN_ONLY_KEYS: &[(&str, IsSet)] = &[
    ("gpus", |o| o.gpus.is_some()),
    ("gpus-per-node", |o| o.gpus_per_node.is_some()),
    ("nodes", |o| o.nodes.is_some()),
    ("ntasks-per-node", |o| o.ntasks_per_node.is_some()),
    ("command", |o| o.command.is_some()),
    ("args", |o| o.args.is_some()),
];

/// `--build`: the recipe's variants, each locked and with a tag of its own, and where the
/// jobs run and what runs imgbuild in them.
fn build_options(
    args: &SlurmArgs,
    recipe: &std::path::Path,
    job: JobOptions,
) -> Result<BuildOptions, Box<dyn std::error::Error>> {
    if let Some((key, _)) = RUN_ONLY_KEYS.iter().find(|(_, set)| set(&job)) {
        return Err(
            format!("`--set {key}` is for a job that runs an image, not for `--build`").into(),
        );
    }
    let cache_repo = args
        .cache_repo
        .as_ref()
        .ok_or("`--build` needs `--cache-repo REGISTRY/REPO`: the shard tasks hand their layers to the build through it")?;
    let (_, variants) = crate::locked_variants::locked_variants(recipe)?;
    let absolute = |path: &std::path::Path| -> Result<String, std::io::Error> {
        Ok(std::path::absolute(path)?.to_string_lossy().into_owned())
    };
    let builder = match (&args.builder_image, &args.imgbuild) {
        (Some(image), _) => Builder::Container {
            runner: args.runner,
            image: crate::reference::Reference::parse(image)?,
        },
        (None, Some(path)) => Builder::Host {
            imgbuild: absolute(path)?,
        },
        (None, None) => Builder::Host {
            imgbuild: absolute(&std::env::current_exe()?)?,
        },
    };
    let name = match &job.name {
        Some(name) => name.clone(),
        None => job_name_of(&variants[0].base_name()),
    };
    Ok(BuildOptions {
        recipe: absolute(recipe)?,
        workdir: absolute(std::path::Path::new("."))?
            .trim_end_matches("/.")
            .to_string(),
        name,
        builder,
        shards: args.shards,
        cache_repo: cache_repo.to_string(),
        repository: args.repository.clone(),
        variants: if variants[0].variant.is_some() {
            variants.len()
        } else {
            0
        },
        job,
    })
}

/// A job name from a recipe's name, in the characters `--job-name` takes.
fn job_name_of(recipe_name: &str) -> String {
    let name: String = recipe_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() {
        "imgbuild".into()
    } else {
        name
    }
}
