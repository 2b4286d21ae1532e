//! `imgbuild inspect` and `imgbuild diff` on real images built from the test channel.

use std::path::Path;

use serde_json::Value;

use crate::{
    common::{LayoutView, Project},
    support::{base::busybox_base_layout, channel::tiny_recipe, shared_channel},
};

/// Two images in one project: `old` (hello 1.0 on scratch) and `new` (hello 2.0, pyhello
/// and the CUDA runtime on a busybox base, with a user, workdir, env and labels).
fn two_images() -> Project {
    let project = Project::new();
    let recipes = project.path().join("recipes");
    fs_err::create_dir_all(&recipes).unwrap();
    fs_err::write(
        recipes.join("old.toml"),
        tiny_recipe(shared_channel(), "old", &["hello 1.0", "_r-mutex"]),
    )
    .unwrap();

    busybox_base_layout(&project.path().join("base")).unwrap();
    let new = tiny_recipe(
        shared_channel(),
        "new",
        &["hello 2.0", "pyhello", "cuda-cudart"],
    )
    .replace(
        "base = \"scratch\"",
        "base = \"oci:../base:latest\"\nuser = \"1000:1000\"\nworkdir = \"/work\"\n\
         entrypoint = [\"/opt/conda/bin/hello\"]\ncmd = [\"--greet\"]",
    ) + "\n[image.env]\nGREETING = \"hi\"\n\n[image.labels]\n\"org.example.team\" = \"ml\"\n\n\
         [cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\"\n";
    fs_err::write(recipes.join("new.toml"), new).unwrap();

    project.run(&["build", "recipes/old.toml"]).success();
    project.run(&["build", "recipes/new.toml"]).success();
    project
}

