//! Build provenance (issue 21, section 2): every build writes an in-toto Statement v1 with an
//! SLSA Provenance v1 predicate beside its layout. It is checked with the in-toto project's
//! own `in-toto-attestation` package (the Statement's `validate`, and the predicate parsed
//! strictly into its SLSA Provenance v1 protobuf), names the image by its manifest (or
//! index) digest and every locked package, wheel and base by sha256, is byte-identical for
//! two builds of one lock, and `imgbuild verify --provenance` refuses one that does not
//! match the image or the lock.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    common::{LayoutView, Project},
    support::{
        base::busybox_base_layout,
        channel::{tiny_recipe, write_platforms_channel},
        pypi::{SIX_1_16_0, SimpleIndex, bullseye_python_base, pinned_dists, pypi_channel},
        shared_channel, test_cache_dir,
    },
};

const SLSA_PROVENANCE_V1: &str = "https://slsa.dev/provenance/v1";

/// Parses the statement at argv[1] with `in_toto_attestation` and validates it: the
/// Statement with its own `validate`; the predicate with `ParseDict` into SLSA Provenance
/// v1 (which refuses unknown fields and wrong types), then the fields SLSA requires, as the
/// package's Go `Provenance.Validate` checks them (the Python package has no validator of
/// its own for this predicate), and every resolved dependency with `ResourceDescriptor`'s
/// `validate` and a digest of its algorithm's length.
const VALIDATE: &str = "\
import sys, json, re, google.protobuf.json_format as j
from in_toto_attestation.v1 import statement, statement_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
doc = json.load(open(sys.argv[1]))
pb = j.ParseDict(doc, statement_pb2.Statement())
statement.Statement.copy_from_pb(pb).validate()
assert pb.predicate_type == 'https://slsa.dev/provenance/v1', pb.predicate_type
prov = j.ParseDict(doc['predicate'], provenance_pb2.Provenance())
bd, rd = prov.build_definition, prov.run_details
assert prov.HasField('build_definition'), 'buildDefinition required'
assert bd.build_type, 'buildType required'
assert bd.HasField('external_parameters') and bd.external_parameters.fields, 'externalParameters required'
assert prov.HasField('run_details') and rd.HasField('builder'), 'runDetails.builder required'
assert rd.builder.id, 'builder.id required'
lengths = {'sha256': 64, 'md5': 32}
for d in list(bd.resolved_dependencies) + list(rd.byproducts):
    ResourceDescriptor.copy_from_pb(d).validate()
    for alg, value in d.digest.items():
        assert re.fullmatch('[0-9a-f]{%d}' % lengths[alg], value), (alg, value)
print('valid', pb.subject[0].digest['sha256'], len(bd.resolved_dependencies))
";

/// Runs [`VALIDATE`] on `file`; its stdout (`valid HEX COUNT`).
#[track_caller]
fn validate_with_in_toto(file: &Path) -> String {
    crate::common::venv_python_check(VALIDATE, file)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs_err::read(path).unwrap()).unwrap()
}

fn sha256_of(path: &Path) -> String {
    hex::encode(Sha256::digest(fs_err::read(path).unwrap()))
}

