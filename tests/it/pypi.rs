//! `[pypi]` (issue 9): wheels from a local PEP 503/691 index (real wheels from PyPI, pinned
//! by sha256), resolved for the image's Python (the venv `python` 3.9.2 conda package over
//! Debian bullseye's python3.9), locked beside the conda packages, installed into the
//! environment's site-packages and layered above the conda packages.

use std::path::Path;

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, require_root, run_bundle_output, unpack, validate_layout},
    support::{
        channel::{CUDA_RUNTIME_11_8, NVRTC_11_8, tiny_recipe},
        pypi::{
            DATEUTIL_2_9_0_POST0, PYFLAKES_3_4_0, SIX_1_16_0, SimpleIndex, bullseye_python_base,
            pinned_dists, pypi_channel, write_sdist,
        },
        test_cache_dir,
    },
};

/// A project on the bullseye-python base whose conda environment is `conda` from the PyPI
/// test channel and whose `[pypi]` section asks `pypi` from `index`.
fn project(name: &str, conda: &[&str], pypi: &[&str], index: &SimpleIndex) -> Project {
    let project = Project::new();
    bullseye_python_base(&project.path().join("base"), &test_cache_dir()).unwrap();
    let quote = |s: &str| serde_json::to_string(s).unwrap();
    let pypi: Vec<String> = pypi.iter().map(|r| quote(r)).collect();
    let recipe = tiny_recipe(pypi_channel(), name, conda)
        .replace("base = \"scratch\"", "base = \"oci:../base\"")
        + &format!(
            "\n[pypi]\nindex-url = {}\ndependencies = [{}]\n",
            quote(&index.url()),
            pypi.join(", ")
        );
    project.write_recipe(&recipe);
    project
}

fn index_of(wheels: &[crate::support::channel::PinnedWheel]) -> SimpleIndex {
    SimpleIndex::serve(&pinned_dists(wheels).unwrap()).unwrap()
}

/// The PyPI packages of the lock: `(name, version, url)`.
fn locked_wheels(project: &Project) -> Vec<(String, String, String)> {
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_str(
        &lock
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    yaml["packages"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let url = p["pypi"].as_str()?;
            assert!(
                p["sha256"].as_str().is_some_and(|s| s.len() == 64),
                "every wheel is pinned by sha256: {p:?}"
            );
            Some((
                p["name"].as_str().unwrap().to_string(),
                p["version"].as_str().unwrap().to_string(),
                url.to_string(),
            ))
        })
        .collect()
}

