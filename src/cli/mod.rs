//! The command line: clap types, settings resolution and rendering. Only this module prints.

mod completions;
mod init;
mod inspect;
mod k8s;
mod matrix;
mod progress;
mod registry;
mod sbom;
mod verify;

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};
use url::Url;

use crate::{
    build::{self, BuildError, BuildSettings, LockMode, LockOutcome, Stage},
    recipe::DEFAULT_CHANNEL_ALIAS,
};

const BUILD_EXAMPLES: &str = "\
Examples:
  imgbuild recipes/py39-torch21.toml              # same as `imgbuild build …`
  imgbuild build recipes/demo.toml --locked       # fail if recipes/demo.lock is stale
  imgbuild build recipes/demo.toml --offline -o /tmp/demo-image
  SOURCE_DATE_EPOCH=1700000000 imgbuild build recipes/demo.toml";

const SMOKE_EXAMPLES: &str = "\
Examples:
  imgbuild smoke images/py39-torch21              # the `latest` tag of a layout
  imgbuild smoke images/py39-torch21:cuda11.8 --json
  imgbuild smoke registry.example/ml/py39-torch21@sha256:…   # pulled into the cache first

Exit codes: 0 pass, 3 no NVIDIA driver or GPU, 4 the image's CUDA cannot run on this
driver, 5 the kernel failed or computed wrong values, or a library crashed the test (it
runs in a child process), 1 the image cannot be read.";

const LOCK_EXAMPLES: &str = "\
Examples:
  imgbuild lock recipes/py39-torch21.toml         # writes recipes/py39-torch21.lock
  imgbuild lock recipes/x.toml --channel-alias https://mirror.example/conda";

/// Daemonless, rootless, bit-reproducible OCI images for conda-based AI runtimes.
#[derive(Debug, Parser)]
#[command(name = "imgbuild", version, after_help = BUILD_EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: GlobalArgs,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Where packages, repodata and staging trees are cached
    /// [default: $XDG_CACHE_HOME/imgbuild or ~/.cache/imgbuild]
    #[arg(long, global = true, env = "IMGBUILD_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Base URL that channel names resolve against, e.g. a mirror
    #[arg(long, global = true, env = "IMGBUILD_CHANNEL_ALIAS", value_name = "URL", default_value = DEFAULT_CHANNEL_ALIAS)]
    pub channel_alias: Url,
    /// Print only errors and the result
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Use plain HTTP for registries on loopback (localhost, 127.0.0.0/8, [::1])
    #[arg(long, global = true)]
    pub insecure: bool,
    /// Trust the CA certificates in this PEM file for registries
    #[arg(long, global = true, value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
    /// Give up an attempt once a registry has been silent this long (connecting, answering
    /// or taking an upload); a request stops retrying within 3 times it [default: 30]
    #[arg(
        long,
        global = true,
        env = crate::registry::client::TIMEOUT_ENV,
        value_name = "SECONDS",
        value_parser = registry::parse_timeout
    )]
    pub registry_timeout: Option<std::time::Duration>,
    /// An `imgbuild-smoke` executable that `[smoke] embed = true` puts into images; repeat
    /// it (or separate paths with `:`) for one per architecture
    /// [default: imgbuild-smoke and imgbuild-smoke-* beside imgbuild]
    #[arg(
        long,
        global = true,
        env = crate::smoke::embed::EXE_ENV,
        value_name = "PATH",
        value_delimiter = ':'
    )]
    pub smoke_exe: Vec<PathBuf>,
}

