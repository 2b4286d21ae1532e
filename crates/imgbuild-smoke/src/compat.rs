//! NVIDIA's CUDA ⇄ driver compatibility rules, as data.
//!
//! Sources (Linux x86-64 columns):
//! - "CUDA Toolkit and Corresponding Driver Versions", Table 3 of the CUDA Toolkit release
//!   notes (docs.nvidia.com/cuda/cuda-toolkit-release-notes): the driver each toolkit
//!   release (GA) ships with and fully supports.
//! - "CUDA Compatibility" guide (docs.nvidia.com/deploy/cuda-compatibility), minor-version
//!   compatibility: any 11.x runtime runs on ≥ 450.80.02, 12.x on ≥ 525.60.13, 13.x on
//!   ≥ 580, with limits (no JIT of PTX newer than the driver; use SASS or the same-major
//!   NVRTC output compiled for the device).
//! - "PTX Release History", Table 57 of the PTX ISA document's release notes
//!   (docs.nvidia.com/cuda/parallel-thread-execution): the CUDA release that introduced each
//!   PTX ISA version, so the driver PTX of that ISA needs ([`ptx_minimum_driver`]).

use std::{cmp::Ordering, fmt, str::FromStr};

/// A driver version such as `520.61.05`, compared numerically field by field and shown as
/// written (NVIDIA's versions keep leading zeros: `520.61.05`).
#[derive(Debug, Clone)]
pub struct DriverVersion {
    parts: Vec<u32>,
    text: String,
}

impl DriverVersion {
    pub fn major(&self) -> u32 {
        self.parts[0]
    }
}

impl PartialEq for DriverVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for DriverVersion {}

