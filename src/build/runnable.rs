//! Between staging and writing: whether the image can start the program its entrypoint (or
//! cmd) names. An image that cannot builds fine and fails only at `podman run` with `exec
//! /opt/conda/bin/python: no such file or directory` (a `scratch` base has no glibc loader);
//! this says so at build time, naming the file that is missing.
//!
//! The program must be in the image (on its PATH when named bare), and what the kernel loads
//! for it must be there too: an ELF's loader (`PT_INTERP`), a script's `#!` interpreter, and
//! for `#!/usr/bin/env NAME` the NAME on the PATH. The image's tree is the base's layers
//! (whiteouts applied), the staged environment and the recipe's own layers, top winning;
//! links are followed as the kernel follows them, within the image. `[image]
//! check-entrypoint = false` turns it off, for a program the runtime mounts in.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use object::{
    Endianness,
    read::elf::{FileHeader, ProgramHeader},
};

use crate::{
    layers::owned::{Content, OwnedLayer},
    oci::{
        base::GlibcError,
        rootfs::{BaseTree, Node, read_head},
    },
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunnableError {
    #[error(transparent)]
    Base(#[from] GlibcError),
    #[error(
        "The image for {platform} cannot start its entrypoint: {problem}. Use a base that has it (with glibc and a shell: `base = \"docker.io/library/debian:12-slim\"`, as the shipped recipes; this one is `{base}`), or set `[image] check-entrypoint = false` when the runtime provides it"
    )]
    NotRunnable {
        platform: String,
        base: String,
        problem: NotRunnable,
    },
}

/// At most this many links on the way to one file, as Linux's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;
/// At most this many `#!` interpreters in a row, as Linux's `BINPRM_MAX_RECURSION`.
const MAX_SCRIPTS: usize = 4;

/// Why the entrypoint cannot start, for the error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotRunnable {
    /// A bare name that no directory of the image's PATH holds.
    NotOnPath { program: String, path: String },
    /// A path (or a link on the way) that leads nowhere.
    Missing { program: String, missing: String },
    /// An ELF whose loader the image lacks.
    NoLoader { program: String, loader: String },
    /// A script whose interpreter the image lacks.
    NoInterpreter {
        program: String,
        interpreter: String,
    },
}

impl std::fmt::Display for NotRunnable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRunnable::NotOnPath { program, path } => {
                write!(
                    f,
                    "`{program}` is in no directory of the image's PATH ({path})"
                )
            }
            NotRunnable::Missing { program, missing } => {
                write!(
                    f,
                    "`{program}` is not in the image (`/{missing}` is missing)"
                )
            }
            NotRunnable::NoLoader { program, loader } => write!(
                f,
                "`{program}` is an ELF executable whose loader `{loader}` the image lacks: the base has no glibc (or another one)"
            ),
            NotRunnable::NoInterpreter {
                program,
                interpreter,
            } => write!(
                f,
                "`{program}` is a script whose interpreter `{interpreter}` the image lacks"
            ),
        }
    }
}

/// The image's file tree, top layer first: the recipe's own layers, the staged
/// environment, the base.
pub(super) struct ImageTree<'a> {
    owned: BTreeMap<String, Node>,
    /// The directories above the recipe's own entries.
    implied: BTreeSet<String>,
    staging: &'a Path,
    base: BaseTree,
}

impl<'a> ImageTree<'a> {
    pub(super) fn new(owned: &[OwnedLayer], staging: &'a Path, base: BaseTree) -> Self {
        let mut nodes = BTreeMap::new();
        let mut implied = BTreeSet::new();
        for entry in owned.iter().flat_map(|layer| &layer.entries) {
            let node = match &entry.content {
                Content::Directory => Node::Directory,
                Content::Symlink(target) => Node::Symlink(target.display().to_string()),
                Content::Bytes(bytes) => Node::File {
                    head: Some(
                        bytes
                            .iter()
                            .copied()
                            .take(crate::oci::rootfs::HEAD)
                            .collect(),
                    ),
                },
                // An executable of the build context: its head, read beneath the context as
                // its layer's bytes are.
                Content::File { source, size, .. } => Node::File {
                    head: (entry.mode & 0o111 != 0)
                        .then(|| source.open_sized(*size).ok())
                        .flatten()
                        .and_then(|file| read_head(file).ok()),
                },
            };
            // A `[[files]]` layer leaves the directories above its entries to the layers
            // below; where those have none, unpacking makes them.
            let mut parent = entry.path.as_str();
            while let Some((dir, _)) = parent.rsplit_once('/') {
                implied.insert(dir.to_string());
                parent = dir;
            }
            nodes.insert(entry.path.clone(), node);
        }
        ImageTree {
            owned: nodes,
            implied,
            staging,
            base,
        }
    }

