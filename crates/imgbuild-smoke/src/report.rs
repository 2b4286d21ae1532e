//! What a smoke run learned: printed as text or `--json`; its [`Verdict`] is the exit code.

use serde::{Deserialize, Serialize};

/// The outcome, which is also the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Exit 0.
    Pass,
    /// Exit 3: no NVIDIA driver or no GPU on this machine.
    NoDevice,
    /// Exit 4: the image's CUDA cannot run on this driver.
    Incompatible,
    /// Exit 5: the kernel failed or computed wrong values.
    KernelFailure,
    /// Exit 6: the CUDA stack passed, but a framework of the image did not (see
    /// [`crate::framework`]).
    FrameworkFailure,
}

impl Verdict {
    /// The verdict as `--json` writes it: `pass`, `no-device`, `incompatible`,
    /// `kernel-failure`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::NoDevice => "no-device",
            Verdict::Incompatible => "incompatible",
            Verdict::KernelFailure => "kernel-failure",
            Verdict::FrameworkFailure => "framework-failure",
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Pass => 0,
            Verdict::NoDevice => 3,
            Verdict::Incompatible => 4,
            Verdict::KernelFailure => 5,
            Verdict::FrameworkFailure => 6,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GpuInfo {
    pub name: String,
    pub compute_capability: String,
    pub total_memory_mib: u64,
    pub free_memory_mib: u64,
    pub managed_memory: bool,
    pub concurrent_managed_access: bool,
    pub pageable_memory_access: bool,
}

/// A GPU's MIG (Multi-Instance GPU) mode, as NVML gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigMode {
    Disabled,
    Enabled,
    /// The GPU (or its driver) has no MIG.
    NotSupported,
    /// NVML could not say; [`MigState::reason`] says why.
    Unknown,
}

impl MigMode {
    /// As `--json` writes it: `disabled`, `enabled`, `not-supported`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            MigMode::Disabled => "disabled",
            MigMode::Enabled => "enabled",
            MigMode::NotSupported => "not-supported",
            MigMode::Unknown => "unknown",
        }
    }
}

/// The MIG state of the GPU the test ran on (see [`crate::mig`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigState {
    /// The GPU's current mode; for a MIG instance, its parent GPU's (`enabled`).
    pub mode: MigMode,
    /// The mode after the GPU's next reset (`nvidia-smi -mig` changes this one first).
    pub pending: MigMode,
    /// Whether the CUDA device the test ran on is itself a MIG instance; `None` when NVML did
    /// not find the device.
    pub instance: Option<bool>,
    /// Where the state comes from: `nvml`.
    pub source: String,
    /// Why the state is `unknown` (or what else NVML said); `None` when NVML answered all.
    pub reason: Option<String>,
}

impl MigState {
    /// The text report's words: `disabled (NVML)`, `disabled, pending enabled (NVML)`,
    /// `enabled: this device is a MIG instance (NVML)`, `not supported by this GPU (NVML)`,
    /// `unknown (NVML: REASON)`.
    pub fn describe(&self) -> String {
        let mut text = match self.mode {
            MigMode::NotSupported => "not supported by this GPU".to_string(),
            mode => mode.as_str().to_string(),
        };
        if self.pending != self.mode && self.pending != MigMode::Unknown {
            text.push_str(&format!(", pending {}", self.pending.as_str()));
        }
        if self.instance == Some(true) {
            text.push_str(": this device is a MIG instance");
        }
        let source = match self.source.as_str() {
            "nvml" => "NVML",
            other => other,
        };
        match &self.reason {
            Some(reason) => text.push_str(&format!(" ({source}: {reason})")),
            None => text.push_str(&format!(" ({source})")),
        }
        text
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunTiming {
    pub name: String,
    /// Time to move the pages to the GPU before the kernel, when prefetched.
    pub prefetch_ms: Option<f64>,
    /// Launch to synchronised completion, page faults included when not prefetched.
    pub kernel_ms: f64,
    pub elements: usize,
    pub mismatches: usize,
}

/// One round of the ping-pong run: the GPU touches every element, then the CPU writes every
/// page, so the pages migrate both ways.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PingPongRound {
    /// The CPU writing one value in every 4 KiB page (faulting each page back to the host).
    pub cpu_ms: f64,
    /// The kernel's launch to synchronised completion (faulting each page to the GPU).
    pub gpu_ms: f64,
}

impl PingPongRound {
    /// The round's cost: both halves.
    pub(crate) fn total_ms(&self) -> f64 {
        self.cpu_ms + self.gpu_ms
    }
}

/// The third run: CPU and GPU take turns touching the same managed pages, the migration cost
/// the first design document warns about, per round beside the on-demand and prefetched runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingPongTiming {
    pub rounds: Vec<PingPongRound>,
    /// Sum of the rounds' costs.
    pub total_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub elements: usize,
    pub mismatches: usize,
}

