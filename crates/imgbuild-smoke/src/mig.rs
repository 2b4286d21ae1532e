//! The GPU's MIG (Multi-Instance GPU) state, from NVML: `libnvidia-ml.so.1`, the driver's
//! own management library, loaded at run time like the driver (no link-time dependency).
//!
//! The CUDA device the test runs on is found in NVML by its UUID: `cuDeviceGetUuid_v2` gives
//! 16 bytes, NVML names a GPU `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` and a MIG instance
//! `MIG-…` with the same digits ([`nvml_uuid`]). Then `nvmlDeviceIsMigDeviceHandle` says
//! whether it is a MIG instance, and `nvmlDeviceGetMigMode` (of the parent GPU, for an
//! instance) gives the current and pending mode. The signatures and return codes are those of
//! NVIDIA's `nvml.h` (NVML API 13, as vendored in NVIDIA/go-nvml).
//!
//! NVML is a witness, not a test: when it cannot be loaded or answers an error, the state is
//! `unknown` with the reason, and the verdict does not change.

use std::{
    ffi::{CString, c_char, c_int, c_uint, c_void},
    path::Path,
};

use crate::{
    libraries::LoadEvent,
    report::{MigMode, MigState},
};

/// NVML, as the driver installs it (by soname).
pub(crate) const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// `nvmlReturn_t`.
type NvmlReturn = c_int;
/// `nvmlDevice_t`: a pointer to an opaque `struct nvmlDevice_st`.
type NvmlDevice = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;

/// `NVML_DEVICE_MIG_DISABLE`, `NVML_DEVICE_MIG_ENABLE`.
const NVML_DEVICE_MIG_DISABLE: c_uint = 0;
const NVML_DEVICE_MIG_ENABLE: c_uint = 1;

/// The name `nvml.h` gives a return code, e.g. `NVML_ERROR_NOT_FOUND`.
pub(crate) fn error_name(code: c_int) -> String {
    let name = match code {
        0 => "NVML_SUCCESS",
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        5 => "NVML_ERROR_ALREADY_INITIALIZED",
        6 => "NVML_ERROR_NOT_FOUND",
        7 => "NVML_ERROR_INSUFFICIENT_SIZE",
        8 => "NVML_ERROR_INSUFFICIENT_POWER",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        10 => "NVML_ERROR_TIMEOUT",
        11 => "NVML_ERROR_IRQ_ISSUE",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
        14 => "NVML_ERROR_CORRUPTED_INFOROM",
        15 => "NVML_ERROR_GPU_IS_LOST",
        16 => "NVML_ERROR_RESET_REQUIRED",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        19 => "NVML_ERROR_IN_USE",
        20 => "NVML_ERROR_MEMORY",
        21 => "NVML_ERROR_NO_DATA",
        22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
        24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        26 => "NVML_ERROR_DEPRECATED",
        27 => "NVML_ERROR_NOT_READY",
        28 => "NVML_ERROR_GPU_NOT_FOUND",
        29 => "NVML_ERROR_INVALID_STATE",
        30 => "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
        999 => "NVML_ERROR_UNKNOWN",
        other => return format!("NVML error {other}"),
    };
    name.to_string()
}

/// Which kind of NVML device a UUID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UuidKind {
    /// A whole GPU: `GPU-…`.
    Gpu,
    /// A MIG instance: `MIG-…` (drivers R470 and newer; R450 named them by their GPU, GI and CI).
    Mig,
}

/// The NVML name of the device whose CUDA UUID is `bytes`: `GPU-` or `MIG-`, then the bytes in
/// order as lowercase hex, dashes after the 4th, 6th, 8th and 10th byte.
pub(crate) fn nvml_uuid(kind: UuidKind, bytes: &[u8; 16]) -> String {
    let hex = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let prefix = match kind {
        UuidKind::Gpu => "GPU",
        UuidKind::Mig => "MIG",
    };
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// A call that did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The NVML function.
    pub call: &'static str,
    /// What it returned; `None` when this NVML has no such function.
    pub code: Option<NvmlReturn>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(code) => write!(f, "{}: {}", self.call, error_name(code)),
            None => write!(f, "this driver's NVML has no {}", self.call),
        }
    }
}

/// What NVML answered about the CUDA device; [`state`] turns it into the report's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// NVML could not be asked about the device: why.
    Unavailable(String),
    /// NVML found the device.
    Found {
        /// Whether it is a MIG instance.
        instance: bool,
        /// `nvmlDeviceGetMigMode` of the GPU (the instance's parent): current and pending.
        mode: Result<(c_uint, c_uint), Failure>,
    },
}

