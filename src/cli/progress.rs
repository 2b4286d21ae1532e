//! Build progress: indicatif bars on a terminal, plain lines otherwise, nothing with
//! `--quiet`, and one JSON event per line on stdout with `--json`.
//!
//! JSON events (all have `event`):
//! - `{"event":"pull-started","reference":"…","platform":"linux/amd64","blobs":3,"bytes":123}`
//!   and `{"event":"pull-finished","reference":…,"platform":…,"seconds":…,"blobs":3,
//!   "downloaded_blobs":2,"downloaded_bytes":120}`, for each registry base, before the stages
//! - `{"event":"stage-started","stage":"solve|install|layers|write","detail":"…"}`
//! - `{"event":"stage-finished","stage":…,"ok":true,"seconds":1.25,"items":5,"bytes":123,"downloaded_bytes":0}`
//!   (`items`: packages linked or layers written; `bytes`: compressed layer bytes); the
//!   install stage's also has `package_bytes` (package archives checked and extracted; the
//!   solve stage's too, of the conda packages the PyPI resolution reads), the
//!   solve stage's `pypi_projects`, `pypi_metadata`, `pypi_metadata_bytes`, `pypi_wheels`,
//!   `pypi_wheel_bytes`, `pypi_local_wheels` and `pypi_local_wheel_bytes` (index pages read;
//!   metadata read without its wheel, from the index or by range requests, and the bytes that
//!   took; wheels the resolution downloaded whole; wheels it read from `file://` sources)
//! - `{"event":"warning","message":"…"}`
//! - `{"event":"lock","path":"…","outcome":"reused|written","reason":null,"packages":5}`
//! - `{"event":"result",…}` (see [`result_event`]) or `{"event":"error","message":"…","exit_code":1}`
//! - with `build --push`, after the result: `{"event":"push","pushed":"REF@sha256:…","digest":…,
//!   "blobs_total":…,"blobs_uploaded":…,"blobs_mounted":…,"bytes_uploaded":…,"requests":…,
//!   "retries":…,"sboms":[…],"sboms_found_by":…}`

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use crate::{
    build::{BuildReport, LockOutcome, LockReport, Reporter, Stage, counted},
    report::Progress,
};

use super::printer::{Printer, ProgressMode, human_bytes};

#[derive(Default)]
struct Current {
    stage: Option<(Stage, Instant)>,
    /// What the stage's first line said (`1 dependency for linux-64`).
    detail: String,
    bar: Option<ProgressBar>,
    items: usize,
    bytes: u64,
    downloaded: u64,
    /// Package archive bytes checked and extracted, of `archive_total` (install).
    archived: u64,
    archive_total: u64,
    /// When the archives of the platform being installed started to be read, until its
    /// packages are linked.
    archives_since: Option<Instant>,
    pypi: PypiCounts,
}

/// What the PyPI resolution read (solve).
#[derive(Default)]
struct PypiCounts {
    projects: usize,
    metadata: usize,
    metadata_bytes: u64,
    wheels: usize,
    wheel_bytes: u64,
    /// Wheels read from a `file://` find-links directory or index, not downloaded.
    local_wheels: usize,
    local_wheel_bytes: u64,
    /// Bytes received of the wheels being downloaded (or copied, for local ones).
    received: u64,
}

/// A base image being pulled.
struct BasePull {
    reference: String,
    platform: String,
    started: Instant,
    bar: Option<ProgressBar>,
    blobs: usize,
    done: usize,
    downloaded_blobs: usize,
    downloaded: u64,
}

/// The build's [`Reporter`] for the command line.
pub(crate) struct BuildProgress {
    printer: Printer,
    mode: ProgressMode,
    current: Mutex<Current>,
    pull: Mutex<Option<BasePull>>,
}

impl BuildProgress {
    pub(crate) fn new(printer: &Printer) -> Self {
        BuildProgress {
            printer: *printer,
            mode: printer.progress_mode(),
            current: Mutex::default(),
            pull: Mutex::default(),
        }
    }

    /// Ends the running stage once the build returned; `ok` is whether it succeeded (a
    /// failed stage gets no "done" line, and `"ok": false` in its JSON event).
    pub(crate) fn finish(&self, ok: bool) {
        // A pull that failed leaves its bar.
        if let Some(bar) = self.pull().take().and_then(|p| p.bar) {
            bar.finish_and_clear();
        }
        let mut current = self
            .current
            .lock()
            .expect("no panics while holding the lock");
        self.finish_stage(&mut current, ok);
    }

