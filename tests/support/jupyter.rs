//! The JupyterLab image of the Jupyter tests (`jupyter`, `notebook`): JupyterLab's real PyPI
//! wheels through `[pypi]` (no conda channel is reachable here), over the venv `python` 3.9
//! on Debian bullseye that the PyPI tests use, with the non-root user `jovyan` (uid 1000)
//! from `[accounts]`.

use crate::{
    common::Project,
    support::{
        channel::{PinnedWheel, fetch_wheel},
        pypi::{bullseye_python_base, pypi_channel},
        test_cache_dir,
    },
};

/// The pins of JupyterLab 4.3.8 and its dependencies (see `tests/data/README.md`).
const WHEELS: &str = include_str!("../data/jupyter/wheels.tsv");

pub(crate) fn pinned_wheels() -> Vec<PinnedWheel> {
    WHEELS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let mut fields = line.split('\t');
            let mut next = || fields.next().expect("file, URL and sha256");
            PinnedWheel {
                file_name: next(),
                url: next(),
                sha256: next(),
            }
        })
        .collect()
}

/// The recipe of the image `name`: `[accounts]` for `jovyan`, whose home holds the workdir,
/// and JupyterLab; `extra` (more tables, such as `[[files]]`) goes at its end.
pub(crate) fn recipe(name: &str, extra: &str) -> String {
    let channel = format!("file://{}/", pypi_channel().display());
    format!(
        r#"[image]
name = "{name}"
base = "oci:../base"
user = "jovyan"
workdir = "/home/jovyan/work"
ports = ["8888/tcp"]
entrypoint = ["/opt/conda/bin/jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser"]

[[accounts.groups]]
name = "jovyan"
gid = 1000

[[accounts.users]]
name = "jovyan"
uid = 1000
gid = 1000
home = "/home/jovyan"
shell = "/bin/sh"

[conda]
channels = ["{channel}"]
dependencies = ["python"]

[pypi]
no-index = true
find-links = ["wheels"]
dependencies = ["jupyterlab"]
{extra}"#
    )
}

/// Puts the wheels into `recipes/wheels` and the bullseye base into `base` of `project`, for
/// a recipe of [`recipe`] at `recipes/image.toml`.
pub(crate) fn prepare(project: &Project) {
    let wheels = project.path().join("recipes/wheels");
    fs_err::create_dir_all(&wheels).unwrap();
    for wheel in pinned_wheels() {
        let path = fetch_wheel(&test_cache_dir(), &wheel).unwrap();
        fs_err::copy(&path, wheels.join(wheel.file_name)).unwrap();
    }
    bullseye_python_base(&project.path().join("base"), &test_cache_dir()).unwrap();
}

/// Builds the image `name` of [`recipe`] with `extra` in `project`.
pub(crate) fn build_image(project: &Project, name: &str, extra: &str) {
    prepare(project);
    project.write_recipe(&recipe(name, extra));
    project.build(&[]).success();
}
