//! sbatch scripts for a pushed image: the job's resources as `#SBATCH` lines and one `srun`
//! step that runs the image, referenced by its registry digest, never by a tag. Pyxis (the
//! SPANK plugin that runs enroot containers, the usual way Slurm sites run OCI images) or
//! `podman run` runs it. A CUDA image asks for one GPU through `--gres=gpu:N`.
//!
//! Every value that reaches the script is either checked against the grammar Slurm gives it
//! (the `#SBATCH` lines, which sbatch reads with its own parser) or shell-quoted (the `srun`
//! line, which bash reads), so no `--set`, `--env` or image config can add a command.

mod build;
mod jupyter;
mod values;

pub(crate) use build::{BuildOptions, Builder, build_script};
pub(crate) use jupyter::{Jupyter, check_login_host, check_login_user};

pub(crate) use values::{
    check_constraint, check_name, check_time, parse_count, parse_cpus, parse_gpus, parse_memory,
    parse_switch, parse_volume,
};
use values::{check_env, is_name_char};

use crate::{inspect::ImageSummary, reference::Reference};

/// How the job step runs the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Runner {
    /// `srun --container-image=…` (Pyxis and enroot).
    Pyxis,
    /// `srun podman run …`.
    Podman,
}

/// GPUs per job: a count, optionally of one GRES type (`a100:2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gpus {
    pub kind: Option<String>,
    pub count: u32,
}

/// A host directory or file mounted into the container (`--volume SRC:DST[:ro]`): both
/// absolute, normal and free of `,` and `:`, which Pyxis's mount list and podman's `-v`
/// would read as separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Volume {
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

/// What the script says beyond the image: the `--set` keys and flags.
#[derive(Debug, Clone)]
pub(crate) struct JobOptions {
    pub runner: Runner,
    /// `REGISTRY/REPO`, where the image was pushed.
    pub repository: String,
    /// `--job-name`; default: the layout's directory name.
    pub name: Option<String>,
    pub partition: Option<String>,
    pub account: Option<String>,
    /// `--time`, in one of Slurm's forms (`90`, `4:00:00`, `2-00:00:00`).
    pub time: Option<String>,
    /// `--cpus-per-task`.
    pub cpus: Option<u32>,
    /// `--nodes`; with it a multi-node job, one task per node unless `ntasks_per_node`.
    pub nodes: Option<u32>,
    /// `--ntasks-per-node`; without it (and `nodes`) the job has one task.
    pub ntasks_per_node: Option<u32>,
    /// `--gpus-per-node`, in place of the job's `--gres=gpu:N`.
    pub gpus_per_node: Option<Gpus>,
    /// `--qos`.
    pub qos: Option<String>,
    /// `--constraint`, node features (`a100&ib`, `[rack1|rack2]`).
    pub constraint: Option<String>,
    /// `--exclusive`: the nodes to this job alone.
    pub exclusive: bool,
    /// `--volume`, in this order.
    pub volumes: Vec<Volume>,
    /// `--mem`, as Slurm writes it (`32G`).
    pub memory: Option<String>,
    /// Default: one GPU for a CUDA image, else none.
    pub gpus: Option<Gpus>,
    /// Replace the image's entrypoint (and with it its cmd) or cmd, as `k8s` does.
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    /// `--env NAME=VALUE`, set in the container in this order.
    pub env: Vec<(String, String)>,
    /// Pull over plain HTTP or without verifying TLS (a registry on the nodes' loopback, a
    /// test registry): podman's `--tls-verify=false`, enroot's `ENROOT_ALLOW_HTTP`.
    pub insecure_registry: bool,
    /// `--jupyter`: the image's JupyterLab, reached through an SSH tunnel.
    pub jupyter: Option<Jupyter>,
}

