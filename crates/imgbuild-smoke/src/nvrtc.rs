//! The image's own NVRTC, called through `dlopen` by absolute path.
//!
//! cudarc finds NVRTC by soname (`libnvrtc.so.12`, …) on the loader path, which cannot reach
//! an 11.x (`libnvrtc.so.11.2`) or 13.x library extracted from an image; NVRTC's C API is
//! small and stable across releases, so it is bound here directly.

use std::{
    ffi::{CStr, CString, c_char, c_int, c_void},
    path::Path,
};

use libloading::{Library, Symbol};

use crate::libraries::LoadEvent;

type Program = *mut c_void;
type NvrtcResult = c_int;

/// A loaded NVRTC. Keeps its builtins library loaded as long as it lives.
pub struct Nvrtc {
    library: Library,
    _builtins: Option<Library>,
    pub version: (i32, i32),
}

/// What a compilation produced.
pub struct Compiled {
    pub image: Vec<u8>,
    pub log: String,
}

fn symbol<'a, T>(library: &'a Library, name: &[u8]) -> Result<Symbol<'a, T>, String> {
    // SAFETY: the symbols are NVRTC's documented C API with the signatures used below.
    unsafe { library.get(name) }.map_err(|e| {
        format!(
            "NVRTC has no `{}`: {e}",
            String::from_utf8_lossy(&name[..name.len() - 1])
        )
    })
}

/// libloading says only "dlopen failed"; the loader's own reason (a missing
/// `libstdc++.so.6`, a `GLIBC_2.34` not found) is its source.
fn dlopen_error(err: &libloading::Error) -> String {
    match std::error::Error::source(err) {
        Some(reason) => reason.to_string(),
        None => err.to_string(),
    }
}

/// `dlopen`s `path`, telling `on_load` before and after.
fn load_library(path: &Path, on_load: &mut dyn FnMut(LoadEvent<'_>)) -> Result<Library, String> {
    on_load(LoadEvent::Loading(path));
    // SAFETY: loading a shared library runs its initialisers; these are NVIDIA's (and when
    // they crash, the process watching this one says so: see `crate::isolate`).
    let library = unsafe { Library::new(path) }
        .map_err(|e| format!("cannot load `{}`: {}", path.display(), dlopen_error(&e)))?;
    on_load(LoadEvent::Loaded(path));
    Ok(library)
}

impl Nvrtc {
    /// Loads `path`; `builtins` first, so NVRTC's own `dlopen` of it by soname finds it.
    /// `on_load` hears of each library before and after it is loaded.
    pub fn load(
        path: &Path,
        builtins: Option<&Path>,
        on_load: &mut dyn FnMut(LoadEvent<'_>),
    ) -> Result<Nvrtc, String> {
        let builtins = builtins.map(|b| load_library(b, on_load)).transpose()?;
        let library = load_library(path, on_load)?;
        let mut version = (0, 0);
        {
            let nvrtc_version: Symbol<unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult> =
                symbol(&library, b"nvrtcVersion\0")?;
            // SAFETY: two valid out-pointers.
            let result = unsafe { nvrtc_version(&mut version.0, &mut version.1) };
            if result != 0 {
                return Err(format!("nvrtcVersion failed with {result}"));
            }
        }
        Ok(Nvrtc {
            library,
            _builtins: builtins,
            version,
        })
    }

    fn error_string(&self, result: NvrtcResult) -> String {
        let Ok(get) = symbol::<unsafe extern "C" fn(NvrtcResult) -> *const c_char>(
            &self.library,
            b"nvrtcGetErrorString\0",
        ) else {
            return format!("NVRTC error {result}");
        };
        // SAFETY: NVRTC returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(get(result)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Compiles `source` with `options`; `cubin` selects SASS (`nvrtcGetCUBIN`) over PTX.
    pub fn compile(
        &self,
        source: &str,
        options: &[String],
        cubin: bool,
    ) -> Result<Compiled, String> {
        type Create = unsafe extern "C" fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> NvrtcResult;
        type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult;
        type Size = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;
        type Get = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;
        type Destroy = unsafe extern "C" fn(*mut Program) -> NvrtcResult;

        let create: Symbol<Create> = symbol(&self.library, b"nvrtcCreateProgram\0")?;
        let compile: Symbol<CompileFn> = symbol(&self.library, b"nvrtcCompileProgram\0")?;
        let log_size: Symbol<Size> = symbol(&self.library, b"nvrtcGetProgramLogSize\0")?;
        let get_log: Symbol<Get> = symbol(&self.library, b"nvrtcGetProgramLog\0")?;
        let (size_name, get_name): (&[u8], &[u8]) = if cubin {
            (b"nvrtcGetCUBINSize\0", b"nvrtcGetCUBIN\0")
        } else {
            (b"nvrtcGetPTXSize\0", b"nvrtcGetPTX\0")
        };
        let image_size: Symbol<Size> = symbol(&self.library, size_name)?;
        let get_image: Symbol<Get> = symbol(&self.library, get_name)?;
        let destroy: Symbol<Destroy> = symbol(&self.library, b"nvrtcDestroyProgram\0")?;

        let source = CString::new(source).map_err(|e| e.to_string())?;
        let name = CString::new("imgbuild_smoke.cu").expect("no NUL");
        let options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).expect("no NUL in options"))
            .collect();
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();

        let mut program: Program = std::ptr::null_mut();
        // SAFETY: valid C strings and out-pointer; no headers.
        let result = unsafe {
            create(
                &mut program,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if result != 0 {
            return Err(format!("nvrtcCreateProgram: {}", self.error_string(result)));
        }
        // SAFETY: `program` was created above; every buffer is sized by NVRTC's own answer.
        let outcome = unsafe {
            let compiled = compile(program, option_ptrs.len() as c_int, option_ptrs.as_ptr());
            let mut size = 0usize;
            let mut log = String::new();
            if log_size(program, &mut size) == 0 && size > 1 {
                let mut buffer = vec![0u8; size];
                if get_log(program, buffer.as_mut_ptr().cast()) == 0 {
                    log = String::from_utf8_lossy(&buffer[..size - 1])
                        .trim()
                        .to_string();
                }
            }
            if compiled != 0 {
                Err(format!(
                    "nvrtcCompileProgram: {}{}",
                    self.error_string(compiled),
                    if log.is_empty() {
                        String::new()
                    } else {
                        format!(": {log}")
                    }
                ))
            } else {
                let mut size = 0usize;
                let result = image_size(program, &mut size);
                let mut image = vec![0u8; size];
                if result != 0 || get_image(program, image.as_mut_ptr().cast()) != 0 {
                    Err(format!(
                        "NVRTC returned no {}",
                        if cubin { "CUBIN" } else { "PTX" }
                    ))
                } else {
                    Ok(Compiled { image, log })
                }
            }
        };
        // SAFETY: destroys the program created above, once.
        unsafe { destroy(&mut program) };
        outcome
    }
}
