//! PTX the driver must JIT-compile: which libraries run on the recipe's GPUs only by their
//! PTX, and the driver that PTX's ISA needs ([`compat::ptx_minimum_driver`]). A driver older
//! than that fails the first kernel with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, whatever
//! minor-version compatibility promises for the runtime.

use super::{
    compat::{self, CudaVersion, DriverVersion, PtxDriver, PtxIsa},
    fatbin::{Arch, Architectures, Coverage, PackageArchitectures, coverage},
};

/// A library that runs on a device only by its PTX.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxOnlyLibrary {
    /// Prefix-relative path.
    pub library: String,
    pub package: String,
    /// The device (`sm_90`) it has no SASS for.
    pub device: Arch,
    /// The PTX the driver compiles for it (`compute_90`) and its ISA.
    pub ptx: Arch,
    pub isa: PtxIsa,
    pub needs: PtxDriver,
}

impl PtxOnlyLibrary {
    /// "`lib/x.so` (pkg) is PTX-only for sm_90 (compute_90, ISA 8.5): needs driver ≥ 555.42.02".
    pub fn describe(&self) -> String {
        format!(
            "`{}` ({}) is PTX-only for {} ({}, ISA {}): {}",
            self.library,
            self.package,
            self.device,
            self.ptx,
            self.isa,
            compat::describe_ptx_need(self.isa)
        )
    }

    /// Whether `driver` is too old for it, or may be (an ISA newer than the table, on a
    /// driver no newer than the newest known ISA needs).
    pub fn too_new_for(&self, driver: &DriverVersion) -> bool {
        compat::ptx_runs_on(self.isa, driver) == Some(false)
    }
}

/// The libraries of `found` that run on a device of `wanted` (`sm_XX`) only by their PTX,
/// each with its need, for every such device.
pub fn ptx_only_libraries(
    found: &[PackageArchitectures],
    wanted: &Architectures,
) -> Vec<PtxOnlyLibrary> {
    let mut only = Vec::new();
    for package in found {
        for (library, archs) in &package.libraries {
            for device in wanted {
                let Coverage::PtxOnly(ptx) = coverage(archs, device.sm) else {
                    continue;
                };
                let Some(&isa) = package.ptx_isas.get(library).and_then(|i| i.get(&ptx.sm)) else {
                    continue;
                };
                only.push(PtxOnlyLibrary {
                    library: library.clone(),
                    package: package.package.clone(),
                    device: *device,
                    ptx,
                    isa,
                    needs: compat::ptx_minimum_driver(isa),
                });
            }
        }
    }
    only
}

/// The newest known need of `libraries`: the release and driver the image's PTX asks for.
pub fn newest_need(libraries: &[PtxOnlyLibrary]) -> Option<(PtxIsa, CudaVersion, DriverVersion)> {
    libraries
        .iter()
        .filter_map(|l| match &l.needs {
            PtxDriver::Needs { cuda, driver } => Some((l.isa, *cuda, driver.clone())),
            PtxDriver::NewerThanKnown { .. } => None,
        })
        .max_by(|a, b| a.2.cmp(&b.2).then(a.0.cmp(&b.0)))
}

/// PTX-only libraries whose ISA needs a newer driver than `[cuda] min-driver`.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} needs a newer driver than `[cuda] min-driver` {min_driver}: {}. The driver JIT-compiles this PTX, and an older one fails the first kernel with CUDA_ERROR_UNSUPPORTED_PTX_VERSION (minor-version compatibility does not cover PTX). Raise `[cuda] min-driver`, or install builds of the packages with SASS for these GPUs",
    if .libraries.len() == 1 { "A PTX-only library".to_string() } else { format!("{} PTX-only libraries", .libraries.len()) },
    .libraries.iter().map(PtxOnlyLibrary::describe).collect::<Vec<_>>().join("; ")
)]
pub struct PtxTooNew {
    pub min_driver: DriverVersion,
    pub libraries: Vec<PtxOnlyLibrary>,
}

/// Refuses PTX-only libraries (for the devices of `wanted`) that `min_driver` cannot
/// JIT-compile; returns the libraries that are PTX-only there, all within `min_driver`.
pub fn check_ptx_drivers(
    found: &[PackageArchitectures],
    wanted: &Architectures,
    min_driver: &DriverVersion,
) -> Result<Vec<PtxOnlyLibrary>, Box<PtxTooNew>> {
    let only = ptx_only_libraries(found, wanted);
    let too_new: Vec<PtxOnlyLibrary> = only
        .iter()
        .filter(|l| l.too_new_for(min_driver))
        .cloned()
        .collect();
    if too_new.is_empty() {
        return Ok(only);
    }
    Err(Box::new(PtxTooNew {
        min_driver: min_driver.clone(),
        libraries: too_new,
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cuda::fatbin::parse_list;

    fn package(archs: &str, isa: &str) -> PackageArchitectures {
        let ptx = parse_list(archs)
            .unwrap()
            .into_iter()
            .filter(|a| a.kind == crate::cuda::fatbin::ArchKind::Ptx)
            .map(|a| (a.sm, isa.parse().unwrap()))
            .collect();
        PackageArchitectures {
            package: "pypi:nvidia_x-1.0".into(),
            libraries: BTreeMap::from([("lib/libx.so.1".to_string(), parse_list(archs).unwrap())]),
            ptx_isas: BTreeMap::from([("lib/libx.so.1".to_string(), ptx)]),
        }
    }

    fn d(s: &str) -> DriverVersion {
        s.parse().unwrap()
    }

    #[test]
    fn only_devices_without_sass_count() {
        let found = [package("sm_80,compute_80", "8.5")];
        // 8.0 runs the SASS: no PTX need, whatever the driver.
        let sass = check_ptx_drivers(&found, &parse_list("sm_80").unwrap(), &d("525.60.13"));
        assert_eq!(sass.unwrap(), []);
        // 9.0 runs only the compute_80 PTX of ISA 8.5: 555.42.02, not 12.x's 525.60.13.
        let err =
            check_ptx_drivers(&found, &parse_list("sm_90").unwrap(), &d("550.54.14")).unwrap_err();
        assert_eq!(
            err.to_string().split(". The driver").next().unwrap(),
            "A PTX-only library needs a newer driver than `[cuda] min-driver` 550.54.14: `lib/libx.so.1` (pypi:nvidia_x-1.0) is PTX-only for sm_90 (compute_80, ISA 8.5): needs driver ≥ 555.42.02 (CUDA 12.5)"
        );
        let ok = check_ptx_drivers(&found, &parse_list("sm_90").unwrap(), &d("555.42.02")).unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(
            newest_need(&ok),
            Some((
                "8.5".parse().unwrap(),
                CudaVersion::new(12, 5),
                d("555.42.02")
            ))
        );
    }

    #[test]
    fn an_isa_newer_than_the_table_is_too_new_for_the_newest_known_driver() {
        let found = [package("compute_90", "9.9")];
        let wanted = parse_list("sm_100").unwrap();
        let err = check_ptx_drivers(&found, &wanted, &d("590.44.01")).unwrap_err();
        assert!(
            err.to_string()
                .contains("ISA 9.9): the ISA is newer than the newest imgbuild knows (9.1, whose driver is 590.44.01)"),
            "{err}"
        );
        // A driver past the newest known one may run it: not refused, not promised.
        let only = check_ptx_drivers(&found, &wanted, &d("610.43.02")).unwrap();
        assert_eq!(newest_need(&only), None);
    }
}
