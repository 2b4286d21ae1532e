//! CUDA: NVIDIA's driver compatibility rules ([`compat`]) and what an image needs to get a
//! GPU from the NVIDIA container toolkit.

pub mod compat;
