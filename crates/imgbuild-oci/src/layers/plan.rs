//! Which file goes into which layer, and in what order. Pure: no file is written here.
//!
//! A layer per package, so the same package build gives the same layer in every image that
//! holds it and registries and nodes store it once. Runtimes share a layer only when every
//! layer below it is shared too (containerd keys snapshots by chain id), so the order runs
//! from the most shared and least changing to the most specific: CUDA runtime packages
//! first, then libraries before the packages that depend on them. When the packages do not
//! fit the budget, the largest keep their own layers and the small rest share one. A last
//! layer holds the image's own files: what no package owns (`conda-meta/history`, empty
//! directories).

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use super::split::{LayerPart, split_files};
use crate::annotations;

/// A staged prefix as the planner sees it: plain data that the build's staging step makes
/// from what it installed, so planning names neither the installer nor the PyPI code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedTree {
    /// The staging root: the image's `/`.
    pub root: PathBuf,
    /// The in-image prefix, `/opt/conda`.
    pub prefix: String,
    /// The conda packages in the order they were installed; a path two of them list is in
    /// the later one's files only (as on disk).
    pub packages: Vec<StagedUnit>,
    /// The wheels installed into the prefix.
    pub wheels: Vec<StagedUnit>,
}

impl StagedTree {
    fn prefix_dir(&self) -> PathBuf {
        self.root.join(self.prefix.trim_start_matches('/'))
    }
}

/// One installed conda package or wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedUnit {
    /// Its normalized name (`numpy`), which orders the layers.
    pub name: String,
    /// How layers name it: a package's `name-version-build`, a wheel's `.dist-info` stem.
    pub label: String,
    /// The names of the packages it depends on (those outside the tree are ignored).
    pub depends: Vec<String>,
    /// Its files, relative to the prefix.
    pub files: Vec<String>,
    /// Its build time, seconds since the epoch (0 when unknown).
    pub mtime: u64,
}

/// What a layer holds. It decides the layer's history line, its annotations and where the
/// layer cache finds its packages' file lists, so no stage has to read it back from a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerKind {
    /// One or more conda packages, named `name-version-build`.
    Conda,
    /// One or more PyPI wheels, named by their `.dist-info` stem (`six-1.16.0`).
    Wheels,
    /// The image's own files: what no package owns.
    Image,
    /// The embedded `imgbuild-smoke` executable (`[smoke] embed = true`).
    Smoke,
    /// `[accounts]`: `/etc/passwd` and `/etc/group` with the recipe's users and groups,
    /// their home directories and the user's workdir (see [`super::owned`]).
    Accounts,
    /// One `[[files]]` entry of the recipe (see [`super::owned`]).
    Files,
}

/// The [`annotations::LAYER_CONTENT`] of an [`LayerKind::Accounts`] layer; a
/// [`LayerKind::Files`] layer's is [`FILES_CONTENT`].
const ACCOUNTS_CONTENT: &str = "accounts";
const FILES_CONTENT: &str = "files";

impl LayerKind {
    /// The annotation a layer of this kind carries: the `packages` it holds (named as
    /// [`Self::package_label`] says), where the smoke executable is, or that it holds the
    /// recipe's accounts or files; none for the image's own files. Readers of an image
    /// take the kind back with [`Self::from_annotations`].
    pub fn annotation(self, packages: &[String]) -> Option<(&'static str, String)> {
        match self {
            LayerKind::Conda | LayerKind::Wheels => {
                let labels: Vec<String> = packages.iter().map(|p| self.package_label(p)).collect();
                Some((annotations::PACKAGES, labels.join(",")))
            }
            LayerKind::Smoke => Some((annotations::SMOKE, super::smoke_layer::in_image_path())),
            LayerKind::Accounts => Some((annotations::LAYER_CONTENT, ACCOUNTS_CONTENT.into())),
            LayerKind::Files => Some((annotations::LAYER_CONTENT, FILES_CONTENT.into())),
            LayerKind::Image => None,
        }
    }

