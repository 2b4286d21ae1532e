//! Issue 26, the operator's files: signing keys, passphrase files, registries.d files,
//! signatures already in a lookaside area, registry auth files and the password on stdin
//! are read as regular files (a fifo or a device is refused, never waited on or read
//! forever) and bounded (keys and registries.d files 1 MiB, passphrases and passwords 64
//! KiB, auth files 4 MiB); `verify --provenance` reads only the lock the user names, never
//! the path the provenance records.
//!
//! Every run is under a 4 GiB address-space limit, so an unbounded read of a 5 GiB file or
//! of endless stdin fails the test instead of taking the machine's memory, and under a
//! deadline, so a hang fails the test too.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    common::{LayoutView, Project, Run, run_with_deadline},
    registry::{Auth, Registry},
    signing::Gpg,
    support::{channel::tiny_recipe, imgbuild_bin, shared_channel},
    trust::{Canary, Tree},
};

/// imgbuild `args` in `project` with `envs` (after a Docker config and auth file of the
/// project's own, so the host's are never read), stdin from `IMGBUILD_TEST_STDIN` when
/// `envs` sets it, under the limits above.
fn imgbuild(project: &Project, args: &[&str], envs: &[(&str, &Path)]) -> Run {
    let script = r#"ulimit -v 4194304 && if [ -n "$IMGBUILD_TEST_STDIN" ]; then exec "$0" "$@" < "$IMGBUILD_TEST_STDIN"; else exec "$0" "$@"; fi"#;
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .arg(imgbuild_bin())
        .args(args)
        .env("IMGBUILD_CACHE_DIR", &project.cache)
        .env("HOME", project.path())
        .env("XDG_RUNTIME_DIR", project.path())
        .env("DOCKER_CONFIG", project.path().join("docker"))
        .env(
            "REGISTRY_AUTH_FILE",
            project.path().join("docker/auth.json"),
        )
        .env_remove("IMGBUILD_TEST_STDIN");
    for (key, value) in envs {
        command.env(key, value);
    }
    run_with_deadline(command, project, args)
}

/// Replaces `path` with a fifo nobody writes to.
fn fifo(path: &Path) -> PathBuf {
    let _ = fs_err::remove_file(path);
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
    path.to_path_buf()
}

