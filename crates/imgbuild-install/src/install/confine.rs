//! Confining the link step to the prefix, by construction.
//!
//! rattler links each package on its own, in parallel, and follows whatever links are in the
//! prefix when it creates a directory or writes a file. Each link judged alone is not enough:
//! `bin/x -> ..` and `bin/y -> x/bin/x/../../…` each stay inside, yet together lead out. So
//! before rattler writes anything, the tree that every package of the install will make is
//! planned whole, from the extracted copies (the same bytes rattler links: the link targets
//! are read from the copies, not from the archive), and refused unless:
//!
//! - no package path lies below a symlink or a file of any package: rattler then never writes
//!   through a link, so where a link points cannot decide where a write lands;
//! - a path two packages install is the same thing in both (the same directory, the same file
//!   by sha256, the same link); anything else is a clobber, refused naming both;
//! - every symlink, followed through every other link of the plan, ends inside the prefix, so
//!   nothing that later reads the prefix (activation's `env_vars.d`, the image's users) is
//!   led out;
//! - every record field that becomes a path (`python_site_packages_path`, entry point names,
//!   the build string in `conda-meta/<name>-<version>-<build>.json`, `subdir`) is one or more
//!   plain names.
//!
//! After the install, the staged prefix itself is read back and its links checked again the
//! same way ([`check_staged`]), so what reaches the image is what was planned.
//!
//! Why not a mount namespace and `chroot`: rattler hard-links files from the package cache,
//! and no link crosses a mount, so a chroot with the cache bind-mounted would copy every file
//! (2.7 GB for the PyTorch bench environment); and build pods are commonly refused
//! `unshare(CLONE_NEWUSER)` by their seccomp profile, so a fallback would be needed anyway.
//! The plan holds wherever imgbuild runs, as root or not.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    path::{Component, Path, PathBuf},
};

use rattler_conda_types::{
    RepoDataRecord, Subdir,
    package::{LinkJson, NoArchLinks, PackageFile, PathType, PathsJson},
};
use rattler_digest::Sha256Hash;

use super::{InstallError, dist_name};

/// Paths rattler keeps for itself in a prefix; no package may ship them.
const RESERVED: &[&str] = &["conda-meta", "__clobbers__"];

/// The most links followed while resolving one path, as the kernel's own limit.
const MAX_HOPS: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Dir,
    File(Option<Sha256Hash>),
    Symlink(PathBuf),
}

impl Kind {
    fn describe(&self) -> &'static str {
        match self {
            Kind::Dir => "a directory",
            Kind::File(_) => "a file",
            Kind::Symlink(_) => "a symlink",
        }
    }

    /// Two packages may ship the same path only when it is the same thing.
    fn same_as(&self, other: &Kind) -> bool {
        match (self, other) {
            (Kind::Dir, Kind::Dir) => true,
            (Kind::File(Some(a)), Kind::File(Some(b))) => a == b,
            (Kind::Symlink(a), Kind::Symlink(b)) => a == b,
            _ => false,
        }
    }
}

#[derive(Debug)]
struct TreeNode {
    kind: Kind,
    /// Index into [`Tree::owners`] of the package that put it there.
    owner: usize,
}

/// Why a plan is refused: the package, the prefix-relative path and what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Escape {
    pub package: String,
    pub path: String,
    pub reason: String,
}

impl From<Escape> for InstallError {
    fn from(e: Escape) -> Self {
        InstallError::Check {
            package: e.package,
            entry: super::scan::printable(&e.path),
            reason: super::scan::printable(&e.reason),
        }
    }
}

/// The prefix as the packages of one install will leave it, keyed by prefix-relative path.
#[derive(Debug, Default)]
struct Tree {
    nodes: BTreeMap<PathBuf, TreeNode>,
    owners: Vec<String>,
}

impl Tree {
    fn refuse(&self, owner: usize, path: &Path, reason: String) -> Escape {
        Escape {
            package: self.owners[owner].clone(),
            path: path.display().to_string(),
            reason,
        }
    }

    /// Adds `path` as `kind` for package `owner`, with its parent directories.
    fn insert(&mut self, path: &Path, kind: Kind, owner: usize) -> Result<(), Escape> {
        check_relative(path).map_err(|reason| self.refuse(owner, path, reason))?;
        let first = path.components().next().map(|c| c.as_os_str().to_owned());
        if first.is_some_and(|f| RESERVED.iter().any(|r| f == *r)) {
            return Err(self.refuse(
                owner,
                path,
                "is where rattler keeps its own records; a package may not ship it".into(),
            ));
        }
        let parents: Vec<&Path> = path.ancestors().skip(1).collect();
        for parent in parents
            .into_iter()
            .rev()
            .filter(|p| !p.as_os_str().is_empty())
        {
            self.put(parent, Kind::Dir, owner, path)?;
        }
        self.put(path, kind, owner, path)
    }

