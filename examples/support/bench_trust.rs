//! `just bench --trust-against OLD`: what the trust checks of issue 26 cost (the confined
//! `[[files]]` reader, the checked layer cache, the bounded readers), measured against an
//! older binary in the same run. The two binaries take turns (old, new, old, new, …) so a
//! machine's drift falls on both alike; each row is the median of the rounds. Every build
//! of the same recipe must give the same manifest digest with both binaries.

use std::path::{Path, PathBuf};

use anyhow::ensure;

use super::{Bench, Row};

/// Rounds per binary.
const ROUNDS: usize = 3;

/// Files in the `[[files]]` source: a source tree of small files, as a repository's.
const SOURCE_FILES: usize = 5_000;

/// One measured step of a round.
struct Step {
    what: &'static str,
    seconds: Vec<f64>,
    peak_rss_kb: Vec<u64>,
    digests: Vec<String>,
}

/// The steps of one round with one binary, each as a row; the digests of the builds.
fn round(bench: &Bench, channel: &Path) -> anyhow::Result<Vec<(Row, Option<String>)>> {
    let mut rows = Vec::new();
    for path in [bench.cache.clone(), bench.dir.join("images")] {
        if path.exists() {
            fs_err::remove_dir_all(&path)?;
        }
    }
    bench.write_recipe("bench", channel, "1.0", "zstd")?;
    let build = ["build", "recipes/bench.toml"];
    rows.push(measured(bench, "cold build (empty caches), zstd", &build)?);
    bench.forget_layers("bench")?;
    rows.push(measured(
        bench,
        "warm build (packages cached, layers not), zstd",
        &build,
    )?);
    forget_image(bench, "bench")?;
    rows.push(measured(
        bench,
        "warm build, every layer a cache hit, image removed before",
        &build,
    )?);
    forget_noop(bench)?;
    rows.push(measured(
        bench,
        "warm build, every layer a cache hit, image kept",
        &build,
    )?);
    bench.write_recipe("bench", channel, "1.1", "zstd")?;
    rows.push(measured(
        bench,
        "rebuild after one small package changed (app 1.0 → 1.1)",
        &build,
    )?);
    write_files_recipe(bench, channel)?;
    let files = ["build", "recipes/files.toml"];
    rows.push(measured(
        bench,
        "warm build of a recipe with a 5,000-file `[[files]]` source",
        &files,
    )?);
    // Last: it seals the cache under a key of its own, which the steps above must not see.
    forget_image(bench, "bench")?;
    // A key file of its own: every cached entry is then another machine's, checked in full
    // before it is used (an older binary without the check ignores the variable).
    let fresh_key = bench.dir.join(format!("cache-key-{}", rand_suffix()));
    let restored = bench.command_with_env(&build, &[("IMGBUILD_CACHE_KEY_FILE", &fresh_key)]);
    rows.push(measured_command(
        bench,
        "warm build, every layer a hit of a restored cache (first use on this machine)",
        restored,
    )?);
    Ok(rows)
}

fn measured(bench: &Bench, what: &str, args: &[&str]) -> anyhow::Result<(Row, Option<String>)> {
    let row = bench.measure(what, args)?;
    Ok((row, image_digest(bench, args)))
}

fn measured_command(
    bench: &Bench,
    what: &str,
    command: std::process::Command,
) -> anyhow::Result<(Row, Option<String>)> {
    let row = bench.measure_command(what, command)?;
    Ok((row, image_digest(bench, &["build", "recipes/bench.toml"])))
}

/// The manifest digest the build `args` wrote (its image is `images/<recipe stem>`).
fn image_digest(bench: &Bench, args: &[&str]) -> Option<String> {
    let stem = Path::new(args.last()?).file_stem()?.to_str()?;
    let index = fs_err::read_to_string(bench.dir.join("images").join(stem).join("index.json"));
    let index: serde_json::Value = serde_json::from_str(&index.ok()?).ok()?;
    index["manifests"][0]["digest"].as_str().map(str::to_string)
}

/// Drops the no-op records, keeping the image and the layer cache: the next build takes every
/// layer from the cache into a layout that already holds them.
fn forget_noop(bench: &Bench) -> anyhow::Result<()> {
    let builds = bench.cache.join("builds");
    if builds.exists() {
        fs_err::remove_dir_all(&builds)?;
    }
    Ok(())
}

/// Drops the image and the no-op records, keeping the layer cache: the next build takes every
/// layer from the cache.
fn forget_image(bench: &Bench, name: &str) -> anyhow::Result<()> {
    for path in [
        bench.cache.join("builds"),
        bench.dir.join("images").join(name),
    ] {
        if path.exists() {
            fs_err::remove_dir_all(&path)?;
        }
    }
    Ok(())
}