fn mode_of(value: c_uint) -> MigMode {
    match value {
        NVML_DEVICE_MIG_DISABLE => MigMode::Disabled,
        NVML_DEVICE_MIG_ENABLE => MigMode::Enabled,
        _ => MigMode::Unknown,
    }
}

/// The report's MIG state for what NVML answered.
pub fn state(answer: Answer) -> MigState {
    let unknown = |instance, reason: String| MigState {
        mode: MigMode::Unknown,
        pending: MigMode::Unknown,
        instance,
        source: "nvml".to_string(),
        reason: Some(reason),
    };
    match answer {
        Answer::Unavailable(reason) => unknown(None, reason),
        Answer::Found {
            instance,
            mode: Ok((current, pending)),
        } => {
            let (mode, pending_mode) = (mode_of(current), mode_of(pending));
            let odd = mode == MigMode::Unknown || pending_mode == MigMode::Unknown;
            MigState {
                mode,
                pending: pending_mode,
                instance: Some(instance),
                source: "nvml".to_string(),
                reason: odd.then(|| {
                    format!(
                        "nvmlDeviceGetMigMode answered current {current}, pending {pending} (0 disabled, 1 enabled)"
                    )
                }),
            }
        }
        // A MIG instance exists only on a GPU in MIG mode.
        Answer::Found {
            instance: true,
            mode: Err(failure),
        } => MigState {
            mode: MigMode::Enabled,
            pending: MigMode::Unknown,
            instance: Some(true),
            source: "nvml".to_string(),
            reason: Some(format!(
                "the device is a MIG instance, so its GPU is in MIG mode; the GPU's own mode was not read ({failure})"
            )),
        },
        Answer::Found {
            instance: false,
            mode: Err(failure),
        } => match failure.code {
            // The GPU (or, for a missing function, the driver: MIG came with R450) has no MIG.
            Some(NVML_ERROR_NOT_SUPPORTED) | None => MigState {
                mode: MigMode::NotSupported,
                pending: MigMode::NotSupported,
                instance: Some(false),
                source: "nvml".to_string(),
                reason: failure.code.is_none().then(|| failure.to_string()),
            },
            Some(_) => unknown(Some(false), failure.to_string()),
        },
    }
}

/// The MIG state of the CUDA device whose UUID (`cuDeviceGetUuid_v2`) is `uuid`, asked of
/// NVML; `on_load` hears of `libnvidia-ml.so.1` before and after it is loaded and initialised
/// (see [`crate::isolate`]). Never fails: what NVML cannot say is `unknown`, with the reason.
pub fn query(uuid: Result<[u8; 16], String>, on_load: &mut dyn FnMut(LoadEvent<'_>)) -> MigState {
    state(ask(uuid, on_load))
}

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
type IsMigFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint) -> NvmlReturn;
type ParentFn = unsafe extern "C" fn(NvmlDevice, *mut NvmlDevice) -> NvmlReturn;
type MigModeFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut c_uint) -> NvmlReturn;

