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
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Pass => 0,
            Verdict::NoDevice => 3,
            Verdict::Incompatible => 4,
            Verdict::KernelFailure => 5,
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
    pub compatibility: Option<String>,
    /// How the kernel was built.
    pub kernel: Option<String>,
    pub runs: Vec<RunTiming>,
    pub verdict: Verdict,
    pub message: String,
}

impl SmokeReport {
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
            compatibility: None,
            kernel: None,
            runs: Vec::new(),
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
    pub fn to_text(&self) -> String {
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
        let verdict = self.verdict.as_str().to_uppercase();
        let _ = writeln!(out, "verdict          {verdict}: {}", self.message);
        out
    }
}
