//! sbatch scripts for a pushed image: the job's resources as `#SBATCH` lines and one `srun`
//! step that runs the image, referenced by its registry digest, never by a tag. Pyxis (the
//! SPANK plugin that runs enroot containers, the usual way Slurm sites run OCI images) or
//! `podman run` runs it. A CUDA image asks for one GPU through `--gres=gpu:N`.
//!
//! Every value that reaches the script is either checked against the grammar Slurm gives it
//! (the `#SBATCH` lines, which sbatch reads with its own parser) or shell-quoted (the `srun`
//! line, which bash reads), so no `--set`, `--env` or image config can add a command.

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
    let argv = container_argv(image, options);
    if argv.is_empty() {
        return Err(SlurmError::NoCommand {
            image: image.image.clone(),
        });
    }
    let step = match options.runner {
        Runner::Pyxis => pyxis_step(&argv, image, &reference, options),
        Runner::Podman => podman_step(
            &reference,
            options,
            gpus.count > 0 || options.gpus_per_node.is_some(),
        ),
    };
    script.push_str(&step);
    Ok(script)
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
fn directives(name: &str, options: &JobOptions, gpus: &Gpus) -> Vec<String> {
    let mut lines = vec![format!("--job-name={name}")];
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
    if !options.env.is_empty() {
        // Named here, the job's values win over the image's (Pyxis keeps an image's own
        // value of a variable otherwise).
        let names: Vec<&str> = options.env.iter().map(|(n, _)| n.as_str()).collect();
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
fn podman_step(reference: &Reference, options: &JobOptions, gpus: bool) -> String {
    let mut step = String::new();
    let mut flags = vec!["--rm".to_string(), "--network=host".to_string()];
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
    for volume in &options.volumes {
        flags.push(format!("--volume={}", shell_quote(&mount_spec(volume))));
    }
    if let Some(command) = &options.command {
        let json = serde_json::to_string(command).unwrap_or_default();
        flags.push(format!("--entrypoint={}", shell_quote(&json)));
    }
    let mut image_and_args = vec![shell_quote(&reference.to_string())];
    if let Some(args) = &options.args {
        image_and_args.extend(args.iter().map(|w| shell_quote(w)));
    }
    step.push_str(&command_lines("srun podman run", &flags, &image_and_args));
    step
}

/// The container's command line, as Docker and Kubernetes compose it: `command` replaces the
/// entrypoint and drops the image's cmd, `args` replaces the cmd.
fn container_argv(image: &ImageSummary, options: &JobOptions) -> Vec<String> {
    let config = &image.config;
    let (entrypoint, cmd) = match &options.command {
        Some(command) => (command.clone(), None),
        None => (
            config.entrypoint.clone().unwrap_or_default(),
            config.cmd.clone(),
        ),
    };
    let args = options.args.clone().or(cmd).unwrap_or_default();
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

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-".contains(c)
}

fn value_error(key: &'static str, value: &str, expected: &'static str) -> SlurmError {
    SlurmError::Value {
        key,
        value: value.to_string(),
        expected,
    }
}

/// Checks a job name, partition (a comma-separated list) or account: letters, digits, `.`,
/// `_` and `-`.
pub(crate) fn check_name(key: &'static str, value: &str) -> Result<(), SlurmError> {
    let list = key == "partition";
    let valid = value
        .split(',')
        .all(|part| !part.is_empty() && part.chars().all(is_name_char) && !part.starts_with('-'))
        && (list || !value.contains(','));
    if valid {
        Ok(())
    } else {
        Err(value_error(
            key,
            value,
            "must be letters, digits, `.`, `_` and `-` (a partition: several, separated by `,`)",
        ))
    }
}

/// Checks a time limit in one of the forms sbatch reads: `MINUTES`, `MINUTES:SECONDS`,
/// `HOURS:MINUTES:SECONDS`, `DAYS-HOURS`, `DAYS-HOURS:MINUTES`, `DAYS-HOURS:MINUTES:SECONDS`,
/// or `UNLIMITED`.
pub(crate) fn check_time(value: &str) -> Result<(), SlurmError> {
    let number = |s: &str| !s.is_empty() && s.len() <= 6 && s.chars().all(|c| c.is_ascii_digit());
    let clock = |s: &str, most: usize| {
        let parts: Vec<&str> = s.split(':').collect();
        parts.len() <= most && parts.iter().all(|p| number(p))
    };
    let valid = match value.split_once('-') {
        Some((days, clock_part)) => number(days) && clock(clock_part, 3),
        None => clock(value, 3) || value.eq_ignore_ascii_case("unlimited"),
    };
    if valid {
        Ok(())
    } else {
        Err(value_error(
            "time",
            value,
            "is not a Slurm time limit: MINUTES, HH:MM:SS, D-HH, D-HH:MM:SS or UNLIMITED",
        ))
    }
}

/// Reads a memory size as Slurm writes it: a whole number of mebibytes, or with a `K`, `M`,
/// `G` or `T` suffix, which Slurm reads as powers of 1024; the Kubernetes forms `Ki`, `Mi`,
/// `Gi` and `Ti` mean the same and are written as Slurm's.
pub(crate) fn parse_memory(value: &str) -> Result<String, SlurmError> {
    let (number, unit) = value.split_at(
        value
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(value.len()),
    );
    let unit = match unit.strip_suffix('i').unwrap_or(unit) {
        "" if unit.is_empty() => Some(""),
        u @ ("K" | "M" | "G" | "T" | "k" | "m" | "g" | "t") => Some(u),
        _ => None,
    };
    match (number.parse::<u64>(), unit) {
        (Ok(n), Some(unit)) if n > 0 => Ok(format!("{n}{}", unit.to_ascii_uppercase())),
        _ => Err(value_error(
            "memory",
            value,
            "is not a memory size like `32G`, `512M` or `32Gi` (Slurm reads K, M, G and T as powers of 1024)",
        )),
    }
}

/// Reads `--set cpus=N`: a whole number above 0.
pub(crate) fn parse_cpus(value: &str) -> Result<u32, SlurmError> {
    parse_count("cpus", value)
}

/// A count above 0 in plain digits (`cpus`, `nodes`, `ntasks-per-node`): no sign, no
/// range, no suffix, none of which the script would pass on as it was meant.
pub(crate) fn parse_count(key: &'static str, value: &str) -> Result<u32, SlurmError> {
    Some(value)
        .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| value_error(key, value, "must be a whole number above 0"))
}

/// Checks `--set constraint=…`: node features (letters, digits, `.`, `_`, `-`) joined by
/// sbatch's operators `&`, `|`, `,`, `*N`, `[…]` and `(…)`, with no white space, which would
/// end the `#SBATCH` line's value.
pub(crate) fn check_constraint(value: &str) -> Result<(), SlurmError> {
    let valid = !value.is_empty()
        && value
            .chars()
            .all(|c| is_name_char(c) || "&|,*[]()".contains(c))
        && value.chars().any(is_name_char);
    if valid {
        Ok(())
    } else {
        Err(value_error(
            "constraint",
            value,
            "must be node features (letters, digits, `.`, `_`, `-`) joined by `&`, `|`, `,`, `*N`, `[…]` or `(…)`",
        ))
    }
}

/// Reads `--set exclusive=true|false`.
pub(crate) fn parse_switch(key: &'static str, value: &str) -> Result<bool, SlurmError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(value_error(key, value, "must be `true` or `false`")),
    }
}

