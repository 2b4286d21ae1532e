//! `imgbuild notebook` (issue 29): a real notebook runs headless in the JupyterLab image
//! under podman, as the image's user, with the image's own nbclient; its statement validates
//! with the in-toto project's package; `--verify` passes on a second run, whatever a cell
//! tagged `imgbuild:volatile` printed, and fails naming the cell after one `[[files]]` input
//! of the image changes. The hostile inputs (notebook and statement) go through the real
//! CLI and fail before anything runs.

use std::path::Path;

use serde_json::Value;

use crate::{
    common::{
        IN_TOTO_STATEMENT_CHECK, LayoutView, Project, Run, require_root, subject_digest,
        venv_python_check,
    },
    support::{
        channel::tiny_recipe,
        jupyter,
        podman::{Podman, Storage},
        shared_channel,
    },
};

const NOTEBOOKS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/notebooks");

/// The image file the `reads-params` cell prints, as a `[[files]]` entry, and the recipe's
/// check of the round-trip notebook against the statement of its first run.
const FILES: &str = r#"
[[files]]
src = "data/params.txt"
dest = "/opt/data/params.txt"

[[checks]]
notebook = "checks/roundtrip.ipynb"
expect = "checks/roundtrip.intoto.json"
"#;

/// `imgbuild notebook ARGS` with podman's settings pointing at `podman`'s storage.
fn notebook(project: &Project, podman: Option<&Podman>, args: &[&str]) -> Run {
    let mut command = project.command(&[&["notebook"], args].concat());
    if let Some(podman) = podman {
        command.envs(podman.env());
    }
    let output = command.output().expect("running imgbuild");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs_err::read(path).unwrap()).unwrap()
}

/// Validates the statement at `file` with `in_toto_attestation`: `valid TYPE HEX`.
#[track_caller]
fn validate_with_in_toto(file: &Path) -> String {
    venv_python_check(IN_TOTO_STATEMENT_CHECK, file)
}

/// `notebook images/nb notebooks/NAME.ipynb --verify notebooks/NAME.intoto.json`.
fn verify(project: &Project, podman: &Podman, name: &str) -> Run {
    let notebook_file = format!("notebooks/{name}.ipynb");
    let statement = format!("notebooks/{name}.intoto.json");
    let args = ["images/nb", &notebook_file, "--verify", &statement];
    notebook(project, Some(podman), &args)
}

/// Panics with `run`'s output unless it exited 0.
#[track_caller]
fn succeeded(run: &Run) {
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
}

/// Builds the JupyterLab image with `/opt/data/params.txt` holding `params`.
fn build_with_params(project: &Project, params: &str) -> String {
    fs_err::create_dir_all(project.path().join("recipes/data")).unwrap();
    fs_err::write(project.path().join("recipes/data/params.txt"), params).unwrap();
    project.write_recipe(&jupyter::recipe("nb", FILES));
    project.build(&[]).success();
    LayoutView::new(project.path().join("images/nb")).manifest_digest()
}

