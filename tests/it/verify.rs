//! `imgbuild verify`, crash safety (builds killed at random points) and concurrent builds
//! sharing a cache and an output directory.

use std::process::{Command, Stdio};

use crate::{
    common::{LayoutView, Project},
    support::{channel::tiny_recipe, imgbuild_bin, shared_channel},
};

fn project(name: &str, deps: &[&str]) -> Project {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), name, deps));
    project
}

/// `imgbuild build RECIPE -q` in the background with the project's cache; stderr is kept
/// for a failure message.
fn spawn_build(project: &Project, recipe: &str) -> std::process::Child {
    Command::new(imgbuild_bin())
        .args(["build", recipe, "-q"])
        .current_dir(project.path())
        .env("IMGBUILD_CACHE_DIR", &project.cache)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Alternates between two versions of `hello`, so each build really replaces the image in
/// place instead of finding it unchanged.
fn hello_for(round: usize) -> &'static str {
    if round.is_multiple_of(2) {
        "hello 1.0"
    } else {
        "hello 2.0"
    }
}

#[test]
fn verify_checks_blobs_diff_ids_lock_and_rebuild() {
    let project = project("checked", &["hello 1.0", "pyhello"]);
    project.build(&[]).success();
    let image = "images/checked";
    let ok = project
        .run(&[
            "verify",
            image,
            "--recipe",
            "recipes/image.toml",
            "--rebuild",
            "--json",
        ])
        .success();
    let report: serde_json::Value = serde_json::from_str(&ok.stdout).unwrap();
    let layout = LayoutView::new(project.path().join(image));
    assert_eq!(report["rebuilt"], layout.manifest_digest());
    assert_eq!(report["layers_checked"], 5);

    // A rebuild that differs names the first differing file: an image made with another
    // SOURCE_DATE_EPOCH differs from the lock's in its own layer's timestamps.
    let dated = project
        .run_with(
            &["build", "recipes/image.toml", "-o", "out/dated"],
            &[("SOURCE_DATE_EPOCH", "1")],
            None,
        )
        .success();
    let differs = project.run(&[
        "verify",
        "out/dated",
        "--recipe",
        "recipes/image.toml",
        "--rebuild",
    ]);
    differs.assert_clean_failure(1);
    assert!(
        differs.stderr.contains(&format!(
            "A rebuild from the lock gives {}, not {}",
            ok_digest(&layout),
            dated.digest()
        )) && differs.stderr.contains("layer 4: `opt/` differs"),
        "{}",
        differs.stderr
    );

    // The lock changed: the image no longer holds what it pins.
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        "checked",
        &["hello 2.0", "pyhello"],
    ));
    project.run(&["lock", "recipes/image.toml"]).success();
    let stale = project.run(&["verify", image, "--recipe", "recipes/image.toml"]);
    stale.assert_clean_failure(1);
    assert!(
        stale
            .stderr
            .contains("locked package `hello-2.0-h0_0` is in no layer"),
        "{}",
        stale.stderr
    );

    // A blob with one byte changed, then one cut short.
    let manifest = layout.manifest();
    let digest = manifest["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = project
        .path()
        .join(image)
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let original = fs_err::read(&blob).unwrap();
    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0xff;
    fs_err::write(&blob, &flipped).unwrap();
    let corrupt = project.run(&["verify", image]);
    corrupt.assert_clean_failure(1);
    assert!(
        corrupt
            .stderr
            .contains(&format!("Blob {digest} does not match its digest")),
        "{}",
        corrupt.stderr
    );
    fs_err::write(&blob, &original[..original.len() - 10]).unwrap();
    let short = project.run(&["verify", image]);
    short.assert_clean_failure(1);
    assert!(
        short
            .stderr
            .contains(&format!("Blob {digest} has {} bytes", original.len() - 10)),
        "{}",
        short.stderr
    );
    fs_err::remove_file(&blob).unwrap();
    let missing = project.run(&["verify", image]);
    missing.assert_clean_failure(1);
    assert!(
        missing
            .stderr
            .contains(&format!("Blob {digest} is missing")),
        "{}",
        missing.stderr
    );
}

fn ok_digest(layout: &LayoutView) -> String {
    layout.manifest_digest()
}

/// A fixed sequence of pseudo-random fractions in [0, 1), so a failure can be replayed.
fn fractions(count: usize) -> Vec<f64> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 10_000) as f64 / 10_000.0
        })
        .collect()
}

