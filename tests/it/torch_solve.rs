//! `recipes/py39-torch21.toml` solved against the real pytorch channel index of October 2023
//! (`tests/data/conda-real/repodata/pytorch-2023-10/linux-64/repodata.json`): the
//! solve must pick pytorch 2.1.0's `py3.9_cuda11.8…` build. Each variant of
//! `recipes/torch21-matrix.toml` (Python 3.9/3.10 × CUDA 11.8/12.1) must pick its own.
//!
//! Only the pytorch channel is real. What the solution needs from elsewhere is stubbed with
//! metadata-only records (no package files; a solve reads repodata only): the nvidia
//! channel's CUDA 11.8 and 12.1 libraries that `pytorch-cuda` asks for, conda-forge's python,
//! numpy, BLAS/MKL, OpenMP, the pure-python dependencies and ffmpeg's libraries, and
//! `pytorch-mutex`, which lives in pytorch's `noarch` subdir (not part of the fixture).

use std::path::Path;

use imgbuild::{
    recipe::{Recipe, RecipeOptions},
    resolve::{Environment, ResolveError, ResolveOptions, Target, resolve_environment},
};
use rattler_conda_types::RepoDataRecord;
use serde_json::{Value, json};

use crate::support::channel::fixtures_dir;

/// (name, version, build, depends) of a stub record.
type Stub = (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

/// What `pytorch-cuda 11.8` (build h7e8668a_5) and `12.1` (ha16c6d3_5) depend on, at the
/// versions NVIDIA published for each CUDA.
const NVIDIA: &[Stub] = &[
    ("cuda-cudart", "11.8.89", "0", &[]),
    ("cuda-cupti", "11.8.87", "0", &[]),
    ("cuda-libraries", "11.8.0", "0", &[]),
    ("cuda-nvrtc", "11.8.89", "0", &[]),
    ("cuda-nvtx", "11.8.86", "0", &[]),
    ("cuda-runtime", "11.8.0", "0", &["cuda-libraries >=11.8.0"]),
    ("libcublas", "11.11.3.6", "0", &[]),
    ("libcufft", "10.9.0.58", "0", &[]),
    ("libcusolver", "11.4.1.48", "0", &[]),
    ("libcusparse", "11.7.5.86", "0", &[]),
    ("libnpp", "11.8.0.86", "0", &[]),
    ("libnvjpeg", "11.9.0.86", "0", &[]),
    // CUDA 12.1.
    ("cuda-cudart", "12.1.105", "0", &[]),
    ("cuda-cupti", "12.1.105", "0", &[]),
    ("cuda-libraries", "12.1.0", "0", &[]),
    ("cuda-nvrtc", "12.1.105", "0", &[]),
    ("cuda-nvtx", "12.1.105", "0", &[]),
    ("cuda-runtime", "12.1.0", "0", &["cuda-libraries >=12.1.0"]),
    ("libcublas", "12.1.0.26", "0", &[]),
    ("libcufft", "11.0.2.4", "0", &[]),
    ("libcusolver", "11.4.4.55", "0", &[]),
    ("libcusparse", "12.0.2.55", "0", &[]),
    ("libnpp", "12.0.2.50", "0", &[]),
    ("libnvjitlink", "12.1.105", "0", &[]),
    ("libnvjpeg", "12.1.0.39", "0", &[]),
    // CUDA 11.7, for `pytorch-cuda 11.7` (h778d358_5).
    ("cuda-cudart", "11.7.99", "0", &[]),
    ("cuda-cupti", "11.7.101", "0", &[]),
    ("cuda-libraries", "11.7.1", "0", &[]),
    ("cuda-nvrtc", "11.7.99", "0", &[]),
    ("cuda-nvtx", "11.7.91", "0", &[]),
    ("cuda-runtime", "11.7.1", "0", &["cuda-libraries >=11.7.1"]),
    ("libcublas", "11.10.3.66", "0", &[]),
    ("libcufft", "10.7.2.124", "0", &[]),
    ("libcusolver", "11.4.0.1", "0", &[]),
    ("libcusparse", "11.7.4.91", "0", &[]),
    ("libnpp", "11.7.4.75", "0", &[]),
    ("libnvjpeg", "11.8.0.2", "0", &[]),
];

const CONDA_FORGE: &[Stub] = &[
    ("python", "3.9.18", "h0755675_0_cpython", &[]),
    ("python", "3.10.13", "hd12c33a_0_cpython", &[]),
    (
        "numpy",
        "1.26.0",
        "py39h474f0d3_0",
        &["python >=3.9,<3.10.0a0"],
    ),
    (
        "numpy",
        "1.26.0",
        "py310hb13e2d6_0",
        &["python >=3.10,<3.11.0a0"],
    ),
    (
        "pyyaml",
        "6.0.1",
        "py310h2372a71_1",
        &["python >=3.10,<3.11.0a0"],
    ),
    (
        "pillow",
        "10.0.1",
        "py310h29da1c1_1",
        &["python >=3.10,<3.11.0a0"],
    ),
    ("blas", "1.0", "mkl", &["mkl"]),
    (
        "mkl",
        "2023.2.0",
        "h84fe81f_50496",
        &["llvm-openmp >=16.0.6"],
    ),
    (
        "mkl",
        "2022.2.1",
        "h84fe81f_16997",
        &["llvm-openmp >=14.0.6"],
    ),
    ("llvm-openmp", "17.0.2", "h4dfa4b3_0", &[]),
    ("llvm-openmp", "15.0.7", "h0cdce71_0", &[]),
    ("filelock", "3.12.4", "pyhd8ed1ab_0", &["python >=3.7"]),
    ("jinja2", "3.1.2", "pyhd8ed1ab_1", &["python >=3.7"]),
    ("networkx", "3.1", "pyhd8ed1ab_0", &["python >=3.8"]),
    (
        "pyyaml",
        "6.0.1",
        "py39hd1e30aa_1",
        &["python >=3.9,<3.10.0a0"],
    ),
    ("sympy", "1.12", "pypyh9d50eac_103", &["python >=3.8"]),
    (
        "typing_extensions",
        "4.8.0",
        "pyha770c72_0",
        &["python >=3.8"],
    ),
    (
        "pillow",
        "10.0.1",
        "py39h444a776_1",
        &["python >=3.9,<3.10.0a0"],
    ),
    ("requests", "2.31.0", "pyhd8ed1ab_0", &["python >=3.7"]),
    ("libpng", "1.6.39", "h753d276_0", &[]),
    ("bzip2", "1.0.8", "h7f98852_4", &[]),
    ("freetype", "2.12.1", "h267a509_2", &[]),
    ("gmp", "6.2.1", "h58526e2_0", &[]),
    ("gnutls", "3.6.13", "h85f3911_1", &[]),
    ("lame", "3.100", "h166bdaf_1003", &[]),
    ("libgcc-ng", "13.2.0", "h807b86a_2", &[]),
    ("libstdcxx-ng", "13.2.0", "h7e041cc_2", &[]),
    ("libiconv", "1.17", "h166bdaf_0", &[]),
    ("nettle", "3.4.1", "h1bed415_1002", &[]),
    ("openh264", "2.1.1", "h780b84a_0", &[]),
    ("zlib", "1.2.13", "hd590300_5", &[]),
    // Python 3.11, which `python >=3.8` solves to, and what torchvision 0.15 adds.
    ("python", "3.11.6", "hab00c5b_0_cpython", &[]),
    (
        "numpy",
        "1.26.0",
        "py311h64a7726_0",
        &["python >=3.11,<3.12.0a0"],
    ),
    (
        "pyyaml",
        "6.0.1",
        "py311h459d7ec_1",
        &["python >=3.11,<3.12.0a0"],
    ),
    (
        "pillow",
        "10.0.1",
        "py311h8aef010_1",
        &["python >=3.11,<3.12.0a0"],
    ),
    ("jpeg", "9e", "h166bdaf_2", &[]),
];

/// One repodata.json with `records`; noarch records get `noarch: python` or `generic`.
fn write_repodata(dir: &Path, subdir: &str, records: &[Value]) {
    let mut packages = serde_json::Map::new();
    for record in records {
        let file_name = format!(
            "{}-{}-{}.tar.bz2",
            record["name"].as_str().unwrap(),
            record["version"].as_str().unwrap(),
            record["build"].as_str().unwrap()
        );
        packages.insert(file_name, record.clone());
    }
    let repodata = json!({
        "info": {"subdir": subdir},
        "packages": packages,
        "packages.conda": {},
        "repodata_version": 1,
    });
    fs_err::create_dir_all(dir.join(subdir)).unwrap();
    fs_err::write(
        dir.join(subdir).join("repodata.json"),
        serde_json::to_vec(&repodata).unwrap(),
    )
    .unwrap();
}

fn stub_records(stubs: &[Stub], subdir: &str) -> Vec<Value> {
    stubs
        .iter()
        .map(|(name, version, build, depends)| {
            let noarch = build.starts_with("pyh") || build.starts_with("pypy");
            let mut record = json!({
                "name": name,
                "version": version,
                "build": build,
                "build_number": 0,
                "depends": depends,
                "subdir": if noarch { "noarch" } else { subdir },
                "license": "stub",
            });
            if noarch {
                record["noarch"] = json!("python");
            }
            record
        })
        .collect()
}

/// The channels under one directory, so the recipe's channel names resolve there through
/// the channel alias.
fn write_channels(root: &Path) {
    let fixture = fixtures_dir().join("repodata/pytorch-2023-10/linux-64/repodata.json");
    let pytorch = root.join("pytorch");
    fs_err::create_dir_all(pytorch.join("linux-64")).unwrap();
    fs_err::copy(&fixture, pytorch.join("linux-64/repodata.json"))
        .unwrap_or_else(|e| panic!("the real pytorch index {}: {e}", fixture.display()));
    // pytorch-mutex as the pytorch channel publishes it in noarch: the CPU variant carries a
    // tracked feature, so a solver prefers the CUDA variant when both fit.
    let mutex = |build: &str| {
        let mut record = json!({
            "name": "pytorch-mutex", "version": "1.0", "build": build, "build_number": 100,
            "depends": [], "subdir": "noarch", "noarch": "generic", "license": "BSD 3-Clause",
        });
        if build == "cpu" {
            record["track_features"] = json!("pytorch-mutex");
        }
        record
    };
    write_repodata(&pytorch, "noarch", &[mutex("cpu"), mutex("cuda")]);

    let nvidia = root.join("nvidia");
    write_repodata(&nvidia, "linux-64", &stub_records(NVIDIA, "linux-64"));
    write_repodata(&nvidia, "noarch", &[]);

    let conda_forge = root.join("conda-forge");
    let (noarch, linux): (Vec<Value>, Vec<Value>) = stub_records(CONDA_FORGE, "linux-64")
        .into_iter()
        .partition(|r| r["subdir"] == "noarch");
    write_repodata(&conda_forge, "linux-64", &linux);
    write_repodata(&conda_forge, "noarch", &noarch);
}

#[tokio::test(flavor = "multi_thread")]
async fn py39_torch21_picks_the_cuda_11_8_build_from_the_real_pytorch_index() {
    let root = tempfile::tempdir().unwrap();
    write_channels(root.path());
    let alias = url::Url::from_directory_path(root.path()).unwrap();
    let recipe = Recipe::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/py39-torch21.toml"),
        &RecipeOptions {
            channel_alias: alias.clone(),
            variant: None,
        },
    )
    .unwrap();
    assert!(
        recipe.channels[0]
            .base_url
            .as_str()
            .starts_with(alias.as_str()),
        "channel names resolve through the alias: {}",
        recipe.channels[0].base_url
    );
    let target = Target::for_recipe(&recipe, recipe.platforms.as_slice()[0], None);
    let cache = root.path().join("cache");
    let records = resolve_environment(
        &Environment::of(&recipe),
        &target,
        &ResolveOptions {
            cache_dir: &cache,
            offline: false,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}", imgbuild_error_chain(&e)));

    let find = |name: &str| {
        records
            .iter()
            .find(|r| r.package_record.name.as_normalized() == name)
            .unwrap_or_else(|| panic!("`{name}` is not in the solution"))
    };
    let pytorch = find("pytorch");
    assert_eq!(pytorch.package_record.version.to_string(), "2.1.0");
    assert!(
        pytorch
            .package_record
            .build
            .as_str()
            .starts_with("py3.9_cuda11.8"),
        "build {}",
        pytorch.package_record.build
    );
    assert_eq!(
        pytorch.identifier.to_string(),
        "pytorch-2.1.0-py3.9_cuda11.8_cudnn8.7.0_0.tar.bz2"
    );
    assert!(
        pytorch
            .url
            .as_str()
            .starts_with(&format!("{alias}pytorch/linux-64/"))
    );
    // Its companions from the same index, and the CUDA 11.8 stack from nvidia.
    assert_eq!(
        find("torchvision").package_record.build.as_str(),
        "py39_cu118"
    );
    assert_eq!(
        find("torchtriton").package_record.version.to_string(),
        "2.1.0"
    );
    assert_eq!(
        find("pytorch-cuda").package_record.version.to_string(),
        "11.8"
    );
    assert_eq!(find("pytorch-mutex").package_record.build.as_str(), "cuda");
    assert_eq!(find("python").package_record.version.to_string(), "3.9.18");
    assert_eq!(
        find("cuda-cudart").package_record.version.to_string(),
        "11.8.89"
    );
    assert!(
        find("cuda-cudart")
            .url
            .as_str()
            .contains("/nvidia/linux-64/")
    );
    // `llvm-openmp <16` from pytorch's record rules out conda-forge's newest.
    assert_eq!(
        find("llvm-openmp").package_record.version.to_string(),
        "15.0.7"
    );
    assert_eq!(find("blas").package_record.build.as_str(), "mkl");
}

/// `recipes/torch21-matrix.toml`: each of its four variants (Python 3.9 and 3.10 × CUDA 11.8
/// and 12.1) solves, against the same real index, to the pytorch build of its Python and CUDA,
/// with the matching torchvision and NVIDIA runtime, and a `__cuda` of its own CUDA.
#[tokio::test(flavor = "multi_thread")]
async fn torch21_matrix_solves_each_variant_to_its_python_and_cuda_build() {
    let root = tempfile::tempdir().unwrap();
    write_channels(root.path());
    let alias = url::Url::from_directory_path(root.path()).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/torch21-matrix.toml");
    let text = fs_err::read_to_string(&path).unwrap();
    let variants = imgbuild::recipe::matrix::variants(&text, &path).unwrap();
    let names: Vec<String> = variants.iter().map(|v| v.suffix()).collect();
    assert_eq!(
        names,
        [
            "cuda11.8-python3.9",
            "cuda11.8-python3.10",
            "cuda12.1-python3.9",
            "cuda12.1-python3.10"
        ]
    );
    let cache = root.path().join("cache");
    for variant in variants {
        let value = |key: &str| {
            variant
                .values
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let (python, cuda) = (value("python"), value("cuda"));
        let recipe = Recipe::load(
            &path,
            &RecipeOptions {
                channel_alias: alias.clone(),
                variant: Some(variant.clone()),
            },
        )
        .unwrap();
        assert_eq!(recipe.tags, [format!("py{python}-cuda{cuda}")]);
        let target = Target::for_recipe(&recipe, recipe.platforms.as_slice()[0], None);
        // The solver's `__cuda` is the variant's CUDA: its release driver is the default
        // min-driver.
        let virtual_cuda = target
            .virtual_packages
            .iter()
            .find(|p| p.name.as_normalized() == "__cuda")
            .unwrap();
        assert_eq!(virtual_cuda.version.to_string(), cuda);
        let records = resolve_environment(
            &Environment::of(&recipe),
            &target,
            &ResolveOptions {
                cache_dir: &cache,
                offline: false,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {}", variant.suffix(), imgbuild_error_chain(&e)));
        let find = |name: &str| {
            records
                .iter()
                .find(|r| r.package_record.name.as_normalized() == name)
                .unwrap_or_else(|| panic!("`{name}` is not in the {} solution", variant.suffix()))
        };
        let pytorch = find("pytorch");
        assert_eq!(pytorch.package_record.version.to_string(), "2.1.0");
        assert!(
            pytorch
                .package_record
                .build
                .as_str()
                .starts_with(&format!("py{python}_cuda{cuda}_")),
            "{}: pytorch build {}",
            variant.suffix(),
            pytorch.package_record.build
        );
        let short = |v: &str| v.replace('.', "");
        assert_eq!(
            find("torchvision").package_record.build.as_str(),
            format!("py{}_cu{}", short(&python), short(&cuda))
        );
        assert!(
            find("cuda-cudart")
                .package_record
                .version
                .to_string()
                .starts_with(&format!("{cuda}.")),
            "{}",
            variant.suffix()
        );
        assert!(
            find("python")
                .package_record
                .version
                .to_string()
                .starts_with(&format!("{python}.")),
            "{}",
            variant.suffix()
        );
    }
}

fn imgbuild_error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!("\n  caused by: {cause}"));
        source = cause.source();
    }
    text
}

/// The channels written under a temporary directory and a recipe for them.
struct Solve {
    root: tempfile::TempDir,
    recipe: Recipe,
}

impl Solve {
    /// `[conda]` over the pytorch, nvidia and conda-forge channels with `dependencies`,
    /// and `cuda` as the `[cuda]` section's body (none when empty).
    fn new(dependencies: &[&str], cuda: &str) -> Solve {
        let root = tempfile::tempdir().unwrap();
        write_channels(root.path());
        let alias = url::Url::from_directory_path(root.path()).unwrap();
        let mut text = format!(
            "[image]\nname = \"research\"\n[conda]\nchannels = [\"pytorch\", \"nvidia\", \"conda-forge\"]\ndependencies = {}\n",
            serde_json::to_string(dependencies).unwrap()
        );
        if !cuda.is_empty() {
            text.push_str(&format!("[cuda]\n{cuda}\n"));
        }
        let path = root.path().join("research.toml");
        fs_err::write(&path, text).unwrap();
        let recipe = Recipe::load(
            &path,
            &RecipeOptions {
                channel_alias: alias,
                variant: None,
            },
        )
        .unwrap();
        Solve { root, recipe }
    }

    async fn solve(&self) -> Result<Vec<RepoDataRecord>, ResolveError> {
        let target = Target::for_recipe(&self.recipe, self.recipe.platforms.as_slice()[0], None);
        let cache = self.root.path().join("cache");
        resolve_environment(
            &Environment::of(&self.recipe),
            &target,
            &ResolveOptions {
                cache_dir: &cache,
                offline: false,
            },
        )
        .await
    }
}

/// `name version build` of each package in `names`, from `records`.
fn locked(records: &[RepoDataRecord], names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let r = &records
                .iter()
                .find(|r| r.package_record.name.as_normalized() == *name)
                .unwrap_or_else(|| panic!("`{name}` is not in the solution"))
                .package_record;
            format!("{name} {} {}", r.version, r.build)
        })
        .collect()
}