    fn node(&self, path: &str) -> Option<Node> {
        if let Some(node) = self.owned.get(path) {
            return Some(node.clone());
        }
        staged_node(self.staging, path)
            .or_else(|| self.base.get(path).cloned())
            .or_else(|| self.implied.contains(path).then_some(Node::Directory))
    }

    /// `path` with every link followed; `Err` names the first path that is not there.
    fn resolve(&self, path: &str) -> Result<Node, String> {
        let mut rest: Vec<String> = components(path).rev().collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(part) = rest.pop() {
            if part == ".." {
                done.pop();
                continue;
            }
            let here = match done.is_empty() {
                true => part.clone(),
                false => format!("{}/{part}", done.join("/")),
            };
            match self.node(&here) {
                None => return Err(here),
                Some(Node::Symlink(target)) => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(here);
                    }
                    if target.starts_with('/') {
                        done.clear();
                    }
                    rest.extend(components(&target).rev());
                }
                Some(Node::Directory) => done.push(part),
                Some(file) if rest.is_empty() => return Ok(file),
                Some(_) => return Err(here),
            }
        }
        Ok(Node::Directory)
    }

    /// Whether `program` can start, given the image's `path` (its PATH).
    pub(super) fn check(&self, program: &str, path: &str) -> Result<(), NotRunnable> {
        self.check_at(program, path, 0)
    }

    fn check_at(&self, program: &str, path: &str, scripts: usize) -> Result<(), NotRunnable> {
        // A file whose head is unknown (or a directory, which the kernel refuses itself)
        // is not judged.
        let Node::File { head: Some(head) } = self.find(program, path)? else {
            return Ok(());
        };
        if let Some(line) = head.strip_prefix(b"#!") {
            // The kernel gives up past its depth too, with ELOOP; that is not ours to judge.
            if scripts >= MAX_SCRIPTS {
                return Ok(());
            }
            return self.check_script(program, line, path, scripts + 1);
        }
        match elf_interpreter(&head) {
            Some(loader) if self.resolve(&loader).is_err() => Err(NotRunnable::NoLoader {
                program: program.to_string(),
                loader,
            }),
            _ => Ok(()),
        }
    }

    /// What `program` names, links followed: the path as written when it has a `/`, else
    /// the first file of that name in the PATH's directories.
    fn find(&self, program: &str, path: &str) -> Result<Node, NotRunnable> {
        if program.contains('/') {
            return self
                .resolve(program)
                .map_err(|missing| NotRunnable::Missing {
                    program: program.to_string(),
                    missing,
                });
        }
        path.split(':')
            .filter(|dir| dir.starts_with('/'))
            .find_map(|dir| match self.resolve(&format!("{dir}/{program}")) {
                Ok(file @ Node::File { .. }) => Some(file),
                _ => None,
            })
            .ok_or_else(|| NotRunnable::NotOnPath {
                program: program.to_string(),
                path: path.to_string(),
            })
    }

    /// A script's `#!` line: its interpreter must start, and `env NAME` must find NAME.
    fn check_script(
        &self,
        program: &str,
        line: &[u8],
        path: &str,
        scripts: usize,
    ) -> Result<(), NotRunnable> {
        let line =
            String::from_utf8_lossy(line.split(|b| *b == b'\n').next().unwrap_or(&[])).into_owned();
        let mut words = line.split_whitespace();
        let Some(interpreter) = words.next() else {
            return Ok(());
        };
        let missing = |_| NotRunnable::NoInterpreter {
            program: program.to_string(),
            interpreter: interpreter.to_string(),
        };
        // The interpreter is itself an executable: its loader must be there too.
        self.check_at(interpreter, path, scripts).map_err(missing)?;
        match words.next() {
            Some(name) if interpreter.ends_with("/env") && !name.starts_with('-') => self
                .find(name, path)
                .map(|_| ())
                .map_err(|_| NotRunnable::NoInterpreter {
                    program: program.to_string(),
                    interpreter: format!("{interpreter} {name}"),
                }),
            _ => Ok(()),
        }
    }
}

/// The parts of `path`, `.` and empty ones left out.
fn components(path: &str) -> impl DoubleEndedIterator<Item = String> + '_ {
    path.split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .map(str::to_string)
}