    fn put(&mut self, at: &Path, kind: Kind, owner: usize, wanted: &Path) -> Result<(), Escape> {
        let Some(existing) = self.nodes.get(at) else {
            self.nodes
                .insert(at.to_path_buf(), TreeNode { kind, owner });
            return Ok(());
        };
        if existing.kind.same_as(&kind) {
            return Ok(());
        }
        let other = &self.owners[existing.owner];
        let reason = if existing.kind == Kind::Dir {
            format!(
                "is a directory of `{other}`, but this package installs {} there",
                kind.describe()
            )
        } else if at == wanted {
            format!(
                "is installed as {} by this package and as {} by `{other}`; packages may share a path only when it is the same file",
                kind.describe(),
                existing.kind.describe()
            )
        } else {
            format!(
                "lies below `{}`, which is {} of `{other}`; imgbuild never writes through a link",
                at.display(),
                existing.kind.describe()
            )
        };
        let shown = if at == wanted || existing.kind == Kind::Dir {
            at
        } else {
            wanted
        };
        Err(self.refuse(owner, shown, reason))
    }

    /// Every symlink, followed through the others, must end inside the prefix.
    fn check_links(&self) -> Result<(), Escape> {
        for (path, node) in &self.nodes {
            if let Kind::Symlink(target) = &node.kind {
                self.resolve(path, target).map_err(|reason| {
                    self.refuse(
                        node.owner,
                        path,
                        format!("is a symlink to `{}`, which {reason}", target.display()),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Follows `target` from the directory holding the link at `link`, component by
    /// component, through the plan's other links. A component the plan lacks is taken to be a
    /// directory, the most a later write could make of it.
    fn resolve(&self, link: &Path, target: &Path) -> Result<(), String> {
        let mut at: Vec<OsString> = parts(link.parent().unwrap_or(Path::new("")));
        let mut pending: Vec<Component<'_>> = target.components().rev().collect();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            match part {
                Component::RootDir | Component::Prefix(_) => {
                    return Err("is absolute; links must stay inside the prefix".into());
                }
                Component::CurDir => {}
                Component::ParentDir => {
                    if at.pop().is_none() {
                        return Err("leads out of the prefix".into());
                    }
                }
                Component::Normal(name) => {
                    at.push(name.to_owned());
                    let here: PathBuf = at.iter().collect();
                    if let Some(TreeNode {
                        kind: Kind::Symlink(next),
                        ..
                    }) = self.nodes.get(&here)
                    {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(format!(
                                "goes through more than {MAX_HOPS} links (a loop)"
                            ));
                        }
                        at.pop();
                        pending.extend(next.components().rev());
                    }
                }
            }
        }
        Ok(())
    }
}

fn parts(path: &Path) -> Vec<OsString> {
    path.components()
        .map(|c| c.as_os_str().to_owned())
        .collect()
}

/// A prefix-relative path made of plain names only.
fn check_relative(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("is empty".into());
    }
    if path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Ok(());
    }
    Err("is not a plain relative path inside the prefix".into())
}

/// One package of the install: its record and its extracted copy in the cache.
pub(super) struct Planned<'a> {
    pub record: &'a RepoDataRecord,
    pub dir: &'a Path,
}

