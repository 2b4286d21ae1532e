//! `[[models]]` (issue 33): model weights written by PyPI's `safetensors`, with a
//! `config.json` and a tokenizer file, pinned file by file in the lock and written as an
//! OCI layout beside the image: a ModelPack artifact whose config validates against the
//! spec's own JSON schema (tests/data/modelpack), and an image form that podman mounts with
//! `--mount type=image` next to the runtime, its files read in the container with their
//! sha256 intact. The same files give the same digests in another checkout; a revision that
//! changes one file changes one layer; `--locked` names the file that changed.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;
use sha2::Digest;

use crate::{
    common::{LayoutView, Project, require_root, run_tool, venv_tool},
    support::{
        base::busybox_base_layout,
        channel::tiny_recipe,
        podman::{Podman, Storage},
        shared_channel,
    },
};

/// The recipe of an image with the model `tiny` mounted at `/models/tiny`.
fn recipe() -> String {
    tiny_recipe(shared_channel(), "served", &["hello 1.0"])
        + "\n[[models]]\nname = \"tiny\"\nmount = \"/models/tiny\"\nsource = \"models/tiny\"\n"
}

/// A small model in `dir`: two safetensors shards written by the `safetensors` package, a
/// `config.json`, a tokenizer and a README.
pub(crate) fn write_model(dir: &Path) {
    fs_err::create_dir_all(dir.join("tokenizer")).unwrap();
    let script = "import sys, numpy as np\n\
        from safetensors.numpy import save_file\n\
        d = sys.argv[1]\n\
        rng = np.random.default_rng(7)\n\
        save_file({'embed.weight': rng.standard_normal((256, 64)).astype(np.float16)}, d + '/model-00001-of-00002.safetensors', metadata={'format': 'np'})\n\
        save_file({'lm_head.weight': rng.standard_normal((64, 256)).astype(np.float16), 'norm.bias': np.zeros(64, dtype=np.float32)}, d + '/model-00002-of-00002.safetensors')\n";
    let output = Command::new(venv_tool("python"))
        .args(["-c", script])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config =
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}"#;
    fs_err::write(dir.join("config.json"), config).unwrap();
    fs_err::write(
        dir.join("tokenizer/tokenizer.json"),
        r#"{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}"#,
    )
    .unwrap();
    fs_err::write(dir.join("README.md"), "# tiny\nA test model.\n").unwrap();
}

/// A project of [`recipe`] with the model beside it.
pub(crate) fn model_project() -> Project {
    let project = Project::new();
    project.write_recipe(&recipe());
    write_model(&project.path().join("recipes/models/tiny"));
    project
}

/// `build --json` (which must succeed) and its `result` event.
pub(crate) fn build(project: &Project, extra: &[&str]) -> Value {
    let mut args = vec!["build", "recipes/image.toml", "--json"];
    args.extend_from_slice(extra);
    let run = project.run(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "result")
        .unwrap_or_else(|| panic!("no result in {}", run.stdout))
}

pub(crate) fn model_layout(project: &Project) -> PathBuf {
    project.path().join("images/served.models/tiny")
}

/// Each layer's file path and digest, of the manifest tagged `tag`.
pub(crate) fn layers_by_path(layout: &LayoutView, tag: &str) -> BTreeMap<String, String> {
    let manifest = tagged_manifest(layout, tag);
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["annotations"]["org.cncf.model.filepath"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                l["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(crate) fn tagged_manifest(layout: &LayoutView, tag: &str) -> Value {
    let index = layout.index();
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no `{tag}` in {index}"));
    layout.json_blob(entry["digest"].as_str().unwrap())
}

/// The model's files on disk beside the recipe, by path: their sha256.
pub(crate) fn source_files(project: &Project) -> BTreeMap<String, String> {
    let top = project.path().join("recipes/models/tiny");
    walkdir::WalkDir::new(&top)
        .into_iter()
        .map(Result::unwrap)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let path = e.path().strip_prefix(&top).unwrap().to_str().unwrap();
            (
                path.to_string(),
                hex::encode(sha2::Sha256::digest(fs_err::read(e.path()).unwrap())),
            )
        })
        .collect()
}

