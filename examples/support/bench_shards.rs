//! `bench --fleet`, the sharded matrix (issue 28, item 2): a `[matrix]` of four variants of
//! the synthetic environment built by 1, 2 and 4 workers. The workers are separate
//! `build --shard I/W --locked` processes, run side by side, each with its own empty cache,
//! against a fresh repository of the fleet's registry. Then one assembly build of the whole
//! matrix, on another empty cache, takes every package layer from that repository. The
//! baseline is one plain matrix build on an empty cache, with no cache repository.
//!
//! The matrix is 2 × 2 and changes only small packages: two stand-in pythons (`synthpy`) and
//! two versions of a small app (`synthapp`), beside the 20 packages every variant shares. So
//! the 88 package layers of the four images are 24 distinct ones, most of the bytes in the
//! shared 20: the case sharding is for. A matrix of two prefixes would share no layer, as
//! every path of every layer would differ.
//!
//! Per worker count: the wall time of the shard phase (first worker started to last one
//! ended), of the assembly and of both; each process's peak RSS (`wait4`); the bytes that
//! the workers and the assembly compressed ÷ the compressed bytes of the distinct package
//! layers (1.00 when none is compressed twice); how many distinct layers were compressed
//! exactly once (the `shard` events' `layers[].compressed`, by digest), and how many the
//! assembly took from the registry.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, ensure};
use serde_json::Value;

use super::node::LoggingRegistry;

/// The worker counts measured.
const WORKERS: &[usize] = &[1, 2, 4];
/// The matrix's axes: the stand-in pythons and the app versions.
const PYTHONS: &[&str] = &["3.9.18", "3.10.14"];
const APPS: &[&str] = &["1.0", "1.1"];
/// Bump when the packages the variants differ by change, so old ones are not reused.
const CHANNEL_VERSION: &str = "m1";

/// Where the sharded matrix runs: the binary, the fleet's run directory and registry.
pub(super) struct Fleet<'a> {
    pub imgbuild: &'a Path,
    pub run_dir: &'a Path,
    pub registry: &'a LoggingRegistry,
}

/// Builds the matrix of `channel`'s environment as a baseline and by each worker count;
/// the report's subsection.
pub(super) fn run(
    fleet: &Fleet,
    work: &Path,
    channel: &Path,
    size_gb: f64,
) -> anyhow::Result<String> {
    let extra = prepare_channel(work, size_gb)?;
    let recipe = matrix_recipe(&extra, channel)?;
    let dir = fleet.run_dir.join("matrix");
    let baseline = baseline(fleet, &dir, &recipe)?;
    let mut rows = vec![baseline.row()];
    for &workers in WORKERS {
        rows.push(sharded(fleet, &dir, &recipe, &baseline, workers)?);
    }
    fs_err::remove_dir_all(&dir)?;
    Ok(render(&baseline, &rows))
}

// --- the matrix -----------------------------------------------------------------------------

/// A channel of the packages the variants differ by: each python 2.5 % of the environment
/// (about a real python's share of an ML image), each app 0.2 %.
fn prepare_channel(work: &Path, size_gb: f64) -> anyhow::Result<PathBuf> {
    let channel = work.join(format!("fleet-matrix-{CHANNEL_VERSION}-{size_gb}gb"));
    let done = channel.join(".complete");
    if done.exists() {
        return Ok(channel);
    }
    let linux64 = super::empty_channel(&channel)?;
    let total = size_gb * 1e9;
    let pythons = PYTHONS.iter().map(|v| ("synthpy", *v, total / 40.0));
    let apps = APPS.iter().map(|v| ("synthapp", *v, total / 500.0));
    let mut rng = super::synthetic::Rng(0x5ba4d);
    for (name, version, bytes) in pythons.chain(apps) {
        let staging = tempfile::tempdir_in(work)?;
        super::synthetic::write_files(staging.path(), name, &mut rng, bytes as u64)?;
        super::write_conda(staging.path(), &linux64, name, version, &[])?;
    }
    super::channel::index_channel(&channel)?;
    fs_err::write(&done, "")?;
    Ok(channel)
}

/// The synthetic recipe with a python and an app of `extra` per variant.
fn matrix_recipe(extra: &Path, channel: &Path) -> anyhow::Result<String> {
    let url = |dir: &Path| {
        url::Url::from_directory_path(dir)
            .map_err(|()| anyhow::anyhow!("{} is not absolute", dir.display()))
    };
    let channels = format!("channels = [\"{}\", \"{}\"]", url(extra)?, url(channel)?);
    let same = super::synthetic::recipe(channel, "zstd")?;
    let mut recipe: String = same
        .lines()
        .map(|line| match line {
            l if l.starts_with("channels = ") => channels.clone(),
            l if l.starts_with("dependencies = ") => {
                l.replace(']', ", \"synthpy {{python}}\", \"synthapp {{app}}\"]")
            }
            l => l.to_string(),
        })
        .map(|line| line + "\n")
        .collect();
    let list = |values: &[&str]| format!("[\"{}\"]", values.join("\", \""));
    let _ = write!(
        recipe,
        "\n[matrix]\npython = {}\napp = {}\n",
        list(PYTHONS),
        list(APPS)
    );
    Ok(recipe)
}