/// Reads `--volume SRC:DST[:ro|rw]`: a host path and a container path, both absolute and
/// normal (no `..`; `.` and doubled `/` are dropped), with none of `,` and `:`.
pub(crate) fn parse_volume(text: &str) -> Result<Volume, SlurmError> {
    let error = |reason: String| SlurmError::Volume {
        value: text.to_string(),
        reason,
    };
    let parts: Vec<&str> = text.split(':').collect();
    let (source, target, read_only) = match parts[..] {
        [source, target] => (source, target, false),
        [source, target, "ro"] => (source, target, true),
        [source, target, "rw"] => (source, target, false),
        [_, _, mode] => return Err(error(format!("`{mode}` is neither `ro` nor `rw`"))),
        _ => {
            return Err(error(
                "not `SRC:DST` or `SRC:DST:ro` (a path may hold no `:`)".into(),
            ));
        }
    };
    let normal = |path: &str, what: &str| {
        crate::k8s::normal_path(path)
            .filter(|p| !p.contains(','))
            .ok_or_else(|| {
                error(format!(
                    "the {what} `{}` is not an absolute path without `..` and `,`",
                    path.escape_debug()
                ))
            })
    };
    Ok(Volume {
        source: normal(source, "host path")?,
        target: normal(target, "container path")?,
        read_only,
    })
}

