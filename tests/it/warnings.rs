//! Every warning of the library reaches the user through the `Reporter`, so `--json` gives it
//! as a `warning` event (docs/src/commands/build.md, "`--json` events"); `tracing` is for debugging only. Each
//! test provokes one kind of warning through the real CLI, and a scan of `src/` keeps
//! `tracing::warn!` out of the library.

use std::path::Path;

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
            "cache/layers` is a regular file, not a directory",
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
fn the_download_and_push_limits_are_warned_of_too() {
    // Both were dropped without a word before: a wheel index bigger than the default bound,
    // or a proxy's body limit, would go on as if nothing were set.
    for (name, value) in [
        ("IMGBUILD_MAX_UNSIZED_DOWNLOAD", "16GiB"),
        ("IMGBUILD_PUSH_CHUNK_SIZE", "-5"),
    ] {
        let project = project();
        let run = build_json_with(&project, (name, value));
        assert_one_warning(
            &run,
            &[&format!(
                "{name}={value} is not a positive integer; using the default"
            )],
        );
    }
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

#[test]
fn a_corrupted_layer_cache_entry_is_evicted_with_a_warning_event() {
    let project = project();
    let digest = project.build(&[]).success().digest();
    let keys = project.path().join("cache/layers/keys");
    for entry in fs_err::read_dir(&keys).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "json") {
            fs_err::write(path, "not json").unwrap();
        }
    }
    // No image in place: the same inputs build again, through the cache.
    fs_err::remove_dir_all(project.path().join("images")).unwrap();
    let run = project.build(&["--json"]);
    let warnings = json_warnings(&run);
    assert!(!warnings.is_empty(), "{}", run.stdout);
    for warning in &warnings {
        assert!(
            warning.starts_with("layer `")
                && warning.contains("fails its check (key file: ")
                && warning.ends_with("evicted, building the layer again"),
            "{warnings:?}"
        );
    }
    let layout = crate::common::LayoutView::new(project.path().join("images/progress"));
    assert_eq!(layout.manifest_digest(), digest, "the same image");
}

#[test]
fn no_machine_key_for_the_layer_cache_is_a_warning_event() {
    let project = project();
    let args = ["build", "recipes/image.toml", "--json"];
    let mut command = project.command(&args);
    for name in ["HOME", "XDG_STATE_HOME", "IMGBUILD_CACHE_KEY_FILE"] {
        command.env_remove(name);
    }
    let run = crate::common::run_with_deadline(command, &project, &args);
    assert_one_warning(
        &run,
        &["no HOME, XDG_STATE_HOME or IMGBUILD_CACHE_KEY_FILE: cached layers are verified in full"],
    );
}

#[test]
fn a_machine_key_that_cannot_be_used_is_a_warning_event() {
    let project = project();
    // A directory where the key file should be.
    let key = project.path().join("state/cache-key");
    fs_err::create_dir_all(&key).unwrap();
    let run = project.build(&["--json"]);
    assert_one_warning(
        &run,
        &[
            "the layer cache key `",
            "cannot be used (",
            "verified in full on every use",
        ],
    );
}

/// `tracing::warn!` outside `src/cli`, in code (not comments, strings or tests): a warning
/// that `--json` would never show.
fn tracing_warnings(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walkdir::WalkDir::new(src).sort_by_file_name() {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "rs") || path.starts_with(src.join("cli")) {
            continue;
        }
        let code: String = crate::layering::code_of(&fs_err::read_to_string(path).unwrap())
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if code.contains("warn!(") {
            found.push(path.strip_prefix(src).unwrap().display().to_string());
        }
    }
    found
}

#[test]
fn the_library_warns_only_through_the_reporter() {
    let found: Vec<String> = crate::layering::library_sources()
        .iter()
        .flat_map(|src| tracing_warnings(src))
        .collect();
    assert!(
        found.is_empty(),
        "tracing::warn! in {found:?}: tell the Reporter (`on_warning`), or return the warning to the stage that has it"
    );
}

#[test]
fn the_scan_sees_a_warning_across_lines_and_not_in_comments_or_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs_err::create_dir_all(src.join("cli")).unwrap();
    fs_err::write(src.join("a.rs"), "fn f() { tracing::warn !\n(\"x\"); }\n").unwrap();
    fs_err::write(src.join("b.rs"), "// tracing::warn!(\"x\")\nfn g() {}\n").unwrap();
    fs_err::write(src.join("cli/c.rs"), "fn h() { tracing::warn!(\"x\"); }\n").unwrap();
    assert_eq!(tracing_warnings(&src), vec!["a.rs".to_string()]);
}
