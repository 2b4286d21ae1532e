//! Build progress: indicatif bars on a terminal, plain lines otherwise, nothing with
//! `--quiet`, and one JSON event per line on stdout with `--json`.
//!
//! JSON events (all have `event`):
//! - `{"event":"stage-started","stage":"solve|install|layers|write","detail":"…"}`
//! - `{"event":"stage-finished","stage":…,"ok":true,"seconds":1.25,"items":5,"bytes":123,"downloaded_bytes":0}`
//!   (`items`: packages linked or layers written; `bytes`: compressed layer bytes)
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

use crate::build::{BuildReport, LockOutcome, LockReport, Reporter, Stage, counted};

use super::printer::{Printer, human_bytes};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing but errors and warnings.
    Quiet,
    /// One line per stage on stderr (stderr is not a terminal).
    Plain,
    /// indicatif spinners and bars on stderr.
    Bars,
    /// JSON events on stdout.
    Json,
}

#[derive(Default)]
struct Current {
    stage: Option<(Stage, Instant)>,
    bar: Option<ProgressBar>,
    items: usize,
    bytes: u64,
    downloaded: u64,
}

/// The build's [`Reporter`] for the command line.
pub(crate) struct BuildProgress {
    printer: Printer,
    mode: Mode,
    current: Mutex<Current>,
}

impl BuildProgress {
    pub(crate) fn new(printer: &Printer) -> Self {
        BuildProgress {
            printer: *printer,
            mode: printer.progress_mode(),
            current: Mutex::default(),
        }
    }

    /// Ends the running stage once the build returned; `ok` is whether it succeeded (a
    /// failed stage gets no "done" line, and `"ok": false` in its JSON event).
    pub(crate) fn finish(&self, ok: bool) {
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
            Mode::Quiet => {}
            Mode::Plain | Mode::Bars if !ok => {}
            Mode::Json => self.printer.event(&json!({
                "event": "stage-finished",
                "stage": stage.name(),
                "ok": ok,
                "seconds": round(elapsed),
                "items": current.items,
                "bytes": current.bytes,
                "downloaded_bytes": current.downloaded,
            })),
            Mode::Plain | Mode::Bars => {
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
        match self.mode {
            Mode::Quiet => {}
            Mode::Json => self.printer.event(&json!({
                "event": "stage-started",
                "stage": stage.name(),
                "detail": detail,
            })),
            Mode::Plain => self.printer.status(verb(stage), detail),
            Mode::Bars => {
                let bar = ProgressBar::new_spinner();
                bar.set_style(
                    ProgressStyle::with_template("{prefix:>12.bold} {spinner} {msg} {elapsed}")
                        .expect("a valid template"),
                );
                bar.set_prefix(verb(stage));
                bar.set_message(detail.to_string());
                bar.enable_steady_tick(Duration::from_millis(100));
                current.bar = Some(bar);
            }
        }
    }

    fn on_stage_total(&self, stage: Stage, total: usize) {
        let current = self
            .current
            .lock()
            .expect("no panics while holding the lock");
        if let Some(bar) = &current.bar {
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>12.bold} [{bar:30}] {pos}/{len} {msg} {elapsed}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_length(total as u64);
            bar.set_message(match stage {
                Stage::Install => "packages",
                Stage::Layers => "layers",
                Stage::Solve | Stage::Write => "",
            });
        }
    }

    fn on_download_bytes(&self, bytes: u64) {
        let mut current = self
            .current
            .lock()
            .expect("no panics while holding the lock");
        current.downloaded += bytes;
        if let Some(bar) = &current.bar {
            bar.set_message(format!(
                "packages, {} downloaded",
                human_bytes(current.downloaded)
            ));
        }
    }

    fn on_item_done(&self, stage: Stage, _name: &str, bytes: u64) {
        let mut current = self
            .current
            .lock()
            .expect("no panics while holding the lock");
        current.items += 1;
        current.bytes += bytes;
        if let Some(bar) = &current.bar {
            bar.inc(1);
            if stage == Stage::Layers {
                bar.set_message(format!("layers, {} compressed", human_bytes(current.bytes)));
            }
        }
    }

    fn on_warning(&self, message: &str) {
        if self.mode == Mode::Json {
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

/// The lock event of `--json`.
pub(crate) fn lock_event(report: &LockReport) -> Value {
    let (outcome, reason) = match &report.outcome {
        LockOutcome::Reused => ("reused", None),
        LockOutcome::Written { reason } => ("written", reason.clone()),
    };
    json!({
        "event": "lock",
        "path": report.lock_path,
        "outcome": outcome,
        "reason": reason,
        "packages": report.packages,
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
        "total_size": uncompressed,
        "packages": report.lock.packages,
        "sboms": report.sboms,
        "timings": timings,
    })
}
