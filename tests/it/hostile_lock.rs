//! The lock surface (README, "Input surfaces"): a lock arrives in a pull request beside its
//! recipe, so everything in it is a stranger's claim. Each case builds a good image first,
//! then hands `build` (and, where it reads locks, `verify --recipe`) a hostile lock, and
//! checks the refusal names the lock or the package, exits 1, never waits or aborts,
//! carries no host secret into an output or an error, and leaves the good image as it was.
//!
//! Cases of the last round live beside these: a lock pinning a package or wheel outside the
//! recipe's channels and find-links (`hostile_inputs.rs`), a sha256 that does not match the
//! archive, a lock that is a device (`hostile.rs`).

use std::path::Path;

use crate::{
    common::{Project, Run, run_with_deadline},
    hostile_inputs::{pypi_recipe, recipe, sources},
    trust::{Canary, Tree},
};

/// A project with the good image built from `chan/`, and the tree of its `images/`.
fn built() -> (Project, Tree) {
    let project = Project::new();
    project.write_recipe(&recipe(&sources().url("chan")));
    project.build(&[]).success();
    let images = Tree::of(&project.path().join("images"));
    (project, images)
}

/// `build` (reusing the lock) and `build --locked`, each with a deadline and its own output.
fn builds(project: &Project) -> Vec<Run> {
    [&[][..], &["--locked"][..]]
        .iter()
        .map(|extra| {
            let mut args = vec!["build", "recipes/image.toml", "-o", "images/hostile"];
            args.extend_from_slice(extra);
            run_with_deadline(project.command(&args), project, &args)
        })
        .collect()
}

/// Both builds refuse, naming `needles`, and nothing changed in `images/` but for no new
/// image.
#[track_caller]
fn refused(project: &Project, images: &Tree, needles: &[&str]) {
    for run in builds(project) {
        run.assert_failure_naming(1, needles);
    }
    assert!(!project.path().join("images/hostile").exists());
    assert_eq!(&Tree::of(&project.path().join("images")), images);
}

/// The lock's text with every `from` replaced by `to` (which must occur in it).
#[track_caller]
fn edit_lock(project: &Project, from: &str, to: &str) {
    let text = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(text.contains(from), "`{from}` is not in the lock:\n{text}");
    fs_err::write(project.lock_path(), text.replace(from, to)).unwrap();
}

/// What follows `key` on the first line of the lock that starts with it (after
/// indentation): `- conda: ` gives the first package's path.
fn lock_value(project: &Project, key: &str) -> String {
    fs_err::read_to_string(project.lock_path())
        .unwrap()
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(key).map(str::to_string))
        .unwrap_or_else(|| panic!("no `{key}` line in the lock"))
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_lock_that_is_a_fifo_is_refused_without_waiting() {
    let (project, images) = built();
    fs_err::remove_file(project.lock_path()).unwrap();
    mkfifo(&project.lock_path());
    refused(&project, &images, &["recipes/image.lock", "is a fifo"]);
}

#[test]
fn a_lock_that_is_a_directory_is_refused() {
    let (project, images) = built();
    fs_err::remove_file(project.lock_path()).unwrap();
    fs_err::create_dir(project.lock_path()).unwrap();
    refused(&project, &images, &["recipes/image.lock", "is a directory"]);
}

#[test]
fn a_sparse_lock_over_the_bound_is_refused_before_reading() {
    let (project, images) = built();
    let file = fs_err::File::create(project.lock_path()).unwrap();
    file.set_len(65 << 20).unwrap();
    refused(
        &project,
        &images,
        &["recipes/image.lock", "has 68157440 bytes; at most 67108864"],
    );
}

#[test]
fn a_lock_that_is_not_utf8_is_refused() {
    let (project, images) = built();
    let mut bytes = fs_err::read(project.lock_path()).unwrap();
    bytes.extend_from_slice(b"# \xff\xfe\n");
    fs_err::write(project.lock_path(), bytes).unwrap();
    refused(&project, &images, &["recipes/image.lock", "UTF-8"]);
}