impl FromStr for DriverVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts = s
            .split('.')
            .map(|p| p.parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("`{s}` is not a driver version like `520.61.05`"))?;
        if parts.is_empty() || parts.len() > 3 || parts[0] < 100 {
            return Err(format!("`{s}` is not a driver version like `520.61.05`"));
        }
        Ok(DriverVersion {
            parts,
            text: s.to_string(),
        })
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialOrd for DriverVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DriverVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        // Missing fields count as 0: `580` < `580.65.06`.
        let len = self.parts.len().max(other.parts.len());
        (0..len)
            .map(|i| {
                let a = self.parts.get(i).copied().unwrap_or(0);
                let b = other.parts.get(i).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

/// A CUDA `major.minor` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The CUDA version the driver API reports (`cuDriverGetVersion`: 1000 × major + 10 × minor).
    pub(crate) fn from_driver_api(version: i32) -> Self {
        let version = version.max(0) as u32;
        Self::new(version / 1000, (version % 1000) / 10)
    }
}

impl FromStr for CudaVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split('.');
        let parse = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
        match (parse(parts.next()), parse(parts.next())) {
            (Some(major), Some(minor)) => Ok(Self::new(major, minor)),
            (Some(major), None) if !s.contains('.') => Ok(Self::new(major, 0)),
            _ => Err(format!("`{s}` is not a CUDA version like `11.8`")),
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The minimum Linux driver of each CUDA toolkit release (GA), Table 3 of the release notes.
pub const RELEASE_MINIMUM_DRIVER: &[(CudaVersion, &str)] = &[
    (CudaVersion::new(11, 0), "450.36.06"),
    (CudaVersion::new(11, 1), "455.23"),
    (CudaVersion::new(11, 2), "460.27.03"),
    (CudaVersion::new(11, 3), "465.19.01"),
    (CudaVersion::new(11, 4), "470.42.01"),
    (CudaVersion::new(11, 5), "495.29.05"),
    (CudaVersion::new(11, 6), "510.39.01"),
    (CudaVersion::new(11, 7), "515.43.04"),
    (CudaVersion::new(11, 8), "520.61.05"),
    (CudaVersion::new(12, 0), "525.60.13"),
    (CudaVersion::new(12, 1), "530.30.02"),
    (CudaVersion::new(12, 2), "535.54.03"),
    (CudaVersion::new(12, 3), "545.23.06"),
    (CudaVersion::new(12, 4), "550.54.14"),
    (CudaVersion::new(12, 5), "555.42.02"),
    (CudaVersion::new(12, 6), "560.28.03"),
    (CudaVersion::new(12, 8), "570.26"),
    (CudaVersion::new(12, 9), "575.51.03"),
    (CudaVersion::new(13, 0), "580.65.06"),
    // Table 3 of the 13.1, 13.2 and 13.3 release notes (docs.nvidia.com/cuda/archive/13.x.0/
    // cuda-toolkit-release-notes). A 13.1+ runtime on an R580 driver runs only through
    // minor-version compatibility: its PTX is too new for that driver to JIT.
    (CudaVersion::new(13, 1), "590.44.01"),
    (CudaVersion::new(13, 2), "595.45.04"),
    (CudaVersion::new(13, 3), "610.43.02"),
];

/// Minor-version compatibility: the oldest driver any runtime of a major version runs on.
pub(crate) const MINOR_VERSION_COMPAT: &[(u32, &str)] =
    &[(11, "450.80.02"), (12, "525.60.13"), (13, "580")];

/// How a runtime can run on a driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The driver is at least the release's own minimum.
    Full,
    /// Only through minor-version compatibility: PTX newer than the driver cannot be
    /// JIT-compiled, so kernels must be built for the device (SASS).
    MinorVersion,
    /// It cannot run; the driver it would need is given.
    Unsupported { needs: DriverVersion },
}

fn driver(s: &str) -> DriverVersion {
    s.parse().expect("the tables hold valid driver versions")
}

/// The minimum driver of release `cuda`, if the table knows the release.
pub fn release_minimum(cuda: CudaVersion) -> Option<DriverVersion> {
    RELEASE_MINIMUM_DRIVER
        .iter()
        .find(|(v, _)| *v == cuda)
        .map(|(_, d)| driver(d))
}

/// The oldest driver a `major` runtime runs on through minor-version compatibility.
pub fn minor_version_minimum(major: u32) -> Option<DriverVersion> {
    MINOR_VERSION_COMPAT
        .iter()
        .find(|(m, _)| *m == major)
        .map(|(_, d)| driver(d))
}

/// Whether runtime `cuda` runs on `installed`.
pub fn support(cuda: CudaVersion, installed: &DriverVersion) -> Support {
    // A release newer than the table: its own minimum is unknown, so ask for at least the
    // newest known release's.
    let full = release_minimum(cuda).unwrap_or_else(|| {
        RELEASE_MINIMUM_DRIVER
            .iter()
            .filter(|(v, _)| *v <= cuda)
            .map(|(_, d)| driver(d))
            .max()
            .unwrap_or_else(|| driver("450.36.06"))
    });
    if *installed >= full {
        return Support::Full;
    }
    match minor_version_minimum(cuda.major) {
        Some(floor) if *installed >= floor => Support::MinorVersion,
        Some(floor) => Support::Unsupported { needs: floor },
        None => Support::Unsupported { needs: full },
    }
}

/// The newest CUDA release `installed` fully supports: what `cuDriverGetVersion` would
/// report, and the solver's `__cuda`.
pub fn driver_cuda_version(installed: &DriverVersion) -> Option<CudaVersion> {
    RELEASE_MINIMUM_DRIVER
        .iter()
        .filter(|(_, d)| driver(d) <= *installed)
        .map(|(v, _)| *v)
        .max()
}

/// A PTX ISA version, as a PTX module's `.version 8.5` directive and its fatbin entry header
/// give it. Not a CUDA version: ISA 8.5 came with CUDA 12.5 (and stayed for 12.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxIsa {
    pub major: u32,
    pub minor: u32,
}

impl PtxIsa {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for PtxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for PtxIsa {
    type Err = String;

    /// `8.5`: two numbers of at most two digits each, as `.version` writes them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || format!("`{s}` is not a PTX ISA version like `8.5`");
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let number = |p: &str| {
            (!p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<u32>().ok())
                .flatten()
        };
        match (number(major), number(minor)) {
            (Some(major), Some(minor)) => Ok(Self::new(major, minor)),
            _ => Err(err()),
        }
    }
}

