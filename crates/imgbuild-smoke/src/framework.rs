//! The framework readiness check: the image's own Python asked whether its GPU framework
//! (PyTorch, CuPy, JAX) sees the GPU, computes right in mixed precision and gives memory
//! back, the questions a researcher asks first.
//!
//! The facts come from `framework/probe.py`, run by the image's Python once per framework
//! (one process each, so a framework that crashes its interpreter costs only its own
//! result). The verdict is decided here, from the facts, so the rules are Rust and tested:
//! a CPU build, no device, a CUDA the driver is too old for, a missing library named, or
//! `is_available()` false with the framework's own reason.
//!
//! Where Python runs is the caller's: `imgbuild smoke` runs it in the image's unpacked root
//! with the host's driver made visible (see `imgbuild::smoke::sandbox`); the in-image
//! `imgbuild-smoke` runs it where it is, on a node whose container toolkit already did that.

use std::{
    io::Read,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::compat::{CudaVersion, minor_version_minimum, release_minimum};

/// The probe's source, passed to `python -c`.
pub const PROBE: &str = include_str!("framework/probe.py");

/// A framework the check knows: its name in reports and the package directory that tells
/// it is installed (`site-packages/<module>/__init__.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framework {
    pub name: &'static str,
    pub module: &'static str,
}

pub const FRAMEWORKS: &[Framework] = &[
    Framework {
        name: "pytorch",
        module: "torch",
    },
    Framework {
        name: "cupy",
        module: "cupy",
    },
    Framework {
        name: "jax",
        module: "jax",
    },
];

/// The arguments after the interpreter: `-c PROBE FRAMEWORK`.
pub fn probe_args(framework: &Framework) -> Vec<String> {
    vec!["-c".into(), PROBE.into(), framework.name.into()]
}

/// The largest relative error a mixed-precision matmul of two 512 × 512 normal matrices may
/// have against fp32: fp16 keeps 11 significant bits (about 5e-4 per product, a few 1e-3
/// summed over 512 terms), bf16 8 bits (about 8 times more). Wrong kernels are off by 1 or
/// more; these leave a margin of ten over honest rounding.
fn tolerance(dtype: &str) -> f64 {
    match dtype {
        "bfloat16" => 8e-2,
        _ => 1e-2,
    }
}

/// The verdict of one framework.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FrameworkVerdict {
    Pass,
    /// Built without CUDA: it will never use a GPU.
    CpuBuild,
    /// No NVIDIA driver or no GPU where it ran.
    NoDevice,
    /// Its CUDA needs a newer driver than the host's.
    CudaMismatch,
    /// A shared library it needs is not in the image.
    MissingLibrary,
    /// `is_available()` is false for another reason, given.
    NotAvailable,
    /// It sees the GPU but autocast or memory release went wrong.
    ComputeFailure,
    /// It failed to import or the probe died, for a reason given.
    Broken,
}

