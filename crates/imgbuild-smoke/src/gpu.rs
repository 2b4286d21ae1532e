//! The GPU run: loads the host driver through cudarc, compiles a kernel with the image's own
//! NVRTC (or takes PTX embedded here when the image has none), runs it on unified memory
//! (`cuMemAllocManaged`) initialised on the CPU, checks every element on the CPU, and repeats
//! with a prefetch to the device to show what on-demand page migration costs, then lets the
//! CPU and GPU take turns on the same pages to show what migrating back and forth costs.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::Instant,
};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg, sys,
};
use cudarc::nvrtc::Ptx;

use crate::{
    compat::{CudaVersion, minor_version_minimum},
    libraries::{CudaLibraries, LoadEvent},
    nvrtc,
    report::{GpuInfo, PingPongRound, PingPongTiming, RunTiming, SmokeReport, Verdict},
};

/// The kernel the smoke test runs: `data[i] = data[i] * factor + offset`.
pub(crate) const KERNEL_SOURCE: &str = r#"
extern "C" __global__ void scale_add(float* data, float factor, float offset, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        data[i] = data[i] * factor + offset;
    }
}
"#;

/// The same kernel as PTX (ISA 7.0, sm_50), for images without NVRTC: any driver of CUDA
/// 11.0 or newer can JIT it for any GPU it supports.
pub(crate) const EMBEDDED_PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry scale_add(
    .param .u64 scale_add_param_0,
    .param .f32 scale_add_param_1,
    .param .f32 scale_add_param_2,
    .param .u32 scale_add_param_3
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<5>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [scale_add_param_0];
    ld.param.f32 %f1, [scale_add_param_1];
    ld.param.f32 %f2, [scale_add_param_2];
    ld.param.u32 %r1, [scale_add_param_3];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f3, [%rd4];
    fma.rn.f32 %f4, %f3, %f1, %f2;
    st.global.f32 [%rd4], %f4;
DONE:
    ret;
}
"#;

/// The host's driver library, as cudarc loads it (by soname).
const DRIVER_LIBRARY: &str = "libcuda.so.1";

const FACTOR: f32 = 2.0;
const OFFSET: f32 = 1.0;
/// 16 MiB of f32: enough to see page migration, small next to any GPU.
const ELEMENTS: usize = 4 << 20;

/// How many times the ping-pong run moves the pages to the CPU and back to the GPU: enough
/// for a mean, min and max that say something, few enough to stay well under a second.
pub(crate) const PING_PONG_ROUNDS: usize = 8;
/// The host page size the CPU half of a ping-pong round writes at: one value per 4 KiB page
/// faults every page back to the host (on hosts with larger pages it just writes more often).
const PAGE_BYTES: usize = 4096;
/// The ping-pong kernel adds 1 to every element (`x * 1 + 1`): exact in f32 for the buffer's
/// values, so the CPU can check the result of every round on every element.
const PING_PONG_FACTOR: f32 = 1.0;
const PING_PONG_OFFSET: f32 = 1.0;

/// Runs the smoke test with `libraries` on this machine's first GPU and completes `report`.
/// Never panics: without a driver the verdict is [`Verdict::NoDevice`].
pub fn run(libraries: &CudaLibraries, report: SmokeReport) -> SmokeReport {
    run_observed(libraries, report, &mut |_| {})
}

