//! Multi-platform images: one recipe, `platforms = ["linux-64", "linux-aarch64"]`, solved and
//! installed for each platform on this (x86-64) host and written as an OCI image index.
//!
//! The channel holds `speedups`, a package per platform made from MarkupSafe's real compiled
//! extension in the pinned PyPI wheel of each architecture, and a `noarch` package both
//! platforms share. Real consumers read the result: skopeo picks each platform's manifest
//! (from the layout and from a registry), umoci unpacks each, and the unpacked file's ELF
//! header says which machine it is for.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, run_tool},
    registry::{Auth, Registry},
    support::{channel::write_platforms_channel, test_cache_dir},
};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// ELF `e_machine` values.
const EM_X86_64: u16 = 0x3E;
const EM_AARCH64: u16 = 0xB7;

/// The two-platform channel, written once per test process.
fn platforms_channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        crate::support::kept_channel_dir("platforms-channel", |dir| {
            write_platforms_channel(dir, &test_cache_dir())
        })
    })
}

fn recipe(platforms: &[&str]) -> String {
    let url = url::Url::from_file_path(platforms_channel()).unwrap();
    let platforms: Vec<String> = platforms.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        "[image]\nname = \"multi\"\nplatforms = [{}]\n\n[conda]\nchannels = [\"{url}\"]\n\
         dependencies = [\"speedups\", \"greeting\"]\n",
        platforms.join(", ")
    )
}

fn project(platforms: &[&str]) -> Project {
    let project = Project::new();
    project.write_recipe(&recipe(platforms));
    project
}

