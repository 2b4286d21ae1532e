//! `imgbuild smoke`: proves an image's CUDA stack on this machine's GPU.
//!
//! The image's own CUDA libraries are extracted from its layers ([`extract`]) and handed to
//! the run of the `imgbuild-smoke` crate, the same code the in-image executable
//! (`[smoke] embed = true`) runs on a cluster node; see that crate for what the run does.

pub mod embed;
pub mod extract;

use std::path::Path;

pub use imgbuild_smoke::{SmokeReport, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    #[error("Cannot open image `{image}`")]
    Open {
        image: String,
        #[source]
        source: extract::ExtractError,
    },
}

/// `layout[:tag]` → (layout, tag).
fn split_reference(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') && !path.is_empty() => (path, tag),
        _ => (image, "latest"),
    }
}

/// Runs the smoke test on `image` (`LAYOUT[:TAG]`).
pub fn smoke(image: &str) -> Result<SmokeReport, SmokeError> {
    let (layout, tag) = split_reference(image);
    let opened =
        extract::open_image(Path::new(layout), tag).map_err(|source| SmokeError::Open {
            image: image.to_string(),
            source: source.into(),
        })?;
    let cuda = extract::extract_cuda_libraries(&opened).map_err(|source| SmokeError::Open {
        image: image.to_string(),
        source,
    })?;
    let report = SmokeReport::new(
        image.to_string(),
        cuda.libraries.cuda_version.clone(),
        cuda.sources.values().cloned().collect(),
    );
    Ok(imgbuild_smoke::run(&cuda.libraries, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        assert_eq!(split_reference("images/x"), ("images/x", "latest"));
        assert_eq!(split_reference("images/x:v1"), ("images/x", "v1"));
        assert_eq!(split_reference("/a:b/x"), ("/a:b/x", "latest"));
    }
}
