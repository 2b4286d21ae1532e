//! Pulls an image's CUDA libraries (cudart, NVRTC and its builtins) out of its layers into a
//! temporary directory, where the smoke test loads them by absolute path.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use imgbuild_smoke::libraries::{CudaLibraries, LibraryKind};
use rattler_conda_types::Subdir;

use crate::{
    compression::bounded::{self, Bound, Bounded},
    oci::{base::BaseImage, layout::Layout, read::ReadError},
};

/// The CUDA libraries found in an image.
#[derive(Debug)]
pub struct ImageCuda {
    /// Holds the extracted files; removed on drop.
    pub dir: tempfile::TempDir,
    /// The extracted libraries to load, and `CUDA_VERSION` from the image config.
    pub libraries: CudaLibraries,
    /// Where each extracted file was in the image.
    pub sources: BTreeMap<String, String>,
}

/// The most one extracted library may hold. The largest real one, `libnvrtc.so` of CUDA
/// 12 and 13, is 60 to 110 MB; cudart is under 1 MB and NVRTC's builtins under 10 MB.
pub const MAX_LIBRARY: u64 = 256 << 20;
/// Replaces [`MAX_LIBRARY`] (bytes, a positive integer); all libraries together may hold
/// twice it.
pub const MAX_LIBRARY_ENV: &str = "IMGBUILD_SMOKE_MAX_LIBRARY_BYTES";

/// What the extracted files may still hold: each at most `per_file`, all together (copies
/// a later layer replaces included) at most `left`. A layer's own ratio bound allows a
/// gigabyte of zeros from a megabyte of gzip; these keep that out of `TMPDIR`.
struct Budget {
    per_file: u64,
    left: u64,
}

impl Budget {
    fn from_env() -> Self {
        let per_file = bounded::env_u64(MAX_LIBRARY_ENV).unwrap_or(MAX_LIBRARY);
        Budget {
            per_file,
            left: per_file.saturating_mul(2),
        }
    }

    /// The bound of the next file, `path` in layer `digest`.
    fn next(&self, digest: &str, path: &str) -> Bound {
        let (max, rule) = if self.per_file <= self.left {
            (self.per_file, "the most one CUDA library may hold")
        } else {
            (
                self.left,
                "what is left of the most all CUDA libraries together may hold",
            )
        };
        Bound::new(
            max,
            format!("`{path}` in layer `{digest}`"),
            format!("{rule}; {MAX_LIBRARY_ENV} sets it"),
        )
    }

    fn spend(&mut self, bytes: u64) {
        self.left = self.left.saturating_sub(bytes);
    }
}