/// Issue 16: a research repository's environment.yml specs under `[cuda] version = "11.7"`.
/// The newest pytorch (2.1.0) has no CUDA 11.7 build, and its CPU build needs no
/// `pytorch-cuda`, so a plain solve takes it beside `pytorch-cuda 11.7`. Under `[cuda]` the
/// CPU build is ruled out and 2.0.1's CUDA 11.7 build is locked.
#[tokio::test(flavor = "multi_thread")]
async fn research_specs_under_cuda_11_7_lock_a_cuda_11_7_build_not_the_cpu_one() {
    let specs = [
        "python >=3.8",
        "pytorch >=1.13",
        "torchvision",
        "pytorch-cuda=11.7",
    ];
    let solve = Solve::new(&specs, "version = \"11.7\"");
    let records = solve
        .solve()
        .await
        .unwrap_or_else(|e| panic!("{}", imgbuild_error_chain(&e)));
    let builds = locked(
        &records,
        &[
            "pytorch",
            "pytorch-mutex",
            "torchvision",
            "pytorch-cuda",
            "cuda-cudart",
        ],
    );
    assert_eq!(
        builds,
        [
            "pytorch 2.0.1 py3.11_cuda11.7_cudnn8.5.0_0",
            "pytorch-mutex 1.0 cuda",
            "torchvision 0.15.2 py311_cu117",
            "pytorch-cuda 11.7 h778d358_5",
            "cuda-cudart 11.7.99 0",
        ]
    );

    // The same specs without `[cuda]` are the silent CPU solve, which is what the
    // re-solve above had to undo.
    let plain = Solve::new(&specs, "").solve().await.unwrap();
    assert_eq!(
        locked(&plain, &["pytorch", "pytorch-mutex"]),
        ["pytorch 2.1.0 py3.11_cpu_0", "pytorch-mutex 1.0 cpu"]
    );
}

