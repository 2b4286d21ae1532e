//! Solving: recipe specs + channels + the image's target → a set of package records.
//!
//! The virtual packages describe the machine the *image* will run on (its platform, the glibc
//! of its base, the CUDA it targets), never the build host, so a laptop without a GPU can
//! lock a CUDA image for x86-64 or aarch64 alike.

use std::{path::Path, str::FromStr};

use rattler_conda_types::{
    Channel, GenericVirtualPackage, MatchSpec, PackageName, RepoDataRecord, Subdir, Version,
    package::BuildString,
};
use rattler_repodata_gateway::{Gateway, GatewayError, RepoData, SourceConfig, fetch::CacheAction};
use rattler_solve::{ChannelPriority, SolveError, SolverImpl, SolverTask};

use crate::{
    cuda::{compat::CudaVersion, intent::CpuBuild},
    recipe::Recipe,
};

/// The glibc assumed for a base that does not tell us its own (conda-forge's baseline).
pub(crate) const DEFAULT_GLIBC: &str = "2.17";

/// The Linux kernel version the image is solved for: RHEL 8's kernel, old enough for any
/// cluster node still in service.
pub(crate) const TARGET_LINUX: &str = "4.18";

/// What an environment is solved from: the recipe's `[conda]` channels, dependencies and
/// channel priority, and the CUDA runtime its `[cuda]` holds the solution to.
#[derive(Debug, Clone, Copy)]
pub struct Environment<'a> {
    /// In priority order.
    pub channels: &'a [Channel],
    pub specs: &'a [MatchSpec],
    pub priority: ChannelPriority,
    /// `[cuda] version`, when the recipe has `[cuda]`.
    pub cuda: Option<CudaVersion>,
    /// Pins the solver keeps where they still fit (`lock --update NAME`: every record of
    /// the lock but NAME's); empty for a solve from scratch.
    pub locked: &'a [RepoDataRecord],
}

impl<'a> Environment<'a> {
    /// What `recipe` asks for.
    pub fn of(recipe: &'a Recipe) -> Self {
        Environment {
            channels: &recipe.channels,
            specs: &recipe.specs,
            priority: recipe.channel_priority,
            cuda: recipe.cuda.as_ref().map(|cuda| cuda.version),
            locked: &[],
        }
    }
}

/// What the image runs on, as the solver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub platform: Subdir,
    pub virtual_packages: Vec<GenericVirtualPackage>,
}

impl Target {
    /// The target of `recipe` on `platform`, given the glibc its base provides there (if
    /// known). The virtual packages are those of the platform the image runs on, whatever
    /// machine builds it.
    pub fn for_recipe(recipe: &Recipe, platform: Subdir, base_glibc: Option<&Version>) -> Target {
        let glibc = recipe
            .glibc
            .clone()
            .or_else(|| base_glibc.cloned())
            .unwrap_or_else(|| Version::from_str(DEFAULT_GLIBC).expect("valid version"));
        let virtual_package = |name: &str, version: Version, build: &str| GenericVirtualPackage {
            name: PackageName::new_unchecked(name),
            version,
            build_string: BuildString::new_unchecked(build),
        };
        let mut virtual_packages = vec![
            virtual_package("__unix", Version::from_str("0").expect("valid"), "0"),
            virtual_package(
                "__linux",
                Version::from_str(TARGET_LINUX).expect("valid"),
                "0",
            ),
            virtual_package("__glibc", glibc, "0"),
        ];
        if let Some(cuda) = &recipe.cuda {
            let version = Version::from_str(&cuda.virtual_cuda().to_string()).expect("valid");
            virtual_packages.push(virtual_package("__cuda", version, "0"));
        }
        if let Some(arch) = platform.arch() {
            virtual_packages.push(virtual_package(
                "__archspec",
                Version::from_str("1").expect("valid"),
                &arch.to_string(),
            ));
        }
        virtual_packages.sort_by(|a, b| a.name.cmp(&b.name));
        Target {
            platform,
            virtual_packages,
        }
    }