/// The CUDA release that introduced each PTX ISA version: "PTX Release History", Table 57 of
/// the PTX ISA document's release notes (docs.nvidia.com/cuda/parallel-thread-execution,
/// `#release-notes-ptx-release-history`), which NVIDIA's cuda-python also encodes
/// (`cuda.bindings.utils.get_minimal_required_cuda_ver_from_ptx_ver`). CUDA 12.6 kept ISA
/// 8.5; ISA 8.6 came with CUDA 12.7, a release with a driver (r565) and no public toolkit.
pub const PTX_ISA_RELEASE: &[(PtxIsa, CudaVersion)] = &[
    (PtxIsa::new(7, 0), CudaVersion::new(11, 0)),
    (PtxIsa::new(7, 1), CudaVersion::new(11, 1)),
    (PtxIsa::new(7, 2), CudaVersion::new(11, 2)),
    (PtxIsa::new(7, 3), CudaVersion::new(11, 3)),
    (PtxIsa::new(7, 4), CudaVersion::new(11, 4)),
    (PtxIsa::new(7, 5), CudaVersion::new(11, 5)),
    (PtxIsa::new(7, 6), CudaVersion::new(11, 6)),
    (PtxIsa::new(7, 7), CudaVersion::new(11, 7)),
    (PtxIsa::new(7, 8), CudaVersion::new(11, 8)),
    (PtxIsa::new(8, 0), CudaVersion::new(12, 0)),
    (PtxIsa::new(8, 1), CudaVersion::new(12, 1)),
    (PtxIsa::new(8, 2), CudaVersion::new(12, 2)),
    (PtxIsa::new(8, 3), CudaVersion::new(12, 3)),
    (PtxIsa::new(8, 4), CudaVersion::new(12, 4)),
    (PtxIsa::new(8, 5), CudaVersion::new(12, 5)),
    (PtxIsa::new(8, 6), CudaVersion::new(12, 7)),
    (PtxIsa::new(8, 7), CudaVersion::new(12, 8)),
    (PtxIsa::new(8, 8), CudaVersion::new(12, 9)),
    (PtxIsa::new(9, 0), CudaVersion::new(13, 0)),
    (PtxIsa::new(9, 1), CudaVersion::new(13, 1)),
];

/// Releases of the PTX table that [`RELEASE_MINIMUM_DRIVER`] lacks, with the driver branch
/// the PTX table gives them: CUDA 12.7 shipped as driver r565 only.
const PTX_ONLY_RELEASE_DRIVER: &[(CudaVersion, &str)] = &[(CudaVersion::new(12, 7), "565")];

/// The driver a PTX ISA needs, see [`ptx_minimum_driver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtxDriver {
    /// The driver must be at least `driver`, the GA driver of `cuda`, the release that
    /// introduced the ISA.
    Needs {
        cuda: CudaVersion,
        driver: DriverVersion,
    },
    /// An ISA newer than [`PTX_ISA_RELEASE`] knows: the driver it needs is not guessed; it is
    /// newer than `newest`'s.
    NewerThanKnown { newest: PtxIsa },
}

/// The oldest driver that JIT-compiles PTX of `isa`. The driver compiles PTX itself, so
/// minor-version compatibility does not apply (the CUDA Compatibility guide: PTX newer than the
/// driver fails with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`): it must be at least the GA driver
/// of the release that introduced the ISA. ISAs older than 7.0 run on any driver of CUDA 11.0
/// or newer, the oldest imgbuild targets, and are held to 11.0's.
pub fn ptx_minimum_driver(isa: PtxIsa) -> PtxDriver {
    let (newest, _) = PTX_ISA_RELEASE[PTX_ISA_RELEASE.len() - 1];
    if isa > newest {
        return PtxDriver::NewerThanKnown { newest };
    }
    let cuda = PTX_ISA_RELEASE
        .iter()
        .find(|(known, _)| *known >= isa)
        .map_or(CudaVersion::new(11, 0), |(_, cuda)| *cuda);
    let driver = release_minimum(cuda).unwrap_or_else(|| {
        PTX_ONLY_RELEASE_DRIVER
            .iter()
            .find(|(v, _)| *v == cuda)
            .map(|(_, d)| driver(d))
            .expect("every release of the PTX table has a driver")
    });
    PtxDriver::Needs { cuda, driver }
}

