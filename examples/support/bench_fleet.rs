//! `bench --fleet`: the registry as a shared layer cache (issue 28), offline. The synthetic
//! environment of `bench --synthetic` is built by fresh builders (an empty cache each, as a CI
//! runner or build pod starts) against one `docker-registry` on 127.0.0.1 that holds the
//! cache and the pushed images:
//!
//! - cold: an empty registry cache, `build --cache-repo … --push …`;
//! - a fresh builder, no change: the same lock, with the registry cache warm;
//! - a fresh builder, one small package changed;
//! - a `[matrix]` of four variants built by 1, 2 and 4 `--shard` workers, then assembled
//!   from the registry, against one plain matrix build (`bench_shards.rs`).
//!
//! Each row gives the wall time, the package bytes extracted, the bytes compressed and the
//! registry bytes moved (cache downloads and uploads, and the push's uploads, as imgbuild
//! reports them). The same three cases run with buildah's `bud --layers --cache-to/--cache-from`
//! on a Dockerfile that copies the same packages, extracted, from a local directory (one
//! `COPY` per package, so one layer each as imgbuild's), with a fresh storage root for every
//! builder; its registry bytes are what the registry sent for blobs (its log) plus what its
//! storage grew by.
//!
//! ```text
//! cargo run --release --example bench -- --fleet [--size-gb N] [--no-buildah]
//!     [--imgbuild PATH] [--label TEXT] [--out FILE]
//! ```

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

use super::node::LoggingRegistry;

struct Args {
    imgbuild: PathBuf,
    size_gb: f64,
    buildah: bool,
    label: String,
    out: Option<PathBuf>,
}

fn parse_args(args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let mut parsed = Args {
        imgbuild: super::default_imgbuild(),
        size_gb: 1.0,
        buildah: true,
        label: "fleet (this checkout)".to_string(),
        out: None,
    };
    let mut args = args;
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().with_context(|| format!("{arg} {what}"));
        match arg.as_str() {
            "--fleet" => {}
            "--imgbuild" => parsed.imgbuild = value("PATH")?.into(),
            "--out" => parsed.out = Some(value("FILE")?.into()),
            "--label" => parsed.label = value("TEXT")?,
            "--size-gb" => parsed.size_gb = value("N")?.parse()?,
            "--no-buildah" => parsed.buildah = false,
            other => bail!(
                "unknown argument `{other}` (--fleet [--size-gb N] [--no-buildah] \
                 [--imgbuild PATH] [--label TEXT] [--out FILE])"
            ),
        }
    }
    ensure!(parsed.size_gb > 0.0, "--size-gb must be positive");
    ensure!(
        parsed.imgbuild.is_file(),
        "{} not found: run `cargo build --release` first",
        parsed.imgbuild.display()
    );
    Ok(parsed)
}

/// One builder's run: what it took and moved.
struct Row {
    case: &'static str,
    wall: f64,
    /// Package archive bytes checked and extracted.
    extracted: u64,
    /// Layer bytes this builder compressed itself.
    compressed: u64,
    /// Bytes to and from the registry: cache downloads, cache uploads, push uploads.
    moved: u64,
    /// The image's layer bytes.
    image: u64,
    digest: String,
}