    /// The kind of a layer, from the annotations [`Self::annotation`] gave it; `None` for a
    /// layer without any (the image's own files, or a base's layer that is not imgbuild's).
    /// Packages that are all [`wheel_label`]s make a wheels layer; a content other than
    /// accounts is read as files.
    pub fn from_annotations(layer_annotations: &HashMap<String, String>) -> Option<LayerKind> {
        let mut labels = layer_annotations
            .get(annotations::PACKAGES)
            .into_iter()
            .flat_map(|list| list.split(','))
            .filter(|label| !label.is_empty())
            .peekable();
        if labels.peek().is_some() {
            return Some(match labels.all(|label| wheel_of_label(label).is_some()) {
                true => LayerKind::Wheels,
                false => LayerKind::Conda,
            });
        }
        if layer_annotations.contains_key(annotations::SMOKE) {
            return Some(LayerKind::Smoke);
        }
        let content = layer_annotations.get(annotations::LAYER_CONTENT)?;
        Some(match content.as_str() {
            ACCOUNTS_CONTENT => LayerKind::Accounts,
            _ => LayerKind::Files,
        })
    }

    /// How a package of a layer of this kind is named in the layer's packages annotation
    /// and in reports: a wheel as [`wheel_label`], a conda package as it is.
    pub(crate) fn package_label(self, package: &str) -> String {
        match self {
            LayerKind::Wheels => wheel_label(package),
            _ => package.to_string(),
        }
    }
}

/// One planned layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLayer {
    pub kind: LayerKind,
    /// What the layer holds, for history and reports: a package's `name-version-build`, a
    /// wheel's [`wheel_label`], `N small packages`, or `image` for the image's own files.
    pub name: String,
    /// The packages in the layer, named as [`LayerKind`] says, empty for the image layer.
    pub packages: Vec<String>,
    /// Paths relative to the staging root (`opt/conda/lib/libz.so`), without parents;
    /// the tar writer adds parent directories.
    pub paths: Vec<String>,
    /// Modification time of every entry, seconds since the epoch. A package layer carries
    /// its package's build time, so the layer does not depend on the image it is in.
    pub mtime: u64,
    /// Bytes of file data, for ordering and reports.
    pub size: u64,
    /// For one part of a package split by `[layers] split`: which part, and its package's
    /// record.
    pub part: Option<PlannedPart>,
}

/// One part of a split package's layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPart {
    pub part: LayerPart,
    /// The package's record (`conda-meta/*.json` or a wheel's `RECORD`), relative to the
    /// staging root. It pins the bytes of every file of the package, and lies in one part
    /// only, so the layer cache keys every part by it.
    pub record: String,
}

/// The layers of an image, bottom first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPlan {
    pub layers: Vec<PlannedLayer>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "The layer budget of {budget} is too small: the base has {base_layers} layers and the image needs at least 2 more (packages and its own files); raise `[layers] max`"
    )]
    BudgetTooSmall { budget: u32, base_layers: usize },
    #[error("`{}` has a name that is not UTF-8, which an image layer cannot carry faithfully", path.display())]
    NonUtf8 { path: std::path::PathBuf },
    #[error("Failed to read the staged prefix at `{}`", path.display())]
    Walk {
        path: std::path::PathBuf,
        #[source]
        source: walkdir::Error,
    },
}

/// Names of packages that make up a CUDA runtime; they go to the bottom of the image so
/// every variant built on the same CUDA shares them.
fn is_cuda_runtime(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "cuda-",
        "libcu",
        "libnv",
        "nvidia-",
        "cudnn",
        "nccl",
        "cudatoolkit",
        "libnccl",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// How many layers an image may have and how large a package's layer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// Most layers in all, base layers included (`[layers] max`).
    pub budget: u32,
    /// Layers below the planned ones: the base's, and those added on top planned apart.
    pub base_layers: usize,
    /// `[layers] split`: a package of more bytes is split into parts of at most this many,
    /// while the budget has room for them; `None` keeps every package whole.
    pub split: Option<u64>,
}

