//! `push` of an image with `[[models]]` (issue 33): each model goes to
//! `REGISTRY/REPO/models/MODEL` beside the image, its image form under the image's tag and
//! its ModelPack artifact under `TAG-modelpack`, both signed with the image. Read back by real
//! clients: `skopeo inspect` of both forms, and oras-py (the ORAS project's Python client from
//! PyPI), whose manifest schema check passes and whose blobs untar to the pinned files. A
//! revision that changes one file uploads that file's layer and the two configs, no more.

use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    common::{LayoutView, Project, venv_tool},
    models::{build, layers_by_path, model_layout, model_project, source_files, tagged_manifest},
    registry::{Auth, Registry},
    signing::{Gpg, imgbuild, registries_d_staging_in},
};

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `push --json` (which must succeed) of the built `served` image to `REPO:v1`.
fn push(project: &Project, home: &Path, target: &str, extra: &[&str]) -> Value {
    let mut args = vec!["push", "images/served", target, "--insecure", "--json"];
    args.extend_from_slice(extra);
    let run = imgbuild(project, &args, home);
    assert_eq!(run.code, 0, "{}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// The digest of the manifest tagged `tag` in the model's layout.
fn local_digest(project: &Project, tag: &str) -> String {
    let index = LayoutView::new(model_layout(project)).index();
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no `{tag}` in {index}"))
        .clone();
    entry["digest"].as_str().unwrap().to_string()
}

/// What oras-py reads of `reference`: its manifest (checked by oras-py against the OCI
/// manifest schema it ships), then every layer blob, its digest checked and its tar read:
/// each file's path and sha256.
fn oras_files(reference: &str) -> BTreeMap<String, String> {
    let script = r#"
import hashlib, io, json, sys, tarfile, tempfile, os
import oras.client
ref = sys.argv[1]
client = oras.client.OrasClient(hostname=ref.split('/')[0], insecure=True)
manifest = client.get_manifest(ref)
assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json", manifest
files = {}
with tempfile.TemporaryDirectory() as out:
    for layer in manifest["layers"]:
        path = os.path.join(out, "blob")
        client.download_blob(ref, layer["digest"], path)
        data = open(path, "rb").read()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"], layer
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    body = tar.extractfile(member).read()
                    files[member.name] = hashlib.sha256(body).hexdigest()
        assert layer["annotations"]["org.cncf.model.filepath"] in files, layer
print(json.dumps(files))
"#;
    let output = Command::new(venv_tool("python"))
        .args(["-c", script, reference])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "oras-py: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `skopeo inspect --raw` of `reference`: the bytes the registry serves.
fn skopeo_raw(reference: &str) -> Vec<u8> {
    let output = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "skopeo inspect {reference}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

#[test]
fn a_model_is_pushed_signed_and_read_by_skopeo_and_oras_and_a_revision_sends_one_layer() {
    let project = model_project();
    build(&project, &[]);
    fs_err::create_dir_all(project.path().join("docker-config")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start(Auth::None);
    let host = &registry.host;
    let key = Gpg::new(work.path(), "release");
    let key_file = key.secret_key(&work.path().join("release.asc"));
    let registries_d = registries_d_staging_in(work.path(), work.path());
    let report = push(
        &project,
        work.path(),
        &format!("{host}/ml/served:v1"),
        &[
            "--sign-by",
            key_file.to_str().unwrap(),
            "--registries.d",
            registries_d.to_str().unwrap(),
        ],
    );

    // Both forms, where the image's repository says, by the digests of the local layout.
    let models = report["models"].as_array().unwrap();
    assert_eq!(models.len(), 1, "{report}");
    let model = &models[0];
    assert_eq!(model["name"], "tiny", "{report}");
    let repository = format!("{host}/ml/served/models/tiny");
    let image_digest = local_digest(&project, "latest");
    let artifact_digest = local_digest(&project, "latest-modelpack");
    assert_eq!(
        model["image"]["pushed"],
        format!("{repository}:v1@{image_digest}")
    );
    assert_eq!(
        model["artifact"]["pushed"],
        format!("{repository}:v1-modelpack@{artifact_digest}")
    );
    let files = source_files(&project);
    assert_eq!(
        model["image"]["blobs_total"],
        files.len() + 1,
        "a layer per file and the config: {report}"
    );

    // The registry serves the layout's exact bytes for both tags.
    for (tag, digest) in [("v1", &image_digest), ("v1-modelpack", &artifact_digest)] {
        let raw = skopeo_raw(&format!("{repository}:{tag}"));
        assert_eq!(format!("sha256:{}", sha256_hex(&raw)), *digest, "{tag}");
    }
    // oras-py reads the artifact: every file, with the sha256 it has beside the recipe.
    assert_eq!(oras_files(&format!("{repository}:v1-modelpack")), files);

    // Signed with the image: skopeo checks the image form's signature against the key.
    let signed: Vec<&str> = report["signatures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["identity"].as_str())
        .filter(|identity| identity.starts_with(&repository))
        .collect();
    assert_eq!(
        signed,
        [
            format!("{repository}:v1"),
            format!("{repository}:v1-modelpack")
        ],
        "{report}"
    );
    let manifest_file = work.path().join("model-manifest.json");
    let layout = LayoutView::new(model_layout(&project));
    fs_err::write(&manifest_file, layout.blob(&image_digest)).unwrap();
    let signature = work.path().join(format!(
        "sigs/ml/served/models/tiny@sha256={}/signature-1",
        image_digest.trim_start_matches("sha256:")
    ));
    let (ok, said) = key.standalone_verify(&manifest_file, &format!("{repository}:v1"), &signature);
    assert!(
        ok,
        "skopeo standalone-verify of the model's signature: {said}"
    );

    // A revision of one shard: that shard's layer and the two configs naming the layers go
    // up; every other file's layer is already there.
    let before = layers_by_path(&layout, "latest-modelpack");
    let shard = project
        .path()
        .join("recipes/models/tiny/model-00002-of-00002.safetensors");
    let mut bytes = fs_err::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs_err::write(&shard, &bytes).unwrap();
    build(&project, &[]);
    let after = layers_by_path(&layout, "latest-modelpack");
    let changed: Vec<&String> = before.keys().filter(|p| before[*p] != after[*p]).collect();
    assert_eq!(changed, ["model-00002-of-00002.safetensors"]);
    let revised = push(&project, work.path(), &format!("{host}/ml/served:v2"), &[]);
    let model = &revised["models"][0];
    assert_eq!(
        model["image"]["blobs_uploaded"], 2,
        "layer and config: {revised}"
    );
    assert_eq!(
        model["artifact"]["blobs_uploaded"], 1,
        "its config: {revised}"
    );
    let manifest = tagged_manifest(&layout, "latest-modelpack");
    let size_of = |digest: &str| {
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["digest"] == digest)
            .map(|l| l["size"].as_u64().unwrap())
            .unwrap()
    };
    let shard_layer = size_of(&after["model-00002-of-00002.safetensors"]);
    let configs: u64 = ["latest", "latest-modelpack"]
        .iter()
        .map(|tag| {
            tagged_manifest(&layout, tag)["config"]["size"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let total: u64 = after.values().map(|d| size_of(d)).sum();
    let sent = model["image"]["bytes_uploaded"].as_u64().unwrap()
        + model["artifact"]["bytes_uploaded"].as_u64().unwrap();
    eprintln!(
        "revision: {sent} bytes sent: a {shard_layer}-byte shard layer and {configs} bytes of \
         configs, of {total} bytes of layers"
    );
    assert_eq!(sent, shard_layer + configs, "{revised}");

    // `--no-models` pushes the image alone.
    let alone = push(
        &project,
        work.path(),
        &format!("{host}/ml/alone:v1"),
        &["--no-models"],
    );
    assert_eq!(alone["models"], serde_json::json!([]), "{alone}");
    assert_eq!(registry.count("PUT", "/v2/ml/alone/models/"), 0);
}

/// What is wrong, how to make it in the models' directory, and what the refusal says.
type Case<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);

#[test]
fn a_model_layout_that_is_a_link_or_misnamed_is_refused_before_anything_is_pushed() {
    let project = model_project();
    build(&project, &[]);
    fs_err::create_dir_all(project.path().join("docker-config")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start(Auth::None);
    let models = project.path().join("images/served.models");
    let elsewhere = work.path().join("elsewhere");
    fs_err::create_dir_all(&elsewhere).unwrap();
    let cases: [Case; 3] = [
        (
            "a link",
            &|dir| std::os::unix::fs::symlink(&elsewhere, dir.join("linked")).unwrap(),
            "is a symbolic link, not a model's layout",
        ),
        (
            "a file",
            &|dir| fs_err::write(dir.join("stray"), "x").unwrap(),
            "is a regular file, not a model's layout",
        ),
        (
            "a name no model may have",
            &|dir| fs_err::create_dir(dir.join("Bad_Name")).unwrap(),
            "is not named as a model is",
        ),
    ];
    for (what, make, says) in cases {
        let copy = work.path().join("copy");
        let _ = fs_err::remove_dir_all(&copy);
        crate::common::run_tool(
            "cp",
            &["-a", models.to_str().unwrap(), copy.to_str().unwrap()],
        );
        make(&models);
        let run = imgbuild(
            &project,
            &[
                "push",
                "images/served",
                &format!("{}/ml/served:v1", registry.host),
                "--insecure",
            ],
            work.path(),
        );
        run.assert_failure_naming(1, &["served.models", says]);
        assert_eq!(
            registry.count("PUT", "/v2/ml/served/"),
            0,
            "{what}: the registry changed"
        );
        fs_err::remove_dir_all(&models).unwrap();
        fs_err::rename(&copy, &models).unwrap();
    }
}
