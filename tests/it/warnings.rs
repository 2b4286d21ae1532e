//! Every warning of the library reaches the user through the `Reporter`, so `--json` gives it
//! as a `warning` event (README, "`--json` events"); `tracing` is for debugging only. Each
//! test provokes one kind of warning through the real CLI.

use serde_json::Value;

use crate::{
    common::{Project, Run},
    progress::{events, project},
};

/// The messages of the `warning` events of a `--json` run, which must have succeeded.
#[track_caller]
fn json_warnings(run: &Run) -> Vec<String> {
    assert_eq!(run.code, 0, "{}", run.stderr);
    events(&run.stdout)
        .into_iter()
        .filter(|event| event["event"] == "warning")
        .map(|event| event["message"].as_str().unwrap().to_string())
        .collect()
}

/// Exactly one warning, containing every one of `needles`.
#[track_caller]
fn assert_one_warning(run: &Run, needles: &[&str]) {
    let warnings = json_warnings(run);
    assert_eq!(warnings.len(), 1, "one warning event: {warnings:?}");
    for needle in needles {
        assert!(warnings[0].contains(needle), "`{needle}` in {warnings:?}");
    }
}

/// `build --json` with one more environment variable.
fn build_json_with(project: &Project, env: (&str, &str)) -> Run {
    project.run_with(&["build", "recipes/image.toml", "--json"], &[env], None)
}

/// A file where the cache keeps a directory.
fn block(project: &Project, dir: &str) {
    let path = project.path().join("cache").join(dir);
    fs_err::create_dir_all(path.parent().unwrap()).unwrap();
    fs_err::write(path, "not a directory\n").unwrap();
}

#[test]
fn a_clean_build_warns_of_nothing() {
    let project = project();
    assert_eq!(
        json_warnings(&project.build(&["--json"])),
        Vec::<String>::new()
    );
}

#[test]
fn a_build_record_that_cannot_be_written_is_a_warning_event() {
    let project = project();
    block(&project, "builds");
    let run = project.build(&["--json"]);
    assert_one_warning(&run, &["could not record the build in", "cache/builds"]);
}

#[test]
fn a_layer_cache_that_is_a_file_is_a_warning_event() {
    let project = project();
    block(&project, "layers");
    let run = project.build(&["--json"]);
    assert_one_warning(
        &run,
        &[
            "not using the layer cache: `",
            "cache/layers` is",
            "not a directory",
        ],
    );
}

#[test]
fn a_package_check_that_cannot_be_recorded_is_a_warning_event() {
    let project = project();
    block(&project, "checked");
    let run = project.build(&["--json"]);
    let warnings = json_warnings(&run);
    assert!(!warnings.is_empty(), "{}", run.stdout);
    for warning in &warnings {
        assert!(
            warning.starts_with("could not record that ") && warning.contains(" was checked: "),
            "{warnings:?}"
        );
    }
    assert!(
        warnings.iter().any(|w| w.contains("hello-1.0")),
        "{warnings:?}"
    );
}

#[test]
fn a_limit_that_is_not_a_positive_integer_is_a_warning_event() {
    let project = project();
    let run = build_json_with(&project, ("IMGBUILD_MAX_UNPACK_RATIO", "lots"));
    assert_one_warning(
        &run,
        &["IMGBUILD_MAX_UNPACK_RATIO=lots is not a positive integer; using the default"],
    );
}

#[test]
fn an_unreadable_manifest_in_the_layout_keeps_its_blobs_with_a_warning_event() {
    let project = project();
    project.build(&[]).success();
    // Another tag's entry that names a manifest the layout does not hold.
    let index_path = project.path().join("images/progress/index.json");
    let mut index: Value = serde_json::from_slice(&fs_err::read(&index_path).unwrap()).unwrap();
    let mut other = index["manifests"][0].clone();
    other["digest"] = format!("sha256:{}", "0".repeat(64)).into();
    other["annotations"]["org.opencontainers.image.ref.name"] = "other".into();
    index["manifests"].as_array_mut().unwrap().push(other);
    fs_err::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    // Other inputs, so the build writes (and collects) rather than finding it unchanged.
    let run = build_json_with(&project, ("SOURCE_DATE_EPOCH", "1"));
    assert_one_warning(
        &run,
        &[
            "not removing unused blobs from",
            "cannot be read as a manifest or index",
        ],
    );
}