    fn finish_stage(&self, current: &mut Current, ok: bool) {
        let Some((stage, started)) = current.stage.take() else {
            return;
        };
        let elapsed = started.elapsed();
        if let Some(bar) = current.bar.take() {
            bar.finish_and_clear();
        }
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Plain | ProgressMode::Bars if !ok => {}
            ProgressMode::Json => self
                .printer
                .event(&finished_event(stage, ok, elapsed, current)),
            ProgressMode::Plain | ProgressMode::Bars => {
                self.end_archives(current);
                if stage == Stage::Solve
                    && let Some(read) = pypi_read(&current.pypi)
                {
                    self.printer.status("Fetched", read);
                }
                let (done, what) = match stage {
                    Stage::Solve => ("Solved", String::new()),
                    Stage::Install if current.downloaded > 0 => (
                        "Installed",
                        format!(
                            "{} ({} downloaded) ",
                            counted(current.items, "package"),
                            human_bytes(current.downloaded)
                        ),
                    ),
                    Stage::Install => (
                        "Installed",
                        format!("{} ", counted(current.items, "package")),
                    ),
                    Stage::Layers => (
                        "Wrote",
                        format!(
                            "{} ({} compressed) ",
                            counted(current.items, "layer"),
                            human_bytes(current.bytes)
                        ),
                    ),
                    Stage::Write => ("Committed", String::new()),
                };
                let took = elapsed.as_secs_f64();
                self.printer
                    .status(done, format_args!("{what}in {took:.2}s"));
            }
        }
        *current = Current::default();
    }
}

/// The `stage-finished` event of `stage`: what every stage counts, and what the install and
/// the solve count of their own.
fn finished_event(stage: Stage, ok: bool, elapsed: Duration, current: &Current) -> Value {
    let mut event = json!({
        "event": "stage-finished",
        "stage": stage.name(),
        "ok": ok,
        "seconds": round(elapsed),
        "items": current.items,
        "bytes": current.bytes,
        "downloaded_bytes": current.downloaded,
    });
    match stage {
        Stage::Install => event["package_bytes"] = json!(current.archived),
        Stage::Solve => {
            event["package_bytes"] = json!(current.archived);
            let pypi = &current.pypi;
            event["pypi_projects"] = json!(pypi.projects);
            event["pypi_metadata"] = json!(pypi.metadata);
            event["pypi_metadata_bytes"] = json!(pypi.metadata_bytes);
            event["pypi_wheels"] = json!(pypi.wheels);
            event["pypi_wheel_bytes"] = json!(pypi.wheel_bytes);
            event["pypi_local_wheels"] = json!(pypi.local_wheels);
            event["pypi_local_wheel_bytes"] = json!(pypi.local_wheel_bytes);
        }
        Stage::Layers | Stage::Write => {}
    }
    event
}

/// `3 PyPI projects, 2 metadata files and 1 wheel (2.0 MiB)`: what the resolution read,
/// `None` when it read nothing.
fn pypi_read(pypi: &PypiCounts) -> Option<String> {
    if pypi.projects == 0 && pypi.wheels == 0 && pypi.local_wheels == 0 {
        return None;
    }
    // A find-links directory has no project pages: nothing to count there.
    let mut parts = Vec::new();
    if pypi.projects > 0 {
        parts.push(counted(pypi.projects, "PyPI project"));
    }
    if pypi.metadata > 0 {
        parts.push(counted(pypi.metadata, "metadata file"));
    }
    if pypi.wheels > 0 {
        parts.push(format!(
            "{} ({})",
            counted(pypi.wheels, "wheel"),
            human_bytes(pypi.wheel_bytes)
        ));
    }
    if pypi.local_wheels > 0 {
        parts.push(format!(
            "{} read ({})",
            counted(pypi.local_wheels, "local wheel"),
            human_bytes(pypi.local_wheel_bytes)
        ));
    }
    let last = parts.pop().expect("one at least");
    Some(match parts.is_empty() {
        true => last,
        false => format!("{} and {last}", parts.join(", ")),
    })
}

fn round(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1000.0).round() / 1000.0
}

fn verb(stage: Stage) -> &'static str {
    match stage {
        Stage::Solve => "Solving",
        Stage::Install => "Installing",
        Stage::Layers => "Writing",
        Stage::Write => "Committing",
    }
}