impl GlobalArgs {
    fn registry_options(&self) -> crate::registry::ClientOptions {
        crate::registry::ClientOptions {
            insecure: self.insecure,
            ca_cert: self.ca_cert.clone(),
            timeout: self.registry_timeout,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Solve (or reuse the lock), install and write the OCI image layout
    #[command(after_help = BUILD_EXAMPLES)]
    Build(BuildArgs),
    /// Solve the recipe and write its lock file, without building
    #[command(after_help = LOCK_EXAMPLES)]
    Lock(LockArgs),
    /// Run a CUDA unified-memory kernel on this machine's GPU with the image's own CUDA
    /// libraries
    #[command(after_help = SMOKE_EXAMPLES)]
    Smoke(SmokeArgs),
    /// Show an image's config, CUDA needs, layers and packages
    #[command(after_help = inspect::INSPECT_EXAMPLES)]
    Inspect(inspect::InspectArgs),
    /// Compare two images: packages added, removed and changed, layers shared and new
    #[command(after_help = inspect::DIFF_EXAMPLES)]
    Diff(inspect::DiffArgs),
    /// Write an SPDX 2.3 or CycloneDX 1.5 SBOM of a recipe's lock
    #[command(after_help = sbom::SBOM_EXAMPLES)]
    Sbom(sbom::SbomArgs),
    /// Write a commented starter recipe, or convert a conda environment.yml into a recipe
    #[command(after_help = init::INIT_EXAMPLES)]
    Init(init::InitArgs),
    /// Print shell completions for bash, zsh, fish, elvish or PowerShell
    #[command(after_help = completions::COMPLETIONS_EXAMPLES)]
    Completions(completions::CompletionsArgs),
    /// Print the man page (roff)
    #[command(after_help = completions::MAN_EXAMPLES)]
    Man,
    /// Check an image layout: every blob's digest and size, the layers' diff_ids, and with
    /// `--recipe` its lock; `--rebuild` rebuilds it and compares
    #[command(after_help = verify::VERIFY_EXAMPLES)]
    Verify(verify::VerifyArgs),
    /// Push an image layout to a registry; prints `REF@sha256:…`
    #[command(after_help = registry::PUSH_EXAMPLES)]
    Push(registry::PushArgs),
    /// Check credentials with a registry and store them for push and pull
    #[command(after_help = registry::LOGIN_EXAMPLES)]
    Login(registry::LoginArgs),
    /// Write a Kubernetes Job or Deployment for a pushed image (by digest, GPU limits, driver
    /// affinity, non-root)
    #[command(after_help = k8s::K8S_EXAMPLES)]
    K8s(k8s::K8sArgs),
}

#[derive(Debug, Args)]
pub struct SmokeArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`, or a registry reference
    /// naming its registry (`registry.example/ml/x:tag`, `…@sha256:…`)
    pub image: String,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The recipe, e.g. recipes/py39-torch21.toml
    pub recipe: PathBuf,
    /// Fail instead of re-solving when the lock is missing or no longer satisfies the recipe
    #[arg(long)]
    pub locked: bool,
    /// Use only cached repodata and packages (local channels still work)
    #[arg(long)]
    pub offline: bool,
    /// The OCI layout directory to write [default: images/<name>]
    #[arg(short, long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Compression threads, shared by all layers; never changes the bytes. At most 4 per
    /// CPU: a larger N is cut down to that, with a warning; 0 is refused (exit 2)
    /// [default: the number of CPUs]
    #[arg(
        short,
        long,
        env = "IMGBUILD_JOBS",
        value_name = "N",
        value_parser = crate::layers::compress::parse_jobs
    )]
    pub jobs: Option<usize>,
    /// After building, push the image to this reference (`registry/repository[:tag]`)
    #[arg(long, value_name = "REF")]
    pub push: Option<String>,
    /// Also write the image as one file next to the layout: `oci-archive`
    /// (`NAME.oci.tar`) or `docker-archive` (`NAME.docker.tar`, for `docker load` and
    /// `podman load`)
    #[arg(long, value_enum, default_value = "oci")]
    pub format: crate::oci::archive::OutputFormat,
    /// Print one JSON event per line on stdout (stages, lock, result) instead of progress
    /// and result lines
    #[arg(long)]
    pub json: bool,
    /// Build one variant of a `[matrix]` recipe: its 0-based index (in the order a matrix
    /// build lists them) or its name (`cuda11.8-python3.9`)
    #[arg(long, value_name = "INDEX|NAME")]
    pub variant: Option<String>,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The recipe, e.g. recipes/py39-torch21.toml
    pub recipe: PathBuf,
    /// Use only cached repodata
    #[arg(long)]
    pub offline: bool,
    /// Print one JSON event per line on stdout (stages, lock, result)
    #[arg(long)]
    pub json: bool,
}

/// Parses the command line; `imgbuild [flags] recipe.toml` means `imgbuild [flags] build
/// recipe.toml`. clap reports the recipe as an unknown subcommand; `build` is inserted in
/// front of it and the line parsed again.
fn parse_cli(args: Vec<String>) -> Result<Cli, clap::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let err = match Cli::try_parse_from(&args) {
        Ok(cli) => return Ok(cli),
        Err(err) => err,
    };
    if err.kind() != ErrorKind::InvalidSubcommand {
        return Err(err);
    }
    let Some(ContextValue::String(word)) = err.get(ContextKind::InvalidSubcommand) else {
        return Err(err);
    };
    let Some(position) = args.iter().skip(1).position(|a| a == word) else {
        return Err(err);
    };
    let mut with_build = args.clone();
    with_build.insert(position + 1, "build".to_string());
    Cli::try_parse_from(with_build)
}

fn default_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("imgbuild")
}