/// A sparse file of 5 GiB at `path`.
fn huge(path: &Path) -> PathBuf {
    let status = Command::new("truncate")
        .args(["-s", "5G"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "truncate {}", path.display());
    path.to_path_buf()
}

/// `imgbuild sign` of an image nobody serves: every file it reads is read before the
/// registry is asked.
fn sign(project: &Project, extra: &[&str]) -> Run {
    let mut args = vec!["sign", "127.0.0.1:9/ml/app:v1", "--insecure"];
    args.extend_from_slice(extra);
    imgbuild(project, &args, &[])
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A refusal naming `needles`, with the canary as it was and its secret nowhere.
#[track_caller]
fn refused(run: &Run, canary: &Canary, code: i32, needles: &[&str]) {
    run.assert_failure_naming(code, needles);
    assert!(!run.stderr.contains(&canary.secret), "{}", run.stderr);
    canary.assert_untouched();
}

#[test]
fn a_signing_key_that_is_a_fifo() {
    let (project, canary) = (Project::new(), Canary::new());
    let key = fifo(&project.path().join("key.asc"));
    let run = sign(&project, &["--sign-by", path(&key)]);
    refused(
        &run,
        &canary,
        1,
        &["key.asc", "is a fifo, not a regular file"],
    );
}

#[test]
fn a_signing_key_that_is_dev_zero() {
    let (project, canary) = (Project::new(), Canary::new());
    let run = sign(&project, &["--sign-by", "/dev/zero"]);
    refused(&run, &canary, 1, &["`/dev/zero`", "is a character device"]);
}

#[test]
fn a_signing_key_of_5_gib() {
    let (project, canary) = (Project::new(), Canary::new());
    let key = huge(&project.path().join("key.asc"));
    let run = sign(&project, &["--sign-by", path(&key)]);
    refused(
        &run,
        &canary,
        1,
        &["key.asc", "has 5368709120 bytes; at most 1048576 are read"],
    );
}

#[test]
fn a_signing_key_that_links_to_the_canary_is_not_a_key_and_not_shown() {
    let (project, canary) = (Project::new(), Canary::new());
    let key = project.path().join("key.asc");
    std::os::unix::fs::symlink(canary.file(), &key).unwrap();
    let run = sign(&project, &["--sign-by", path(&key)]);
    refused(
        &run,
        &canary,
        1,
        &["key.asc", "is not an OpenPGP secret key"],
    );
}

#[test]
fn a_passphrase_file_that_is_a_fifo() {
    let (project, canary) = (Project::new(), Canary::new());
    let file = fifo(&project.path().join("passphrase"));
    let run = sign(
        &project,
        &[
            "--sign-by",
            "key.asc",
            "--sign-passphrase-file",
            path(&file),
        ],
    );
    refused(
        &run,
        &canary,
        1,
        &["passphrase", "is a fifo, not a regular file"],
    );
}

#[test]
fn a_passphrase_file_of_5_gib() {
    let (project, canary) = (Project::new(), Canary::new());
    let file = huge(&project.path().join("passphrase"));
    let run = sign(
        &project,
        &[
            "--sign-by",
            "key.asc",
            "--sign-passphrase-file",
            path(&file),
        ],
    );
    refused(&run, &canary, 1, &["passphrase", "at most 65536 are read"]);
}

/// A project with a usable key, and a registries.d directory whose `a.yaml` is made by
/// `spoil`: the key loads and signs, then registries.d is read.
fn registries_d_case(spoil: impl FnOnce(&Path)) -> (Project, Canary, Run) {
    let (project, canary) = (Project::new(), Canary::new());
    let key = Gpg::new(project.path(), "operator").secret_key(&project.path().join("key.asc"));
    let dir = project.path().join("registries.d");
    fs_err::create_dir_all(&dir).unwrap();
    spoil(&dir.join("a.yaml"));
    let run = sign(
        &project,
        &["--sign-by", path(&key), "--registries.d", path(&dir)],
    );
    (project, canary, run)
}

#[test]
fn a_registries_d_file_that_is_a_fifo() {
    let (_project, canary, run) = registries_d_case(|file| {
        fifo(file);
    });
    refused(
        &run,
        &canary,
        1,
        &["a.yaml", "is a fifo, not a regular file"],
    );
}

#[test]
fn a_registries_d_file_of_5_gib() {
    let (_project, canary, run) = registries_d_case(|file| {
        huge(file);
    });
    refused(&run, &canary, 1, &["a.yaml", "at most 1048576 are read"]);
}

/// A built image `app` (hello) with its tree.
fn built() -> (Project, Tree) {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "app", &["hello 1.0"]));
    project.build(&[]).success();
    let tree = Tree::of(&project.path().join("images"));
    (project, tree)
}