impl JobOptions {
    /// The image's own command and one GPU if it is a CUDA image, nothing else asked for.
    pub(crate) fn new(runner: Runner, repository: String) -> Self {
        JobOptions {
            runner,
            repository,
            name: None,
            partition: None,
            account: None,
            time: None,
            cpus: None,
            nodes: None,
            ntasks_per_node: None,
            gpus_per_node: None,
            qos: None,
            constraint: None,
            exclusive: false,
            volumes: Vec::new(),
            memory: None,
            gpus: None,
            command: None,
            args: None,
            env: Vec::new(),
            insecure_registry: false,
            jupyter: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SlurmError {
    #[error(
        "`{repository}` is not a repository like `registry.example/team/image` (no tag, no digest: the script adds the image's digest)"
    )]
    Repository { repository: String },
    #[error("`--set {key}={value}` {expected}")]
    Value {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "`--env {name}=…`: `{name}` is not a shell variable name (letters, digits and `_`, not starting with a digit), which the job script exports"
    )]
    EnvName { name: String },
    #[error("`--env {name}` is given twice")]
    DuplicateEnv { name: String },
    #[error(
        "`--env {name}=…`: with the Pyxis runner the job step's environment is also the one Pyxis runs enroot in on the node, so {why}; set it in the recipe's `[image.env]`, or use `--runner podman`, which passes it to the container only"
    )]
    PyxisEnvName { name: String, why: &'static str },
    #[error(
        "`--env {name}=…`: the value has a quote (`'` or `\"`), which Slurm's `srun --export` list cannot carry; set it in the recipe's `[image.env]`, or use `--runner podman`"
    )]
    PyxisEnvValue { name: String },
    #[error(
        "`{image}` has neither an entrypoint nor a cmd, so the job would run nothing: give one with `--set command=…`"
    )]
    NoCommand { image: String },
    #[error("`--volume {value}`: {reason}")]
    Volume { value: String, reason: String },
    #[error(
        "`--set gpus` and `--set gpus-per-node` both ask for GPUs; give one (gpus-per-node for a multi-node job)"
    )]
    GpusTwice,
    #[error(
        "the {what} `{}` holds a line break or another control character, which a job script cannot carry",
        value.escape_debug()
    )]
    LineBreak { what: &'static str, value: String },
    #[error("`--jupyter`: `{image}` {reason}")]
    Jupyter { image: String, reason: String },
}

/// The sbatch script that runs `image` with `options`.
pub(crate) fn sbatch_script(
    image: &ImageSummary,
    options: &JobOptions,
) -> Result<String, SlurmError> {
    let reference = pinned_reference(&options.repository, image.image_digest())?;
    check_env(&options.env)?;
    if options.runner == Runner::Pyxis {
        check_pyxis_env(&options.env)?;
    }
    let name = match &options.name {
        Some(name) => name.clone(),
        None => job_name(&image.image),
    };
    if options.gpus.is_some() && options.gpus_per_node.is_some() {
        return Err(SlurmError::GpusTwice);
    }
    // A CUDA image asks for one GPU unless told otherwise; per node when told per node.
    let gpus = match (&options.gpus, &options.gpus_per_node) {
        (Some(gpus), _) => gpus.clone(),
        (None, Some(_)) => Gpus {
            kind: None,
            count: 0,
        },
        (None, None) => Gpus {
            kind: None,
            count: u32::from(image.cuda.is_some()),
        },
    };
    let jupyter = options
        .jupyter
        .as_ref()
        .map(|j| jupyter::plan(image, options, j))
        .transpose()?;
    let mut script = format!(
        "#!/bin/bash\n# Runs {} through {}; written by `imgbuild slurm`, submit it with `sbatch`.\n",
        reference,
        match options.runner {
            Runner::Pyxis => "Pyxis/enroot",
            Runner::Podman => "podman",
        }
    );
    for directive in directives(&name, options, &gpus) {
        script.push_str(&format!("#SBATCH {directive}\n"));
    }
    script.push_str("\nset -euo pipefail\n");
    script.push_str(&volume_checks(&options.volumes));
    let launch = match &jupyter {
        Some(plan) => Launch::jupyter(plan),
        None => Launch::of(options),
    };
    let argv = container_argv(image, &launch);
    if argv.is_empty() {
        return Err(SlurmError::NoCommand {
            image: image.image.clone(),
        });
    }
    let gpus = gpus.count > 0 || options.gpus_per_node.is_some();
    let step = match options.runner {
        Runner::Pyxis => pyxis_step(&argv, image, &reference, options, &launch),
        Runner::Podman => podman_step(&reference, options, &launch, gpus),
    };
    match &jupyter {
        Some(plan) => {
            script.push_str(&plan.prelude);
            script.push_str(&format!("{} &\n", step.trim_end()));
            script.push_str(&jupyter::supervise(options.runner));
        }
        None => script.push_str(&step),
    }
    Ok(script)
}

