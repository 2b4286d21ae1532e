//! Every recipe shipped in `recipes/` parses and validates.

use std::path::Path;

use imgbuild::recipe::{Recipe, RecipeOptions};

#[test]
fn every_shipped_recipe_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut names = Vec::new();
    for entry in fs_err::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let recipe =
                Recipe::load(&path, &RecipeOptions::default()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                path.file_stem().unwrap().to_str().unwrap(),
                recipe.name,
                "a recipe's file is named after its image"
            );
            names.push(recipe.name);
        }
    }
    names.sort();
    assert_eq!(names, ["demo", "py39-torch21"]);

    let torch = Recipe::load(&dir.join("py39-torch21.toml"), &RecipeOptions::default()).unwrap();
    let channels: Vec<String> = torch
        .channels
        .iter()
        .map(|c| c.base_url.to_string())
        .collect();
    assert_eq!(
        channels,
        [
            "https://conda.anaconda.org/pytorch/",
            "https://conda.anaconda.org/nvidia/",
            "https://conda.anaconda.org/conda-forge/"
        ]
    );
    let specs: Vec<String> = torch.specs.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        specs,
        [
            "python 3.9.*",
            "pytorch 2.1.*",
            "pytorch-cuda 11.8.*",
            "torchvision",
            "numpy"
        ]
    );
    assert_eq!(torch.cuda.as_ref().unwrap().version.to_string(), "11.8");
}