/// The layer annotations `dev.imgbuild.layer.packages`, bottom first (base layers: none).
fn layer_packages(layout: &LayoutView) -> Vec<String> {
    layout.manifest()["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["annotations"]["dev.imgbuild.layer.packages"].as_str())
        .map(str::to_string)
        .collect()
}

/// Runs `args` in the image under runc; `None` when runc cannot run here.
fn run_in_image(project: &Project, image: &str, args: &[&str]) -> Option<(i32, String, String)> {
    require_root!("runc needs root here", None);
    let bundle = project.path().join(format!("bundle-{}", args.len()));
    unpack(
        &project.path().join("images").join(image),
        "latest",
        &bundle,
    );
    let output = run_bundle_output(&bundle, image, Some(args));
    Some((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

#[test]
fn six_from_a_local_index_is_locked_installed_and_imported_in_the_image() {
    let index = index_of(&[SIX_1_16_0, PYFLAKES_3_4_0]);
    let project = project("pysix", &["python"], &["six", "pyflakes==3.4.*"], &index);
    project.build(&[]).success();

    // Locked by URL and sha256 in the same lock as the conda packages.
    let wheels = locked_wheels(&project);
    let names: Vec<&str> = wheels
        .iter()
        .map(|(n, v, _)| (n.as_str(), v.as_str()))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["pyflakes", "six"], "{wheels:?}");
    assert!(
        wheels
            .iter()
            .all(|(_, _, url)| url.starts_with(&index.base_url().to_string()))
    );
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(
        lock.contains("pypi-indexes") || lock.contains("indexes:"),
        "{lock}"
    );

    let layout = LayoutView::new(project.path().join("images/pysix"));
    validate_layout(project.path().join("images/pysix").to_str().unwrap());
    // Each wheel its own layer, above the conda packages, below the image's own files.
    let packages = layer_packages(&layout);
    let first_wheel = packages
        .iter()
        .position(|p| p.starts_with("pypi:"))
        .unwrap();
    assert!(
        packages[..first_wheel].iter().all(|p| !p.contains("pypi:")),
        "{packages:?}"
    );
    assert_eq!(
        &packages[first_wheel..],
        ["pypi:pyflakes-3.4.0", "pypi:six-1.16.0"],
        "{packages:?}"
    );
    let history: Vec<String> = layout.config()["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["created_by"].as_str().map(str::to_string))
        .collect();
    assert!(
        history.iter().any(|h| h == "imgbuild: pypi six-1.16.0"),
        "{history:?}"
    );

    project
        .run(&["verify", "images/pysix", "--recipe", "recipes/image.toml"])
        .success();
    // Both SBOMs list the wheels with their purl and sha256.
    for sbom in ["images/pysix.spdx.json", "images/pysix.cdx.json"] {
        let text = fs_err::read_to_string(project.path().join(sbom)).unwrap();
        assert!(
            text.contains("pkg:pypi/six@1.16.0?file_name=six-1.16.0-py2.py3-none-any.whl"),
            "{sbom}"
        );
        assert!(text.contains(SIX_1_16_0.sha256), "{sbom}");
    }
    crate::sbom::validate_sboms(
        &project.path().join("images/pysix.spdx.json"),
        &project.path().join("images/pysix.cdx.json"),
    );

    let Some((code, stdout, stderr)) = run_in_image(
        &project,
        "pysix",
        &[
            "/opt/conda/bin/python",
            "-c",
            "import six, importlib.metadata as m; d = m.distribution('six'); \
             print(six.__version__, six.__file__, d.read_text('INSTALLER').strip(), len(d.files), d.read_text('REQUESTED') is not None)",
        ],
    ) else {
        return;
    };
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "1.16.0 /opt/conda/lib/python3.9/site-packages/six.py imgbuild 8 True",
        "{stderr}"
    );
    // The console script runs with the in-image Python.
    let rootfs = project.path().join("bundle-3/rootfs");
    let script = fs_err::read_to_string(rootfs.join("opt/conda/bin/pyflakes")).unwrap();
    assert!(
        script.starts_with("#!/opt/conda/bin/python3.9\n"),
        "{script}"
    );
    let (code, stdout, stderr) =
        run_in_image(&project, "pysix", &["/opt/conda/bin/pyflakes", "--version"]).unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.starts_with("3.4.0 "), "{stdout}");
}

#[test]
fn a_distribution_conda_provides_is_not_installed_again_from_pypi() {
    let index = index_of(&[SIX_1_16_0, DATEUTIL_2_9_0_POST0]);
    // conda's six and python-dateutil's `six >=1.5`, plus an explicit `six` from PyPI.
    let project = project(
        "pyonce",
        &["python", "six"],
        &["python-dateutil==2.9.0.post0", "six>=1.10"],
        &index,
    );
    project.build(&[]).success();

    let wheels = locked_wheels(&project);
    assert_eq!(
        wheels
            .iter()
            .map(|(n, v, _)| format!("{n} {v}"))
            .collect::<Vec<_>>(),
        ["python-dateutil 2.9.0.post0"]
    );
    // The conda record says what it provides, as pixi writes it.
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("pkg:pypi/six@1.16.0"), "{lock}");
    // six's wheel was never fetched; the dateutil wheel once at most.
    assert_eq!(index.downloads(SIX_1_16_0.file_name), 0);

    let layout = LayoutView::new(project.path().join("images/pyonce"));
    let packages = layer_packages(&layout);
    assert!(
        !packages.iter().any(|p| p.contains("pypi:six")),
        "{packages:?}"
    );
    assert!(
        packages
            .iter()
            .any(|p| p == "pypi:python_dateutil-2.9.0.post0"),
        "{packages:?}"
    );

    // A rebuild from the lock is a no-op, and another project building the same lock
    // elsewhere gets the same image.
    let digest = layout.manifest_digest();
    let again = Project::new();
    bullseye_python_base(&again.path().join("base"), &test_cache_dir()).unwrap();
    again.write_recipe(&fs_err::read_to_string(project.recipe_path()).unwrap());
    fs_err::copy(project.lock_path(), again.lock_path()).unwrap();
    again.build(&["--locked"]).success();
    assert_eq!(
        LayoutView::new(again.path().join("images/pyonce")).manifest_digest(),
        digest
    );

    let Some((code, stdout, stderr)) = run_in_image(
        &project,
        "pyonce",
        &[
            "/opt/conda/bin/python",
            "-c",
            "import importlib.metadata as m, dateutil.parser as p; \
             print(sorted((d.metadata['Name'], d.read_text('INSTALLER').strip()) for d in m.distributions()), p.parse('2024-01-02').year)",
        ],
    ) else {
        return;
    };
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "[('python-dateutil', 'imgbuild'), ('six', 'conda')] 2024"
    );
}