/// The latest `SOURCE_DATE_EPOCH` accepted: 9999-12-31T23:59:59Z, the last second an RFC 3339
/// `created` time (four-digit year) can hold.
const MAX_SOURCE_DATE_EPOCH: i64 = 253_402_300_799;

fn source_date_epoch() -> Result<Option<i64>, String> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) if !value.trim().is_empty() => match value.trim().parse::<i64>() {
            Ok(seconds @ 0..=MAX_SOURCE_DATE_EPOCH) => Ok(Some(seconds)),
            Ok(_) => Err(format!(
                "SOURCE_DATE_EPOCH=`{value}` is outside 0..{MAX_SOURCE_DATE_EPOCH} (1970-01-01 to 9999-12-31)"
            )),
            Err(_) => Err(format!(
                "SOURCE_DATE_EPOCH=`{value}` is not a number of seconds"
            )),
        },
        _ => Ok(None),
    }
}

/// Renders an error and its causes the way uv does: `error: …` then `Caused by: …` lines.
fn render_error(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("error: {err}");
    let mut source = err.source();
    let mut last = err.to_string();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Some errors repeat their source in their own message; print each text once.
        if !last.contains(&text) {
            out.push_str(&format!("\n  Caused by: {text}"));
        }
        last = text;
        source = cause.source();
    }
    out
}

/// Parses the arguments, runs the command and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = match parse_cli(std::env::args().collect()) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IMGBUILD_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,rustls_platform_verifier=off")
            }),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, never into CI logs and files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .init();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&err, 2),
    };
    runtime.block_on(run(cli))
}

