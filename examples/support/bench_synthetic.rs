//! `bench --synthetic`: an offline bench (issue 32) that needs no network, so the same run
//! works on a 2-core laptop and on a 16-core GPU host. It makes a deterministic conda
//! environment of about 20 packages from a seeded PRNG, with real-world compressibility (a
//! mix of incompressible, text-like and binary-like bytes), as a local `file://` channel,
//! primes the package cache with one build, then times a warm build for each `-j` as a child
//! pinned to that many CPUs, for zstd and gzip: wall time, peak RSS (`wait4`'s `ru_maxrss`)
//! and the CPU floor (user + system CPU seconds ÷ cores).
//!
//! ```text
//! cargo run --release --example bench -- --synthetic [--jobs 2,4,8,16,64] [--size-gb N]
//!     [--seed S] [--compressions zstd,gzip] [--imgbuild PATH] [--label TEXT] [--out FILE]
//! ```

use std::{
    fmt::Write as _,
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, bail, ensure};

/// How many packages the environment has.
const PACKAGES: usize = 20;
/// Bytes are generated in pieces of this size, each of one kind.
const PIECE: usize = 256 << 10;
/// Bump when the generated packages change, so old ones are not reused.
const SYNTHETIC_VERSION: &str = "s2";

struct Args {
    imgbuild: PathBuf,
    jobs: Vec<usize>,
    size_gb: f64,
    seed: u64,
    label: String,
    out: Option<PathBuf>,
    /// zstd and gzip unless `--compressions` names others (estargz, zstd:chunked).
    compressions: Vec<String>,
}