// --- the processes --------------------------------------------------------------------------

/// A fresh builder's directory holding the recipe, and the baseline's locks when given; its
/// cache, key and registry config are made by the build, empty.
fn project(dir: &Path, recipe: &str, locks: Option<&Path>) -> anyhow::Result<()> {
    let recipes = dir.join("recipes");
    fs_err::create_dir_all(&recipes)?;
    fs_err::write(recipes.join("image.toml"), recipe)?;
    for entry in locks
        .map(fs_err::read_dir)
        .transpose()?
        .into_iter()
        .flatten()
    {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "lock") {
            fs_err::copy(&path, recipes.join(path.file_name().context("lock name")?))?;
        }
    }
    Ok(())
}

/// One `imgbuild build --json` in `dir`. Its stdout goes to a file, not a pipe, so that
/// workers side by side never wait on a full pipe that no one reads yet.
struct Running {
    child: std::process::Child,
    events: PathBuf,
    what: String,
}

fn start(fleet: &Fleet, dir: &Path, extra: &[String], what: String) -> anyhow::Result<Running> {
    let events = dir.join("events.jsonl");
    let child = Command::new(fleet.imgbuild)
        .current_dir(dir)
        .env("IMGBUILD_CACHE_DIR", dir.join("cache"))
        .env("IMGBUILD_CACHE_KEY_FILE", dir.join("state/cache-key"))
        .env("DOCKER_CONFIG", dir.join("docker"))
        .env("REGISTRY_AUTH_FILE", dir.join("docker/auth.json"))
        .args(["--insecure", "build", "recipes/image.toml", "--json"])
        .args(extra)
        .stdout(Stdio::from(fs_err::File::create(&events)?.into_file()))
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting imgbuild")?;
    Ok(Running {
        child,
        events,
        what,
    })
}

/// What one process did: its events and its own peak RSS.
struct Ended {
    events: Vec<Value>,
    rss_mb: f64,
}

impl Ended {
    fn all(&self, event: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == event).collect()
    }
}

impl Running {
    fn wait(self) -> anyhow::Result<Ended> {
        let (status, usage) = super::synthetic::wait4(self.child.id())?;
        ensure!(status == 0, "{} failed (wait status {status})", self.what);
        let events = fs_err::read_to_string(&self.events)?
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        Ok(Ended {
            events,
            rss_mb: usage.ru_maxrss as f64 * 1024.0 / 1e6,
        })
    }
}

/// Starts `runs` (directory, flags, what) side by side and waits for every one, before
/// failing for any, so none is left running; the seconds from first start to last end.
fn side_by_side(
    fleet: &Fleet,
    runs: &[(PathBuf, Vec<String>, String)],
) -> anyhow::Result<(f64, Vec<Ended>)> {
    super::sync_and_settle();
    let started = Instant::now();
    let mut running = Vec::new();
    for (dir, extra, what) in runs {
        running.push(start(fleet, dir, extra, what.clone()));
    }
    let ended: Vec<anyhow::Result<Ended>> = running
        .into_iter()
        .map(|r| r.and_then(Running::wait))
        .collect();
    let wall = started.elapsed().as_secs_f64();
    Ok((wall, ended.into_iter().collect::<anyhow::Result<_>>()?))
}

// --- what was compressed --------------------------------------------------------------------

/// The layers of the image of a `result` event: digest, compressed size and whether it is a
/// package layer (one with a packages annotation).
fn image_layers(dir: &Path, result: &Value) -> anyhow::Result<Vec<(String, u64, bool)>> {
    let layout = dir.join(
        result["layout"]
            .as_str()
            .context("result without a layout")?,
    );
    let manifest = super::layout_manifest(&layout)?;
    let layers = manifest["layers"].as_array().context("manifest layers")?;
    Ok(layers
        .iter()
        .map(|l| {
            let packages = l["annotations"]["dev.imgbuild.layer.packages"].as_str();
            (
                l["digest"].as_str().unwrap_or_default().to_string(),
                l["size"].as_u64().unwrap_or(0),
                packages.is_some_and(|p| !p.is_empty()),
            )
        })
        .collect())
}