/// `[cuda] version = "12.1"` with specs of the 11.8 runtime: refused (it was a warning),
/// naming the packages of the other runtime.
#[tokio::test(flavor = "multi_thread")]
async fn cuda_12_1_with_specs_of_the_11_8_runtime_is_refused_naming_them() {
    let solve = Solve::new(
        &["python=3.9", "pytorch=2.1", "pytorch-cuda=11.8"],
        "version = \"12.1\"",
    );
    let err = solve.solve().await.unwrap_err();
    assert!(
        matches!(err, ResolveError::NoCudaSolution { .. }),
        "{}",
        imgbuild_error_chain(&err)
    );
    let text = err.to_string();
    for wanted in [
        "cannot be solved for linux-64 with the CUDA 12.1 runtime of `[cuda] version`",
        "cuda-cudart 11.8.89 0",
        "pytorch-cuda 11.8 h7e8668a_5",
    ] {
        assert!(text.contains(wanted), "{wanted} in {text}");
    }
}

/// pytorch 2.1 has no CUDA 11.7 build: under `[cuda] version = "11.7"` only its CPU build
/// would solve, and that is refused, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn a_framework_with_only_a_cpu_build_for_the_cuda_version_is_refused_naming_it() {
    let solve = Solve::new(&["python=3.11", "pytorch=2.1"], "version = \"11.7\"");
    let err = solve.solve().await.unwrap_err();
    assert!(
        matches!(err, ResolveError::CpuBuild { .. }),
        "{}",
        imgbuild_error_chain(&err)
    );
    let text = err.to_string();
    for wanted in [
        "solves only with a CPU build of a GPU framework, in an image for CUDA 11.7",
        "pytorch 2.1.0 py3.11_cpu_0 (the channels have CUDA builds of `pytorch`, but none fits the other dependencies)",
    ] {
        assert!(text.contains(wanted), "{wanted} in {text}");
    }
}