impl FrameworkVerdict {
    /// Whether the verdict holds whatever GPU and driver the machine has.
    pub fn fails_anywhere(self) -> bool {
        matches!(
            self,
            FrameworkVerdict::CpuBuild
                | FrameworkVerdict::MissingLibrary
                | FrameworkVerdict::Broken
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FrameworkVerdict::Pass => "pass",
            FrameworkVerdict::CpuBuild => "cpu-build",
            FrameworkVerdict::NoDevice => "no-device",
            FrameworkVerdict::CudaMismatch => "cuda-mismatch",
            FrameworkVerdict::MissingLibrary => "missing-library",
            FrameworkVerdict::NotAvailable => "not-available",
            FrameworkVerdict::ComputeFailure => "compute-failure",
            FrameworkVerdict::Broken => "broken",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameworkDevice {
    pub name: String,
    pub capability: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutocastResult {
    pub dtype: String,
    pub result_dtype: String,
    /// `None` when the error was NaN or infinite.
    pub max_rel_error: Option<f64>,
    #[serde(default)]
    pub tolerance: f64,
    #[serde(default)]
    pub ok: bool,
}

/// Device memory in use (bytes) before, while and after holding a 64 MiB tensor, the last
/// after `del` and `empty_cache()`: it must come back to the baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryResult {
    pub baseline: u64,
    pub allocated: u64,
    pub released: u64,
    pub reserved_after: u64,
    #[serde(default)]
    pub ok: bool,
}

/// What the probe printed: facts, no verdict.
#[derive(Debug, Clone, Default, Deserialize)]
struct Facts {
    framework: String,
    python: Option<String>,
    stage: Option<String>,
    version: Option<String>,
    cuda: Option<String>,
    cudnn: Option<u64>,
    available: Option<bool>,
    reason: Option<String>,
    device_count: Option<u64>,
    #[serde(default)]
    devices: Vec<FrameworkDevice>,
    #[serde(default)]
    autocast: Vec<AutocastResult>,
    memory: Option<MemoryResult>,
    error: Option<String>,
}

/// One framework's section of the smoke report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameworkCheck {
    pub framework: String,
    /// The interpreter that ran it, as the image has it.
    pub python: String,
    pub python_version: Option<String>,
    pub version: Option<String>,
    /// The CUDA it was built for (`torch.version.cuda`; for JAX, its CUDA plugin).
    pub cuda: Option<String>,
    pub cudnn: Option<u64>,
    pub available: Option<bool>,
    pub device_count: Option<u64>,
    pub devices: Vec<FrameworkDevice>,
    pub autocast: Vec<AutocastResult>,
    pub memory: Option<MemoryResult>,
    pub verdict: FrameworkVerdict,
    pub message: String,
}

impl FrameworkCheck {
    /// A check that never produced facts (the probe died, hung or printed none).
    pub fn broken(framework: &str, python: &str, message: String) -> Self {
        Self::from_facts(
            Facts {
                framework: framework.into(),
                ..Facts::default()
            },
            python,
            FrameworkVerdict::Broken,
            message,
        )
    }

    fn from_facts(facts: Facts, python: &str, verdict: FrameworkVerdict, message: String) -> Self {
        FrameworkCheck {
            framework: facts.framework,
            python: python.into(),
            python_version: facts.python,
            version: facts.version,
            cuda: facts.cuda,
            cudnn: facts.cudnn,
            available: facts.available,
            device_count: facts.device_count,
            devices: facts.devices,
            autocast: facts.autocast,
            memory: facts.memory,
            verdict,
            message,
        }
    }

    /// One line for the text report.
    pub fn line(&self) -> String {
        let version = self.version.as_deref().unwrap_or("?");
        let cuda = self.cuda.as_deref().unwrap_or("none");
        format!(
            "{} {version} (CUDA {cuda}): {}: {}",
            self.framework,
            self.verdict.as_str().to_uppercase(),
            self.message
        )
    }
}

/// Decides the verdict of the probe's `facts`, run by `python`.
fn classify(mut facts: Facts, python: &str) -> FrameworkCheck {
    for check in &mut facts.autocast {
        check.tolerance = tolerance(&check.dtype);
        check.ok = check.max_rel_error.is_some_and(|e| e <= check.tolerance)
            && check.result_dtype == check.dtype;
    }
    if let Some(memory) = &mut facts.memory {
        memory.ok = memory.released <= memory.baseline && memory.allocated > memory.baseline;
    }
    let (verdict, message) = judge(&facts);
    FrameworkCheck::from_facts(facts, python, verdict, message)
}

fn judge(facts: &Facts) -> (FrameworkVerdict, String) {
    if let Some(error) = &facts.error {
        if let Some(library) = missing_library(error) {
            return (
                FrameworkVerdict::MissingLibrary,
                format!("`{library}` is not in the image: {error}"),
            );
        }
        let when = match facts.stage.as_deref() {
            Some("import") => "import failed",
            _ => "the check failed",
        };
        return (FrameworkVerdict::Broken, format!("{when}: {error}"));
    }
    if facts.cuda.is_none() {
        return (
            FrameworkVerdict::CpuBuild,
            "built without CUDA: it will never use a GPU; install its CUDA build".into(),
        );
    }
    if facts.available != Some(true) {
        let reason = facts.reason.clone().unwrap_or_default();
        return not_available(facts, reason);
    }
    computed(facts)
}

/// The verdict when the framework says no GPU: why, from its own words.
fn not_available(facts: &Facts, reason: String) -> (FrameworkVerdict, String) {
    let lower = reason.to_lowercase();
    let no_device = [
        "found no nvidia driver",
        "no cuda gpus are available",
        "no cuda-capable device",
        "cudaerrornodevice",
        "unable to initialize backend 'cuda'",
    ];
    let too_old = [
        "driver on your system is too old",
        "cudaerrorinsufficientdriver",
        "insufficient driver",
        "unsupported display driver",
        "forward compatibility was attempted",
    ];
    if too_old.iter().any(|s| lower.contains(s)) {
        let needs = facts
            .cuda
            .as_deref()
            .and_then(|c| c.parse::<CudaVersion>().ok())
            .map(needed_driver)
            .unwrap_or_default();
        return (
            FrameworkVerdict::CudaMismatch,
            format!("its CUDA needs a newer driver{needs}: {reason}"),
        );
    }
    if no_device.iter().any(|s| lower.contains(s)) {
        return (
            FrameworkVerdict::NoDevice,
            format!("no GPU where it ran: {reason}"),
        );
    }
    (
        FrameworkVerdict::NotAvailable,
        format!("it sees no GPU: {reason}"),
    )
}

/// ` (CUDA 12.1: driver ≥ 525.60.13 by minor-version compatibility, ≥ 530.30.02 in full)`.
fn needed_driver(cuda: CudaVersion) -> String {
    let minor = minor_version_minimum(cuda.major).map(|d| d.to_string());
    let full = release_minimum(cuda).map(|d| d.to_string());
    match (minor, full) {
        (Some(minor), Some(full)) => format!(
            " (CUDA {cuda}: driver ≥ {minor} by minor-version compatibility, ≥ {full} in full)"
        ),
        (None, Some(full)) => format!(" (CUDA {cuda}: driver ≥ {full})"),
        _ => format!(" (CUDA {cuda})"),
    }
}

/// The verdict when the framework sees the GPU: did it compute and release right?
fn computed(facts: &Facts) -> (FrameworkVerdict, String) {
    let mut wrong = Vec::new();
    if facts.autocast.is_empty() {
        wrong.push("no mixed-precision matmul ran".to_string());
    }
    for check in facts.autocast.iter().filter(|c| !c.ok) {
        wrong.push(format!(
            "{} matmul: relative error {} (at most {:.0e}), result {}",
            check.dtype,
            check
                .max_rel_error
                .map_or("NaN".into(), |e| format!("{e:.2e}")),
            check.tolerance,
            check.result_dtype
        ));
    }
    match &facts.memory {
        Some(memory) if !memory.ok => wrong.push(format!(
            "memory did not come back: {} bytes in use before, {} holding 64 MiB, {} after release",
            memory.baseline, memory.allocated, memory.released
        )),
        None => wrong.push("no memory check ran".into()),
        Some(_) => {}
    }
    if !wrong.is_empty() {
        return (FrameworkVerdict::ComputeFailure, wrong.join("; "));
    }
    let devices = facts
        .devices
        .iter()
        .map(|d| format!("{} (sm {})", d.name, d.capability))
        .collect::<Vec<_>>()
        .join(", ");
    let dtypes = facts
        .autocast
        .iter()
        .map(|c| format!("{} {:.1e}", c.dtype, c.max_rel_error.unwrap_or(f64::NAN)))
        .collect::<Vec<_>>()
        .join(", ");
    (
        FrameworkVerdict::Pass,
        format!("sees {devices}; autocast matmul within tolerance ({dtypes}); memory released"),
    )
}

/// The library named by a loader error: `libcudnn.so.8: cannot open shared object file`, or
/// PyTorch's own `libcublas.so.*[0-9] not found in the system path`.
fn missing_library(error: &str) -> Option<String> {
    let markers = [
        ": cannot open shared object file",
        " not found in the system path",
    ];
    let at = markers.iter().find_map(|m| error.find(m))?;
    let name = error[..at]
        .rsplit(|c: char| c.is_whitespace() || c == '\'' || c == '"' || c == '(')
        .next()?;
    name.contains(".so").then(|| name.to_string())
}

/// How long one framework's probe may run: importing PyTorch and initialising CUDA take
/// seconds, a hung driver call would otherwise hang the smoke test.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(300);
/// The most of the probe's stdout and stderr kept each.
const MAX_OUTPUT: u64 = 1 << 20;

/// Runs `command` (the image's Python with [`probe_args`], however the caller confines it)
/// and classifies what it printed. `python` names the interpreter in the report.
pub fn run_probe(
    mut command: Command,
    framework: &Framework,
    python: &str,
    limit: Duration,
) -> FrameworkCheck {
    let broken = |message: String| FrameworkCheck::broken(framework.name, python, message);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => return broken(format!("cannot start `{python}`: {err}")),
    };
    let stdout = child.stdout.take().map(read_bounded);
    let stderr = child.stderr.take().map(read_bounded);
    let child = Arc::new(Mutex::new(child));
    let (done, watchdog) = crate::isolate::watch(child.clone(), limit);
    let status = crate::isolate::wait(&child);
    let _ = done.send(());
    let killed = watchdog.join().ok().flatten();
    let out = stdout.and_then(|h| h.join().ok()).unwrap_or_default();
    let err = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    if let Some(limit) = killed {
        return broken(format!(
            "hung: not finished after {} s and killed ({} sets the limit)",
            limit.as_secs(),
            crate::isolate::LIMIT_VAR
        ));
    }
    match last_json(&out) {
        Some(facts) => classify(facts, python),
        None => broken(format!(
            "the probe ended ({}) without a report: {}",
            status.map_or_else(|e| e.to_string(), |s| s.to_string()),
            tail(&err)
        )),
    }
}

/// Every known framework `python` has, each checked: `command(args)` is the interpreter,
/// however the caller confines it, with `args` after it. No Python, or none installed: an
/// empty list.
pub fn check_all(command: impl Fn(&[String]) -> Command, python: &str) -> Vec<FrameworkCheck> {
    let installed = detect_installed(command(&["-c".into(), PROBE.into(), "detect".into()]));
    FRAMEWORKS
        .iter()
        .filter(|f| installed.iter().any(|name| name == f.name))
        .map(|f| {
            run_probe(
                command(&probe_args(f)),
                f,
                python,
                crate::isolate::time_limit(),
            )
        })
        .collect()
}

/// The frameworks the probe's `detect` run names; none when it cannot run.
fn detect_installed(mut command: Command) -> Vec<String> {
    #[derive(Deserialize)]
    struct Detected {
        frameworks: Vec<String>,
    }
    command.stdin(Stdio::null()).stderr(Stdio::null());
    let Ok(output) = command.output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<Detected>(line.trim()).ok())
        .map(|d| d.frameworks)
        .unwrap_or_default()
}

