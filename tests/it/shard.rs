//! `build --shard I/N` (issue 28, item 2) against Debian's real `docker-registry`: workers
//! with empty caches split the distinct package layers of a two-python matrix, each layer
//! compressed by exactly one of them (counted from their `shard` events), and the builds
//! that follow, on another empty cache, take every package layer from the registry and
//! give the images a local build gives.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::{
    cache_repo::{copy_locks, matrix_build, project, pythons_recipe},
    common::{LayoutView, Project},
    registry::{Auth, Registry, free_port},
};

/// The recipe's packages: two that every variant shares (`hello`, `other`), and two whose
/// layers differ by python (python itself, and `pyhello` linked into its site-packages).
const PACKAGES: &[&str] = &["python {{python}}", "pyhello", "hello 1.0", "other"];

/// The `shard` event of `build --shard SHARD --json`, which must succeed.
fn shard(project: &Project, shard: &str, repo: &str) -> Value {
    let args = [
        "--insecure",
        "build",
        "recipes/image.toml",
        "--locked",
        "--json",
        "--shard",
        shard,
        "--cache-repo",
        repo,
    ];
    let run = project.run(&args);
    assert_eq!(run.code, 0, "shard {shard} failed:\n{}", run.stderr);
    let events: Vec<Value> = run
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(
        !events.iter().any(|e| e["event"] == "result"),
        "a shard writes no image: {}",
        run.stdout
    );
    events
        .into_iter()
        .find(|e| e["event"] == "shard")
        .unwrap_or_else(|| panic!("no shard event in:\n{}", run.stdout))
}

/// The digests of the package layers (those with a packages annotation) of a result's image.
pub(crate) fn package_digests(project: &Project, result: &Value) -> BTreeSet<String> {
    let layout = LayoutView::new(project.path().join(result["layout"].as_str().unwrap()));
    layout
        .layers()
        .into_iter()
        .filter(|(packages, _)| !packages.is_empty())
        .map(|(_, digest)| digest)
        .collect()
}

#[test]
fn shards_compress_each_distinct_layer_once_and_the_builds_after_hit_every_one() {
    let registry = Registry::start(Auth::None);
    let repo = format!("{}/ci/shards", registry.host);
    let extra = tempfile::tempdir().unwrap();
    let recipe = pythons_recipe(extra.path(), PACKAGES);
    // The reference: a plain local build, no cache repository.
    let local = project(&recipe);
    let reference = matrix_build(&local, &[]);
    assert_eq!(reference.len(), 2);
    let distinct: BTreeSet<String> = reference
        .iter()
        .flat_map(|r| package_digests(&local, r))
        .collect();
    let shared = package_digests(&local, &reference[0])
        .intersection(&package_digests(&local, &reference[1]))
        .count();
    // hello and other (and what they need) are in both variants: fewer distinct layers
    // than the variants hold between them.
    assert!(shared >= 2, "{shared} shared layers");

    // Three workers, each a fresh project with its own empty cache.
    let mut compressed: BTreeMap<String, usize> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for index in 0..3 {
        let worker = project(&recipe);
        copy_locks(&local, &worker);
        let event = shard(&worker, &format!("{index}/3"), &repo);
        assert_eq!(
            (event["shard"].as_u64(), event["shards"].as_u64()),
            (Some(index), Some(3))
        );
        assert_eq!(event["variants"], 2, "{event}");
        assert_eq!(event["distinct_layers"], distinct.len(), "{event}");
        let layers = event["layers"].as_array().unwrap();
        for layer in layers {
            let digest = layer["digest"].as_str().unwrap().to_string();
            assert!(distinct.contains(&digest), "{layer} is in no local image");
            assert!(
                keys.insert(layer["key"].as_str().unwrap().to_string()),
                "{layer} twice"
            );
            if layer["compressed"] == true {
                *compressed.entry(digest).or_default() += 1;
            }
        }
        assert_eq!(event["compressed_layers"], layers.len(), "{event}");
        let cache = &event["cache_repo"];
        assert_eq!(cache["stored"], layers.len(), "{event}");
    }
    // Every distinct layer compressed by exactly one worker.
    assert_eq!(
        compressed.keys().cloned().collect::<BTreeSet<_>>(),
        distinct
    );
    assert!(compressed.values().all(|n| *n == 1), "{compressed:?}");

    // The builds after the shards: another empty cache, every package layer a hit.
    let assembly = project(&recipe);
    copy_locks(&local, &assembly);
    let built = matrix_build(&assembly, &["--locked", "--cache-repo", &repo]);
    let mut hits = 0;
    for (built, reference) in built.iter().zip(&reference) {
        assert_eq!(built["digest"], reference["digest"], "{built}");
        // Each package layer from a cache: the registry's, or the local one that the
        // first variant filled with the layers both share.
        let packages = package_digests(&assembly, built).len() as u64;
        assert_eq!(built["reused_layers"], packages, "{built}");
        let written: Vec<&Value> = built["written_layers"].as_array().unwrap().iter().collect();
        assert!(
            written
                .iter()
                .all(|l| l["kind"] != "conda" && l["kind"] != "wheels"),
            "a package layer was compressed again: {built}"
        );
        assert_eq!(built["cache_repo"]["stored"], 0, "{built}");
        hits += built["cache_repo"]["hits"].as_u64().unwrap();
    }
    assert_eq!(
        hits,
        distinct.len() as u64,
        "each distinct layer downloaded once"
    );
}

#[test]
fn a_shard_without_a_writable_cache_or_of_a_bad_number_is_refused() {
    let extra = tempfile::tempdir().unwrap();
    let recipe = pythons_recipe(extra.path(), PACKAGES);
    let worker = project(&recipe);
    let unreachable = format!("127.0.0.1:{}/ci/none", free_port());
    let cases: [(&[&str], i32, &[&str]); 5] = [
        (
            &["--shard", "2/2", "--cache-repo", &unreachable],
            2,
            &["`2/2`", "I/N"],
        ),
        (
            &["--shard", "0/0", "--cache-repo", &unreachable],
            2,
            &["`0/0`"],
        ),
        (&["--shard", "0/2"], 2, &["--cache-repo"]),
        (
            &[
                "--shard",
                "0/2",
                "--cache-repo",
                &unreachable,
                "--cache-repo-readonly",
            ],
            2,
            &["--cache-repo-readonly"],
        ),
        // Unreachable: the shard's layers would reach no one.
        (
            &["--shard", "0/2", "--cache-repo", &unreachable],
            1,
            &["--shard", &unreachable],
        ),
    ];
    for (flags, code, needles) in cases {
        let mut args = vec!["--insecure", "build", "recipes/image.toml"];
        args.extend_from_slice(flags);
        let run = worker.run(&args);
        run.assert_failure_naming(code, needles);
    }
    assert!(
        !worker.path().join("images").exists(),
        "a failed shard leaves no image"
    );
}
