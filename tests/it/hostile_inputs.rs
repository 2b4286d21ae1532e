//! Issue 15 (security), recipe and lock inputs trusted too far. Every case runs the real CLI
//! against channels written here (no network) and must fail with exit 1 and a message that
//! names the culprit, never panic, and write no image:
//!
//! - a lock pinning a conda package outside the recipe's channels (a sibling directory whose
//!   name starts like the channel's, or outside a channel reached through the channel alias),
//!   or a wheel outside the recipe's `[pypi]` find-links, is refused by a plain build that
//!   would reuse it, by `build --locked` and by `verify --recipe`; the same locks untampered
//!   build, so each refusal is the tampering's;
//! - a recipe path that is not a regular file (`/dev/zero`, a fifo, a directory) or is over
//!   1 MiB is refused before it is read;
//! - `SOURCE_DATE_EPOCH` outside 0..253402300799 is refused naming the variable.
//!
//! Recipe values that make broken images (env keys, control and bidirectional characters,
//! users, empty entrypoint elements, `..` in workdir, duplicate tags) are refused at their
//! line and column: their caret snapshots are in `error_messages.rs`, every rule's unit test
//! in `crates/imgbuild-recipe/src/recipe/load.rs`.

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use base64::Engine;
use serde_json::json;

use crate::{
    common::{Project, Run},
    support::hostile::{Channel, Package, Raw, index_json, json_bytes, sha256_hex},
};

/// The channels and wheel directories of this test process: `chan/` (the package `good`
/// and a stand-in `python` 3.9), `chan-evil/` (another `good`, whose file says `evil`),
/// `wheels/` and `wheels-evil/` (a `demo` 1.0 wheel each, different bytes).
pub(crate) struct Sources {
    pub(crate) root: PathBuf,
}

impl Sources {
    pub(crate) fn url(&self, name: &str) -> String {
        url::Url::from_directory_path(self.root.join(name))
            .unwrap()
            .to_string()
    }

    fn good(&self, channel: &str) -> Vec<u8> {
        fs_err::read(
            self.root
                .join(channel)
                .join("linux-64/good-1.0-h0_0.tar.bz2"),
        )
        .unwrap()
    }
}

pub(crate) fn sources() -> &'static Sources {
    static SOURCES: OnceLock<Sources> = OnceLock::new();
    SOURCES.get_or_init(|| {
        let root = crate::support::kept_channel_dir("in", |root| {
            write_channel(&root.join("chan"), "fine\n");
            write_channel(&root.join("chan-evil"), "evil\n");
            write_wheel(&root.join("wheels"), "fine");
            write_wheel(&root.join("wheels-evil"), "evil");
            Ok(())
        });
        Sources { root }
    })
}

fn write_channel(dir: &Path, text: &str) {
    let mut channel = Channel::new(dir);
    let good = Package::new("good", &[], false, vec![Raw::file("share/ok.txt", text)]);
    channel.add(
        "good-1.0-h0_0.tar.bz2",
        &index_json("good", &[], false),
        &good.tar_bz2(),
        |_| {},
    );
    // Enough of a Python for the PyPI resolver (it reads the version) and the wheel
    // installer (it writes into lib/python3.9/site-packages); nothing runs it.
    let mut index = index_json("python", &[], false);
    index["version"] = "3.9.2".into();
    let python = Package {
        stem: "python-3.9.2-h0_0".into(),
        ..Package::new(
            "python",
            &[],
            false,
            vec![
                Raw::file("bin/python3.9", "#!/bin/sh\n"),
                Raw::file("lib/python3.9/site-packages/README.txt", "x\n"),
            ],
        )
    }
    .with_info("index.json", json_bytes(&index));
    channel.add(
        "python-3.9.2-h0_0.tar.bz2",
        &index,
        &python.tar_bz2(),
        |_| {},
    );
    channel.finish();
}

