//! `imgbuild build`: one image, one variant of a `[matrix]` recipe or all of them, then the
//! archive and the push it asks for.

use std::{path::Path, path::PathBuf, process::ExitCode, sync::Arc};

use clap::Args;
use serde_json::json;

use super::{
    Env, compression_threads,
    lock::describe_lock,
    matrix,
    printer::{CommandFailure, Printer, human_bytes},
    progress::{BuildProgress, lock_event, result_event},
    registry,
};
use crate::{
    build::{self, BuildReport, BuildSettings, LockMode, counted},
    oci::archive::OutputFormat,
    recipe::matrix::Variant,
    registry::cache_repo::{CacheRepoSummary, EntryKeys},
    sign::Verifier,
};

pub(super) const BUILD_EXAMPLES: &str = "\
Examples:
  imgbuild recipes/py39-torch21.toml              # same as `imgbuild build …`
  imgbuild build recipes/demo.toml --locked       # fail if recipes/demo.lock is stale
  imgbuild build recipes/demo.toml --offline -o /tmp/demo-image
  SOURCE_DATE_EPOCH=1700000000 imgbuild build recipes/demo.toml";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("the_recipe").args(["recipe", "file"]).required(true)))]
pub(crate) struct BuildArgs {
    /// The recipe, e.g. recipes/py39-torch21.toml
    recipe: Option<PathBuf>,
    /// The recipe, given as `docker build -f` gives a Dockerfile (instead of RECIPE)
    #[arg(
        short = 'f',
        long = "file",
        value_name = "RECIPE",
        conflicts_with = "recipe"
    )]
    file: Option<PathBuf>,
    /// Tag the image TAG instead of the recipe's `[image] tags` (repeatable). A tag only:
    /// the layout is `-o DIR` (default images/NAME), a registry's is `--push REF`
    #[arg(short = 't', long = "tag", value_name = "TAG", value_parser = parse_tag)]
    pub tags: Vec<String>,
    /// Build only these of the recipe's platforms (repeatable or comma-separated:
    /// `linux/amd64`, `arm64`, `linux-aarch64`). The lock still holds them all
    #[arg(long = "platform", value_name = "PLATFORM", value_delimiter = ',', value_parser = super::inspect::parse_platform)]
    pub platforms: Vec<rattler_conda_types::Subdir>,
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
    /// Share package layers with other builders through this registry repository
    /// (`registry/repository`, no tag): a layer that is not in the local layer cache is
    /// taken from there, checked against its tar, instead of compressed; the layers this
    /// build compresses are stored there. A cache that fails is a warning, never a failed
    /// build. Credentials as for `push`
    #[arg(
        long,
        env = "IMGBUILD_CACHE_REPO",
        value_name = "REGISTRY/REPO",
        value_parser = parse_cache_repo
    )]
    pub cache_repo: Option<crate::registry::Reference>,
    /// Read the `--cache-repo`, never write it (for untrusted branches, or runners without
    /// push rights)
    #[arg(long, requires = "cache_repo")]
    pub cache_repo_readonly: bool,
    /// Sign the `--cache-repo` entries this build stores with this OpenPGP secret key file
    /// (as `--sign-by` of `push` takes one)
    #[arg(long, value_name = "KEY", requires = "cache_repo")]
    pub cache_sign_by: Option<PathBuf>,
    /// A file whose first line is the `--cache-sign-by` key's passphrase
    #[arg(long, value_name = "FILE", requires = "cache_sign_by")]
    pub cache_sign_passphrase_file: Option<PathBuf>,
    /// Use only `--cache-repo` entries signed by this OpenPGP public key file (`gpg
    /// --export`); then eStargz and zstd:chunked entries are used too, on their signature
    #[arg(long, value_name = "PUBKEY", requires = "cache_repo")]
    pub cache_verify_key: Option<PathBuf>,
    /// Also write the image as one file next to the layout: `oci-archive`
    /// (`NAME.oci.tar`) or `docker-archive` (`NAME.docker.tar`, for `docker load` and
    /// `podman load`)
    #[arg(long, value_enum, default_value = "oci")]
    pub format: OutputFormat,
    /// Print one JSON event per line on stdout (stages, lock, result) instead of progress
    /// and result lines
    #[arg(long)]
    pub json: bool,
    /// Build one variant of a `[matrix]` recipe: its 0-based index (in the order a matrix
    /// build lists them) or its name (`cuda11.8-python3.9`)
    #[arg(long, value_name = "INDEX|NAME")]
    pub variant: Option<String>,
    /// Be worker I (from 0) of N: of the distinct package layers of every variant and
    /// platform, compress those assigned to I (largest first, balanced by size) and store
    /// them in the `--cache-repo`; write no image. The builds of the variants that follow
    /// then take every package layer from the cache. `$SLURM_ARRAY_TASK_ID/N`,
    /// `$JOB_COMPLETION_INDEX/N`
    #[arg(
        long,
        value_name = "I/N",
        value_parser = crate::layers::shard::Shard::parse,
        requires = "cache_repo",
        conflicts_with_all = ["push", "output", "tags", "variant", "cache_repo_readonly"]
    )]
    pub shard: Option<crate::layers::shard::Shard>,
}

