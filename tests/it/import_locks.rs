//! `imgbuild init --from` a pixi.lock, a pixi manifest, a conda-lock.yml or an `@EXPLICIT`
//! file (issue 31, item 5): real lock files from public projects (`tests/data/locks/`,
//! origins in its MANIFEST.md) are imported through the CLI, and every pinned URL and
//! digest of the input's Linux platforms is compared with the lock imgbuild wrote; a lock
//! generated against the test channel is imported and built with `--locked`.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use rattler_lock::{LockFile, PackageHashes};

use crate::{common::Project, support::shared_channel};

fn locks_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/locks")
}

/// One pin: (platform, URL, sha256 or md5 hex).
type Pin = (String, String, String);

fn hash_hex(hash: Option<&PackageHashes>) -> String {
    match hash {
        Some(PackageHashes::Sha256(sha) | PackageHashes::Md5Sha256(_, sha)) => hex::encode(sha),
        Some(PackageHashes::Md5(md5)) => format!("md5:{}", hex::encode(md5)),
        None => "none".to_string(),
    }
}

/// The pins of `environment`'s Linux platforms in a rattler/pixi/conda-lock lock.
fn lock_pins(text: &str, dir: &Path, environment: &str) -> BTreeSet<Pin> {
    let lock = LockFile::from_str_with_base_directory(text, Some(dir)).unwrap();
    let env = lock.environment(environment).unwrap();
    let mut pins = BTreeSet::new();
    for platform in env.platforms() {
        let subdir = platform.subdir().to_string();
        if !subdir.starts_with("linux-") {
            continue;
        }
        for record in env.conda_repodata_records(platform).unwrap().unwrap() {
            let hash = match (record.package_record.sha256, record.package_record.md5) {
                (Some(sha), _) => hex::encode(sha),
                (None, Some(md5)) => format!("md5:{}", hex::encode(md5)),
                (None, None) => "none".to_string(),
            };
            pins.insert((subdir.clone(), record.url.to_string(), hash));
        }
        for wheel in env.pypi_packages(platform).into_iter().flatten() {
            let wheel = wheel.as_wheel().unwrap();
            pins.insert((
                subdir.clone(),
                wheel.location.to_string(),
                hash_hex(wheel.hash.as_ref()),
            ));
        }
    }
    pins
}

/// The pins of an `@EXPLICIT` file.
fn explicit_pins(text: &str) -> BTreeSet<Pin> {
    let platform = text
        .lines()
        .find_map(|l| l.strip_prefix("# platform: "))
        .unwrap()
        .trim()
        .to_string();
    text.lines()
        .filter(|l| l.starts_with("http"))
        .map(|l| {
            let (url, hash) = l.split_once('#').unwrap();
            let hash = match hash.strip_prefix("sha256:") {
                Some(sha) => sha.to_string(),
                None => format!("md5:{hash}"),
            };
            (platform.clone(), url.to_string(), hash)
        })
        .collect()
}