/// Reads `--set gpus=N` or `gpus=TYPE:N` (a GRES type the site defines, e.g. `a100:2`); 0
/// asks for none.
pub(crate) fn parse_gpus(key: &'static str, value: &str) -> Result<Gpus, SlurmError> {
    let (kind, count) = match value.rsplit_once(':') {
        Some((kind, count)) => (Some(kind), count),
        None => (None, value),
    };
    let kind_ok = kind.is_none_or(|k| !k.is_empty() && k.chars().all(is_name_char));
    let digits = !count.is_empty() && count.chars().all(|c| c.is_ascii_digit());
    match count.parse::<u32>() {
        Ok(count) if kind_ok && digits => Ok(Gpus {
            kind: kind.map(str::to_string),
            count,
        }),
        _ => Err(value_error(
            key,
            value,
            "must be a whole number of GPUs, or `TYPE:N` for a GRES type (e.g. `a100:2`)",
        )),
    }
}

/// Checks `--env` names: each a shell variable name (the Pyxis script exports them), once.
fn check_env(env: &[(String, String)]) -> Result<(), SlurmError> {
    let mut seen = std::collections::BTreeSet::new();
    for (name, _) in env {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(SlurmError::EnvName { name: name.clone() });
        }
        if !seen.insert(name) {
            return Err(SlurmError::DuplicateEnv { name: name.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked() {
        for good in [
            "90",
            "30:00",
            "4:00:00",
            "2-12",
            "2-12:30",
            "2-12:30:00",
            "UNLIMITED",
        ] {
            assert!(check_time(good).is_ok(), "{good}");
        }
        for bad in ["", "1h", "1:2:3:4", "-1", "2-", "1 0", "1;id", "2-1:2:3:4"] {
            assert!(check_time(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_memory("32G").unwrap(), "32G");
        assert_eq!(parse_memory("32Gi").unwrap(), "32G");
        assert_eq!(parse_memory("512m").unwrap(), "512M");
        assert_eq!(parse_memory("4096").unwrap(), "4096");
        for bad in ["", "0", "G", "1.5G", "32GB", "i", "32 G", "+5G", "1Pi"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_gpus("gpus", "2").unwrap(),
            Gpus {
                kind: None,
                count: 2
            }
        );
        let typed = parse_gpus("gpus", "a100:4").unwrap();
        assert_eq!((typed.kind.as_deref(), typed.count), (Some("a100"), 4));
        for bad in ["", "-1", "+1", "two", ":1", "a b:1", "a100:", "1.5"] {
            assert!(parse_gpus("gpus", bad).is_err(), "{bad}");
        }
        assert_eq!(parse_cpus("16").unwrap(), 16);
        assert!(parse_cpus("0").is_err());
        assert!(check_name("partition", "gpu,debug").is_ok());
        for bad in ["", "a b", "a;b", "$(id)", "-x", "a\nb"] {
            assert!(check_name("partition", bad).is_err(), "{bad:?}");
        }
        assert!(check_name("account", "a,b").is_err(), "one account");
    }

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
        assert_eq!(container_argv(&image, &options), ["python", "train.py"]);
        options.args = Some(vec!["eval.py".into()]);
        assert_eq!(container_argv(&image, &options), ["python", "eval.py"]);
        options.args = None;
        options.command = Some(vec!["bash".into()]);
        assert_eq!(container_argv(&image, &options), ["bash"], "cmd dropped");
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
    fn multi_node_keys_volumes_and_their_refusals() {
        assert_eq!(parse_count("nodes", "4").unwrap(), 4);
        for bad in ["", "0", "+2", "2-4", "two", "1\n", "$(id)"] {
            assert!(parse_count("nodes", bad).is_err(), "{bad:?}");
        }
        assert!(check_constraint("a100&ib").is_ok());
        assert!(check_constraint("[rack1|rack2]*2").is_ok());
        for bad in ["", "&", "a b", "a\nb", "$(id)", "a;b", "`id`"] {
            assert!(check_constraint(bad).is_err(), "{bad:?}");
        }
        assert!(parse_switch("exclusive", "true").unwrap());
        assert!(parse_switch("exclusive", "yes").is_err());
        let volume = parse_volume("/scratch//data/./x:/data:ro").unwrap();
        assert_eq!(
            volume,
            Volume {
                source: "/scratch/data/x".into(),
                target: "/data".into(),
                read_only: true
            }
        );
        for bad in [
            "/a/../etc:/x",
            "rel:/x",
            "/a:rel",
            "/a,b:/x",
            "/a:/x:rx",
            "/a",
            "/a\nb:/x",
        ] {
            assert!(parse_volume(bad).is_err(), "{bad:?}");
        }
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
}