impl BuildArgs {
    /// The recipe, given as the argument or by `-f`.
    pub(crate) fn recipe(&self) -> &Path {
        self.recipe
            .as_deref()
            .or(self.file.as_deref())
            .expect("clap requires the recipe or -f")
    }
}

/// `-t`: a tag as `index.json` holds one. `name:tag` and `registry/name` are told where
/// those go instead.
fn parse_tag(text: &str) -> Result<String, String> {
    if text.contains(['/', ':', '@']) {
        return Err(format!(
            "`{text}` is more than a tag: the layout's directory is `-o DIR` (default \
             images/NAME), and a registry reference is `--push REGISTRY/REPO:TAG`"
        ));
    }
    if !crate::names::is_valid_tag(text) {
        return Err(format!(
            "invalid tag `{text}`: expected {}",
            crate::names::TAG_RULE
        ));
    }
    Ok(text.to_string())
}

/// `--cache-sign-by` and `--cache-verify-key`, loaded (and the signing key unlocked) before
/// anything is built: a key that cannot be used is the operator's mistake (exit 2).
fn cache_keys(args: &BuildArgs) -> Result<EntryKeys, CommandFailure> {
    let failed = |err: &dyn std::fmt::Display| CommandFailure::new(err.to_string(), 2);
    let signer = match &args.cache_sign_by {
        Some(key) => {
            let passphrase_file = args.cache_sign_passphrase_file.as_deref();
            let signer =
                crate::publish::load_key_file(key, passphrase_file).map_err(|e| failed(&e))?;
            // The key must unlock now, not when the first entry is stored.
            signer.sign(b"").map_err(|e| failed(&e))?;
            Some(Arc::new(signer))
        }
        None => None,
    };
    let verifier = match &args.cache_verify_key {
        Some(key) => Some(Arc::new(Verifier::load(key).map_err(|e| failed(&e))?)),
        None => None,
    };
    Ok(EntryKeys { signer, verifier })
}

/// `--cache-repo`: a repository, not an image in it.
pub(super) fn parse_cache_repo(text: &str) -> Result<crate::registry::Reference, String> {
    let reference = crate::registry::Reference::parse(text).map_err(|e| e.to_string())?;
    if reference.tag.is_some() || reference.digest.is_some() {
        return Err(format!(
            "`{text}` names an image; the layer cache is a repository: `REGISTRY/REPO`"
        ));
    }
    Ok(reference)
}