/// Imports `input` (under `tests/data/locks/`) into a fresh project as `recipes/app.toml`
/// with `extra` arguments; the written lock's pins and the run's stderr.
fn import(input: &str, extra: &[&str]) -> (BTreeSet<Pin>, String, String) {
    let project = Project::new();
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    let input = locks_dir().join(input);
    let mut args = vec![
        "init",
        "--from",
        input.to_str().unwrap(),
        "-o",
        "recipes/app.toml",
    ];
    args.extend_from_slice(extra);
    let run = project.run(&args).success();
    let lock = fs_err::read_to_string(project.path().join("recipes/app.lock")).unwrap();
    let recipe = fs_err::read_to_string(project.path().join("recipes/app.toml")).unwrap();
    // The recipe is one imgbuild loads, and its lock is the one beside it.
    let loaded = imgbuild::recipe::Recipe::load(
        &project.path().join("recipes/app.toml"),
        &imgbuild::recipe::RecipeOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{recipe}"));
    assert_eq!(loaded.lock_path(), project.path().join("recipes/app.lock"));
    (
        lock_pins(&lock, &project.path().join("recipes"), "default"),
        run.stderr,
        recipe,
    )
}

/// Imports a real lock and checks every pin came across unchanged; the count of pins.
#[track_caller]
fn imported_exactly(input: &str, environment: &str, extra: &[&str]) -> (usize, String, String) {
    let mut path = locks_dir().join(input);
    // A manifest's pins are the pixi.lock's beside it.
    if input.ends_with(".toml") {
        path = path.with_file_name("pixi.lock");
    }
    let text = fs_err::read_to_string(&path).unwrap();
    let dir = path.parent().unwrap();
    let wanted = match text.contains("\n@EXPLICIT\n") {
        true => explicit_pins(&text),
        false => lock_pins(&text, dir, environment),
    };
    assert!(!wanted.is_empty(), "{input} pins nothing on Linux");
    let (written, stderr, recipe) = import(input, extra);
    let missing: Vec<_> = wanted.difference(&written).take(5).collect();
    let extra_pins: Vec<_> = written.difference(&wanted).take(5).collect();
    assert!(
        missing.is_empty() && extra_pins.is_empty(),
        "{input}: not carried {missing:?}; not in the input {extra_pins:?}"
    );
    (wanted.len(), stderr, recipe)
}

#[test]
fn a_pixi_lock_v5_imports_every_linux_pin() {
    let (pins, stderr, recipe) = imported_exactly("pixi-lightgbm/pixi.lock", "default", &[]);
    assert!(pins > 40, "{pins}");
    assert!(
        stderr.contains("`osx-64`, `osx-arm64`, `win-64` of pixi.lock are not Linux"),
        "{stderr}"
    );
    assert!(recipe.contains("platforms = [\"linux-64\"]"), "{recipe}");
    assert!(recipe.contains("\"lightgbm ==4.1.0\""), "{recipe}");
}

#[test]
fn a_pixi_lock_v6_environment_with_wheels_imports_every_pin() {
    let (_, _, recipe) = imported_exactly(
        "pixi-solve-groups/pixi.lock",
        "min-py38",
        &["--environment", "min-py38"],
    );
    // The wheels become [pypi], pinned.
    assert!(
        recipe.contains("[pypi]\nindex-url = \"https://pypi.org/simple\""),
        "{recipe}"
    );
    assert!(recipe.contains("\"matplotlib=="), "{recipe}");
    imported_exactly("pixi-solve-groups/pixi.lock", "default", &[]);
}

#[test]
fn a_pixi_lock_v6_with_several_environments_imports_the_one_asked_for() {
    imported_exactly(
        "pixi-multi-env/pixi.lock",
        "py312",
        &["--environment", "py312"],
    );
    let project = Project::new();
    let input = locks_dir().join("pixi-multi-env/pixi.lock");
    let run = project.run(&[
        "init",
        "--from",
        input.to_str().unwrap(),
        "--environment",
        "py3000",
        "-o",
        "app.toml",
    ]);
    run.assert_failure_naming(1, &["pixi.lock", "no environment `py3000`", "`py312`"]);
    assert!(!project.path().join("app.toml").exists());
    assert!(!project.path().join("app.lock").exists());
}

#[test]
fn a_pyproject_toml_imports_the_pixi_lock_beside_it() {
    let (_, _, recipe) =
        imported_exactly("pixi-readthedocs-override/pyproject.toml", "default", &[]);
    assert!(
        recipe.contains("name = \"readthedocs-override\""),
        "{recipe}"
    );
    assert!(recipe.contains("\"mkdocs =="), "{recipe}");
}

#[test]
fn a_conda_lock_yml_imports_every_linux_pin() {
    let (pins, stderr, recipe) = imported_exactly("repro-course-ci/conda-lock.yml", "default", &[]);
    assert!(pins > 30, "{pins}");
    assert!(stderr.contains("not Linux"), "{stderr}");
    assert!(recipe.contains("\"pyattimo==0.6.0\""), "{recipe}");
}

#[test]
fn an_explicit_md5_file_imports_every_pin_and_says_md5() {
    let (pins, stderr, recipe) = imported_exactly("esmvalcore/conda-linux-64.lock", "default", &[]);
    assert!(pins > 400, "{pins}");
    assert!(
        stderr.contains("carry only an md5") && stderr.contains("records no dependencies"),
        "{stderr}"
    );
    assert!(
        recipe.contains("\"https://conda.anaconda.org/conda-forge\""),
        "{recipe}"
    );
}

#[test]
fn a_pixi_toml_without_a_lock_gives_its_specs_and_says_so() {
    let project = Project::new();
    fs_err::write(
        project.path().join("pixi.toml"),
        "[workspace]\nname = \"demo\"\nchannels = [\"conda-forge\"]\nplatforms = [\"linux-64\", \"osx-arm64\"]\n\n[dependencies]\npython = \"3.12.*\"\nnumpy = \"*\"\n",
    )
    .unwrap();
    let run = project
        .run(&["init", "--from", "pixi.toml", "-o", "demo.toml"])
        .success();
    assert!(
        run.stderr.contains("no pixi.lock beside pixi.toml"),
        "{}",
        run.stderr
    );
    let recipe = fs_err::read_to_string(project.path().join("demo.toml")).unwrap();
    assert!(
        recipe.contains("\"numpy\",\n    \"python 3.12.*\","),
        "{recipe}"
    );
    assert!(!project.path().join("demo.lock").exists());
}

/// A pixi.lock made from imgbuild's own lock of the test channel (the v7 format pixi
/// writes, without imgbuild's header comments), imported and built with `--locked`: the
/// image holds exactly its packages.
#[test]
fn an_imported_pixi_lock_builds_locked_from_a_local_channel() {
    let project = Project::new();
    project.write_recipe(&crate::support::channel::tiny_recipe(
        shared_channel(),
        "solved",
        &["python 3.9.18", "hello 1.0", "pyhello"],
    ));
    project.run(&["lock", "recipes/image.toml"]).success();
    let solved = fs_err::read_to_string(project.lock_path()).unwrap();
    let pixi: String = solved
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    fs_err::create_dir_all(project.path().join("app")).unwrap();
    fs_err::write(project.path().join("app/pixi.lock"), &pixi).unwrap();

    project
        .run(&["init", "--from", "app/pixi.lock", "-o", "app/app.toml"])
        .success();
    let written = fs_err::read_to_string(project.path().join("app/app.lock")).unwrap();
    let dir = project.path().join("app");
    assert_eq!(
        lock_pins(&written, &dir, "default"),
        lock_pins(&pixi, &dir, "default")
    );
    // Never over an existing recipe or lock.
    project
        .run(&["init", "--from", "app/pixi.lock", "-o", "app/app.toml"])
        .assert_failure_naming(1, &["app.toml", "already exists"]);

    project
        .run(&["build", "app/app.toml", "--locked"])
        .success();
    let summary: serde_json::Value = serde_json::from_str(
        &project
            .run(&["inspect", "images/app", "--json"])
            .success()
            .stdout,
    )
    .unwrap();
    let packages: BTreeSet<&str> = summary["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let locked = LockFile::from_str_with_base_directory(&pixi, Some(&dir)).unwrap();
    let env = locked.default_environment().unwrap();
    let platform = env.platforms().next().unwrap();
    let wanted: BTreeSet<String> = env
        .conda_repodata_records(platform)
        .unwrap()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}-{}-{}",
                r.package_record.name.as_normalized(),
                r.package_record.version,
                r.package_record.build
            )
        })
        .collect();
    assert!(wanted.contains("hello-1.0-h0_0"), "{wanted:?}");
    assert_eq!(
        packages,
        wanted.iter().map(String::as_str).collect::<BTreeSet<_>>()
    );
}