/// The package layers a matrix build compressed itself (`written_layers` of kind conda or
/// wheels): one (digest, size) per compression.
fn compressed_by_build(dir: &Path, ended: &Ended) -> anyhow::Result<Vec<(String, u64)>> {
    let mut compressed = Vec::new();
    for result in ended.all("result") {
        let sizes: BTreeMap<String, u64> = image_layers(dir, result)?
            .into_iter()
            .map(|(digest, size, _)| (digest, size))
            .collect();
        let written = result["written_layers"]
            .as_array()
            .context("written_layers")?;
        for layer in written {
            if layer["kind"] == "conda" || layer["kind"] == "wheels" {
                let digest = layer["digest"].as_str().unwrap_or_default().to_string();
                compressed.push((digest.clone(), sizes.get(&digest).copied().unwrap_or(0)));
            }
        }
    }
    Ok(compressed)
}

/// The layers a worker's `shard` event says it compressed (not taken from a cache).
fn compressed_by_shard(ended: &Ended) -> anyhow::Result<(Vec<(String, u64)>, u64)> {
    let event = ended
        .all("shard")
        .into_iter()
        .next()
        .context("no shard event")?;
    let layers = event["layers"].as_array().context("shard layers")?;
    let compressed = layers
        .iter()
        .filter(|l| l["compressed"] == true)
        .map(|l| {
            let digest = l["digest"].as_str().unwrap_or_default().to_string();
            (digest, l["size"].as_u64().unwrap_or(0))
        })
        .collect();
    Ok((compressed, event["compressed_size"].as_u64().unwrap_or(0)))
}

/// Each image's digest, by layout.
fn digests(ended: &Ended) -> BTreeMap<String, String> {
    ended
        .all("result")
        .into_iter()
        .map(|r| (r["layout"].to_string(), r["digest"].to_string()))
        .collect()
}

// --- the runs -------------------------------------------------------------------------------

/// The plain matrix build: the reference images, their distinct package layers, and the
/// locks every later builder reads.
struct Baseline {
    dir: PathBuf,
    wall: f64,
    ended: Ended,
    /// The compressed size of each distinct package layer, by digest.
    distinct: BTreeMap<String, u64>,
    /// The package layers of the four images, each image's counted.
    layers: usize,
    compressed: Vec<(String, u64)>,
}

fn baseline(fleet: &Fleet, dir: &Path, recipe: &str) -> anyhow::Result<Baseline> {
    let dir = dir.join("baseline");
    project(&dir, recipe, None)?;
    eprintln!("fleet, sharded matrix: the plain build");
    let runs = [(dir.clone(), vec![], "the plain matrix build".to_string())];
    let (wall, mut ended) = side_by_side(fleet, &runs)?;
    let ended = ended.pop().context("the plain build")?;
    let mut distinct = BTreeMap::new();
    let mut layers = 0;
    for result in ended.all("result") {
        for (digest, size, package) in image_layers(&dir, result)? {
            if package {
                layers += 1;
                distinct.insert(digest, size);
            }
        }
    }
    let compressed = compressed_by_build(&dir, &ended)?;
    Ok(Baseline {
        wall,
        distinct,
        layers,
        compressed,
        ended,
        dir,
    })
}

/// One row of the table: the plain build, or a sharded one.
struct Row {
    /// The worker count and its two phases; none for the plain build.
    sharded: Option<Phases>,
    total: f64,
    /// The workers' peak RSS, then the assembly's (or the plain build's alone).
    rss_mb: Vec<f64>,
    /// One (digest, size) per package layer compressed, by any process of the row.
    compressed: Vec<(String, u64)>,
}

struct Phases {
    workers: usize,
    shards: f64,
    assembly: f64,
    /// The package layers the assembly took from the registry.
    hits: u64,
}

impl Baseline {
    fn row(&self) -> Row {
        Row {
            sharded: None,
            total: self.wall,
            rss_mb: vec![self.ended.rss_mb],
            compressed: self.compressed.clone(),
        }
    }
}

