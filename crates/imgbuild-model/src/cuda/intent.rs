//! What `[cuda]` asks of the solve: the runtime's MAJOR.MINOR as solver constraints, no CPU
//! build of a GPU framework, and the section a recipe without one would have needed.

use rattler_conda_types::{MatchSpec, Matches, ParseStrictness, RepoDataRecord};

use super::CudaTarget;
use super::{
    SolvedCuda,
    compat::{self, CudaVersion},
};

/// The packages that pin the CUDA runtime, one per channel family: conda-forge's and the
/// nvidia channel's `cuda-version` (12.x and conda-forge's 11.x), the nvidia channel's 11.x
/// `cuda-cudart`/`cuda-runtime` (they depend on no `cuda-version`), the pytorch channel's
/// `pytorch-cuda` and defaults' (and conda-forge's 11.x) `cudatoolkit`.
///
/// All of them are given whatever the recipe's channels are: a constraint pulls nothing in
/// and one on a package the channels do not have is never looked at, while choosing by
/// channel name would miss a mirror or a local channel under another name.
const RUNTIME_PINS: &[&str] = &[
    "cuda-version",
    "cuda-cudart",
    "cuda-runtime",
    "pytorch-cuda",
    "cudatoolkit",
];

/// Solver constraints that hold every runtime package to `version`'s MAJOR.MINOR.
pub fn runtime_constraints(version: CudaVersion) -> Vec<MatchSpec> {
    RUNTIME_PINS
        .iter()
        .map(|name| spec(&format!("{name} {version}.*")))
        .collect()
}

/// The runtime packages in `records` that are not `version`'s MAJOR.MINOR, as
/// `name version build`.
pub fn other_runtimes(records: &[RepoDataRecord], version: CudaVersion) -> Vec<String> {
    let pins = runtime_constraints(version);
    records
        .iter()
        .map(|r| &r.package_record)
        .filter(|r| {
            RUNTIME_PINS.contains(&r.name.as_normalized()) && !pins.iter().any(|p| p.matches(*r))
        })
        .map(|r| format!("{} {} {}", r.name.as_normalized(), r.version, r.build))
        .collect()
}

fn spec(text: &str) -> MatchSpec {
    MatchSpec::from_str(text, ParseStrictness::Lenient).expect("the specs made here are valid")
}

/// GPU frameworks whose channels publish CPU and CUDA builds of one package, told apart by
/// the build string: the pytorch channel's `py3.11_cpu_0`/`py3.11_cuda11.7_…`, conda-forge's
/// `cpu_…`/`cuda118_…` of pytorch (and its `libtorch`), jaxlib, tensorflow and cupy.
const GPU_FRAMEWORKS: &[&str] = &[
    "pytorch",
    "libtorch",
    "jaxlib",
    "tensorflow",
    "tensorflow-base",
    "cupy",
];

/// A CPU build of a GPU framework (or the package that selects one) in a solution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuBuild {
    pub name: String,
    pub version: String,
    pub build: String,
}

impl std::fmt::Display for CpuBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.name, self.version, self.build)
    }
}

impl CpuBuild {
    /// A constraint that rules this CPU variant out, so the solver must take a CUDA one.
    pub fn exclusion(&self) -> MatchSpec {
        match self.name.as_str() {
            // The pytorch channel's selector: its CUDA variant is the build `cuda`.
            "pytorch-mutex" => spec("pytorch-mutex * cuda"),
            // `cpuonly` exists only to select the CPU variant: no version of it may be taken.
            "cpuonly" => spec("cpuonly <0a0"),
            name => spec(&format!("{name} * *cuda*")),
        }
    }

    /// Whether `record` is a CUDA variant of this package (what [`Self::exclusion`] lets
    /// through).
    pub fn is_cuda_variant(&self, record: &rattler_conda_types::PackageRecord) -> bool {
        record.name.as_normalized() == self.name && self.exclusion().matches(record)
    }
}

/// The CPU builds of GPU frameworks in `records`: a framework whose build string says
/// `cpu`, `pytorch-mutex` of build `cpu`, and `cpuonly`.
pub fn cpu_builds(records: &[RepoDataRecord]) -> Vec<CpuBuild> {
    records
        .iter()
        .map(|r| &r.package_record)
        .filter(|r| {
            let (name, build) = (r.name.as_normalized(), r.build.as_str());
            match name {
                "cpuonly" => true,
                "pytorch-mutex" => build == "cpu",
                _ => GPU_FRAMEWORKS.contains(&name) && build.contains("cpu"),
            }
        })
        .map(|r| CpuBuild {
            name: r.name.as_normalized().to_string(),
            version: r.version.to_string(),
            build: r.build.to_string(),
        })
        .collect()
}