impl Reporter for BuildProgress {
    fn on_stage(&self, stage: Stage, detail: &str) {
        let mut current = self
            .current
            .lock()
            .expect("no panics while holding the lock");
        self.finish_stage(&mut current, true);
        current.stage = Some((stage, Instant::now()));
        current.detail = detail.to_string();
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Json => self.printer.event(&json!({
                "event": "stage-started",
                "stage": stage.name(),
                "detail": detail,
            })),
            ProgressMode::Plain => self.printer.status(verb(stage), detail),
            ProgressMode::Bars => {
                let bar = ProgressBar::new_spinner();
                bar.set_style(spinner_style());
                bar.set_prefix(verb(stage));
                bar.set_message(detail.to_string());
                bar.enable_steady_tick(Duration::from_millis(100));
                current.bar = Some(bar);
            }
        }
    }

    fn on_stage_total(&self, stage: Stage, total: usize) {
        let mut current = self.current();
        // The packages are linked once their archives are through.
        if stage == Stage::Install {
            self.end_archives(&mut current);
        }
        if let Some(bar) = &current.bar {
            bar.set_style(bar_style("{pos}/{len}"));
            bar.set_length(total as u64);
            bar.set_position(current.items as u64);
        }
        set_message(&current, stage);
    }

    fn on_download_bytes(&self, bytes: u64) {
        let mut current = self.current();
        current.downloaded += bytes;
        set_message(&current, current_stage(&current));
    }

    fn on_progress(&self, progress: Progress<'_>) {
        match progress {
            Progress::PackageBytesTotal(bytes) => self.archive_total(bytes),
            Progress::PackageBytes(bytes) => {
                let mut current = self.current();
                current.archived += bytes;
                if let Some(bar) = &current.bar {
                    bar.set_position(current.archived);
                }
            }
            Progress::PullStarted {
                reference,
                platform,
                blobs,
                bytes,
            } => self.pull_started(reference, platform, blobs, bytes),
            Progress::PullBytes(bytes) => {
                if let Some(pull) = self.pull().as_mut() {
                    pull.downloaded += bytes;
                    if let Some(bar) = &pull.bar {
                        bar.inc(bytes);
                    }
                }
            }
            Progress::PullBlob { bytes, downloaded } => self.pull_blob(bytes, downloaded),
            Progress::PullFinished => self.pull_finished(),
            Progress::PypiProject(_)
            | Progress::PypiMetadata { .. }
            | Progress::PypiBytes(_)
            | Progress::PypiWheel { .. } => self.pypi(progress),
        }
    }

    fn on_item_done(&self, stage: Stage, _name: &str, bytes: u64) {
        let mut current = self.current();
        current.items += 1;
        current.bytes += bytes;
        if let Some(bar) = &current.bar {
            bar.inc(1);
        }
        if stage == Stage::Layers {
            set_message(&current, stage);
        }
    }

    fn on_warning(&self, message: &str) {
        if self.mode == ProgressMode::Json {
            self.printer.warning(message);
            return;
        }
        let current = self
            .current
            .lock()
            .expect("no panics while holding the lock");
        match &current.bar {
            Some(bar) => bar.suspend(|| self.printer.warning(message)),
            None => self.printer.warning(message),
        }
    }
}

/// The stage running, for a report that is not a stage's own (archive bytes come in the
/// install stage and, for the PyPI resolution, in the solve stage).
fn current_stage(current: &Current) -> Stage {
    current.stage.map_or(Stage::Install, |(stage, _)| stage)
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>12.bold} {spinner} {msg} {elapsed}")
        .expect("a valid template")
}

/// The bar of a stage that counts `unit` (`{pos}/{len}` items or `{binary_bytes}/…`).
fn bar_style(unit: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{{prefix:>12.bold}} [{{bar:30}}] {unit} {{msg}} {{elapsed}}"
    ))
    .expect("a valid template")
    .progress_chars("=> ")
}

const BYTES: &str = "{binary_bytes}/{binary_total_bytes}";

/// The words after the count of the stage's bar: what it counts, what was downloaded.
fn set_message(current: &Current, stage: Stage) {
    let Some(bar) = &current.bar else { return };
    let downloaded = match current.downloaded {
        0 => String::new(),
        bytes => format!(", {} downloaded", human_bytes(bytes)),
    };
    bar.set_message(match stage {
        Stage::Install if current.archives_since.is_some() => format!("extracted{downloaded}"),
        Stage::Solve if current.archives_since.is_some() => format!(
            "{}; conda packages extracted for the PyPI resolution{downloaded}",
            current.detail
        ),
        Stage::Install => format!("packages{downloaded}"),
        Stage::Layers if current.bytes > 0 => {
            format!("layers, {} compressed", human_bytes(current.bytes))
        }
        Stage::Layers => "layers".to_string(),
        Stage::Solve | Stage::Write => String::new(),
    });
}