pub(super) async fn run_build(
    args: &BuildArgs,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let lock_mode = if args.locked {
        LockMode::Locked
    } else {
        LockMode::Reuse
    };
    // Checked before anything is solved or fetched, as `--jobs` is.
    crate::layers::budget::layer_memory_from_env().map_err(|e| CommandFailure::new(e, 2))?;
    let mut settings = BuildSettings {
        output: args.output.clone(),
        offline: args.offline,
        jobs: compression_threads(args.jobs, printer),
        tags: dedup(&args.tags),
        platforms: dedup(&args.platforms),
        cache_repo: match &args.cache_repo {
            Some(repository) => Some(build::CacheRepoSettings {
                repository: repository.clone(),
                readonly: args.cache_repo_readonly,
                keys: cache_keys(args)?,
            }),
            None => None,
        },
        ..env.build_settings(args.recipe().to_path_buf(), lock_mode)
    };
    if let Some(shard) = args.shard {
        if args.format.archive_suffix().is_some() {
            return Err(CommandFailure::new(
                "`--format` writes an image, and `--shard` writes none (only layers, into the cache)",
                2,
            ));
        }
        return super::shard::run_shard(&settings, shard, printer).await;
    }
    match variants_to_build(args)? {
        Variants::One(variant) => settings.variant = variant,
        Variants::All(variants) => return matrix::run_matrix(&settings, variants, printer).await,
    }
    check_docker_archive(args, &settings)?;
    let reporter = BuildProgress::new(printer);
    let built = build::build(&settings, &reporter).await;
    reporter.finish(built.is_ok());
    let report = built?;
    print_build(&report, printer);
    if let (Some(suffix), Some(tag)) = (args.format.archive_suffix(), report.tags.first()) {
        write_archive(&report.layout_dir, tag, args.format, suffix, printer)?;
    }
    if let (Some(reference), Some(tag)) = (&args.push, report.tags.first()) {
        let image = format!("{}:{tag}", report.layout_dir.display());
        let mount_first = args.cache_repo.as_ref();
        push_built(&image, reference, mount_first, env, printer).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a build of a recipe makes: one image (of the `--variant` chosen, if any), or every
/// variant of its `[matrix]`.
enum Variants {
    One(Option<Variant>),
    All(Vec<Variant>),
}

/// Reads the recipe's `[matrix]` and picks `--variant` from it. A file that cannot be read
/// builds one image: its errors are left to the build, which reports them with their place.
fn variants_to_build(args: &BuildArgs) -> Result<Variants, CommandFailure> {
    let Ok(text) = crate::recipe::read_recipe_text(args.recipe()) else {
        return Ok(Variants::One(None));
    };
    // These checks come before the build: text only, even with `--json`.
    let variants = crate::recipe::matrix::variants(&text, args.recipe())
        .map_err(|err| CommandFailure::new(err, 1))?;
    let refuse = |message: String| Err(CommandFailure::new(message, 1));
    let recipe = args.recipe().display();
    if let Some(wanted) = args.variant.as_deref() {
        return match crate::recipe::matrix::select(&variants, wanted) {
            Some(variant) => Ok(Variants::One(Some(variant.clone()))),
            None if variants.is_empty() => refuse(format!(
                "`{recipe}` has no [matrix], so no variant `{wanted}`"
            )),
            None => refuse(format!(
                "`{recipe}` has no variant `{wanted}`; its variants are {}",
                variants
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{i}: {}", v.suffix()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        };
    }
    if variants.is_empty() {
        return Ok(Variants::One(None));
    }
    let one_image = args.output.is_some() || args.push.is_some() || !args.tags.is_empty();
    if one_image || args.format.archive_suffix().is_some() {
        return refuse(format!(
            "`-o`, `-t`, `--push` and `--format` name one image; a matrix builds {} (images/NAME-VARIANT): push them one by one",
            variants.len()
        ));
    }
    Ok(Variants::All(variants))
}

/// Refuses `--format docker-archive` for a recipe of several platforms before building.
fn check_docker_archive(args: &BuildArgs, settings: &BuildSettings) -> Result<(), CommandFailure> {
    if args.format != OutputFormat::DockerArchive {
        return Ok(());
    }
    match multi_platforms(settings) {
        Some(platforms) => Err(CommandFailure::new(
            format!(
                "a docker-archive holds one platform's image, and `{}` builds {platforms}: use `--format oci-archive` (it holds the image index), or a recipe with one platform",
                settings.recipe_path.display()
            ),
            1,
        )),
        None => Ok(()),
    }
}

/// The platforms of the recipe `settings` builds, when it has several (errors in the recipe
/// are left to the build, which reports them with their place).
fn multi_platforms(settings: &BuildSettings) -> Option<crate::recipe::Platforms> {
    let options = crate::recipe::RecipeOptions {
        channel_alias: settings.channel_alias.clone(),
        variant: settings.variant.clone(),
    };
    let recipe = crate::recipe::Recipe::load(&settings.recipe_path, &options).ok()?;
    let platforms = match settings.platforms.as_slice() {
        [] => recipe.platforms,
        chosen => crate::recipe::Platforms::new(chosen.to_vec())?,
    };
    platforms.is_multi().then_some(platforms)
}

/// `-t a -t a` tags the image `a` once, as the recipe's list would be refused for it, and
/// `--platform linux/amd64,linux-64` names one platform.
fn dedup<T: PartialEq + Clone>(values: &[T]) -> Vec<T> {
    let mut kept: Vec<T> = Vec::with_capacity(values.len());
    for value in values {
        if !kept.contains(value) {
            kept.push(value.clone());
        }
    }
    kept
}

/// The lock and result events with `--json`; else the status lines, then the result on
/// stdout: one `layout:tag@digest` line per tag.
/// What the layer cache repository gave and took: the hits and misses of the layers looked
/// up there, and what was stored.
fn print_cache_repo(shared: &CacheRepoSummary, printer: &Printer) {
    let misses = shared.looked_up - shared.hits;
    let stored = if shared.readonly {
        "read-only".to_string()
    } else {
        format!(
            "{} stored ({} sent), {} already there",
            shared.stored,
            human_bytes(shared.bytes_uploaded),
            shared.present
        )
    };
    let rejected = match shared.rejected {
        0 => String::new(),
        n => format!(", {n} refused by their check"),
    };
    printer.status(
        "Layer cache",
        format_args!(
            "{}: {} hit ({}), {misses} missed{rejected}; {stored}",
            shared.repository,
            shared.hits,
            human_bytes(shared.bytes_downloaded),
        ),
    );
    if let Some(why) = &shared.unusable {
        printer.status("Layer cache", format_args!("not used after: {why}"));
    }
}

fn print_build(report: &BuildReport, printer: &Printer) {
    if printer.json() {
        printer.event(&lock_event(&report.lock));
        printer.event(&result_event(report));
        return;
    }
    describe_lock(&report.lock, printer);
    let compressed: u64 = report.layers.iter().map(|l| l.blob.size).sum();
    let uncompressed: u64 = report.layers.iter().map(|l| l.blob.tar_size).sum();
    let reused = report.layers.iter().filter(|l| l.reused).count();
    if report.unchanged {
        printer.status(
            "Unchanged",
            format_args!(
                "{}: the recipe, lock and base are those of the image in place",
                report.layout_dir.display()
            ),
        );
    }
    printer.status(
        "Built",
        format_args!(
            "{} ({} from the base, {} ours: {} written, {} reused): {} compressed, {} uncompressed",
            counted(report.base_layers + report.layers.len(), "layer"),
            report.base_layers,
            report.layers.len(),
            report.layers.len() - reused,
            reused,
            human_bytes(compressed),
            human_bytes(uncompressed),
        ),
    );
    if let Some(shared) = &report.cache_repo {
        print_cache_repo(shared, printer);
    }
    for model in &report.models {
        printer.status(
            "Model",
            format_args!(
                "{} ({}, {}) for {}: {}@{}",
                model.name,
                counted(model.files, "file"),
                human_bytes(model.bytes),
                model.mount,
                model.layout.display(),
                model.image_digest
            ),
        );
    }
    for path in &report.sboms {
        printer.status("SBOM", path.display());
    }
    printer.status("Provenance", report.provenance.display());
    let timings: Vec<String> = report
        .timings
        .iter()
        .map(|(stage, time)| format!("{} {:.2}s", stage.name(), time.as_secs_f64()))
        .collect();
    printer.status("Took", timings.join(", "));
    for tag in &report.tags {
        printer.result(format_args!(
            "{}:{tag}@{}",
            report.layout_dir.display(),
            report.manifest_digest
        ));
    }
}

/// `--format …-archive`: the image `tag` of the layout also written as one file beside it.
fn write_archive(
    layout_dir: &Path,
    tag: &str,
    format: OutputFormat,
    suffix: &str,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let name = layout_dir
        .file_name()
        .map_or_else(|| "image".to_string(), |n| n.to_string_lossy().into_owned());
    let archive = layout_dir.with_file_name(format!("{name}.{suffix}"));
    let layout = crate::oci::layout::Layout::new(layout_dir);
    crate::oci::archive::write_archive(&layout, tag, &format!("{name}:{tag}"), format, &archive)
        // After the result event, and text only, as it always was.
        .map_err(|err| CommandFailure::new(err, 2))?;
    if printer.json() {
        printer.event(&json!({"event": "archive", "path": archive}));
    } else {
        printer.result(archive.display());
    }
    Ok(())
}

/// `--push REF`: the built `image` (layout and first tag) pushed once the build succeeded,
/// its blobs mounted from `mount_first` (the `--cache-repo`) when that is on the same registry.
async fn push_built(
    image: &str,
    reference: &str,
    mount_first: Option<&crate::registry::Reference>,
    env: &Env<'_>,
    printer: &Printer,
) -> Result<(), CommandFailure> {
    let options = env.global.registry_options();
    let push = registry::PushOf {
        image,
        reference,
        mount_first,
        models: true,
    };
    let published = registry::publish_layout(&push, &[], None, &options, printer).await?;
    let report = published.push;
    if printer.json() {
        let mut event = serde_json::to_value(&report).expect("the report serializes");
        event["event"] = "push".into();
        event["models"] = registry::models_json(&published.models);
        printer.event(&event);
    } else {
        registry::print_models(&published.models, printer);
        registry::print_push(&report, printer);
    }
    Ok(())
}