/// [`run`], telling `on_load` of each library just before and just after it is loaded (the
/// image's cudart, NVRTC's builtins, NVRTC, the host's `libcuda.so.1`, then its
/// `libnvidia-ml.so.1` for the MIG state), so that a parent
/// process can name the one that crashed this one (see [`crate::isolate`]).
pub(crate) fn run_observed(
    libraries: &CudaLibraries,
    mut report: SmokeReport,
    on_load: &mut dyn FnMut(LoadEvent<'_>),
) -> SmokeReport {
    report.driver_version = driver_version();
    report.image_cudart = libraries.cudart.as_deref().and_then(|path| {
        on_load(LoadEvent::Loading(path));
        let version = cudart_version(path);
        on_load(LoadEvent::Loaded(path));
        version
    });
    // NVRTC needs no GPU: an image whose NVRTC cannot load (a library it needs is missing
    // from the image, say) is broken on any machine, so this is found even without a driver.
    let nvrtc = match libraries.nvrtc.as_deref() {
        Some(path) => {
            match nvrtc::Nvrtc::load(path, libraries.nvrtc_builtins.as_deref(), on_load) {
                Ok(nvrtc) => Some(nvrtc),
                Err(err) => {
                    report.verdict = Verdict::KernelFailure;
                    report.message = format!("the image's NVRTC does not load: {err}");
                    return report;
                }
            }
        }
        None => None,
    };
    report.image_nvrtc = nvrtc
        .as_ref()
        .map(|n| format!("{}.{}", n.version.0, n.version.1));

    // cudarc panics when it cannot load libcuda or a symbol: check first, and contain any
    // panic that is left, so a machine without a driver gets an answer, not a crash.
    let driver = Path::new(DRIVER_LIBRARY);
    on_load(LoadEvent::Loading(driver));
    // SAFETY: only tries to dlopen the driver library.
    let present = unsafe { sys::is_culib_present() };
    on_load(LoadEvent::Loaded(driver));
    if !present {
        report.message =
            "no NVIDIA driver found: libcuda.so.1 cannot be loaded on this machine".to_string();
        return report;
    }
    let shared = Arc::new(Mutex::new(report));
    let inner = shared.clone();
    let panic_message = Arc::new(Mutex::new(None::<String>));
    let hook_message = panic_message.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *hook_message.lock().unwrap_or_else(|e| e.into_inner()) = Some(info.to_string());
    }));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut report = inner.lock().unwrap_or_else(|e| e.into_inner());
        run_on_gpu(nvrtc.as_ref(), &mut report, on_load);
    }));
    std::panic::set_hook(previous);
    let mut report = Arc::try_unwrap(shared)
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .unwrap_or_else(|shared| shared.lock().unwrap_or_else(|e| e.into_inner()).clone());
    if outcome.is_err() {
        let why = panic_message
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        report.verdict = Verdict::NoDevice;
        report.message = format!("the CUDA driver could not be used: {why}");
    }
    report
}