/// What the step runs in the container: the overrides of the image's command, and the
/// variables the container takes from the job by name.
#[derive(Debug)]
struct Launch {
    command: Option<Vec<String>>,
    args: Option<Vec<String>>,
    /// Names whose values the job sets (the Jupyter server's port and token).
    inherited: &'static [&'static str],
    /// podman's `--name`, a shell word.
    container_name: Option<&'static str>,
}

impl Launch {
    fn of(options: &JobOptions) -> Launch {
        Launch {
            command: options.command.clone(),
            args: options.args.clone(),
            inherited: &[],
            container_name: None,
        }
    }

    /// JupyterLab's command, with no args: the image's cmd is dropped with its entrypoint.
    fn jupyter(plan: &jupyter::JupyterPlan) -> Launch {
        Launch {
            command: Some(plan.command.clone()),
            args: None,
            inherited: jupyter::SERVER_ENV,
            container_name: Some(jupyter::CONTAINER_NAME),
        }
    }
}

/// `REPOSITORY@DIGEST`, parsed as Docker reads it: a repository without tag or digest.
fn pinned_reference(repository: &str, digest: &str) -> Result<Reference, SlurmError> {
    let refused = || SlurmError::Repository {
        repository: repository.to_string(),
    };
    let parsed = Reference::parse(repository.trim_end_matches('/')).map_err(|_| refused())?;
    if parsed.tag.is_some() || parsed.digest.is_some() || !repository.contains('/') {
        return Err(refused());
    }
    Ok(parsed.with_digest(digest))
}

/// The `#SBATCH` options, each already checked by the `check_*` functions. One task unless
/// nodes or tasks per node are asked for; then `srun` runs the step once per task, on
/// every node.
pub(super) fn directives(name: &str, options: &JobOptions, gpus: &Gpus) -> Vec<String> {
    let mut lines = vec![format!("--job-name={name}")];
    if options.jupyter.is_some() {
        lines.push(format!("--output={}", jupyter::OUTPUT));
    }
    match (options.nodes, options.ntasks_per_node) {
        (None, None) => lines.push("--ntasks=1".to_string()),
        (nodes, per_node) => {
            lines.extend(nodes.map(|n| format!("--nodes={n}")));
            lines.push(format!("--ntasks-per-node={}", per_node.unwrap_or(1)));
        }
    }
    let optional = [
        ("partition", &options.partition),
        ("account", &options.account),
        ("qos", &options.qos),
        ("time", &options.time),
        ("mem", &options.memory),
        ("constraint", &options.constraint),
    ];
    for (flag, value) in optional {
        if let Some(value) = value {
            lines.push(format!("--{flag}={value}"));
        }
    }
    if let Some(cpus) = options.cpus {
        lines.push(format!("--cpus-per-task={cpus}"));
    }
    if options.exclusive {
        lines.push("--exclusive".to_string());
    }
    if gpus.count > 0 {
        lines.push(format!("--gres=gpu:{}", gpu_count(gpus)));
    }
    if let Some(per_node) = &options.gpus_per_node {
        lines.push(format!("--gpus-per-node={}", gpu_count(per_node)));
    }
    lines
}

/// `N` or `TYPE:N`, as `--gres=gpu:` and `--gpus-per-node=` take it.
fn gpu_count(gpus: &Gpus) -> String {
    match &gpus.kind {
        Some(kind) => format!("{kind}:{}", gpus.count),
        None => gpus.count.to_string(),
    }
}

/// Each volume's source checked on the node the batch script starts on, before anything
/// is pulled: a missing one ends the job with a line saying which, where Pyxis or podman
/// would fail later with a message of their own.
fn volume_checks(volumes: &[Volume]) -> String {
    volumes
        .iter()
        .map(|volume| {
            let source = shell_quote(&volume.source);
            format!(
                "[ -e {source} ] || {{ echo \"imgbuild: the volume source \"{source}\" is missing on $(hostname)\" >&2; exit 1; }}\n"
            )
        })
        .collect()
}

/// `SRC:DST[:ro]` as Pyxis's `--container-mounts` and podman's `-v` take it.
fn mount_spec(volume: &Volume) -> String {
    let mode = if volume.read_only { ":ro" } else { "" };
    format!("{}:{}{mode}", volume.source, volume.target)
}