#[test]
fn a_notebook_round_trip_verifies_and_fails_on_a_changed_image_file() {
    require_root!("podman's rootful runs need root here");
    let project = Project::new();
    jupyter::prepare(&project);
    let first_digest = build_with_params(&project, "alpha = 1\n");
    let notebooks = project.path().join("notebooks");
    fs_err::create_dir_all(&notebooks).unwrap();
    for name in ["roundtrip.ipynb", "Factorials.ipynb"] {
        fs_err::copy(Path::new(NOTEBOOKS).join(name), notebooks.join(name)).unwrap();
    }
    let podman = Podman::new(
        &project.path().join("podman"),
        Storage::Overlay {
            partial_pulls: false,
        },
    )
    .unwrap();

    let run = notebook(
        &project,
        Some(&podman),
        &["images/nb", "notebooks/roundtrip.ipynb"],
    );
    succeeded(&run);
    let statement_path = notebooks.join("roundtrip.intoto.json");
    let valid = validate_with_in_toto(&statement_path);
    assert!(
        valid.starts_with("valid https://imgbuild.dev/attestations/notebook-run/v1"),
        "{valid}"
    );
    let statement = read_json(&statement_path);
    assert_eq!(subject_digest(&statement), first_digest);
    let predicate = &statement["predicate"];
    assert_eq!(predicate["exit"]["status"], "ok", "{predicate}");
    assert_eq!(predicate["kernel"]["name"], "python3", "{predicate}");
    assert_eq!(
        predicate["kernel"]["language_version"], "3.9.2",
        "{predicate}"
    );
    let cells = predicate["cells"].as_array().unwrap();
    let ids: Vec<&str> = cells.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["seed", "fibonacci", "reads-params", "clock"]);
    assert_eq!(cells[2]["text"], "alpha = 1\n");
    assert_eq!(cells[3]["volatile"], true);
    assert!(cells[1]["text"].as_str().unwrap().ends_with("89\n144\n"));
    // The executed notebook holds what ran, in the image's user's kernel.
    let executed = read_json(&notebooks.join("roundtrip.executed.ipynb"));
    assert_eq!(
        executed["cells"][2]["outputs"][0]["text"],
        serde_json::json!(["alpha = 1\n"]),
        "{executed}"
    );

    // The same image again: every cell but the volatile one matches.
    let again = verify(&project, &podman, "roundtrip");
    succeeded(&again);
    assert!(
        again.stdout.contains("verified: 3 cells match"),
        "{}",
        again.stdout
    );
    let second = read_json(&notebooks.join("roundtrip.verify.intoto.json"));
    // The volatile cell did print something else: the comparison left it out.
    assert_ne!(
        second["predicate"]["cells"][3]["sha256"],
        cells[3]["sha256"]
    );

    // The recipe's `[[checks]]` entry: the same notebook against the first run's statement.
    let checks = project.path().join("recipes/checks");
    fs_err::create_dir_all(&checks).unwrap();
    fs_err::copy(
        notebooks.join("roundtrip.ipynb"),
        checks.join("roundtrip.ipynb"),
    )
    .unwrap();
    fs_err::copy(&statement_path, checks.join("roundtrip.intoto.json")).unwrap();
    let checked = notebook(&project, Some(&podman), &["--recipe", "recipes/image.toml"]);
    succeeded(&checked);
    assert!(
        checked.stdout.contains("verified: 3 cells match"),
        "{}",
        checked.stdout
    );
    let written = project
        .path()
        .join("images/nb.checks/roundtrip.intoto.json");
    assert_eq!(subject_digest(&read_json(&written)), first_digest);

    // nbclient's own notebook, as published, on the same image.
    let factorials = notebook(
        &project,
        Some(&podman),
        &["images/nb", "notebooks/Factorials.ipynb"],
    );
    succeeded(&factorials);
    validate_with_in_toto(&notebooks.join("Factorials.intoto.json"));

    // One input file of the image changes: the cell that prints it is named.
    let changed_digest = build_with_params(&project, "alpha = 2\n");
    assert_ne!(changed_digest, first_digest);
    let changed = verify(&project, &podman, "roundtrip");
    changed.assert_clean_failure(4);
    for line in [
        "cell 2 (id `reads-params`) differs from the earlier run:",
        "- alpha = 1\n+ alpha = 2",
    ] {
        assert!(changed.stderr.contains(line), "{}", changed.stderr);
    }
    // The recipe's check fails the same way, naming the notebook and the cell.
    let checked = notebook(&project, Some(&podman), &["--recipe", "recipes/image.toml"]);
    checked.assert_failure_naming(4, &["checks/roundtrip.ipynb", "cell 2 (id `reads-params`)"]);
    // Factorials does not read the file: it verifies on the changed image.
    let factorials = verify(&project, &podman, "Factorials");
    succeeded(&factorials);
    evidence(project.path(), &run, &changed, &statement_path);
}

/// What the round trip showed, for `docs/evidence/notebook-roundtrip.txt` (printed with
/// `--nocapture`).
fn evidence(dir: &Path, run: &Run, changed: &Run, statement: &Path) {
    let text = format!(
        "$ imgbuild notebook images/nb notebooks/roundtrip.ipynb\n{}{}exit 0\n\n\
         $ cat notebooks/roundtrip.intoto.json\n{}\n\
         (after params.txt changed and the image was rebuilt)\n\
         $ imgbuild notebook images/nb notebooks/roundtrip.ipynb --verify notebooks/roundtrip.intoto.json\n{}{}exit {}\n",
        run.stderr,
        run.stdout,
        fs_err::read_to_string(statement).unwrap(),
        changed.stderr,
        changed.stdout,
        changed.code
    );
    fs_err::write(dir.join("notebook-transcript.txt"), &text).unwrap();
    eprintln!("{text}");
}

