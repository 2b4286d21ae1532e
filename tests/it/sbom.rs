//! SBOMs: written beside a built image and by `imgbuild sbom`, valid SPDX 2.3 and CycloneDX
//! 1.5 by real validators, listing exactly the packages of the lock, reproducible.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, venv_tool},
    support::{base::busybox_base_layout, channel::tiny_recipe, shared_channel},
};

#[track_caller]
fn validate(program: &Path, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{} {args:?} rejected the document:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The CycloneDX 1.5 schema shipped by cyclonedx-python-lib (with the SPDX licence and JSF
/// schemas it refers to beside it).
fn cyclonedx_schema() -> PathBuf {
    let output = Command::new(venv_tool("python"))
        .args([
            "-c",
            "import cyclonedx.schema, os; print(os.path.dirname(cyclonedx.schema.__file__))",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "cyclonedx-python-lib is missing");
    let dir = PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
    dir.join("_res/bom-1.5.SNAPSHOT.schema.json")
}

fn spdx_schema() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/spdx-schema-2.3.json")
}

/// Each locked package as (name, version, build, sha256, file name, channel).
/// Real validators: the SPDX 2.3 JSON schema, the SPDX project's own validator (licence
/// expressions, ids, relationships, URIs), and the CycloneDX 1.5 schema.
pub(crate) fn validate_sboms(spdx: &Path, cdx: &Path) {
    let (spdx_arg, cdx_arg) = (spdx.to_str().unwrap(), cdx.to_str().unwrap());
    validate(
        &venv_tool("check-jsonschema"),
        &["--schemafile", spdx_schema().to_str().unwrap(), spdx_arg],
    );
    validate(&venv_tool("pyspdxtools"), &["-i", spdx_arg]);
    validate(
        &venv_tool("check-jsonschema"),
        &[
            "--schemafile",
            cyclonedx_schema().to_str().unwrap(),
            cdx_arg,
        ],
    );
}

fn locked(lock: &Path) -> BTreeMap<String, (String, String, String, String, String)> {
    let lock = imgbuild::lock::Lock::read(lock).unwrap().unwrap();
    lock.all_records()
        .map(|r| {
            let p = &r.package_record;
            (
                p.name.as_normalized().to_string(),
                (
                    p.version.to_string(),
                    p.build.to_string(),
                    hex::encode(p.sha256.unwrap()),
                    r.identifier.to_string(),
                    p.subdir.clone(),
                ),
            )
        })
        .collect()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs_err::read(path).unwrap()).unwrap()
}

fn image_on_busybox(project: &Project) {
    busybox_base_layout(&project.path().join("base")).unwrap();
    let recipe = tiny_recipe(
        shared_channel(),
        "sbomimg",
        &["hello 1.0", "pyhello", "_r-mutex"],
    )
    .replace("base = \"scratch\"", "base = \"oci:../base:latest\"");
    project.write_recipe(&recipe);
    project.build(&[]).success();
}

#[test]
fn build_writes_valid_spdx_and_cyclonedx_listing_exactly_the_lock() {
    let project = Project::new();
    image_on_busybox(&project);
    let spdx_path = project.path().join("images/sbomimg.spdx.json");
    let cdx_path = project.path().join("images/sbomimg.cdx.json");

    validate_sboms(&spdx_path, &cdx_path);

    // Exactly the packages of the lock, each with version, build, sha256 and purl.
    let lock = locked(&project.lock_path());
    let channel = url::Url::from_file_path(shared_channel()).unwrap();
    let channel = channel.as_str().trim_end_matches('/');
    let spdx = read_json(&spdx_path);
    assert_eq!(spdx["spdxVersion"], "SPDX-2.3");
    let packages = spdx["packages"].as_array().unwrap();
    let conda: BTreeMap<String, &Value> = packages
        .iter()
        .filter(|p| {
            p["SPDXID"]
                .as_str()
                .unwrap()
                .starts_with("SPDXRef-Package-conda-")
        })
        .map(|p| (p["name"].as_str().unwrap().to_string(), p))
        .collect();
    assert_eq!(
        conda.keys().collect::<Vec<_>>(),
        lock.keys().collect::<Vec<_>>()
    );
    for (name, (version, build, sha256, file_name, subdir)) in &lock {
        let package = conda[name];
        assert_eq!(package["versionInfo"], *version);
        assert_eq!(package["packageFileName"], *file_name);
        assert_eq!(package["checksums"][0]["algorithm"], "SHA256");
        assert_eq!(package["checksums"][0]["checksumValue"], *sha256);
        let archive = if file_name.ends_with(".conda") {
            "conda"
        } else {
            "tar.bz2"
        };
        assert_eq!(
            package["externalRefs"][0]["referenceLocator"],
            format!(
                "pkg:conda/{name}@{version}?build={build}&channel={channel}&subdir={subdir}&type={archive}"
            )
        );
    }
    // Licences: SPDX expressions where the package has one, a LicenseRef with the text
    // otherwise (the CUDA runtime's NVIDIA EULA).
    assert_eq!(conda["hello"]["licenseDeclared"], "Apache-2.0");
    assert_eq!(
        conda["cuda-cudart"]["licenseDeclared"],
        "LicenseRef-NVIDIA-End-User-License-Agreement"
    );
    assert!(
        spdx["hasExtractedLicensingInfos"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["extractedText"] == "NVIDIA End User License Agreement")
    );

    // The image by manifest digest, descending from the base by digest.
    let layout = LayoutView::new(project.path().join("images/sbomimg"));
    let image = &packages[0];
    assert_eq!(image["SPDXID"], "SPDXRef-Image");
    assert_eq!(image["versionInfo"], layout.manifest_digest());
    let base_digest = layout.manifest()["annotations"]["org.opencontainers.image.base.digest"]
        .as_str()
        .unwrap()
        .to_string();
    let base = packages
        .iter()
        .find(|p| p["SPDXID"] == "SPDXRef-Base")
        .unwrap();
    assert_eq!(base["versionInfo"], base_digest);
    assert_eq!(base["name"], "oci:../base:latest");
    let relationships = spdx["relationships"].as_array().unwrap();
    let has = |from: &str, kind: &str, to: &str| {
        relationships.iter().any(|r| {
            r["spdxElementId"] == from
                && r["relationshipType"] == kind
                && r["relatedSpdxElement"] == to
        })
    };
    assert!(has("SPDXRef-Image", "DESCENDANT_OF", "SPDXRef-Base"));
    for package in conda.values() {
        assert!(has(
            "SPDXRef-Image",
            "CONTAINS",
            package["SPDXID"].as_str().unwrap()
        ));
    }
    // pyhello depends on python, which the lock holds.
    assert!(has(
        conda["pyhello"]["SPDXID"].as_str().unwrap(),
        "DEPENDS_ON",
        conda["python"]["SPDXID"].as_str().unwrap()
    ));
    // Deterministic: created is the image's, not the clock.
    assert_eq!(
        spdx["creationInfo"]["created"],
        layout.config()["created"].as_str().unwrap()
    );

    // CycloneDX: the same packages, purls and hashes.
    let cdx = read_json(&cdx_path);
    assert_eq!(cdx["specVersion"], "1.5");
    assert_eq!(
        cdx["metadata"]["component"]["version"],
        layout.manifest_digest()
    );
    let libraries: BTreeMap<String, &Value> = cdx["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "library")
        .map(|c| (c["name"].as_str().unwrap().to_string(), c))
        .collect();
    assert_eq!(
        libraries.keys().collect::<Vec<_>>(),
        lock.keys().collect::<Vec<_>>()
    );
    for (name, component) in &libraries {
        assert_eq!(
            component["purl"],
            conda[name]["externalRefs"][0]["referenceLocator"]
        );
        assert_eq!(component["hashes"][0]["content"], lock[name].2);
    }
    assert!(
        cdx["components"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "container" && c["version"] == base_digest)
    );

    // Rebuilding from the same lock writes the same bytes.
    let before = fs_err::read(&spdx_path).unwrap();
    let before_cdx = fs_err::read(&cdx_path).unwrap();
    fs_err::remove_dir_all(project.path().join("images")).unwrap();
    project.build(&["--locked"]).success();
    assert_eq!(fs_err::read(&spdx_path).unwrap(), before);
    assert_eq!(fs_err::read(&cdx_path).unwrap(), before_cdx);
}

#[test]
fn sbom_command_reads_a_recipe_or_a_lock() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        "cmd",
        &["hello 1.0", "_r-mutex"],
    ));

    // No lock yet: a clean error that says what to run.
    let run = project.run(&["sbom", "recipes/image.toml"]);
    run.assert_clean_failure(1);
    assert!(run.stderr.contains("run `imgbuild lock"), "{}", run.stderr);

    project.run(&["lock", "recipes/image.toml"]).success();
    let from_recipe = project
        .run(&["sbom", "recipes/image.toml"])
        .success()
        .stdout;
    let from_lock = project
        .run(&["sbom", "recipes/image.lock"])
        .success()
        .stdout;
    let again = project
        .run(&["sbom", "recipes/image.toml"])
        .success()
        .stdout;
    assert_eq!(from_recipe, again, "the same lock gives the same document");
    let spdx: Value = serde_json::from_str(&from_recipe).unwrap();
    assert_eq!(spdx["name"], "cmd");
    assert!(
        spdx["packages"][0].get("versionInfo").is_none(),
        "no image digest without an image"
    );
    let from_lock: Value = serde_json::from_str(&from_lock).unwrap();
    assert_eq!(
        from_lock["name"], "image",
        "a lock alone is named after its file"
    );
    assert_eq!(
        from_lock["packages"].as_array().unwrap()[1..],
        spdx["packages"].as_array().unwrap()[1..],
        "the same packages from the recipe or its lock"
    );

    // SOURCE_DATE_EPOCH moves `created` and the namespace with it.
    let dated = project
        .run_with(
            &["sbom", "recipes/image.toml"],
            &[("SOURCE_DATE_EPOCH", "1700000000")],
            None,
        )
        .success()
        .stdout;
    let dated: Value = serde_json::from_str(&dated).unwrap();
    assert_eq!(dated["creationInfo"]["created"], "2023-11-14T22:13:20Z");
    assert_ne!(dated["documentNamespace"], spdx["documentNamespace"]);

    // CycloneDX to a file; the path is the result on stdout.
    let out = project.path().join("out.cdx.json");
    let run = project
        .run(&[
            "sbom",
            "recipes/image.toml",
            "--format",
            "cyclonedx",
            "-o",
            out.to_str().unwrap(),
        ])
        .success();
    assert_eq!(run.stdout.trim(), out.to_str().unwrap());
    validate(
        &venv_tool("check-jsonschema"),
        &[
            "--schemafile",
            cyclonedx_schema().to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    );
    let cdx = read_json(&out);
    let names: Vec<&str> = cdx["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["_r-mutex", "cuda-cudart", "hello"]);
}