/// The kernel driver's version from `/proc/driver/nvidia/version`, whose first line reads
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  …` or, for the open
/// modules, `… Open Kernel Module for x86_64  580.159.04  …`.
#[allow(
    clippy::disallowed_methods,
    reason = "imgbuild-smoke stays free of dependencies, and an unreadable file only means no version"
)]
pub(crate) fn driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_driver_version(text.lines().next()?)
}

fn parse_driver_version(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|word| {
            word.contains('.')
                && word
                    .split('.')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// `cudaRuntimeGetVersion` of the image's cudart, e.g. `11.8`.
fn cudart_version(path: &Path) -> Option<String> {
    // SAFETY: loads NVIDIA's cudart and calls its documented version query.
    unsafe {
        let library = libloading::Library::new(path).ok()?;
        let get: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
            library.get(b"cudaRuntimeGetVersion\0").ok()?;
        let mut version = 0;
        (get(&mut version) == 0).then(|| CudaVersion::from_driver_api(version).to_string())
    }
}

/// The 16 bytes that identify `device`: `cuDeviceGetUuid_v2` (CUDA 11.4), which names a MIG
/// instance by its own UUID, else `cuDeviceGetUuid`, which older drivers have. Both are
/// looked up first, as cudarc panics on a symbol the driver lacks.
fn device_uuid(device: sys::CUdevice) -> Result<[u8; 16], String> {
    type GetUuid = unsafe extern "C" fn(*mut sys::CUuuid, sys::CUdevice) -> sys::CUresult;
    // SAFETY: looks up symbols of the driver cudarc has loaded; called as cuda.h declares.
    unsafe {
        let has = |name: &str| sys::culib().get::<GetUuid>(name).is_ok();
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        let (call, result) = if has("cuDeviceGetUuid_v2") {
            (
                "cuDeviceGetUuid_v2",
                sys::cuDeviceGetUuid_v2(&mut uuid, device),
            )
        } else if has("cuDeviceGetUuid") {
            ("cuDeviceGetUuid", sys::cuDeviceGetUuid(&mut uuid, device))
        } else {
            return Err("the driver has no cuDeviceGetUuid".to_string());
        };
        if result != sys::cudaError_enum::CUDA_SUCCESS {
            return Err(format!("{call}: {result:?}"));
        }
        Ok(uuid.bytes.map(|b| b as u8))
    }
}

fn run_on_gpu(
    nvrtc: Option<&nvrtc::Nvrtc>,
    report: &mut SmokeReport,
    on_load: &mut dyn FnMut(LoadEvent<'_>),
) {
    let fail = |report: &mut SmokeReport, verdict, message: String| {
        report.verdict = verdict;
        report.message = message;
    };
    let mut driver_api = 0;
    // SAFETY: one out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver_api) };
    let driver_cuda = CudaVersion::from_driver_api(driver_api);
    report.driver_cuda = Some(driver_cuda.to_string());

    let context = match CudaContext::new(0) {
        Ok(context) => context,
        Err(err) => {
            return fail(report, Verdict::NoDevice, format!("no usable GPU: {err}"));
        }
    };
    let attribute = |a| context.attribute(a).unwrap_or(0);
    let (major, minor) = context.compute_capability().unwrap_or((0, 0));
    let (free, total) = context.mem_get_info().unwrap_or((0, 0));
    let gpu = GpuInfo {
        name: context.name().unwrap_or_default(),
        compute_capability: format!("{major}.{minor}"),
        total_memory_mib: (total >> 20) as u64,
        free_memory_mib: (free >> 20) as u64,
        managed_memory: attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) != 0,
        concurrent_managed_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        ) != 0,
        pageable_memory_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
        ) != 0,
    };
    report.gpu = Some(gpu.clone());
    // The MIG state, before anything can fail the run: it says what the device was.
    report.mig = Some(crate::mig::query(device_uuid(context.cu_device()), on_load));

    // Which CUDA the image needs: its config's CUDA_VERSION, else its NVRTC or cudart.
    let image_cuda: Option<CudaVersion> = report
        .image_cuda
        .as_deref()
        .and_then(|v| {
            let mut parts = v.split('.');
            format!("{}.{}", parts.next()?, parts.next().unwrap_or("0"))
                .parse()
                .ok()
        })
        .or_else(|| report.image_nvrtc.as_deref().and_then(|v| v.parse().ok()))
        .or_else(|| report.image_cudart.as_deref().and_then(|v| v.parse().ok()));
    if let Some(needed) = image_cuda {
        if needed.major > driver_cuda.major {
            let needs = minor_version_minimum(needed.major)
                .map(|d| format!("driver {d} or newer"))
                .unwrap_or_else(|| "a newer driver".to_string());
            report.compatibility = Some(format!(
                "CUDA {needed} needs {needs}; this driver supports CUDA {driver_cuda}"
            ));
            return fail(
                report,
                Verdict::Incompatible,
                format!(
                    "the image's CUDA {needed} is newer than this driver's CUDA {driver_cuda}: it needs {needs}"
                ),
            );
        }
        report.compatibility = Some(if needed <= driver_cuda {
            format!("CUDA {needed} on a CUDA {driver_cuda} driver: supported")
        } else {
            format!(
                "CUDA {needed} on a CUDA {driver_cuda} driver: minor-version compatibility (kernels must be built for the device)"
            )
        });
    }

    // The kernel: PTX from the image's NVRTC, SASS when this driver cannot JIT that PTX.
    let arch = format!("{major}{minor}");
    let module = match nvrtc {
        None => {
            report.kernel = Some("embedded PTX (ISA 7.0, sm_50): the image has no NVRTC".into());
            context.load_module(Ptx::from_src(EMBEDDED_PTX))
        }
        Some(nvrtc) => {
            let version = format!("{}.{}", nvrtc.version.0, nvrtc.version.1);
            let ptx = match nvrtc.compile(
                KERNEL_SOURCE,
                &[format!("--gpu-architecture=compute_{arch}")],
                false,
            ) {
                Ok(ptx) => ptx,
                Err(err) => {
                    return fail(
                        report,
                        Verdict::KernelFailure,
                        format!("NVRTC {version} failed: {err}"),
                    );
                }
            };
            match context.load_module(Ptx::from_binary(ptx.image)) {
                Ok(module) => {
                    report.kernel = Some(format!(
                        "image NVRTC {version} → PTX compute_{arch}, JIT-compiled by the driver"
                    ));
                    Ok(module)
                }
                Err(err) if err.0 == sys::cudaError_enum::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
                    // NVIDIA's advice for NVRTC under minor-version compatibility: compile
                    // to SASS for the device instead of shipping PTX the driver cannot JIT.
                    let cubin = match nvrtc.compile(
                        KERNEL_SOURCE,
                        &[format!("--gpu-architecture=sm_{arch}")],
                        true,
                    ) {
                        Ok(cubin) => cubin,
                        Err(err) => {
                            return fail(
                                report,
                                Verdict::Incompatible,
                                format!(
                                    "NVRTC {version} emits PTX this driver (CUDA {driver_cuda}) cannot JIT, and compiling to SASS failed: {err}"
                                ),
                            );
                        }
                    };
                    report.kernel = Some(format!(
                        "image NVRTC {version} → PTX rejected by the CUDA {driver_cuda} driver (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); compiled to SASS sm_{arch} instead (minor-version compatibility)"
                    ));
                    context.load_module(Ptx::from_binary(cubin.image))
                }
                Err(err) => Err(err),
            }
        }
    };
    let function = match module.and_then(|m| m.load_function("scale_add")) {
        Ok(function) => function,
        Err(err) => {
            return fail(
                report,
                Verdict::Incompatible,
                format!("the kernel does not load on this driver: {err}"),
            );
        }
    };

    if !gpu.managed_memory {
        return fail(
            report,
            Verdict::KernelFailure,
            "this GPU does not support managed memory".into(),
        );
    }
    // Never ask for more managed memory than the GPU has free.
    let elements = ELEMENTS.min(free / 4 / std::mem::size_of::<f32>());
    if elements < 1024 {
        return fail(
            report,
            Verdict::KernelFailure,
            format!("too little free GPU memory ({} MiB)", free >> 20),
        );
    }

    let stream = context.default_stream();
    for prefetch in [false, true] {
        let run = (|| -> Result<RunTiming, cudarc::driver::DriverError> {
            // SAFETY: f32 is valid for any bit pattern.
            let mut data = unsafe { context.alloc_unified::<f32>(elements, true)? };
            for (i, value) in data.as_mut_slice()?.iter_mut().enumerate() {
                *value = i as f32;
            }
            let mut prefetch_ms = None;
            if prefetch && gpu.concurrent_managed_access {
                let started = Instant::now();
                data.prefetch()?;
                stream.synchronize()?;
                prefetch_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            }
            let started = Instant::now();
            let mut launch = stream.launch_builder(&function);
            let n = elements as u32;
            launch.arg(&mut data).arg(&FACTOR).arg(&OFFSET).arg(&n);
            // SAFETY: the argument list matches `scale_add`'s signature.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n))? };
            stream.synchronize()?;
            let kernel_ms = started.elapsed().as_secs_f64() * 1e3;
            let mismatches = data
                .as_slice()?
                .iter()
                .enumerate()
                .filter(|(i, v)| **v != (*i as f32) * FACTOR + OFFSET)
                .count();
            Ok(RunTiming {
                name: if prefetch {
                    "prefetched to the GPU"
                } else {
                    "on-demand page migration"
                }
                .to_string(),
                prefetch_ms,
                kernel_ms,
                elements,
                mismatches,
            })
        })();
        match run {
            Ok(timing) => report.runs.push(timing),
            Err(err) => {
                return fail(
                    report,
                    Verdict::KernelFailure,
                    format!("the kernel run failed: {err}"),
                );
            }
        }
    }
    match ping_pong(&context, &stream, &function, elements) {
        Ok(timing) => report.ping_pong = Some(timing),
        Err(err) => {
            return fail(
                report,
                Verdict::KernelFailure,
                format!("the CPU/GPU ping-pong run failed: {err}"),
            );
        }
    }
    let wrong: usize = report.runs.iter().map(|r| r.mismatches).sum::<usize>()
        + report.ping_pong.as_ref().map_or(0, |p| p.mismatches);
    if wrong > 0 {
        return fail(
            report,
            Verdict::KernelFailure,
            format!("{wrong} elements were computed wrong"),
        );
    }
    report.verdict = Verdict::Pass;
    report.message = format!(
        "{} elements computed on the GPU and verified on the CPU, twice",
        report.runs.first().map_or(0, |r| r.elements)
    );
}

/// The third run: for [`PING_PONG_ROUNDS`] rounds the kernel touches every element of a fresh
/// managed buffer, then the CPU writes every page, so each round migrates every page to the
/// GPU and back (the cost neither the on-demand nor the prefetched run shows). The GPU goes
/// first because the buffer starts on the host: with the CPU first, round 1 would find its
/// pages already there and cost less than the others. Host timers around each half, as the
/// other runs; the values are checked on the CPU at the end.
fn ping_pong(
    context: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    function: &CudaFunction,
    elements: usize,
) -> Result<PingPongTiming, DriverError> {
    // SAFETY: f32 is valid for any bit pattern.
    let mut data = unsafe { context.alloc_unified::<f32>(elements, true)? };
    for (i, value) in data.as_mut_slice()?.iter_mut().enumerate() {
        *value = i as f32;
    }
    let n = elements as u32;
    let mut rounds = Vec::with_capacity(PING_PONG_ROUNDS);
    for _ in 0..PING_PONG_ROUNDS {
        let started = Instant::now();
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&mut data)
            .arg(&PING_PONG_FACTOR)
            .arg(&PING_PONG_OFFSET)
            .arg(&n);
        // SAFETY: the argument list matches `scale_add`'s signature.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n))? };
        stream.synchronize()?;
        let gpu_ms = started.elapsed().as_secs_f64() * 1e3;

        let started = Instant::now();
        touch_every_page(data.as_mut_slice()?);
        let cpu_ms = started.elapsed().as_secs_f64() * 1e3;
        rounds.push(PingPongRound { cpu_ms, gpu_ms });
    }
    let mismatches = ping_pong_mismatches(data.as_slice()?, PING_PONG_ROUNDS);
    Ok(PingPongTiming::new(rounds, elements, mismatches))
}

/// The CPU half of a round: adds 1 to the first value of every page, a read and a write that
/// fault the page back to the host.
fn touch_every_page(values: &mut [f32]) {
    let per_page = PAGE_BYTES / std::mem::size_of::<f32>();
    for value in values.iter_mut().step_by(per_page) {
        *value += 1.0;
    }
}

/// How many of `values` differ from what `rounds` ping-pong rounds leave: each element starts
/// as its index and gains 1 per round from the kernel, and the first of each page 1 more per
/// round from the CPU.
fn ping_pong_mismatches(values: &[f32], rounds: usize) -> usize {
    let per_page = PAGE_BYTES / std::mem::size_of::<f32>();
    values
        .iter()
        .enumerate()
        .filter(|&(i, &value)| {
            let touched = if i % per_page == 0 { rounds } else { 0 };
            value != (i + rounds + touched) as f32
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_version_lines() {
        assert_eq!(
            parse_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu Oct  2 2025").as_deref(),
            Some("580.159.04")
        );
        assert_eq!(
            parse_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023").as_deref(),
            Some("535.104.05")
        );
        assert_eq!(parse_driver_version("garbage"), None);
    }

    /// The kernel's arithmetic on the CPU, as `scale_add` does it on the GPU.
    fn scale_add(values: &mut [f32], factor: f32, offset: f32) {
        for value in values {
            *value = value.mul_add(factor, offset);
        }
    }

    fn ping_pong_on_cpu(elements: usize, rounds: usize) -> Vec<f32> {
        let mut values: Vec<f32> = (0..elements).map(|i| i as f32).collect();
        for _ in 0..rounds {
            scale_add(&mut values, PING_PONG_FACTOR, PING_PONG_OFFSET);
            touch_every_page(&mut values);
        }
        values
    }

    #[test]
    fn ping_pong_check_matches_the_rounds() {
        // The smoke's own buffer size: the values stay exact in f32.
        let values = ping_pong_on_cpu(ELEMENTS, PING_PONG_ROUNDS);
        assert_eq!(ping_pong_mismatches(&values, PING_PONG_ROUNDS), 0);
    }

    #[test]
    fn ping_pong_check_sees_a_lost_half_round() {
        let per_page = PAGE_BYTES / std::mem::size_of::<f32>();
        let elements = 4 * per_page;
        // A round without the kernel: every element is off.
        let mut values = ping_pong_on_cpu(elements, PING_PONG_ROUNDS - 1);
        touch_every_page(&mut values);
        assert_eq!(ping_pong_mismatches(&values, PING_PONG_ROUNDS), elements);
        // A round without the CPU's write: the first value of each page is off.
        let mut values = ping_pong_on_cpu(elements, PING_PONG_ROUNDS - 1);
        scale_add(&mut values, PING_PONG_FACTOR, PING_PONG_OFFSET);
        assert_eq!(ping_pong_mismatches(&values, PING_PONG_ROUNDS), 4);
    }
}