#[allow(clippy::print_stderr)]
fn fail(err: &(dyn std::error::Error + 'static), code: u8) -> ExitCode {
    eprintln!("{}", render_error(err));
    ExitCode::from(code)
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
async fn run(cli: Cli) -> ExitCode {
    let source_date_epoch = match source_date_epoch() {
        Ok(value) => value,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(1);
        }
    };
    let cache_dir = cli
        .global
        .cache_dir
        .clone()
        .unwrap_or_else(default_cache_dir);
    let json = match &cli.command {
        Command::Build(args) => args.json,
        Command::Lock(args) => args.json,
        _ => false,
    };
    let reporter = progress::BuildProgress::new(progress::Mode::new(cli.global.quiet, json));
    let settings =
        |recipe: PathBuf, lock_mode, offline, output, jobs: Option<usize>| BuildSettings {
            recipe_path: recipe,
            channel_alias: cli.global.channel_alias.clone(),
            cache_dir: cache_dir.clone(),
            output,
            lock_mode,
            offline,
            jobs: compression_threads(jobs, &reporter),
            source_date_epoch,
            registry: cli.global.registry_options(),
            variant: None,
            smoke_exe: cli.global.smoke_exe.clone(),
        };

    match &cli.command {
        Command::Smoke(args) => {
            return smoke(args, &cache_dir, &cli.global.registry_options()).await;
        }
        Command::Inspect(args) => return inspect::run_inspect(args),
        Command::K8s(args) => return k8s::run_k8s(args),
        Command::Diff(args) => return inspect::run_diff(args),
        Command::Sbom(args) => return sbom::run_sbom(args, &cli.global.channel_alias),
        Command::Init(args) => return init::run_init(args, cli.global.quiet),
        Command::Completions(args) => return completions::run_completions(args),
        Command::Man => return completions::run_man(),
        Command::Verify(args) => {
            let settings = args
                .recipe
                .clone()
                .map(|recipe| settings(recipe, LockMode::Locked, false, None, None));
            return verify::run_verify(args, settings, cli.global.quiet).await;
        }
        Command::Push(args) => {
            return registry::run_push(args, &cli.global.registry_options(), cli.global.quiet)
                .await;
        }
        Command::Login(args) => {
            return registry::run_login(args, &cli.global.registry_options()).await;
        }
        _ => {}
    }
    // `build --push REF`: the layout (and its first tag) to push once the build succeeded.
    let mut to_push: Option<(String, String)> = None;
    // `build --format …-archive`: the layout, its first tag and the archive suffix.
    let mut to_archive: Option<(PathBuf, String, &'static str)> = None;
    let result: Result<(), BuildError> = match &cli.command {
        Command::Build(args) => {
            let mode = if args.locked {
                LockMode::Locked
            } else {
                LockMode::Reuse
            };
            let mut settings = settings(
                args.recipe.clone(),
                mode,
                args.offline,
                args.output.clone(),
                args.jobs,
            );
            // A recipe with a `[matrix]` builds every variant (errors in the file itself are
            // left to the normal path, which reports them with their place).
            let variants = crate::recipe::read_recipe_text(&args.recipe)
                .ok()
                .map(|text| crate::recipe::matrix::variants(&text, &args.recipe));
            match variants {
                Some(Err(err)) => return fail(&err, 1),
                Some(Ok(variants)) if args.variant.is_some() => {
                    let wanted = args.variant.as_deref().unwrap_or_default();
                    match crate::recipe::matrix::select(&variants, wanted) {
                        Some(variant) => settings.variant = Some(variant.clone()),
                        None if variants.is_empty() => {
                            eprintln!(
                                "error: `{}` has no [matrix], so no variant `{wanted}`",
                                args.recipe.display()
                            );
                            return ExitCode::from(1);
                        }
                        None => {
                            eprintln!(
                                "error: `{}` has no variant `{wanted}`; its variants are {}",
                                args.recipe.display(),
                                variants
                                    .iter()
                                    .enumerate()
                                    .map(|(i, v)| format!("{i}: {}", v.suffix()))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            );
                            return ExitCode::from(1);
                        }
                    }
                }
                Some(Ok(variants)) if !variants.is_empty() => {
                    if args.output.is_some()
                        || args.push.is_some()
                        || args.format.archive_suffix().is_some()
                    {
                        eprintln!(
                            "error: `-o`, `--push` and `--format` name one image; a matrix builds {} (images/NAME-VARIANT): push them one by one",
                            variants.len()
                        );
                        return ExitCode::from(1);
                    }
                    return matrix::run_matrix(&settings, variants, json, cli.global.quiet).await;
                }
                _ => {}
            }
            if args.format == crate::oci::archive::OutputFormat::DockerArchive
                && let Some(platforms) = multi_platforms(&settings)
            {
                eprintln!(
                    "error: a docker-archive holds one platform's image, and `{}` builds {platforms}: use `--format oci-archive` (it holds the image index), or a recipe with one platform",
                    settings.recipe_path.display()
                );
                return ExitCode::from(1);
            }
            let built = build::build(&settings, &reporter).await;
            reporter.finish(built.is_ok());
            built.map(|report| {
                if json {
                    progress::emit(&progress::lock_event(&report.lock));
                    progress::emit(&progress::result_event(&report));
                } else if !cli.global.quiet {
                    describe_lock(&report.lock);
                    let compressed: u64 = report.layers.iter().map(|l| l.blob.size).sum();
                    let uncompressed: u64 = report.layers.iter().map(|l| l.blob.tar_size).sum();
                    let reused = report.layers.iter().filter(|l| l.reused).count();
                    if report.unchanged {
                        eprintln!(
                            "{:>12} {}: the recipe, lock and base are those of the image in place",
                            "Unchanged",
                            report.layout_dir.display()
                        );
                    }
                    eprintln!(
                        "{:>12} {} ({} from the base, {} ours: {} written, {} reused): {} compressed, {} uncompressed",
                        "Built",
                        build::counted(report.base_layers + report.layers.len(), "layer"),
                        report.base_layers,
                        report.layers.len(),
                        report.layers.len() - reused,
                        reused,
                        human_bytes(compressed),
                        human_bytes(uncompressed),
                    );
                    let timings: Vec<String> = report
                        .timings
                        .iter()
                        .map(|(stage, time)| format!("{} {:.2}s", stage_name(*stage), time.as_secs_f64()))
                        .collect();
                    for path in &report.sboms {
                        eprintln!("{:>12} {}", "SBOM", path.display());
                    }
                    eprintln!("{:>12} {}", "Took", timings.join(", "));
                }
                // stdout carries the result only: one `layout:tag@digest` line per tag.
                if !json {
                    for tag in &report.tags {
                        println!("{}:{tag}@{}", report.layout_dir.display(), report.manifest_digest);
                    }
                }
                if let (Some(suffix), Some(tag)) = (args.format.archive_suffix(), report.tags.first()) {
                    to_archive = Some((report.layout_dir.clone(), tag.clone(), suffix));
                }
                if let (Some(reference), Some(tag)) = (&args.push, report.tags.first()) {
                    to_push = Some((
                        format!("{}:{tag}", report.layout_dir.display()),
                        reference.clone(),
                    ));
                }
            })
        }
        Command::Lock(args) => {
            let settings = settings(
                args.recipe.clone(),
                LockMode::Refresh,
                args.offline,
                None,
                None,
            );
            let locked = build::lock(&settings, &reporter).await;
            reporter.finish(locked.is_ok());
            locked.map(|report| {
                if json {
                    progress::emit(&progress::lock_event(&report));
                } else {
                    if !cli.global.quiet {
                        describe_lock(&report);
                    }
                    println!("{}", report.lock_path.display());
                }
            })
        }
        Command::Smoke(_)
        | Command::Inspect(_)
        | Command::Diff(_)
        | Command::Sbom(_)
        | Command::Init(_)
        | Command::Completions(_)
        | Command::Man
        | Command::Push(_)
        | Command::Verify(_)
        | Command::K8s(_)
        | Command::Login(_) => {
            unreachable!("handled above")
        }
    };
    if let (Ok(()), Some((layout_dir, tag, suffix)), Command::Build(args)) =
        (&result, &to_archive, &cli.command)
    {
        let name = layout_dir
            .file_name()
            .map_or_else(|| "image".to_string(), |n| n.to_string_lossy().into_owned());
        let archive = layout_dir.with_file_name(format!("{name}.{suffix}"));
        let layout = crate::oci::layout::Layout::new(layout_dir);
        if let Err(err) = crate::oci::archive::write_archive(
            &layout,
            tag,
            &format!("{name}:{tag}"),
            args.format,
            &archive,
        ) {
            return fail(&err, 2);
        }
        if json {
            progress::emit(&serde_json::json!({"event": "archive", "path": archive}));
        } else {
            println!("{}", archive.display());
        }
    }
    if let (Ok(()), Some((image, reference))) = (&result, &to_push) {
        let options = cli.global.registry_options();
        let mount_from = registry::base_of(image);
        return match registry::push_layout(
            image,
            reference,
            &[],
            &options,
            mount_from.as_ref(),
            cli.global.quiet || json,
        )
        .await
        {
            Ok(report) if json => {
                let mut event = serde_json::to_value(&report).expect("the report serializes");
                event["event"] = "push".into();
                progress::emit(&event);
                ExitCode::SUCCESS
            }
            Ok(report) => {
                registry::print_push(&report, cli.global.quiet);
                ExitCode::SUCCESS
            }
            Err(err) => {
                if json {
                    progress::emit(&serde_json::json!({
                        "event": "error",
                        "message": render_error(err.as_ref()).trim_start_matches("error: "),
                        "exit_code": 1,
                    }));
                }
                fail(err.as_ref(), 1)
            }
        };
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let code = err.exit_code() as u8;
            if json {
                progress::emit(&serde_json::json!({
                    "event": "error",
                    "message": render_error(&err).trim_start_matches("error: "),
                    "exit_code": code,
                }));
            }
            fail(&err, code)
        }
    }
}

/// The threads for `--jobs` (see `layers::compress::threads_for`), saying so when a request
/// above the cap was cut down.
fn compression_threads(requested: Option<usize>, reporter: &dyn build::Reporter) -> usize {
    let (threads, warning) = crate::layers::compress::threads_for(requested);
    if let Some(warning) = warning {
        reporter.on_warning(&warning);
    }
    threads
}

#[allow(clippy::print_stdout)]
async fn smoke(
    args: &SmokeArgs,
    cache_dir: &std::path::Path,
    registry: &crate::registry::ClientOptions,
) -> ExitCode {
    let report = match crate::smoke::smoke(&args.image, cache_dir, registry).await {
        Ok(report) => report,
        Err(err) => return fail(&err, 1),
    };
    print!("{}", report.render(args.json));
    ExitCode::from(report.verdict.exit_code())
}

/// The platforms of the recipe `settings` builds, when it has several (errors in the recipe
/// are left to the build, which reports them with their place).
fn multi_platforms(settings: &build::BuildSettings) -> Option<crate::recipe::Platforms> {
    let options = crate::recipe::RecipeOptions {
        channel_alias: settings.channel_alias.clone(),
        variant: settings.variant.clone(),
    };
    crate::recipe::Recipe::load(&settings.recipe_path, &options)
        .ok()
        .map(|recipe| recipe.platforms)
        .filter(|platforms| platforms.is_multi())
}

#[allow(clippy::print_stderr)]
fn describe_lock(report: &build::LockReport) {
    let path = report.lock_path.display();
    let packages = build::counted(report.packages, "package");
    match &report.outcome {
        LockOutcome::Reused => eprintln!("{:>12} {path} ({packages})", "Reusing"),
        LockOutcome::Written { reason: None } => {
            eprintln!("{:>12} {path} ({packages})", "Locked")
        }
        LockOutcome::Written {
            reason: Some(reason),
        } => eprintln!(
            "{:>12} {path} ({packages}; re-solved because {reason})",
            "Locked"
        ),
    }
}

fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Solve => "lock",
        Stage::Install => "install",
        Stage::Layers => "layers",
        Stage::Write => "write",
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recipe_path_means_build() {
        let parse = |a: &[&str]| parse_cli(a.iter().map(|s| s.to_string()).collect());
        let cli = parse(&["imgbuild", "-q", "--cache-dir", "/c", "r.toml", "--locked"]).unwrap();
        match cli.command {
            Command::Build(args) => {
                assert_eq!(args.recipe, PathBuf::from("r.toml"));
                assert!(args.locked);
            }
            other => panic!("expected build, got {other:?}"),
        }
        assert!(cli.global.quiet);
        assert!(matches!(
            parse(&["imgbuild", "lock", "r.toml"]).unwrap().command,
            Command::Lock(_)
        ));
        assert!(parse(&["imgbuild", "r.toml", "--no-such-flag"]).is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
