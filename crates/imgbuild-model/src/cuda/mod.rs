//! CUDA: NVIDIA's driver compatibility rules ([`compat`]) and what an image needs to get a
//! GPU from the NVIDIA container toolkit.

pub use imgbuild_smoke::compat;

pub mod fatbin;
pub mod intent;
pub mod jit;
pub mod ptx;

use indexmap::IndexMap;
use rattler_conda_types::RepoDataRecord;

use compat::{CudaVersion, DriverVersion, Support, driver_cuda_version};

/// Where the NVIDIA container toolkit mounts the driver's libraries when it does not use
/// the loader cache (NVIDIA's own images put these on `LD_LIBRARY_PATH`).
pub(crate) const NVIDIA_LIBRARY_PATH: &str = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64";

/// Packages whose version is the CUDA runtime version, most telling first.
const RUNTIME_PACKAGES: &[&str] = &["cuda-cudart", "cuda-version", "cudatoolkit", "cuda-runtime"];

/// The CUDA runtime an image targets and the oldest driver it must run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaTarget {
    pub version: CudaVersion,
    /// As the recipe gave it, or the release's own minimum.
    pub min_driver: DriverVersion,
    /// Whether NVIDIA's forward-compatibility libraries are added.
    pub compat: bool,
    /// How the runtime runs on `min_driver`; never `Unsupported` (that is a recipe error).
    pub support: Support,
    /// `architectures`: the GPUs (`sm_80`) every library with kernels must run on one of;
    /// empty when the recipe names none.
    pub architectures: fatbin::Architectures,
}

impl CudaTarget {
    /// The `__cuda` virtual package: the CUDA version `min_driver` fully supports, so
    /// packages that need a newer driver are never chosen.
    pub fn virtual_cuda(&self) -> CudaVersion {
        driver_cuda_version(&self.min_driver).unwrap_or(self.version)
    }
}

/// The CUDA runtime of a solved environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SolvedCuda {
    /// The package or wheel that holds it (`cuda-cudart`, `nvidia-cuda-runtime-cu11`).
    pub package: String,
    /// The full version as the package has it (`11.8.89`).
    pub full_version: String,
    pub version: CudaVersion,
}

/// Finds the CUDA runtime in `records`.
pub fn solved_cuda(records: &[RepoDataRecord]) -> Option<SolvedCuda> {
    RUNTIME_PACKAGES.iter().find_map(|name| {
        let record = records
            .iter()
            .find(|r| r.package_record.name.as_normalized() == *name)?;
        SolvedCuda::from_version(name, &record.package_record.version.to_string())
    })
}

/// The solved runtime is not the one `[cuda]` names.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeMismatch {
    /// Without `compat`, the runtime must be the recipe's MAJOR.MINOR.
    #[error(
        "The environment's CUDA runtime is {} ({} {}), not the recipe's `[cuda] version` {wanted}. Pin the runtime to CUDA {wanted} in the dependencies, change `[cuda] version`, or set `[cuda] compat = true` to run it through NVIDIA's forward-compatibility rules",
        solved.version, solved.package, solved.full_version
    )]
    Differs {
        solved: SolvedCuda,
        wanted: CudaVersion,
    },
    /// A runtime `min-driver` cannot run (with `compat`: one newer than the
    /// forward-compatibility libraries, which run no newer runtime).
    #[error(
        "The environment's CUDA runtime is {} ({} {}), not the recipe's `[cuda] version` {wanted}, and CUDA {} cannot run on `min-driver` {min_driver}: it needs driver {needs} or newer. Pin the runtime to CUDA {wanted} in the dependencies, or raise `[cuda] version` and `min-driver`",
        solved.version, solved.package, solved.full_version, solved.version
    )]
    CannotRun {
        solved: SolvedCuda,
        wanted: CudaVersion,
        min_driver: compat::DriverVersion,
        needs: compat::DriverVersion,
    },
    /// A lock (written before the solve ruled them out) pins a CPU build of a GPU framework.
    #[error(
        "The lock pins a CPU build of a GPU framework, in an image for CUDA {wanted}: {}. Solve it again (`imgbuild lock`), which takes the CUDA build or says why there is none",
        builds.join(", ")
    )]
    CpuBuild {
        wanted: CudaVersion,
        /// `pytorch 2.1.0 py3.11_cpu_0`.
        builds: Vec<String>,
    },
}

