//! `imgbuild slurm --build` (issue 28, item 2) on a real Slurm of two nodes (two `slurmd` of
//! Debian's 22.05 on this host), with Debian's `docker-registry` on 127.0.0.1 as both the
//! layer cache and the target: the driver script submits an array of 4 shard tasks and a
//! build job after them (`afterok`). The images it pushes are, digest for digest, those of a
//! local `--locked` build, and across all the tasks each distinct layer was compressed
//! exactly once, counted from their `--json` events.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde_json::Value;

use crate::{
    cache_repo::{copy_locks, matrix_build, project, pythons_recipe},
    common::{Project, require_root},
    registry::{Auth, Registry},
    shard::package_digests,
    slurm::Cluster,
    support::base::have,
};

const TOOLS: &[&str] = &["slurmctld", "slurmd", "sbatch", "scontrol", "munged"];

/// Two variants (pythons) that share `hello` and `other`, each pushed under its own tag.
fn recipe(extra: &Path) -> String {
    let packages = ["python {{python}}", "pyhello", "hello 1.0", "other"];
    pythons_recipe(extra, &packages).replace(
        "base = \"scratch\"\n",
        "base = \"scratch\"\ntags = [\"py{{python}}\"]\n",
    )
}

/// Every JSON event of a job's output file.
fn events(path: &Path) -> Vec<Value> {
    let text = fs_err::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[test]
fn a_sharded_build_on_two_nodes_pushes_the_local_images_compressing_each_layer_once() {
    require_root!("slurmd needs root to start jobs as their users");
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| !have(t)).collect();
    assert!(
        missing.is_empty(),
        "the Slurm daemons and clients are required: run tests/install-deps.sh (missing: {})",
        missing.join(", ")
    );
    let registry = Registry::start(Auth::None);
    let extra = tempfile::tempdir().unwrap();
    let recipe = recipe(extra.path());
    let local = project(&recipe);
    let reference = matrix_build(&local, &[]);
    let distinct: BTreeSet<String> = reference
        .iter()
        .flat_map(|r| package_digests(&local, r))
        .collect();

    let cluster = Cluster::start_nodes(2);
    let site = project(&recipe);
    copy_locks(&local, &site);
    let docker = site.path().join("docker");
    let (cache, images) = (
        format!("{}/ci/layers", registry.host),
        format!("{}/ci/images", registry.host),
    );
    let written = site.run(&[
        "slurm",
        "--build",
        "recipes/image.toml",
        "--repository",
        &images,
        "--cache-repo",
        &cache,
        "--shards",
        "4",
        "--insecure-registry",
        "--env",
        &format!("DOCKER_CONFIG={}", docker.display()),
        "--env",
        &format!("REGISTRY_AUTH_FILE={}", docker.join("auth.json").display()),
    ]);
    assert_eq!(written.code, 0, "{}", written.stderr);
    let driver = site.path().join("build.sh");
    fs_err::write(&driver, &written.stdout).unwrap();
    let submitted = cluster
        .client("bash")
        .arg(&driver)
        .current_dir(site.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&submitted.stdout).into_owned();
    assert!(
        submitted.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let array = said
        .split_whitespace()
        .nth(3)
        .map(|id| id.trim_end_matches(';').to_string())
        .unwrap_or_else(|| panic!("no job id in `{said}`"));
    let jobs = cluster.wait_for_job(&array);
    let states: Vec<(&str, &str)> = jobs
        .iter()
        .map(|j| (j.get("JobName"), j.get("JobState")))
        .collect();
    assert!(
        jobs.len() == 5 && jobs.iter().all(|j| j.get("JobState") == "COMPLETED"),
        "{states:?}\n{}",
        cluster.logs()
    );
    let nodes: BTreeSet<&str> = jobs
        .iter()
        .filter(|j| j.get("JobName") == "pythons-shards")
        .map(|j| j.get("NodeList"))
        .collect();
    assert!(nodes.len() >= 2, "the array ran on {nodes:?}");

    // Each distinct layer compressed by exactly one task, counted from their events.
    let mut compressed: BTreeMap<String, usize> = BTreeMap::new();
    for task in 0..4 {
        let output = site
            .path()
            .join(format!("pythons-shards-{array}_{task}.out"));
        let shard = events(&output)
            .into_iter()
            .find(|e| e["event"] == "shard")
            .unwrap_or_else(|| panic!("no shard event in {}", output.display()));
        for layer in shard["layers"].as_array().unwrap() {
            if layer["compressed"] == true {
                *compressed
                    .entry(layer["digest"].as_str().unwrap().into())
                    .or_default() += 1;
            }
        }
    }
    assert_eq!(
        compressed.keys().cloned().collect::<BTreeSet<_>>(),
        distinct
    );
    assert!(compressed.values().all(|n| *n == 1), "{compressed:?}");

    // The build job: every variant from the cache, pushed, equal to the local build.
    let build = jobs
        .iter()
        .find(|j| j.get("JobName") == "pythons-build")
        .unwrap();
    let output = site
        .path()
        .join(format!("pythons-build-{}.out", build.get("JobId")));
    let events = events(&output);
    let results: Vec<&Value> = events.iter().filter(|e| e["event"] == "result").collect();
    let pushes: Vec<&Value> = events.iter().filter(|e| e["event"] == "push").collect();
    assert_eq!(
        (results.len(), pushes.len()),
        (2, 2),
        "{}",
        output.display()
    );
    for ((result, push), reference) in results.iter().zip(&pushes).zip(&reference) {
        assert_eq!(result["digest"], reference["digest"], "{result}");
        assert_eq!(push["digest"], reference["digest"], "{push}");
        let kinds: Vec<&Value> = result["written_layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| &l["kind"])
            .collect();
        assert!(
            kinds.iter().all(|k| *k != "conda" && *k != "wheels"),
            "a package layer was compressed again: {result}"
        );
        // The registry serves the image under the variant's tag, by that digest.
        let tag = &reference["tags"][0];
        let pushed = push["pushed"].as_str().unwrap();
        assert!(
            pushed.starts_with(&format!("{images}:{}", tag.as_str().unwrap())),
            "{pushed}"
        );
    }
}

/// `slurm --build` of `project`'s recipe with `flags`.
fn driver(project: &Project, flags: &[&str]) -> crate::common::Run {
    let mut args = vec![
        "slurm",
        "--build",
        "recipes/image.toml",
        "--repository",
        "registry.example/ml/pythons",
    ];
    args.extend_from_slice(flags);
    project.run(&args)
}

#[test]
fn the_container_runners_write_scripts_bash_reads_and_bad_builds_are_refused() {
    let extra = tempfile::tempdir().unwrap();
    let recipe = recipe(extra.path());
    let site = project(&recipe);
    let cache = ["--cache-repo", "registry.example/ci/layers"];
    // No locks yet: the cluster builds with `--locked`.
    driver(&site, &cache).assert_failure_naming(1, &["does not exist", "lock every variant"]);
    let local = project(&recipe);
    matrix_build(&local, &[]);
    copy_locks(&local, &site);

    for (runner, step) in [
        ("podman", "srun podman run --rm --network=host"),
        (
            "pyxis",
            "srun --container-image='registry.example#tools/imgbuild:1'",
        ),
    ] {
        let mut flags = cache.to_vec();
        flags.extend(["--builder-image", "registry.example/tools/imgbuild:1"]);
        flags.extend(["--runner", runner, "--shards", "3"]);
        let run = driver(&site, &flags);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let script = &run.stdout;
        assert!(script.contains("#SBATCH --array=0-2\n"), "{script}");
        assert!(
            script.contains("--shard \"$SLURM_ARRAY_TASK_ID/3\""),
            "{script}"
        );
        assert!(
            script.contains("--dependency=afterok:\"$shards\""),
            "{script}"
        );
        assert_eq!(script.matches(step).count(), 3, "{script}");
        assert_eq!(script.matches(" --variant ").count(), 2, "{script}");
        let file = site.path().join(format!("{runner}.sh"));
        fs_err::write(&file, script).unwrap();
        let checked = std::process::Command::new("bash")
            .arg("-n")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            checked.status.success(),
            "{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }

    let refused: [(&[&str], &[&str]); 4] = [
        (&[], &["--cache-repo"]),
        (
            &[
                "--cache-repo",
                "registry.example/ci/layers",
                "--set",
                "gpus=1",
            ],
            &["--set gpus"],
        ),
        (
            &["--cache-repo", "registry.example/ci/layers:v1"],
            &["names an image"],
        ),
        (
            &[
                "--cache-repo",
                "registry.example/ci/layers",
                "--shards",
                "0",
            ],
            &["--shards"],
        ),
    ];
    for (flags, needles) in refused {
        let run = driver(&site, flags);
        assert_ne!(run.code, 0, "{flags:?}: {}", run.stdout);
        for needle in needles {
            assert!(run.stderr.contains(needle), "{flags:?}: {}", run.stderr);
        }
    }
}

#[test]
fn variants_that_would_push_to_one_tag_or_a_recipe_path_with_a_line_break_are_refused() {
    let extra = tempfile::tempdir().unwrap();
    let one_tag = pythons_recipe(extra.path(), &["python {{python}}"]);
    let site = project(&one_tag);
    let cache = ["--cache-repo", "registry.example/ci/layers"];
    let local = project(&one_tag);
    matrix_build(&local, &[]);
    copy_locks(&local, &site);
    driver(&site, &cache).assert_failure_naming(1, &["would both push to tag `latest`"]);

    // A path with a line break would end the here-document early and run what follows.
    let site = project(&recipe(extra.path()));
    matrix_build(&site, &[]);
    let odd = site
        .path()
        .join("recipes/odd\nIMGBUILD_SHARDS\ntouch pwned");
    fs_err::create_dir_all(&odd).unwrap();
    let recipe = odd.join("image.toml");
    fs_err::write(&recipe, recipe_text_of(&site)).unwrap();
    for entry in fs_err::read_dir(site.path().join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lock") {
            fs_err::copy(&path, odd.join(path.file_name().unwrap())).unwrap();
        }
    }
    let run = site.run(&[
        "slurm",
        "--build",
        recipe.to_str().unwrap(),
        "--repository",
        "registry.example/ml/pythons",
        "--cache-repo",
        "registry.example/ci/layers",
    ]);
    run.assert_failure_naming(1, &["line break", "recipe path"]);
    assert!(!run.stdout.contains("touch pwned"), "{}", run.stdout);
}

/// The recipe of `project`, as written.
fn recipe_text_of(project: &Project) -> String {
    fs_err::read_to_string(project.recipe_path()).unwrap()
}