    /// The virtual packages in the form the lock file stores (`__glibc=2.17=0`).
    pub(crate) fn virtual_package_strings(&self) -> Vec<String> {
        self.virtual_packages
            .iter()
            .map(|v| v.to_string())
            .collect()
    }
}

/// How to reach channels.
#[derive(Debug, Clone)]
pub struct ResolveOptions<'a> {
    /// Where repodata and packages are cached.
    pub cache_dir: &'a Path,
    /// Use only cached repodata; never touch the network.
    pub offline: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error(
        "Failed to fetch repodata from channels {}. Offline or behind a mirror: `--channel-alias URL` points channel names at a mirror, a `file://` URL or a path relative to the recipe reads a local channel, and `--offline` builds from the repodata and packages already cached",
        channels.join(", ")
    )]
    Fetch {
        channels: Vec<String>,
        #[source]
        source: GatewayError,
    },
    #[error("The environment cannot be solved for {platform}:\n{}{}", explanation.trim_end(), render_hints(hints))]
    Unsolvable {
        platform: Subdir,
        explanation: String,
        /// `did you mean` lines for packages the channels do not have.
        hints: Vec<String>,
    },
    /// No solution holds the runtime of `[cuda] version`.
    #[error("The environment cannot be solved for {platform} with the CUDA {wanted} runtime of `[cuda] version`{}. Pin CUDA {wanted} builds in the dependencies (e.g. `pytorch-cuda={wanted}`), or change `[cuda] version`.\n{}", render_holders(holders), explanation.trim_end())]
    NoCudaSolution {
        platform: Subdir,
        wanted: CudaVersion,
        /// The packages that hold another runtime when the recipe is solved without the pin.
        holders: Vec<String>,
        explanation: String,
    },
    /// Under `[cuda]`, a GPU framework solved only to its CPU build.
    #[error("The environment for {platform} solves only with a CPU build of a GPU framework, in an image for CUDA {wanted}: {}. Pin a CUDA build (e.g. `pytorch=*=*cuda*`) or drop `[cuda]` for a CPU image.\n{}", builds.join("; "), explanation.trim_end())]
    CpuBuild {
        platform: Subdir,
        wanted: CudaVersion,
        /// `pytorch 2.1.0 py3.11_cpu_0 (why)`.
        builds: Vec<String>,
        explanation: String,
    },
    #[error("The solver failed")]
    Solver(#[source] SolveError),
}

fn render_holders(holders: &[String]) -> String {
    if holders.is_empty() {
        String::new()
    } else {
        format!(": without it, the environment holds {}", holders.join(", "))
    }
}

fn render_hints(hints: &[String]) -> String {
    hints.iter().map(|h| format!("\nhelp: {h}")).collect()
}

/// For each package the solver found no candidates for, the closest names the channels do
/// have. Only run after such a failure: listing every name reads the whole repodata (from
/// the cache the failed solve just filled). A failure to list names gives no hints.
async fn missing_package_hints(
    channels: &[Channel],
    target: &Target,
    options: &ResolveOptions<'_>,
    explanation: &str,
) -> Vec<String> {
    let missing = crate::recipe::suggest::missing_packages(explanation);
    if missing.is_empty() {
        return Vec::new();
    }
    let Ok(gateway) = gateway(options) else {
        return Vec::new();
    };
    let names = match gateway
        .names(channels.iter().cloned(), [target.platform, Subdir::NoArch])
        .await
    {
        Ok(output) => output.names,
        Err(err) => {
            tracing::debug!("could not list package names for suggestions: {err}");
            return Vec::new();
        }
    };
    let names: Vec<&str> = names.iter().map(|n| n.as_normalized()).collect();
    missing
        .iter()
        // A name the channels have failed on its version or build, not its spelling.
        .filter(|word| !names.contains(&word.as_str()))
        .filter_map(|word| {
            let close = crate::recipe::suggest::closest(word, names.iter().copied(), 3);
            (!close.is_empty()).then(|| {
                let list: Vec<String> = close.iter().map(|c| format!("`{c}`")).collect();
                format!(
                    "the channels have no package `{word}`; did you mean {}?",
                    list.join(" or ")
                )
            })
        })
        .collect()
}