/// `demo-1.0-py3-none-any.whl` in `dir`: a module saying `text`, with a `RECORD` that
/// matches, as the installer checks.
pub(crate) fn write_wheel(dir: &Path, text: &str) {
    let files = [
        ("demo.py".to_string(), format!("SAYS = {text:?}\n")),
        (
            "demo-1.0.dist-info/METADATA".to_string(),
            "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n".to_string(),
        ),
        (
            "demo-1.0.dist-info/WHEEL".to_string(),
            "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_string(),
        ),
    ];
    let mut record = String::new();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    for (name, body) in &files {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(body.as_bytes());
        let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
        record.push_str(&format!("{name},sha256={hash},{}\n", body.len()));
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(body.as_bytes()).unwrap();
    }
    record.push_str("demo-1.0.dist-info/RECORD,,\n");
    zip.start_file("demo-1.0.dist-info/RECORD", options)
        .unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    fs_err::create_dir_all(dir).unwrap();
    fs_err::write(
        dir.join("demo-1.0-py3-none-any.whl"),
        zip.finish().unwrap().into_inner(),
    )
    .unwrap();
}

/// A recipe of `good` from `channel` (a URL, or a name for the channel alias).
pub(crate) fn recipe(channel: &str) -> String {
    format!(
        "[image]\nname = \"inputs\"\n[conda]\nchannels = [{}]\ndependencies = [\"good\"]\n",
        serde_json::to_string(channel).unwrap()
    )
}

/// The lock with `from` replaced by `to`, which must occur in it.
#[track_caller]
fn tamper(project: &Project, from: &str, to: &str) {
    let text = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(text.contains(from), "`{from}` is not in the lock:\n{text}");
    fs_err::write(project.lock_path(), text.replace(from, to)).unwrap();
}

/// Points the lock's `good` at `chan-evil/`'s, sha256, md5 and size included, so only where
/// it comes from is wrong. (A lock writes a package of a local channel as its path.)
fn point_good_at_the_evil_channel(project: &Project) {
    let s = sources();
    let file = |channel: &str| {
        s.root
            .join(channel)
            .join("linux-64/good-1.0-h0_0.tar.bz2")
            .display()
            .to_string()
    };
    tamper(
        project,
        &format!("conda: {}", file("chan")),
        &format!("conda: {}", file("chan-evil")),
    );
    tamper(
        project,
        &sha256_hex(&s.good("chan")),
        &sha256_hex(&s.good("chan-evil")),
    );
    let md5 = |b: &[u8]| {
        hex::encode(rattler_digest::compute_bytes_digest::<rattler_digest::Md5>(
            b,
        ))
    };
    tamper(project, &md5(&s.good("chan")), &md5(&s.good("chan-evil")));
    let size = |b: Vec<u8>| format!("size: {}\n", b.len());
    tamper(project, &size(s.good("chan")), &size(s.good("chan-evil")));
}

/// A build (plain, so it would reuse the lock, and `--locked`) and `verify --recipe` all
/// refuse the lock, naming `needles`.
#[track_caller]
fn refused_everywhere(project: &Project, envs: &[(&str, &str)], needles: &[&str]) {
    let run = |args: &[&str]| project.run_with(args, envs, None);
    for extra in [&[][..], &["--locked"]] {
        let mut args = vec!["build", "recipes/image.toml", "-o", "images/tampered"];
        args.extend_from_slice(extra);
        run(&args).assert_failure_naming(1, needles);
        assert!(!project.path().join("images/tampered").exists());
    }
    run(&["verify", "images/inputs", "--recipe", "recipes/image.toml"])
        .assert_failure_naming(1, needles);
}

#[test]
fn a_lock_pinning_a_package_outside_the_channels_is_refused() {
    let s = sources();
    let project = Project::new();
    project.write_recipe(&recipe(&s.url("chan")));
    project.build(&[]).success();
    // The untampered lock is taken as it is.
    project.build(&["--locked", "-o", "images/again"]).success();
    point_good_at_the_evil_channel(&project);
    refused_everywhere(
        &project,
        &[],
        &[
            &format!("pins `good-1.0-h0_0` at `{}linux-64/", s.url("chan-evil")),
            &format!("the recipe's channels: `{}`", s.url("chan")),
        ],
    );
}

/// Channel names resolve through the alias (a mirror): a lock under the alias's channel is
/// built from, one under another directory of the alias is not.
#[test]
fn a_lock_outside_the_channel_the_alias_resolves_to_is_refused() {
    let s = sources();
    let project = Project::new();
    project.write_recipe(&recipe("chan"));
    let alias = s.url("");
    let env = [("IMGBUILD_CHANNEL_ALIAS", alias.as_str())];
    project
        .run_with(&["build", "recipes/image.toml"], &env, None)
        .success();
    project
        .run_with(
            &[
                "build",
                "recipes/image.toml",
                "--locked",
                "-o",
                "images/again",
            ],
            &env,
            None,
        )
        .success();
    point_good_at_the_evil_channel(&project);
    refused_everywhere(
        &project,
        &env,
        &[
            &s.url("chan-evil"),
            &format!("the recipe's channels: `{}`", s.url("chan")),
        ],
    );
}