/// Plans the layers of `tree` within `limits`. `image_mtime` stamps the image's own layer.
pub fn plan_layers(
    tree: &StagedTree,
    limits: LayerLimits,
    image_mtime: u64,
) -> Result<LayerPlan, PlanError> {
    let LayerLimits {
        budget,
        base_layers,
        split,
    } = limits;
    // Conda packages and wheels each need a shared layer when they do not all fit alone.
    let kinds = usize::from(!tree.packages.is_empty()) + usize::from(!tree.wheels.is_empty());
    let slots = (budget as usize)
        .checked_sub(base_layers + 1)
        .filter(|slots| *slots >= kinds.max(1) || kinds == 0)
        .ok_or(PlanError::BudgetTooSmall {
            budget,
            base_layers,
        })?;
    let mut units = package_units(tree, split);
    units.extend(wheel_units(tree, split));
    let mut layers = fit_budget(&units, slots, kinds);
    layers.push(image_layer(tree, image_mtime)?);
    Ok(LayerPlan { layers })
}

/// A package's layer contents before the budget groups any.
struct Unit {
    kind: LayerKind,
    /// The package, named as `kind` says.
    package: String,
    paths: Vec<String>,
    size: u64,
    mtime: u64,
    /// Its parts when `[layers] split` splits it.
    split: Option<Split>,
}

/// A unit's layers when it is split: each part's paths with their bytes, and the record
/// that keys them all.
struct Split {
    record: String,
    parts: Vec<(Vec<String>, u64)>,
}

impl Unit {
    /// The unit of `package`'s `paths`, split into parts of at most `split` bytes when it
    /// is larger and has a record to key its parts by.
    fn new(
        tree: &StagedTree,
        kind: LayerKind,
        package: &StagedUnit,
        paths: Vec<String>,
        split: Option<u64>,
    ) -> Unit {
        let sizes: Vec<u64> = paths
            .iter()
            .map(|p| file_size(&tree.root.join(p)))
            .collect();
        let size = sizes.iter().sum();
        let split = split
            .filter(|&bound| size > bound)
            .and_then(|bound| split_unit(kind, package, &paths, &sizes, bound));
        Unit {
            kind,
            package: package.label.clone(),
            size,
            paths,
            mtime: package.mtime,
            split,
        }
    }

    /// The layers it adds beyond one when it is split.
    fn extra_layers(&self) -> usize {
        self.split.as_ref().map_or(0, |split| split.parts.len() - 1)
    }

    fn layer(&self) -> PlannedLayer {
        PlannedLayer {
            kind: self.kind,
            name: self.kind.package_label(&self.package),
            packages: vec![self.package.clone()],
            paths: self.paths.clone(),
            mtime: self.mtime,
            size: self.size,
            part: None,
        }
    }

    /// Its layers as parts, or its one layer when it stays whole.
    fn part_layers(&self) -> Vec<PlannedLayer> {
        let Some(split) = &self.split else {
            return vec![self.layer()];
        };
        let count = split.parts.len() as u32;
        (1..)
            .zip(&split.parts)
            .map(|(index, (paths, size))| {
                let part = LayerPart { index, count };
                PlannedLayer {
                    name: format!("{} (part {part})", self.kind.package_label(&self.package)),
                    paths: paths.clone(),
                    size: *size,
                    part: Some(PlannedPart {
                        part,
                        record: split.record.clone(),
                    }),
                    ..self.layer()
                }
            })
            .collect()
    }
}

/// `package`'s `paths` (with their `sizes`) in parts of at most `bound` bytes, keyed by its
/// record; `None` when they fit in one part or the package has no record among them.
fn split_unit(
    kind: LayerKind,
    package: &StagedUnit,
    paths: &[String],
    sizes: &[u64],
    bound: u64,
) -> Option<Split> {
    let suffix = record_suffix(kind, &package.label);
    let record = paths.iter().find(|p| p.ends_with(&suffix))?.clone();
    let files: Vec<(&str, u64)> = paths
        .iter()
        .map(String::as_str)
        .zip(sizes.iter().copied())
        .collect();
    let parts = split_files(&files, bound);
    (parts.len() > 1).then_some(Split { record, parts })
}

