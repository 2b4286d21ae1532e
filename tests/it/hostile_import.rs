//! Hostile locks through `imgbuild init --from` (README, "Input surfaces": pixi.lock,
//! conda-lock.yml, `@EXPLICIT`). Each is refused with exit 1, naming the file, never a
//! panic, and writes neither the recipe nor the lock.

use crate::common::Project;

/// A small valid pixi.lock (v6) pinning `url` with `sha256` on linux-64.
fn pixi_lock(url: &str, sha256: &str) -> String {
    format!(
        "version: 6\nenvironments:\n  default:\n    channels:\n    - url: https://conda.anaconda.org/conda-forge/\n    packages:\n      linux-64:\n      - conda: {url}\npackages:\n- conda: {url}\n  subdir: noarch\n  sha256: {sha256}\n  md5: 0c96522c6bdaed4b1566d11387caaf45\n  depends: []\n"
    )
}

const GOOD_URL: &str =
    "https://conda.anaconda.org/conda-forge/noarch/tzdata-2024a-h0c530f3_0.conda";
const SHA: &str = "8b7aa6b8d3ac8b1e5a2c5be3a6ae2eb1e5a8ffbc5f9c3e2b3a3f1d6d6b5d3b1e";

/// `init --from NAME` with `bytes` as the file: refused, naming the file and `needles`.
#[track_caller]
fn refused(name: &str, bytes: &[u8], needles: &[&str]) {
    let project = Project::new();
    fs_err::write(project.path().join(name), bytes).unwrap();
    let run = project.run(&["init", "--from", name, "-o", "app.toml"]);
    let mut all = vec![name];
    all.extend_from_slice(needles);
    run.assert_failure_naming(1, &all);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(!project.path().join("app.toml").exists());
    assert!(!project.path().join("app.lock").exists());
}

#[test]
fn a_good_small_pixi_lock_imports() {
    // The baseline the hostile cases below are edits of.
    let project = Project::new();
    fs_err::write(project.path().join("pixi.lock"), pixi_lock(GOOD_URL, SHA)).unwrap();
    project
        .run(&["init", "--from", "pixi.lock", "-o", "app.toml"])
        .success();
    let lock = fs_err::read_to_string(project.path().join("app.lock")).unwrap();
    assert!(lock.contains(GOOD_URL) && lock.contains(SHA), "{lock}");
}

#[test]
fn hostile_pixi_locks_are_refused() {
    refused("pixi.lock", &[0xff, 0xfe, b'v', 0x80], &["Failed to read"]);
    // Aliases that expand a billion times, and nesting far past any lock's.
    let mut bomb = String::from("version: 6\na: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..9 {
        let prev = if i == 0 {
            "a".to_string()
        } else {
            format!("b{}", i - 1)
        };
        bomb.push_str(&format!(
            "b{i}: &b{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
        ));
    }
    refused("pixi.lock", bomb.as_bytes(), &["not a lock file"]);
    let deep = format!(
        "version: 6\nx: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    refused("pixi.lock", deep.as_bytes(), &["not a lock file"]);
    // A sha256 that is not hex.
    refused(
        "pixi.lock",
        pixi_lock(GOOD_URL, &"zz".repeat(32)).as_bytes(),
        &["not a lock file"],
    );
    // A URL outside the lock's own channels, and a path that climbs out of its directory.
    refused(
        "pixi.lock",
        pixi_lock(
            "https://evil.example/noarch/tzdata-2024a-h0c530f3_0.conda",
            SHA,
        )
        .as_bytes(),
        &["evil.example", "not under"],
    );
    refused(
        "pixi.lock",
        pixi_lock("file:///etc/noarch/tzdata-2024a-h0c530f3_0.conda", SHA).as_bytes(),
        &["file:///etc/", "not under"],
    );
    // One package pinned twice for one platform.
    let twice = pixi_lock(GOOD_URL, SHA).replace(
        &format!("      - conda: {GOOD_URL}\n"),
        &format!(
            "      - conda: {GOOD_URL}\n      - conda: {}\n",
            GOOD_URL.replace("h0c530f3_0", "h0c530f3_1")
        ),
    ) + &format!(
        "- conda: {}\n  sha256: {SHA}\n  depends: []\n",
        GOOD_URL.replace("h0c530f3_0", "h0c530f3_1")
    );
    refused("pixi.lock", twice.as_bytes(), &["`tzdata` twice"]);
    // A lock with only other systems' platforms.
    let mac =
        pixi_lock(&GOOD_URL.replace("noarch", "osx-arm64"), SHA).replace("linux-64:", "osx-arm64:");
    refused("pixi.lock", mac.as_bytes(), &["no Linux platform"]);
}

#[test]
fn a_lock_over_the_bound_is_refused_unread() {
    let project = Project::new();
    let file = fs_err::File::create(project.path().join("pixi.lock")).unwrap();
    file.set_len(65 << 20).unwrap();
    let run = project.run(&["init", "--from", "pixi.lock", "-o", "app.toml"]);
    run.assert_failure_naming(1, &["pixi.lock", "Failed to read"]);
    assert!(!project.path().join("app.lock").exists());
}

#[test]
fn hostile_explicit_files_are_refused() {
    let line = "https://conda.anaconda.org/conda-forge/linux-64/zlib-1.3.1-hb9d3cd8_2.conda";
    let file = |body: &str| format!("# platform: linux-64\n@EXPLICIT\n{body}\n");
    refused(
        "conda-linux-64.lock",
        file(&format!("{line}#sha256:{}", "g".repeat(64))).as_bytes(),
        &["not a hex md5"],
    );
    refused(
        "conda-linux-64.lock",
        file(line).as_bytes(),
        &["has no digest"],
    );
    refused(
        "conda-linux-64.lock",
        file(&format!(
            "{line}#{}\n{line}#{}",
            "a".repeat(32),
            "b".repeat(32)
        ))
        .as_bytes(),
        &["`zlib` twice"],
    );
    refused(
        "conda-linux-64.lock",
        file(&format!(
            "https://conda.anaconda.org/conda-forge/linux-64/not-a-package#{}",
            "a".repeat(32)
        ))
        .as_bytes(),
        &["does not name a conda package"],
    );
}

#[test]
fn an_import_needs_a_recipe_path_that_is_not_its_lock() {
    let project = Project::new();
    fs_err::write(project.path().join("pixi.lock"), pixi_lock(GOOD_URL, SHA)).unwrap();
    project
        .run(&["init", "--from", "pixi.lock"])
        .assert_failure_naming(1, &["pixi.lock", "-o FILE.toml"]);
    project
        .run(&["init", "--from", "pixi.lock", "-o", "pixi.lock"])
        .assert_failure_naming(1, &["its own lock"]);
    // `-o x.toml` with an x.lock already there: neither is written.
    fs_err::write(project.path().join("x.lock"), "mine").unwrap();
    project
        .run(&["init", "--from", "pixi.lock", "-o", "x.toml"])
        .assert_failure_naming(1, &["x.lock", "already exists"]);
    assert!(!project.path().join("x.toml").exists());
    assert_eq!(
        fs_err::read_to_string(project.path().join("x.lock")).unwrap(),
        "mine"
    );
}
