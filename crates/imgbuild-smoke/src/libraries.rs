//! Which files are the CUDA libraries the smoke test loads (cudart, NVRTC and its builtins),
//! and finding them: in an image's layers (imgbuild does that) or under a prefix inside the
//! running image ([`find_under`], for the embedded executable).

use std::path::{Path, PathBuf};

/// The CUDA libraries to load, by absolute path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaLibraries {
    pub cudart: Option<PathBuf>,
    pub nvrtc: Option<PathBuf>,
    pub nvrtc_builtins: Option<PathBuf>,
    /// `CUDA_VERSION` of the image (its config, or the container's environment).
    pub cuda_version: Option<String>,
    /// The image's forward-compatibility libraries, extracted, for the run to put before
    /// the host driver's when [`crate::forward_compat`] decides so. Inside the image the
    /// container runtime has already decided, and this is `None`.
    pub compat_dir: Option<PathBuf>,
}

/// A library the smoke run is about to load, or has loaded: told to the observer of
/// [`crate::gpu::run_observed`], so that a process watching the run can name the library that
/// crashed it (see [`crate::isolate`]). The host driver is `libcuda.so.1`, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadEvent<'a> {
    Loading(&'a Path),
    Loaded(&'a Path),
}

/// Which CUDA library a file name is, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LibraryKind {
    Cudart,
    Nvrtc,
    NvrtcBuiltins,
}

impl LibraryKind {
    pub fn of(file_name: &str) -> Option<LibraryKind> {
        if file_name.starts_with("libnvrtc-builtins.so") {
            Some(LibraryKind::NvrtcBuiltins)
        } else if file_name.starts_with("libnvrtc.so") {
            Some(LibraryKind::Nvrtc)
        } else if file_name.starts_with("libcudart.so") {
            Some(LibraryKind::Cudart)
        } else {
            None
        }
    }
}

impl CudaLibraries {
    /// Picks, from the regular files (not links) found, the one of each kind with the longest
    /// name: the most specific soname (`libnvrtc.so.11.8.89` over a `libnvrtc.so.11.2` link).
    pub fn pick<'a>(
        files: impl IntoIterator<Item = &'a Path>,
        cuda_version: Option<String>,
    ) -> CudaLibraries {
        let mut libraries = CudaLibraries {
            cuda_version,
            ..CudaLibraries::default()
        };
        for path in files {
            let Some(kind) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(LibraryKind::of)
            else {
                continue;
            };
            let slot = match kind {
                LibraryKind::Cudart => &mut libraries.cudart,
                LibraryKind::Nvrtc => &mut libraries.nvrtc,
                LibraryKind::NvrtcBuiltins => &mut libraries.nvrtc_builtins,
            };
            let longer = |old: &PathBuf| {
                let (old_len, new_len) = (old.as_os_str().len(), path.as_os_str().len());
                new_len > old_len || (new_len == old_len && path > old.as_path())
            };
            if slot.as_ref().is_none_or(longer) {
                *slot = Some(path.to_path_buf());
            }
        }
        libraries
    }
}

/// The CUDA libraries under `roots` (searched recursively: conda puts them in `lib/`, NVIDIA's
/// wheels in `site-packages/nvidia/*/lib/`), and every library file found.
pub fn find_under(
    roots: &[PathBuf],
    cuda_version: Option<String>,
) -> (CudaLibraries, Vec<PathBuf>) {
    let mut files: Vec<PathBuf> = roots
        .iter()
        .flat_map(|root| walkdir::WalkDir::new(root).follow_links(false))
        .filter_map(Result::ok)
        .filter(|entry| {
            entry.file_type().is_file()
                && entry
                    .file_name()
                    .to_str()
                    .and_then(LibraryKind::of)
                    .is_some()
        })
        .map(walkdir::DirEntry::into_path)
        .collect();
    files.sort();
    let libraries = CudaLibraries::pick(files.iter().map(PathBuf::as_path), cuda_version);
    (libraries, files)
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "imgbuild-smoke stays free of dependencies"
)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(
            LibraryKind::of("libnvrtc-builtins.so.11.8"),
            Some(LibraryKind::NvrtcBuiltins)
        );
        assert_eq!(
            LibraryKind::of("libnvrtc.so.11.2"),
            Some(LibraryKind::Nvrtc)
        );
        assert_eq!(
            LibraryKind::of("libcudart.so.11.0"),
            Some(LibraryKind::Cudart)
        );
        assert_eq!(LibraryKind::of("libcudnn.so.8"), None);
    }

    #[test]
    fn the_most_specific_soname_wins() {
        let files = [
            Path::new("/x/lib/libnvrtc.so.11.2"),
            Path::new("/x/lib/libnvrtc.so.11.8.89"),
            Path::new("/x/lib/libcudart.so.11.8.89"),
            Path::new("/x/lib/libz.so"),
        ];
        let picked = CudaLibraries::pick(files, Some("11.8.89".into()));
        assert_eq!(picked.nvrtc.as_deref(), Some(files[1]));
        assert_eq!(picked.cudart.as_deref(), Some(files[2]));
        assert_eq!(picked.nvrtc_builtins, None);
    }

    #[test]
    fn finds_libraries_below_a_prefix_and_skips_links() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().to_path_buf();
        let lib = dir.join("lib/python3.9/site-packages/nvidia/cuda_nvrtc/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvrtc.so.11.8.89"), b"x").unwrap();
        std::fs::write(lib.join("libnvrtc-builtins.so.11.8"), b"x").unwrap();
        std::os::unix::fs::symlink("libnvrtc.so.11.8.89", lib.join("libnvrtc.so.11.8.89.0"))
            .unwrap();
        let (found, files) = find_under(std::slice::from_ref(&dir), None);
        assert_eq!(found.nvrtc, Some(lib.join("libnvrtc.so.11.8.89")));
        assert_eq!(
            found.nvrtc_builtins,
            Some(lib.join("libnvrtc-builtins.so.11.8"))
        );
        assert_eq!(found.cudart, None);
        assert_eq!(files.len(), 2);
    }
}