/// `workers` shards side by side against a fresh repository, then the assembly.
fn sharded(
    fleet: &Fleet,
    dir: &Path,
    recipe: &str,
    baseline: &Baseline,
    workers: usize,
) -> anyhow::Result<Row> {
    let dir = dir.join(format!("w{workers}"));
    let repo = format!("{}/ci/matrix-w{workers}", fleet.registry.host);
    let locked: Vec<String> = ["--locked", "--cache-repo", &repo].map(String::from).into();
    let locks = baseline.dir.join("recipes");
    let mut runs = Vec::new();
    for index in 0..workers {
        let worker = dir.join(format!("worker{index}"));
        project(&worker, recipe, Some(&locks))?;
        let shard = format!("{index}/{workers}");
        let flags = [&locked[..], &["--shard".to_string(), shard.clone()]].concat();
        runs.push((worker, flags, format!("shard {shard}")));
    }
    eprintln!("fleet, sharded matrix: {workers} workers");
    let (shard_wall, shards) = side_by_side(fleet, &runs)?;
    let assembly = dir.join("assembly");
    project(&assembly, recipe, Some(&locks))?;
    let what = format!("the assembly after {workers} workers");
    let (assembly_wall, mut ended) = side_by_side(fleet, &[(assembly.clone(), locked, what)])?;
    let assembled = ended.pop().context("the assembly")?;
    ensure!(
        digests(&assembled) == digests(&baseline.ended),
        "the assembly's images after {workers} workers are not the plain build's"
    );
    let mut compressed = compressed_by_shards(&shards)?;
    compressed.extend(compressed_by_build(&assembly, &assembled)?);
    let mut rss_mb: Vec<f64> = shards.iter().map(|s| s.rss_mb).collect();
    rss_mb.push(assembled.rss_mb);
    let hits = assembled
        .all("result")
        .iter()
        .map(|r| r["cache_repo"]["hits"].as_u64().unwrap_or(0))
        .sum();
    fs_err::remove_dir_all(&dir)?;
    Ok(Row {
        sharded: Some(Phases {
            workers,
            shards: shard_wall,
            assembly: assembly_wall,
            hits,
        }),
        total: shard_wall + assembly_wall,
        rss_mb,
        compressed,
    })
}

/// Every worker's compressed layers. A `compressed_size` that is not the sum of its layers
/// would make the bytes column disagree with the count column, so it fails the run.
fn compressed_by_shards(shards: &[Ended]) -> anyhow::Result<Vec<(String, u64)>> {
    let mut compressed = Vec::new();
    for shard in shards {
        let (layers, size) = compressed_by_shard(shard)?;
        let listed: u64 = layers.iter().map(|(_, s)| s).sum();
        ensure!(
            listed == size,
            "a shard's compressed_size {size} is not its layers' {listed}"
        );
        compressed.extend(layers);
    }
    Ok(compressed)
}

// --- the report -----------------------------------------------------------------------------

/// How many distinct layers were compressed exactly once, and how many compressions were of
/// no distinct layer or a second time.
fn once(distinct: &BTreeMap<String, u64>, compressed: &[(String, u64)]) -> (usize, usize) {
    let mut times: BTreeMap<&str, usize> = BTreeMap::new();
    for (digest, _) in compressed {
        *times.entry(digest).or_default() += 1;
    }
    let exactly = distinct
        .keys()
        .filter(|d| times.get(d.as_str()) == Some(&1))
        .count();
    (exactly, compressed.len() - exactly)
}

fn render(baseline: &Baseline, rows: &[Row]) -> String {
    let distinct: u64 = baseline.distinct.values().sum();
    let mut out = format!(
        "#### sharded matrix (4 variants: python × app)\n\n\
         The four images hold {} package layers, {} distinct ({} MB compressed).\n\n\
         | workers | shard phase s | assembly s | total s | shards ÷ plain | assembly ÷ plain | \
         total ÷ plain | peak RSS MB (workers; assembly) | MB compressed | ÷ distinct | \
         distinct layers compressed once | other compressions | assembly cache hits |\n\
         |---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
        baseline.layers,
        baseline.distinct.len(),
        super::fleet::mb(distinct)
    );
    for row in rows {
        out += &render_row(baseline, row, distinct);
    }
    out.push('\n');
    out
}

fn render_row(baseline: &Baseline, row: &Row, distinct: u64) -> String {
    let plain = baseline.wall;
    let bytes: u64 = row.compressed.iter().map(|(_, size)| size).sum();
    let (exactly, other) = once(&baseline.distinct, &row.compressed);
    let rss: Vec<String> = row.rss_mb.iter().map(|r| format!("{r:.0}")).collect();
    let (times, rss, hits) = match &row.sharded {
        Some(p) => (
            format!(
                "{} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3}",
                p.workers,
                p.shards,
                p.assembly,
                row.total,
                p.shards / plain,
                p.assembly / plain,
                row.total / plain
            ),
            match rss.split_last() {
                Some((assembly, workers)) => format!("{}; {assembly}", workers.join(", ")),
                None => String::new(),
            },
            p.hits.to_string(),
        ),
        None => (
            format!(
                "plain build | | | {:.2} | | | {:.3}",
                row.total,
                row.total / plain
            ),
            rss.join(", "),
            String::new(),
        ),
    };
    format!(
        "| {times} | {rss} | {} | {:.2} | {exactly} of {} | {other} | {hits} |\n",
        super::fleet::mb(bytes),
        bytes as f64 / distinct.max(1) as f64,
        baseline.distinct.len(),
    )
}
