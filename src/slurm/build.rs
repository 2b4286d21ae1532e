//! `slurm --build RECIPE`: a driver script that submits a sharded build of a recipe's
//! variants. A job array of N tasks runs `imgbuild build --shard $SLURM_ARRAY_TASK_ID/N`,
//! each compressing its share of the distinct layers into the layer cache repository; a job
//! that depends on the whole array (`afterok`) then builds every variant `--locked` from that
//! cache and pushes it. Each job script goes to `sbatch` on its standard input, from a
//! quoted here-document, so the driver expands nothing in it.
//!
//! Every task starts from an empty local cache of its own, as a fresh CI runner does: the
//! registry is the cache the tasks share, and no two tasks write one directory, whatever
//! filesystem the nodes share.

use super::{Gpus, JobOptions, Runner, SlurmError, directives, shell_quote};
use crate::reference::Reference;

/// What runs `imgbuild` in the jobs.
#[derive(Debug, Clone)]
pub(crate) enum Builder {
    /// The `imgbuild` at this path on the nodes (a shared filesystem, or the same install).
    Host { imgbuild: String },
    /// imgbuild's own image (`recipes/imgbuild-builder.toml`), through Pyxis or podman.
    Container { runner: Runner, image: Reference },
}

/// Where imgbuild lies in its own image (`recipes/imgbuild-builder.toml`).
const IMGBUILD_IN_IMAGE: &str = "/opt/imgbuild/bin/imgbuild";

/// What the driver submits.
#[derive(Debug, Clone)]
pub(crate) struct BuildOptions {
    /// The recipe, absolute: the jobs read it, and its locks, where it lies.
    pub recipe: String,
    /// The directory the jobs run in (`--chdir`), absolute: the submitting one.
    pub workdir: String,
    /// The jobs' base name: `NAME-shards`, `NAME-build`.
    pub name: String,
    pub builder: Builder,
    pub shards: u32,
    /// `--cache-repo`.
    pub cache_repo: String,
    /// Where each variant is pushed, under its own tag.
    pub repository: String,
    /// The variants, by `--variant` index; 0 for a recipe without a matrix.
    pub variants: usize,
    /// Resources, account, partition, `--env`, `--insecure-registry`.
    pub job: JobOptions,
}

/// The here-document delimiters; no line of a job script is either (every value is
/// checked free of line breaks).
const SHARDS_END: &str = "IMGBUILD_SHARDS";
const BUILD_END: &str = "IMGBUILD_BUILD";

/// The driver script.
pub(crate) fn build_script(options: &BuildOptions) -> Result<String, SlurmError> {
    for (what, value) in [
        ("recipe path", &options.recipe),
        ("working directory", &options.workdir),
        ("imgbuild path", &builder_path(&options.builder)),
    ] {
        if value.chars().any(char::is_control) {
            return Err(SlurmError::LineBreak {
                what,
                value: value.clone(),
            });
        }
    }
    super::values::check_env(&options.job.env)?;
    let shards = shards_script(options);
    let build = assembly_script(options);
    Ok(format!(
        "#!/bin/bash\n\
         # Builds every variant of {recipe} on Slurm, written by `imgbuild slurm --build`:\n\
         # {n} shard tasks compress the distinct layers into {cache}, then one job\n\
         # (afterok on them all) builds each variant from it and pushes it to {repository}.\n\
         # Run it where you run sbatch: `bash THIS-FILE`.\n\
         set -euo pipefail\n\
         shards=$(sbatch --parsable <<'{SHARDS_END}'\n{shards}{SHARDS_END}\n)\n\
         # `--parsable` prints `JOBID` or `JOBID;CLUSTER`.\n\
         shards=${{shards%%;*}}\n\
         build=$(sbatch --parsable --dependency=afterok:\"$shards\" <<'{BUILD_END}'\n{build}{BUILD_END}\n)\n\
         echo \"shards: job array $shards; build: job ${{build%%;*}}, after the array\"\n",
        recipe = options.recipe,
        n = options.shards,
        cache = options.cache_repo,
        repository = options.repository,
    ))
}

fn builder_path(builder: &Builder) -> String {
    match builder {
        Builder::Host { imgbuild } => imgbuild.clone(),
        Builder::Container { .. } => IMGBUILD_IN_IMAGE.to_string(),
    }
}

/// The array: task I builds shard I of N.
fn shards_script(options: &BuildOptions) -> String {
    let name = format!("{}-shards", options.name);
    let mut script = job_header(
        &name,
        options,
        &[
            format!("--array=0-{}", options.shards.saturating_sub(1)),
            format!("--output={name}-%A_%a.out"),
        ],
    );
    let shard = format!("\"$SLURM_ARRAY_TASK_ID/{}\"", options.shards);
    let mut args = imgbuild_args(options);
    args.extend(["--shard".into(), shard]);
    script.push_str(&command(options, &args));
    script
}