/// The machine an ELF file is for, after checking it is one.
fn elf_machine(bytes: &[u8]) -> u16 {
    assert!(bytes.len() > 20, "too short for an ELF header");
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// The nested image index a tag of a multi-platform layout points to.
fn platform_index(layout: &LayoutView) -> Value {
    let top = layout.index();
    let entry = &top["manifests"][0];
    assert_eq!(entry["mediaType"], INDEX, "{top}");
    layout.json_blob(entry["digest"].as_str().unwrap())
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// `skopeo inspect` of one architecture of `image` (a transport reference), and the raw
/// config skopeo resolved for it (through the index to that platform's manifest).
fn skopeo_inspect(image: &str, arch: &str) -> (Value, String) {
    let inspect = |extra: &[&str]| {
        let mut args = vec!["--override-os", "linux", "--override-arch", arch, "inspect"];
        if image.starts_with("docker://") {
            args.push("--tls-verify=false");
        }
        args.extend_from_slice(extra);
        args.push(image);
        run_tool("skopeo", &args)
    };
    (
        serde_json::from_str(&inspect(&[])).unwrap(),
        inspect(&["--config", "--raw"]),
    )
}

#[test]
fn two_platform_image_is_an_index_whose_layers_hold_each_platforms_binaries() {
    let project = project(&["linux-64", "linux-aarch64"]);
    let built = project.build(&[]).success();
    let digest = built.digest();
    let dir = project.path().join("images/multi");
    let layout = LayoutView::new(&dir);

    // The tag points to an image index listing one manifest per platform, in recipe order.
    let top = layout.index();
    assert_eq!(top["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(top["manifests"][0]["digest"], digest.as_str());
    assert!(top["manifests"][0].get("platform").is_none());
    let index = platform_index(&layout);
    assert_eq!(index["mediaType"], INDEX);
    let manifests = index["manifests"].as_array().unwrap();
    let platforms: Vec<(String, String, String)> = manifests
        .iter()
        .map(|m| {
            assert_eq!(m["mediaType"], MANIFEST);
            let p = &m["platform"];
            (
                p["os"].as_str().unwrap().to_string(),
                p["architecture"].as_str().unwrap().to_string(),
                p["variant"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("linux".into(), "amd64".into(), String::new()),
            ("linux".into(), "arm64".into(), "v8".into())
        ]
    );

    // skopeo resolves each architecture through the index to that platform's image.
    let image = format!("oci:{}:latest", dir.display());
    for (arch, entry) in ["amd64", "arm64"].into_iter().zip(manifests) {
        let (inspect, config) = skopeo_inspect(&image, arch);
        assert_eq!(inspect["Architecture"], arch);
        assert_eq!(inspect["Os"], "linux");
        let manifest = layout.json_blob(entry["digest"].as_str().unwrap());
        assert_eq!(sha256(config.as_bytes()), manifest["config"]["digest"]);
        assert_eq!(
            inspect["Layers"].as_array().unwrap().len(),
            manifest["layers"].as_array().unwrap().len()
        );
        let config = layout.json_blob(manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(config["architecture"], arch);
        let conda = &manifest["annotations"]["dev.imgbuild.conda.platform"];
        assert_eq!(
            conda,
            if arch == "amd64" {
                "linux-64"
            } else {
                "linux-aarch64"
            }
        );
    }

    // Each platform, copied out by skopeo and unpacked by umoci, holds its own machine code.
    for (arch, machine) in [("amd64", EM_X86_64), ("arm64", EM_AARCH64)] {
        let single = project.path().join(format!("single-{arch}"));
        run_tool(
            "skopeo",
            &[
                "--override-os",
                "linux",
                "--override-arch",
                arch,
                "copy",
                &image,
                &format!("oci:{}:latest", single.display()),
            ],
        );
        crate::common::validate_layout(single.to_str().unwrap());
        let bundle = project.path().join(format!("bundle-{arch}"));
        let rootfs = crate::common::unpack(&single, "latest", &bundle);
        let library = fs_err::read(rootfs.join("opt/conda/lib/_speedups.so")).unwrap();
        assert_eq!(elf_machine(&library), machine, "{arch}");
        assert_eq!(
            fs_err::read_to_string(rootfs.join("opt/conda/share/greeting.txt")).unwrap(),
            "hello from every platform\n"
        );
    }

    // The noarch package is the same layer, one blob, in both platform images.
    let layers_of = |entry: &Value| -> Vec<(String, String)> {
        crate::common::layers_of(&layout.json_blob(entry["digest"].as_str().unwrap()))
    };
    let (amd64, arm64) = (layers_of(&manifests[0]), layers_of(&manifests[1]));
    let layer_with = |layers: &[(String, String)], package: &str| {
        layers
            .iter()
            .find(|(packages, _)| packages.contains(package))
            .map(|(_, digest)| digest.clone())
            .unwrap_or_else(|| panic!("a layer with {package}"))
    };
    assert_eq!(
        layer_with(&amd64, "greeting"),
        layer_with(&arm64, "greeting")
    );
    assert_ne!(
        layer_with(&amd64, "speedups"),
        layer_with(&arm64, "speedups")
    );

    // One lock holds both platforms.
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    for needle in [
        "linux-64/speedups-2.1.5-h0_0.conda",
        "linux-aarch64/speedups-2.1.5-h0_0.conda",
        "__archspec=1=aarch64",
        "__archspec=1=x86_64",
    ] {
        assert!(lock.contains(needle), "{needle} in:\n{lock}");
    }

    // verify checks every platform's manifest and its packages against its platform's lock.
    let verified: Value = serde_json::from_str(
        &project
            .run(&[
                "verify",
                "images/multi",
                "--recipe",
                "recipes/image.toml",
                "--json",
            ])
            .success()
            .stdout,
    )
    .unwrap();
    assert_eq!(verified["manifests"].as_array().unwrap().len(), 2);
    assert_eq!(verified["indexes"][0], digest.as_str());
    let rebuilt: Value = serde_json::from_str(
        &project
            .run(&[
                "verify",
                "images/multi",
                "--recipe",
                "recipes/image.toml",
                "--rebuild",
                "--json",
            ])
            .success()
            .stdout,
    )
    .unwrap();
    assert_eq!(rebuilt["rebuilt"], digest.as_str());

    // The SBOMs list both platforms' packages, each once (noarch `greeting` is one file).
    let spdx: Value = serde_json::from_slice(
        &fs_err::read(project.path().join("images/multi.spdx.json")).unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = spdx["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "speedups").count(),
        2,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| **n == "greeting").count(),
        1,
        "{names:?}"
    );

    // The same lock gives the same index, from scratch in another layout and in place.
    let other = project
        .build(&["-o", "other", "--locked", "--cache-dir", "other-cache"])
        .success();
    assert_eq!(other.digest(), digest);
    assert_eq!(
        LayoutView::new(project.path().join("other")).blob_names(),
        layout.blob_names()
    );
    let again = project.build(&["--json"]).success();
    let result = again
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "result")
        .unwrap();
    assert_eq!(result["digest"], digest.as_str());
    assert_eq!(result["unchanged"], true);
    let platforms: Vec<(String, String)> = result["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["platform"].as_str().unwrap().to_string(),
                p["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = ["linux-64", "linux-aarch64"]
        .iter()
        .zip(manifests)
        .map(|(p, m)| (p.to_string(), m["digest"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(platforms, expected);

    // The arm64 image is built without running anything of it, and the build says so.
    assert!(
        built.stderr.contains("linux-aarch64 is installed on"),
        "{}",
        built.stderr
    );
    assert!(!built.stderr.contains("linux-64 is installed on"));
    assert!(
        built
            .stderr
            .contains("Installing 4 packages: 2 for linux-64, 2 for linux-aarch64"),
        "{}",
        built.stderr
    );
}

#[test]
fn oci_image_tool_validates_the_index_layout() {
    let project = project(&["linux-64", "linux-aarch64"]);
    project.build(&[]).success();
    let dir = project.path().join("images/multi");
    // oci-image-tool validates the layout and its tag; it does not descend into an image
    // index (it warns that the media type is unknown to it), so each platform image is also
    // validated on its own after skopeo copies it out (in the test above).
    let output = std::process::Command::new("oci-image-tool")
        .args([
            "validate",
            "--type",
            "image",
            "--ref",
            "name=latest",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    assert!(text.contains("Validation succeeded"), "{text}");
}

#[test]
fn push_sends_both_manifests_then_the_index() {
    let registry = Registry::start(Auth::None);
    let project = project(&["linux-64", "linux-aarch64"]);
    let digest = project.build(&[]).success().digest();
    let layout = LayoutView::new(project.path().join("images/multi"));
    let children: Vec<String> = platform_index(&layout)["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["digest"].as_str().unwrap().to_string())
        .collect();

    let target = format!("{}/ml/multi:v1", registry.host);
    let pushed = project
        .run(&["push", "images/multi", &target, "--insecure", "--json"])
        .success();
    let report: Value = serde_json::from_str(pushed.stdout.trim()).unwrap();
    assert_eq!(report["pushed"], format!("{target}@{digest}"));
    // The SBOMs describe the whole image: their subject is the index.
    assert_eq!(report["sboms"].as_array().unwrap().len(), 2, "{report}");
    let referrers: Value = serde_json::from_str(&run_tool(
        "skopeo",
        &[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!(
                "docker://{}/ml/multi:{}",
                registry.host,
                digest.replace(':', "-")
            ),
        ],
    ))
    .unwrap();
    for artifact in referrers["manifests"].as_array().unwrap() {
        let manifest: Value = serde_json::from_str(&run_tool(
            "skopeo",
            &[
                "inspect",
                "--raw",
                "--tls-verify=false",
                &format!(
                    "docker://{}/ml/multi@{}",
                    registry.host,
                    artifact["digest"].as_str().unwrap()
                ),
            ],
        ))
        .unwrap();
        assert_eq!(manifest["subject"]["mediaType"], INDEX);
        assert_eq!(manifest["subject"]["digest"], digest.as_str());
    }

    // The registry serves the index under the tag, byte for byte ours.
    let raw = run_tool(
        "skopeo",
        &[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{target}"),
        ],
    );
    assert_eq!(sha256(raw.as_bytes()), digest);
    let index: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(index["mediaType"], INDEX);
    // Each platform resolves to its manifest.
    for (arch, child) in ["amd64", "arm64"].into_iter().zip(&children) {
        let (inspect, config) = skopeo_inspect(&format!("docker://{target}"), arch);
        assert_eq!(inspect["Architecture"], arch);
        let manifest = layout.json_blob(child);
        assert_eq!(sha256(config.as_bytes()), manifest["config"]["digest"]);
    }
    // Manifests went up before the index that names them.
    let log = registry.log();
    let position = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("{needle} not in the registry log:\n{log}"))
    };
    let index_put = position("PUT /v2/ml/multi/manifests/v1");
    for child in &children {
        assert!(position(&format!("PUT /v2/ml/multi/manifests/{child}")) < index_put);
    }
}

#[test]
fn one_foreign_platform_writes_a_plain_manifest_of_aarch64_code() {
    let project = project(&["linux-aarch64"]);
    let built = project.build(&[]).success();
    let layout = LayoutView::new(project.path().join("images/multi"));
    let entry = &layout.index()["manifests"][0];
    assert_eq!(entry["mediaType"], MANIFEST);
    assert_eq!(entry["platform"]["architecture"], "arm64");
    assert_eq!(entry["digest"], built.digest().as_str());
    assert_eq!(layout.config()["architecture"], "arm64");
    assert!(built.stderr.contains("linux-aarch64 is installed on"));

    let rootfs = crate::common::unpack(
        &project.path().join("images/multi"),
        "latest",
        &project.path().join("bundle"),
    );
    let library = fs_err::read(rootfs.join("opt/conda/lib/_speedups.so")).unwrap();
    assert_eq!(elf_machine(&library), EM_AARCH64);

    // inspect reads a plain arm64 manifest on this x86-64 host.
    let summary: Value = serde_json::from_str(
        &project
            .run(&["inspect", "images/multi", "--json"])
            .success()
            .stdout,
    )
    .unwrap();
    assert_eq!(summary["architecture"], "arm64");
    assert!(summary.get("index_digest").is_none());
}

#[test]
fn a_lock_missing_a_platform_is_stale() {
    let project = project(&["linux-64"]);
    project.build(&[]).success();
    project.write_recipe(&recipe(&["linux-64", "linux-aarch64"]));
    project.build(&["--locked"]).assert_failure_naming(
        1,
        &[
            "no longer satisfies the recipe",
            "the lock is for platforms `linux-64`, the recipe asks for `linux-64, linux-aarch64`",
        ],
    );
    let rebuilt = project.build(&[]).success();
    assert!(
        rebuilt.stderr.contains("linux-64, linux-aarch64"),
        "{}",
        rebuilt.stderr
    );
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("linux-aarch64/speedups-2.1.5-h0_0.conda"));
    // And the other way: a platform dropped from the recipe.
    project.write_recipe(&recipe(&["linux-aarch64"]));
    project
        .build(&["--locked"])
        .assert_failure_naming(1, &["the recipe asks for `linux-aarch64`"]);
}

#[test]
fn docker_archive_of_several_platforms_is_refused_and_oci_archive_holds_the_index() {
    let project = project(&["linux-64", "linux-aarch64"]);
    let digest = project.build(&[]).success().digest();
    project
        .build(&["--format", "docker-archive"])
        .assert_failure_naming(1, &["docker-archive", "one platform"]);
    project.build(&["--format", "oci-archive"]).success();
    let archive = project.path().join("images/multi.oci.tar");
    let inspect: Value = serde_json::from_str(&run_tool(
        "skopeo",
        &[
            "inspect",
            "--raw",
            &format!("oci-archive:{}:latest", archive.display()),
        ],
    ))
    .unwrap();
    assert_eq!(inspect["mediaType"], INDEX);
    assert_eq!(
        inspect["manifests"].as_array().unwrap().len(),
        2,
        "{inspect} ({digest})"
    );
}

#[test]
fn inspect_describes_each_platform_and_k8s_pins_the_index() {
    let project = project(&["linux-64", "linux-aarch64"]);
    let digest = project.build(&[]).success().digest();
    let inspect = |extra: &[&str]| -> Value {
        let mut args = vec!["inspect", "images/multi", "--json"];
        args.extend_from_slice(extra);
        serde_json::from_str(&project.run(&args).success().stdout).unwrap()
    };
    let default = inspect(&[]);
    assert_eq!(default["index_digest"], digest.as_str());
    assert_eq!(
        default["platforms"],
        serde_json::json!(["linux/amd64", "linux/arm64/v8"])
    );
    // This x86-64 host's platform by default.
    assert_eq!(default["architecture"], "amd64");
    assert_eq!(default["conda"]["platform"], "linux-64");
    for platform in ["linux/arm64", "arm64", "linux-aarch64"] {
        let arm = inspect(&["--platform", platform]);
        assert_eq!(arm["architecture"], "arm64");
        assert_eq!(arm["conda"]["platform"], "linux-aarch64");
        assert_ne!(arm["manifest_digest"], default["manifest_digest"]);
        assert!(
            arm["packages"]
                .as_array()
                .unwrap()
                .contains(&Value::from("speedups-2.1.5-h0_0"))
        );
    }
    let text = project.run(&["inspect", "images/multi"]).success().stdout;
    assert!(text.contains(&format!("index        {digest}")), "{text}");
    project
        .run(&["inspect", "images/multi", "--platform", "linux/s390x"])
        .assert_failure_naming(
            1,
            &["no manifest for linux/s390x; it has linux/amd64, linux/arm64/v8"],
        );
    project
        .run(&["inspect", "images/multi", "--platform", "windows/amd64"])
        .assert_failure_naming(2, &["not a Linux platform"]);

    // Kubernetes pulls by the index digest, so each node gets its own platform's image.
    let yaml = project
        .run(&[
            "k8s",
            "images/multi",
            "--repository",
            "registry.example/ml/multi",
        ])
        .success()
        .stdout;
    // (Quoted or not: the YAML writer quotes what is not a plain word.)
    let pinned = format!("registry.example/ml/multi@{digest}");
    assert!(
        yaml.lines().any(|l| l
            .trim_start()
            .trim_start_matches("- ")
            .starts_with("image: ")
            && l.contains(&pinned)),
        "{yaml}"
    );
    // Nodes of either architecture may run it (and no others).
    let job: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    let terms = &job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let arch = terms[0]["matchExpressions"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["key"].as_str() == Some("kubernetes.io/arch"))
        .unwrap_or_else(|| panic!("an arch requirement in {yaml}"));
    assert_eq!(arch["operator"].as_str(), Some("In"));
    let values: Vec<&str> = arch["values"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(values, ["amd64", "arm64"]);
}

#[test]
fn smoke_of_an_image_without_the_hosts_platform_says_so() {
    let project = project(&["linux-aarch64"]);
    project.build(&[]).success();
    let run = project.run(&["smoke", "images/multi"]);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("linux/amd64"), "{}", run.stderr);
}

/// A recipe on `base` installing `greeting` for both platforms.
/// The image on a base: `speedups` only (the base holds `greeting`).
fn on_base_recipe(base: &str, platforms: &[&str]) -> String {
    recipe(platforms)
        .replace(
            "name = \"multi\"",
            &format!("name = \"onbase\"\nbase = \"{base}\""),
        )
        .replace(", \"greeting\"", "")
}

#[test]
fn a_base_that_is_an_index_gives_each_platform_its_own_manifest() {
    // The base: a two-platform image of our own holding `greeting`, in a layout and in a
    // registry. The image on it installs `speedups` only: `verify --recipe` compares the
    // lock with the layers this build added, not the base's (whose package annotations
    // stay on its layers).
    let base = project(&["linux-64", "linux-aarch64"]);
    base.write_recipe(&recipe(&["linux-64", "linux-aarch64"]).replace("\"speedups\", ", ""));
    base.build(&[]).success();
    let base_dir = base.path().join("images/multi");
    let base_children: Vec<Value> = platform_index(&LayoutView::new(&base_dir))["manifests"]
        .as_array()
        .unwrap()
        .clone();
    let registry = Registry::start(Auth::None);
    let base_ref = format!("{}/base/multi:v1", registry.host);
    base.run(&["push", "images/multi", &base_ref, "--insecure"])
        .success();

    for (base_name, extra) in [
        (format!("oci:{}", base_dir.display()), vec![]),
        (base_ref.clone(), vec!["--insecure"]),
    ] {
        let project = Project::new();
        project.write_recipe(&on_base_recipe(&base_name, &["linux-64", "linux-aarch64"]));
        let digest = project.build(&extra).success().digest();
        // The lock pins each platform's base manifest.
        let lock = fs_err::read_to_string(project.lock_path()).unwrap();
        let header = format!(
            "# imgbuild-base: linux-64={} linux-aarch64={}",
            base_children[0]["digest"].as_str().unwrap(),
            base_children[1]["digest"].as_str().unwrap()
        );
        assert!(lock.contains(&header), "{header} in:\n{lock}");
        // Each platform image starts with its base platform's layers.
        let layout = LayoutView::new(project.path().join("images/onbase"));
        let children = platform_index(&layout)["manifests"]
            .as_array()
            .unwrap()
            .clone();
        for (child, base_child) in children.iter().zip(&base_children) {
            assert_eq!(child["platform"], base_child["platform"]);
            let manifest = layout.json_blob(child["digest"].as_str().unwrap());
            let base_manifest =
                LayoutView::new(&base_dir).json_blob(base_child["digest"].as_str().unwrap());
            let base_layers = base_manifest["layers"].as_array().unwrap();
            assert_eq!(
                manifest["layers"].as_array().unwrap()[..base_layers.len()],
                base_layers[..]
            );
            assert_eq!(
                manifest["annotations"]["org.opencontainers.image.base.digest"],
                base_child["digest"]
            );
        }
        project
            .run(&["verify", "images/onbase", "--recipe", "recipes/image.toml"])
            .success();
        // The SBOMs list the base of each platform (the bases differ): its manifest digest,
        // and a purl with the architecture.
        let (spdx_path, cdx_path) = (
            project.path().join("images/onbase.spdx.json"),
            project.path().join("images/onbase.cdx.json"),
        );
        crate::sbom::validate_sboms(&spdx_path, &cdx_path);
        let spdx: Value =
            serde_json::from_str(&fs_err::read_to_string(&spdx_path).unwrap()).unwrap();
        let cdx: Value = serde_json::from_str(&fs_err::read_to_string(&cdx_path).unwrap()).unwrap();
        for (base_child, (subdir, arch)) in base_children
            .iter()
            .zip([("linux-64", "amd64"), ("linux-aarch64", "arm64")])
        {
            let base_digest = base_child["digest"].as_str().unwrap();
            let id = format!("SPDXRef-Base-{subdir}");
            let package = spdx["packages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["SPDXID"] == id.as_str())
                .unwrap_or_else(|| panic!("{id} in {spdx}"));
            assert_eq!(package["versionInfo"], base_digest);
            let purl = package["externalRefs"][0]["referenceLocator"]
                .as_str()
                .unwrap();
            assert!(purl.contains(&format!("?arch={arch}")), "{purl}");
            assert!(
                spdx["relationships"].as_array().unwrap().iter().any(|r| {
                    r["relationshipType"] == "DESCENDANT_OF"
                        && r["relatedSpdxElement"] == id.as_str()
                }),
                "{spdx}"
            );
            let component = cdx["components"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["purl"] == purl)
                .unwrap_or_else(|| panic!("{purl} in {cdx}"));
            assert_eq!(component["version"], base_digest);
            assert_eq!(component["type"], "container");
        }
        let mut again = vec!["--locked"];
        again.extend_from_slice(&extra);
        assert_eq!(project.build(&again).success().digest(), digest);
    }
}

#[test]
fn a_base_lacking_a_platform_is_a_clear_error() {
    let base = project(&["linux-aarch64"]);
    base.build(&[]).success();
    let project = Project::new();
    project.write_recipe(&on_base_recipe(
        &format!("oci:{}", base.path().join("images/multi").display()),
        &["linux-64", "linux-aarch64"],
    ));
    project
        .build(&[])
        .assert_failure_naming(1, &["is for linux/arm64", "linux/amd64"]);
    project.assert_no_image();
}

#[test]
fn each_platform_embeds_the_smoke_executable_built_for_it() {
    let project = Project::new();
    project.write_recipe(
        &(recipe(&["linux-64", "linux-aarch64"]).replacen(
            "platforms",
            "glibc = \"2.28\"\nplatforms",
            1,
        ) + "\n[smoke]\nembed = true\n"),
    );
    project
        .run_with(
            &["build", "recipes/image.toml"],
            &[(
                "IMGBUILD_SMOKE_EXE",
                crate::support::smoke_exe().to_str().unwrap(),
            )],
            None,
        )
        .assert_failure_naming(1, &["is for `linux-aarch64` (aarch64)", "x86-64"]);
    project.assert_no_image();
    assert!(!project.lock_path().exists(), "refused before solving");

    // With one executable per architecture, each platform's image gets its own, on top.
    let both = format!(
        "{}:{}",
        crate::support::smoke_exe().display(),
        crate::support::smoke_exe_aarch64().display()
    );
    project
        .run_with(
            &["build", "recipes/image.toml"],
            &[("IMGBUILD_SMOKE_EXE", both.as_str())],
            None,
        )
        .success();
    let layout = LayoutView::new(project.path().join("images/multi"));
    let index = platform_index(&layout);
    let manifests = index["manifests"].as_array().unwrap();
    for (entry, (machine, exe)) in manifests.iter().zip([
        (0x3e, crate::support::smoke_exe()),
        (0xb7, crate::support::smoke_exe_aarch64()),
    ]) {
        let manifest = layout.json_blob(entry["digest"].as_str().unwrap());
        assert_eq!(
            manifest["annotations"]["dev.imgbuild.smoke"],
            "/opt/imgbuild/bin/imgbuild-smoke"
        );
        let top = manifest["layers"].as_array().unwrap().last().unwrap();
        let blob = layout.blob(top["digest"].as_str().unwrap());
        let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(&blob[..]));
        let mut found = None;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.header().entry_type().is_file() {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
                found = Some((entry.path().unwrap().display().to_string(), bytes));
            }
        }
        let (path, bytes) = found.expect("the smoke layer holds a file");
        assert_eq!(path, "opt/imgbuild/bin/imgbuild-smoke");
        assert_eq!(elf_machine(&bytes), machine);
        assert!(bytes == fs_err::read(exe).unwrap());
    }
}

#[test]
fn a_matrix_of_two_platform_images_counts_the_layers_of_every_platform() {
    // Two variants that differ only in their config: every layer of both platforms is in
    // both variants, and the summary must count the arm64 layers as well as the amd64 ones.
    let project = Project::new();
    let text = recipe(&["linux-64", "linux-aarch64"]).replacen(
        "\n\n[conda]",
        "\nenv = { MODE = \"{{mode}}\" }\n\n[conda]",
        1,
    ) + "\n[matrix]\nmode = [\"train\", \"serve\"]\n";
    project.write_recipe(&text);
    let run = project.build(&["--json"]).success();
    let events: Vec<Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .collect();
    let summary = events
        .iter()
        .find(|event| event["event"] == "matrix")
        .expect("a matrix summary event")
        .clone();
    // Each variant's warnings reach the user, naming the variant: here, that the arm64
    // image was installed without running any of its code.
    for variant in ["modeserve", "modetrain"] {
        assert!(
            events.iter().any(|e| e["event"] == "warning"
                && e["variant"] == variant
                && e["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("linux-aarch64 is installed on a linux-64 build host")),
            "a warning of {variant} in {events:?}"
        );
    }

    // Each variant's distinct layer blobs over both platform manifests, from its layout.
    let mut holders: std::collections::BTreeMap<String, (u64, usize)> = Default::default();
    for variant in ["modeserve", "modetrain"] {
        let layout = LayoutView::new(project.path().join(format!("images/multi-{variant}")));
        let index = platform_index(&layout);
        let mut blobs = std::collections::BTreeMap::new();
        for entry in index["manifests"].as_array().unwrap() {
            let manifest = layout.json_blob(entry["digest"].as_str().unwrap());
            for layer in manifest["layers"].as_array().unwrap() {
                blobs.insert(
                    layer["digest"].as_str().unwrap().to_string(),
                    layer["size"].as_u64().unwrap(),
                );
            }
        }
        for (digest, size) in blobs {
            holders.entry(digest).or_insert((size, 0)).1 += 1;
        }
    }
    let total: u64 = holders.values().map(|(size, _)| size).sum();
    let shared: Vec<u64> = holders
        .values()
        .filter(|(_, n)| *n == 2)
        .map(|(size, _)| *size)
        .collect();
    // The speedups layer of each architecture is its own blob: at least three in all.
    assert!(holders.len() >= 3, "{holders:?}");
    assert_eq!(summary["layers"], holders.len(), "{summary}");
    assert_eq!(summary["bytes"], total, "{summary}");
    assert_eq!(summary["shared_layers"], shared.len(), "{summary}");
    assert_eq!(
        summary["shared_bytes"],
        shared.iter().sum::<u64>(),
        "{summary}"
    );

    // `diff --platform` compares the arm64 images of the two variants: same packages, every
    // layer shared, the manifests the indexes list for arm64.
    let arm64_manifest = |variant: &str| -> String {
        let layout = LayoutView::new(project.path().join(format!("images/multi-{variant}")));
        let index = platform_index(&layout);
        index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["platform"]["architecture"] == "arm64")
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let diff = project
        .run(&[
            "diff",
            "images/multi-modetrain",
            "images/multi-modeserve",
            "--platform",
            "linux/arm64",
            "--json",
        ])
        .success();
    let diff: Value = serde_json::from_str(&diff.stdout).unwrap();
    assert_eq!(diff["from"]["manifest_digest"], arm64_manifest("modetrain"));
    assert_eq!(diff["to"]["manifest_digest"], arm64_manifest("modeserve"));
    assert_eq!(diff["added"], serde_json::json!([]), "{diff}");
    assert_eq!(diff["changed"], serde_json::json!([]), "{diff}");
    assert_eq!(diff["new_bytes"], 0, "{diff}");
    assert!(
        diff["shared_layers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["holds"].as_str().unwrap().starts_with("speedups")),
        "{diff}"
    );
    // A platform neither image has is an error naming the platforms they have.
    project
        .run(&[
            "diff",
            "images/multi-modetrain",
            "images/multi-modeserve",
            "--platform",
            "linux/ppc64le",
        ])
        .assert_failure_naming(
            1,
            &["no manifest for linux/ppc64le; it has linux/amd64, linux/arm64/v8"],
        );
}

#[test]
fn build_platform_builds_one_of_the_recipes_platforms_and_keeps_the_whole_lock() {
    let multi = project(&["linux-64", "linux-aarch64"]);
    // `-f` names the recipe as `docker build -f` does; `-t` replaces the recipe's tags.
    let built = multi
        .run(&[
            "build",
            "-f",
            "recipes/image.toml",
            "--platform",
            "linux/arm64",
            "-t",
            "arm",
        ])
        .success();
    let layout = LayoutView::new(multi.path().join("images/multi"));
    let entries = layout.index()["manifests"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 1, "{entries:?}");
    // One platform of two: a plain manifest, as a recipe of that platform alone writes.
    assert_eq!(entries[0]["mediaType"], MANIFEST);
    assert_eq!(entries[0]["platform"]["architecture"], "arm64");
    assert_eq!(
        entries[0]["annotations"]["org.opencontainers.image.ref.name"],
        "arm"
    );
    assert!(
        built.stdout.starts_with("images/multi:arm@sha256:"),
        "{}",
        built.stdout
    );
    // The lock still holds both platforms: a build of one never drops the other's pins.
    let lock = fs_err::read_to_string(multi.lock_path()).unwrap();
    assert!(lock.contains("linux-aarch64/speedups-2.1.5-h0_0.conda"));
    assert!(
        lock.contains("linux-64/speedups-2.1.5-h0_0.conda"),
        "{lock}"
    );
    // It is the image a recipe of arm64 alone gives, digest for digest.
    let alone = project(&["linux-aarch64"]);
    let alone_digest = alone.build(&[]).success().digest();
    assert_eq!(built.digest(), alone_digest);
    // The full build afterwards reuses that lock as it is.
    let full = multi.build(&["--locked"]).success();
    let top = LayoutView::new(multi.path().join("images/multi")).index();
    assert_eq!(top["manifests"][0]["mediaType"], INDEX, "{}", full.stderr);
}

#[test]
fn build_platform_tag_and_file_are_refused_with_what_is_wrong() {
    let project = project(&["linux-64"]);
    project
        .build(&["--platform", "linux/arm64"])
        .assert_failure_naming(
            1,
            &[
                "`--platform linux-aarch64`",
                "builds linux-64, not linux-aarch64",
            ],
        );
    project
        .build(&["--platform", "windows/amd64"])
        .assert_failure_naming(2, &["`windows/amd64` is not a Linux platform"]);
    project
        .build(&["-t", "ghcr.io/me/app:v1"])
        .assert_failure_naming(2, &["is more than a tag", "--push REGISTRY/REPO:TAG"]);
    project
        .build(&["-t", ".bad"])
        .assert_failure_naming(2, &["invalid tag `.bad`"]);
    project
        .run(&["build", "recipes/image.toml", "-f", "recipes/image.toml"])
        .assert_failure_naming(2, &["cannot be used with"]);
    project
        .run(&["build"])
        .assert_failure_naming(2, &["required"]);
    project.assert_no_image();
}
