//! `imgbuild smoke`: proves an image's CUDA stack on this machine's GPU.
//!
//! The image's own CUDA libraries are extracted from its layers ([`extract`]) and handed to
//! the run of the `imgbuild-smoke` crate, the same code the in-image executable
//! (`[smoke] embed = true`) runs on a cluster node; see that crate for what the run does.
//! The run loads the image's libraries, so it happens in a child process, this executable
//! run again with [`CHILD_ARG`] (`src/main.rs` hands that to [`child_main`]): a library that
//! crashes the loader is a `kernel-failure` naming it, never the death of imgbuild.
//!
//! Then the image's own frameworks ([`framework`]): the image unpacked into a private root
//! ([`unpack`]) and its Python run there with the host's driver visible ([`sandbox`]).

pub mod embed;
pub mod extract;
pub mod framework;
pub mod sandbox;
pub mod unpack;

use std::path::Path;

pub use imgbuild_smoke::{
    SmokeReport, Verdict,
    isolate::{CHILD_ARG, child_main},
};

use crate::{
    oci::{base::BaseImage, read::LayoutRef},
    registry::{ClientOptions, Reference, RepositoryClient, pull::pull_base},
};

#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    #[error("Cannot open image `{image}`")]
    Open {
        image: String,
        #[source]
        source: extract::ExtractError,
    },
    #[error("Cannot pull image `{image}`")]
    Pull {
        image: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("Cannot unpack image `{image}` to run its frameworks")]
    Unpack {
        image: String,
        #[source]
        source: unpack::UnpackError,
    },
    #[error("Cannot run the smoke test of `{image}` in a child process")]
    Child {
        image: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where the image to test is: a layout directory when `DIR` of `DIR[:TAG]` is one, else a
/// registry reference that names its registry (`registry.example/ml/x:tag`,
/// `127.0.0.1:5000/x@sha256:…`). A path that is not there stays a path, so a typo is a
/// missing layout rather than a lookup on Docker Hub.
#[derive(Debug, PartialEq, Eq)]
pub enum ImageSource {
    Layout(LayoutRef),
    Registry(Reference),
}

impl ImageSource {
    pub fn of(image: &str) -> Self {
        let layout = LayoutRef::parse(image);
        if !layout.dir.is_dir()
            && Reference::names_registry(image)
            && let Ok(reference) = Reference::parse(image)
        {
            return ImageSource::Registry(reference);
        }
        ImageSource::Layout(layout)
    }
}

/// Opens `image` for this machine's platform: from its layout, or pulled (layers cached
/// under `cache_dir`, digests checked) from its registry.
pub async fn open(
    image: &str,
    cache_dir: &Path,
    registry: &ClientOptions,
) -> Result<BaseImage, SmokeError> {
    match ImageSource::of(image) {
        ImageSource::Layout(layout) => {
            extract::open_image(&layout.dir, layout.tag()).map_err(|source| SmokeError::Open {
                image: image.to_string(),
                source: source.into(),
            })
        }
        ImageSource::Registry(reference) => {
            let pull_err = |source: Box<dyn std::error::Error + Send + Sync>| SmokeError::Pull {
                image: image.to_string(),
                source,
            };
            let credentials = crate::registry::auth::credentials_for(&reference.registry)
                .map_err(|e| pull_err(Box::new(e)))?;
            let client = RepositoryClient::new(&reference, credentials, registry)
                .map_err(|e| pull_err(Box::new(e)))?;
            let platform = rattler_conda_types::Subdir::current()
                .unwrap_or(rattler_conda_types::Subdir::Linux64);
            let (architecture, variant) =
                crate::recipe::oci_architecture(platform).unwrap_or(("amd64", None));
            pull_base(&client, architecture, variant, cache_dir, false)
                .await
                .map_err(|e| pull_err(Box::new(e)))
        }
    }
}

/// Runs the smoke test on `image` (a layout `DIR[:TAG]` or a registry reference, see
/// [`ImageSource`]).
pub async fn smoke(
    image: &str,
    cache_dir: &Path,
    registry: &ClientOptions,
    frameworks: framework::FrameworkMode,
) -> Result<SmokeRun, SmokeError> {
    let opened = open(image, cache_dir, registry).await?;
    let cuda = extract::extract_cuda_libraries(&opened).map_err(|source| SmokeError::Open {
        image: image.to_string(),
        source,
    })?;
    let report = SmokeReport::new(
        image.to_string(),
        cuda.libraries.cuda_version.clone(),
        cuda.sources.values().cloned().collect(),
    );
    let mut report = report;
    report.forward_compat = cuda
        .libraries
        .compat_dir
        .as_deref()
        .and_then(imgbuild_smoke::forward_compat::decide_here);
    let recorded = recorded_kernels(&opened);
    // The child runs while `cuda.dir`, which holds the libraries it loads, still exists.
    let child = |source| SmokeError::Child {
        image: image.to_string(),
        source,
    };
    let exe = std::env::current_exe().map_err(child)?;
    let libraries = cuda.libraries.clone();
    let run = tokio::task::spawn_blocking(move || {
        imgbuild_smoke::isolate::run_in_child(&exe, &libraries, report)
    })
    .await
    .map_err(|e| child(std::io::Error::other(e)))?
    .map_err(child);
    drop(cuda);
    let report = with_kernel_images(run?, recorded.as_ref());
    let compat_first = report.forward_compat.as_ref().is_some_and(|d| d.used);
    let checks = if frameworks.wants(&opened) {
        let exe = std::env::current_exe().map_err(child)?;
        let image_name = image.to_string();
        tokio::task::spawn_blocking(move || {
            framework::check_frameworks(&opened, &exe, compat_first)
                .map(|checks| (checks, opened))
                .map_err(|source| SmokeError::Unpack {
                    image: image_name,
                    source,
                })
        })
        .await
        .map_err(|e| child(std::io::Error::other(e)))??
    } else {
        (Vec::new(), opened)
    };
    let (checks, opened) = checks;
    Ok(SmokeRun {
        report: report.with_frameworks(checks),
        manifest_digest: opened.manifest_digest.clone(),
    })
}

/// A smoke run's report, and the manifest digest of the image it ran (what an
/// attestation of the run names).
pub struct SmokeRun {
    pub report: SmokeReport,
    /// `sha256:<hex>`.
    pub manifest_digest: String,
}

/// What the image's manifest records of its kernels: the architectures
/// ([`crate::oci::annotations::CUDA_ARCHITECTURES`]) and each package's PTX ISAs
/// ([`crate::oci::annotations::CUDA_PTX_ISA`], absent from images of older versions).
struct RecordedKernels {
    architectures: String,
    ptx_isa: Option<String>,
}

/// Adds whether the image's kernels run on the device the run found (issue 16) and, where
/// only their PTX does, whether this driver JIT-compiles its ISA (issue 30): a run that
/// passed on a driver too old for it is `incompatible`, naming the driver it needs.
fn with_kernel_images(mut report: SmokeReport, recorded: Option<&RecordedKernels>) -> SmokeReport {
    let Some((recorded, gpu)) = recorded.zip(report.gpu.as_ref()) else {
        return report;
    };
    let coverage =
        imgbuild_smoke::architectures::classify(&recorded.architectures, &gpu.compute_capability);
    let coverage = coverage.map(|c| match newest_isa(recorded, c.arch.as_deref()) {
        Some(isa) => c.with_ptx_isa(isa),
        None => c,
    });
    let driver = report
        .driver_version
        .as_deref()
        .and_then(|d| d.parse().ok());
    let why = coverage.as_ref().zip(driver.as_ref());
    if let Some(why) = why.and_then(|(c, driver)| c.ptx_incompatibility(driver))
        && report.verdict == Verdict::Pass
    {
        report.verdict = Verdict::Incompatible;
        report.message = why;
    }
    report.kernel_images = coverage;
    report
}

/// The newest ISA any package records for the PTX architecture `arch` (`compute_90`).
fn newest_isa(
    recorded: &RecordedKernels,
    arch: Option<&str>,
) -> Option<crate::cuda::compat::PtxIsa> {
    let arch: crate::cuda::fatbin::Arch = arch?.parse().ok()?;
    crate::cuda::fatbin::parse_ptx_annotation(recorded.ptx_isa.as_deref()?)
        .iter()
        .filter_map(|(_, isas)| isas.get(&arch.sm).copied())
        .max()
}

/// What `image`'s manifest records of its kernels, for the smoke run to classify the
/// device. `None` when the manifest cannot be read back or records no architectures: the
/// run then says nothing about kernel images.
fn recorded_kernels(image: &crate::oci::base::BaseImage) -> Option<RecordedKernels> {
    // Read as any blob of the layout: beneath it, a regular file, bounded, checked.
    let bytes = image
        .blobs
        .read_named(&image.manifest_digest, crate::oci::blobs::MAX_JSON_BLOB)
        .ok()?;
    let manifest: oci_spec::image::ImageManifest = serde_json::from_slice(&bytes).ok()?;
    let annotations = manifest.annotations().as_ref()?;
    Some(RecordedKernels {
        architectures: annotations
            .get(crate::oci::annotations::CUDA_ARCHITECTURES)?
            .clone(),
        ptx_isa: annotations
            .get(crate::oci::annotations::CUDA_PTX_ISA)
            .cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of a run that passed on `driver` with a GPU of compute capability 10.0.
    fn passed_on(driver: &str) -> SmokeReport {
        let mut report = SmokeReport::new("img".into(), Some("12.1".into()), Vec::new());
        report.driver_version = Some(driver.into());
        report.gpu = Some(imgbuild_smoke::report::GpuInfo {
            compute_capability: "10.0".into(),
            ..Default::default()
        });
        report.verdict = Verdict::Pass;
        report.message = "the kernel ran".into();
        report
    }

    #[test]
    fn ptx_too_new_for_the_driver_is_incompatible_naming_the_driver_it_needs() {
        // CUDA 12.1's cuRAND: PTX compute_90 of ISA 8.1 is all a 10.0 GPU runs.
        let recorded = RecordedKernels {
            architectures: "sm_80,sm_90,compute_90".into(),
            ptx_isa: Some("libcurand-10.3.2.106-0=compute_90:8.1;other-1-0=compute_80:8.5".into()),
        };
        let old = with_kernel_images(passed_on("525.60.13"), Some(&recorded));
        assert_eq!(old.verdict, Verdict::Incompatible);
        assert!(
            old.message
                .contains("compute_90 PTX of ISA 8.1, which needs driver ≥ 530.30.02"),
            "{}",
            old.message
        );
        let kernels = old.kernel_images.unwrap();
        assert_eq!(kernels.ptx_isa.as_deref(), Some("8.1"));
        let new = with_kernel_images(passed_on("530.30.02"), Some(&recorded));
        assert_eq!(new.verdict, Verdict::Pass);
        assert!(
            new.render(false).contains(
                "kernel images    PTX-only: covered only by compute_90 (ISA 8.1), needs driver ≥ 530.30.02"
            ),
            "{}",
            new.render(false)
        );
        // An image of an older version records no ISA: the case alone, no verdict change.
        let older = RecordedKernels {
            ptx_isa: None,
            ..recorded
        };
        let run = with_kernel_images(passed_on("525.60.13"), Some(&older));
        assert_eq!(run.verdict, Verdict::Pass);
        assert_eq!(run.kernel_images.unwrap().ptx_isa, None);
    }

    #[test]
    fn image_references() {
        assert_eq!(
            ImageSource::of("images/none"),
            ImageSource::Layout(LayoutRef {
                dir: "images/none".into(),
                tag: None
            })
        );
        assert_eq!(
            ImageSource::of("images/none:v1"),
            ImageSource::Layout(LayoutRef {
                dir: "images/none".into(),
                tag: Some("v1".into())
            })
        );
        assert_eq!(
            ImageSource::of("127.0.0.1:5000/ml/x:v1"),
            ImageSource::Registry(Reference::parse("127.0.0.1:5000/ml/x:v1").unwrap())
        );
        assert!(matches!(
            ImageSource::of(
                "registry.example/ml/x@sha256:0000000000000000000000000000000000000000000000000000000000000000"
            ),
            ImageSource::Registry(_)
        ));
        // A name without a registry host is a layout path, never Docker Hub.
        assert!(matches!(ImageSource::of("ml/x:v1"), ImageSource::Layout(_)));
    }
}
