//! Pulls an image's CUDA libraries (cudart, NVRTC and its builtins) out of its layers into a
//! temporary directory, where the smoke test loads them by absolute path.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use imgbuild_smoke::libraries::{CudaLibraries, LibraryKind};
use rattler_conda_types::Subdir;

use crate::oci::{base::BaseImage, layout::Layout, read::ReadError};

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

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
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
    let layer_error = |digest, source| ExtractError::Layer { digest, source };
    image.walk_layers(layer_error, |digest, path, entry| {
        let Some(name) = path.rsplit('/').next().map(str::to_string) else {
            return Ok(());
        };
        if LibraryKind::of(&name).is_none() {
            return Ok(());
        }
        let target = dir.path().join(&name);
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
            let mut out = fs_err::File::create(&target).map_err(|source| ExtractError::Write {
                path: target.clone(),
                source,
            })?;
            std::io::copy(entry, &mut out).map_err(|source| ExtractError::Write {
                path: target.clone(),
                source,
            })?;
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
        .filter(|(_, (_, link))| link.is_none())
        .map(|(name, _)| dir.path().join(name))
        .collect();
    Ok(ImageCuda {
        libraries: CudaLibraries::pick(files.iter().map(PathBuf::as_path), cuda_version),
        sources: found
            .into_iter()
            .map(|(name, (path, _))| (name, path))
            .collect(),
        dir,
    })
}