/// Builds the gateway that fetches and caches repodata for `options`.
pub fn gateway(options: &ResolveOptions<'_>) -> Result<Gateway, crate::http::HttpError> {
    let source = SourceConfig {
        cache_action: if options.offline {
            CacheAction::ForceCacheOnly
        } else {
            CacheAction::CacheOrFetch
        },
        ..SourceConfig::default()
    };
    Ok(Gateway::builder()
        .with_client(crate::http::client()?)
        .with_cache_dir(options.cache_dir.join("repodata"))
        .with_package_cache(rattler_cache::package_cache::PackageCache::new(
            options.cache_dir.join("pkgs"),
        ))
        .with_channel_config(rattler_repodata_gateway::ChannelConfig {
            default: source,
            per_channel: Default::default(),
        })
        .finish())
}

/// Solves `specs` from `channels` (in `priority`) for `target`. Records come back sorted by
/// name.
pub async fn resolve(
    channels: &[Channel],
    specs: &[MatchSpec],
    priority: ChannelPriority,
    target: &Target,
    options: &ResolveOptions<'_>,
) -> Result<Vec<RepoDataRecord>, ResolveError> {
    let environment = Environment {
        channels,
        specs,
        priority,
        cuda: None,
        locked: &[],
    };
    resolve_plain(&environment, target, options).await
}

/// Solves `environment` with no `[cuda]` to hold it to.
async fn resolve_plain(
    environment: &Environment<'_>,
    target: &Target,
    options: &ResolveOptions<'_>,
) -> Result<Vec<RepoDataRecord>, ResolveError> {
    let Environment {
        channels, specs, ..
    } = *environment;
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let repodata = query(channels, specs, target, options).await?;
    match solve(&repodata, environment, &[], target)? {
        Ok(records) => Ok(records),
        Err(explanation) => Err(unsolvable(channels, target, options, explanation).await),
    }
}

/// Solves `environment` for `target`, holding it to its `[cuda]`: the runtime must be
/// `[cuda] version`'s MAJOR.MINOR (solver constraints, so the CUDA solution is found
/// whenever there is one), and a CPU build of a GPU framework is re-solved away or refused.
pub async fn resolve_environment(
    environment: &Environment<'_>,
    target: &Target,
    options: &ResolveOptions<'_>,
) -> Result<Vec<RepoDataRecord>, ResolveError> {
    let Environment {
        channels,
        specs,
        cuda,
        ..
    } = *environment;
    let Some(wanted) = cuda.filter(|_| !specs.is_empty()) else {
        return resolve_plain(environment, target, options).await;
    };
    let repodata = query(channels, specs, target, options).await?;
    let mut constraints = crate::cuda::intent::runtime_constraints(wanted);
    // The CPU builds ruled out so far: each round rules out at least one more, of a fixed
    // set of names, so this ends.
    let mut excluded: Vec<CpuBuild> = Vec::new();
    loop {
        let explanation = match solve(&repodata, environment, &constraints, target)? {
            Ok(records) => {
                let cpu: Vec<CpuBuild> = crate::cuda::intent::cpu_builds(&records)
                    .into_iter()
                    .filter(|c| !excluded.iter().any(|e| e.name == c.name))
                    .collect();
                if cpu.is_empty() {
                    return Ok(records);
                }
                tracing::debug!("re-solving without CPU builds: {cpu:?}");
                constraints.extend(cpu.iter().map(CpuBuild::exclusion));
                excluded.extend(cpu);
                continue;
            }
            Err(explanation) => explanation,
        };
        if !excluded.is_empty() {
            return Err(cpu_only(&repodata, &excluded, wanted, target, explanation));
        }
        return Err(
            no_cuda_solution(environment, &repodata, wanted, target, options, explanation).await,
        );
    }
}