impl PingPongTiming {
    /// The timing of `rounds`, with its total, mean, min and max per round (all 0 without
    /// rounds, so that the JSON never holds a NaN or an infinity).
    pub fn new(rounds: Vec<PingPongRound>, elements: usize, mismatches: usize) -> Self {
        let costs = rounds.iter().map(PingPongRound::total_ms);
        let total_ms: f64 = costs.clone().sum();
        let (min_ms, max_ms) = costs
            .fold(None, |range: Option<(f64, f64)>, ms| {
                Some(range.map_or((ms, ms), |(lo, hi)| (lo.min(ms), hi.max(ms))))
            })
            .unwrap_or((0.0, 0.0));
        let mean_ms = if rounds.is_empty() {
            0.0
        } else {
            total_ms / rounds.len() as f64
        };
        PingPongTiming {
            rounds,
            total_ms,
            mean_ms,
            min_ms,
            max_ms,
            elements,
            mismatches,
        }
    }
}

/// Everything the smoke test learned; printed as text or `--json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SmokeReport {
    pub image: String,
    /// `CUDA_VERSION` of the image config.
    pub image_cuda: Option<String>,
    /// `cudaRuntimeGetVersion` of the image's cudart.
    pub image_cudart: Option<String>,
    /// `nvrtcVersion` of the image's NVRTC.
    pub image_nvrtc: Option<String>,
    pub libraries: Vec<String>,
    /// The kernel driver's version (`/proc/driver/nvidia/version`).
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports (`cuDriverGetVersion`).
    pub driver_cuda: Option<String>,
    pub gpu: Option<GpuInfo>,
    /// The GPU's MIG state (see [`MigState`]); absent from reports of older versions, and
    /// `None` when the run found no GPU.
    #[serde(default)]
    pub mig: Option<MigState>,
    pub compatibility: Option<String>,
    /// Whether the image's CUDA forward-compatibility libraries were used (see
    /// [`crate::forward_compat`]); absent when the image has none or the host no driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_compat: Option<crate::forward_compat::ForwardCompat>,
    /// How the kernel was built.
    pub kernel: Option<String>,
    pub runs: Vec<RunTiming>,
    /// The ping-pong run (see [`PingPongTiming`]); absent from reports of older versions, and
    /// when the run did not get that far.
    #[serde(default)]
    pub ping_pong: Option<PingPongTiming>,
    /// Whether the image's libraries carry kernels for this device (see
    /// [`crate::architectures::classify`]); absent when the image records no architectures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_images: Option<crate::architectures::KernelCoverage>,
    /// The image's own frameworks, each asked in the image's Python (see
    /// [`crate::framework`]); absent when none ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub framework: Vec<crate::framework::FrameworkCheck>,
    pub verdict: Verdict,
    pub message: String,
}

