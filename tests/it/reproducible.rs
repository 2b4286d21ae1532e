//! Same lock + recipe ⇒ same manifest digest, whatever the directory, time, umask, cache or
//! thread count; and the same package gives the same layer in different images.

use crate::{
    common::{LayoutView, Project},
    support::{channel::tiny_recipe, shared_channel},
};

#[test]
fn same_lock_same_digest_across_directories_times_umasks_and_threads() {
    let recipe = tiny_recipe(
        shared_channel(),
        "repro",
        &["hello 1.0", "pyhello", "other"],
    );
    let first = Project::new();
    first.write_recipe(&recipe);
    let a = first
        .run_with(
            &["build", "recipes/image.toml", "--jobs", "1"],
            &[("TZ", "UTC"), ("LC_ALL", "C")],
            Some("022"),
        )
        .success();

    // Somewhere else, later, with another umask, cache, output path and thread count, from
    // the lock the first build wrote.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let second = Project::new();
    second.write_recipe(&recipe);
    fs_err::copy(first.lock_path(), second.lock_path()).unwrap();
    let b = second
        .run_with(
            &[
                "build",
                "recipes/image.toml",
                "--locked",
                "--jobs",
                "4",
                "-o",
                "out/elsewhere",
            ],
            &[("TZ", "Asia/Tokyo"), ("LC_ALL", "C.UTF-8")],
            Some("077"),
        )
        .success();

    assert_eq!(a.digest(), b.digest());
    let layout_a = LayoutView::new(first.path().join("images/repro"));
    let layout_b = LayoutView::new(second.path().join("out/elsewhere"));
    assert_eq!(layout_a.blob_names(), layout_b.blob_names());
    assert_eq!(
        fs_err::read(layout_a.dir.join("index.json")).unwrap(),
        fs_err::read(layout_b.dir.join("index.json")).unwrap()
    );

    // SOURCE_DATE_EPOCH sets `created` (so the digest changes) but no package layer.
    let c = second
        .run_with(
            &["build", "recipes/image.toml", "--locked", "-o", "out/dated"],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
            None,
        )
        .success();
    assert_ne!(c.digest(), a.digest());
    let layout_c = LayoutView::new(second.path().join("out/dated"));
    assert_eq!(layout_c.config()["created"], "2023-11-14T22:13:20Z");
    let packages = |view: &LayoutView| -> Vec<(String, String)> {
        view.layers()
            .into_iter()
            .filter(|(p, _)| !p.is_empty())
            .collect()
    };
    assert_eq!(packages(&layout_a), packages(&layout_c));
}

#[test]
fn a_package_shared_by_two_recipes_has_one_layer_digest() {
    let with_hello = Project::new();
    with_hello.write_recipe(&tiny_recipe(shared_channel(), "one", &["hello 2.0"]));
    with_hello.build(&[]).success();
    let with_other = Project::new();
    with_other.write_recipe(&tiny_recipe(
        shared_channel(),
        "two",
        &["other", "_r-mutex"],
    ));
    with_other.build(&[]).success();

    let one = LayoutView::new(with_hello.path().join("images/one")).layers();
    let two = LayoutView::new(with_other.path().join("images/two")).layers();
    // The CUDA runtime is the lowest layer of both, so runtimes share it (and everything
    // above it that is equal, by chain id).
    assert_eq!(one[0].0, "cuda-cudart-11.8.89-h0_0");
    assert_eq!(two[0].0, "cuda-cudart-11.8.89-h0_0");
    assert_eq!(one[0].1, two[0].1);
    // No other package layer is shared (the image's own layers, both holding just an empty
    // `conda-meta/history`, are equal too, which is right).
    let other_digests: Vec<&String> = two.iter().map(|(_, d)| d).collect();
    assert!(
        one[1..]
            .iter()
            .filter(|(packages, _)| !packages.is_empty())
            .all(|(_, d)| !other_digests.contains(&d))
    );
}

/// A package whose repodata record has no `arch`/`platform` (many channels omit them; the
/// solver fills them in from the subdir, the lock file does not keep them): the build that
/// solves and writes the lock and a later build from that lock must give the same image.
#[test]
fn fresh_solve_and_reused_lock_give_the_same_image() {
    use crate::support::hostile::{Channel, Package, Raw};

    let project = Project::new();
    let channel_dir = project.path().join("channel");
    let mut channel = Channel::new(&channel_dir);
    let package = Package::new(
        "plain",
        &[],
        false,
        vec![Raw::file("share/plain.txt", "x\n")],
    );
    let mut index: serde_json::Value = serde_json::from_slice(&package.info[0].1).unwrap();
    index.as_object_mut().unwrap().remove("arch");
    index.as_object_mut().unwrap().remove("platform");
    let package = package.with_info("index.json", serde_json::to_vec(&index).unwrap());
    channel.add("plain-1.0-h0_0.tar.bz2", &index, &package.tar_bz2(), |_| {});
    channel.finish();
    project.write_recipe(&tiny_recipe(&channel_dir, "plain", &["plain"]));

    let solved = project.build(&[]).success();
    let from_lock = project.build(&["--locked", "-o", "images/again"]).success();
    assert_eq!(solved.digest(), from_lock.digest());
}