impl BuildProgress {
    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current
            .lock()
            .expect("no panics while holding the lock")
    }

    fn pull(&self) -> std::sync::MutexGuard<'_, Option<BasePull>> {
        self.pull.lock().expect("no panics while holding the lock")
    }

    /// The archives of a platform's packages are about to be read: the bar counts their
    /// bytes until the packages are linked.
    fn archive_total(&self, bytes: u64) {
        let mut current = self.current();
        current.archive_total += bytes;
        current.archives_since.get_or_insert_with(Instant::now);
        if let Some(bar) = &current.bar {
            bar.set_style(bar_style(BYTES));
            bar.set_length(current.archive_total);
            bar.set_position(current.archived);
        }
        set_message(&current, current_stage(&current));
    }

    /// The archives are through: the plain line says how many bytes took how long.
    fn end_archives(&self, current: &mut Current) {
        if let Some(since) = current.archives_since.take()
            && self.mode == ProgressMode::Plain
        {
            self.printer.status(
                "Extracted",
                format_args!(
                    "{} of package archives in {:.2}s",
                    human_bytes(current.archived),
                    since.elapsed().as_secs_f64()
                ),
            );
        }
    }

    fn pypi(&self, progress: Progress<'_>) {
        let mut current = self.current();
        // The conda packages the resolution reads are through: the spinner is back.
        if current.archives_since.is_some() {
            self.end_archives(&mut current);
            if let Some(bar) = &current.bar {
                bar.set_style(spinner_style());
            }
        }
        let pypi = &mut current.pypi;
        match progress {
            Progress::PypiProject(_) => pypi.projects += 1,
            Progress::PypiMetadata { bytes, .. } => {
                pypi.metadata += 1;
                pypi.metadata_bytes += bytes;
            }
            Progress::PypiBytes(bytes) => pypi.received += bytes,
            Progress::PypiWheel {
                bytes, local: true, ..
            } => {
                pypi.local_wheels += 1;
                pypi.local_wheel_bytes += bytes;
            }
            Progress::PypiWheel { bytes, .. } => {
                pypi.wheels += 1;
                pypi.wheel_bytes += bytes;
            }
            _ => {}
        }
        if let Some(bar) = &current.bar {
            // Bytes of the wheels still downloading (received counts the finished too).
            let done = current.pypi.wheel_bytes + current.pypi.local_wheel_bytes;
            let received = match current.pypi.received.saturating_sub(done) {
                0 => String::new(),
                bytes => format!(", downloading {}", human_bytes(bytes)),
            };
            let read = pypi_read(&current.pypi).unwrap_or_default();
            bar.set_message(format!("{}; fetched {read}{received}", current.detail));
        }
    }

    fn pull_started(&self, reference: &str, platform: &str, blobs: usize, bytes: u64) {
        let what = format!("{reference} for {platform}");
        let bar = match self.mode {
            ProgressMode::Quiet => None,
            ProgressMode::Json => {
                self.printer.event(&json!({
                    "event": "pull-started",
                    "reference": reference,
                    "platform": platform,
                    "blobs": blobs,
                    "bytes": bytes,
                }));
                None
            }
            ProgressMode::Plain => {
                self.printer.status(
                    "Pulling",
                    format_args!("{what}: {}, {}", counted(blobs, "blob"), human_bytes(bytes)),
                );
                None
            }
            ProgressMode::Bars => {
                let bar = ProgressBar::new(bytes);
                bar.set_style(bar_style(BYTES));
                bar.set_prefix("Pulling");
                bar.set_message(format!("{what}, 0/{blobs} blobs"));
                bar.enable_steady_tick(Duration::from_millis(100));
                Some(bar)
            }
        };
        *self.pull() = Some(BasePull {
            reference: reference.to_string(),
            platform: platform.to_string(),
            started: Instant::now(),
            bar,
            blobs,
            done: 0,
            downloaded_blobs: 0,
            downloaded: 0,
        });
    }

    fn pull_blob(&self, bytes: u64, downloaded: bool) {
        let mut pull = self.pull();
        let Some(pull) = pull.as_mut() else { return };
        pull.done += 1;
        if downloaded {
            pull.downloaded_blobs += 1;
        }
        if let Some(bar) = &pull.bar {
            // A cached blob counts whole; a downloaded one counted its bytes as they came.
            if !downloaded {
                bar.inc(bytes);
            }
            bar.set_message(format!(
                "{} for {}, {}/{} blobs",
                pull.reference, pull.platform, pull.done, pull.blobs
            ));
        }
    }

    fn pull_finished(&self) {
        let Some(pull) = self.pull().take() else {
            return;
        };
        if let Some(bar) = &pull.bar {
            bar.finish_and_clear();
        }
        let seconds = pull.started.elapsed();
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Json => self.printer.event(&json!({
                "event": "pull-finished",
                "reference": pull.reference,
                "platform": pull.platform,
                "seconds": round(seconds),
                "blobs": pull.done,
                "downloaded_blobs": pull.downloaded_blobs,
                "downloaded_bytes": pull.downloaded,
            })),
            ProgressMode::Plain | ProgressMode::Bars => self.printer.status(
                "Pulled",
                format_args!(
                    "{} ({} downloaded) in {:.2}s",
                    counted(pull.done, "blob"),
                    match pull.downloaded_blobs {
                        0 => "none".to_string(),
                        n => format!("{n}, {}", human_bytes(pull.downloaded)),
                    },
                    seconds.as_secs_f64()
                ),
            ),
        }
    }
}