/// The `[cuda]` section a recipe without one gets from the runtime its environment holds:
/// that runtime, on its release's own minimum driver (as a recipe that leaves out
/// `min-driver` gets), without forward compatibility.
pub fn derived_target(solved: &SolvedCuda) -> CudaTarget {
    let version = solved.version;
    let min_driver = compat::release_minimum(version)
        .or_else(|| compat::minor_version_minimum(version.major))
        .unwrap_or_else(|| {
            // A major imgbuild has no table for: the newest release's minimum is a floor.
            let (_, newest) = compat::RELEASE_MINIMUM_DRIVER
                .last()
                .expect("the table is not empty");
            newest.parse().expect("the table holds valid drivers")
        });
    CudaTarget {
        support: compat::support(version, &min_driver),
        version,
        min_driver,
        compat: false,
        architectures: Default::default(),
    }
}

/// The warning for a recipe without `[cuda]` whose environment holds a CUDA runtime, with
/// the section it is configured as if it had.
pub fn undeclared_runtime_warning(solved: &SolvedCuda, derived: &CudaTarget) -> String {
    format!(
        "the environment holds CUDA runtime {} {} but the recipe has no [cuda]; the image is configured for the NVIDIA container toolkit as if it said:\n[cuda]\nversion = \"{}\"\nmin-driver = \"{}\"",
        solved.package, solved.full_version, derived.version, derived.min_driver
    )
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn record(name: &str, version: &str, build: &str) -> RepoDataRecord {
        let package_record = rattler_conda_types::PackageRecord::new(
            rattler_conda_types::PackageName::new_unchecked(name),
            rattler_conda_types::Version::from_str(version).unwrap(),
            rattler_conda_types::package::BuildString::new_unchecked(build),
        );
        RepoDataRecord {
            package_record,
            identifier: format!("{name}-{version}-{build}.tar.bz2").parse().unwrap(),
            url: url::Url::parse(&format!(
                "https://example.invalid/{name}-{version}-{build}.tar.bz2"
            ))
            .unwrap(),
            channel: None,
        }
    }

    #[test]
    fn cpu_builds_of_gpu_frameworks_are_found_and_excluded() {
        let records = [
            record("pytorch", "2.1.0", "py3.11_cpu_0"),
            record("pytorch-mutex", "1.0", "cpu"),
            record("cpuonly", "2.0", "0"),
            record("jaxlib", "0.4.14", "cpu_py311h0"),
            record("pytorch-cuda", "11.7", "h778d358_5"),
            record("numpy", "1.26.0", "py311h0"),
            record("tensorflow", "2.13.0", "cuda118py311h0"),
        ];
        let found: Vec<String> = cpu_builds(&records).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            found,
            [
                "pytorch 2.1.0 py3.11_cpu_0",
                "pytorch-mutex 1.0 cpu",
                "cpuonly 2.0 0",
                "jaxlib 0.4.14 cpu_py311h0"
            ]
        );
        let cpu = cpu_builds(&records);
        let cuda_torch = record("pytorch", "2.0.1", "py3.11_cuda11.7_cudnn8.5.0_0");
        assert!(cpu[0].is_cuda_variant(&cuda_torch.package_record));
        assert!(!cpu[0].is_cuda_variant(&records[0].package_record));
        let forge = record("pytorch", "2.1.0", "cuda118_py311h0");
        assert!(cpu[0].is_cuda_variant(&forge.package_record));
        assert!(cpu[1].is_cuda_variant(&record("pytorch-mutex", "1.0", "cuda").package_record));
        assert!(!cpu[2].is_cuda_variant(&records[2].package_record));
    }

    #[test]
    fn runtime_constraints_pin_each_family_to_major_minor() {
        let specs: Vec<String> = runtime_constraints("11.7".parse().unwrap())
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(
            specs.contains(&"cuda-version 11.7.*".to_string()),
            "{specs:?}"
        );
        assert!(
            specs.contains(&"pytorch-cuda 11.7.*".to_string()),
            "{specs:?}"
        );
        assert!(
            specs.contains(&"cudatoolkit 11.7.*".to_string()),
            "{specs:?}"
        );
        let records = [
            record("cuda-cudart", "11.7.99", "0"),
            record("cuda-cudart", "11.8.89", "0"),
            record("pytorch-cuda", "11.8", "h7e8668a_5"),
            record("numpy", "1.26.0", "py311h0"),
        ];
        assert_eq!(
            other_runtimes(&records, "11.7".parse().unwrap()),
            ["cuda-cudart 11.8.89 0", "pytorch-cuda 11.8 h7e8668a_5"]
        );
    }

    #[test]
    fn a_runtime_without_cuda_section_derives_its_release_driver() {
        let solved = SolvedCuda {
            package: "cuda-cudart".into(),
            full_version: "11.8.89".into(),
            version: "11.8".parse().unwrap(),
        };
        let derived = derived_target(&solved);
        assert_eq!(derived.min_driver.to_string(), "520.61.05");
        assert_eq!(derived.support, compat::Support::Full);
        let warning = undeclared_runtime_warning(&solved, &derived);
        assert!(
            warning.ends_with("[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\""),
            "{warning}"
        );
    }
}
