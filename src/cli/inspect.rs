//! `imgbuild inspect` and `imgbuild diff`: arguments and rendering.

use std::{fmt::Write, process::ExitCode};

use clap::Args;

use super::inspect_models;
use super::printer::{CommandFailure, Printer, human_bytes, short_digest as short};
use crate::inspect::{ImageDiff, ImageSummary, describe_layer, diff, inspect_platform};

/// `--platform`: an OCI platform or a conda subdir that maps to one.
pub(super) fn parse_platform(text: &str) -> Result<rattler_conda_types::Subdir, String> {
    crate::recipe::OciPlatform::parse_subdir(text).ok_or_else(|| {
        format!("`{text}` is not a Linux platform: expected e.g. `linux/amd64`, `linux/arm64` or `linux-aarch64`")
    })
}

pub(super) const INSPECT_EXAMPLES: &str = "\
Examples:
  imgbuild inspect images/py39-torch21             # the `latest` tag of a layout
  imgbuild inspect images/multi --platform linux/arm64   # one platform of a multi-platform image
  imgbuild inspect images/py39-torch21:cuda11.8 --json | jq '.layers[].packages'
  imgbuild inspect registry.example/ml/py39-torch21:v1    # its manifest and config only
  imgbuild inspect images/py39-torch21 --sizes --top 10  # where the bytes are
  imgbuild inspect images/py39-torch21 --sizes --architectures sm_80,sm_90
  imgbuild inspect images/served.models/tiny --json   # a model: its files, kinds, layers";

