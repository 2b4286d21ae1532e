//! `imgbuild init` (starter and `--from environment.yml`), shell completions and the man page.

use imgbuild::recipe::{Recipe, RecipeOptions};

use crate::{common::Project, support::shared_channel};

#[test]
fn the_starter_recipe_parses_and_is_never_written_over() {
    let project = Project::new();
    let run = project.run(&["init", "--name", "My App"]).success();
    let recipe = Recipe::from_str_at(
        &run.stdout,
        &project.path().join("r.toml"),
        &RecipeOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", run.stdout));
    assert_eq!(recipe.name, "my-app");
    assert!(
        run.stdout.contains("# user = \"1000:1000\""),
        "{}",
        run.stdout
    );

    let path = project.path().join("app.toml");
    let run = project.run(&["init", "-o", "app.toml"]).success();
    assert_eq!(run.stdout.trim(), "app.toml");
    let written = fs_err::read_to_string(&path).unwrap();
    assert!(written.contains("name = \"app\""), "{written}");

    fs_err::write(&path, "mine").unwrap();
    let run = project.run(&["init", "-o", "app.toml"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr
            .contains("already exists; refusing to overwrite it"),
        "{}",
        run.stderr
    );
    assert_eq!(fs_err::read_to_string(&path).unwrap(), "mine");
}

/// An environment.yml as people write them (conda's docs style): a name, channels, pinned
/// versions, and a `pip:` section. The channel is the test channel, by URL; the pip index is
/// `index` (a local PEP 503/691 index).
fn environment_yml(index: &str) -> String {
    let channel = url::Url::from_file_path(shared_channel()).unwrap();
    format!(
        "\
# Environment for the hello service
name: hello-service
channels:
  - {channel}
  - nodefaults
dependencies:
  - python=3.9.18
  - hello=1.0
  - pyhello
  - cuda-cudart=11.8
  - pip:
    - --index-url {index}
    - six==1.16.0
    - -e ./src
variables:
  HELLO_MODE: production
"
    )
}

#[test]
fn an_environment_yml_becomes_a_recipe_that_builds() {
    let project = Project::new();
    let index = crate::support::pypi::SimpleIndex::serve(
        &crate::support::pypi::pinned_dists(&[crate::support::pypi::SIX_1_16_0]).unwrap(),
    )
    .unwrap();
    fs_err::write(
        project.path().join("environment.yml"),
        environment_yml(&index.url()),
    )
    .unwrap();
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    let run = project
        .run(&[
            "init",
            "--from",
            "environment.yml",
            "-o",
            "recipes/hello-service.toml",
        ])
        .success();
    // The pip section becomes [pypi]; the editable line it cannot express is reported and
    // kept in the recipe.
    assert!(
        run.stderr
            .contains("warning: 1 line of the `pip:` section cannot be expressed in a recipe"),
        "{}",
        run.stderr
    );
    let text = fs_err::read_to_string(project.path().join("recipes/hello-service.toml")).unwrap();
    assert!(
        text.contains(&format!(
            "[pypi]\nindex-url = \"{}\"\ndependencies = [\n    \"six==1.16.0\",\n]\n",
            index.url()
        )),
        "{text}"
    );
    assert!(
        text.contains("# pip = [\n#     \"-e ./src\",\n# ]"),
        "{text}"
    );

    let recipe = Recipe::load(
        &project.path().join("recipes/hello-service.toml"),
        &RecipeOptions::default(),
    )
    .unwrap();
    assert_eq!(recipe.name, "hello-service");
    let specs: Vec<String> = recipe.specs.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        specs,
        [
            "python 3.9.18.*",
            "hello 1.0.*",
            "pyhello",
            "cuda-cudart 11.8.*"
        ]
    );
    assert_eq!(recipe.config.env["HELLO_MODE"], "production");

    // It builds against the test channel, with the pinned versions, on a local base in
    // place of the Debian one init writes (no registry here), as the recipe's comment says.
    assert!(
        text.contains("base = \"docker.io/library/debian:12-slim\""),
        "{text}"
    );
    crate::support::base::busybox_base_layout(&project.path().join("base")).unwrap();
    let local = text.replace(
        "base = \"docker.io/library/debian:12-slim\"",
        &format!(
            "base = \"oci:{}:latest\"",
            project.path().join("base").display()
        ),
    );
    fs_err::write(project.path().join("recipes/hello-service.toml"), local).unwrap();
    project
        .run(&["build", "recipes/hello-service.toml"])
        .success();
    let summary: serde_json::Value = serde_json::from_str(
        &project
            .run(&["inspect", "images/hello-service", "--json"])
            .success()
            .stdout,
    )
    .unwrap();
    let packages: Vec<&str> = summary["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    for expected in [
        "python-3.9.18-h0_0",
        "hello-1.0-h0_0",
        "pyhello-1.0-pyh0_0",
        "cuda-cudart-11.8.89-h0_0",
        "pypi:six-1.16.0",
    ] {
        assert!(packages.contains(&expected), "{expected} in {packages:?}");
    }
    assert!(
        summary["config"]["env"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("HELLO_MODE=production"))
    );
}

#[test]
fn a_broken_environment_yml_is_a_clean_error() {
    let project = Project::new();
    fs_err::write(
        project.path().join("environment.yml"),
        "dependencies:\n  - 'numpy >>= 1'\n",
    )
    .unwrap();
    let run = project.run(&["init", "--from", "environment.yml"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr
            .contains("`environment.yml` is not a valid conda environment file"),
        "{}",
        run.stderr
    );
    let run = project.run(&["init", "--from", "missing.yml"]);
    run.assert_clean_failure(1);
}

/// What `init --from` makes of one of the real environment files in
/// `tests/data/environment-yml/` (their origin is in its MANIFEST.md).
struct Converted {
    recipe: Recipe,
    stderr: String,
}

fn convert_real(file: &str) -> Converted {
    let project = Project::new();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/environment-yml")
        .join(file);
    let run = project
        .run(&["init", "--from", path.to_str().unwrap()])
        .success();
    let recipe = Recipe::from_str_at(
        &run.stdout,
        &project.path().join("r.toml"),
        &RecipeOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{file}: {e}\n{}", run.stdout));
    Converted {
        recipe,
        stderr: run.stderr,
    }
}

impl Converted {
    fn cuda(&self) -> Option<String> {
        self.recipe.cuda.as_ref().map(|c| c.version.to_string())
    }

    fn platforms(&self) -> Vec<String> {
        self.recipe
            .platforms
            .iter()
            .map(|p| p.to_string())
            .collect()
    }

    fn warned(&self, text: &str) -> bool {
        self.stderr
            .lines()
            .any(|line| line.starts_with("warning: ") && line.contains(text))
    }
}

const MAIN: &str = "https://repo.anaconda.com/pkgs/main";
const R: &str = "https://repo.anaconda.com/pkgs/r";

#[test]
fn real_environment_files_keep_their_cuda() {
    // `cudatoolkit =11.0` (conda-lock's test), `cuda-version=11.8` beside an unversioned
    // `cudatoolkit` (cuDF's), `pytorch::pytorch-cuda=11.7.0` (DINOv2's).
    let cudatoolkit = convert_real("conda-lock-test-cuda.yml");
    assert_eq!(cudatoolkit.cuda().as_deref(), Some("11.0"));
    assert_eq!(cudatoolkit.recipe.channel_names, ["conda-forge", MAIN, R]);

    let cudf = convert_real("cudf-all_cuda-118_arch-x86_64.yaml");
    assert_eq!(cudf.cuda().as_deref(), Some("11.8"));
    assert_eq!(
        cudf.recipe.channel_names,
        [
            "rapidsai",
            "rapidsai-nightly",
            "dask/label/dev",
            "conda-forge",
            "nvidia",
            MAIN,
            R
        ]
    );
    assert_eq!(cudf.platforms(), ["linux-64"]);
    assert_eq!(cudf.recipe.name, "all_cuda-118_arch-x86_64");
    assert!(
        cudf.warned("the file's channels do not list `nodefaults`, so conda also searches its `defaults` channels"),
        "{}",
        cudf.stderr
    );

    let dinov2 = convert_real("dinov2-conda.yaml");
    assert_eq!(dinov2.cuda().as_deref(), Some("11.7"));
    assert_eq!(
        dinov2.recipe.channel_names,
        [MAIN, R, "pytorch", "nvidia", "xformers", "conda-forge"],
        "`defaults` is Anaconda's main and r, where the file lists it"
    );
    assert!(
        dinov2.warned("channel `defaults` names Anaconda's repositories"),
        "{}",
        dinov2.stderr
    );
}

#[test]
fn real_environment_files_keep_their_channels_and_platforms() {
    let nodefaults = convert_real("conda-lock-test-env-nodefaults.yml");
    assert_eq!(nodefaults.recipe.channel_names, ["conda-forge"]);
    assert_eq!(nodefaults.cuda(), None);
    assert_eq!(nodefaults.stderr, "", "nothing to warn about");

    let platforms = convert_real("conda-lock-test-env-filter-platform.yml");
    assert_eq!(platforms.platforms(), ["linux-64"]);
    assert!(
        platforms.warned("`platforms:` `osx-arm64`, `osx-64` are not Linux"),
        "{}",
        platforms.stderr
    );
    assert!(
        platforms.warned("`clang_osx-arm64`, `clang_osx-64` are for macOS or Windows"),
        "{}",
        platforms.stderr
    );
    assert!(
        platforms.warned("3 dependencies have a platform selector comment"),
        "{}",
        platforms.stderr
    );

    // Exported on macOS: `libcxx` gives it away.
    let diffdock = convert_real("diffdock-environment.yml");
    assert_eq!(diffdock.recipe.channel_names, ["conda-forge", MAIN, R]);
    assert_eq!(diffdock.cuda(), None);
    assert!(
        diffdock.warned("`libcxx 14.0.6.*` is for macOS or Windows"),
        "{}",
        diffdock.stderr
    );
}

#[test]
fn unknown_top_level_keys_are_named() {
    let project = Project::new();
    fs_err::write(
        project.path().join("environment.yml"),
        "name: x\nchannels: [conda-forge, nodefaults]\ndependencies: [python=3.11]\nchannel_alias: https://mirror.example/anaconda\nshow_channel_urls: true\n",
    )
    .unwrap();
    let run = project
        .run(&["init", "--from", "environment.yml"])
        .success();
    assert!(
        run.stderr.contains("warning: top-level keys `channel_alias`, `show_channel_urls` of environment.yml: not environment-file keys imgbuild reads; left out"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("pass it as `imgbuild --channel-alias URL`"),
        "{}",
        run.stderr
    );
}

const SUBCOMMANDS: &[&str] = &[
    "build",
    "lock",
    "smoke",
    "inspect",
    "diff",
    "sbom",
    "init",
    "completions",
    "man",
];

#[test]
fn completions_and_man_page_name_every_subcommand() {
    let project = Project::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = project.run(&["completions", shell]).success().stdout;
        for subcommand in SUBCOMMANDS {
            assert!(out.contains(subcommand), "{shell}: `{subcommand}` missing");
        }
    }
    let bash = project.run(&["completions", "bash"]).success().stdout;
    assert!(bash.contains("complete -F _imgbuild"), "{bash}");
    assert!(
        bash.contains("--channel-alias"),
        "global flags complete too"
    );

    let man = project.run(&["man"]).success().stdout;
    assert!(man.contains(".TH imgbuild 1"), "{man}");
    for subcommand in SUBCOMMANDS {
        assert!(
            man.contains(&format!(
                "\\fBimgbuild {}\\fR",
                subcommand.replace('-', "\\-")
            )),
            "man: `{subcommand}` missing\n{man}"
        );
    }
    // No page is generated per subcommand, so none is referred to (`imgbuild-build(1)`).
    assert!(!man.contains("(1)"), "{man}");
    assert!(man.contains("\\fB\\-\\-help\\fR shows"), "{man}");
    let run = project.run(&["completions", "tcsh"]);
    assert_eq!(run.code, 2, "clap rejects an unknown shell");
}