/// Refuses a locked platform that pins a CPU build of a GPU framework under `[cuda]`: a
/// solve never locks one (see `imgbuild_solve::resolve::resolve_environment`), but an older lock may.
pub fn check_no_cpu_builds(
    target: &CudaTarget,
    records: &[RepoDataRecord],
) -> Result<(), Box<RuntimeMismatch>> {
    let builds: Vec<String> = intent::cpu_builds(records)
        .iter()
        .map(ToString::to_string)
        .collect();
    if builds.is_empty() {
        return Ok(());
    }
    Err(Box::new(RuntimeMismatch::CpuBuild {
        wanted: target.version,
        builds,
    }))
}

/// Checks the solved runtime against the recipe's `[cuda]`. Without `compat` it must be
/// `version`'s MAJOR.MINOR. With `compat`, NVIDIA's forward-compatibility rules apply: the
/// `cuda-compat` libraries of `version` run any runtime up to `version` (a warning), and a
/// newer one only where `min-driver` runs it itself.
pub fn check_runtime(
    target: &CudaTarget,
    solved: &SolvedCuda,
) -> Result<Option<String>, Box<RuntimeMismatch>> {
    if solved.version == target.version {
        return Ok(None);
    }
    // Forward compatibility runs a runtime up to `version` whatever the driver; any other
    // runtime must run on `min-driver` itself.
    let forward = target.compat && solved.version < target.version;
    if let compat::Support::Unsupported { needs } =
        compat::support(solved.version, &target.min_driver)
        && !forward
    {
        return Err(Box::new(RuntimeMismatch::CannotRun {
            solved: solved.clone(),
            wanted: target.version,
            min_driver: target.min_driver.clone(),
            needs,
        }));
    }
    if !target.compat {
        return Err(Box::new(RuntimeMismatch::Differs {
            solved: solved.clone(),
            wanted: target.version,
        }));
    }
    Ok(Some(format!(
        "the environment's CUDA runtime is {} ({} {}), not the recipe's `[cuda] version` {}; with `compat = true` it runs through NVIDIA's forward compatibility, and the image config follows the runtime",
        solved.version, solved.package, solved.full_version, target.version
    )))
}

/// The CUDA runtime installed from PyPI wheels, for an environment whose conda packages
/// hold none: NVIDIA's `nvidia-cuda-runtime-cu11`/`-cu12` or `nvidia-cuda-runtime` (CUDA 13),
/// versioned like the toolkit (`11.8.89`). `wheels` are (normalized name, version).
pub fn solved_cuda_from_wheels<'a>(
    mut wheels: impl Iterator<Item = (&'a str, String)>,
) -> Option<SolvedCuda> {
    wheels.find_map(|(name, version)| {
        let rest = name.strip_prefix("nvidia-cuda-runtime")?;
        (rest.is_empty() || rest.starts_with("-cu"))
            .then(|| SolvedCuda::from_version(name, &version))
            .flatten()
    })
}

impl SolvedCuda {
    fn from_version(package: &str, full_version: &str) -> Option<SolvedCuda> {
        let mut parts = full_version.split('.');
        let version = format!("{}.{}", parts.next()?, parts.next().unwrap_or("0"))
            .parse()
            .ok()?;
        Some(SolvedCuda {
            package: package.to_string(),
            full_version: full_version.to_string(),
            version,
        })
    }
}

/// Environment variables and annotations a CUDA image carries, the way NVIDIA's images do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaImage {
    pub env: IndexMap<String, String>,
    pub annotations: IndexMap<String, String>,
}