fn read_bounded(pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let mut pipe = pipe;
        let _ = pipe.by_ref().take(MAX_OUTPUT).read_to_end(&mut bytes);
        // Drain the rest so the child never blocks on a full pipe.
        let _ = std::io::copy(&mut pipe, &mut std::io::sink());
        bytes
    })
}

/// The facts on the probe's last line of stdout that parses.
fn last_json(out: &[u8]) -> Option<Facts> {
    String::from_utf8_lossy(out)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line.trim()).ok())
}

/// The last lines of stderr, for a message.
fn tail(err: &[u8]) -> String {
    let text = String::from_utf8_lossy(err);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(3);
    let tail = lines[start..].join(" | ");
    if tail.is_empty() {
        "nothing on stderr".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(json: serde_json::Value) -> FrameworkCheck {
        classify(
            serde_json::from_value(json).unwrap(),
            "/opt/conda/bin/python",
        )
    }

    #[test]
    fn cpu_build() {
        // Debian's python3-torch 1.13.1: torch.version.cuda is None.
        let check = facts(serde_json::json!({
            "framework": "pytorch", "python": "3.11.2", "stage": "run",
            "version": "1.13.1", "cuda": null, "hip": null, "cudnn": null
        }));
        assert_eq!(check.verdict, FrameworkVerdict::CpuBuild);
    }

    #[test]
    fn no_driver_is_no_device_with_torchs_reason() {
        let reason = "CUDA initialization: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx";
        let check = facts(serde_json::json!({
            "framework": "pytorch", "stage": "run", "version": "1.12.1+cu102",
            "cuda": "10.2", "available": false, "reason": reason
        }));
        assert_eq!(check.verdict, FrameworkVerdict::NoDevice);
        assert!(
            check.message.contains("Found no NVIDIA driver"),
            "{}",
            check.message
        );
    }

    #[test]
    fn old_driver_is_a_mismatch_naming_the_driver_needed() {
        let reason = "The NVIDIA driver on your system is too old (found version 11040).";
        let check = facts(serde_json::json!({
            "framework": "pytorch", "stage": "run", "version": "2.1.0",
            "cuda": "12.1", "available": false, "reason": reason
        }));
        assert_eq!(check.verdict, FrameworkVerdict::CudaMismatch);
        assert!(check.message.contains("≥ 525.60.13"), "{}", check.message);
        assert!(check.message.contains("≥ 530.30.02"), "{}", check.message);
    }

    #[test]
    fn missing_library_is_named() {
        for (error, name) in [
            (
                "OSError: libcudnn.so.8: cannot open shared object file: No such file or directory",
                "libcudnn.so.8",
            ),
            (
                "ValueError: libcublas.so.*[0-9] not found in the system path ['/x']",
                "libcublas.so.*[0-9]",
            ),
        ] {
            let check = facts(serde_json::json!({
                "framework": "pytorch", "stage": "import", "error": error
            }));
            assert_eq!(check.verdict, FrameworkVerdict::MissingLibrary, "{error}");
            assert!(
                check.message.contains(&format!("`{name}`")),
                "{}",
                check.message
            );
        }
        let check = facts(serde_json::json!({
            "framework": "pytorch", "stage": "import",
            "error": "ModuleNotFoundError: No module named 'typing_extensions'"
        }));
        assert_eq!(check.verdict, FrameworkVerdict::Broken);
        assert!(
            check.message.starts_with("import failed"),
            "{}",
            check.message
        );
    }

    #[test]
    fn other_reasons_are_not_available_with_the_reason() {
        let check = facts(serde_json::json!({
            "framework": "cupy", "stage": "run", "cuda": "12.4", "available": false,
            "reason": "CUDARuntimeError: cudaErrorDevicesUnavailable: all CUDA-capable devices are busy"
        }));
        assert_eq!(check.verdict, FrameworkVerdict::NotAvailable);
        assert!(check.message.contains("busy"));
    }

    fn on_gpu(autocast: serde_json::Value, released: u64) -> FrameworkCheck {
        facts(serde_json::json!({
            "framework": "pytorch", "stage": "run", "version": "2.11.0+cu130", "cuda": "13.0",
            "available": true, "device_count": 1,
            "devices": [{"name": "NVIDIA H200", "capability": "9.0"}],
            "autocast": autocast,
            "memory": {"baseline": 0, "allocated": 67108864, "released": released, "reserved_after": 0}
        }))
    }

    #[test]
    fn pass_needs_autocast_within_tolerance_and_memory_back() {
        let good = serde_json::json!([
            {"dtype": "float16", "result_dtype": "float16", "max_rel_error": 4e-4},
            {"dtype": "bfloat16", "result_dtype": "bfloat16", "max_rel_error": 3e-3}
        ]);
        let check = on_gpu(good.clone(), 0);
        assert_eq!(check.verdict, FrameworkVerdict::Pass, "{}", check.message);
        assert!(check.autocast.iter().all(|c| c.ok && c.tolerance > 0.0));
        let leaked = on_gpu(good, 67108864);
        assert_eq!(leaked.verdict, FrameworkVerdict::ComputeFailure);
        assert!(leaked.message.contains("memory did not come back"));
        let wrong = on_gpu(
            serde_json::json!([{"dtype": "float16", "result_dtype": "float32", "max_rel_error": 1.5}]),
            0,
        );
        assert_eq!(wrong.verdict, FrameworkVerdict::ComputeFailure);
        assert!(
            wrong.message.contains("float16 matmul"),
            "{}",
            wrong.message
        );
        let nan = on_gpu(
            serde_json::json!([{"dtype": "float16", "result_dtype": "float16", "max_rel_error": null}]),
            0,
        );
        assert_eq!(nan.verdict, FrameworkVerdict::ComputeFailure);
    }

    #[test]
    fn the_last_json_line_is_the_report() {
        let out = b"import noise\n{\"not\": \"this\"\n{\"framework\": \"jax\", \"cuda\": null, \"stage\": \"run\"}\n";
        let facts = last_json(out).unwrap();
        assert_eq!(facts.framework, "jax");
        assert!(last_json(b"Segmentation fault\n").is_none());
    }

    #[test]
    fn a_probe_that_cannot_start_is_broken_not_a_panic() {
        let check = run_probe(
            Command::new("/nonexistent/python"),
            &FRAMEWORKS[0],
            "/nonexistent/python",
            DEFAULT_LIMIT,
        );
        assert_eq!(check.verdict, FrameworkVerdict::Broken);
        assert!(check.message.contains("cannot start"), "{}", check.message);
    }

    #[test]
    fn the_probe_runs_on_a_real_python() {
        // This machine's python3 has none of the frameworks: detect finds none, and a probe
        // asked for PyTorch reports the failed import, not a crash.
        let python = |args: &[String]| {
            let mut command = Command::new("python3");
            command.args(args);
            command
        };
        assert_eq!(check_all(python, "python3"), Vec::new());
        let check = run_probe(
            python(&probe_args(&FRAMEWORKS[0])),
            &FRAMEWORKS[0],
            "python3",
            DEFAULT_LIMIT,
        );
        assert_eq!(check.verdict, FrameworkVerdict::Broken, "{}", check.message);
        assert_eq!(
            check.message,
            "import failed: ModuleNotFoundError: No module named 'torch'"
        );
        assert!(check.python_version.is_some_and(|v| v.starts_with('3')));
    }

    #[test]
    fn a_hung_probe_is_killed() {
        let mut sleep = Command::new("sleep");
        sleep.arg("30");
        let check = run_probe(sleep, &FRAMEWORKS[0], "sleep", Duration::from_millis(200));
        assert_eq!(check.verdict, FrameworkVerdict::Broken);
        assert!(check.message.starts_with("hung"), "{}", check.message);
    }
}