#[test]
fn a_model_is_pinned_written_alike_elsewhere_and_read_by_skopeo_and_its_schema() {
    let project = model_project();
    let result = build(&project, &[]);
    let model = &result["models"][0];
    assert_eq!(
        (model["name"].as_str(), model["files"].as_u64()),
        (Some("tiny"), Some(5))
    );
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    let pins = lock
        .lines()
        .find_map(|l| l.strip_prefix("# imgbuild-models: "))
        .expect("the lock pins the model");
    let pins: Vec<Value> = serde_json::from_str(pins).unwrap();
    let paths: Vec<&str> = pins.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "README.md",
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "tokenizer/tokenizer.json"
        ]
    );

    let layout = LayoutView::new(model_layout(&project));
    let artifact = tagged_manifest(&layout, "latest-modelpack");
    assert_eq!(
        artifact["artifactType"],
        "application/vnd.cncf.model.manifest.v1+json"
    );
    let kinds: Vec<&str> = artifact["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| k.ends_with("weight.v1.tar"))
            .count(),
        2,
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"application/vnd.cncf.model.doc.v1.tar"),
        "{kinds:?}"
    );
    let config = layout.json_blob(artifact["config"]["digest"].as_str().unwrap());
    assert_eq!(config["config"]["format"], "safetensors");
    assert_eq!(config["config"]["architecture"], "LlamaForCausalLM");
    // 256×64 + 64×256 + 64 parameters, most of them float16.
    assert_eq!(config["config"]["paramSize"], "32.8K");
    assert_eq!(config["config"]["precision"], "float16");
    let config_file = project.path().join("modelpack-config.json");
    fs_err::write(&config_file, serde_json::to_vec(&config).unwrap()).unwrap();
    let schema =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/modelpack/config-schema.json");
    let checked = Command::new(venv_tool("check-jsonschema"))
        .arg("--schemafile")
        .arg(&schema)
        .arg(&config_file)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );

    // skopeo reads both forms.
    let dir = model_layout(&project);
    for tag in ["latest", "latest-modelpack"] {
        let raw = run_tool(
            "skopeo",
            &["inspect", "--raw", &format!("oci:{}:{tag}", dir.display())],
        );
        let raw: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(raw["layers"].as_array().unwrap().len(), 5, "{raw}");
    }
    // The image form and the artifact share every layer.
    assert_eq!(
        layers_by_path(&layout, "latest"),
        layers_by_path(&layout, "latest-modelpack")
    );

    // Another checkout with the same files: the same digests.
    let elsewhere = model_project();
    fs_err::copy(project.lock_path(), elsewhere.lock_path()).unwrap();
    let again = build(&elsewhere, &["--locked"]);
    assert_eq!(
        again["models"][0]["image"]
            .as_str()
            .map(|s| s.rsplit('@').next()),
        model["image"].as_str().map(|s| s.rsplit('@').next())
    );
    assert_eq!(again["models"][0]["artifact"], model["artifact"]);
}

#[test]
fn a_revision_of_one_file_changes_one_layer_and_locked_names_the_file() {
    let project = model_project();
    build(&project, &[]);
    let before = layers_by_path(&LayoutView::new(model_layout(&project)), "latest-modelpack");
    let config = project.path().join("recipes/models/tiny/config.json");
    fs_err::write(
        &config,
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 128}"#,
    )
    .unwrap();
    let run = project.run(&["build", "recipes/image.toml", "--locked"]);
    run.assert_failure_naming(1, &["config.json", "model `tiny`", "--locked"]);
    let verify = project.run(&["verify", "images/served", "--recipe", "recipes/image.toml"]);
    assert_ne!(verify.code, 0, "{}", verify.stdout);
    let said = format!("{}{}", verify.stdout, verify.stderr);
    assert!(
        said.contains("config.json") && said.contains("model `tiny`"),
        "{said}"
    );

    let revised = build(&project, &[]);
    let after = layers_by_path(&LayoutView::new(model_layout(&project)), "latest-modelpack");
    let changed: Vec<&String> = before.keys().filter(|p| before[*p] != after[*p]).collect();
    assert_eq!(changed, ["config.json"], "{revised}");
}

