//! The command line: clap types, settings resolution and one module per command. Only this
//! module prints, through [`printer::Printer`].

mod build;
mod cache;
mod completions;
mod init;
mod inspect;
mod inspect_models;
mod inspect_sizes;
mod k8s;
mod lock;
mod matrix;
mod meant;
mod notebook;
mod printer;
mod progress;
mod registry;
mod sbom;
mod shard;
mod sign;
mod slurm;
mod smoke;
mod verify;

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};
use url::Url;

use crate::{
    build::{BuildSettings, LockMode},
    recipe::DEFAULT_CHANNEL_ALIAS,
};
use printer::{CommandFailure, Printer};

use build::BUILD_EXAMPLES;

const VERSION_EXAMPLES: &str = "\
Examples:
  imgbuild version";

/// Daemonless, rootless, bit-reproducible OCI images for conda-based AI runtimes.
#[derive(Debug, Parser)]
#[command(name = "imgbuild", version, after_help = BUILD_EXAMPLES)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: GlobalArgs,
}

/// The options every command takes, under their own heading in each command's help.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct GlobalArgs {
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
pub(crate) enum Command {
    /// Solve (or reuse the lock), install and write the OCI image layout
    #[command(after_help = BUILD_EXAMPLES)]
    Build(build::BuildArgs),
    /// Solve the recipe and write its lock file, without building
    #[command(after_help = lock::LOCK_EXAMPLES)]
    Lock(lock::LockArgs),
    /// Run a CUDA unified-memory kernel on this machine's GPU with the image's own CUDA
    /// libraries
    #[command(after_help = smoke::SMOKE_EXAMPLES)]
    Smoke(smoke::SmokeArgs),
    /// Run a notebook headless in an image and record its outputs in an in-toto statement;
    /// `--verify` compares them with an earlier run's
    #[command(after_help = notebook::NOTEBOOK_EXAMPLES)]
    Notebook(notebook::NotebookArgs),
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
    /// Show the local cache's size by kind, or evict layer-cache entries (`du`, `prune`)
    #[command(after_help = cache::CACHE_EXAMPLES)]
    Cache(cache::CacheArgs),
    /// Print shell completions for bash, zsh, fish, elvish or PowerShell
    #[command(after_help = completions::COMPLETIONS_EXAMPLES)]
    Completions(completions::CompletionsArgs),
    /// Print the man page (roff), or with --markdown the command reference of the book
    #[command(after_help = completions::MAN_EXAMPLES)]
    Man(completions::ManArgs),
    /// Print imgbuild's version (as `imgbuild --version` does)
    #[command(after_help = VERSION_EXAMPLES)]
    Version,
    /// Check an image layout: every blob's digest and size, the layers' diff_ids, and with
    /// `--recipe` its lock; `--rebuild` rebuilds it and compares
    #[command(after_help = verify::VERIFY_EXAMPLES)]
    Verify(verify::VerifyArgs),
    /// Push an image layout to a registry; prints `REF@sha256:…`
    #[command(after_help = registry::PUSH_EXAMPLES)]
    Push(registry::PushArgs),
    /// Sign a pushed image: a simple-signing signature, as skopeo and podman check it, in the
    /// lookaside area registries.d configures
    #[command(after_help = sign::SIGN_EXAMPLES)]
    Sign(sign::SignArgs),
    /// Check credentials with a registry and store them for push and pull
    #[command(after_help = registry::LOGIN_EXAMPLES)]
    Login(registry::LoginArgs),
    /// Write a Kubernetes Job or Deployment for a pushed image (by digest, GPU limits, driver
    /// affinity, non-root)
    #[command(after_help = k8s::K8S_EXAMPLES)]
    K8s(k8s::K8sArgs),
    /// Write an sbatch script for a pushed image (by digest, GPUs through GRES, run by
    /// Pyxis/enroot or podman)
    #[command(after_help = slurm::SLURM_EXAMPLES)]
    Slurm(slurm::SlurmArgs),
}

impl Command {
    /// Whether the command prints the `--json` event stream (`build` and `lock`); the other
    /// commands' `--json` prints one report instead (see [`Printer`]).
    fn prints_events(&self) -> bool {
        match self {
            Command::Build(args) => args.json,
            Command::Lock(args) => args.json,
            _ => false,
        }
    }
}

/// Parses the command line; `imgbuild [flags] recipe.toml` means `imgbuild [flags] build
/// recipe.toml`. clap reports the recipe as an unknown subcommand; when the word is a recipe
/// ([`meant::first_word`]), `build` is inserted in front of it and the line parsed again,
/// and otherwise the word is refused with what to use instead (exit 2, as clap's errors).
fn parse_cli(args: Vec<String>) -> Result<Cli, clap::Error> {
    use clap::{
        CommandFactory,
        error::{ContextKind, ContextValue, ErrorKind},
    };
    let err = match Cli::try_parse_from(&args) {
        Ok(cli) => return Ok(cli),
        Err(err) => err,
    };
    if err.kind() == ErrorKind::UnknownArgument
        && let Some(ContextValue::String(flag)) = err.get(ContextKind::InvalidArg)
        && let Some(message) = meant::unknown_flag(flag)
    {
        return Err(Cli::command().error(ErrorKind::UnknownArgument, message));
    }
    if err.kind() != ErrorKind::InvalidSubcommand {
        return Err(err);
    }
    let Some(ContextValue::String(word)) = err.get(ContextKind::InvalidSubcommand) else {
        return Err(err);
    };
    let Some(position) = args.iter().skip(1).position(|a| a == word) else {
        return Err(err);
    };
    let command = Cli::command();
    let subcommands: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
    if let meant::Meant::Refused(message) = meant::first_word(word, &subcommands) {
        return Err(command.clone().error(ErrorKind::InvalidSubcommand, message));
    }
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

/// The global flags and the environment, resolved once before any command runs.
pub(crate) struct Env<'a> {
    pub global: &'a GlobalArgs,
    pub cache_dir: PathBuf,
    pub source_date_epoch: Option<i64>,
}