/// Copies the library `entry` to `target` through `bound`; the bytes written. A refused
/// library is removed again, so a bomb leaves nothing behind.
fn write_library(
    entry: &mut impl std::io::Read,
    target: &Path,
    bound: Bound,
) -> Result<u64, ExtractError> {
    let write_error = |source| ExtractError::Write {
        path: target.to_path_buf(),
        source,
    };
    let mut out = fs_err::File::create(target).map_err(write_error)?;
    let mut reader = Bounded::new(entry, bound);
    match std::io::copy(&mut reader, &mut out) {
        Ok(written) => Ok(written),
        Err(err) => {
            drop(out);
            let _ = fs_err::remove_file(target);
            Err(match bounded::TooLarge::in_io(&err) {
                Some(too_large) => ExtractError::TooLarge(too_large.clone()),
                None => write_error(err),
            })
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error(transparent)]
    TooLarge(bounded::TooLarge),
    #[error(transparent)]
    Open(#[from] ReadError),
    #[error("Failed to read layer `{digest}` of the image")]
    Layer {
        digest: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Opens the image `tag` of the layout at `dir` (for this machine's platform).
pub fn open_image(dir: &Path, tag: &str) -> Result<BaseImage, ReadError> {
    let layout = Layout::new(dir);
    let platform = Subdir::current().unwrap_or(Subdir::Linux64);
    let image = layout.image(tag, Some(platform))?;
    Ok(BaseImage::from_layout(&layout, image))
}

/// Where beneath the extraction directory the forward-compatibility libraries go.
const COMPAT_SUBDIR: &str = "compat";

/// Whether `path` (in the image) is a library of a CUDA forward-compatibility directory:
/// conda's `PREFIX/cuda-compat/` (which `compat = true` links to `/usr/local/cuda/compat`)
/// or NVIDIA's `/usr/local/cuda[-X.Y]/compat/`.
fn is_compat_library(path: &str) -> bool {
    let Some((parent, name)) = path.trim_start_matches("./").rsplit_once('/') else {
        return false;
    };
    let in_compat_dir = parent.ends_with("/cuda-compat")
        || parent
            .strip_prefix("usr/local/cuda")
            .and_then(|rest| rest.strip_suffix("/compat"))
            .is_some_and(|version| !version.contains('/'));
    in_compat_dir && name.starts_with("lib") && name.contains(".so")
}

/// Adds `libcuda.so` → `libcuda.so.1` to the extracted compat directory when it lacks one:
/// the run loads the driver as `libcuda.so` first (cudarc's order), which would otherwise
/// be found on the host past the compat directory, while the image's own CUDA asks for
/// `libcuda.so.1`.
fn link_unversioned_libcuda(compat_dir: &Path) -> Result<(), ExtractError> {
    let (soname, plain) = (
        compat_dir.join("libcuda.so.1"),
        compat_dir.join("libcuda.so"),
    );
    if !soname.exists() || plain.symlink_metadata().is_ok() {
        return Ok(());
    }
    std::os::unix::fs::symlink("libcuda.so.1", &plain).map_err(|source| ExtractError::Write {
        path: plain.clone(),
        source,
    })
}

/// Extracts the CUDA libraries of `image`; later layers win, as in the container.
pub fn extract_cuda_libraries(image: &BaseImage) -> Result<ImageCuda, ExtractError> {
    let dir = tempfile::Builder::new()
        .prefix("imgbuild-smoke-")
        .tempdir()
        .map_err(|source| ExtractError::Write {
            path: std::env::temp_dir(),
            source,
        })?;
    // File name → (in-image path, symlink target or None for a file).
    let mut found: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    let mut budget = Budget::from_env();
    let layer_error = |digest, source| ExtractError::Layer { digest, source };
    image.walk_layers(layer_error, |digest, path, entry| {
        let Some(name) = path.rsplit('/').next().map(str::to_string) else {
            return Ok(());
        };
        // Forward-compatibility libraries keep their own directory: they replace the host
        // driver's only when `forward_compat` decides so.
        let name = if is_compat_library(path) {
            format!("{COMPAT_SUBDIR}/{name}")
        } else if LibraryKind::of(&name).is_some() {
            name
        } else {
            return Ok(());
        };
        let target = dir.path().join(&name);
        if let Some(parent) = target.parent().filter(|p| !p.exists()) {
            fs_err::create_dir(parent).map_err(|source| ExtractError::Write {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let entry_type = entry.header().entry_type();
        if entry_type.is_symlink() {
            let link = entry
                .link_name()
                .map_err(|source| layer_error(digest.to_string(), source))?
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default();
            // Links between CUDA libraries point within their directory.
            let link_name = link.rsplit('/').next().unwrap_or(&link).to_string();
            found.insert(name, (path.to_string(), Some(link_name)));
        } else if entry_type.is_file() {
            let bound = budget.next(digest, path);
            let written = write_library(entry, &target, bound)?;
            budget.spend(written);
            found.insert(name, (path.to_string(), None));
        }
        Ok(())
    })?;
    for (name, (_, link)) in &found {
        if let Some(link) = link {
            let target = dir.path().join(name);
            let _ = fs_err::remove_file(&target);
            std::os::unix::fs::symlink(link, &target).map_err(|source| ExtractError::Write {
                path: target.clone(),
                source,
            })?;
        }
    }
    let cuda_version = image
        .config
        .config()
        .as_ref()
        .and_then(|c| c.env().as_ref())
        .and_then(|env| env.iter().find_map(|kv| kv.strip_prefix("CUDA_VERSION=")))
        .map(str::to_string);
    // Links are recreated beside the files, but the libraries loaded are the files.
    let files: Vec<PathBuf> = found
        .iter()
        .filter(|(name, (_, link))| link.is_none() && !name.starts_with(COMPAT_SUBDIR))
        .map(|(name, _)| dir.path().join(name))
        .collect();
    let compat_dir = dir.path().join(COMPAT_SUBDIR);
    if compat_dir.is_dir() {
        link_unversioned_libcuda(&compat_dir)?;
    }
    let mut libraries = CudaLibraries::pick(files.iter().map(PathBuf::as_path), cuda_version);
    libraries.compat_dir = compat_dir.is_dir().then_some(compat_dir);
    Ok(ImageCuda {
        libraries,
        sources: found
            .into_iter()
            .map(|(name, (path, _))| (name, path))
            .collect(),
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::is_compat_library;

    #[test]
    fn compat_libraries_are_those_of_a_compat_directory() {
        assert!(is_compat_library(
            "opt/conda/cuda-compat/libcuda.so.580.95.05"
        ));
        assert!(is_compat_library("usr/local/cuda/compat/libcuda.so.1"));
        assert!(is_compat_library(
            "usr/local/cuda-12.4/compat/libnvidia-ptxjitcompiler.so.550.54.15"
        ));
        assert!(!is_compat_library("opt/conda/lib/libcudart.so.12"));
        assert!(!is_compat_library("usr/local/cuda/x/compat/libcuda.so.1"));
        assert!(!is_compat_library("opt/conda/cuda-compat/README"));
    }
}