pub(super) const DIFF_EXAMPLES: &str = "\
Examples:
  imgbuild diff images/app-old images/app          # what a rebuild changed
  imgbuild diff images/a:v1 images/a:v2 --json | jq .changed
  imgbuild diff images/multi:v1 images/multi:v2 --platform linux/arm64
  imgbuild diff old/served.models/tiny images/served.models/tiny   # which files a revision changed";

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`, or a registry reference
    /// naming its registry (`registry.example/ml/x:tag`, `…@sha256:…`): then only its
    /// manifest and config are fetched
    pub image: String,
    /// Of a multi-platform image, the platform to describe: `linux/arm64`, `arm64` or a
    /// conda subdir (`linux-aarch64`); default: this machine's, else the image's first
    #[arg(long, value_parser = parse_platform)]
    pub platform: Option<rattler_conda_types::Subdir>,
    /// Print the summary as one JSON object
    #[arg(long)]
    pub json: bool,
    /// Where the bytes are: per layer and per package (compressed and not), the largest
    /// files, and shared libraries held twice (by soname or by bytes). Reads every layer of
    /// a local layout
    #[arg(long)]
    pub sizes: bool,
    /// With `--sizes`, how many of the largest files to list
    #[arg(long, value_name = "N", default_value_t = 20, requires = "sizes")]
    pub top: usize,
    /// With `--sizes`, the GPUs the image is for (`sm_80,sm_90`, as `[cuda] architectures`):
    /// the bytes of SASS that none of them runs, per library
    #[arg(long, value_name = "LIST", value_parser = parse_architectures, requires = "sizes")]
    pub architectures: Option<crate::cuda::fatbin::Architectures>,
}

fn parse_architectures(text: &str) -> Result<crate::cuda::fatbin::Architectures, String> {
    crate::cuda::fatbin::parse_list(text).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The image to compare from: an OCI layout directory, optionally with `:TAG`
    pub from: String,
    /// The image to compare to
    pub to: String,
    /// Of multi-platform images, the platform to compare (both must have it): `linux/arm64`,
    /// `arm64` or a conda subdir; default: this machine's, else each image's first
    #[arg(long, value_parser = parse_platform)]
    pub platform: Option<rattler_conda_types::Subdir>,
    /// Print the differences as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub(super) async fn run_inspect(
    args: &InspectArgs,
    cache_dir: &std::path::Path,
    registry: &crate::registry::ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    if args.sizes {
        let options = crate::sizes::SizeOptions {
            top: args.top,
            architectures: args.architectures.clone(),
        };
        return super::inspect_sizes::run_sizes(
            &args.image,
            args.platform,
            &options,
            args.json,
            printer,
        );
    }
    if inspect_models::is_model(&args.image) {
        inspect_models::run_inspect(&args.image, args.json, printer)?;
        return Ok(ExitCode::SUCCESS);
    }
    let summary = crate::inspect::inspect_any(&args.image, args.platform, cache_dir, registry)
        .await
        .map_err(|err| CommandFailure::new(err, 1))?;
    let local = !matches!(
        crate::smoke::ImageSource::of(&args.image),
        crate::smoke::ImageSource::Registry(_)
    );
    let models = match local {
        true => inspect_models::beside(&args.image, printer),
        false => Vec::new(),
    };
    if args.json {
        let mut value = serde_json::to_value(&summary).expect("the summary serializes");
        if !models.is_empty() {
            value["models"] = serde_json::to_value(&models).expect("the models serialize");
        }
        printer.result(serde_json::to_string_pretty(&value).expect("JSON serializes"));
    } else {
        printer.document(&(render_summary(&summary) + &inspect_models::render_beside(&models)));
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn run_diff(args: &DiffArgs, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    match (
        inspect_models::is_model(&args.from),
        inspect_models::is_model(&args.to),
    ) {
        (true, true) => {
            inspect_models::run_diff(&args.from, &args.to, args.json, printer)?;
            return Ok(ExitCode::SUCCESS);
        }
        (false, false) => {}
        (from, _) => {
            let (model, image) = if from {
                (&args.from, &args.to)
            } else {
                (&args.to, &args.from)
            };
            return Err(CommandFailure::new(
                format!(
                    "`{model}` is a model's layout and `{image}` is not: diff compares two revisions of one kind"
                ),
                1,
            ));
        }
    }
    let (from, to) = match (
        inspect_platform(&args.from, args.platform),
        inspect_platform(&args.to, args.platform),
    ) {
        (Ok(from), Ok(to)) => (from, to),
        (Err(err), _) | (_, Err(err)) => return Err(CommandFailure::new(err, 1)),
    };
    let changes = diff(&from, &to);
    if args.json {
        printer.result(serde_json::to_string_pretty(&changes).expect("the diff serializes"));
    } else {
        printer.document(&render_diff(&changes));
    }
    Ok(ExitCode::SUCCESS)
}

fn words(list: &Option<Vec<String>>) -> String {
    list.as_ref()
        .map(|l| serde_json::to_string(l).expect("strings serialize"))
        .unwrap_or_else(|| "-".to_string())
}

fn or_dash(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "-".to_string())
}

/// The summary as text: the config, CUDA needs, then a table of layers.
fn render_summary(summary: &ImageSummary) -> String {
    let mut out = String::new();
    render_origin(&mut out, summary);
    render_config(&mut out, &summary.config);
    render_cuda(&mut out, summary);
    render_layers(&mut out, summary);
    out
}

/// Where the image comes from: its name, digests, platform, time, base and conda prefix.
fn render_origin(out: &mut String, summary: &ImageSummary) {
    let _ = writeln!(out, "image        {}", summary.image);
    if let Some(index) = &summary.index_digest {
        let _ = writeln!(
            out,
            "index        {index} ({}; below: {}/{}, `--platform` picks another)",
            summary.platforms.join(", "),
            summary.os,
            summary.architecture
        );
    }
    let _ = writeln!(out, "digest       {}", summary.manifest_digest);
    let _ = writeln!(out, "platform     {}/{}", summary.os, summary.architecture);
    let _ = writeln!(out, "created      {}", or_dash(&summary.created));
    if let Some(base) = &summary.base {
        let _ = writeln!(
            out,
            "base         {} {}",
            or_dash(&base.name),
            or_dash(&base.digest)
        );
    }
    if let Some(conda) = &summary.conda {
        let _ = writeln!(
            out,
            "conda        {} at {}",
            or_dash(&conda.platform),
            or_dash(&conda.prefix)
        );
    }
}

/// What the image runs, as whom, where and with what.
fn render_config(out: &mut String, config: &crate::inspect::RuntimeConfig) {
    let _ = writeln!(out, "entrypoint   {}", words(&config.entrypoint));
    let _ = writeln!(out, "cmd          {}", words(&config.cmd));
    let _ = writeln!(out, "user         {}", or_dash(&config.user));
    let _ = writeln!(out, "workdir      {}", or_dash(&config.workdir));
    for var in &config.env {
        let _ = writeln!(out, "env          {var}");
    }
    for (key, value) in &config.labels {
        let _ = writeln!(out, "label        {key}={value}");
    }
    if !config.ports.is_empty() {
        let _ = writeln!(out, "ports        {}", config.ports.join(" "));
    }
    if let Some(signal) = &config.stop_signal {
        let _ = writeln!(out, "stop-signal  {signal}");
    }
}

/// The CUDA the image needs, its GPU architectures and its embedded smoke test.
fn render_cuda(out: &mut String, summary: &ImageSummary) {
    match &summary.cuda {
        Some(cuda) => {
            let _ = writeln!(
                out,
                "cuda         {} (min driver {}; NVIDIA_REQUIRE_CUDA {}; CUDA_VERSION {})",
                or_dash(&cuda.version),
                or_dash(&cuda.min_driver),
                or_dash(&cuda.require_cuda),
                or_dash(&cuda.cuda_version)
            );
        }
        None => {
            let _ = writeln!(out, "cuda         none");
        }
    }
    if let Some(gpu) = &summary.gpu {
        render_gpu(out, gpu);
    }
    if let Some(smoke) = &summary.smoke {
        let _ = writeln!(
            out,
            "smoke        {smoke} (`imgbuild k8s --smoke-job` runs it)"
        );
    }
}

/// The layers, one row each, and the totals.
fn render_layers(out: &mut String, summary: &ImageSummary) {
    let _ = writeln!(out);
    let _ = writeln!(out, "{:>3}  {:<12}  {:>10}  holds", "#", "digest", "size");
    for (position, layer) in summary.layers.iter().enumerate() {
        let _ = writeln!(
            out,
            "{:>3}  {:<12}  {:>10}  {}",
            position + 1,
            short(&layer.digest),
            human_bytes(layer.size),
            describe_layer(layer)
        );
    }
    let _ = writeln!(
        out,
        "total        {} layers, {} packages, {} compressed",
        summary.layers.len(),
        summary.packages.len(),
        human_bytes(summary.total_size)
    );
}

/// The GPU architectures: all of them, then each package's.
fn render_gpu(out: &mut String, gpu: &crate::inspect::GpuArchitectures) {
    let _ = writeln!(
        out,
        "gpu          {} (SASS sm_XX runs as built, PTX compute_XX is JIT-compiled)",
        gpu.architectures.join(" ")
    );
    for package in &gpu.packages {
        let _ = writeln!(
            out,
            "gpu          {}: {}",
            package.package,
            package.architectures.join(" ")
        );
    }
}

/// The diff as text: package changes, then layers.
fn render_diff(changes: &ImageDiff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "from         {} {}",
        changes.from.image, changes.from.manifest_digest
    );
    let _ = writeln!(
        out,
        "to           {} {}",
        changes.to.image, changes.to.manifest_digest
    );
    if changes.added.is_empty() && changes.removed.is_empty() && changes.changed.is_empty() {
        let _ = writeln!(out, "packages     unchanged");
    }
    for package in &changes.added {
        let _ = writeln!(out, "+ {} {}", package.name, package.version_build());
    }
    for package in &changes.removed {
        let _ = writeln!(out, "- {} {}", package.name, package.version_build());
    }
    for change in &changes.changed {
        let _ = writeln!(out, "~ {} {} -> {}", change.name, change.from, change.to);
    }
    if changes.config.is_empty() {
        let _ = writeln!(out, "config       unchanged");
    }
    for change in &changes.config {
        let _ = writeln!(
            out,
            "config       {}: {} -> {}",
            change.field,
            or_dash(&change.from),
            or_dash(&change.to)
        );
    }
    let _ = writeln!(out);
    for layer in &changes.new_layers {
        let _ = writeln!(
            out,
            "new layer    {}  {:>10}  {}",
            short(&layer.digest),
            human_bytes(layer.size),
            layer.holds
        );
    }
    let shared: u64 = changes.shared_layers.iter().map(|l| l.size).sum();
    let sign = if changes.size_delta < 0 { "-" } else { "+" };
    let _ = writeln!(
        out,
        "layers       {} shared ({}), {} new ({}), {} dropped",
        changes.shared_layers.len(),
        human_bytes(shared),
        changes.new_layers.len(),
        human_bytes(changes.new_bytes),
        changes.dropped_layers.len()
    );
    let _ = writeln!(
        out,
        "size         {} -> {} ({sign}{})",
        human_bytes(changes.from.total_size),
        human_bytes(changes.to.total_size),
        human_bytes(changes.size_delta.unsigned_abs())
    );
    out
}