fn json(project: &Project, args: &[&str]) -> Value {
    let run = project.run(args).success();
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}):\n{}", run.stdout))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// The packages a lock pins, as `name-version-build`, sorted.
fn locked_packages(lock: &Path) -> Vec<String> {
    let lock = imgbuild::lock::Lock::read(lock).unwrap().unwrap();
    let mut names: Vec<String> = lock
        .all_records()
        .map(|r| {
            let p = &r.package_record;
            format!("{}-{}-{}", p.name.as_normalized(), p.version, p.build)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn inspect_and_diff_describe_real_images() {
    let project = two_images();

    // inspect --json: config, CUDA needs, layers and packages, as the layout holds them.
    let new = json(&project, &["inspect", "images/new", "--json"]);
    let layout = LayoutView::new(project.path().join("images/new"));
    assert_eq!(new["image"], "images/new");
    assert_eq!(new["manifest_digest"], layout.manifest_digest());
    assert_eq!(new["architecture"], "amd64");
    assert_eq!(new["created"], layout.config()["created"]);
    assert_eq!(new["config"]["user"], "1000:1000");
    assert_eq!(new["config"]["workdir"], "/work");
    assert_eq!(
        strings(&new["config"]["entrypoint"]),
        ["/opt/conda/bin/hello"]
    );
    assert_eq!(strings(&new["config"]["cmd"]), ["--greet"]);
    assert_eq!(new["config"]["labels"]["org.example.team"], "ml");
    assert!(strings(&new["config"]["env"]).contains(&"GREETING=hi".to_string()));
    assert_eq!(new["cuda"]["version"], "11.8");
    assert_eq!(new["cuda"]["min_driver"], "520.61.05");
    assert_eq!(new["cuda"]["require_cuda"], "cuda>=11.8");
    assert_eq!(new["cuda"]["cuda_version"], "11.8.89");
    assert_eq!(new["conda"]["platform"], "linux-64");
    assert_eq!(new["conda"]["prefix"], "/opt/conda");
    assert_eq!(new["base"]["name"], "oci:../base:latest");
    assert!(
        new["base"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );

    // The layers, bottom first: the busybox base, one per package (CUDA first), image files.
    let layers = new["layers"].as_array().unwrap();
    let manifest_layers = layout.manifest()["layers"].as_array().unwrap().clone();
    assert_eq!(layers.len(), manifest_layers.len());
    for (summary, descriptor) in layers.iter().zip(&manifest_layers) {
        assert_eq!(summary["digest"], descriptor["digest"]);
        assert_eq!(summary["size"], descriptor["size"]);
    }
    assert_eq!(layers[0]["kind"], "base");
    assert_eq!(
        strings(&layers[1]["packages"]),
        ["cuda-cudart-11.8.89-h0_0"]
    );
    // With a user and a workdir, the workdir is created owned by the user in the accounts
    // layer, on top (issue 17).
    assert_eq!(layers[layers.len() - 2]["kind"], "image-files");
    assert_eq!(layers.last().unwrap()["kind"], "accounts");
    let kinds: Vec<&str> = layers.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "base").count(),
        1,
        "{kinds:?}"
    );
    let total: u64 = layers.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert_eq!(new["total_size"], total);
    // Exactly the packages of the lock.
    assert_eq!(
        strings(&new["packages"]),
        locked_packages(&project.path().join("recipes/new.lock"))
    );

    // The text form names the same things.
    let text = project
        .run(&["inspect", "images/new:latest"])
        .success()
        .stdout;
    for needle in [
        "user         1000:1000",
        "cuda         11.8 (min driver 520.61.05; NVIDIA_REQUIRE_CUDA cuda>=11.8",
        "cuda-cudart-11.8.89-h0_0",
        "hello-2.0-h0_0",
        "image files",
        "base",
    ] {
        assert!(text.contains(needle), "`{needle}` in\n{text}");
    }

    let old = json(&project, &["inspect", "images/old", "--json"]);
    // No [cuda], but hello pulls in the CUDA runtime: the image is configured as the
    // section that runtime implies (issue 16), so it states its CUDA needs too.
    assert_eq!(old["cuda"]["version"], "11.8", "{}", old["cuda"]);
    assert_eq!(old["cuda"]["min_driver"], "520.61.05");
    assert_eq!(old["base"], Value::Null, "scratch has no base");
    assert!(
        old["layers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["kind"] != "base")
    );

    // diff --json: packages by name, layers by digest, sizes.
    let diff = json(&project, &["diff", "images/old", "images/new", "--json"]);
    let names = |key: &str| -> Vec<String> {
        diff[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    let old_names: Vec<String> = strings(&old["packages"]);
    assert!(old_names.contains(&"_r-mutex-1.0.1-anacondar_1".to_string()));
    assert_eq!(names("removed"), ["_r-mutex"]);
    // hello pulls in the CUDA runtime in both images.
    assert_eq!(names("added"), ["pyhello", "python"]);
    assert_eq!(
        diff["changed"],
        serde_json::json!([{"name": "hello", "from": "1.0-h0_0", "to": "2.0-h0_0"}])
    );
    // The same cuda-cudart build at the same prefix is the same layer in both images; so is
    // the image-files layer (same files, same `created`).
    let shared = diff["shared_layers"].as_array().unwrap();
    let shared_holds: Vec<&str> = shared
        .iter()
        .map(|l| l["holds"].as_str().unwrap())
        .collect();
    assert_eq!(shared_holds, ["cuda-cudart-11.8.89-h0_0", "image files"]);
    assert_eq!(shared[0]["digest"], layers[1]["digest"]);
    let shared_bytes: u64 = shared.iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert_eq!(
        diff["new_layers"].as_array().unwrap().len(),
        layers.len() - 2
    );
    assert_eq!(
        diff["new_bytes"].as_u64().unwrap(),
        new["total_size"].as_u64().unwrap() - shared_bytes
    );
    assert_eq!(
        diff["size_delta"].as_i64().unwrap(),
        new["total_size"].as_i64().unwrap() - old["total_size"].as_i64().unwrap()
    );

    // An image against itself: everything shared, nothing new.
    let same = json(
        &project,
        &["diff", "images/new", "images/new:latest", "--json"],
    );
    assert_eq!(same["added"], serde_json::json!([]));
    assert_eq!(same["changed"], serde_json::json!([]));
    assert_eq!(same["new_bytes"], 0);
    assert_eq!(same["size_delta"], 0);
    assert_eq!(
        same["shared_layers"].as_array().unwrap().len(),
        layers.len()
    );

    let text = project
        .run(&["diff", "images/old", "images/new"])
        .success()
        .stdout;
    assert!(text.contains("~ hello 1.0-h0_0 -> 2.0-h0_0"), "{text}");
    assert!(text.contains("- _r-mutex 1.0.1-anacondar_1"), "{text}");
    assert!(text.contains("+ pyhello 1.0-pyh0_0"), "{text}");
    assert!(text.contains("layers       2 shared"), "{text}");
}

#[test]
fn a_rebuild_with_one_more_package_shares_the_unchanged_layers() {
    let project = Project::new();
    let recipes = project.path().join("recipes");
    fs_err::create_dir_all(&recipes).unwrap();
    fs_err::write(
        recipes.join("a.toml"),
        tiny_recipe(shared_channel(), "a", &["hello 1.0"]),
    )
    .unwrap();
    fs_err::write(
        recipes.join("b.toml"),
        tiny_recipe(shared_channel(), "b", &["hello 1.0", "other"]),
    )
    .unwrap();
    project.run(&["build", "recipes/a.toml"]).success();
    project.run(&["build", "recipes/b.toml"]).success();
    let diff = json(&project, &["diff", "images/a", "images/b", "--json"]);
    assert_eq!(diff["removed"], serde_json::json!([]));
    assert_eq!(diff["changed"], serde_json::json!([]));
    let shared: Vec<String> = diff["shared_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["holds"].as_str().unwrap().to_string())
        .collect();
    assert!(shared.contains(&"hello-1.0-h0_0".to_string()), "{shared:?}");
    let new_holds: Vec<&str> = diff["new_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["holds"].as_str().unwrap())
        .collect();
    assert!(
        new_holds.iter().any(|h| h.starts_with("other-1.0")),
        "{new_holds:?}"
    );
}

#[test]
fn inspect_of_a_missing_image_is_a_clean_error() {
    let project = Project::new();
    let run = project.run(&["inspect", "images/nothing"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr.contains("Cannot open image `images/nothing`"),
        "{}",
        run.stderr
    );
    let run = project.run(&["diff", "images/nothing", "images/nothing:v2"]);
    run.assert_clean_failure(1);
}

#[test]
fn diff_reports_config_changes_when_the_packages_are_the_same() {
    let project = Project::new();
    let recipes = project.path().join("recipes");
    fs_err::create_dir_all(&recipes).unwrap();
    let recipe = |name: &str| tiny_recipe(shared_channel(), name, &["hello 1.0"]);
    fs_err::write(recipes.join("plain.toml"), recipe("plain")).unwrap();
    // Same packages, but run as root with another entrypoint, env and label.
    fs_err::write(
        recipes.join("root.toml"),
        recipe("root").replace(
            "base = \"scratch\"",
            "base = \"scratch\"\nuser = \"0\"\nentrypoint = [\"/bin/sh\", \"-c\"]\ncheck-entrypoint = false",
        ) + "\n[image.env]\nMODE = \"admin\"\n\n[image.labels]\n\"org.example.role\" = \"root\"\n",
    )
    .unwrap();
    project.run(&["build", "recipes/plain.toml"]).success();
    project.run(&["build", "recipes/root.toml"]).success();

    let text = project
        .run(&["diff", "images/plain", "images/root"])
        .success()
        .stdout;
    for needle in [
        "packages     unchanged\n",
        " -> 0\n",
        "config       entrypoint: ",
        " -> [\"/bin/sh\",\"-c\"]\n",
        "config       env MODE: - -> admin\n",
        "config       label org.example.role: - -> root\n",
    ] {
        assert!(text.contains(needle), "`{needle}` in\n{text}");
    }
    assert!(text.contains("config       user: "), "{text}");

    let diff = json(&project, &["diff", "images/plain", "images/root", "--json"]);
    let fields: Vec<&str> = diff["config"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["entrypoint", "user", "env MODE", "label org.example.role"],
        "{diff}"
    );
    let user = &diff["config"][1];
    assert_eq!(user["to"], "0", "{user}");

    // An image against itself: nothing changed.
    let same = project
        .run(&["diff", "images/root", "images/root"])
        .success()
        .stdout;
    assert!(same.contains("config       unchanged\n"), "{same}");
}