/// What the staged environment holds at `path`. The staging tree is this build's own, made
/// by the confined install; links are read, never followed (a path through a staged link
/// that a layer above shadows is not the staging tree's), and an executable's head is read
/// beneath the staging root with no link on the way.
fn staged_node(staging: &Path, path: &str) -> Option<Node> {
    use std::os::unix::fs::PermissionsExt;
    let mut above = staging.to_path_buf();
    for part in Path::new(path).parent()?.components() {
        above.push(part);
        if !fs_err::symlink_metadata(&above).ok()?.file_type().is_dir() {
            return None;
        }
    }
    let full = staging.join(path);
    let meta = fs_err::symlink_metadata(&full).ok()?;
    if meta.file_type().is_symlink() {
        let target = fs_err::read_link(&full).ok()?;
        return Some(Node::Symlink(target.display().to_string()));
    }
    if meta.is_dir() {
        return Some(Node::Directory);
    }
    let head = match meta.permissions().mode() & 0o111 != 0 {
        true => crate::fs::open_input_beneath(staging, Path::new(path))
            .ok()
            .and_then(|file| read_head(file).ok()),
        false => None,
    };
    Some(Node::File { head })
}

/// The loader an ELF names (`PT_INTERP`), when its program headers lie within `head`.
fn elf_interpreter(head: &[u8]) -> Option<String> {
    match head.get(4)? {
        1 => interpreter_of::<object::elf::FileHeader32<Endianness>>(head),
        2 => interpreter_of::<object::elf::FileHeader64<Endianness>>(head),
        _ => None,
    }
}

fn interpreter_of<Elf: FileHeader<Endian = Endianness>>(head: &[u8]) -> Option<String> {
    let header = Elf::parse(head).ok()?;
    let endian = header.endian().ok()?;
    let headers = header.program_headers(endian, head).ok()?;
    headers.iter().find_map(|ph| {
        let bytes = ph.interpreter(endian, head).ok()??;
        Some(String::from_utf8_lossy(bytes).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(nodes: &[(&str, Node)]) -> BaseTree {
        let mut tree = BaseTree::default();
        for (path, node) in nodes {
            tree.insert(path.to_string(), node.clone());
        }
        tree
    }

    fn file(head: &[u8]) -> Node {
        Node::File {
            head: Some(head.to_vec()),
        }
    }

    #[test]
    fn an_elf_names_its_loader() {
        // This test's own executable: a dynamically linked ELF of the host, its head read
        // as the check reads one.
        let exe = fs_err::File::open(std::env::current_exe().unwrap()).unwrap();
        let loader = elf_interpreter(&read_head(exe).unwrap()).expect("a PT_INTERP");
        assert!(loader.starts_with("/lib"), "{loader}");
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn links_resolve_in_the_image_never_on_the_host() {
        // The host has /usr/bin/true; the image does not, so a link to it leads nowhere.
        assert!(Path::new("/usr/bin/true").exists());
        let staging = tempfile::tempdir().unwrap();
        let base = tree(&[
            ("app", Node::Directory),
            ("app/true", Node::Symlink("/usr/bin/true".into())),
            ("app/up", Node::Symlink("../../../../usr/bin/true".into())),
        ]);
        let image = ImageTree::new(&[], staging.path(), base);
        for program in ["/app/true", "/app/up"] {
            assert_eq!(
                image.check(program, "/usr/bin"),
                Err(NotRunnable::Missing {
                    program: program.to_string(),
                    missing: "usr".to_string()
                })
            );
        }
    }

    #[test]
    fn scripts_need_their_interpreter_and_env_its_program() {
        let staging = tempfile::tempdir().unwrap();
        let base = tree(&[
            ("bin", Node::Directory),
            ("usr", Node::Directory),
            ("usr/bin", Node::Directory),
            ("bin/sh", file(b"not an ELF")),
            ("usr/bin/env", file(b"not an ELF")),
            ("bin/run", file(b"#!/bin/sh -e\necho")),
            ("bin/py", file(b"#!/usr/bin/env python3\n")),
            ("bin/bash-it", file(b"#!/bin/bash\n")),
            ("bin/link", Node::Symlink("run".into())),
            ("bin/loop", Node::Symlink("loop".into())),
            ("bin/self", file(b"#!/bin/self\n")),
        ]);
        let image = ImageTree::new(&[], staging.path(), base);
        let path = "/usr/bin:/bin";
        assert_eq!(image.check("run", path), Ok(()));
        assert_eq!(image.check("/bin/link", path), Ok(()));
        assert!(matches!(
            image.check("/bin/py", path),
            Err(NotRunnable::NoInterpreter { interpreter, .. }) if interpreter == "/usr/bin/env python3"
        ));
        assert!(matches!(
            image.check("/bin/bash-it", path),
            Err(NotRunnable::NoInterpreter { interpreter, .. }) if interpreter == "/bin/bash"
        ));
        assert!(matches!(
            image.check("/bin/loop", path),
            Err(NotRunnable::Missing { .. })
        ));
        // A script that is its own interpreter stops at the kernel's depth.
        assert_eq!(image.check("/bin/self", path), Ok(()));
        assert!(matches!(
            image.check("python", path),
            Err(NotRunnable::NotOnPath { .. })
        ));
    }
}
