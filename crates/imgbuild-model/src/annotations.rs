//! Annotation keys of our own, under a reverse-DNS namespace as the image spec asks. A leaf
//! of values: the stages that write them (layers, oci, cuda) and the commands that read
//! them back (inspect, smoke, k8s) share one spelling.

pub const COMPRESSION: &str = "dev.imgbuild.compression";
pub const CUDA_VERSION: &str = "dev.imgbuild.cuda.version";
pub const CUDA_MIN_DRIVER: &str = "dev.imgbuild.cuda.min-driver";
/// The GPU architectures the environment's libraries carry kernels for, SASS then PTX
/// (`sm_80,sm_90,compute_90`); see `crate::cuda::fatbin`.
pub const CUDA_ARCHITECTURES: &str = "dev.imgbuild.cuda.architectures";
/// The same per package: `package=sm_80,compute_90;…`, by package name.
pub const CUDA_PACKAGE_ARCHITECTURES: &str = "dev.imgbuild.cuda.package-architectures";
/// The PTX ISA version of each package's PTX, per PTX architecture, the newest of its
/// libraries: `package=compute_90:8.1,compute_121:8.8;…`, by package name; absent when no
/// library carries PTX. What driver JIT-compiles it: `crate::cuda::compat::ptx_minimum_driver`.
pub const CUDA_PTX_ISA: &str = "dev.imgbuild.cuda.ptx-isa";
pub const PACKAGES: &str = "dev.imgbuild.layer.packages";
/// Which part of its one package a layer is, when `[layers] split` split the package by
/// file into several layers: `2/3`.
pub const LAYER_PART: &str = "dev.imgbuild.layer.part";
/// What a layer of the recipe's own holds: `accounts` (`[accounts]`, home directories, the
/// workdir) or `files` (one `[[files]]` entry, named by the layer's history line).
pub const LAYER_CONTENT: &str = "dev.imgbuild.layer.content";
pub const PLATFORM: &str = "dev.imgbuild.conda.platform";
pub const PREFIX: &str = "dev.imgbuild.conda.prefix";
/// In-image path of the embedded `imgbuild-smoke` executable (`[smoke] embed = true`),
/// on the manifest and on the layer that holds it.
pub const SMOKE: &str = "dev.imgbuild.smoke";