/// How the path of the record of a package labelled `label` ends: a conda package's
/// `conda-meta/<label>.json`, a wheel's `<label>.dist-info/RECORD`. A record names the
/// package and each file's sha256, so the layer cache keys a package's layers by it.
pub(crate) fn record_suffix(kind: LayerKind, label: &str) -> String {
    match kind {
        LayerKind::Wheels => format!("/{label}.dist-info/RECORD"),
        _ => format!("/conda-meta/{label}.json"),
    }
}

/// `rel` (under the prefix) relative to the staging root.
fn in_prefix(tree: &StagedTree, rel: &str) -> String {
    format!("{}/{rel}", tree.prefix.trim_start_matches('/'))
}

/// The conda packages from most shared to most specific, each with its files in path order.
fn package_units(tree: &StagedTree, split: Option<u64>) -> Vec<Unit> {
    dependency_order(&tree.packages)
        .into_iter()
        .map(|index| {
            let package = &tree.packages[index];
            let mut files: Vec<&String> = package.files.iter().collect();
            files.sort();
            let paths: Vec<String> = files.iter().map(|f| in_prefix(tree, f)).collect();
            Unit::new(tree, LayerKind::Conda, package, paths, split)
        })
        .collect()
}

/// The wheels, above the conda packages (they depend on the conda environment, never the
/// other way round), CUDA runtime wheels first.
fn wheel_units(tree: &StagedTree, split: Option<u64>) -> Vec<Unit> {
    let mut wheels: Vec<&StagedUnit> = tree.wheels.iter().collect();
    wheels.sort_by(|a, b| {
        (!is_cuda_runtime(&a.name), &a.name).cmp(&(!is_cuda_runtime(&b.name), &b.name))
    });
    wheels
        .into_iter()
        .map(|wheel| {
            let paths: Vec<String> = wheel.files.iter().map(|f| in_prefix(tree, f)).collect();
            Unit::new(tree, LayerKind::Wheels, wheel, paths, split)
        })
        .collect()
}

/// A layer per unit when they fit in `slots`, the largest split into their parts while the
/// `slots` left over hold them; else the largest keep a layer each and the rest of each of
/// the `kinds` share one, and none is split.
fn fit_budget(units: &[Unit], slots: usize, kinds: usize) -> Vec<PlannedLayer> {
    let by_size = by_size(units);
    if units.len() <= slots {
        let split = split_within(units, &by_size, slots - units.len());
        return (0..units.len())
            .flat_map(|i| match split.contains(&i) {
                true => units[i].part_layers(),
                false => vec![units[i].layer()],
            })
            .collect();
    }
    let alone: BTreeSet<usize> = by_size.iter().take(slots - kinds).copied().collect();
    let mut layers = Vec::new();
    for kind in [LayerKind::Conda, LayerKind::Wheels] {
        let of_kind: Vec<usize> = (0..units.len())
            .filter(|&i| units[i].kind == kind)
            .collect();
        layers.extend(
            of_kind
                .iter()
                .filter(|i| alone.contains(i))
                .map(|&i| units[i].layer()),
        );
        let grouped: Vec<&Unit> = of_kind
            .iter()
            .filter(|i| !alone.contains(i))
            .map(|&i| &units[i])
            .collect();
        if !grouped.is_empty() {
            layers.push(shared_layer(kind, &grouped));
        }
    }
    layers
}

/// Unit indices from the largest to the smallest, ties in plan order.
fn by_size(units: &[Unit]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|a, b| units[*b].size.cmp(&units[*a].size).then(a.cmp(b)));
    order
}

/// The units split into their parts: from the largest down, each whose extra layers fit in
/// the `spare` slots still left. A package too large for what is left stays whole, so a
/// tight budget changes how many packages are split, never how one is.
fn split_within(units: &[Unit], by_size: &[usize], mut spare: usize) -> BTreeSet<usize> {
    let mut split = BTreeSet::new();
    for &i in by_size {
        let extra = units[i].extra_layers();
        if extra > 0 && extra <= spare {
            spare -= extra;
            split.insert(i);
        }
    }
    split
}