#[test]
fn a_registry_auth_file_that_is_a_fifo() {
    let ((project, images), canary) = (built(), Canary::new());
    let auth = fifo(&project.path().join("auth.json"));
    let args = ["push", "images/app", "127.0.0.1:9/ml/app:v1", "--insecure"];
    let run = imgbuild(&project, &args, &[("REGISTRY_AUTH_FILE", &auth)]);
    refused(
        &run,
        &canary,
        1,
        &["auth.json", "is a fifo, not a regular file"],
    );
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

#[test]
fn a_docker_config_of_5_gib() {
    let ((project, images), canary) = (built(), Canary::new());
    let docker = project.path().join("docker");
    fs_err::create_dir_all(&docker).unwrap();
    huge(&docker.join("config.json"));
    let args = ["push", "images/app", "127.0.0.1:9/ml/app:v1", "--insecure"];
    let run = imgbuild(&project, &args, &[]);
    refused(
        &run,
        &canary,
        1,
        &["config.json", "at most 4194304 are read"],
    );
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

#[test]
fn an_endless_password_on_stdin() {
    let (project, canary) = (Project::new(), Canary::new());
    let args = [
        "login",
        "127.0.0.1:9",
        "-u",
        "ci",
        "--password-stdin",
        "--insecure",
    ];
    let run = imgbuild(
        &project,
        &args,
        &[("IMGBUILD_TEST_STDIN", Path::new("/dev/zero"))],
    );
    refused(&run, &canary, 1, &["password on stdin", "at most 65536"]);
    assert!(!project.path().join("docker/auth.json").exists());
}

/// Pushes and signs `images/app` to a registry, with `signature-1` of the image's lookaside
/// directory made by `plant` first. Returns the run and that directory.
fn push_signed_over(plant: impl FnOnce(&Path)) -> (Project, Tree, Canary, Run, PathBuf) {
    let registry = Registry::start(Auth::None);
    let ((project, images), canary) = (built(), Canary::new());
    let key = Gpg::new(project.path(), "operator").secret_key(&project.path().join("key.asc"));
    let registries_d = project.path().join("registries.d");
    fs_err::create_dir_all(&registries_d).unwrap();
    let sigs = project.path().join("sigs");
    fs_err::write(
        registries_d.join("a.yaml"),
        format!(
            "default-docker:\n  lookaside-staging: file://{}\n",
            sigs.display()
        ),
    )
    .unwrap();
    let digest = LayoutView::new(project.path().join("images/app")).manifest_digest();
    let dir = sigs.join(format!(
        "ml/app@sha256={}",
        digest.trim_start_matches("sha256:")
    ));
    fs_err::create_dir_all(&dir).unwrap();
    plant(&dir.join("signature-1"));
    let reference = format!("{}/ml/app:v1", registry.host);
    let args = [
        "push",
        "images/app",
        &reference,
        "--insecure",
        "--sign-by",
        path(&key),
        "--registries.d",
        path(&registries_d),
    ];
    let run = imgbuild(&project, &args, &[]);
    (project, images, canary, run, dir)
}

#[test]
fn a_lookaside_signature_that_is_a_fifo() {
    let (project, images, canary, run, dir) = push_signed_over(|file| {
        fifo(file);
    });
    refused(
        &run,
        &canary,
        1,
        &["was pushed but not signed", "signature-1", "is a fifo"],
    );
    assert!(!dir.join("signature-2").exists());
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

#[test]
fn a_lookaside_signature_of_5_gib_is_another_signature() {
    let (project, images, canary, run, dir) = push_signed_over(|file| {
        huge(file);
    });
    let run = run.success();
    assert!(run.stderr.contains("signature-2"), "{}", run.stderr);
    assert!(dir.join("signature-2").is_file());
    assert_eq!(
        fs_err::metadata(dir.join("signature-1")).unwrap().len(),
        5 << 30
    );
    canary.assert_untouched();
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

/// A built image `app` and its provenance with the lock path it records set to `lock`,
/// written to `edited.json`.
fn provenance_naming(lock: impl FnOnce(&Project) -> PathBuf) -> (Project, Tree) {
    let (project, images) = built();
    let mut statement: Value = serde_json::from_str(
        &fs_err::read_to_string(project.path().join("images/app.provenance.json")).unwrap(),
    )
    .unwrap();
    let named = lock(&project);
    statement["predicate"]["buildDefinition"]["externalParameters"]["lock"]["path"] =
        Value::from(named.to_str().unwrap());
    fs_err::write(
        project.path().join("edited.json"),
        serde_json::to_string_pretty(&statement).unwrap(),
    )
    .unwrap();
    (project, images)
}

#[test]
fn verify_never_hashes_the_lock_a_provenance_names() {
    let canary = Canary::new();
    let (project, images) = provenance_naming(|_| canary.file());
    let secret_digest = hex::encode(Sha256::digest(fs_err::read(canary.file()).unwrap()));
    // Without a lock named by the user, nothing is read: the flags say what to name.
    let run = imgbuild(
        &project,
        &["verify", "images/app", "--provenance", "edited.json"],
        &[],
    );
    refused(&run, &canary, 2, &["--lock"]);
    assert!(!run.stderr.contains(&secret_digest), "{}", run.stderr);
    // With the lock named, the provenance's path is only a record.
    for extra in [
        ["--lock", "recipes/image.lock"],
        ["--recipe", "recipes/image.toml"],
    ] {
        let mut args = vec!["verify", "images/app", "--provenance", "edited.json"];
        args.extend(extra);
        let run = imgbuild(&project, &args, &[]).success();
        assert!(!run.stderr.contains(&secret_digest), "{}", run.stderr);
        assert!(!run.stdout.contains(&secret_digest), "{}", run.stdout);
    }
    canary.assert_untouched();
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

#[test]
fn verify_never_opens_a_fifo_a_provenance_names_as_its_lock() {
    let (project, images) = provenance_naming(|project| fifo(&project.path().join("lock.fifo")));
    let args = [
        "verify",
        "images/app",
        "--provenance",
        "edited.json",
        "--lock",
        "recipes/image.lock",
    ];
    let run = imgbuild(&project, &args, &[]).success();
    assert!(!run.stderr.contains("fifo"), "{}", run.stderr);
    // A lock the user names that is a fifo is refused, naming it.
    let run = imgbuild(
        &project,
        &[
            "verify",
            "images/app",
            "--provenance",
            "edited.json",
            "--lock",
            "lock.fifo",
        ],
        &[],
    );
    run.assert_failure_naming(1, &["lock.fifo", "is a fifo, not a regular file"]);
    assert_eq!(Tree::of(&project.path().join("images")), images);
}
