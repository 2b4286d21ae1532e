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
use rattler_repodata_gateway::{Gateway, GatewayError, SourceConfig, fetch::CacheAction};
use rattler_solve::{SolveError, SolverImpl, SolverTask};

use crate::recipe::Recipe;

/// The glibc assumed for a base that does not tell us its own (conda-forge's baseline).
pub const DEFAULT_GLIBC: &str = "2.17";

/// The Linux kernel version the image is solved for: RHEL 8's kernel, old enough for any
/// cluster node still in service.
pub const TARGET_LINUX: &str = "4.18";

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
    pub fn virtual_package_strings(&self) -> Vec<String> {
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
    #[error("Failed to fetch repodata from channels {}", channels.join(", "))]
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
    #[error("The solver failed")]
    Solver(#[source] SolveError),
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

/// Solves `specs` from `channels` for `target`. Records come back sorted by name.
pub async fn resolve(
    channels: &[Channel],
    specs: &[MatchSpec],
    target: &Target,
    options: &ResolveOptions<'_>,
) -> Result<Vec<RepoDataRecord>, ResolveError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let repodata = gateway(options)?
        .query(
            channels.iter().cloned(),
            [target.platform, Subdir::NoArch],
            specs.iter().cloned(),
        )
        .recursive(true)
        .await
        .map_err(|source| ResolveError::Fetch {
            channels: channels.iter().map(|c| c.base_url.to_string()).collect(),
            source,
        })?;

    let task = SolverTask {
        virtual_packages: target.virtual_packages.clone(),
        specs: specs.to_vec(),
        ..SolverTask::from_iter(repodata.repodata.iter())
    };
    // resolvo is CPU-bound; keep it off the async workers.
    let result = tokio::task::block_in_place(|| rattler_solve::resolvo::Solver.solve(task));
    let mut records = match result {
        Ok(solution) => solution.records,
        Err(SolveError::Unsolvable(explanation)) => {
            let explanation = explanation.join("\n");
            let hints = missing_package_hints(channels, target, options, &explanation).await;
            return Err(ResolveError::Unsolvable {
                platform: target.platform,
                explanation,
                hints,
            });
        }
        Err(other) => return Err(ResolveError::Solver(other)),
    };
    records.sort_by(|a, b| a.package_record.name.cmp(&b.package_record.name));
    Ok(records)
}