fn ask(uuid: Result<[u8; 16], String>, on_load: &mut dyn FnMut(LoadEvent<'_>)) -> Answer {
    let uuid = match uuid {
        Ok(uuid) => uuid,
        Err(why) => return Answer::Unavailable(format!("the CUDA device's UUID: {why}")),
    };
    let path = Path::new(NVML_LIBRARY);
    on_load(LoadEvent::Loading(path));
    // SAFETY: loads the driver's NVML, whose initialisers are the driver's.
    let library = unsafe { libloading::Library::new(NVML_LIBRARY) };
    let library = match library {
        Ok(library) => library,
        Err(err) => {
            on_load(LoadEvent::Loaded(path));
            return Answer::Unavailable(format!("{NVML_LIBRARY} cannot be loaded: {err}"));
        }
    };
    let (Some(init), Some(shutdown), Some(by_uuid)) = (
        symbol::<InitFn>(&library, "nvmlInit_v2"),
        symbol::<InitFn>(&library, "nvmlShutdown"),
        symbol::<ByUuidFn>(&library, "nvmlDeviceGetHandleByUUID"),
    ) else {
        on_load(LoadEvent::Loaded(path));
        return Answer::Unavailable(format!(
            "{NVML_LIBRARY} lacks nvmlInit_v2, nvmlShutdown or nvmlDeviceGetHandleByUUID"
        ));
    };
    // SAFETY: no arguments; NVML counts its initialisations.
    let initialised = unsafe { init() };
    on_load(LoadEvent::Loaded(path));
    if initialised != NVML_SUCCESS {
        return Answer::Unavailable(format!("nvmlInit_v2: {}", error_name(initialised)));
    }
    let answer = ask_initialised(&library, &uuid, by_uuid);
    // SAFETY: one shutdown for the one successful init.
    unsafe { shutdown() };
    answer
}

/// The function `name` of `library`, of type `F` (a function pointer type of nvml.h's
/// declaration for that name); `None` when this NVML has none.
fn symbol<F: Copy>(library: &libloading::Library, name: &str) -> Option<F> {
    // SAFETY: every caller names `F` as nvml.h declares `name`; the pointer is used only while
    // `library` is loaded.
    unsafe { library.get::<F>(name).ok().map(|s| *s) }
}

/// The questions once NVML is initialised.
fn ask_initialised(library: &libloading::Library, uuid: &[u8; 16], by_uuid: ByUuidFn) -> Answer {
    let find = |kind| {
        let name = CString::new(nvml_uuid(kind, uuid)).expect("hex has no NUL");
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and an out-pointer, as nvml.h declares.
        let code = unsafe { by_uuid(name.as_ptr(), &mut device) };
        (code == NVML_SUCCESS).then_some(device).ok_or(code)
    };
    // A MIG instance's UUID is not a GPU's: NVML answers NOT_FOUND (or INVALID_ARGUMENT, for
    // a prefix it does not take) to the first question, and finds it as `MIG-…`.
    let (device, found_as_mig) = match find(UuidKind::Gpu) {
        Ok(device) => (device, false),
        Err(NVML_ERROR_NOT_FOUND | NVML_ERROR_INVALID_ARGUMENT) => match find(UuidKind::Mig) {
            Ok(device) => (device, true),
            Err(code) => {
                return Answer::Unavailable(format!(
                    "NVML has no GPU or MIG device of the CUDA device's UUID (nvmlDeviceGetHandleByUUID: {})",
                    error_name(code)
                ));
            }
        },
        Err(code) => {
            return Answer::Unavailable(format!("nvmlDeviceGetHandleByUUID: {}", error_name(code)));
        }
    };
    let is_mig = symbol::<IsMigFn>(library, "nvmlDeviceIsMigDeviceHandle");
    let parent = symbol::<ParentFn>(library, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    let mig_mode = symbol::<MigModeFn>(library, "nvmlDeviceGetMigMode");

    // What NVML says of the handle; which name found it when it cannot say.
    let instance = is_mig
        .and_then(|is_mig| {
            let mut flag: c_uint = 0;
            // SAFETY: a handle NVML gave and an out-pointer.
            (unsafe { is_mig(device, &mut flag) } == NVML_SUCCESS).then_some(flag != 0)
        })
        .unwrap_or(found_as_mig);
    let gpu = if instance {
        match parent {
            None => Err(Failure {
                call: "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                code: None,
            }),
            Some(parent) => {
                let mut gpu: NvmlDevice = std::ptr::null_mut();
                // SAFETY: a MIG handle NVML gave and an out-pointer.
                match unsafe { parent(device, &mut gpu) } {
                    NVML_SUCCESS => Ok(gpu),
                    code => Err(Failure {
                        call: "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                        code: Some(code),
                    }),
                }
            }
        }
    } else {
        Ok(device)
    };
    let mode = gpu.and_then(|gpu| {
        let mig_mode = mig_mode.ok_or(Failure {
            call: "nvmlDeviceGetMigMode",
            code: None,
        })?;
        let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
        // SAFETY: a GPU handle NVML gave and two out-pointers.
        match unsafe { mig_mode(gpu, &mut current, &mut pending) } {
            NVML_SUCCESS => Ok((current, pending)),
            code => Err(Failure {
                call: "nvmlDeviceGetMigMode",
                code: Some(code),
            }),
        }
    });
    Answer::Found { instance, mode }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: [u8; 16] = [
        0x2f, 0x41, 0x9a, 0x0c, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb,
        0x0d,
    ];

    #[test]
    fn uuids_as_nvml_names_them() {
        assert_eq!(
            nvml_uuid(UuidKind::Gpu, &H200),
            "GPU-2f419a0c-1122-3344-5566-778899aabb0d"
        );
        assert_eq!(
            nvml_uuid(UuidKind::Mig, &H200),
            "MIG-2f419a0c-1122-3344-5566-778899aabb0d"
        );
        let name = nvml_uuid(UuidKind::Gpu, &[0; 16]);
        assert_eq!(name, "GPU-00000000-0000-0000-0000-000000000000");
        // What nvmlDeviceGetUUID writes fits NVML_DEVICE_UUID_BUFFER_SIZE (80) with its NUL.
        assert_eq!(name.len(), 40);
    }

    #[test]
    fn error_names_are_nvml_h_s() {
        assert_eq!(error_name(3), "NVML_ERROR_NOT_SUPPORTED");
        assert_eq!(error_name(6), "NVML_ERROR_NOT_FOUND");
        assert_eq!(error_name(9), "NVML_ERROR_DRIVER_NOT_LOADED");
        assert_eq!(error_name(999), "NVML_ERROR_UNKNOWN");
        assert_eq!(error_name(77), "NVML error 77");
    }

    fn found(instance: bool, mode: Result<(c_uint, c_uint), Failure>) -> MigState {
        state(Answer::Found { instance, mode })
    }

    fn failed(call: &'static str, code: Option<c_int>) -> Failure {
        Failure { call, code }
    }

    #[test]
    fn a_whole_gpu_s_modes() {
        let disabled = found(false, Ok((0, 0)));
        assert_eq!(
            (disabled.mode, disabled.pending, disabled.instance),
            (MigMode::Disabled, MigMode::Disabled, Some(false))
        );
        assert_eq!((disabled.source.as_str(), disabled.reason), ("nvml", None));
        // Enabled with `nvidia-smi -mig 1`, not yet reset.
        let pending = found(false, Ok((0, 1)));
        assert_eq!(
            (pending.mode, pending.pending),
            (MigMode::Disabled, MigMode::Enabled)
        );
        let odd = found(false, Ok((7, 0)));
        assert_eq!(odd.mode, MigMode::Unknown);
        assert!(odd.reason.unwrap().contains("current 7"));
    }

    #[test]
    fn a_gpu_without_mig_is_not_supported() {
        let state = found(false, Err(failed("nvmlDeviceGetMigMode", Some(3))));
        assert_eq!(
            (state.mode, state.pending, state.instance, state.reason),
            (
                MigMode::NotSupported,
                MigMode::NotSupported,
                Some(false),
                None
            )
        );
        // A driver older than MIG (R450) has no nvmlDeviceGetMigMode.
        let old = found(false, Err(failed("nvmlDeviceGetMigMode", None)));
        assert_eq!(old.mode, MigMode::NotSupported);
        assert_eq!(
            old.reason.as_deref(),
            Some("this driver's NVML has no nvmlDeviceGetMigMode")
        );
    }

    #[test]
    fn a_mig_instance_s_gpu_is_in_mig_mode() {
        let state = found(true, Ok((1, 1)));
        assert_eq!(
            (state.mode, state.pending, state.instance, state.reason),
            (MigMode::Enabled, MigMode::Enabled, Some(true), None)
        );
        // Its parent's mode not read: still enabled, as an instance says.
        let state = found(
            true,
            Err(failed(
                "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                Some(4),
            )),
        );
        assert_eq!(
            (state.mode, state.pending, state.instance),
            (MigMode::Enabled, MigMode::Unknown, Some(true))
        );
        assert!(
            state.reason.unwrap().ends_with(
                "(nvmlDeviceGetDeviceHandleFromMigDeviceHandle: NVML_ERROR_NO_PERMISSION)"
            )
        );
    }

    #[test]
    fn errors_are_unknown_with_the_reason() {
        let state = found(false, Err(failed("nvmlDeviceGetMigMode", Some(15))));
        assert_eq!(
            (state.mode, state.pending, state.instance),
            (MigMode::Unknown, MigMode::Unknown, Some(false))
        );
        assert_eq!(
            state.reason.as_deref(),
            Some("nvmlDeviceGetMigMode: NVML_ERROR_GPU_IS_LOST")
        );
        let state = state_of_unavailable("nvmlInit_v2: NVML_ERROR_DRIVER_NOT_LOADED");
        assert_eq!(
            (state.mode, state.pending, state.instance),
            (MigMode::Unknown, MigMode::Unknown, None)
        );
    }

    fn state_of_unavailable(why: &str) -> MigState {
        state(Answer::Unavailable(why.to_string()))
    }

    /// Without NVML (CI, this machine without a driver) the query answers, never fails.
    #[test]
    #[allow(clippy::print_stderr)] // says why it skipped
    fn without_nvml_the_state_is_unknown() {
        if Path::new("/proc/driver/nvidia/version").exists() {
            eprintln!("skipped: this machine has an NVIDIA driver");
            return;
        }
        let mut events = Vec::new();
        let state = query(Ok(H200), &mut |event| {
            events.push(matches!(event, LoadEvent::Loading(_)))
        });
        assert_eq!(state.mode, MigMode::Unknown);
        let reason = state.reason.unwrap();
        assert!(
            reason.starts_with("libnvidia-ml.so.1 cannot be loaded") || reason.contains("nvmlInit"),
            "{reason}"
        );
        assert_eq!(events, [true, false], "loading, then loaded");
        let state = query(Err("CUDA_ERROR_INVALID_DEVICE".into()), &mut |_| {});
        assert_eq!(
            state.reason.as_deref(),
            Some("the CUDA device's UUID: CUDA_ERROR_INVALID_DEVICE")
        );
    }
}