/// The Pyxis step: the command is written out (the image's entrypoint and cmd, or the
/// overrides), with `--no-container-entrypoint` so that a site whose Pyxis runs entrypoints
/// by default does not run it twice; the workdir is passed on, as Pyxis would otherwise start
/// in the submitting directory.
fn pyxis_step(
    argv: &[String],
    image: &ImageSummary,
    reference: &Reference,
    options: &JobOptions,
    launch: &Launch,
) -> String {
    let mut step = String::new();
    if options.insecure_registry {
        // Pyxis passes the job's environment to `enroot import`. imgbuild's own constant:
        // the user's `--env` never reaches the batch shell (below).
        step.push_str("export ENROOT_ALLOW_HTTP=yes\n");
    }
    let mut flags = Vec::new();
    if !options.env.is_empty() {
        // The values go to the step's tasks through srun's argument, never into the batch
        // shell or srun's own environment (where `PATH` would pick the `srun` that runs and
        // `LD_PRELOAD` load into it).
        flags.push(shell_quote(&export_list(&options.env)));
    }
    flags.extend([
        format!("--container-image={}", shell_quote(&enroot_uri(reference))),
        "--no-container-entrypoint".to_string(),
    ]);
    if let Some(workdir) = image.config.workdir.as_deref().filter(|w| !w.is_empty()) {
        flags.push(format!("--container-workdir={}", shell_quote(workdir)));
    }
    if !options.volumes.is_empty() {
        let mounts: Vec<String> = options.volumes.iter().map(mount_spec).collect();
        flags.push(format!(
            "--container-mounts={}",
            shell_quote(&mounts.join(","))
        ));
    }
    // Named here, the job's values win over the image's (Pyxis keeps an image's own value
    // of a variable otherwise).
    let names: Vec<&str> = (options.env.iter().map(|(n, _)| n.as_str()))
        .chain(launch.inherited.iter().copied())
        .collect();
    if !names.is_empty() {
        flags.push(format!("--container-env={}", names.join(",")));
    }
    let argv: Vec<String> = argv.iter().map(|w| shell_quote(w)).collect();
    step.push_str(&command_lines("srun", &flags, &argv));
    step
}

/// `--export=ALL,NAME=VALUE,…`: the batch shell's environment (Slurm's default, with the
/// job's own `SLURM_*`) and the `--env` values, for the step only. Slurm splits the list at
/// commas outside quotes and strips the quotes around a whole item, so a value with a comma
/// is written as `'NAME=VALUE'`; a value with a quote is refused before ([`check_pyxis_env`]).
fn export_list(env: &[(String, String)]) -> String {
    let mut list = String::from("--export=ALL");
    for (name, value) in env {
        let item = format!("{name}={value}");
        list.push(',');
        if value.contains(',') {
            list.push_str(&format!("'{item}'"));
        } else {
            list.push_str(&item);
        }
    }
    list
}

/// The names that steer what runs on the node rather than in the container (the dynamic
/// loader, the search path, Slurm, enroot and Pyxis themselves), and the values `srun
/// --export` cannot carry: refused for the Pyxis runner, whose step environment is also the
/// environment of the enroot commands Pyxis runs on the node.
fn check_pyxis_env(env: &[(String, String)]) -> Result<(), SlurmError> {
    const PREFIXES: &[&str] = &["LD_", "SLURM_", "SPANK_", "ENROOT_", "PYXIS_"];
    for (name, value) in env {
        let why = if name == "PATH" {
            Some("`PATH` would choose the programs Pyxis and enroot run there")
        } else if PREFIXES.iter().any(|p| name.starts_with(p)) {
            Some(
                "`LD_*`, `SLURM_*`, `SPANK_*`, `ENROOT_*` and `PYXIS_*` would steer the loader, Slurm, enroot or Pyxis there",
            )
        } else {
            None
        };
        if let Some(why) = why {
            return Err(SlurmError::PyxisEnvName {
                name: name.clone(),
                why,
            });
        }
        if value.contains(['\'', '"']) {
            return Err(SlurmError::PyxisEnvValue { name: name.clone() });
        }
    }
    Ok(())
}