impl SmokeReport {
    /// Adds the framework checks; a CUDA stack that passed while a framework did not is a
    /// [`Verdict::FrameworkFailure`] naming it. Other verdicts stand: they say more.
    pub fn with_frameworks(mut self, checks: Vec<crate::framework::FrameworkCheck>) -> Self {
        use crate::framework::FrameworkVerdict;
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| c.verdict != FrameworkVerdict::Pass)
            .map(|c| format!("{} {}", c.framework, c.verdict.as_str()))
            .collect();
        // A CPU build, a missing library or a framework that does not import fails on any
        // machine: found without a GPU, it is the verdict, not `no-device`.
        let anywhere: Vec<String> = checks
            .iter()
            .filter(|c| c.verdict.fails_anywhere())
            .map(|c| format!("{} {}", c.framework, c.verdict.as_str()))
            .collect();
        if self.verdict == Verdict::Pass && !failed.is_empty() {
            self.verdict = Verdict::FrameworkFailure;
            self.message = format!(
                "the CUDA stack passed, but not the framework: {}",
                failed.join(", ")
            );
        } else if self.verdict == Verdict::NoDevice && !anywhere.is_empty() {
            self.verdict = Verdict::FrameworkFailure;
            self.message = format!(
                "no GPU here, but the framework fails on any machine: {}",
                anywhere.join(", ")
            );
        }
        self.framework = checks;
        self
    }

    /// A report for `image` before anything ran: no device until the driver says otherwise.
    pub fn new(image: String, cuda_version: Option<String>, libraries: Vec<String>) -> Self {
        SmokeReport {
            image,
            image_cuda: cuda_version,
            image_cudart: None,
            image_nvrtc: None,
            libraries,
            driver_version: None,
            driver_cuda: None,
            gpu: None,
            mig: None,
            compatibility: None,
            forward_compat: None,
            kernel: None,
            runs: Vec::new(),
            ping_pong: None,
            kernel_images: None,
            framework: Vec::new(),
            verdict: Verdict::NoDevice,
            message: String::new(),
        }
    }

    /// What the smoke commands print: one line of JSON, or [`Self::to_text`].
    pub fn render(&self, json: bool) -> String {
        if json {
            let mut line = serde_json::to_string(self).expect("the report serializes");
            line.push('\n');
            line
        } else {
            self.to_text()
        }
    }

    /// The smoke report as text, one fact per line.
    pub(crate) fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
        let _ = writeln!(out, "image            {}", self.image);
        let _ = writeln!(out, "image CUDA       {}", or_none(&self.image_cuda));
        let _ = writeln!(out, "image cudart     {}", or_none(&self.image_cudart));
        let _ = writeln!(out, "image NVRTC      {}", or_none(&self.image_nvrtc));
        for library in &self.libraries {
            let _ = writeln!(out, "  library        {library}");
        }
        let _ = writeln!(out, "driver           {}", or_none(&self.driver_version));
        let _ = writeln!(out, "driver CUDA      {}", or_none(&self.driver_cuda));
        if let Some(gpu) = &self.gpu {
            let _ = writeln!(
                out,
                "GPU              {} (compute capability {})",
                gpu.name, gpu.compute_capability
            );
            let _ = writeln!(
                out,
                "GPU memory       {} MiB free of {} MiB",
                gpu.free_memory_mib, gpu.total_memory_mib
            );
            let _ = writeln!(
                out,
                "managed memory   {} (concurrent managed access: {}, pageable memory access: {})",
                gpu.managed_memory, gpu.concurrent_managed_access, gpu.pageable_memory_access
            );
        }
        if let Some(mig) = &self.mig {
            let _ = writeln!(out, "mig              {}", mig.describe());
        }
        if let Some(forward) = &self.forward_compat {
            let _ = writeln!(out, "forward compat   {}", forward.describe());
        }
        if let Some(compatibility) = &self.compatibility {
            let _ = writeln!(out, "compatibility    {compatibility}");
        }
        if let Some(kernel) = &self.kernel {
            let _ = writeln!(out, "kernel           {kernel}");
        }
        for run in &self.runs {
            let prefetch = run
                .prefetch_ms
                .map(|ms| format!("prefetch {ms:.3} ms, "))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "run              {}: {prefetch}kernel {:.3} ms, {} elements, {} wrong",
                run.name, run.kernel_ms, run.elements, run.mismatches
            );
        }
        if let Some(ping_pong) = &self.ping_pong {
            write_ping_pong(&mut out, ping_pong);
        }
        if let Some(coverage) = &self.kernel_images {
            let _ = writeln!(out, "kernel images    {}", coverage.message);
        }
        for check in &self.framework {
            let _ = writeln!(out, "framework        {}", check.line());
        }
        let verdict = self.verdict.as_str().to_uppercase();
        let _ = writeln!(out, "verdict          {verdict}: {}", self.message);
        out
    }
}