#[test]
fn every_requirement_with_only_source_distributions_is_named_in_one_error() {
    // `six<1.16` has only an sdist in range though 1.16.0 has a wheel; `sdist-only` has no
    // wheel at all. A newcomer used to meet them one build at a time.
    let dir = tempfile::tempdir().unwrap();
    let mut dists = pinned_dists(&[SIX_1_16_0]).unwrap();
    dists.push((
        write_sdist(dir.path(), "six", "1.15.0").unwrap(),
        "six".to_string(),
    ));
    dists.push((
        write_sdist(dir.path(), "sdist-only", "1.0").unwrap(),
        "sdist-only".to_string(),
    ));
    let index = SimpleIndex::serve(&dists).unwrap();
    let project = project("pysdists", &["python"], &["six<1.16", "sdist-only"], &index);
    let run = project.build(&[]);
    run.assert_failure_naming(
        1,
        &[
            "2 requirements have no wheel for this image:",
            "- `six`: only source distributions (six-1.15.0.tar.gz); versions with a wheel for this image: 1.16.0",
            "- `sdist-only`: only source distributions (sdist_only-1.0.tar.gz); no version has a wheel for this image",
            "run its code on the build host: pin versions that have wheels",
        ],
    );
    project.assert_no_image();
    assert_eq!(index.downloads("six-1.15.0.tar.gz"), 0, "never downloaded");
}

#[test]
fn a_requirement_with_only_a_source_distribution_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let sdist = write_sdist(dir.path(), "sdist-only", "1.0").unwrap();
    let mut dists = pinned_dists(&[SIX_1_16_0]).unwrap();
    dists.push((sdist, "sdist-only".to_string()));
    let index = SimpleIndex::serve(&dists).unwrap();
    let project = project("pysdist", &["python"], &["six", "sdist-only"], &index);
    let run = project.build(&[]);
    run.assert_failure_naming(
        1,
        &[
            "`sdist-only` has no wheel for this image, only source distributions (sdist_only-1.0.tar.gz)",
            "run its code on the build host",
        ],
    );
    project.assert_no_image();
    assert!(!project.lock_path().exists(), "no lock for a failed solve");
    assert_eq!(
        index.downloads("sdist_only-1.0.tar.gz"),
        0,
        "never downloaded"
    );
}

#[test]
fn nvidia_runtime_wheels_get_their_own_layers_and_smoke_finds_their_libraries() {
    let index = index_of(&[CUDA_RUNTIME_11_8, NVRTC_11_8]);
    let project = project(
        "pycuda",
        &["python"],
        &[
            "nvidia-cuda-runtime-cu11==11.8.89",
            "nvidia-cuda-nvrtc-cu11==11.8.89",
        ],
        &index,
    );
    let recipe = fs_err::read_to_string(project.recipe_path()).unwrap();
    project.write_recipe(&format!(
        "{recipe}\n[cuda]\nversion = \"11.8\"\nmin-driver = \"520.61.05\"\n"
    ));
    project.build(&[]).success();
    let layout = LayoutView::new(project.path().join("images/pycuda"));
    let packages = layer_packages(&layout);
    let wheel_layers: Vec<&String> = packages.iter().filter(|p| p.starts_with("pypi:")).collect();
    assert_eq!(
        wheel_layers,
        [
            "pypi:nvidia_cuda_nvrtc_cu11-11.8.89",
            "pypi:nvidia_cuda_runtime_cu11-11.8.89"
        ],
        "one layer each: {packages:?}"
    );

    // The image config names the runtime the wheels installed, as for conda's cudart.
    let config = layout.config();
    let env = crate::common::env_of(&config);
    assert!(env.contains(&"CUDA_VERSION=11.8.89"), "{env:?}");

    let run = project.run(&["smoke", "images/pycuda", "--json"]);
    if Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!("a driver is present: the no-driver expectation does not apply");
        return;
    }
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let libraries: Vec<&str> = report["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for wanted in [
        "opt/conda/lib/python3.9/site-packages/nvidia/cuda_runtime/lib/libcudart.so.11.0",
        "opt/conda/lib/python3.9/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2",
    ] {
        assert!(libraries.contains(&wanted), "{wanted} in {libraries:?}");
    }
}