/// The podman step: podman reads the image's entrypoint, cmd, env and workdir itself, as a
/// Kubernetes node does; only the overrides are written. The node's network (multi-node
/// jobs reach each other over it); the job's GPUs by their Slurm ids, as CDI devices.
fn podman_step(reference: &Reference, options: &JobOptions, launch: &Launch, gpus: bool) -> String {
    let mut step = String::new();
    let mut flags = vec!["--rm".to_string(), "--network=host".to_string()];
    flags.extend(launch.container_name.map(|name| format!("--name={name}")));
    if options.insecure_registry {
        flags.push("--tls-verify=false".into());
    }
    if gpus {
        step.push_str(concat!(
            ": \"${SLURM_JOB_GPUS:?Slurm allocated no GPU to this job}\"\n",
            "gpus=()\n",
            "for id in ${SLURM_JOB_GPUS//,/ }; do gpus+=(--device \"nvidia.com/gpu=$id\"); done\n",
        ));
        flags.push("\"${gpus[@]}\"".into());
    }
    for (name, value) in &options.env {
        flags.push(format!("--env={}", shell_quote(&format!("{name}={value}"))));
    }
    // Without `=VALUE` podman takes the value from its own environment, the job's.
    flags.extend(launch.inherited.iter().map(|name| format!("--env={name}")));
    for volume in &options.volumes {
        flags.push(format!("--volume={}", shell_quote(&mount_spec(volume))));
    }
    if let Some(command) = &launch.command {
        let json = serde_json::to_string(command).unwrap_or_default();
        flags.push(format!("--entrypoint={}", shell_quote(&json)));
    }
    let mut image_and_args = vec![shell_quote(&reference.to_string())];
    if let Some(args) = &launch.args {
        image_and_args.extend(args.iter().map(|w| shell_quote(w)));
    }
    step.push_str(&command_lines("srun podman run", &flags, &image_and_args));
    step
}

/// The container's command line, as Docker and Kubernetes compose it: `command` replaces the
/// entrypoint and drops the image's cmd, `args` replaces the cmd.
fn container_argv(image: &ImageSummary, launch: &Launch) -> Vec<String> {
    let config = &image.config;
    let (entrypoint, cmd) = match &launch.command {
        Some(command) => (command.clone(), None),
        None => (
            config.entrypoint.clone().unwrap_or_default(),
            config.cmd.clone(),
        ),
    };
    let args = launch.args.clone().or(cmd).unwrap_or_default();
    entrypoint.into_iter().chain(args).collect()
}

/// The image as enroot names it, `REGISTRY#REPO:sha256:…`: the `#` form is the one every
/// enroot reads (3.x takes `REGISTRY/REPO` for a Docker Hub name), and a digest in the tag's
/// place is fetched as `/manifests/sha256:…`, pinned the same as `@sha256:…`, which only
/// enroot 4 parses.
fn enroot_uri(reference: &Reference) -> String {
    let digest = reference.digest.as_deref().unwrap_or_default();
    format!("{}#{}:{digest}", reference.api_host(), reference.repository)
}

/// `program`, then each of `flags` on a line of its own, then `rest` on the last line.
fn command_lines(program: &str, flags: &[String], rest: &[String]) -> String {
    let mut lines = vec![program.to_string()];
    lines.extend(flags.iter().cloned());
    lines.push(rest.join(" "));
    format!("{}\n", lines.join(" \\\n    "))
}