/// A notebook of one code cell.
fn one_cell(id: &str) -> String {
    serde_json::json!({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [{"cell_type": "code", "id": id, "metadata": {}, "outputs": [],
                   "execution_count": null, "source": "print(1)"}]
    })
    .to_string()
}

/// A small image whose user is root (no `user` in its recipe).
fn root_image(project: &Project) {
    project.write_recipe(&tiny_recipe(shared_channel(), "rootimg", &["hello"]));
    project.build(&[]).success();
}

#[test]
fn hostile_notebooks_and_statements_are_refused_before_anything_runs() {
    let project = Project::new();
    let dir = project.path();
    let write = |name: &str, bytes: &[u8]| fs_err::write(dir.join(name), bytes).unwrap();
    write("text.ipynb", b"this is not { JSON");
    write(
        "v3.ipynb",
        br#"{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}"#,
    );
    write("ok.ipynb", one_cell("a").as_bytes());
    write("other.ipynb", one_cell("b").as_bytes());
    let big = fs_err::File::create(dir.join("big.ipynb")).unwrap();
    big.set_len(17 << 20).unwrap();
    let fifo = dir.join("fifo.ipynb");
    crate::common::run_tool("mkfifo", &[fifo.to_str().unwrap()]);
    for (notebook_file, expected) in [
        ("text.ipynb", "is not JSON"),
        ("v3.ipynb", "`nbformat` is 3, not 4"),
        ("big.ipynb", "at most 16777216 are read"),
        ("fifo.ipynb", "not a regular file"),
        ("missing.ipynb", "Cannot read the notebook `missing.ipynb`"),
    ] {
        let run = notebook(&project, None, &["images/none", notebook_file]);
        run.assert_clean_failure(1);
        assert!(
            run.stderr.contains(expected),
            "{notebook_file}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("podman"), "{}", run.stderr);
    }

    // Statements: not in-toto, in-toto of another kind, of another notebook.
    let sha = |name: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(fs_err::read(dir.join(name)).unwrap()))
    };
    let statement = |sha256: &str, kind: &str| {
        serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "x", "digest": {"sha256": "ab".repeat(32)}}],
            "predicateType": kind,
            "predicate": {"notebook": {"name": "other.ipynb", "sha256": sha256, "nbformat": "4.5"},
                          "kernel": {"name": "python3", "language": "python", "language_version": "3"},
                          "cells": [], "exit": {"status": "ok"}, "runner": "podman", "imgbuild": "0"}
        })
        .to_string()
    };
    let notebook_run = "https://imgbuild.dev/attestations/notebook-run/v1";
    write("plain.json", br#"{"cells": []}"#);
    write(
        "slsa.json",
        statement(&sha("ok.ipynb"), "https://slsa.dev/provenance/v1").as_bytes(),
    );
    write(
        "other.json",
        statement(&sha("other.ipynb"), notebook_run).as_bytes(),
    );
    write("notjson.json", b"\x00\x01");
    for (file, expected) in [
        (
            "plain.json",
            "is not an in-toto statement of a notebook run: its `_type` is null",
        ),
        (
            "slsa.json",
            "its `predicateType` is \"https://slsa.dev/provenance/v1\"",
        ),
        ("notjson.json", "not JSON"),
        ("other.json", "--verify compares runs of one notebook"),
        ("big.ipynb", "at most 4194304 are read"),
    ] {
        let run = notebook(
            &project,
            None,
            &["images/none", "ok.ipynb", "--verify", file],
        );
        run.assert_clean_failure(1);
        assert!(run.stderr.contains(expected), "{file}: {}", run.stderr);
    }

    // An image whose user is root is refused, naming the override; so is `--user 0`.
    root_image(&project);
    let run = notebook(&project, None, &["images/rootimg", "ok.ipynb"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr
            .contains("runs as root (its config's User is empty)")
            && run.stderr.contains("--user UID[:GID]"),
        "{}",
        run.stderr
    );
    let run = notebook(
        &project,
        None,
        &["images/rootimg", "ok.ipynb", "--user", "0:0"],
    );
    run.assert_clean_failure(1);
    assert!(run.stderr.contains("`--user` is `0:0`"), "{}", run.stderr);
    assert!(!dir.join("ok.executed.ipynb").exists() && !dir.join("ok.intoto.json").exists());
}

/// Without podman on `PATH`, the notebook runs under runc, in a bundle umoci unpacked from
/// the layout, and prints what it prints under podman.
#[test]
fn without_podman_a_notebook_runs_under_runc() {
    require_root!("runc's rootful runs need root here");
    let project = Project::new();
    jupyter::build_image(&project, "nb", "");
    let notebooks = project.path().join("notebooks");
    fs_err::create_dir_all(&notebooks).unwrap();
    for name in ["Factorials.ipynb", "Error.ipynb"] {
        fs_err::copy(Path::new(NOTEBOOKS).join(name), notebooks.join(name)).unwrap();
    }
    // A PATH with runc and umoci but no podman.
    let bin = project.path().join("bin");
    fs_err::create_dir_all(&bin).unwrap();
    for tool in ["runc", "umoci"] {
        let path = crate::common::run_tool("sh", &["-c", &format!("command -v {tool}")]);
        std::os::unix::fs::symlink(path.trim(), bin.join(tool)).unwrap();
    }
    let runc = |args: &[&str]| {
        let output = project
            .command(&[&["notebook", "images/nb"], args].concat())
            .env("PATH", &bin)
            .output()
            .unwrap();
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    };
    succeeded(&runc(&["notebooks/Factorials.ipynb"]));
    let statement = read_json(&notebooks.join("Factorials.intoto.json"));
    let predicate = &statement["predicate"];
    assert_eq!(predicate["runner"], "runc", "{predicate}");
    assert_eq!(predicate["kernel"]["language_version"], "3.9.2");
    // The same outputs, to the byte, as under podman (docs/evidence/notebook-roundtrip.txt).
    assert_eq!(
        predicate["cells"][1]["sha256"],
        "94640108a7682c4b4c0874aac637da6e67b8d03f59a2ca8c455fa383b562b286"
    );

    // nbclient's Error.ipynb: the failing cell is named, and still attested (exit 3).
    let error = runc(&["notebooks/Error.ipynb"]);
    error.assert_clean_failure(3);
    assert!(
        error
            .stderr
            .contains("cell 0 (id `d200673b`) raised ZeroDivisionError"),
        "{}",
        error.stderr
    );
    let failed = read_json(&notebooks.join("Error.intoto.json"));
    assert_eq!(
        failed["predicate"]["exit"],
        serde_json::json!({"status": "failed", "index": 0, "id": "d200673b", "error": "ZeroDivisionError"})
    );
    // A result past --max-output stops the run and leaves no container behind.
    let bounded = runc(&["notebooks/Factorials.ipynb", "--max-output", "1000"]);
    bounded.assert_clean_failure(1);
    assert!(
        bounded.stderr.contains("more than 1000 bytes"),
        "{}",
        bounded.stderr
    );
    let left = crate::common::run_tool("runc", &["list", "-q"]);
    assert!(!left.contains("imgbuild-notebook-"), "{left}");
}

#[test]
fn recipe_checks_are_read_beneath_the_recipe_only() {
    let canary = crate::trust::Canary::new();
    let project = Project::new();
    let recipe = |checks: &str| tiny_recipe(shared_channel(), "nb", &["hello 1.0"]) + checks;
    // A path out of the recipe's directory is refused where the recipe says it.
    for path in ["../notebooks/a.ipynb", "/etc/passwd"] {
        project.write_recipe(&recipe(&format!("\n[[checks]]\nnotebook = \"{path}\"\n")));
        let run = notebook(&project, None, &["--recipe", "recipes/image.toml"]);
        run.assert_failure_naming(
            1,
            &["`notebook` must be a file beneath the recipe's directory"],
        );
    }
    // A link in it that leads out (to the canary's secret) is never followed.
    std::os::unix::fs::symlink(canary.file(), project.path().join("recipes/link.ipynb")).unwrap();
    project.write_recipe(&recipe("\n[[checks]]\nnotebook = \"link.ipynb\"\n"));
    let run = notebook(&project, None, &["--recipe", "recipes/image.toml"]);
    run.assert_failure_naming(1, &["Cannot read the notebook", "link.ipynb"]);
    assert!(!run.stderr.contains(&canary.secret), "{}", run.stderr);
    canary.assert_untouched();
    // A recipe without checks says so.
    project.write_recipe(&recipe(""));
    let run = notebook(&project, None, &["--recipe", "recipes/image.toml"]);
    run.assert_failure_naming(1, &["has no `[[checks]]`"]);
}