#[test]
fn podman_mounts_the_model_beside_the_runtime_and_reads_its_files_intact() {
    require_root!("podman's --mount type=image mounts overlay (root)");
    let project = model_project();
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let text = recipe().replace("base = \"scratch\"", "base = \"oci:../base\"");
    project.write_recipe(&text);
    let result = build(&project, &[]);
    let podman = Podman::new(
        &project.path().join("podman"),
        Storage::Overlay {
            partial_pulls: false,
        },
    )
    .unwrap();
    // Into podman's storage as a registry pull would leave them, by skopeo.
    for (layout, name) in [
        (
            project.path().join("images/served"),
            "localhost/served:latest",
        ),
        (model_layout(&project), "localhost/tiny-model:latest"),
    ] {
        let from = format!("oci:{}:latest", layout.display());
        run_tool(
            "skopeo",
            &["copy", "--quiet", &from, &podman.storage_reference(name)],
        );
    }
    let listing = podman.ok(&[
        "run",
        "--rm",
        "--mount",
        "type=image,source=localhost/tiny-model:latest,destination=/models/tiny",
        "localhost/served:latest",
        "/bin/sh",
        "-c",
        "cd /models/tiny && find . -type f | sort | xargs sha256sum",
    ]);
    let pins: Vec<Value> = {
        let lock = fs_err::read_to_string(project.lock_path()).unwrap();
        let json = lock
            .lines()
            .find_map(|l| l.strip_prefix("# imgbuild-models: "))
            .unwrap();
        serde_json::from_str(json).unwrap()
    };
    for pin in &pins {
        let line = format!(
            "{}  ./{}",
            pin["sha256"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:"),
            pin["path"].as_str().unwrap()
        );
        assert!(
            listing.lines().any(|l| l == line),
            "{line} not in:\n{listing}\n{result}"
        );
    }
}

#[test]
fn the_sboms_and_the_provenance_list_every_model_file_and_verify_checks_them() {
    let project = model_project();
    build(&project, &[]);
    let files = source_files(&project);
    let images = project.path().join("images");
    let (spdx_path, cdx_path) = (
        images.join("served.spdx.json"),
        images.join("served.cdx.json"),
    );
    crate::sbom::validate_sboms(&spdx_path, &cdx_path);

    // SPDX: the model described beside the image, a package per file with its sha256.
    let spdx: Value = serde_json::from_slice(&fs_err::read(&spdx_path).unwrap()).unwrap();
    assert_eq!(
        spdx["documentDescribes"],
        serde_json::json!(["SPDXRef-Image", "SPDXRef-Model-tiny"])
    );
    let listed: BTreeMap<String, String> = spdx["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["primaryPackagePurpose"] == "FILE")
        .map(|p| {
            let name = p["name"].as_str().unwrap();
            let path = name.strip_prefix("tiny/").unwrap().to_string();
            (
                path,
                p["checksums"][0]["checksumValue"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(listed, files);
    let contains = spdx["relationships"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["spdxElementId"] == "SPDXRef-Model-tiny" && r["relationshipType"] == "CONTAINS"
        })
        .count();
    assert_eq!(contains, files.len());

    // CycloneDX: a machine-learning-model component holding its files.
    let cdx: Value = serde_json::from_slice(&fs_err::read(&cdx_path).unwrap()).unwrap();
    let model = cdx["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "machine-learning-model")
        .unwrap_or_else(|| panic!("no model in {cdx}"));
    assert_eq!(model["name"], "tiny");
    let listed: BTreeMap<String, String> = model["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["hashes"][0]["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed, files);
    // `imgbuild sbom` of the recipe says the same, from the lock.
    let from_lock = project.run(&["sbom", "recipes/image.toml", "--format", "cyclonedx"]);
    assert_eq!(from_lock.code, 0, "{}", from_lock.stderr);
    let from_lock: Value = serde_json::from_str(&from_lock.stdout).unwrap();
    assert_eq!(from_lock["components"], cdx["components"]);

    // The provenance lists each file as the lock pins it, and verify holds it to the lock.
    let provenance_path = images.join("served.provenance.json");
    let mut provenance: Value =
        serde_json::from_slice(&fs_err::read(&provenance_path).unwrap()).unwrap();
    let recorded = &provenance["predicate"]["buildDefinition"]["externalParameters"]["models"];
    let recorded: BTreeMap<String, String> = recorded
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["model"], "tiny");
            let sha256 = m["sha256"].as_str().unwrap();
            (
                m["path"].as_str().unwrap().to_string(),
                sha256.trim_start_matches("sha256:").to_string(),
            )
        })
        .collect();
    assert_eq!(recorded, files);
    let verify = [
        "verify",
        "images/served",
        "--recipe",
        "recipes/image.toml",
        "--provenance",
    ];
    let ok = project.run(&verify);
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    let listed = &mut provenance["predicate"]["buildDefinition"]["externalParameters"]["models"][0];
    listed["sha256"] = Value::String(format!("sha256:{}", "0".repeat(64)));
    let path = listed["path"].as_str().unwrap().to_string();
    fs_err::write(&provenance_path, serde_json::to_vec(&provenance).unwrap()).unwrap();
    let tampered = project.run(&verify);
    assert_ne!(tampered.code, 0, "{}", tampered.stdout);
    let said = format!("{}{}", tampered.stdout, tampered.stderr);
    assert!(
        said.contains(&format!("`{path}` of model `tiny`")) && said.contains("the lock pins"),
        "{said}"
    );
}

#[test]
fn inspect_lists_a_models_files_and_diff_names_the_layer_a_revision_changed() {
    let project = model_project();
    build(&project, &[]);
    let files = source_files(&project);
    let run = project.run(&["inspect", "images/served.models/tiny", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let summary: Value = serde_json::from_str(&run.stdout).unwrap();
    let kinds: BTreeMap<String, String> = summary["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        kinds.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>()
    );
    assert_eq!(kinds["model-00001-of-00002.safetensors"], "weight");
    assert_eq!(kinds["config.json"], "config");
    assert_eq!(kinds["README.md"], "doc");
    assert_eq!(summary["architecture"], "LlamaForCausalLM", "{summary}");
    assert_eq!(summary["format"], "safetensors", "{summary}");

    // The image's summary names the model beside it.
    let image = project.run(&["inspect", "images/served"]);
    assert_eq!(image.code, 0, "{}", image.stderr);
    assert!(
        image.stdout.contains("Models beside it:") && image.stdout.contains("served.models/tiny"),
        "{}",
        image.stdout
    );
    let image = project.run(&["inspect", "images/served", "--json"]);
    let image: Value = serde_json::from_str(&image.stdout).unwrap();
    assert_eq!(image["models"][0]["artifact"], summary["artifact"]);

    // A revision of one shard: diff names that file's layer, and the bytes of new layers.
    let old = project.path().join("old-tiny");
    crate::common::run_tool(
        "cp",
        &[
            "-a",
            model_layout(&project).to_str().unwrap(),
            old.to_str().unwrap(),
        ],
    );
    let shard = project
        .path()
        .join("recipes/models/tiny/model-00002-of-00002.safetensors");
    let mut bytes = fs_err::read(&shard).unwrap();
    bytes[100] ^= 1;
    fs_err::write(&shard, &bytes).unwrap();
    build(&project, &[]);
    let run = project.run(&["diff", "old-tiny", "images/served.models/tiny", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let changes: Value = serde_json::from_str(&run.stdout).unwrap();
    let changed: Vec<&str> = changes["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(changed, ["model-00002-of-00002.safetensors"], "{changes}");
    assert_eq!(changes["unchanged"], files.len() - 1);
    assert_eq!(changes["added"], serde_json::json!([]));
    assert_eq!(changes["new_bytes"], changes["changed"][0]["to"]["size"]);
    let text = project.run(&["diff", "old-tiny", "images/served.models/tiny"]);
    assert!(
        text.stdout
            .contains("~ model-00002-of-00002.safetensors: layer"),
        "{}",
        text.stdout
    );
    let mixed = project.run(&["diff", "old-tiny", "images/served"]);
    mixed.assert_failure_naming(1, &["is a model's layout", "images/served"]);
}