/// `word` as one shell word: as it is when it holds only characters no shell treats
/// specially, else in single quotes (a `'` inside closes them, is escaped and reopens them).
pub(crate) fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The job's name from the layout's (`images/py39-torch21:latest` → `py39-torch21`), in the
/// characters [`check_name`] takes.
fn job_name(image: &str) -> String {
    let (path, _) = crate::reference::split_layout(image);
    let base = std::path::Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = base
        .chars()
        .map(|c| if is_name_char(c) { c } else { '-' })
        .collect();
    if name.is_empty() {
        "imgbuild".into()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(
            shell_quote("/opt/conda/bin/python"),
            "/opt/conda/bin/python"
        );
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("$(id)"), "'$(id)'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("#x"), "'#x'");
        assert_eq!(shell_quote("a\nb"), "'a\nb'");
    }

    fn image(entrypoint: Option<&[&str]>, cmd: Option<&[&str]>) -> ImageSummary {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect();
        ImageSummary {
            image: "images/Train_2:latest".into(),
            index_digest: None,
            platforms: Vec::new(),
            manifest_digest: format!("sha256:{}", "a".repeat(64)),
            config_digest: String::new(),
            created: None,
            os: "linux".into(),
            architecture: "amd64".into(),
            config: crate::inspect::RuntimeConfig {
                entrypoint: entrypoint.map(words),
                cmd: cmd.map(words),
                workdir: Some("/work dir".into()),
                ..Default::default()
            },
            base: None,
            conda: None,
            cuda: None,
            gpu: None,
            smoke: None,
            layers: Vec::new(),
            total_size: 0,
            packages: Vec::new(),
        }
    }

    fn options(runner: Runner) -> JobOptions {
        JobOptions::new(runner, "registry.example/ml/train".into())
    }

    #[test]
    fn the_command_is_composed_as_docker_does() {
        let image = image(Some(&["python"]), Some(&["train.py"]));
        let mut options = options(Runner::Pyxis);
        assert_eq!(
            container_argv(&image, &Launch::of(&options)),
            ["python", "train.py"]
        );
        options.args = Some(vec!["eval.py".into()]);
        assert_eq!(
            container_argv(&image, &Launch::of(&options)),
            ["python", "eval.py"]
        );
        options.args = None;
        options.command = Some(vec!["bash".into()]);
        assert_eq!(
            container_argv(&image, &Launch::of(&options)),
            ["bash"],
            "cmd dropped"
        );
    }

    #[test]
    fn the_pyxis_script_pins_the_digest_and_quotes_every_word() {
        let image = image(Some(&["sh", "-c", "echo $0"]), None);
        let mut options = options(Runner::Pyxis);
        options.env = vec![("HF_HOME".into(), "/a b".into())];
        options.gpus = Some(Gpus {
            kind: None,
            count: 2,
        });
        let script = sbatch_script(&image, &options).unwrap();
        let digest = "a".repeat(64);
        assert!(script.starts_with("#!/bin/bash\n"), "{script}");
        for line in [
            "#SBATCH --job-name=Train_2\n",
            "#SBATCH --gres=gpu:2\n",
            "    '--export=ALL,HF_HOME=/a b' \\\n",
            &format!("--container-image='registry.example#ml/train:sha256:{digest}'"),
            "--container-workdir='/work dir'",
            "--container-env=HF_HOME",
            "sh -c 'echo $0'\n",
        ] {
            assert!(script.contains(line), "`{line}` in:\n{script}");
        }
        options.repository = "registry.example/ml/train:v1".into();
        assert!(sbatch_script(&image, &options).is_err(), "a tag");
        options.repository = "train".into();
        assert!(sbatch_script(&image, &options).is_err(), "no registry path");
        options.repository = "registry.example/ml/train".into();
        options.env.push(("HF_HOME".into(), "again".into()));
        assert!(matches!(
            sbatch_script(&image, &options),
            Err(SlurmError::DuplicateEnv { .. })
        ));
    }

    #[test]
    fn a_multi_node_script_asks_per_node_and_mounts_the_volumes() {
        let image = image(Some(&["torchrun", "train.py"]), None);
        let mut options = options(Runner::Pyxis);
        options.nodes = Some(2);
        options.ntasks_per_node = Some(4);
        options.gpus_per_node = Some(parse_gpus("gpus-per-node", "h100:4").unwrap());
        options.qos = Some("high".into());
        options.constraint = Some("ib&h100".into());
        options.exclusive = true;
        options.volumes = vec![
            parse_volume("/scratch/data:/data:ro").unwrap(),
            parse_volume("/home/me/out:/out").unwrap(),
        ];
        let script = sbatch_script(&image, &options).unwrap();
        for line in [
            "#SBATCH --nodes=2\n",
            "#SBATCH --ntasks-per-node=4\n",
            "#SBATCH --qos=high\n",
            "#SBATCH --constraint=ib&h100\n",
            "#SBATCH --exclusive\n",
            "#SBATCH --gpus-per-node=h100:4\n",
            "[ -e /scratch/data ] || {",
            "--container-mounts=/scratch/data:/data:ro,/home/me/out:/out",
        ] {
            assert!(script.contains(line), "`{line}` in:\n{script}");
        }
        assert!(!script.contains("--ntasks=1"), "{script}");
        assert!(!script.contains("--gres"), "per node only: {script}");
        options.runner = Runner::Podman;
        let script = sbatch_script(&image, &options).unwrap();
        assert!(
            script.contains("--volume=/scratch/data:/data:ro"),
            "{script}"
        );
        options.gpus = Some(parse_gpus("gpus", "1").unwrap());
        assert!(matches!(
            sbatch_script(&image, &options),
            Err(SlurmError::GpusTwice)
        ));
    }

    #[test]
    fn pyxis_env_goes_to_the_step_only() {
        let image = image(Some(&["python"]), None);
        let mut options = options(Runner::Pyxis);
        options.env = vec![
            ("A".into(), "no".into()),
            ("LIST".into(), "a,b $(id)".into()),
        ];
        let script = sbatch_script(&image, &options).unwrap();
        assert!(!script.contains("export A"), "{script}");
        assert!(
            script.contains(r"'--export=ALL,A=no,'\''LIST=a,b $(id)'\''' \"),
            "{script}"
        );
        for (name, value) in [
            ("PATH", "/tmp/x"),
            ("LD_PRELOAD", "/tmp/x.so"),
            ("SLURM_CONF", "/x"),
            ("ENROOT_MOUNT_HOME", "y"),
            ("A", "it's"),
            ("A", "say \"x\""),
        ] {
            options.env = vec![(name.into(), value.into())];
            assert!(sbatch_script(&image, &options).is_err(), "{name}={value}");
        }
        // podman gets them as its arguments, which reach the container only.
        options.runner = Runner::Podman;
        options.env = vec![("PATH".into(), "/tmp/x".into())];
        let script = sbatch_script(&image, &options).unwrap();
        assert!(script.contains("--env=PATH=/tmp/x"), "{script}");
    }

    fn jupyter_image(user: &str) -> ImageSummary {
        let mut image = image(Some(&["/opt/conda/bin/jupyter", "lab"]), None);
        image.config.user = Some(user.into());
        image.packages = vec!["pypi:jupyterlab-4.3.8".into(), "python-3.11.9-h1_0".into()];
        image
    }

    #[test]
    fn the_jupyter_script_serves_the_lab_and_prints_the_tunnel() {
        let mut options = options(Runner::Podman);
        options.jupyter = Some(Jupyter {
            login_host: Some("login1.example".into()),
            login_user: None,
            local_port: 9999,
        });
        let script = sbatch_script(&jupyter_image("jovyan"), &options).unwrap();
        for line in [
            "#SBATCH --output=jupyter-%j.out\n",
            "--name=\"imgbuild-jupyter-${SLURM_JOB_ID:-$$}\"",
            "--env=JUPYTER_TOKEN \\\n",
            "--env=JUPYTER_PORT \\\n",
            "--entrypoint='[\"/opt/conda/bin/jupyter\",\"lab\",\"--no-browser\",\"--ip=0.0.0.0\"]'",
            "login_host=login1.example\n",
            "ssh -N -L 9999:$node:$port $login_user@$login_host",
            "http://localhost:9999/lab?token=$JUPYTER_TOKEN",
            "JUPYTER_TOKEN=$(od -An -N24 -tx1 /dev/urandom",
            "trap stop TERM INT\n",
        ] {
            assert!(script.contains(line), "`{line}` in:\n{script}");
        }
        assert!(!script.contains("--allow-root"), "{script}");
        // The token is never on a command line.
        assert!(!script.contains("--ServerApp.token"), "{script}");

        options.runner = Runner::Pyxis;
        let script = sbatch_script(&jupyter_image("root"), &options).unwrap();
        assert!(
            script.contains("--container-env=JUPYTER_TOKEN,JUPYTER_PORT,JUPYTER_PORT_RETRIES"),
            "{script}"
        );
        assert!(script.contains("[ \"$(id -u)\" != 0 ]"), "{script}");
    }

    #[test]
    fn the_jupyter_mode_refuses_what_it_cannot_serve() {
        let mut options = options(Runner::Podman);
        options.jupyter = Some(Jupyter {
            login_host: None,
            login_user: None,
            local_port: 8888,
        });
        for user in ["", "root", "0:0"] {
            let err = sbatch_script(&jupyter_image(user), &options).unwrap_err();
            assert!(err.to_string().contains("runs as root"), "{err}");
        }
        let mut no_lab = jupyter_image("jovyan");
        no_lab.packages = vec![
            "pypi:jupyterlab_server-2.27.3".into(),
            "jupyterlab-x".into(),
        ];
        let err = sbatch_script(&no_lab, &options).unwrap_err();
        assert!(err.to_string().contains("has no JupyterLab"), "{err}");
        options.env = vec![("JUPYTER_TOKEN".into(), "known".into())];
        assert!(sbatch_script(&jupyter_image("jovyan"), &options).is_err());
        options.env.clear();
        options.nodes = Some(2);
        assert!(sbatch_script(&jupyter_image("jovyan"), &options).is_err());
        options.nodes = None;
        options.args = Some(vec!["x".into()]);
        assert!(sbatch_script(&jupyter_image("jovyan"), &options).is_err());
    }
}
