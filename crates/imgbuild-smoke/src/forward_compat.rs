//! Whether an image's CUDA forward-compatibility libraries are used on this host: decided
//! when the container starts, from the host driver's version and the compat `libcuda`'s,
//! the way NVIDIA's container toolkit decides it.
//!
//! Sources:
//! - NVIDIA Container Toolkit, `nvidia-cdi-hook enable-cuda-compat`
//!   (cmd/nvidia-cdi-hook/cudacompat, toolkit 1.17.5 and later; pull requests #906 and
//!   #1055): the container's `/usr/local/cuda/compat/libcuda.so.*.*` is put before the host's
//!   libraries (an `/etc/ld.so.conf.d/00-compat-*.conf` file) only when the host driver's
//!   major version is lower than the compat library's. Before 1.17.5, libnvidia-container
//!   mounted the same directory's libraries over the host's on the same condition.
//! - Pull request #1697 (2026-03) took back a finer rule read from libcuda's
//!   `.note.cuda.fwd_compatibility` ELF note on non-Tegra systems: host 580.126.16 with a
//!   580.82.07 compat library failed with it. The major-version rule is what ships.
//! - "CUDA Compatibility" (docs.nvidia.com/deploy/cuda-compatibility): forward compatibility
//!   serves only a driver of an older branch; a compat package older than the driver, or of
//!   the same branch, must not be loaded (error 803, "system has unsupported display driver /
//!   cuda driver combination").

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::compat::DriverVersion;

/// Where NVIDIA's toolkit looks for an image's forward-compatibility libraries. imgbuild's
/// `compat = true` images link it to the environment's `cuda-compat` directory.
pub const COMPAT_DIR: &str = "/usr/local/cuda/compat";

/// The decision and what it was made from, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardCompat {
    /// The compat `libcuda`'s version, from its file name (`libcuda.so.580.95.05`).
    pub compat: String,
    /// The host driver's version.
    pub host: String,
    /// Whether the compat libraries come before the host's.
    pub used: bool,
}

impl ForwardCompat {
    /// Decides for a host driver `host` and a compat library `compat`: used only when the
    /// host driver's branch (major version) is older than the compat library's.
    pub fn decide(host: &DriverVersion, compat: &DriverVersion) -> Self {
        ForwardCompat {
            compat: compat.to_string(),
            host: host.to_string(),
            used: host.major() < compat.major(),
        }
    }

    /// The report's line: what was chosen, and why.
    pub fn describe(&self) -> String {
        if self.used {
            format!(
                "used: compat libcuda {} is of a newer branch than the host driver {}",
                self.compat, self.host
            )
        } else {
            format!(
                "not used: the host driver {} is not of an older branch than compat libcuda {} (loading it would give error 803)",
                self.host, self.compat
            )
        }
    }
}

/// The decision for the compat libraries in `dir` on this host (its kernel driver's
/// version); `None` without a driver or without a single compat `libcuda.so.*.*`.
pub fn decide_here(dir: &Path) -> Option<ForwardCompat> {
    let host = crate::gpu::driver_version()?.parse().ok()?;
    Some(ForwardCompat::decide(&host, &find_in(dir)?))
}

/// The compat `libcuda`'s version from a file name such as `libcuda.so.580.95.05`: the
/// toolkit's `libcuda.so.*.*` pattern (the `libcuda.so.1` link does not match).
pub fn compat_library_version(file_name: &str) -> Option<DriverVersion> {
    let version = file_name.strip_prefix("libcuda.so.")?;
    version.contains('.').then(|| version.parse().ok())?
}

/// The version of the single `libcuda.so.*.*` regular file in `dir`, as the toolkit reads
/// it: none, or several, mean no forward compatibility.
#[allow(
    clippy::disallowed_methods,
    reason = "imgbuild-smoke stays free of dependencies, and an unreadable directory only means no compat libraries"
)]
pub fn find_in(dir: &Path) -> Option<DriverVersion> {
    let mut found = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| compat_library_version(&e.file_name().to_string_lossy()));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "test set-up in a temporary directory"
)]
mod tests {
    use super::*;

    fn v(s: &str) -> DriverVersion {
        s.parse().unwrap()
    }

    #[test]
    fn compat_of_a_newer_branch_is_used() {
        // An R535 host running a CUDA 12.8 image through its 570 compat package.
        let decision = ForwardCompat::decide(&v("535.104.05"), &v("570.124.06"));
        assert!(decision.used);
        assert!(
            decision
                .describe()
                .starts_with("used: compat libcuda 570.124.06")
        );
    }

    #[test]
    fn compat_older_than_the_driver_is_not_used() {
        // The H200 host: driver 580.159.04, the CUDA 13.0 compat package 580.95.05.
        let decision = ForwardCompat::decide(&v("580.159.04"), &v("580.95.05"));
        assert!(!decision.used);
        assert!(decision.describe().contains("error 803"));
        // A newer driver branch than the compat package.
        assert!(!ForwardCompat::decide(&v("590.48.01"), &v("580.95.05")).used);
    }

    #[test]
    fn same_branch_is_not_used_even_when_the_compat_build_is_newer() {
        // NVIDIA's #1697: the finer rule loaded 580.126 compat on 580.82 hosts and failed.
        assert!(!ForwardCompat::decide(&v("580.82.07"), &v("580.126.16")).used);
    }

    #[test]
    fn only_versioned_file_names_count() {
        assert_eq!(
            compat_library_version("libcuda.so.580.95.05").map(|v| v.to_string()),
            Some("580.95.05".to_string())
        );
        assert!(compat_library_version("libcuda.so.1").is_none());
        assert!(compat_library_version("libcuda.so").is_none());
        assert!(compat_library_version("libnvidia-ptxjitcompiler.so.580.95.05").is_none());
        assert!(compat_library_version("libcuda.so.x.y").is_none());
    }

    #[test]
    fn one_library_in_a_directory_decides_and_two_do_not() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find_in(dir.path()).is_none());
        let write = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
        write("libcuda.so.570.124.06");
        std::os::unix::fs::symlink("libcuda.so.570.124.06", dir.path().join("libcuda.so.1"))
            .unwrap();
        assert_eq!(find_in(dir.path()).unwrap().to_string(), "570.124.06");
        write("libcuda.so.575.51.03");
        assert!(find_in(dir.path()).is_none());
    }
}