/// The lock event of `--json`.
pub(crate) fn lock_event(report: &LockReport) -> Value {
    let (outcome, reason) = match &report.outcome {
        LockOutcome::Reused => ("reused", None),
        LockOutcome::Written { reason } => ("written", reason.clone()),
        // Written too: only its `[[files]]` pins changed.
        LockOutcome::Repinned { reason } => ("written", Some(reason.clone())),
        LockOutcome::Updated { names, .. } => {
            ("written", Some(format!("--update {}", names.join(","))))
        }
    };
    let changes = match &report.outcome {
        LockOutcome::Updated { changes, .. } => json!(changes),
        _ => Value::Null,
    };
    json!({
        "event": "lock",
        "path": report.lock_path,
        "outcome": outcome,
        "reason": reason,
        "packages": report.packages,
        "changes": changes,
    })
}

/// The final event of a successful `build --json`: `images` (`LAYOUT:TAG@DIGEST`, one per
/// tag), `layout`, `tags`, `digest`, `layers` (all, base included), `base_layers`,
/// `new_layers` (ours, whether written or reused), `reused_layers` (taken from the layer
/// cache), `unchanged` (nothing rebuilt: same inputs as the image in place), `compressed_size` and `total_size` (uncompressed) of the new layers,
/// `packages`, `sboms` and `timings` (seconds per stage).
pub(crate) fn result_event(report: &BuildReport) -> Value {
    let compressed: u64 = report.layers.iter().map(|l| l.blob.size).sum();
    let uncompressed: u64 = report.layers.iter().map(|l| l.blob.tar_size).sum();
    let reused = report.layers.iter().filter(|l| l.reused).count();
    // What this build compressed itself: the layers it did not take from a cache.
    let written: u64 = report
        .layers
        .iter()
        .filter(|l| !l.reused)
        .map(|l| l.blob.size)
        .sum();
    let timings: serde_json::Map<String, Value> = report
        .timings
        .iter()
        .map(|(stage, time)| (stage.name().to_string(), json!(round(*time))))
        .collect();
    let images: Vec<String> = report
        .tags
        .iter()
        .map(|tag| {
            format!(
                "{}:{tag}@{}",
                report.layout_dir.display(),
                report.manifest_digest
            )
        })
        .collect();
    json!({
        "event": "result",
        "images": images,
        "layout": report.layout_dir,
        "tags": report.tags,
        "digest": report.manifest_digest,
        "platforms": report
            .platforms
            .iter()
            .map(|(platform, digest)| json!({"platform": platform.as_str(), "digest": digest}))
            .collect::<Vec<_>>(),
        "layers": report.base_layers + report.layers.len(),
        "base_layers": report.base_layers,
        "new_layers": report.layers.len(),
        "reused_layers": reused,
        "unchanged": report.unchanged,
        "compressed_size": compressed,
        "written_size": written,
        // What this build compressed, layer by layer: with `--shard` runs before it, only
        // the layers the build makes itself.
        "written_layers": report
            .layers
            .iter()
            .filter(|l| !l.reused)
            .map(|l| json!({"name": l.name, "kind": l.kind, "digest": l.blob.digest}))
            .collect::<Vec<_>>(),
        "total_size": uncompressed,
        "packages": report.lock.packages,
        "sboms": report.sboms,
        "provenance": report.provenance,
        "timings": timings,
        "cache_repo": report.cache_repo,
        "models": report.models.iter().map(|m| json!({
            "name": m.name,
            "mount": m.mount,
            "layout": m.layout,
            "image": format!("{}:{}@{}", m.layout.display(), report.tags.first().map_or("latest", |t| t), m.image_digest),
            "artifact": m.artifact_digest,
            "files": m.files,
            "bytes": m.bytes,
            "layers": m.layers.iter().map(|(path, digest)| json!({"path": path, "digest": digest})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