/// The resolved dependencies as (uri, sha256).
fn listed(statement: &Value) -> BTreeSet<(String, String)> {
    statement["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["uri"].as_str().unwrap().to_string(),
                d["digest"]["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every conda package and wheel of the lock, as (url, sha256).
fn locked(lock: &Path) -> BTreeSet<(String, String)> {
    let lock = imgbuild::lock::Lock::read(lock).unwrap().unwrap();
    let packages = lock.all_records().map(|r| {
        (
            r.url.to_string(),
            hex::encode(r.package_record.sha256.unwrap()),
        )
    });
    let wheels = lock
        .platforms
        .iter()
        .flat_map(|p| &p.wheels)
        .map(|w| (w.url.to_string(), hex::encode(w.sha256)));
    packages.chain(wheels).collect()
}

/// A project of `hello`, `pyhello` and `_r-mutex` on a busybox base from a local layout
/// (`oci:../base:latest`), built.
fn image_on_busybox(name: &str) -> Project {
    let project = Project::new();
    busybox_base_layout(&project.path().join("base")).unwrap();
    let recipe = tiny_recipe(
        shared_channel(),
        name,
        &["hello 1.0", "pyhello", "_r-mutex"],
    )
    .replace("base = \"scratch\"", "base = \"oci:../base:latest\"");
    project.write_recipe(&recipe);
    project.build(&[]).success();
    project
}

#[test]
fn a_build_writes_slsa_provenance_of_the_image_and_every_locked_package() {
    let project = image_on_busybox("provimg");
    let path = project.path().join("images/provimg.provenance.json");
    let valid = validate_with_in_toto(&path);

    let layout = LayoutView::new(project.path().join("images/provimg"));
    let digest = layout.manifest_digest();
    assert!(
        valid.starts_with(&format!("valid {}", digest.trim_start_matches("sha256:"))),
        "{valid}"
    );
    let statement = read_json(&path);
    assert_eq!(statement["predicateType"], SLSA_PROVENANCE_V1);
    assert_eq!(statement["subject"].as_array().unwrap().len(), 1);
    assert_eq!(statement["subject"][0]["name"], "provimg");
    assert_eq!(crate::common::subject_digest(&statement), digest);

    let predicate = &statement["predicate"];
    let builder = &predicate["runDetails"]["builder"];
    assert_eq!(builder["id"], "https://imgbuild.dev/builder");
    assert_eq!(builder["version"]["imgbuild"], env!("CARGO_PKG_VERSION"));
    assert!(
        predicate["runDetails"].get("metadata").is_none(),
        "no wall-clock times: {predicate}"
    );
    let definition = &predicate["buildDefinition"];
    assert_eq!(
        definition["buildType"],
        "https://imgbuild.dev/buildtypes/recipe/v1"
    );
    let external = &definition["externalParameters"];
    assert_eq!(external["recipe"]["path"], "recipes/image.toml");
    assert_eq!(
        external["recipe"]["digest"]["sha256"],
        sha256_of(&project.recipe_path())
    );
    assert_eq!(external["lock"]["path"], "recipes/image.lock");
    assert_eq!(
        external["lock"]["digest"]["sha256"],
        sha256_of(&project.lock_path())
    );
    assert_eq!(external["base"], "oci:../base:latest");
    assert_eq!(external["platforms"], serde_json::json!(["linux-64"]));
    assert_eq!(external["compression"], "gzip");
    // SOURCE_DATE_EPOCH is unset: the lock's newest package time, the image's `created`.
    let created = layout.config()["created"].as_str().unwrap().to_string();
    let epoch = external["sourceDateEpoch"].as_i64().unwrap();
    assert_eq!(
        jiff::Timestamp::from_second(epoch).unwrap().to_string(),
        created
    );
    assert_eq!(
        definition["internalParameters"]["sourceDateEpochFrom"],
        "lock"
    );

    // Every package of the lock with its sha256, and the base by its digest: nothing else.
    let base_digest = layout.manifest()["annotations"]["org.opencontainers.image.base.digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let mut expected = locked(&project.lock_path());
    assert!(expected.len() >= 4, "{expected:?}");
    expected.insert(("oci:../base:latest".into(), base_digest));
    assert_eq!(listed(&statement), expected);
    // Sorted, as written.
    let uris: Vec<&str> = definition["resolvedDependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["uri"].as_str().unwrap())
        .collect();
    assert!(uris.is_sorted(), "{uris:?}");

    // SOURCE_DATE_EPOCH given: the value used, and where it came from.
    let dated = project
        .run_with(
            &["build", "recipes/image.toml", "-o", "out/dated"],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
            None,
        )
        .success();
    let statement = read_json(&project.path().join("out/dated.provenance.json"));
    let external = &statement["predicate"]["buildDefinition"]["externalParameters"];
    assert_eq!(external["sourceDateEpoch"], 1_700_000_000);
    assert_eq!(
        statement["predicate"]["buildDefinition"]["internalParameters"]["sourceDateEpochFrom"],
        "environment"
    );
    assert_eq!(crate::common::subject_digest(&statement), dated.digest());
}

#[test]
fn the_same_lock_built_twice_gives_the_same_provenance_bytes() {
    let project = image_on_busybox("repro");
    let first = fs_err::read(project.path().join("images/repro.provenance.json")).unwrap();

    // An unchanged rebuild in place rewrites the same bytes, and says where they are.
    let again = project.build(&[]).success();
    assert!(again.stderr.contains("Unchanged"), "{}", again.stderr);
    assert!(
        again
            .stderr
            .lines()
            .any(|l| l.trim() == "Provenance images/repro.provenance.json"),
        "{}",
        again.stderr
    );
    assert_eq!(
        fs_err::read(project.path().join("images/repro.provenance.json")).unwrap(),
        first
    );
    let json = project.build(&["--json"]).success();
    let result = json
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "result")
        .unwrap();
    assert_eq!(result["provenance"], "images/repro.provenance.json");

    // Another directory of this project.
    project
        .build(&["--locked", "-o", "elsewhere/deep/repro"])
        .success();
    let elsewhere =
        fs_err::read(project.path().join("elsewhere/deep/repro.provenance.json")).unwrap();
    assert_eq!(elsewhere, first);

    // Another project (another directory, another cache) with the same recipe, lock and
    // base.
    let other = Project::new();
    let copy = |from: &Path, to: &Path| {
        let status = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(status.success());
    };
    copy(&project.path().join("recipes"), other.path());
    copy(&project.path().join("base"), other.path());
    other.build(&["--locked"]).success();
    let copied = fs_err::read(other.path().join("images/repro.provenance.json")).unwrap();
    assert_eq!(
        String::from_utf8(copied).unwrap(),
        String::from_utf8(first).unwrap()
    );
}

#[test]
fn a_failed_build_writes_no_provenance() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        "failed",
        &["no-such-package"],
    ));
    project.build(&[]).assert_clean_failure(1);
    assert!(
        !project
            .path()
            .join("images/failed.provenance.json")
            .exists()
    );
    project.assert_no_image();
}

/// `[pypi]`: each wheel is listed by its URL and sha256, as the lock records it.
#[test]
fn wheels_are_listed_with_their_sha256() {
    let index = SimpleIndex::serve(&pinned_dists(&[SIX_1_16_0]).unwrap()).unwrap();
    let project = Project::new();
    bullseye_python_base(&project.path().join("base"), &test_cache_dir()).unwrap();
    let recipe = tiny_recipe(pypi_channel(), "pywheel", &["python"])
        .replace("base = \"scratch\"", "base = \"oci:../base\"")
        + &format!(
            "\n[pypi]\nindex-url = \"{}\"\ndependencies = [\"six\"]\n",
            index.url()
        );
    project.write_recipe(&recipe);
    project.build(&[]).success();

    let path = project.path().join("images/pywheel.provenance.json");
    validate_with_in_toto(&path);
    let statement = read_json(&path);
    let listed = listed(&statement);
    let locked = locked(&project.lock_path());
    let wheel = locked
        .iter()
        .find(|(url, _)| url.ends_with("/six-1.16.0-py2.py3-none-any.whl"))
        .unwrap_or_else(|| panic!("six is locked: {locked:?}"));
    assert!(listed.contains(wheel), "{listed:?}");
    assert!(locked.is_subset(&listed));
    assert_eq!(listed.len(), locked.len() + 1, "the lock's and the base");
    project
        .run(&verify_provenance("images/pywheel", &[]))
        .success();
}

fn platforms_channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        crate::support::kept_channel_dir("prov-platforms", |dir| {
            write_platforms_channel(dir, &test_cache_dir())
        })
    })
}