#[test]
fn a_cuda_runtime_wheel_the_recipes_min_driver_cannot_run_is_refused_before_locking() {
    let index = index_of(&[CUDA_RUNTIME_11_8]);
    let project = project(
        "pycuda",
        &["python"],
        &["nvidia-cuda-runtime-cu11==11.8.89"],
        &index,
    );
    let recipe = fs_err::read_to_string(project.recipe_path()).unwrap();

    // `[cuda] version = "11.0"` on its release driver 450.36.06, but the wheel is CUDA 11.8,
    // which needs at least 11.x's minor-version floor 450.80.02.
    project.write_recipe(&format!(
        "{recipe}\n[cuda]\nversion = \"11.0\"\nmin-driver = \"450.36.06\"\n"
    ));
    project.build(&[]).assert_failure_naming(
        1,
        &[
            "The environment's CUDA runtime is 11.8 (nvidia-cuda-runtime-cu11 11.8.89), not the recipe's `[cuda] version` 11.0",
            "cannot run on `min-driver` 450.36.06: it needs driver 450.80.02 or newer",
        ],
    );
    project.assert_no_image();
    assert!(
        !project.lock_path().exists(),
        "no lock for a refused runtime"
    );

    // On 11.4's driver the 11.8 wheel would run through minor-version compatibility, but it
    // is not the runtime `[cuda] version` names (issue 16): refused too, pointing at
    // `compat`.
    project.write_recipe(&format!(
        "{recipe}\n[cuda]\nversion = \"11.4\"\nmin-driver = \"470.42.01\"\n"
    ));
    project.build(&[]).assert_failure_naming(
        1,
        &[
            "The environment's CUDA runtime is 11.8 (nvidia-cuda-runtime-cu11 11.8.89), not the recipe's `[cuda] version` 11.4",
            "set `[cuda] compat = true`",
        ],
    );
    project.assert_no_image();
    assert!(
        !project.lock_path().exists(),
        "no lock for a refused runtime"
    );
}

/// A channel holding `python` 3.9.2 for linux-64 and linux-aarch64 with no files: enough to
/// solve and lock, since nothing of the target runs at build time.
fn two_platform_python_channel(dir: &Path) {
    use crate::support::channel::{file, index_channel, linux64_index, write_package};
    for (subdir, arch) in [("linux-64", "x86_64"), ("linux-aarch64", "aarch64")] {
        let out = dir.join(subdir);
        fs_err::create_dir_all(&out).unwrap();
        let mut index = linux64_index("python", "3.9.2", &["__glibc >=2.17"]);
        index["subdir"] = subdir.into();
        index["arch"] = arch.into();
        write_package(
            &out.join("python-3.9.2-h0_0.conda"),
            index,
            &[file(
                "lib/python3.9/site-packages/README.txt",
                "site-packages\n",
            )],
            None,
        )
        .unwrap();
    }
    fs_err::create_dir_all(dir.join("noarch")).unwrap();
    index_channel(dir).unwrap();
}

/// The bytes of `path` in the first layer of `manifest` that has it.
fn file_in_layers(layout: &LayoutView, manifest: &Value, path: &str) -> Vec<u8> {
    use std::io::Read;
    for layer in manifest["layers"].as_array().unwrap() {
        let blob = layout.blob(layer["digest"].as_str().unwrap());
        let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(&blob[..]));
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.path().unwrap().to_str() == Some(path) {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).unwrap();
                return bytes;
            }
        }
    }
    panic!("{path} is in no layer");
}