/// `recipes/files.toml`: the tiny `app` package and a `[[files]]` source of
/// [`SOURCE_FILES`] files in 50 directories, written once.
fn write_files_recipe(bench: &Bench, channel: &Path) -> anyhow::Result<()> {
    let source = bench.dir.join("recipes/src");
    if !source.exists() {
        for i in 0..SOURCE_FILES {
            let dir = source.join(format!("pkg{:02}", i % 50));
            fs_err::create_dir_all(&dir)?;
            fs_err::write(
                dir.join(format!("mod{i}.py")),
                format!("VALUE = {i}\n").repeat(20),
            )?;
        }
    }
    bench.write_recipe_of("files", channel, &["app 1.0"], "zstd", None)?;
    let recipe = bench.dir.join("recipes/files.toml");
    let mut text = fs_err::read_to_string(&recipe)?;
    text.push_str("\n[[files]]\nsrc = \"src\"\ndest = \"/app/src\"\n");
    fs_err::write(&recipe, text)?;
    // The layers of the source are made again each time, as after an edit.
    let layers = bench.cache.join("layers");
    if layers.exists() {
        fs_err::remove_dir_all(&layers)?;
    }
    Ok(())
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Runs [`ROUNDS`] rounds of each binary, taking turns, and returns the report section.
pub(crate) fn compare(
    work: &Path,
    channel: &Path,
    before: &Path,
    after: &Path,
) -> anyhow::Result<String> {
    let binaries = [
        ("before", before.to_path_buf()),
        ("after", after.to_path_buf()),
    ];
    let mut steps: Vec<Vec<Step>> = vec![Vec::new(), Vec::new()];
    for round_number in 0..ROUNDS {
        for (at, (label, binary)) in binaries.iter().enumerate() {
            eprintln!(
                "trust bench: round {} of {ROUNDS}, {label}",
                round_number + 1
            );
            let bench = bench_for(work, label, binary)?;
            for (index, (row, digest)) in round(&bench, channel)?.into_iter().enumerate() {
                if steps[at].len() <= index {
                    steps[at].push(Step {
                        what: leak(row.what.clone()),
                        seconds: Vec::new(),
                        peak_rss_kb: Vec::new(),
                        digests: Vec::new(),
                    });
                }
                let step = &mut steps[at][index];
                step.seconds.push(row.seconds);
                step.peak_rss_kb.extend(row.peak_rss_kb);
                step.digests.extend(digest);
            }
        }
    }
    report(&steps[0], &steps[1], before, after)
}

fn bench_for(work: &Path, label: &str, binary: &Path) -> anyhow::Result<Bench> {
    let dir = work.join(format!("trust-{label}"));
    fs_err::create_dir_all(dir.join("recipes"))?;
    Ok(Bench {
        imgbuild: binary.to_path_buf(),
        cache: dir.join("cache"),
        dir,
    })
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The section: each step's median seconds before and after, their ratio, the peak RSS, and
/// whether both binaries wrote the same images.
fn report(before: &[Step], after: &[Step], old: &Path, new: &Path) -> anyhow::Result<String> {
    ensure!(
        before.len() == after.len(),
        "the binaries ran different steps"
    );
    let mut out = format!(
        "What the trust checks cost: {} (before) against {} (after), {ROUNDS} rounds each, taking \
         turns; medians.\n\n| step | before s | after s | after ÷ before | peak RSS after MB | same digests |\n\
         |---|---:|---:|---:|---:|---|\n",
        display(old),
        display(new)
    );
    for (b, a) in before.iter().zip(after) {
        let (mb, ma) = (median(&b.seconds), median(&a.seconds));
        let rss = a.peak_rss_kb.iter().max().copied().unwrap_or(0) / 1024;
        let same = !a.digests.is_empty()
            && a.digests
                .iter()
                .chain(&b.digests)
                .all(|d| *d == a.digests[0]);
        out.push_str(&format!(
            "| {} | {mb:.2} | {ma:.2} | {:.3} | {rss} | {} |\n",
            a.what,
            ma / mb,
            if same { "yes" } else { "NO" }
        ));
    }
    let digests: Vec<&String> = after.iter().flat_map(|s| s.digests.first()).collect();
    out.push_str(&format!(
        "\nDigests (after, first round): {}\n",
        digests
            .iter()
            .map(|d| format!("`{d}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(out)
}

fn display(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The binary given to `--trust-against`, checked to exist.
pub(crate) fn old_binary(path: &str) -> anyhow::Result<PathBuf> {
    let path = PathBuf::from(path);
    ensure!(path.is_file(), "{} is not a file", path.display());
    Ok(path)
}