/// One layer for the small packages of one kind.
fn shared_layer(kind: LayerKind, grouped: &[&Unit]) -> PlannedLayer {
    let mut paths: Vec<String> = grouped
        .iter()
        .flat_map(|u| u.paths.iter().cloned())
        .collect();
    paths.sort();
    let what = if kind == LayerKind::Wheels {
        "wheels"
    } else {
        "packages"
    };
    PlannedLayer {
        kind,
        name: format!("{} small {what}", grouped.len()),
        mtime: grouped.iter().map(|u| u.mtime).max().unwrap_or(0),
        size: grouped.iter().map(|u| u.size).sum(),
        packages: grouped.iter().map(|u| u.package.clone()).collect(),
        paths,
        part: None,
    }
}

/// The image's own layer: everything under the prefix no package or wheel owns.
fn image_layer(tree: &StagedTree, image_mtime: u64) -> Result<PlannedLayer, PlanError> {
    let owned: BTreeSet<&str> = tree
        .packages
        .iter()
        .chain(&tree.wheels)
        .flat_map(|unit| unit.files.iter().map(String::as_str))
        .collect();
    let prefix_dir = tree.prefix_dir();
    let mut own = Vec::new();
    let mut own_size = 0;
    if prefix_dir.exists() {
        for entry in walkdir::WalkDir::new(&prefix_dir)
            .follow_links(false)
            .sort_by_file_name()
            .min_depth(1)
        {
            let entry = entry.map_err(|source| PlanError::Walk {
                path: prefix_dir.clone(),
                source,
            })?;
            let rel = entry
                .path()
                .strip_prefix(&prefix_dir)
                .expect("walk stays under the prefix")
                .to_str()
                .ok_or_else(|| PlanError::NonUtf8 {
                    path: entry.path().to_path_buf(),
                })?;
            if !owned.contains(rel) && is_own_entry(&entry) {
                own_size += file_size(entry.path());
                own.push(in_prefix(tree, rel));
            }
        }
    }
    if own.is_empty() {
        // An image always has its own layer (it marks the prefix), even when empty of files.
        own.push(tree.prefix.trim_start_matches('/').to_string());
    }
    Ok(PlannedLayer {
        kind: LayerKind::Image,
        name: "image".to_string(),
        packages: Vec::new(),
        paths: own,
        mtime: image_mtime,
        size: own_size,
        part: None,
    })
}

/// A file or link no package owns is the image's; a directory only when it is empty, since
/// the layers that hold an owned file write its parents.
fn is_own_entry(entry: &walkdir::DirEntry) -> bool {
    !entry.file_type().is_dir()
        || fs_err::read_dir(entry.path())
            .map(|mut d| d.next().is_none())
            .unwrap_or(false)
}

/// The name a wheel has in layer annotations and reports: `pypi:` and its `.dist-info`
/// directory's stem (`pypi:python_dateutil-2.9.0.post0`), which also finds its `RECORD`.
pub fn wheel_label(dist_name: &str) -> String {
    format!("{WHEEL_LABEL_PREFIX}{dist_name}")
}

/// The `.dist-info` stem a [`wheel_label`] read back from an image names, if it is one.
pub fn wheel_of_label(label: &str) -> Option<&str> {
    label.strip_prefix(WHEEL_LABEL_PREFIX)
}

/// What [`wheel_label`] puts before a wheel's name.
const WHEEL_LABEL_PREFIX: &str = "pypi:";

fn file_size(path: &Path) -> u64 {
    fs_err::symlink_metadata(path)
        .map(|m| if m.is_file() { m.len() } else { 0 })
        .unwrap_or(0)
}

/// Package indices from most shared to most specific: CUDA runtime packages first, then by
/// depth in the dependency graph (what nothing depends on comes last), then by name.
fn dependency_order(packages: &[StagedUnit]) -> Vec<usize> {
    let index: HashMap<&str, usize> = packages
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let deps: Vec<Vec<usize>> = packages
        .iter()
        .map(|p| {
            p.depends
                .iter()
                .filter_map(|name| index.get(name.as_str()).copied())
                .collect()
        })
        .collect();
    let mut heights = Heights {
        deps: &deps,
        height: vec![None; deps.len()],
        stack: vec![false; deps.len()],
    };
    let keys: Vec<(bool, usize)> = (0..deps.len())
        .map(|i| (!is_cuda_runtime(&packages[i].name), heights.of(i)))
        .collect();
    let mut order: Vec<usize> = (0..deps.len()).collect();
    order.sort_by(|a, b| {
        keys[*a]
            .cmp(&keys[*b])
            .then_with(|| packages[*a].name.cmp(&packages[*b].name))
    });
    order
}