impl<'a> Env<'a> {
    /// Fails on a bad `SOURCE_DATE_EPOCH` whatever the command, as a build would.
    fn resolve(global: &'a GlobalArgs) -> Result<Self, CommandFailure> {
        // Found before any `--json` event: text only, like every failure of the flags.
        let source_date_epoch =
            source_date_epoch().map_err(|message| CommandFailure::new(message, 1))?;
        Ok(Env {
            global,
            cache_dir: global.cache_dir.clone().unwrap_or_else(default_cache_dir),
            source_date_epoch,
        })
    }

    /// The settings of a build of `recipe` (or only its lock, or `verify`'s rebuild): online,
    /// into the default layout, one compression thread per CPU.
    fn build_settings(&self, recipe: PathBuf, lock_mode: LockMode) -> BuildSettings {
        BuildSettings {
            recipe_path: recipe,
            channel_alias: self.global.channel_alias.clone(),
            cache_dir: self.cache_dir.clone(),
            output: None,
            lock_mode,
            offline: false,
            jobs: crate::layers::compress::threads_for(None).0,
            source_date_epoch: self.source_date_epoch,
            registry: self.global.registry_options(),
            variant: None,
            smoke_exe: self.global.smoke_exe.clone(),
            tags: Vec::new(),
            platforms: Vec::new(),
            update: Vec::new(),
            cache_repo: None,
        }
    }
}

/// Parses the arguments, runs the command and returns the process exit code. A failed
/// command's error is rendered here, and only here.
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

    let printer = Printer::new(cli.global.quiet, cli.command.prints_events());
    let ran = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(&cli, &printer)),
        Err(err) => Err(CommandFailure::new(err, 2)),
    };
    ran.unwrap_or_else(|failure| printer.fail(&failure))
}

/// The limits read from the environment as positive integers wherever they apply; a value
/// that is not one is ignored there, and warned of once, here.
const LIMIT_SETTINGS: [&str; 6] = [
    crate::compression::bounded::RATIO_ENV,
    crate::http::repodata::MAX_REPODATA_ENV,
    crate::smoke::extract::MAX_LIBRARY_ENV,
    crate::smoke::unpack::MAX_ROOTFS_ENV,
    crate::download::MAX_UNSIZED_ENV,
    crate::registry::push::CHUNK_ENV,
];

/// Runs one command: its exit code, or the failure for `main` to render.
async fn run(cli: &Cli, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    for name in LIMIT_SETTINGS {
        if let Some(warning) = crate::compression::bounded::env_u64_warning(name) {
            printer.warning(&warning);
        }
    }
    let env = Env::resolve(&cli.global)?;
    let registry = cli.global.registry_options();
    match &cli.command {
        Command::Build(args) => build::run_build(args, &env, printer).await,
        Command::Lock(args) => lock::run_lock(args, &env, printer).await,
        Command::Smoke(args) => smoke::run_smoke(args, &env.cache_dir, &registry, printer).await,
        Command::Notebook(args) => notebook::run_notebook(args, printer),
        Command::Inspect(args) => {
            inspect::run_inspect(args, &env.cache_dir, &registry, printer).await
        }
        Command::Diff(args) => inspect::run_diff(args, printer),
        Command::Sbom(args) => sbom::run_sbom(args, &env, printer),
        Command::Init(args) => init::run_init(args, printer),
        Command::Cache(args) => cache::run_cache(args, &env, printer).await,
        Command::Completions(args) => completions::run_completions(args),
        Command::Man(args) => completions::run_man(args, printer),
        Command::Version => {
            printer.result(concat!("imgbuild ", env!("CARGO_PKG_VERSION")));
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify(args) => {
            let settings = args
                .recipe
                .clone()
                .map(|recipe| env.build_settings(recipe, LockMode::Locked));
            verify::run_verify(args, settings, printer).await
        }
        Command::Push(args) => registry::run_push(args, &registry, printer).await,
        Command::Sign(args) => sign::run_sign(args, &registry, printer).await,
        Command::Login(args) => registry::run_login(args, &registry, printer).await,
        Command::K8s(args) => k8s::run_k8s(args, printer),
        Command::Slurm(args) => slurm::run_slurm(args, printer),
    }
}

/// The threads for `--jobs` (see `layers::compress::threads_for`), saying so when a request
/// above the cap was cut down.
fn compression_threads(requested: Option<usize>, printer: &Printer) -> usize {
    let (threads, warning) = crate::layers::compress::threads_for(requested);
    if let Some(warning) = warning {
        printer.warning(&warning);
    }
    threads
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
                assert_eq!(args.recipe(), std::path::Path::new("r.toml"));
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