#[test]
fn an_x86_64_host_locks_and_installs_the_aarch64_wheel_for_the_arm64_image() {
    use crate::support::pypi::{MARKUPSAFE_CP39_AARCH64, MARKUPSAFE_CP39_X86_64};
    let index = index_of(&[MARKUPSAFE_CP39_X86_64, MARKUPSAFE_CP39_AARCH64]);
    let project = Project::new();
    let channel = project.path().join("channel");
    two_platform_python_channel(&channel);
    let recipe = tiny_recipe(&channel, "pyarm", &["python"]).replace(
        "platforms = [\"linux-64\"]",
        "platforms = [\"linux-64\", \"linux-aarch64\"]\nglibc = \"2.28\"",
    ) + &format!(
        "\n[pypi]\nindex-url = \"{}\"\ndependencies = [\"markupsafe==2.1.5\"]\n",
        index.url()
    );
    project.write_recipe(&recipe);
    project.build(&[]).success();

    // One lock, each platform pinned to its own wheel.
    let mut urls: Vec<String> = locked_wheels(&project)
        .into_iter()
        .map(|(_, _, u)| u)
        .collect();
    urls.sort();
    assert_eq!(urls.len(), 2, "{urls:?}");
    assert!(
        urls[0].ends_with(MARKUPSAFE_CP39_AARCH64.file_name),
        "{urls:?}"
    );
    assert!(
        urls[1].ends_with(MARKUPSAFE_CP39_X86_64.file_name),
        "{urls:?}"
    );

    // Each platform's image holds the extension built for its CPU.
    let layout = LayoutView::new(project.path().join("images/pyarm"));
    let top = layout.index();
    let platform_index = layout.json_blob(top["manifests"][0]["digest"].as_str().unwrap());
    let so =
        "opt/conda/lib/python3.9/site-packages/markupsafe/_speedups.cpython-39-{}-linux-gnu.so";
    for (entry, (arch, machine)) in platform_index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .zip([("x86_64", 0x3Eu16), ("aarch64", 0xB7)])
    {
        let manifest = layout.json_blob(entry["digest"].as_str().unwrap());
        let bytes = file_in_layers(&layout, &manifest, &so.replace("{}", arch));
        assert_eq!(&bytes[..4], b"\x7fELF");
        assert_eq!(
            u16::from_le_bytes([bytes[18], bytes[19]]),
            machine,
            "{arch}"
        );
    }
    project
        .run(&["verify", "images/pyarm", "--recipe", "recipes/image.toml"])
        .success();

    // Changing the PyPI requirements makes the lock stale, and `--locked` says why.
    project
        .write_recipe(&recipe.replace("\"markupsafe==2.1.5\"", "\"markupsafe==2.1.5\", \"six\""));
    project.build(&["--locked"]).assert_failure_naming(
        1,
        &["the recipe needs the PyPI package `six`, which is not locked"],
    );
}

#[test]
fn a_directory_of_wheels_is_enough_with_no_index() {
    let project = Project::new();
    let wheels = project.path().join("recipes/wheels");
    fs_err::create_dir_all(&wheels).unwrap();
    for (path, _) in pinned_dists(&[SIX_1_16_0, DATEUTIL_2_9_0_POST0]).unwrap() {
        fs_err::copy(&path, wheels.join(path.file_name().unwrap())).unwrap();
    }
    let recipe = tiny_recipe(pypi_channel(), "pywheels", &["python"])
        + "\n[pypi]\nno-index = true\nfind-links = [\"wheels\"]\ndependencies = [\"python-dateutil\"]\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let locked: Vec<String> = locked_wheels(&project)
        .into_iter()
        .map(|(name, version, location)| {
            // Relative to the lock, so the project can move.
            assert!(location.starts_with("wheels/"), "{location}");
            format!("{name} {version}")
        })
        .collect();
    assert_eq!(locked, ["python-dateutil 2.9.0.post0", "six 1.16.0"]);
    let layout = LayoutView::new(project.path().join("images/pywheels"));
    let packages = layer_packages(&layout);
    assert!(
        packages.contains(&"pypi:six-1.16.0".to_string()),
        "{packages:?}"
    );

    // The project copied elsewhere builds from its lock to the same image.
    let moved = Project::new();
    let copy = |from: &Path, to: &Path| {
        fs_err::create_dir_all(to).unwrap();
        for entry in fs_err::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                fs_err::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    };
    copy(
        &project.path().join("recipes"),
        &moved.path().join("recipes"),
    );
    copy(&wheels, &moved.path().join("recipes/wheels"));
    moved.build(&["--locked"]).success();
    assert_eq!(
        LayoutView::new(moved.path().join("images/pywheels")).manifest_digest(),
        layout.manifest_digest()
    );

    // Without the directory, or with an index as well, the recipe says what is wrong.
    project.write_recipe(&recipe.replace("find-links = [\"wheels\"]\n", ""));
    project
        .build(&[])
        .assert_failure_naming(1, &["`no-index = true` needs `find-links`"]);
}