pub(super) fn run(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let args = parse_args(args)?;
    let work = super::work_dir()?;
    let channel = super::synthetic::prepare_channel(&work, args.size_gb, 1)?;
    let extra = prepare_changed(&work, args.size_gb)?;
    let run_dir = work.join("fleet-run");
    if run_dir.exists() {
        fs_err::remove_dir_all(&run_dir)?;
    }
    fs_err::create_dir_all(&run_dir)?;
    let registry = LoggingRegistry::start(&run_dir.join("registry"))?;
    let same = super::synthetic::recipe(&channel, "zstd")?;
    let changed = changed_recipe(&extra, &channel)?;

    let mut rows = Vec::new();
    let cold = Builder::new(&run_dir, "cold", &same)?;
    rows.push(cold.build(&args, &registry, "cold: empty registry cache", &[])?);
    let fresh = Builder::new(&run_dir, "fresh", &same)?;
    fs_err::copy(cold.lock(), fresh.lock())?;
    rows.push(fresh.build(&args, &registry, "fresh builder, no change", &["--locked"])?);
    let one = Builder::new(&run_dir, "changed", &changed)?;
    rows.push(one.build(&args, &registry, "fresh builder, one package changed", &[])?);
    ensure!(
        rows[0].digest == rows[1].digest,
        "the fresh builder's image {} is not the cold one's {}",
        rows[1].digest,
        rows[0].digest
    );

    let fleet = super::shards::Fleet {
        imgbuild: &args.imgbuild,
        run_dir: &run_dir,
        registry: &registry,
    };
    let matrix = super::shards::run(&fleet, &work, &channel, args.size_gb)?;

    let buildah = if args.buildah {
        Some(buildah_rows(&run_dir, &registry, &channel, &extra)?)
    } else {
        None
    };
    let report = render(&args, &rows, buildah.as_deref())? + &matrix;
    println!("{report}");
    if let Some(out) = &args.out {
        super::replace_section(out, &args.label, &report)?;
    }
    Ok(())
}

/// A channel holding `synth19` 1.1: the environment's smallest package, changed.
fn prepare_changed(work: &Path, size_gb: f64) -> anyhow::Result<PathBuf> {
    let channel = work.join(format!("fleet-changed-v1-{size_gb}gb"));
    let done = channel.join(".complete");
    if done.exists() {
        return Ok(channel);
    }
    let linux64 = super::empty_channel(&channel)?;
    let staging = tempfile::tempdir_in(work)?;
    let bytes = super::synthetic::package_bytes((size_gb * 1e9) as u64, 19);
    let mut rng = super::synthetic::Rng(0xf1ee7);
    super::synthetic::write_files(staging.path(), "synth19", &mut rng, bytes)?;
    super::write_conda(staging.path(), &linux64, "synth19", "1.1", &[])?;
    super::channel::index_channel(&channel)?;
    fs_err::write(&done, "")?;
    Ok(channel)
}

/// The synthetic recipe with `synth19` 1.1 from `extra` (first, so it is the one found).
fn changed_recipe(extra: &Path, channel: &Path) -> anyhow::Result<String> {
    let url = |dir: &Path| {
        url::Url::from_directory_path(dir)
            .map_err(|()| anyhow::anyhow!("{} is not absolute", dir.display()))
    };
    let same = super::synthetic::recipe(channel, "zstd")?;
    let channels = format!("channels = [\"{}\", \"{}\"]", url(extra)?, url(channel)?);
    let replaced = same
        .lines()
        .map(|line| match line {
            l if l.starts_with("channels = ") => channels.clone(),
            l => l.replace("\"synth19\"", "\"synth19 1.1\""),
        })
        .collect::<Vec<_>>()
        .join("\n");
    Ok(replaced + "\n")
}

/// A fresh builder: its own directory, recipe and empty cache.
struct Builder {
    dir: PathBuf,
    name: &'static str,
}

impl Builder {
    fn new(run_dir: &Path, name: &'static str, recipe: &str) -> anyhow::Result<Builder> {
        let dir = run_dir.join(name);
        fs_err::create_dir_all(dir.join("recipes"))?;
        fs_err::write(dir.join("recipes/image.toml"), recipe)?;
        Ok(Builder { dir, name })
    }

    fn lock(&self) -> PathBuf {
        self.dir.join("recipes/image.lock")
    }