fn parse_args(args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let mut parsed = Args {
        imgbuild: super::default_imgbuild(),
        jobs: vec![2, 4, 8, 16, 64],
        size_gb: 2.6,
        seed: 1,
        label: "synthetic (this checkout)".to_string(),
        out: None,
        compressions: vec!["zstd".to_string(), "gzip".to_string()],
    };
    let mut args = args;
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().with_context(|| format!("{arg} {what}"));
        match arg.as_str() {
            "--synthetic" => {}
            "--imgbuild" => parsed.imgbuild = value("PATH")?.into(),
            "--out" => parsed.out = Some(value("FILE")?.into()),
            "--label" => parsed.label = value("TEXT")?,
            "--seed" => parsed.seed = value("S")?.parse()?,
            "--size-gb" => parsed.size_gb = value("N")?.parse()?,
            "--jobs" => parsed.jobs = parse_jobs(&value("LIST")?)?,
            "--compressions" => {
                parsed.compressions = value("LIST")?.split(',').map(str::to_string).collect();
            }
            other => bail!(
                "unknown argument `{other}` (--synthetic [--jobs LIST] [--size-gb N] [--seed S] \
                 [--compressions LIST] [--imgbuild PATH] [--label TEXT] [--out FILE])"
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

fn parse_jobs(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut jobs = list
        .split(',')
        .map(|j| j.trim().parse::<usize>().context("--jobs 2,4,8"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    ensure!(
        jobs.iter().all(|&j| j > 0),
        "--jobs values must be positive"
    );
    jobs.sort_unstable();
    jobs.dedup();
    Ok(jobs)
}

/// Runs the synthetic bench with the command line's arguments.
pub(super) fn run(args: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let args = parse_args(args)?;
    let work = super::work_dir()?;
    let channel = prepare_channel(&work, args.size_gb, args.seed)?;
    let run_dir = work.join("synthetic-run");
    if run_dir.exists() {
        fs_err::remove_dir_all(&run_dir)?;
    }
    fs_err::create_dir_all(run_dir.join("recipes"))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut report = format!(
        "### {} ({:.2} GB synthetic, seed {}, {} cores here)\n\n{}\n\n",
        args.label,
        args.size_gb,
        args.seed,
        cores,
        super::machine()?
    );
    for compression in &args.compressions {
        let rows = measure(&args, &channel, &run_dir, compression, cores)?;
        report += &render(compression, &rows);
    }
    println!("{report}");
    if let Some(out) = &args.out {
        super::replace_section(out, &args.label, &report)?;
    }
    Ok(())
}

// --- the environment ----------------------------------------------------------------------

/// splitmix64: small, fast and the same on every machine.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: &[&str] = &[
    "def", "return", "self", "import", "tensor", "cuda", "device", "float", "int", "None", "class",
    "for", "in", "if", "else", "torch", "numpy", "array", "shape", "dtype", "kernel", "__init__",
    "lambda", "yield", "assert", "module", "weight", "bias", "grad", "optim",
];

/// One piece of `len` bytes: incompressible (as compressed weights or archives), text-like
/// (source, metadata) or binary-like (code and tables: small values, runs, repeats).
fn piece(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    match rng.below(10) {
        0..=3 => {
            while out.len() < len {
                out.extend_from_slice(&rng.next().to_le_bytes());
            }
        }
        4..=6 => {
            while out.len() < len {
                out.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
                out.push(if rng.below(8) == 0 { b'\n' } else { b' ' });
            }
        }
        _ => {
            while out.len() < len {
                let word = rng.next();
                match word % 4 {
                    0 => out.extend_from_slice(&[0; 8]),
                    1 => out.extend_from_slice(&(word >> 40).to_le_bytes()),
                    _ => out.extend_from_slice(&((word >> 56) as u32 * 4).to_le_bytes()),
                }
            }
        }
    }
    out.truncate(len);
    out
}

/// Bytes of package `index`: one large package (the "torch" of the environment) and a tail
/// of smaller ones, as a real ML environment has.
pub(super) fn package_bytes(total: u64, index: usize) -> u64 {
    let weight = |i: usize| 1.0 / (i as f64 + 1.0).powf(1.3);
    let sum: f64 = (0..PACKAGES).map(weight).sum();
    (total as f64 * weight(index) / sum) as u64
}

/// Writes `bytes` of generated data into `dir` as a few files of package `name` (paths of
/// its own: packages may not share a file).
pub(super) fn write_files(dir: &Path, name: &str, rng: &mut Rng, bytes: u64) -> anyhow::Result<()> {
    let lib = dir.join("lib");
    fs_err::create_dir_all(&lib)?;
    let files = 1 + bytes / (64 << 20);
    for file in 0..files {
        let size = bytes / files;
        let mut out = std::io::BufWriter::new(fs_err::File::create(
            lib.join(format!("lib{name}_part{file}.so")),
        )?);
        let mut left = size as usize;
        while left > 0 {
            let len = left.min(PIECE);
            out.write_all(&piece(rng, len))?;
            left -= len;
        }
        out.flush()?;
    }
    Ok(())
}

/// Makes (once per size and seed) the channel of generated packages.
pub(super) fn prepare_channel(work: &Path, size_gb: f64, seed: u64) -> anyhow::Result<PathBuf> {
    let channel = work.join(format!(
        "synthetic-{SYNTHETIC_VERSION}-{size_gb}gb-seed{seed}"
    ));
    let done = channel.join(".complete");
    if done.exists() {
        return Ok(channel);
    }
    let linux64 = super::empty_channel(&channel)?;
    let total = (size_gb * 1e9) as u64;
    let mut rng = Rng(seed);
    for index in 0..PACKAGES {
        let name = format!("synth{index:02}");
        eprintln!("generating {name}");
        let staging = tempfile::tempdir_in(work)?;
        write_files(staging.path(), &name, &mut rng, package_bytes(total, index))?;
        super::write_conda(staging.path(), &linux64, &name, "1.0", &[])?;
    }
    super::channel::index_channel(&channel)?;
    fs_err::write(&done, "")?;
    Ok(channel)
}

// --- the measurements ---------------------------------------------------------------------

/// One warm build: `-j`, the CPUs it was pinned to, wall and CPU seconds, peak RSS and the
/// image's digest.
struct Row {
    jobs: usize,
    cpus: usize,
    wall: f64,
    cpu: f64,
    rss_mb: f64,
    digest: String,
}

pub(super) fn recipe(channel: &Path, compression: &str) -> anyhow::Result<String> {
    let url = url::Url::from_directory_path(channel)
        .map_err(|()| anyhow::anyhow!("{} is not absolute", channel.display()))?;
    let names: Vec<String> = (0..PACKAGES).map(|i| format!("\"synth{i:02}\"")).collect();
    Ok(format!(
        "[image]\nname = \"synthetic\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"{url}\"]\ndependencies = [{}]\n\n\
         [layers]\ncompression = \"{compression}\"\n",
        names.join(", ")
    ))
}

/// Primes the package cache with one build, then a warm build (layer cache and image gone)
/// for each `-j`.
fn measure(
    args: &Args,
    channel: &Path,
    run_dir: &Path,
    compression: &str,
    cores: usize,
) -> anyhow::Result<Vec<Row>> {
    fs_err::write(
        run_dir.join("recipes/image.toml"),
        recipe(channel, compression)?,
    )?;
    let cache = run_dir.join("cache");
    eprintln!("priming the cache ({compression})");
    timed_build(args, run_dir, &cache, cores, cores)?;
    let mut rows = Vec::new();
    for &jobs in &args.jobs {
        let cpus = jobs.min(cores);
        eprintln!("warm build, {compression}, -j {jobs} on {cpus} CPUs");
        rows.push(timed_build(args, run_dir, &cache, jobs, cpus)?);
    }
    Ok(rows)
}

/// One build with the layer cache and the image removed first, as a child pinned to the
/// first `cpus` CPUs.
fn timed_build(
    args: &Args,
    run_dir: &Path,
    cache: &Path,
    jobs: usize,
    cpus: usize,
) -> anyhow::Result<Row> {
    for gone in [cache.join("layers"), run_dir.join("images")] {
        if gone.exists() {
            fs_err::remove_dir_all(&gone)?;
        }
    }
    super::sync_and_settle();
    let mut command = Command::new(&args.imgbuild);
    command
        .current_dir(run_dir)
        .args(["build", "recipes/image.toml", "--jobs", &jobs.to_string()])
        .arg("--cache-dir")
        .arg(cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    pin_to(&mut command, cpus);
    let started = Instant::now();
    let child = command.spawn().context("starting imgbuild")?;
    let (status, usage) = wait4(child.id())?;
    let wall = started.elapsed().as_secs_f64();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.context("stdout")?, &mut stdout)?;
    ensure!(
        status == 0,
        "imgbuild build -j {jobs} failed (wait status {status})"
    );
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Row {
        jobs,
        cpus,
        wall,
        cpu: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        rss_mb: usage.ru_maxrss as f64 * 1024.0 / 1e6,
        digest: stdout
            .lines()
            .next()
            .and_then(|line| line.rsplit_once('@'))
            .map_or_else(String::new, |(_, digest)| digest.to_string()),
    })
}

/// Pins the child to CPUs `0..cpus` before it runs, so `-j` N has N cores and no more.
fn pin_to(command: &mut Command, cpus: usize) {
    // SAFETY: between fork and exec only async-signal-safe calls run: the set is built on
    // the stack and sched_setaffinity is a system call.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for cpu in 0..cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Waits for the child `pid` and returns its wait status and resource usage (the peak RSS
/// is the child's own, not this process's).
pub(super) fn wait4(pid: u32) -> anyhow::Result<(i32, libc::rusage)> {
    let mut status = 0;
    // SAFETY: rusage is plain data, zeroed is a valid value; wait4 writes both out-params.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    ensure!(
        reaped == pid as libc::pid_t,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    Ok((status, usage))
}

fn render(compression: &str, rows: &[Row]) -> String {
    let mut out = format!(
        "{compression}, warm build:\n\n| -j | cores | seconds | peak RSS MB | speedup vs -j {} | \
         wall ÷ CPU floor | manifest digest |\n|---:|---:|---:|---:|---:|---:|---|\n",
        rows.first().map_or(0, |r| r.jobs)
    );
    let base = rows.first().map_or(1.0, |r| r.wall);
    for row in rows {
        let floor = row.cpu / row.cpus as f64;
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.0} | {:.2} × | {:.2} | `{}` |",
            row.jobs,
            row.cpus,
            row.wall,
            row.rss_mb,
            base / row.wall,
            row.wall / floor,
            short(&row.digest)
        );
    }
    out.push('\n');
    out
}

fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}
