//! Matrix builds (issue 4 part 3): a 2×2 `[matrix]` builds four images in one run, layers
//! that variants have in common are the same blobs, and the summary's shared bytes are the
//! layouts' own.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::{
    common::{LayoutView, Project},
    support::{channel::tiny_recipe, shared_channel},
};

const VARIANTS: [&str; 4] = [
    "extraother-hello1.0",
    "extraother-hello2.0",
    "extrapyhello-hello1.0",
    "extrapyhello-hello2.0",
];

fn matrix_project() -> Project {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "m", &["hello {{hello}}", "{{extra}}"])
        + "\n[matrix]\nhello = [\"1.0\", \"2.0\"]\nextra = [\"pyhello\", \"other\"]\n";
    project.write_recipe(&recipe);
    project
}

#[test]
fn two_by_two_matrix_builds_four_images_sharing_layers() {
    let project = matrix_project();
    let run = project.build(&["--json"]).success();
    let events: Vec<Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let summary = events.iter().find(|e| e["event"] == "matrix").unwrap();
    assert_eq!(
        summary["variants"].as_array().unwrap().len(),
        4,
        "{summary}"
    );

    // Four layouts, four locks, each image whole.
    let mut layers: BTreeMap<&str, Vec<(String, String)>> = BTreeMap::new();
    for variant in VARIANTS {
        let name = format!("m-{variant}");
        assert!(
            project
                .path()
                .join(format!("recipes/image.{variant}.lock"))
                .is_file(),
            "lock of {variant}"
        );
        project
            .run(&["verify", &format!("images/{name}")])
            .success();
        let layout = LayoutView::new(project.path().join("images").join(&name));
        layers.insert(variant, layout.layers());
    }

    // The same package is the same layer blob in every variant that has it.
    let layer_of = |variant: &str, package: &str| -> String {
        layers[variant]
            .iter()
            .find(|(packages, _)| packages.starts_with(package))
            .unwrap_or_else(|| panic!("{package} in {variant}: {:?}", layers[variant]))
            .1
            .clone()
    };
    let cudart: BTreeSet<String> = VARIANTS
        .iter()
        .map(|v| layer_of(v, "cuda-cudart"))
        .collect();
    assert_eq!(cudart.len(), 1, "cuda-cudart is one blob in all four");
    assert_eq!(
        layer_of("extraother-hello1.0", "hello-1.0"),
        layer_of("extrapyhello-hello1.0", "hello-1.0")
    );
    assert_eq!(
        layer_of("extrapyhello-hello1.0", "pyhello"),
        layer_of("extrapyhello-hello2.0", "pyhello")
    );
    assert_ne!(
        layer_of("extraother-hello1.0", "hello-1.0"),
        layer_of("extraother-hello2.0", "hello-2.0")
    );

    // The summary's figures, recomputed from the layouts.
    let mut count: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for variant in VARIANTS {
        let layout = LayoutView::new(project.path().join(format!("images/m-{variant}")));
        for layer in layout.manifest()["layers"].as_array().unwrap() {
            let entry = count
                .entry(layer["digest"].as_str().unwrap().to_string())
                .or_insert((layer["size"].as_u64().unwrap(), 0));
            entry.1 += 1;
        }
    }
    let shared: u64 = count
        .values()
        .filter(|(_, n)| *n >= 2)
        .map(|(s, _)| s)
        .sum();
    let total: u64 = count.values().map(|(s, _)| s).sum();
    assert!(shared > 0);
    assert_eq!(summary["shared_bytes"], shared, "{summary}");
    assert_eq!(summary["bytes"], total, "{summary}");
    assert_eq!(
        summary["shared_layers"],
        count.values().filter(|(_, n)| *n >= 2).count(),
        "{summary}"
    );
}

#[test]
fn matrix_mistakes_are_refused() {
    let project = matrix_project();
    project
        .build(&["-o", "images/one"])
        .assert_failure_naming(1, &["a matrix builds 4"]);
    let text = fs_err::read_to_string(project.recipe_path()).unwrap();
    fs_err::write(
        project.recipe_path(),
        text.replace("{{extra}}", "{{extar}}"),
    )
    .unwrap();
    project
        .build(&[])
        .assert_failure_naming(1, &["{{extar}}", "names no key of `[matrix]`"]);
    project.assert_no_image();
    // Commands that take one recipe say what to do instead of reading a placeholder.
    fs_err::write(project.recipe_path(), text).unwrap();
    project
        .run(&["sbom", "recipes/image.toml"])
        .assert_failure_naming(1, &["[matrix] of 4 variants", "imgbuild build"]);
}
