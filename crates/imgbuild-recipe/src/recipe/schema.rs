//! The serde view of a recipe file. Every key is documented here and in the book's recipe
//! reference (docs/src/reference/recipe.md, checked by tests/it/book.rs); unknown keys are
//! errors, so a typo never silently changes an image.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The whole recipe file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecipeFile {
    /// Required: what image to build and how it runs.
    pub image: ImageSection,
    /// Optional: the conda environment.
    #[serde(default)]
    pub conda: CondaSection,
    /// Optional: the CUDA target the environment is solved for.
    pub cuda: Option<CudaSection>,
    /// Optional: layer planning.
    #[serde(default)]
    pub layers: LayersSection,
    /// Optional: the in-image GPU smoke test.
    #[serde(default)]
    pub smoke: SmokeSection,
    /// Optional: PyPI wheels installed into the conda environment.
    pub pypi: Option<PypiSection>,
    /// Optional: users and groups merged into the base's `/etc/passwd` and `/etc/group`.
    #[serde(default)]
    pub accounts: AccountsSection,
    /// Optional: `[[files]]`, the recipe's own files and directories, a layer each.
    #[serde(default)]
    pub files: Vec<Spanned<FilesEntry>>,
    /// Optional: `[[models]]`, model weights written as artifacts beside the image.
    #[serde(default)]
    pub models: Vec<Spanned<ModelEntry>>,
    /// Optional: `[[checks]]`, notebooks `imgbuild notebook --recipe` runs in the image.
    #[serde(default)]
    pub checks: Vec<Spanned<CheckEntry>>,
    /// Optional: build variants, `key = ["value", …]`; read by [`super::matrix`] before
    /// the recipe is parsed, so here only its presence is kept.
    #[allow(dead_code)]
    pub matrix: Option<toml::Table>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct ImageSection {
    /// Required: image name, also the output directory `images/<name>`.
    pub name: Spanned<String>,
    /// Optional: tags written into `index.json`; default `["latest"]`.
    pub tags: Option<Spanned<Vec<Spanned<String>>>>,
    /// Optional: `scratch` (default) or `oci:PATH[:TAG]`.
    pub base: Option<Spanned<String>>,
    /// Optional: conda subdirs to build for; default `["linux-64"]`.
    pub platforms: Option<Spanned<Vec<Spanned<String>>>>,
    /// Optional: in-image path of the environment; default `/opt/conda`.
    pub prefix: Option<Spanned<String>>,
    /// Optional: glibc version of the target (the `__glibc` virtual package).
    pub glibc: Option<Spanned<String>>,
    /// Optional: extra environment variables, applied last. Keys and values keep their
    /// spans: both are checked (no `=` in a key, no control characters).
    #[serde(default)]
    pub env: BTreeMap<Spanned<String>, Spanned<String>>,
    pub entrypoint: Option<Vec<Spanned<String>>>,
    pub cmd: Option<Vec<Spanned<String>>>,
    pub workdir: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    #[serde(default)]
    pub labels: BTreeMap<Spanned<String>, Spanned<String>>,
    /// Optional: ports the image exposes, `N`, `N/tcp`, `N/udp` or `N/sctp`.
    #[serde(default)]
    pub ports: Vec<Spanned<String>>,
    /// Optional: the signal that stops a container (`SIGTERM`, `SIGRTMIN+3` or a number).
    pub stop_signal: Option<Spanned<String>>,
    /// Optional, default true: check at build time that the entrypoint (or cmd) can start.
    pub check_entrypoint: Option<Spanned<bool>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct CondaSection {
    /// Channel names, URLs, `file://` URLs or paths relative to the recipe.
    #[serde(default)]
    pub channels: Vec<Spanned<String>>,
    /// Match specs, e.g. `python=3.9`.
    #[serde(default)]
    pub dependencies: Vec<Spanned<String>>,
    /// Optional: `strict` (default: a package comes only from the first channel that has
    /// it) or `disabled` (the best version from any channel).
    pub channel_priority: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct PypiSection {
    /// PEP 508 requirements, e.g. `requests>=2.31`.
    #[serde(default)]
    pub dependencies: Vec<Spanned<String>>,
    /// Optional: the index asked first; default `https://pypi.org/simple`.
    pub index_url: Option<Spanned<String>>,
    /// Optional: more indexes, asked in order for projects the earlier ones do not have.
    #[serde(default)]
    pub extra_index_urls: Vec<Spanned<String>>,
    /// Optional: directories (relative to the recipe) or HTML pages of wheels.
    #[serde(default)]
    pub find_links: Vec<Spanned<String>>,
    /// Optional: ask no index, only `find-links` (pip's `--no-index`).
    #[serde(default)]
    pub no_index: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct CudaSection {
    /// CUDA runtime version the image targets, e.g. `11.8`.
    pub version: Spanned<String>,
    /// Oldest host driver the image must run on, e.g. `520.61.05`; default: the release's
    /// own minimum.
    pub min_driver: Option<Spanned<String>>,
    /// Include NVIDIA's forward-compatibility libraries (`cuda-compat`).
    #[serde(default)]
    pub compat: bool,
    /// GPUs the image must run kernels on (`sm_80`): a library that runs on none fails the
    /// build, and so does one that runs on one only by PTX whose ISA needs a newer driver
    /// than `min-driver`.
    #[serde(default)]
    pub architectures: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SmokeSection {
    /// Add the `imgbuild-smoke` executable as a layer of its own, so the smoke test can run
    /// inside the image (`imgbuild k8s --smoke-job`).
    #[serde(default)]
    pub embed: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LayersSection {
    /// Layer budget, base layers included.
    pub max: Option<Spanned<i64>>,
    /// Layer compression: `gzip` (default), `zstd`, `estargz` or `zstd:chunked`.
    pub compression: Option<Spanned<String>>,
    /// eStargz: globs of image paths the stargz snapshotter fetches first.
    #[serde(default)]
    pub prefetch: Option<Spanned<Vec<String>>>,
    /// A package larger than this (`"512MiB"`) is split by file into layers of at most
    /// this size; `false` keeps every package in one layer.
    pub split: Option<Spanned<SplitSetting>>,
}

/// `[layers] split`: a size, or `false`.
#[derive(Debug)]
pub(crate) enum SplitSetting {
    Enabled(bool),
    Size(String),
}

impl<'de> Deserialize<'de> for SplitSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SplitVisitor;
        impl serde::de::Visitor<'_> for SplitVisitor {
            type Value = SplitSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size such as \"512MiB\", or false")
            }
            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<SplitSetting, E> {
                Ok(SplitSetting::Enabled(value))
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<SplitSetting, E> {
                Ok(SplitSetting::Size(value.to_string()))
            }
        }
        deserializer.deserialize_any(SplitVisitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccountsSection {
    /// `[[accounts.groups]]`, in the order they are added to `/etc/group`.
    #[serde(default)]
    pub groups: Vec<Spanned<GroupEntry>>,
    /// `[[accounts.users]]`, in the order they are added to `/etc/passwd`.
    #[serde(default)]
    pub users: Vec<Spanned<UserEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupEntry {
    pub name: Spanned<String>,
    pub gid: Spanned<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserEntry {
    pub name: Spanned<String>,
    pub uid: Spanned<i64>,
    /// The primary group's ID: a group of `[accounts]` or of the base.
    pub gid: Spanned<i64>,
    /// Default `/home/<name>`; created owned by the user.
    pub home: Option<Spanned<String>>,
    /// Default `/bin/sh`.
    pub shell: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckEntry {
    /// A notebook, relative to the recipe's directory.
    pub notebook: Spanned<String>,
    /// The statement of an earlier run to verify against, relative to the recipe's directory.
    pub expect: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilesEntry {
    /// A file or directory, relative to the build context.
    pub src: Spanned<String>,
    /// The build context `src` is read beneath, relative to the recipe (or absolute);
    /// default: the recipe's directory.
    pub context: Option<Spanned<String>>,
    /// Absolute in-image path: the file's, or the directory the contents go into.
    pub dest: Spanned<String>,
    /// `UID:GID`, `name` or `name:group`; default `0:0`.
    pub owner: Option<Spanned<String>>,
    /// Octal permission bits of files, e.g. `0644`; directories get the matching x bits.
    pub mode: Option<Spanned<String>>,
    /// Globs of paths under `src` to leave out, as in `.imgbuildignore`.
    #[serde(default)]
    pub exclude: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelEntry {
    /// Required: the model's name, a DNS label; its artifact is `images/NAME.models/MODEL`.
    pub name: Spanned<String>,
    /// Required: absolute in-container path the model is mounted at.
    pub mount: Spanned<String>,
    /// Required: a file or directory beneath the recipe's directory.
    pub source: Spanned<String>,
}