/// The image settings for `target` with the runtime the environment solved to. `ptx` is the
/// release whose driver the PTX-only libraries need ([`jit::newest_need`]), at most what
/// `min-driver` runs (a build checks that first, [`jit::check_ptx_drivers`]).
pub fn image_settings(
    target: &CudaTarget,
    solved: Option<&SolvedCuda>,
    ptx: Option<CudaVersion>,
) -> CudaImage {
    let runtime = solved.map_or(target.version, |s| s.version);
    // The toolkit refuses to start the container on a driver older than this. The image
    // needs no more than its runtime, and promises no more than its `min-driver` supports
    // (lower with minor-version compatibility); but PTX that the driver must JIT-compile
    // needs its own release's driver, which minor-version compatibility does not lower.
    let promised = runtime.min(target.virtual_cuda());
    let required = ptx.map_or(promised, |ptx| promised.max(ptx));
    // `compat = true` does not put `PREFIX/cuda-compat` on the path: loaded on a host whose
    // driver is of the same or a newer branch, those libraries fail with error 803. The
    // build links them to `/usr/local/cuda/compat`, where NVIDIA's container toolkit finds
    // them and puts them first only on an older driver (see `imgbuild_smoke::forward_compat`).
    let library_path = [NVIDIA_LIBRARY_PATH.to_string()];
    let env = IndexMap::from([
        ("NVIDIA_VISIBLE_DEVICES".to_string(), "all".to_string()),
        (
            "NVIDIA_DRIVER_CAPABILITIES".to_string(),
            "compute,utility".to_string(),
        ),
        (
            "NVIDIA_REQUIRE_CUDA".to_string(),
            format!("cuda>={required}"),
        ),
        (
            "CUDA_VERSION".to_string(),
            solved.map_or_else(|| target.version.to_string(), |s| s.full_version.clone()),
        ),
        ("LD_LIBRARY_PATH".to_string(), library_path.join(":")),
    ]);
    let annotations = IndexMap::from([
        (
            crate::annotations::CUDA_VERSION.to_string(),
            runtime.to_string(),
        ),
        (
            crate::annotations::CUDA_MIN_DRIVER.to_string(),
            target.min_driver.to_string(),
        ),
    ]);
    CudaImage { env, annotations }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_runtime_of_nvidias_wheels_is_the_solved_cuda() {
        let wheels = |list: &[(&'static str, &str)]| {
            list.iter()
                .map(|(n, v)| (*n, v.to_string()))
                .collect::<Vec<_>>()
                .into_iter()
        };
        let solved = solved_cuda_from_wheels(wheels(&[
            ("nvidia-cuda-nvrtc-cu11", "11.8.89"),
            ("nvidia-cuda-runtime-cu11", "11.8.89"),
        ]))
        .unwrap();
        assert_eq!(solved.full_version, "11.8.89");
        assert_eq!(solved.version.to_string(), "11.8");
        let solved =
            solved_cuda_from_wheels(wheels(&[("nvidia-cuda-runtime", "13.2.86")])).unwrap();
        assert_eq!(solved.version.to_string(), "13.2");
        assert!(solved_cuda_from_wheels(wheels(&[("nvidia-cuda-runtime-extra", "1.0")])).is_none());
        assert!(solved_cuda_from_wheels(wheels(&[("six", "1.16.0")])).is_none());
    }

    use super::*;
    use compat::Support;

    fn target(version: &str, min_driver: &str, compat: bool) -> CudaTarget {
        let version: CudaVersion = version.parse().unwrap();
        let min_driver: compat::DriverVersion = min_driver.parse().unwrap();
        CudaTarget {
            support: compat::support(version, &min_driver),
            version,
            min_driver,
            compat,
            architectures: Default::default(),
        }
    }

    #[test]
    fn settings_like_nvidia_images() {
        let solved = SolvedCuda {
            package: "cuda-cudart".into(),
            full_version: "11.8.89".into(),
            version: "11.8".parse().unwrap(),
        };
        let image = image_settings(&target("11.8", "520.61.05", false), Some(&solved), None);
        let env: Vec<String> = image.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            env,
            [
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                "NVIDIA_REQUIRE_CUDA=cuda>=11.8",
                "CUDA_VERSION=11.8.89",
                "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
            ]
        );
        assert_eq!(
            image.annotations["dev.imgbuild.cuda.min-driver"],
            "520.61.05"
        );
        assert_eq!(image.annotations["dev.imgbuild.cuda.version"], "11.8");
    }

    #[test]
    fn a_runtime_other_than_the_recipes_is_refused_unless_compat_runs_it() {
        let wheel =
            |version: &str| SolvedCuda::from_version("nvidia-cuda-runtime-cu11", version).unwrap();
        // The same CUDA: nothing to say.
        assert_eq!(
            check_runtime(&target("11.8", "520.61.05", false), &wheel("11.8.89")).unwrap(),
            None
        );
        // 11.8 in an 11.4 recipe: refused even though 11.4's driver would run it through
        // minor-version compatibility; the image is not what `[cuda]` says.
        let err =
            check_runtime(&target("11.4", "470.42.01", false), &wheel("11.8.89")).unwrap_err();
        assert!(
            err.to_string().contains("CUDA runtime is 11.8 (nvidia-cuda-runtime-cu11 11.8.89), not the recipe's `[cuda] version` 11.4"),
            "{err}"
        );
        assert!(err.to_string().contains("compat = true"), "{err}");
        // 11.8 on 11.0's release driver, older than the 11.x floor: refused, naming the floor.
        let err =
            check_runtime(&target("11.0", "450.36.06", false), &wheel("11.8.89")).unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot run on `min-driver` 450.36.06: it needs driver 450.80.02"),
            "{err}"
        );
        // An older runtime in a newer recipe: refused too.
        assert!(check_runtime(&target("12.1", "530.30.02", false), &wheel("11.8.89")).is_err());
        // With compat, 12.1's forward-compatibility libraries run an older runtime: a warning.
        let warning = check_runtime(&target("12.1", "520.61.05", true), &wheel("11.8.89"))
            .unwrap()
            .unwrap();
        assert!(warning.contains("forward compatibility"), "{warning}");
        // With compat, a runtime newer than the compat libraries must run on `min-driver`
        // itself: 12.1 on 11.8's driver cannot, naming 12.x's floor.
        let err =
            check_runtime(&target("11.8", "520.61.05", true), &wheel("12.1.105")).unwrap_err();
        match *err {
            RuntimeMismatch::CannotRun { ref needs, .. } => {
                assert_eq!(needs.to_string(), "525.60.13")
            }
            ref other => panic!("{other}"),
        }
        // … and 11.8 on 11.4's driver can (minor-version compatibility): a warning.
        assert!(
            check_runtime(&target("11.4", "470.42.01", true), &wheel("11.8.89"))
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn a_lock_that_pins_a_cpu_build_under_cuda_is_refused_naming_it() {
        let record = |name: &str, build: &str| RepoDataRecord {
            package_record: rattler_conda_types::PackageRecord::new(
                rattler_conda_types::PackageName::new_unchecked(name),
                "2.1.0".parse::<rattler_conda_types::Version>().unwrap(),
                rattler_conda_types::package::BuildString::new_unchecked(build),
            ),
            identifier: format!("{name}-2.1.0-{build}.tar.bz2").parse().unwrap(),
            url: url::Url::parse("https://example.invalid/p.tar.bz2").unwrap(),
            channel: None,
        };
        let t = target("11.8", "520.61.05", false);
        let cuda = [record("pytorch", "py3.9_cuda11.8_cudnn8.7.0_0")];
        assert!(check_no_cpu_builds(&t, &cuda).is_ok());
        let err = check_no_cpu_builds(&t, &[record("pytorch", "py3.9_cpu_0")]).unwrap_err();
        assert!(
            err.to_string().contains(
                "CPU build of a GPU framework, in an image for CUDA 11.8: pytorch 2.1.0 py3.9_cpu_0"
            ),
            "{err}"
        );
    }

    #[test]
    fn minor_version_compatibility_lowers_the_requirement_and_compat_stays_off_the_path() {
        let t = target("12.4", "525.60.13", true);
        assert_eq!(t.support, Support::MinorVersion);
        let image = image_settings(&t, None, None);
        assert_eq!(image.env["NVIDIA_REQUIRE_CUDA"], "cuda>=12.0");
        // PTX-only libraries of ISA 8.1 need 12.1's driver: no minor-version compatibility.
        let ptx = image_settings(&t, None, Some(CudaVersion::new(12, 1)));
        assert_eq!(ptx.env["NVIDIA_REQUIRE_CUDA"], "cuda>=12.1");
        assert_eq!(image.env["CUDA_VERSION"], "12.4");
        // The container toolkit decides for the compat libraries at start, not the path.
        assert_eq!(
            image.env["LD_LIBRARY_PATH"],
            "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
        );
    }
}