    /// `build --json --cache-repo … --push …`, timed; what its events say it did.
    fn build(
        &self,
        args: &Args,
        registry: &LoggingRegistry,
        case: &'static str,
        extra: &[&str],
    ) -> anyhow::Result<Row> {
        super::sync_and_settle();
        let cache_repo = format!("{}/ci/imgbuild-cache", registry.host);
        let target = format!("{}/ml/{}:v1", registry.host, self.name);
        eprintln!("fleet: {case}");
        let started = Instant::now();
        let output = Command::new(&args.imgbuild)
            .current_dir(&self.dir)
            .env("IMGBUILD_CACHE_DIR", self.dir.join("cache"))
            .env("IMGBUILD_CACHE_KEY_FILE", self.dir.join("state/cache-key"))
            .env("DOCKER_CONFIG", self.dir.join("docker"))
            .env("REGISTRY_AUTH_FILE", self.dir.join("docker/auth.json"))
            .args(["--insecure", "build", "recipes/image.toml", "--json"])
            .args(["--cache-repo", &cache_repo, "--push", &target])
            .args(extra)
            .stderr(Stdio::inherit())
            .output()
            .context("starting imgbuild")?;
        let wall = started.elapsed().as_secs_f64();
        ensure!(output.status.success(), "imgbuild build ({case}) failed");
        let events: Vec<Value> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let find = |wanted: &dyn Fn(&Value) -> bool| {
            events
                .iter()
                .find(|e| wanted(e))
                .cloned()
                .with_context(|| format!("an event missing from the {case} build"))
        };
        let result = find(&|e| e["event"] == "result")?;
        let push = find(&|e| e["event"] == "push")?;
        let install = find(&|e| e["event"] == "stage-finished" && e["stage"] == "install")?;
        let number = |v: &Value| v.as_u64().unwrap_or(0);
        let shared = &result["cache_repo"];
        Ok(Row {
            case,
            wall,
            extracted: number(&install["package_bytes"]),
            compressed: number(&result["written_size"]),
            moved: number(&shared["bytes_downloaded"])
                + number(&shared["bytes_uploaded"])
                + number(&push["bytes_uploaded"]),
            image: number(&result["compressed_size"]),
            digest: result["digest"].as_str().unwrap_or_default().to_string(),
        })
    }
}

// --- buildah --------------------------------------------------------------------------------

/// buildah's three cases: the packages of `channel` (and of `extra` for the change)
/// extracted into a build context, one `COPY` each.
fn buildah_rows(
    run_dir: &Path,
    registry: &LoggingRegistry,
    channel: &Path,
    extra: &Path,
) -> anyhow::Result<Vec<Row>> {
    ensure!(
        Command::new("buildah")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "buildah is needed (apt-get install buildah), or pass --no-buildah"
    );
    let context = run_dir.join("buildah-context");
    let mut packages = Vec::new();
    for package in conda_packages(&channel.join("linux-64"))? {
        packages.push(extract(&package, &context)?);
    }
    let changed = conda_packages(&extra.join("linux-64"))?;
    let changed = extract(changed.first().context("the changed package")?, &context)?;
    let dockerfile = |packages: &[String]| {
        let mut text = "FROM scratch\n".to_string();
        for package in packages {
            let _ = writeln!(text, "COPY {package}/ /opt/conda/");
        }
        text
    };
    fs_err::write(context.join("Dockerfile.same"), dockerfile(&packages))?;
    let mut with_change = packages.clone();
    if let Some(last) = with_change.iter_mut().find(|p| p.starts_with("synth19-")) {
        *last = changed;
    }
    fs_err::write(context.join("Dockerfile.changed"), dockerfile(&with_change))?;
    Ok(vec![
        buildah_build(run_dir, registry, "cold: empty registry cache", "same", 0)?,
        buildah_build(run_dir, registry, "fresh builder, no change", "same", 1)?,
        buildah_build(
            run_dir,
            registry,
            "fresh builder, one package changed",
            "changed",
            2,
        )?,
    ])
}

fn conda_packages(subdir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut packages: Vec<PathBuf> = fs_err::read_dir(subdir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "conda"))
        .collect();
    packages.sort();
    Ok(packages)
}