#[test]
fn a_yanked_wheel_on_a_find_links_page_is_taken_only_when_pinned() {
    // An HTML page of links (pip's `--find-links URL`) marking its one six wheel yanked.
    let project = Project::new();
    let site = project.path().join("site");
    fs_err::create_dir_all(&site).unwrap();
    let (wheel, _) = pinned_dists(&[SIX_1_16_0]).unwrap().remove(0);
    fs_err::copy(&wheel, site.join(SIX_1_16_0.file_name)).unwrap();
    fs_err::write(
        site.join("links.html"),
        format!(
            "<html><body><a href=\"{0}#sha256={1}\" data-yanked=\"a broken build\">{0}</a></body></html>",
            SIX_1_16_0.file_name, SIX_1_16_0.sha256
        ),
    )
    .unwrap();
    let server = crate::common::FileServer::serve(site);
    let recipe = |requirement: &str| {
        tiny_recipe(pypi_channel(), "pyyanked", &["python"])
            + &format!(
                "\n[pypi]\nno-index = true\nfind-links = [\"{}/links.html\"]\ndependencies = [\"{requirement}\"]\n",
                server.url.trim_end_matches('/')
            )
    };
    project.write_recipe(&recipe("six"));
    project.build(&[]).assert_failure_naming(
        1,
        &["`six` has no version that fits but 1.16.0, which its index marks yanked; pin it with `==1.16.0`"],
    );
    project.assert_no_image();

    project.write_recipe(&recipe("six==1.16.0"));
    project.build(&[]).success();
    let locked = locked_wheels(&project);
    assert_eq!(locked.len(), 1);
    assert!(locked[0].2.ends_with(SIX_1_16_0.file_name), "{locked:?}");
}

#[test]
fn offline_builds_need_a_lock_for_their_pypi_part() {
    let index = index_of(&[SIX_1_16_0]);
    let project = project("pyoffline", &["python"], &["six"], &index);
    project.build(&[]).success();
    let served = index.log().len();

    // From its lock, an offline rebuild needs nothing from the index.
    fs_err::remove_dir_all(project.path().join("images")).unwrap();
    project.build(&["--offline"]).success();
    assert_eq!(index.log().len(), served, "nothing asked of the index");

    // Without it, the PyPI part cannot be resolved offline, and the build says so.
    fs_err::remove_file(project.lock_path()).unwrap();
    fs_err::remove_dir_all(project.path().join("images")).unwrap();
    project.build(&["--offline"]).assert_failure_naming(
        1,
        &[
            "must be resolved",
            "not possible with `--offline`",
            "run `imgbuild lock` online once",
        ],
    );
    assert_eq!(index.log().len(), served);
    project.assert_no_image();
    assert!(
        !project.lock_path().exists(),
        "no lock from a failed offline solve"
    );
}

#[test]
fn a_pypi_requirement_conda_cannot_meet_is_explained_with_the_conda_package() {
    let index = index_of(&[SIX_1_16_0]);
    let project = project("pyclash", &["python", "six"], &["six>=1.17"], &index);
    let run = project.build(&[]);
    run.assert_failure_naming(
        1,
        &[
            "The PyPI requirements cannot be met",
            "there is no version of six in >=1.17",
            "note: six 1.16.0 is provided by the conda package six-1.16.0-py39_0",
        ],
    );
    project.assert_no_image();
    assert_eq!(index.downloads(SIX_1_16_0.file_name), 0);
}