/// Heights in the dependency graph: 0 for a package without dependencies in the set, else
/// one more than the highest of its dependencies. Dependency cycles exist in the wild
/// (python ↔ pip): a package on the stack counts 0.
struct Heights<'a> {
    deps: &'a [Vec<usize>],
    height: Vec<Option<usize>>,
    stack: Vec<bool>,
}

impl Heights<'_> {
    fn of(&mut self, i: usize) -> usize {
        if let Some(h) = self.height[i] {
            return h;
        }
        if self.stack[i] {
            return 0;
        }
        self.stack[i] = true;
        let deps = self.deps;
        let h = deps[i].iter().map(|&d| self.of(d) + 1).max().unwrap_or(0);
        self.stack[i] = false;
        self.height[i] = Some(h);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_kind_is_read_back_from_its_annotation() {
        let conda = vec!["zlib-1.3-h0_0".to_string()];
        let wheels = vec!["six-1.16.0".to_string()];
        for (kind, packages) in [
            (LayerKind::Conda, &conda),
            (LayerKind::Wheels, &wheels),
            (LayerKind::Smoke, &Vec::new()),
            (LayerKind::Accounts, &Vec::new()),
            (LayerKind::Files, &Vec::new()),
        ] {
            let (key, value) = kind.annotation(packages).unwrap();
            let annotations = HashMap::from([(key.to_string(), value)]);
            assert_eq!(LayerKind::from_annotations(&annotations), Some(kind));
        }
        assert_eq!(LayerKind::Image.annotation(&[]), None);
        assert_eq!(LayerKind::from_annotations(&HashMap::new()), None);
        // An empty package list names no packages.
        let empty = HashMap::from([(annotations::PACKAGES.to_string(), String::new())]);
        assert_eq!(LayerKind::from_annotations(&empty), None);
    }

    /// `(name, depends, [(file, size)])` of a made-up package.
    type MadeUpPackage<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, usize)]);

    /// A staged tree holding `packages`, their files written.
    fn staged(root: &Path, packages: &[MadeUpPackage<'_>]) -> StagedTree {
        let prefix = root.join("opt/conda");
        fs_err::create_dir_all(prefix.join("conda-meta")).unwrap();
        fs_err::write(prefix.join("conda-meta/history"), "").unwrap();
        fs_err::create_dir_all(prefix.join("empty")).unwrap();
        let packages = packages
            .iter()
            .map(|(name, depends, files)| {
                let mut owned = Vec::new();
                for (file, size) in *files {
                    let path = prefix.join(file);
                    fs_err::create_dir_all(path.parent().unwrap()).unwrap();
                    fs_err::write(&path, vec![0u8; *size]).unwrap();
                    owned.push(file.to_string());
                }
                let meta = format!("conda-meta/{name}-1-0.json");
                fs_err::write(prefix.join(&meta), "{}").unwrap();
                owned.push(meta);
                StagedUnit {
                    name: name.to_string(),
                    label: format!("{name}-1-0"),
                    depends: depends.iter().map(|d| d.to_string()).collect(),
                    files: owned,
                    mtime: 1_696_118_400,
                }
            })
            .collect();
        StagedTree {
            root: root.to_path_buf(),
            prefix: "/opt/conda".into(),
            packages,
            wheels: Vec::new(),
        }
    }

    const PACKAGES: &[MadeUpPackage<'static>] = &[
        ("app", &["numpy", "python"], &[("bin/app", 10)]),
        ("cuda-cudart", &[], &[("lib/libcudart.so.11.0", 500)]),
        ("numpy", &["python"], &[("lib/numpy.so", 300)]),
        ("python", &["__glibc"], &[("bin/python", 200)]),
        ("tiny", &[], &[("share/tiny", 1)]),
    ];

    pub(super) fn limits(budget: u32, base_layers: usize) -> LayerLimits {
        LayerLimits {
            budget,
            base_layers,
            split: None,
        }
    }

    fn names(plan: &LayerPlan) -> Vec<&str> {
        plan.layers.iter().map(|l| l.name.as_str()).collect()
    }

    #[test]
    fn one_layer_per_package_cuda_first_libraries_before_users() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan_layers(&staged(dir.path(), PACKAGES), limits(60, 0), 7).unwrap();
        assert_eq!(
            names(&plan),
            [
                "cuda-cudart-1-0",
                "python-1-0",
                "tiny-1-0",
                "numpy-1-0",
                "app-1-0",
                "image"
            ]
        );
        let numpy = &plan.layers[3];
        assert_eq!(
            numpy.paths,
            [
                "opt/conda/conda-meta/numpy-1-0.json",
                "opt/conda/lib/numpy.so"
            ]
        );
        assert_eq!(numpy.mtime, 1_696_118_400);
        assert_eq!(numpy.size, 300 + 2);
        let image = plan.layers.last().unwrap();
        assert_eq!(
            image.paths,
            ["opt/conda/conda-meta/history", "opt/conda/empty"]
        );
        assert_eq!(image.mtime, 7);
    }

    #[test]
    fn over_budget_the_largest_stay_alone_and_the_rest_share_a_layer() {
        let dir = tempfile::tempdir().unwrap();
        // 6 layers in all, 2 from the base, 1 for the image: 3 for 5 packages.
        let plan = plan_layers(&staged(dir.path(), PACKAGES), limits(6, 2), 0).unwrap();
        assert_eq!(
            names(&plan),
            ["cuda-cudart-1-0", "numpy-1-0", "3 small packages", "image"]
        );
        assert_eq!(
            plan.layers[2].packages,
            ["python-1-0", "tiny-1-0", "app-1-0"]
        );
        let mut sorted = plan.layers[2].paths.clone();
        sorted.sort();
        assert_eq!(
            plan.layers[2].paths, sorted,
            "a shared layer's paths are sorted"
        );
    }

    /// A package of 6 files of 100 bytes (its record of 2), beside the small ones.
    const WITH_LARGE: &[MadeUpPackage<'static>] = &[
        ("python", &[], &[("bin/python", 200)]),
        (
            "torch",
            &["python"],
            &[
                ("lib/a.so", 100),
                ("lib/b.so", 100),
                ("lib/c.so", 100),
                ("lib/d.so", 100),
                ("lib/e.so", 100),
                ("lib/f.so", 100),
            ],
        ),
    ];

    fn split_at(budget: u32, bound: u64) -> LayerLimits {
        LayerLimits {
            split: Some(bound),
            ..limits(budget, 0)
        }
    }

    #[test]
    fn a_package_over_the_split_bound_becomes_parts_that_cover_it() {
        let dir = tempfile::tempdir().unwrap();
        let tree = staged(dir.path(), WITH_LARGE);
        let plan = plan_layers(&tree, split_at(60, 250), 0).unwrap();
        assert_eq!(
            names(&plan),
            [
                "python-1-0",
                "torch-1-0 (part 1/3)",
                "torch-1-0 (part 2/3)",
                "torch-1-0 (part 3/3)",
                "image"
            ]
        );
        let parts = &plan.layers[1..4];
        let mut paths: Vec<&String> = parts.iter().flat_map(|l| &l.paths).collect();
        paths.sort();
        let whole = plan_layers(&tree, limits(60, 0), 0).unwrap();
        assert_eq!(paths, whole.layers[1].paths.iter().collect::<Vec<_>>());
        for layer in parts {
            assert!(layer.size <= 250, "{}: {}", layer.name, layer.size);
            assert_eq!(layer.packages, ["torch-1-0"]);
            assert_eq!(layer.mtime, whole.layers[1].mtime);
            let planned = layer.part.as_ref().unwrap();
            assert_eq!(planned.record, "opt/conda/conda-meta/torch-1-0.json");
        }
        // Within the bound, or with split off, the package stays whole.
        let plan = plan_layers(&tree, split_at(60, 1000), 0).unwrap();
        assert_eq!(plan, whole);
    }

    #[test]
    fn a_split_takes_only_the_slots_the_budget_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let tree = staged(dir.path(), WITH_LARGE);
        // 3 slots for 2 packages: torch's 3 parts need 2 more, so it stays whole.
        let plan = plan_layers(&tree, split_at(4, 250), 0).unwrap();
        assert_eq!(names(&plan), ["python-1-0", "torch-1-0", "image"]);
        let plan = plan_layers(&tree, split_at(5, 250), 0).unwrap();
        assert_eq!(plan.layers.len(), 5);
    }

    #[test]
    fn a_budget_the_base_already_fills_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = plan_layers(&staged(dir.path(), PACKAGES), limits(10, 9), 0).unwrap_err();
        assert!(err.to_string().contains("the base has 9 layers"), "{err}");
    }
}