/// Plans the prefix every package of `packages` will make together, and refuses it unless
/// every path stays inside (see the module's documentation).
pub(super) fn check_plan(packages: &[Planned<'_>], platform: Subdir) -> Result<(), InstallError> {
    let records: Vec<&RepoDataRecord> = packages.iter().map(|p| p.record).collect();
    check_record_fields(&records)?;
    let python = python_info(&records, platform)?;
    let mut tree = Tree::default();
    for (owner, package) in packages.iter().enumerate() {
        tree.owners.push(dist_name(package.record));
        for (path, kind) in package_paths(package, python.as_ref())? {
            tree.insert(&path, kind, owner)?;
        }
    }
    tree.check_links()?;
    Ok(())
}

/// Where python puts noarch packages, from the solved `python` record (checked first: its
/// `python_site_packages_path` decides where their files land).
fn python_info(
    records: &[&RepoDataRecord],
    platform: Subdir,
) -> Result<Option<rattler::install::PythonInfo>, InstallError> {
    let Some(python) = records
        .iter()
        .find(|r| r.package_record.name.as_normalized() == "python")
    else {
        return Ok(None);
    };
    Ok(rattler::install::PythonInfo::from_python_record(&python.package_record, platform).ok())
}

/// Each path the package's link will create, with what it will be, in prefix terms.
#[allow(
    clippy::disallowed_methods,
    reason = "its error is wrapped with the path already; fs-err would name it twice"
)]
fn package_paths(
    package: &Planned<'_>,
    python: Option<&rattler::install::PythonInfo>,
) -> Result<Vec<(PathBuf, Kind)>, InstallError> {
    let name = dist_name(package.record);
    let bad = |path: &Path, reason: String| Escape {
        package: name.clone(),
        path: path.display().to_string(),
        reason,
    };
    let paths = PathsJson::from_package_directory_with_deprecated_fallback(package.dir)
        .map_err(|e| bad(Path::new("info/paths.json"), format!("cannot be read: {e}")))?;
    let noarch_python = package.record.package_record.noarch.is_python();
    let target = |path: &Path| match (noarch_python, python) {
        (true, Some(python)) => python.get_python_noarch_target_path(path).into_owned(),
        _ => path.to_path_buf(),
    };
    let mut planned = Vec::with_capacity(paths.paths.len());
    for entry in &paths.paths {
        let kind = match entry.path_type {
            PathType::HardLink => Kind::File(entry.sha256),
            PathType::Directory => Kind::Dir,
            PathType::SoftLink => {
                let link = package.dir.join(&entry.relative_path);
                let target = std::fs::read_link(&link).map_err(|e| {
                    bad(
                        &entry.relative_path,
                        format!("cannot be read as a link: {e}"),
                    )
                })?;
                Kind::Symlink(target)
            }
        };
        planned.push((target(&entry.relative_path), kind));
    }
    if noarch_python {
        for command in
            entry_points(package.dir).map_err(|reason| bad(Path::new("info/link.json"), reason))?
        {
            let path = Path::new("bin").join(&command);
            if Path::new(&command).components().count() != 1
                || check_relative(Path::new(&command)).is_err()
            {
                return Err(bad(
                    &path,
                    format!("is an entry point named `{command}`, which is not a plain file name"),
                )
                .into());
            }
            planned.push((path, Kind::File(None)));
        }
    }
    Ok(planned)
}

/// The commands a noarch python package's `info/link.json` asks for.
fn entry_points(dir: &Path) -> Result<Vec<String>, String> {
    if !dir.join("info/link.json").exists() {
        return Ok(Vec::new());
    }
    let link = LinkJson::from_package_directory(dir).map_err(|e| format!("cannot be read: {e}"))?;
    Ok(match link.noarch {
        NoArchLinks::Python(python) => python.entry_points.into_iter().map(|e| e.command).collect(),
        NoArchLinks::Generic => Vec::new(),
    })
}

/// Record fields that become paths: checked before anything is fetched, whether they came
/// from a channel's repodata or from a lock alone.
pub(super) fn check_record_fields(records: &[&RepoDataRecord]) -> Result<(), InstallError> {
    for record in records {
        let p = &record.package_record;
        let bad = |field: &str, value: &str, reason: &str| InstallError::Check {
            package: dist_name(record),
            entry: field.to_string(),
            reason: super::scan::printable(&format!("`{value}` {reason}")),
        };
        if p.sha256.is_none() && p.md5.is_none() {
            return Err(bad(
                "sha256",
                "none",
                "is missing, and so is the md5: every package must be pinned by a digest, which its download is checked against",
            ));
        }
        if let Some(site) = &p.python_site_packages_path
            && check_relative(Path::new(site)).is_err()
        {
            return Err(bad(
                "python_site_packages_path",
                site,
                "must be a relative path inside the prefix, without `..`",
            ));
        }
        for (field, value) in [
            ("build", p.build.as_str()),
            ("subdir", p.subdir.as_str()),
            ("version", &p.version.to_string()),
        ] {
            if !is_file_name_part(value) {
                return Err(bad(
                    field,
                    value,
                    "must be a plain name (letters, digits, `.`, `_`, `+`, `!`, `-`), as it becomes part of a file name",
                ));
            }
        }
    }
    Ok(())
}

/// What conda allows in a version, a build string or a subdir, and nothing that could act as
/// a path.
fn is_file_name_part(value: &str) -> bool {
    !value.is_empty()
        && !value.starts_with('.')
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '!' | '-'))
}

