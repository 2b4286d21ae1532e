//! Every recipe shipped in `recipes/` parses and validates.

use std::path::Path;

use imgbuild::recipe::{Recipe, RecipeOptions, matrix};

#[test]
fn every_shipped_recipe_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut names = Vec::new();
    for entry in fs_err::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
            let text = fs_err::read_to_string(&path).unwrap();
            let variants = matrix::variants(&text, &path).unwrap();
            if variants.is_empty() {
                let recipe = Recipe::load(&path, &RecipeOptions::default())
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    stem, recipe.name,
                    "a recipe's file is named after its image"
                );
            }
            // A matrix recipe: every variant is a valid recipe named after the file and the
            // variant, with a tag of its own.
            let mut tags = std::collections::BTreeSet::new();
            for variant in &variants {
                let options = RecipeOptions {
                    variant: Some(variant.clone()),
                    ..RecipeOptions::default()
                };
                let recipe = Recipe::load(&path, &options).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(recipe.name, format!("{stem}-{}", variant.suffix()));
                for tag in &recipe.tags {
                    assert!(tags.insert(tag.clone()), "{stem}: tag {tag} twice");
                }
            }
            names.push(stem);
        }
    }
    names.sort();
    assert_eq!(
        names,
        [
            "demo",
            "imgbuild-builder",
            "jupyter",
            "py39-torch21",
            "torch-cpu",
            "torch-cpu-multiarch",
            "torch-cuda12",
            "torch21-matrix"
        ]
    );
    // Every recipe is documented in recipes/README.md.
    let readme = fs_err::read_to_string(dir.join("README.md")).unwrap();
    for name in &names {
        assert!(
            readme.contains(&format!("`{name}.toml`")),
            "recipes/README.md documents {name}"
        );
    }

    let multiarch = Recipe::load(
        &dir.join("torch-cpu-multiarch.toml"),
        &RecipeOptions::default(),
    )
    .unwrap();
    assert_eq!(
        multiarch.platforms.to_string(),
        "linux-64, linux-aarch64",
        "the multi-platform recipe builds both"
    );

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

/// The recipes people start from say what they promise.
#[test]
fn starter_recipes_keep_their_promises() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let load = |name: &str| {
        Recipe::load(&dir.join(format!("{name}.toml")), &RecipeOptions::default()).unwrap()
    };
    let specs =
        |recipe: &Recipe| -> Vec<String> { recipe.specs.iter().map(|s| s.to_string()).collect() };

    // conda-forge PyTorch for CUDA 12: CUDA builds only, CUDA 12.6 pinned.
    let cuda12 = load("torch-cuda12");
    assert_eq!(cuda12.channel_names, ["conda-forge"]);
    assert_eq!(cuda12.cuda.as_ref().unwrap().version.to_string(), "12.6");
    let cuda12_specs = specs(&cuda12);
    assert!(
        cuda12_specs
            .iter()
            .any(|s| s.starts_with("pytorch") && s.contains("cuda*")),
        "{cuda12_specs:?}"
    );
    assert!(
        cuda12_specs.contains(&"cuda-version 12.6.*".to_string()),
        "{cuda12_specs:?}"
    );

    // CPU only: no CUDA target, CPU builds only.
    let cpu = load("torch-cpu");
    assert!(cpu.cuda.is_none());
    let cpu_specs = specs(&cpu);
    assert!(
        cpu_specs
            .iter()
            .any(|s| s.starts_with("pytorch") && s.contains("cpu*")),
        "{cpu_specs:?}"
    );

    // Jupyter: non-root, port 8888, and nothing that turns the token off or bakes one in.
    let jupyter = load("jupyter");
    let user = jupyter.config.user.as_deref().unwrap();
    assert!(
        !user.starts_with('0') && user != "root",
        "non-root user, got {user}"
    );
    let cmd = jupyter.config.cmd.as_ref().unwrap().join(" ");
    assert!(cmd.contains("--port=8888"), "{cmd}");
    assert!(
        !cmd.to_lowercase().contains("token"),
        "no token on the command line: {cmd}"
    );
    assert!(
        !jupyter.config.env.contains_key("JUPYTER_TOKEN"),
        "no token baked into the image"
    );
    assert_eq!(jupyter.config.labels["dev.imgbuild.port"], "8888/tcp");
    assert!(specs(&jupyter).iter().any(|s| s.starts_with("jupyterlab")));
}