#[cfg(test)]
mod wheel_tests {
    use std::path::Path;

    use super::{tests::limits, *};

    /// A tree of one conda-less environment's wheels of the given sizes.
    fn with_wheels(root: &Path, wheels: &[(&str, usize)]) -> StagedTree {
        let prefix = root.join("opt/conda");
        let site = "lib/python3.9/site-packages";
        let wheels = wheels
            .iter()
            .map(|(name, size)| {
                let file = format!("{site}/{name}/data.bin");
                let record = format!("{site}/{name}-1.0.dist-info/RECORD");
                for (path, bytes) in [(&file, *size), (&record, 10)] {
                    fs_err::create_dir_all(prefix.join(path).parent().unwrap()).unwrap();
                    fs_err::write(prefix.join(path), vec![0u8; bytes]).unwrap();
                }
                StagedUnit {
                    name: name.replace('_', "-"),
                    label: format!("{name}-1.0"),
                    depends: Vec::new(),
                    files: vec![file, record],
                    mtime: 1_700_000_000,
                }
            })
            .collect();
        StagedTree {
            root: root.to_path_buf(),
            prefix: "/opt/conda".into(),
            packages: Vec::new(),
            wheels,
        }
    }

    #[test]
    fn wheels_get_a_layer_each_cuda_first_and_over_budget_the_small_ones_share() {
        let dir = tempfile::tempdir().unwrap();
        let wheels = [
            ("six", 30),
            ("torch", 5_000),
            ("nvidia_cudnn_cu11", 3_000),
            ("idna", 20),
            ("numpy", 900),
        ];
        let staged = with_wheels(dir.path(), &wheels);
        let names = |plan: &LayerPlan| -> Vec<String> {
            plan.layers.iter().map(|l| l.name.clone()).collect()
        };
        let plan = plan_layers(&staged, limits(60, 0), 0).unwrap();
        assert_eq!(
            names(&plan),
            [
                "pypi:nvidia_cudnn_cu11-1.0",
                "pypi:idna-1.0",
                "pypi:numpy-1.0",
                "pypi:six-1.0",
                "pypi:torch-1.0",
                "image"
            ]
        );
        assert_eq!(plan.layers[4].mtime, 1_700_000_000);
        // 5 layers in all, 1 for the image: torch, cuDNN and numpy alone, the rest share.
        let plan = plan_layers(&staged, limits(5, 0), 0).unwrap();
        assert_eq!(
            names(&plan),
            [
                "pypi:nvidia_cudnn_cu11-1.0",
                "pypi:numpy-1.0",
                "pypi:torch-1.0",
                "2 small wheels",
                "image"
            ]
        );
        // The shared layer knows it holds wheels by its kind, not by their names.
        assert_eq!(plan.layers[3].kind, LayerKind::Wheels);
        assert_eq!(plan.layers[3].packages, ["idna-1.0", "six-1.0"]);
        assert!(plan.layers[..4].iter().all(|l| l.kind == LayerKind::Wheels));
        assert_eq!(plan.layers[4].kind, LayerKind::Image);
        // The image's own layer holds none of the wheels' files.
        assert_eq!(plan.layers[4].paths, ["opt/conda"]);
    }
}