/// The job after the array: each variant built from the cache and pushed, one after
/// another on one cache, so a layer two variants share is fetched once.
fn assembly_script(options: &BuildOptions) -> String {
    let name = format!("{}-build", options.name);
    let mut script = job_header(&name, options, &[format!("--output={name}-%j.out")]);
    let variants: Vec<Option<usize>> = match options.variants {
        0 => vec![None],
        n => (0..n).map(Some).collect(),
    };
    for variant in variants {
        let mut args = imgbuild_args(options);
        if let Some(index) = variant {
            args.extend(["--variant".into(), index.to_string()]);
        }
        args.extend(["--push".into(), shell_quote(&options.repository)]);
        script.push_str(&command(options, &args));
    }
    script
}

/// A job script's start: its `#SBATCH` lines, and a fresh local cache for this job alone,
/// removed when it ends.
fn job_header(name: &str, options: &BuildOptions, extra: &[String]) -> String {
    let no_gpus = Gpus {
        kind: None,
        count: 0,
    };
    let mut script = String::from("#!/bin/bash\n");
    let mut lines = directives(name, &options.job, &no_gpus);
    lines.push(format!("--chdir={}", options.workdir));
    lines.extend(extra.iter().cloned());
    for line in lines {
        script.push_str(&format!("#SBATCH {line}\n"));
    }
    script.push_str("set -euo pipefail\n");
    for (name, value) in &options.job.env {
        script.push_str(&format!("export {name}={}\n", shell_quote(value)));
    }
    script.push_str(concat!(
        "cache=$(mktemp -d \"${TMPDIR:-/tmp}/imgbuild-cache.XXXXXX\")\n",
        "trap 'rm -rf \"$cache\"' EXIT\n",
        "export IMGBUILD_CACHE_DIR=\"$cache\"\n",
    ));
    script
}

/// `imgbuild`'s arguments common to every build: the recipe, `--locked`, `--json` (the
/// events go to the job's output file) and the cache.
fn imgbuild_args(options: &BuildOptions) -> Vec<String> {
    let mut args = Vec::new();
    if options.job.insecure_registry {
        args.push("--insecure".to_string());
    }
    args.extend([
        "build".to_string(),
        shell_quote(&options.recipe),
        "--locked".into(),
        "--json".into(),
        "--cache-repo".into(),
        shell_quote(&options.cache_repo),
    ]);
    args
}

/// The line that runs imgbuild with `args` (already shell words), on the host or in its
/// image with the working directory and the job's cache mounted.
fn command(options: &BuildOptions, args: &[String]) -> String {
    let workdir = &options.workdir;
    let program = match &options.builder {
        Builder::Host { imgbuild } => shell_quote(imgbuild),
        Builder::Container {
            runner: Runner::Podman,
            image,
        } => {
            let mut flags = vec![
                "srun podman run --rm --network=host".to_string(),
                format!("--volume={}", shell_quote(&format!("{workdir}:{workdir}"))),
                format!("--workdir={}", shell_quote(workdir)),
                "--volume=\"$cache:/cache\"".into(),
                "--env=IMGBUILD_CACHE_DIR=/cache".into(),
            ];
            if options.job.insecure_registry {
                flags.push("--tls-verify=false".into());
            }
            flags.extend(
                options
                    .job
                    .env
                    .iter()
                    .map(|(name, _)| format!("--env={name}")),
            );
            flags.push(shell_quote(&image.to_string()));
            flags.join(" ")
        }
        Builder::Container {
            runner: Runner::Pyxis,
            image,
        } => [
            format!(
                "srun --container-image={}",
                shell_quote(&enroot_image(image))
            ),
            format!(
                "--container-mounts={}\",$cache:/cache\"",
                shell_quote(&format!("{workdir}:{workdir}"))
            ),
            format!("--container-workdir={}", shell_quote(workdir)),
            "--no-container-entrypoint".into(),
            "--export=ALL,IMGBUILD_CACHE_DIR=/cache".into(),
            IMGBUILD_IN_IMAGE.into(),
        ]
        .join(" "),
    };
    format!("{program} {}\n", args.join(" "))
}

/// The builder image as enroot names it, `REGISTRY#REPO:TAG` (or the digest in the tag's
/// place, which enroot fetches pinned): the `#` form every enroot reads.
fn enroot_image(image: &Reference) -> String {
    let tag = image
        .digest
        .as_deref()
        .or(image.tag.as_deref())
        .unwrap_or("latest");
    format!("{}#{}:{tag}", image.api_host(), image.repository)
}