/// Reads the staged prefix back and checks every link in it as the plan was checked, and
/// that no `__clobbers__` path is left: what reaches the image is what was planned.
#[allow(
    clippy::disallowed_methods,
    reason = "its error is wrapped with the path already; fs-err would name it twice"
)]
pub(super) fn check_staged(prefix_dir: &Path) -> Result<(), InstallError> {
    let io = |e: std::io::Error| InstallError::Metadata {
        path: prefix_dir.to_path_buf(),
        source: e,
    };
    let mut tree = Tree {
        owners: vec!["the staged prefix".to_string()],
        ..Tree::default()
    };
    for entry in walkdir::WalkDir::new(prefix_dir)
        .min_depth(1)
        .follow_links(false)
    {
        let entry = entry.map_err(|e| io(e.into()))?;
        let relative = entry
            .path()
            .strip_prefix(prefix_dir)
            .expect("under the prefix");
        let kind = if entry.path_is_symlink() {
            Kind::Symlink(std::fs::read_link(entry.path()).map_err(io)?)
        } else if entry.file_type().is_dir() {
            Kind::Dir
        } else {
            Kind::File(None)
        };
        tree.nodes
            .insert(relative.to_path_buf(), TreeNode { kind, owner: 0 });
    }
    tree.check_links()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(entries: &[(&str, Kind, usize)]) -> Result<Tree, Escape> {
        let mut tree = Tree {
            owners: vec!["a-1-0".into(), "b-1-0".into()],
            ..Tree::default()
        };
        for (path, kind, owner) in entries {
            tree.insert(Path::new(path), kind.clone(), *owner)?;
        }
        tree.check_links()?;
        Ok(tree)
    }

    fn link(target: &str) -> Kind {
        Kind::Symlink(target.into())
    }

    #[test]
    fn a_chain_of_links_that_each_stay_inside_is_refused() {
        // Each link alone stays inside; together they climb out.
        let err = tree(&[
            ("bin/x", link(".."), 0),
            ("bin/y", link("x/bin/x/bin/x/../../../../../../victim"), 1),
        ])
        .unwrap_err();
        assert_eq!(err.path, "bin/y");
        assert_eq!(err.package, "b-1-0");
        assert!(err.reason.contains("leads out of the prefix"), "{err:?}");
    }

    #[test]
    fn links_inside_pass_and_loops_are_refused() {
        tree(&[
            ("lib/libz.so.1.2", Kind::File(None), 0),
            ("lib/libz.so", link("libz.so.1.2"), 0),
            ("lib64", link("lib"), 0),
            (
                "lib/python3.9/config/libpython.a",
                link("../../libpython.a"),
                1,
            ),
        ])
        .unwrap();
        let err = tree(&[("a", link("b"), 0), ("b", link("a"), 0)]).unwrap_err();
        assert!(err.reason.contains("loop"), "{err:?}");
        let err = tree(&[("etc/x", link("/etc/passwd"), 0)]).unwrap_err();
        assert!(err.reason.contains("absolute"), "{err:?}");
    }

    #[test]
    fn nothing_is_written_through_a_link_of_any_package() {
        // In either order of the two packages.
        let through = [
            ("lib/out", link("../share"), 0),
            ("lib/out/file", Kind::File(None), 1),
        ];
        let err = tree(&through).unwrap_err();
        assert_eq!(err.path, "lib/out/file");
        assert!(
            err.reason.contains("never writes through a link"),
            "{err:?}"
        );
        let reversed = [
            ("lib/out/file", Kind::File(None), 1),
            ("lib/out", link("../share"), 0),
        ];
        let err = tree(&reversed).unwrap_err();
        assert_eq!(err.path, "lib/out");
        assert!(err.reason.contains("is a directory of `b-1-0`"), "{err:?}");
    }

    #[test]
    fn clobbers_are_refused_unless_identical() {
        let sha = |b: u8| Some(Sha256Hash::from([b; 32]));
        tree(&[
            ("share/x", Kind::File(sha(1)), 0),
            ("share/x", Kind::File(sha(1)), 1),
        ])
        .unwrap();
        let err = tree(&[
            ("share/x", Kind::File(sha(1)), 0),
            ("share/x", Kind::File(sha(2)), 1),
        ])
        .unwrap_err();
        assert_eq!(
            (err.package.as_str(), err.path.as_str()),
            ("b-1-0", "share/x")
        );
        assert!(err.reason.contains("`a-1-0`"), "{err:?}");
        let err = tree(&[
            ("share/x", Kind::File(sha(1)), 0),
            ("share/x/y", Kind::File(sha(1)), 1),
        ])
        .unwrap_err();
        assert!(err.reason.contains("which is a file of `a-1-0`"), "{err:?}");
    }

    #[test]
    fn reserved_and_odd_paths_are_refused() {
        assert!(tree(&[("conda-meta/x.json", Kind::File(None), 0)]).is_err());
        assert!(tree(&[("__clobbers__/a/x", Kind::File(None), 0)]).is_err());
        assert!(tree(&[("a/../b", Kind::File(None), 0)]).is_err());
        assert!(is_file_name_part("py39h6a678d5_0"));
        assert!(is_file_name_part("1.2.3.post1+cu118"));
        for bad in ["../../x", "a/b", "", ".hidden", "x\ny"] {
            assert!(!is_file_name_part(bad), "{bad:?}");
        }
    }
}
