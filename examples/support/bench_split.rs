//! `just bench --split`: the bench image with its large packages split into layers of a
//! bound (`[layers] split`) against the same lock with every package whole (`split = false`),
//! in one run. Measured: the build (a warm build, packages cached and layers not), and on a
//! node with nothing on it, podman's time to the first command (`podman run --pull always`)
//! and containerd's `ctr image pull` (fetch and unpack) followed by `ctr run`. The two images
//! take turns, so a machine's drift falls on both alike; each row is the median of the
//! rounds.

use std::{path::Path, time::Instant};

use anyhow::{Context, ensure};

use super::{Bench, base, containerd::Containerd, node};

/// Rounds per image.
const ROUNDS: usize = 3;

/// The bounds measured against the whole packages.
const BOUNDS: &[&str] = &["256MiB", "512MiB"];

/// One row of seconds per round.
struct Timed {
    what: String,
    seconds: Vec<f64>,
}

impl Timed {
    fn median(&self) -> f64 {
        let mut sorted = self.seconds.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    }
}

/// The variants compared: `false` first, then each bound.
fn settings() -> Vec<&'static str> {
    std::iter::once("false")
        .chain(BOUNDS.iter().copied())
        .collect()
}

fn recipe_name(setting: &str) -> String {
    match setting {
        "false" => "split-off".to_string(),
        bound => format!("split-{}", bound.to_lowercase()),
    }
}

/// Writes a recipe of the bench environment on busybox with `[layers] split = setting`.
fn write_recipe(bench: &Bench, channel: &Path, base: &Path, setting: &str) -> anyhow::Result<()> {
    let name = recipe_name(setting);
    bench.write_recipe_of(
        &name,
        channel,
        &["pytorch 2.1.0", "app 1.0"],
        "gzip",
        Some(base),
    )?;
    let path = bench.dir.join(format!("recipes/{name}.toml"));
    let mut text = fs_err::read_to_string(&path)?;
    let value = match setting {
        "false" => "false".to_string(),
        bound => format!("\"{bound}\""),
    };
    text.push_str(&format!("\n[layers]\nsplit = {value}\n"));
    fs_err::write(path, text)?;
    Ok(())
}

/// The report section: the layers each variant has, then the ratios against whole packages.
pub(crate) fn compare(bench: &Bench, channel: &Path, run_dir: &Path) -> anyhow::Result<String> {
    let base_dir = run_dir.join("busybox");
    if !base_dir.exists() {
        base::busybox_base_layout(&base_dir)?;
    }
    let registry = node::LoggingRegistry::start_logging(&run_dir.join("split-registry"), "error")?;
    let mut references = Vec::new();
    let mut builds: Vec<Timed> = Vec::new();
    for setting in settings() {
        write_recipe(bench, channel, &base_dir, setting)?;
        builds.push(Timed {
            what: format!("warm build, split = {setting}"),
            seconds: Vec::new(),
        });
    }
    // The first build of each fills the package cache; the rounds then build warm.
    for setting in settings() {
        bench.run(&["build", &format!("recipes/{}.toml", recipe_name(setting))])?;
    }
    for _ in 0..ROUNDS {
        for (i, setting) in settings().into_iter().enumerate() {
            let name = recipe_name(setting);
            bench.forget_layers(&name)?;
            let row = bench.measure(
                &format!("warm build, split = {setting}"),
                &["build", &format!("recipes/{name}.toml")],
            )?;
            builds[i].seconds.push(row.seconds);
        }
    }
    let mut layers = Vec::new();
    for setting in settings() {
        let name = recipe_name(setting);
        let reference = format!("{}/{name}:v1", registry.host);
        bench.run(&["push", &format!("images/{name}"), &reference, "--insecure"])?;
        layers.push(layer_sizes(&bench.dir.join("images").join(&name))?);
        references.push(reference);
    }
    let mut pulls: Vec<[Timed; 2]> = settings()
        .into_iter()
        .map(|setting| {
            [
                "podman: nothing → first command",
                "containerd: ctr pull + unpack + run",
            ]
            .map(|what| Timed {
                what: format!("{what}, split = {setting}"),
                seconds: Vec::new(),
            })
        })
        .collect();
    for _ in 0..ROUNDS {
        for (i, reference) in references.iter().enumerate() {
            let [podman, ctr] = &mut pulls[i];
            podman
                .seconds
                .push(podman_first_command(run_dir, reference)?);
            ctr.seconds.push(containerd_first_command(reference)?);
        }
    }
    Ok(render(&builds, &pulls, &layers))
}

fn podman_first_command(run_dir: &Path, reference: &str) -> anyhow::Result<f64> {
    let node = node::node(&run_dir.join("split-node"), false)?;
    super::sync_and_settle();
    node::first_command(&node, reference)
}

/// A fresh containerd: `ctr image pull` (fetch, then unpack into overlayfs), then `ctr run`
/// of the busybox shell doing nothing.
fn containerd_first_command(reference: &str) -> anyhow::Result<f64> {
    let containerd = Containerd::start("").map_err(anyhow::Error::msg)?;
    super::sync_and_settle();
    let started = Instant::now();
    containerd
        .ctr(&["image", "pull", "--plain-http", reference])
        .map_err(anyhow::Error::msg)?;
    containerd
        .ctr(&[
            "run",
            "--rm",
            "--snapshotter",
            "overlayfs",
            reference,
            "first",
            "/bin/sh",
            "-c",
            ":",
        ])
        .map_err(anyhow::Error::msg)?;
    Ok(started.elapsed().as_secs_f64())
}

/// The compressed sizes of the layout's layers, largest first.
fn layer_sizes(layout: &Path) -> anyhow::Result<Vec<u64>> {
    let manifest = super::layout_manifest(layout)?;
    let mut sizes: Vec<u64> = manifest["layers"]
        .as_array()
        .context("manifest without layers")?
        .iter()
        .filter_map(|layer| layer["size"].as_u64())
        .collect();
    ensure!(!sizes.is_empty(), "no layers in {}", layout.display());
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    Ok(sizes)
}

fn mb(bytes: u64) -> String {
    format!("{:.0} MB", bytes as f64 / 1e6)
}

fn render(builds: &[Timed], pulls: &[[Timed; 2]], layers: &[Vec<u64>]) -> String {
    let mut out =
        String::from("| image | layers | largest layers (compressed) |\n|---|---:|---|\n");
    for (setting, sizes) in settings().into_iter().zip(layers) {
        let largest: Vec<String> = sizes.iter().take(4).map(|&s| mb(s)).collect();
        out.push_str(&format!(
            "| split = {setting} | {} | {} |\n",
            sizes.len(),
            largest.join(", ")
        ));
    }
    out.push_str(&format!(
        "\n| what (median of {ROUNDS}) | seconds | ratio to split = false |\n|---|---:|---:|\n"
    ));
    let mut rows: Vec<(&Timed, &Timed)> = Vec::new();
    for (i, build) in builds.iter().enumerate() {
        rows.push((build, &builds[0]));
        for (j, pull) in pulls[i].iter().enumerate() {
            rows.push((pull, &pulls[0][j]));
        }
    }
    rows.sort_by_key(|(row, _)| row.what.split(", split").next().map(str::to_string));
    for (row, whole) in rows {
        out.push_str(&format!(
            "| {} | {:.2} | {:.3} |\n",
            row.what,
            row.median(),
            row.median() / whole.median()
        ));
    }
    out
}