/// The recipe of `chan/` with python, and `demo` from the `wheels/` find-links directory.
pub(crate) fn pypi_recipe() -> String {
    let s = sources();
    format!(
        "{}\n[pypi]\nno-index = true\nfind-links = [{}]\ndependencies = [\"demo\"]\n",
        recipe(&s.url("chan")).replace("[\"good\"]", "[\"good\", \"python\"]"),
        serde_json::to_string(s.root.join("wheels").to_str().unwrap()).unwrap()
    )
}

#[test]
fn a_lock_pinning_a_wheel_outside_the_find_links_is_refused() {
    let s = sources();
    let project = Project::new();
    let wheels = s.root.join("wheels");
    project.write_recipe(&pypi_recipe());
    project.build(&[]).success();
    // The untampered lock is taken as it is.
    project.build(&["--locked", "-o", "images/again"]).success();
    let wheel =
        |dir: &str| fs_err::read(s.root.join(dir).join("demo-1.0-py3-none-any.whl")).unwrap();
    tamper(&project, "/wheels/demo-1.0", "/wheels-evil/demo-1.0");
    tamper(
        &project,
        &sha256_hex(&wheel("wheels")),
        &sha256_hex(&wheel("wheels-evil")),
    );
    refused_everywhere(
        &project,
        &[],
        &[
            "pins the PyPI package `demo 1.0` at `file://",
            "/wheels-evil/demo-1.0-py3-none-any.whl`",
            &format!(
                "the recipe's PyPI indexes and find-links: `{}`",
                wheels.display()
            ),
        ],
    );
}

#[test]
fn a_recipe_that_is_not_a_regular_file_is_refused_before_reading() {
    let project = Project::new();
    let fifo = project.path().join("recipe.fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    // The directory first: code that reads before it checks fails there, rather than
    // waiting on the fifo or filling memory from `/dev/zero`.
    for (path, kind) in [
        (".", "a directory"),
        ("recipe.fifo", "a fifo"),
        ("/dev/zero", "a character device"),
    ] {
        let refused = format!("is {kind}, not a regular file");
        project
            .run(&["build", path])
            .assert_failure_naming(1, &[path, &refused]);
        // `k8s --build-job` reads the recipe too, to put it into its ConfigMap.
        project
            .run(&[
                "k8s",
                "--build-job",
                path,
                "--builder-image",
                "registry.example/imgbuild@sha256:0",
                "--repository",
                "registry.example/x",
            ])
            .assert_failure_naming(1, &[path, &refused]);
    }
    project.assert_no_image();
}

#[test]
fn a_recipe_over_one_mebibyte_is_refused_before_reading() {
    let project = Project::new();
    let mut text = recipe(&sources().url("chan"));
    text.push('#');
    text.push_str(&"x".repeat((1 << 20) - text.len()));
    text.push('\n');
    project.write_recipe(&text);
    project.build(&[]).assert_failure_naming(
        1,
        &[
            "recipes/image.toml",
            "has 1048577 bytes; a recipe may have at most 1048576 (1 MiB)",
        ],
    );
    project.assert_no_image();
}

#[test]
fn source_date_epoch_outside_its_range_is_refused() {
    let project = Project::new();
    project.write_recipe(&recipe(&sources().url("chan")));
    for value in ["-1", "253402300800", "9223372036854775807"] {
        let run: Run = project.run_with(
            &["build", "recipes/image.toml"],
            &[("SOURCE_DATE_EPOCH", value)],
            None,
        );
        run.assert_failure_naming(
            1,
            &[&format!(
                "SOURCE_DATE_EPOCH=`{value}` is outside 0..253402300799"
            )],
        );
        project.assert_no_image();
    }
    // The last second of year 9999 is a valid `created` time.
    project
        .run_with(
            &["build", "recipes/image.toml"],
            &[("SOURCE_DATE_EPOCH", "253402300799")],
            None,
        )
        .success();
    let config = crate::common::LayoutView::new(project.path().join("images/inputs")).config();
    assert_eq!(config["created"], json!("9999-12-31T23:59:59Z"));
}