#[test]
fn builds_killed_at_random_points_never_break_the_image() {
    let project = project("killed", &["hello 1.0", "pyhello", "other"]);
    project.build(&[]).success();
    // Kill points are fractions of how long a build takes on this machine, so they land
    // inside builds however fast or loaded the machine is.
    let timed = |hello: &str| {
        project.write_recipe(&tiny_recipe(
            shared_channel(),
            "killed",
            &[hello, "pyhello", "other"],
        ));
        let started = std::time::Instant::now();
        project.build(&["-q"]).success();
        started.elapsed()
    };
    // The fastest of three: a machine that gets less loaded during the test must still
    // see builds killed while they run.
    let samples = [timed("hello 2.0"), timed("hello 1.0"), timed("hello 2.0")];
    let build_time = samples.into_iter().min().expect("three samples");
    let mut killed_mid_build = 0;
    for (round, fraction) in fractions(20).into_iter().enumerate() {
        let delay = build_time.mul_f64(fraction * 0.9);
        project.write_recipe(&tiny_recipe(
            shared_channel(),
            "killed",
            &[hello_for(round), "pyhello", "other"],
        ));
        let mut child = spawn_build(&project, "recipes/image.toml");
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            killed_mid_build += 1;
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();

        // Whatever image is in place is whole.
        if project.path().join("images/killed/index.json").exists() {
            project.run(&["verify", "images/killed"]).success();
        }
        // And the next build completes without any cleanup.
        project.build(&[]).success();
        project
            .run(&["verify", "images/killed", "--recipe", "recipes/image.toml"])
            .success();
    }
    assert!(
        killed_mid_build >= 10,
        "only {killed_mid_build} of 20 builds were killed while running"
    );
    // Each build removed the staging trees its killed predecessor left.
    assert_eq!(staging_entries(&project), Vec::<String>::new());
}

/// What is in the cache's staging directory.
fn staging_entries(project: &Project) -> Vec<String> {
    let staging = project.cache.join("staging");
    let mut names: Vec<String> = fs_err::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A build killed while its staging tree exists leaves it behind; the next build removes it.
#[test]
fn a_killed_build_leaves_no_staging_tree_after_the_next_build() {
    let project = project("stale", &["hello 1.0", "pyhello", "other"]);
    let staging = project.cache.join("staging");
    let mut left_behind = Vec::new();
    // A build may finish before its tree is seen; a handful of tries always catches one.
    for attempt in 0..20 {
        project.write_recipe(&tiny_recipe(
            shared_channel(),
            "stale",
            &[hello_for(attempt), "pyhello", "other"],
        ));
        let mut child = spawn_build(&project, "recipes/image.toml");
        while child.try_wait().unwrap().is_none() {
            let trees = fs_err::read_dir(&staging).map_or(0, |dir| {
                dir.filter(|e| {
                    let e = e.as_ref().unwrap();
                    e.file_name().to_string_lossy().starts_with("build-") && e.path().is_dir()
                })
                .count()
            });
            if trees > 0 {
                let _ = child.kill(); // SIGKILL
                break;
            }
            std::thread::yield_now();
        }
        let _ = child.wait();
        left_behind = staging_entries(&project);
        if !left_behind.is_empty() {
            break;
        }
    }
    assert!(
        left_behind.iter().any(|n| !n.ends_with(".lock")),
        "no build was killed with its staging tree in place: {left_behind:?}"
    );
    project.build(&[]).success();
    assert_eq!(staging_entries(&project), Vec::<String>::new());
}

#[test]
fn concurrent_builds_sharing_cache_and_output() {
    let project = project("shared", &["hello 1.0", "pyhello"]);
    project.build(&[]).success();
    let other = project.path().join("recipes/other.toml");
    for round in 1..6 {
        // New contents each round, so the builds replace the images instead of finding
        // them unchanged.
        project.write_recipe(&tiny_recipe(
            shared_channel(),
            "shared",
            &[hello_for(round), "pyhello"],
        ));
        fs_err::write(
            &other,
            tiny_recipe(shared_channel(), "other", &["other", hello_for(round + 1)]),
        )
        .unwrap();
        // Two builds of the same image and one of another, at once.
        let children = [
            spawn_build(&project, "recipes/image.toml"),
            spawn_build(&project, "recipes/image.toml"),
            spawn_build(&project, "recipes/other.toml"),
        ];
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        project
            .run(&["verify", "images/shared", "--recipe", "recipes/image.toml"])
            .success();
        project
            .run(&["verify", "images/other", "--recipe", "recipes/other.toml"])
            .success();
    }
}