/// Two packages shipping the same file: rattler renames the loser's copy to
/// `__clobbers__/…` and records it in the order its parallel links finished. imgbuild lets
/// packages share a path only when it is the same file, removes rattler's copy and records
/// the path itself for both, sorted, so the layers do not depend on that timing and no
/// `__clobbers__` path reaches the image (issue 15).
#[test]
fn clobbering_packages_give_sorted_records() {
    use std::io::Read;

    use crate::support::hostile::{Channel, Package, Raw};

    let project = Project::new();
    let channel_dir = project.path().join("channel");
    let mut channel = Channel::new(&channel_dir);
    for name in ["first", "second"] {
        let package = Package::new(
            name,
            &[],
            false,
            vec![
                Raw::file("lib/__init__.py", ""),
                Raw::file(format!("lib/{name}.so"), name),
                Raw::file(format!("share/{name}/README"), name),
            ],
        );
        let index: serde_json::Value = serde_json::from_slice(&package.info[0].1).unwrap();
        channel.add(
            &format!("{name}-1.0-h0_0.tar.bz2"),
            &index,
            &package.tar_bz2(),
            |_| {},
        );
    }
    channel.finish();
    project.write_recipe(&tiny_recipe(&channel_dir, "clobber", &["first", "second"]));

    let mut digests = Vec::new();
    for round in 0..3 {
        let output = format!("images/clobber{round}");
        let run = project.build(&["-o", &output]).success();
        digests.push(run.digest());
        let layout = LayoutView::new(project.path().join(&output));
        let (mut clobbered, mut shared) = (0, 0);
        for (_, digest) in layout.layers() {
            let blob = layout.blob(&digest);
            let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(&blob[..]));
            for entry in archive.entries().unwrap() {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                clobbered += usize::from(path.contains("__clobbers__"));
                if !(path.contains("/conda-meta/") && path.ends_with(".json")) {
                    continue;
                }
                let mut text = String::new();
                entry.read_to_string(&mut text).unwrap();
                let record: serde_json::Value = serde_json::from_str(&text).unwrap();
                let files: Vec<&str> = record["files"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f.as_str().unwrap())
                    .collect();
                let paths: Vec<&str> = record["paths_data"]["paths"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["_path"].as_str().unwrap())
                    .collect();
                clobbered += files
                    .iter()
                    .chain(&paths)
                    .filter(|f| f.contains("__clobbers__"))
                    .count();
                shared += usize::from(files.contains(&"lib/__init__.py"));
                assert!(files.is_sorted(), "{path}: files not sorted: {files:?}");
                assert!(
                    paths.is_sorted(),
                    "{path}: paths_data not sorted: {paths:?}"
                );
            }
        }
        assert_eq!(clobbered, 0, "no __clobbers__ path is recorded");
        assert_eq!(shared, 2, "both records list lib/__init__.py");
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
}

/// The layer memory budget changes what is in flight, never the bytes: a 9 MiB library (more
/// than one block of every compression) and a small package, built at `-j 1` with the
/// default budget and at `-j 8` with the smallest one, give the same image.
#[test]
fn the_layer_memory_budget_and_jobs_leave_the_digest_alone() {
    let url = url::Url::from_file_path(crate::estargz::channel()).unwrap();
    for compression in ["gzip", "zstd", "estargz", "zstd:chunked"] {
        let project = Project::new();
        project.write_recipe(&format!(
            "[image]\nname = \"budget\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
             [conda]\nchannels = [\"{url}\"]\ndependencies = [\"biglib\", \"tiny\"]\n\n\
             [layers]\ncompression = \"{compression}\"\n"
        ));
        let one = project.build(&["--jobs", "1"]).success();
        let eight = project
            .run_with(
                &[
                    "build",
                    "recipes/image.toml",
                    "--locked",
                    "--jobs",
                    "8",
                    "-o",
                    "out/j8",
                ],
                &[("IMGBUILD_LAYER_MEMORY", "33554432")],
                None,
            )
            .success();
        assert_eq!(one.digest(), eight.digest(), "{compression}");
    }
}

/// A budget below the minimum is refused before anything is built, naming the variable.
#[test]
fn a_layer_memory_budget_below_32_mib_is_refused() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "small", &["hello 1.0"]));
    for value in ["1000", "lots"] {
        project
            .run_with(
                &["build", "recipes/image.toml"],
                &[("IMGBUILD_LAYER_MEMORY", value)],
                None,
            )
            .assert_failure_naming(2, &["IMGBUILD_LAYER_MEMORY"]);
    }
    project.assert_no_image();
}