/// Whether `driver` JIT-compiles PTX of `isa`. `None` when the ISA is newer than the table
/// knows and the driver newer than the newest known ISA needs: it may, or may not.
pub fn ptx_runs_on(isa: PtxIsa, driver: &DriverVersion) -> Option<bool> {
    match ptx_minimum_driver(isa) {
        PtxDriver::Needs { driver: needs, .. } => Some(*driver >= needs),
        PtxDriver::NewerThanKnown { newest } => match ptx_minimum_driver(newest) {
            PtxDriver::Needs { driver: known, .. } => (*driver <= known).then_some(false),
            PtxDriver::NewerThanKnown { .. } => None,
        },
    }
}

/// What PTX of `isa` needs, in words: "needs driver ≥ 555.42.02 (CUDA 12.5)", or what is known
/// of an ISA newer than the table.
pub fn describe_ptx_need(isa: PtxIsa) -> String {
    match ptx_minimum_driver(isa) {
        PtxDriver::Needs { driver, cuda } => format!("needs driver ≥ {driver} (CUDA {cuda})"),
        PtxDriver::NewerThanKnown { newest } => {
            let known = match ptx_minimum_driver(newest) {
                PtxDriver::Needs { driver, .. } => format!(", whose driver is {driver}"),
                PtxDriver::NewerThanKnown { .. } => String::new(),
            };
            format!(
                "the ISA is newer than the newest imgbuild knows ({newest}{known}): it needs a newer driver"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> DriverVersion {
        s.parse().unwrap()
    }

    #[test]
    fn driver_versions_compare_numerically() {
        assert!(d("520.61.05") > d("520.61.4"));
        assert!(d("580") < d("580.65.06"));
        assert!(d("1000.0") > d("999.99.99"));
        assert!("52.1".parse::<DriverVersion>().is_err());
        assert!("abc".parse::<DriverVersion>().is_err());
    }

    #[test]
    fn the_tables_are_ordered_and_consistent() {
        for pair in RELEASE_MINIMUM_DRIVER.windows(2) {
            assert!(
                pair[0].0 < pair[1].0 && driver(pair[0].1) < driver(pair[1].1),
                "{pair:?}"
            );
        }
        // Every release of a major runs on that major's minor-version floor or newer; the
        // floor is at most the newest release's own minimum (11.0 GA predates its floor).
        for (major, floor) in MINOR_VERSION_COMPAT {
            let newest = RELEASE_MINIMUM_DRIVER
                .iter()
                .filter(|(v, _)| v.major == *major)
                .map(|(_, d)| driver(d))
                .max()
                .unwrap();
            assert!(driver(floor) <= newest, "{major}: {floor} vs {newest}");
        }
    }

    #[test]
    fn support_follows_nvidia_rules() {
        let v = |s: &str| s.parse::<CudaVersion>().unwrap();
        assert_eq!(support(v("11.8"), &d("520.61.05")), Support::Full);
        assert_eq!(support(v("11.8"), &d("470.82.01")), Support::MinorVersion);
        assert_eq!(
            support(v("11.8"), &d("450.36.06")),
            Support::Unsupported {
                needs: d("450.80.02")
            }
        );
        assert_eq!(support(v("12.4"), &d("525.60.13")), Support::MinorVersion);
        assert_eq!(
            support(v("12.1"), &d("520.61.05")),
            Support::Unsupported {
                needs: d("525.60.13")
            }
        );
        assert_eq!(support(v("13.0"), &d("580.95.05")), Support::Full);
        assert_eq!(
            support(v("13.0"), &d("575.51.03")),
            Support::Unsupported { needs: d("580") }
        );
        // 13.1 and 13.2 on the R580 driver of the H200 we test on: minor-version
        // compatibility only (their PTX is newer than the driver), as the device showed.
        assert_eq!(support(v("13.1"), &d("580.65.06")), Support::MinorVersion);
        assert_eq!(support(v("13.2"), &d("580.159.04")), Support::MinorVersion);
        assert_eq!(support(v("13.2"), &d("595.45.04")), Support::Full);
        // A release newer than the table is held to at least the newest known minimum.
        assert_eq!(support(v("13.9"), &d("610.43.02")), Support::Full);
        assert_eq!(support(v("13.9"), &d("595.58.03")), Support::MinorVersion);
    }

    #[test]
    fn the_driver_cuda_version_is_the_newest_fully_supported_release() {
        assert_eq!(
            driver_cuda_version(&d("520.61.05")),
            Some(CudaVersion::new(11, 8))
        );
        assert_eq!(
            driver_cuda_version(&d("535.104.05")),
            Some(CudaVersion::new(12, 2))
        );
        assert_eq!(
            driver_cuda_version(&d("580.159.04")),
            Some(CudaVersion::new(13, 0))
        );
        assert_eq!(
            driver_cuda_version(&d("595.71.05")),
            Some(CudaVersion::new(13, 2))
        );
        assert_eq!(driver_cuda_version(&d("440.33")), None);
        assert_eq!(CudaVersion::from_driver_api(13000), CudaVersion::new(13, 0));
        assert_eq!(CudaVersion::from_driver_api(12080), CudaVersion::new(12, 8));
    }

    #[test]
    fn ptx_isa_versions_parse_strictly_and_order_numerically() {
        let isa = |s: &str| s.parse::<PtxIsa>();
        assert_eq!(isa("8.5").unwrap(), PtxIsa::new(8, 5));
        assert!(isa("10.0").unwrap() > isa("9.1").unwrap());
        assert_eq!(isa("7.8").unwrap().to_string(), "7.8");
        for bad in ["8", "8.", ".5", "8.5.1", "x.y", "+8.5", "123.0", "8.-1"] {
            assert!(isa(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_ptx_table_is_ordered_and_every_release_has_a_driver() {
        for pair in PTX_ISA_RELEASE.windows(2) {
            assert!(pair[0].0 < pair[1].0 && pair[0].1 < pair[1].1, "{pair:?}");
        }
        for (isa, _) in PTX_ISA_RELEASE {
            assert!(matches!(ptx_minimum_driver(*isa), PtxDriver::Needs { .. }));
        }
    }

    #[test]
    fn ptx_needs_the_ga_driver_of_its_release_without_minor_version_compatibility() {
        let needs = |isa: &str| match ptx_minimum_driver(isa.parse().unwrap()) {
            PtxDriver::Needs { cuda, driver } => (cuda.to_string(), driver.to_string()),
            other => panic!("{other:?}"),
        };
        assert_eq!(needs("7.8"), ("11.8".into(), "520.61.05".into()));
        assert_eq!(needs("8.1"), ("12.1".into(), "530.30.02".into()));
        // Not 12.x's minor-version floor (525.60.13): the driver itself compiles the PTX.
        assert_eq!(needs("8.5"), ("12.5".into(), "555.42.02".into()));
        // 8.6 came with 12.7, a driver branch without a toolkit.
        assert_eq!(needs("8.6"), ("12.7".into(), "565".into()));
        assert_eq!(needs("8.8"), ("12.9".into(), "575.51.03".into()));
        assert_eq!(needs("9.0"), ("13.0".into(), "580.65.06".into()));
        // Older than the table: any driver imgbuild targets.
        assert_eq!(needs("6.3"), ("11.0".into(), "450.36.06".into()));
        let runs = |isa: &str, driver: &str| ptx_runs_on(isa.parse().unwrap(), &d(driver));
        assert_eq!(runs("8.5", "550.54.14"), Some(false));
        assert_eq!(runs("8.5", "555.42.02"), Some(true));
        assert_eq!(runs("9.9", "590.44.01"), Some(false));
        assert_eq!(runs("9.9", "610.43.02"), None);
        assert_eq!(
            describe_ptx_need("9.0".parse().unwrap()),
            "needs driver ≥ 580.65.06 (CUDA 13.0)"
        );
        assert_eq!(
            describe_ptx_need("9.9".parse().unwrap()),
            "the ISA is newer than the newest imgbuild knows (9.1, whose driver is 590.44.01): it needs a newer driver"
        );
        // Newer than the table: said, not guessed.
        assert_eq!(
            ptx_minimum_driver(PtxIsa::new(9, 2)),
            PtxDriver::NewerThanKnown {
                newest: PtxIsa::new(9, 1)
            }
        );
    }
}