/// The ping-pong run's line: per-round cost first (what compares with the other runs), then
/// the CPU and GPU halves summed over the rounds.
fn write_ping_pong(out: &mut String, run: &PingPongTiming) {
    use std::fmt::Write;
    let cpu_ms: f64 = run.rounds.iter().map(|r| r.cpu_ms).sum();
    let gpu_ms: f64 = run.rounds.iter().map(|r| r.gpu_ms).sum();
    let _ = writeln!(
        out,
        "run              CPU/GPU ping-pong: {} rounds, {:.3} ms per round (min {:.3}, max {:.3}), total {:.3} ms (CPU {:.3} ms, GPU {:.3} ms), {} elements, {} wrong",
        run.rounds.len(),
        run.mean_ms,
        run.min_ms,
        run.max_ms,
        run.total_ms,
        cpu_ms,
        gpu_ms,
        run.elements,
        run.mismatches
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framework_broken_anywhere_is_the_verdict_without_a_gpu() {
        use crate::framework::{FrameworkCheck, FrameworkVerdict};
        let check = |verdict| {
            let mut c = FrameworkCheck::broken("pytorch", "/usr/bin/python3", String::new());
            c.verdict = verdict;
            c
        };
        let none = || SmokeReport::new("i".into(), None, Vec::new());
        let cpu = none().with_frameworks(vec![check(FrameworkVerdict::CpuBuild)]);
        assert_eq!(cpu.verdict, Verdict::FrameworkFailure);
        assert!(cpu.message.contains("pytorch cpu-build"), "{}", cpu.message);
        // Without a GPU, no device is what a framework says too: not a failure of its own.
        let no_device = none().with_frameworks(vec![check(FrameworkVerdict::NoDevice)]);
        assert_eq!(no_device.verdict, Verdict::NoDevice);
    }

    fn round(cpu_ms: f64, gpu_ms: f64) -> PingPongRound {
        PingPongRound { cpu_ms, gpu_ms }
    }

    fn report_with(ping_pong: Option<PingPongTiming>) -> SmokeReport {
        let mut report = SmokeReport::new("img".into(), Some("12.4".into()), Vec::new());
        report.ping_pong = ping_pong;
        report
    }

    #[test]
    fn ping_pong_summary_per_round() {
        let timing = PingPongTiming::new(
            vec![round(1.0, 2.0), round(0.5, 0.5), round(2.0, 4.0)],
            4096,
            0,
        );
        assert_eq!(timing.total_ms, 10.0);
        assert_eq!(timing.min_ms, 1.0);
        assert_eq!(timing.max_ms, 6.0);
        assert!((timing.mean_ms - 10.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn ping_pong_without_rounds_is_zero_not_nan() {
        let timing = PingPongTiming::new(Vec::new(), 0, 0);
        assert_eq!(
            (
                timing.total_ms,
                timing.mean_ms,
                timing.min_ms,
                timing.max_ms
            ),
            (0.0, 0.0, 0.0, 0.0)
        );
        let json = serde_json::to_string(&timing).unwrap();
        assert!(!json.contains("null"), "{json}");
    }

    #[test]
    fn ping_pong_text_line() {
        let timing = PingPongTiming::new(vec![round(1.0, 2.0), round(0.25, 0.75)], 4096, 0);
        let text = report_with(Some(timing)).to_text();
        let line = text
            .lines()
            .find(|l| l.contains("ping-pong"))
            .unwrap_or_default();
        assert_eq!(
            line,
            "run              CPU/GPU ping-pong: 2 rounds, 2.000 ms per round (min 1.000, max 3.000), total 4.000 ms (CPU 1.250 ms, GPU 2.750 ms), 4096 elements, 0 wrong"
        );
        // After the other runs, before the verdict.
        assert!(text.find("ping-pong") < text.find("verdict"), "{text}");
        assert!(!report_with(None).to_text().contains("ping-pong"));
    }

    #[test]
    fn ping_pong_json_fields() {
        let timing = PingPongTiming::new(vec![round(1.0, 2.0)], 4096, 3);
        let json: serde_json::Value =
            serde_json::from_str(&report_with(Some(timing)).render(true)).unwrap();
        assert_eq!(
            json["ping_pong"],
            serde_json::json!({
                "rounds": [{"cpu_ms": 1.0, "gpu_ms": 2.0}],
                "total_ms": 3.0, "mean_ms": 3.0, "min_ms": 3.0, "max_ms": 3.0,
                "elements": 4096, "mismatches": 3
            })
        );
        // The fields before it are unchanged.
        assert_eq!(json["runs"], serde_json::json!([]));
        assert_eq!(json["verdict"], "no-device");
        let none: serde_json::Value =
            serde_json::from_str(&report_with(None).render(true)).unwrap();
        assert_eq!(none["ping_pong"], serde_json::Value::Null);
    }

    fn mig(
        mode: MigMode,
        pending: MigMode,
        instance: Option<bool>,
        reason: Option<&str>,
    ) -> MigState {
        MigState {
            mode,
            pending,
            instance,
            source: "nvml".into(),
            reason: reason.map(str::to_string),
        }
    }

    fn mig_line(state: Option<MigState>) -> Option<String> {
        let mut report = report_with(None);
        report.gpu = Some(GpuInfo::default());
        report.mig = state;
        let text = report.to_text();
        // After the GPU's lines, before the verdict.
        if let Some(at) = text.find("\nmig ") {
            assert!(text.find("managed memory") < Some(at), "{text}");
            assert!(text.find("verdict") > Some(at), "{text}");
        }
        text.lines()
            .find(|l| l.starts_with("mig "))
            .map(str::to_string)
    }

    #[test]
    fn mig_text_line() {
        use MigMode::*;
        assert_eq!(
            mig_line(Some(mig(Disabled, Disabled, Some(false), None))).as_deref(),
            Some("mig              disabled (NVML)")
        );
        assert_eq!(
            mig_line(Some(mig(Disabled, Enabled, Some(false), None))).as_deref(),
            Some("mig              disabled, pending enabled (NVML)")
        );
        assert_eq!(
            mig_line(Some(mig(Enabled, Enabled, Some(true), None))).as_deref(),
            Some("mig              enabled: this device is a MIG instance (NVML)")
        );
        assert_eq!(
            mig_line(Some(mig(NotSupported, NotSupported, Some(false), None))).as_deref(),
            Some("mig              not supported by this GPU (NVML)")
        );
        assert_eq!(
            mig_line(Some(mig(
                Unknown,
                Unknown,
                None,
                Some("nvmlInit_v2: NVML_ERROR_DRIVER_NOT_LOADED")
            )))
            .as_deref(),
            Some("mig              unknown (NVML: nvmlInit_v2: NVML_ERROR_DRIVER_NOT_LOADED)")
        );
        // No GPU found, no MIG line.
        assert_eq!(mig_line(None), None);
    }

    #[test]
    fn mig_json_fields() {
        let mut report = report_with(None);
        report.mig = Some(mig(
            MigMode::NotSupported,
            MigMode::NotSupported,
            Some(false),
            None,
        ));
        let json: serde_json::Value = serde_json::from_str(&report.render(true)).unwrap();
        assert_eq!(
            json["mig"],
            serde_json::json!({
                "mode": "not-supported", "pending": "not-supported", "instance": false,
                "source": "nvml", "reason": null
            })
        );
        let none: serde_json::Value =
            serde_json::from_str(&report_with(None).render(true)).unwrap();
        assert_eq!(none["mig"], serde_json::Value::Null);
        // A report of an older version, without `mig`, parses.
        let mut old = none.clone();
        old.as_object_mut().unwrap().remove("mig");
        let parsed: SmokeReport = serde_json::from_value(old).unwrap();
        assert!(parsed.mig.is_none());
        // And one with it round-trips.
        let parsed: SmokeReport = serde_json::from_value(json).unwrap();
        assert_eq!(parsed.mig, report.mig);
    }

    /// A report from an older `imgbuild-smoke` (an embedded one, or a child of another
    /// version) has no `ping_pong`, and still parses.
    #[test]
    fn older_report_without_ping_pong_parses() {
        let mut json: serde_json::Value =
            serde_json::from_str(&report_with(None).render(true)).unwrap();
        json.as_object_mut().unwrap().remove("ping_pong");
        let report: SmokeReport = serde_json::from_value(json).unwrap();
        assert!(report.ping_pong.is_none());
    }
}
