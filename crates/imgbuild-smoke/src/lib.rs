//! imgbuild's GPU smoke test, shared by `imgbuild smoke` (which first extracts an image's CUDA
//! libraries) and the `imgbuild-smoke` executable that `[smoke] embed = true` puts into an
//! image to run the same test inside it on a cluster node.
//!
//! - [`architectures`]: GPU architectures (`sm_80`, `compute_90`) and whether a device runs
//!   kernels built for them.
//! - [`compat`]: NVIDIA's CUDA ⇄ driver compatibility rules, as data.
//! - [`forward_compat`]: whether an image's CUDA forward-compatibility libraries are used on
//!   this host, decided as NVIDIA's container toolkit decides it.
//! - [`framework`]: the image's own Python asked whether its GPU framework works.
//! - [`libraries`]: which files are CUDA libraries, and finding them under a prefix.
//! - [`nvrtc`]: the image's own NVRTC, loaded by absolute path.
//! - [`gpu`]: the run itself: driver, kernel, unified memory, verification.
//! - [`isolate`]: the run in a child process, so that a library that crashes the loader is a
//!   verdict, not the death of the caller.
//! - [`mig`]: the GPU's MIG state, from the driver's NVML.
//! - [`report`]: what the run learned, as text or JSON, and the exit code.

pub mod architectures;
pub mod compat;
pub mod forward_compat;
pub mod framework;
pub mod gpu;
pub mod isolate;
pub mod libraries;
pub mod mig;
pub mod nvrtc;
pub mod report;

pub use gpu::run;
pub use libraries::CudaLibraries;
pub use report::{SmokeReport, Verdict};