/// A lock linked to a host file: its content must not be echoed into the error, where a CI
/// log would publish it.
#[test]
fn a_lock_linked_to_a_host_secret_never_echoes_it() {
    let (project, images) = built();
    let canary = Canary::new();
    fs_err::remove_file(project.lock_path()).unwrap();
    std::os::unix::fs::symlink(canary.file(), project.lock_path()).unwrap();
    for run in builds(&project) {
        run.assert_clean_failure(1);
        assert!(
            !run.stderr.contains(&canary.secret),
            "the secret was echoed:\n{}",
            run.stderr
        );
    }
    canary.assert_not_in(project.path());
    canary.assert_untouched();
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

/// Aliases that expand to about 10^9 nodes from a few hundred bytes ("billion laughs").
#[test]
fn a_yaml_alias_bomb_is_refused() {
    let (project, images) = built();
    let mut text = String::from("version: 6\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let refs = vec![format!("*a{}", level - 1); 10].join(", ");
        text.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
    }
    text.push_str("environments: *a9\n");
    fs_err::write(project.lock_path(), text).unwrap();
    refused(&project, &images, &["recipes/image.lock"]);
}

/// Nesting deep enough to overflow a recursive parser's stack, were it unbounded.
#[test]
fn deeply_nested_yaml_is_refused() {
    let (project, images) = built();
    let depth = 100_000;
    let text = format!(
        "version: 6\nenvironments: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    fs_err::write(project.lock_path(), text).unwrap();
    refused(&project, &images, &["recipes/image.lock"]);
}

#[test]
fn a_lock_pinning_a_host_file_as_a_package_is_refused() {
    let (project, images) = built();
    let canary = Canary::new();
    let path = lock_value(&project, "- conda: ");
    let secret = canary.file().display().to_string();
    edit_lock(&project, &path, &secret);
    refused(&project, &images, &["recipes/image.lock"]);
    // The same host file under a package's name is refused as outside the channels.
    let host = tempfile::tempdir().unwrap();
    let named = host.path().join("linux-64/good-1.0-h0_0.tar.bz2");
    fs_err::create_dir_all(named.parent().unwrap()).unwrap();
    fs_err::copy(canary.file(), &named).unwrap();
    edit_lock(&project, &secret, &named.display().to_string());
    refused(
        &project,
        &images,
        &["good-1.0-h0_0", "the recipe's channels"],
    );
    canary.assert_not_in(project.path());
    canary.assert_untouched();
}

/// A path that starts inside the channel and climbs out of it with `..`.
#[test]
fn a_lock_path_climbing_out_of_the_channel_is_refused() {
    let (project, images) = built();
    let path = lock_value(&project, "- conda: ");
    let climbing = path.replacen(
        "/chan/linux-64/",
        "/chan/linux-64/../../chan-evil/linux-64/",
        1,
    );
    edit_lock(&project, &path, &climbing);
    refused(&project, &images, &["good", "chan-evil"]);
}

/// A URL to a server outside the channels is refused before anything is fetched from it.
#[test]
fn a_lock_pinning_a_loopback_url_outside_the_channels_fetches_nothing() {
    let (project, images) = built();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!(
        "http://{}/linux-64/good-1.0-h0_0.tar.bz2",
        listener.local_addr().unwrap()
    );
    let path = lock_value(&project, "- conda: ");
    edit_lock(&project, &path, &url);
    refused(&project, &images, &["good", &url]);
    assert!(
        listener.accept().is_err(),
        "imgbuild connected to a server the recipe never named"
    );
}

#[test]
fn a_sha256_that_is_not_hex_is_refused() {
    let (project, images) = built();
    let digest = lock_value(&project, "sha256: ");
    edit_lock(&project, &digest, &"z".repeat(64));
    refused(&project, &images, &["recipes/image.lock"]);
}

/// Control characters in a package name must not reach the terminal as they are.
#[test]
fn control_characters_in_a_locked_name_are_refused() {
    let (project, images) = built();
    let path = lock_value(&project, "- conda: ");
    edit_lock(&project, &path, "\"good-1.0-h0_0\\e[2J\\u202e.tar.bz2\"");
    for run in builds(&project) {
        run.assert_clean_failure(1);
        assert!(!run.stderr.contains('\u{1b}'), "{:?}", run.stderr);
        assert!(!run.stderr.contains('\u{202e}'), "{:?}", run.stderr);
    }
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

/// A `requires_dist` entry that pep508_rs 0.9.2 panics on, inside rattler_lock's reading of
/// the lock: refused before rattler_lock reads it, by `build` and by `init --from` (which
/// takes the same lock as a pixi.lock).
#[test]
fn a_locked_requirement_pep508_rs_panics_on_is_refused() {
    let project = Project::new();
    project.write_recipe(&pypi_recipe());
    project.build(&[]).success();
    let images = Tree::of(&project.path().join("images"));
    let text = fs_err::read_to_string(project.lock_path()).unwrap();
    let entry = text
        .lines()
        .find(|line| line.trim_start().starts_with("- pypi: "))
        .unwrap_or_else(|| panic!("no PyPI package in the lock:\n{text}"));
    let indent = " ".repeat(entry.len() - entry.trim_start().len() + 2);
    edit_lock(
        &project,
        entry,
        &format!("{entry}\n{indent}requires_dist:\n{indent}- torch-- >=1"),
    );
    let needles = [
        "recipes/image.lock",
        "`torch-- >=1`",
        "must end with a letter",
    ];
    for run in builds(&project) {
        run.assert_failure_naming(1, &needles);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
    assert_eq!(Tree::of(&project.path().join("images")), images);
    fs_err::copy(project.lock_path(), project.path().join("pixi.lock")).unwrap();
    let run = project.run(&["init", "--from", "pixi.lock", "-o", "recipes/imported.toml"]);
    run.assert_failure_naming(1, &["pixi.lock", "`torch-- >=1`", "must end with a letter"]);
    assert!(!project.path().join("recipes/imported.toml").exists());
}