/// The CPU builds could not be ruled out: names each, and whether its channels have a CUDA
/// build of it at all.
fn cpu_only(
    repodata: &[RepoData],
    excluded: &[CpuBuild],
    wanted: CudaVersion,
    target: &Target,
    explanation: String,
) -> ResolveError {
    let builds = excluded
        .iter()
        .map(|cpu| {
            let has_cuda = repodata
                .iter()
                .flat_map(|r| r.iter())
                .any(|r| cpu.is_cuda_variant(&r.package_record));
            let why = if cpu.name == "cpuonly" {
                "it selects CPU builds; remove it from the dependencies".to_string()
            } else if has_cuda {
                format!(
                    "the channels have CUDA builds of `{}`, but none fits the other dependencies",
                    cpu.name
                )
            } else {
                format!("the channels have no CUDA build of `{}`", cpu.name)
            };
            format!("{cpu} ({why})")
        })
        .collect();
    ResolveError::CpuBuild {
        platform: target.platform,
        wanted,
        builds,
        explanation,
    }
}

/// No solution has `[cuda] version`'s runtime. The recipe solved without that pin names the
/// packages that hold another runtime; one that does not solve either is simply unsolvable.
async fn no_cuda_solution(
    environment: &Environment<'_>,
    repodata: &[RepoData],
    wanted: CudaVersion,
    target: &Target,
    options: &ResolveOptions<'_>,
    explanation: String,
) -> ResolveError {
    let unpinned = match solve(repodata, environment, &[], target) {
        Ok(Ok(records)) => records,
        Ok(Err(other)) => return unsolvable(environment.channels, target, options, other).await,
        Err(err) => return err,
    };
    let holders = crate::cuda::intent::other_runtimes(&unpinned, wanted);
    ResolveError::NoCudaSolution {
        platform: target.platform,
        wanted,
        holders,
        explanation,
    }
}

/// Fetches the repodata `specs` can reach from `channels`.
async fn query(
    channels: &[Channel],
    specs: &[MatchSpec],
    target: &Target,
    options: &ResolveOptions<'_>,
) -> Result<Vec<RepoData>, ResolveError> {
    gateway(options)?
        .query(
            channels.iter().cloned(),
            [target.platform, Subdir::NoArch],
            specs.iter().cloned(),
        )
        .recursive(true)
        .await
        .map(|output| output.repodata)
        .map_err(|source| ResolveError::Fetch {
            channels: channels.iter().map(|c| c.base_url.to_string()).collect(),
            source,
        })
}

/// One solve: the records sorted by name, or the solver's explanation of why there are none.
/// `repodata` is in the channels' order, which is what the environment's priority ranks.
fn solve(
    repodata: &[RepoData],
    environment: &Environment<'_>,
    constraints: &[MatchSpec],
    target: &Target,
) -> Result<Result<Vec<RepoDataRecord>, String>, ResolveError> {
    let task = SolverTask {
        virtual_packages: target.virtual_packages.clone(),
        specs: environment.specs.to_vec(),
        constraints: constraints.to_vec(),
        channel_priority: environment.priority,
        // Preferred, not required: a kept pin that no longer fits gives way.
        locked_packages: environment.locked.iter().collect(),
        ..SolverTask::from_iter(repodata.iter())
    };
    // resolvo is CPU-bound; keep it off the async workers.
    let result = tokio::task::block_in_place(|| rattler_solve::resolvo::Solver.solve(task));
    match result {
        Ok(solution) => {
            let mut records = solution.records;
            records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
            Ok(Ok(records))
        }
        Err(SolveError::Unsolvable(explanation)) => Ok(Err(explanation.join("\n"))),
        Err(other) => Err(ResolveError::Solver(other)),
    }
}

/// The error for an unsolvable recipe, with `did you mean` hints for missing names.
async fn unsolvable(
    channels: &[Channel],
    target: &Target,
    options: &ResolveOptions<'_>,
    explanation: String,
) -> ResolveError {
    let hints = missing_package_hints(channels, target, options, &explanation).await;
    ResolveError::Unsolvable {
        platform: target.platform,
        explanation,
        hints,
    }
}