/// Two platforms: the subject is the image index, both platforms' packages are listed.
#[test]
fn a_multi_platform_image_is_named_by_its_index() {
    let project = Project::new();
    let url = url::Url::from_file_path(platforms_channel()).unwrap();
    project.write_recipe(&format!(
        "[image]\nname = \"multi\"\nplatforms = [\"linux-64\", \"linux-aarch64\"]\n\n\
         [conda]\nchannels = [\"{url}\"]\ndependencies = [\"speedups\", \"greeting\"]\n"
    ));
    let run = project.build(&[]).success();
    let path = project.path().join("images/multi.provenance.json");
    validate_with_in_toto(&path);
    let statement = read_json(&path);
    let layout = LayoutView::new(project.path().join("images/multi"));
    assert_eq!(
        layout.index()["manifests"][0]["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(crate::common::subject_digest(&statement), run.digest());
    assert_eq!(run.digest(), layout.manifest_digest());
    assert_eq!(
        statement["predicate"]["buildDefinition"]["externalParameters"]["platforms"],
        serde_json::json!(["linux-64", "linux-aarch64"])
    );
    // Scratch: no base; the shared noarch package once.
    assert_eq!(listed(&statement), locked(&project.lock_path()));
    let uris = listed(&statement);
    assert!(uris.iter().any(|(u, _)| u.contains("/linux-aarch64/")));
    assert!(uris.iter().any(|(u, _)| u.contains("/linux-64/")));
    project
        .run(&verify_provenance("images/multi", &[]))
        .success();
}

/// Writes `statement` to `name` in the project; its path.
fn write_edited(project: &Project, name: &str, statement: &Value) -> PathBuf {
    let path = project.path().join(name);
    fs_err::write(&path, serde_json::to_string_pretty(statement).unwrap()).unwrap();
    path
}

#[test]
fn verify_provenance_checks_the_image_and_the_lock() {
    let project = image_on_busybox("checked");
    let image = "images/checked";
    let layout = LayoutView::new(project.path().join(image));
    let digest = layout.manifest_digest();

    // Good: the one beside the layout, against the lock named or the recipe's.
    let ok = project.run(&verify_provenance(image, &[])).success();
    assert!(ok.stderr.contains("provenance"), "{}", ok.stderr);
    let report: Value = serde_json::from_str(
        &project
            .run(&[
                "verify",
                image,
                "--recipe",
                "recipes/image.toml",
                "--provenance",
                "--json",
            ])
            .success()
            .stdout,
    )
    .unwrap();
    assert_eq!(report["provenance"], "images/checked.provenance.json");
    let beside = project.path().join("images/checked.provenance.json");
    let statement = read_json(&beside);

    // Another digest as the subject: named, with the layout's.
    let mut other = statement.clone();
    other["subject"][0]["digest"]["sha256"] = Value::from("ab".repeat(32));
    let file = write_edited(&project, "other-subject.json", &other);
    project
        .run(&verify_provenance(image, &[file.to_str().unwrap()]))
        .assert_failure_naming(
            1,
            &[
                &format!(
                    "the provenance names sha256:{} but the layout's image is {digest}",
                    "ab".repeat(32)
                ),
                "other-subject.json",
            ],
        );

    // A package dropped: the lock has it, the provenance does not list it.
    let mut dropped = statement.clone();
    let deps = dropped["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array_mut()
        .unwrap();
    let at = deps
        .iter()
        .position(|d| d["name"].as_str().unwrap().starts_with("hello-1.0"))
        .unwrap();
    let hello = deps.remove(at);
    let file = write_edited(&project, "dropped.json", &dropped);
    project
        .run(&verify_provenance(image, &[file.to_str().unwrap()]))
        .assert_failure_naming(
            1,
            &[&format!(
                "the lock has {} (sha256 {}) that the provenance does not list",
                hello["name"].as_str().unwrap(),
                hello["digest"]["sha256"].as_str().unwrap()
            )],
        );

    // A package's digest changed: the lock's is not listed.
    let mut changed = statement.clone();
    changed["predicate"]["buildDefinition"]["resolvedDependencies"][at]["digest"]["sha256"] =
        Value::from("cd".repeat(32));
    let file = write_edited(&project, "changed.json", &changed);
    project
        .run(&verify_provenance(image, &[file.to_str().unwrap()]))
        .assert_failure_naming(1, &["that the provenance does not list"]);

    // Not a provenance at all.
    let file = write_edited(&project, "not.json", &serde_json::json!({"_type": "x"}));
    project
        .run(&verify_provenance(image, &[file.to_str().unwrap()]))
        .assert_failure_naming(1, &["is not an imgbuild SLSA provenance"]);

    // The recipe edited (a comment: its lock still fits it, the image matches the lock):
    // with --recipe, the recipe's change is named.
    let recipe = fs_err::read_to_string(project.recipe_path()).unwrap();
    project.write_recipe(&format!("# edited\n{recipe}"));
    project
        .run(&[
            "verify",
            image,
            "--recipe",
            "recipes/image.toml",
            "--provenance",
        ])
        .assert_failure_naming(
            1,
            &[&format!(
                "it was built from recipe `recipes/image.toml` sha256:{}, and `recipes/image.toml` is now sha256:",
                statement["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["digest"]["sha256"]
                    .as_str()
                    .unwrap()
            )],
        );

    // The lock changed since the build (re-solved for another recipe): the lock's path and
    // digests are named.
    project.write_recipe(&recipe.replace("\"_r-mutex\"", "\"_r-mutex\", \"other\""));
    project.run(&["lock", "recipes/image.toml"]).success();
    project
        .run(&verify_provenance(image, &[]))
        .assert_failure_naming(
            1,
            &[
                "images/checked.provenance.json",
                "it was built from lock `recipes/image.lock` sha256:",
                "the lock changed since the build",
            ],
        );

    // Rebuilt: the provenance is the new image's and lock's again.
    project.build(&[]).success();
    project.run(&verify_provenance(image, &[])).success();
}

/// `verify IMAGE --provenance [EXTRA…] --lock recipes/image.lock`: the provenance held to
/// the lock the user names.
fn verify_provenance<'a>(image: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["verify", image, "--provenance"];
    args.extend_from_slice(extra);
    args.extend(["--lock", "recipes/image.lock"]);
    args
}