/// `package` extracted under `context`, without its `info/`; the directory's name.
fn extract(package: &Path, context: &Path) -> anyhow::Result<String> {
    let name = package
        .file_stem()
        .and_then(|s| s.to_str())
        .context("package name")?
        .to_string();
    let dir = context.join(&name);
    if !dir.exists() {
        rattler_package_streaming::fs::extract(package, &dir)?;
        fs_err::remove_dir_all(dir.join("info"))?;
    }
    Ok(name)
}

/// One buildah builder: a fresh storage root, `bud --layers` with the registry cache, then a
/// push; registry bytes from its log (sent) and its storage (grown).
fn buildah_build(
    run_dir: &Path,
    registry: &LoggingRegistry,
    case: &'static str,
    dockerfile: &str,
    index: usize,
) -> anyhow::Result<Row> {
    let root = run_dir.join(format!("buildah-{index}"));
    let storage = [
        "--root".to_string(),
        root.join("root").display().to_string(),
        "--runroot".to_string(),
        root.join("run").display().to_string(),
        "--storage-driver".to_string(),
        "overlay".to_string(),
    ];
    let cache = format!("{}/ci/buildah-cache", registry.host);
    let target = format!("docker://{}/ml/buildah-{index}:v1", registry.host);
    let context = run_dir.join("buildah-context");
    super::sync_and_settle();
    let mark = registry.mark();
    let stored_before = dir_bytes(&run_dir.join("registry/data"));
    eprintln!("fleet, buildah: {case}");
    let started = Instant::now();
    let image = format!("localhost/fleet-{index}:v1");
    super::run_quiet(
        Command::new("buildah")
            .args(&storage)
            .args(["bud", "--layers", "--tls-verify=false"])
            .args(["--cache-to", &cache, "--cache-from", &cache])
            .args(["-f", &format!("Dockerfile.{dockerfile}"), "-t", &image])
            .arg(&context),
    )?;
    super::run_quiet(Command::new("buildah").args(&storage).args([
        "push",
        "--tls-verify=false",
        &image,
        &target,
    ]))?;
    let wall = started.elapsed().as_secs_f64();
    let (sent, _) = registry.sent_since(mark)?;
    let grown = dir_bytes(&run_dir.join("registry/data")).saturating_sub(stored_before);
    let _ = fs_err::remove_dir_all(&root);
    Ok(Row {
        case,
        wall,
        extracted: 0,
        compressed: 0,
        moved: sent + grown,
        image: 0,
        digest: String::new(),
    })
}

/// Bytes of the regular files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

// --- the report -----------------------------------------------------------------------------

pub(super) fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

fn render(args: &Args, rows: &[Row], buildah: Option<&[Row]>) -> anyhow::Result<String> {
    let mut out = format!(
        "### {} ({:.2} GB synthetic environment, zstd)\n\n{}\n\n\
         | builder | case | seconds | ÷ cold | package MB extracted | MB compressed | \
         registry MB moved | ÷ image |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
        args.label,
        args.size_gb,
        super::machine()?
    );
    let image = rows.first().map_or(1, |r| r.image.max(1));
    let cold = rows.first().map_or(1.0, |r| r.wall);
    for row in rows {
        let _ = writeln!(
            out,
            "| imgbuild | {} | {:.2} | {:.3} | {} | {} | {} | {:.3} |",
            row.case,
            row.wall,
            row.wall / cold,
            mb(row.extracted),
            mb(row.compressed),
            mb(row.moved),
            row.moved as f64 / image as f64
        );
    }
    if let Some(buildah) = buildah {
        let cold = buildah.first().map_or(1.0, |r| r.wall);
        for row in buildah {
            let _ = writeln!(
                out,
                "| buildah | {} | {:.2} | {:.3} | | | {} | {:.3} |",
                row.case,
                row.wall,
                row.wall / cold,
                mb(row.moved),
                row.moved as f64 / image as f64
            );
        }
    }
    let _ = writeln!(
        out,
        "\nImage (imgbuild): {} MB of layers, `{}`.\n",
        mb(image),
        rows.first()
            .map_or("", |r| r.digest.get(..19).unwrap_or(&r.digest))
    );
    Ok(out)
}
