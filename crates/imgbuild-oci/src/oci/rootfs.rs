//! The file tree of a base image as a container sees it: each layer's entries applied in
//! order, whiteouts and opaque directories included. Only what tells whether a program can
//! start is kept: names, kinds, link targets and the first bytes of executable files (an
//! ELF's program headers, a script's `#!` line).

use std::{collections::BTreeMap, io::Read};

use tar::EntryType;

use super::base::{BaseImage, GlibcError};

/// How many bytes of an executable are kept: the ELF header and program headers of any
/// ordinary executable, or a `#!` line.
pub const HEAD: usize = 4096;
/// The most head bytes kept for one base: a base of tens of thousands of executables is
/// still read in bounded memory (beyond it, files are known without their heads).
const MAX_HEADS: usize = 32 << 20;

/// One entry of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Directory,
    /// A regular file; `head` its first bytes when it is executable (and within the bound).
    File {
        head: Option<Vec<u8>>,
    },
    /// A symbolic link, with its target as written.
    Symlink(String),
}

/// Paths relative to `/`, without a leading or trailing `/`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BaseTree {
    nodes: BTreeMap<String, Node>,
    head_bytes: usize,
}

impl BaseTree {
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    pub fn insert(&mut self, path: String, node: Node) {
        self.nodes.insert(path, node);
    }

    /// A whiteout: `path` and everything beneath it are gone.
    fn remove_tree(&mut self, path: &str) {
        self.nodes.remove(path);
        self.clear_beneath(path);
    }

    /// An opaque directory: what lower layers put beneath `dir` is gone.
    fn clear_beneath(&mut self, dir: &str) {
        let prefix = format!("{dir}/");
        let doomed: Vec<String> = self
            .nodes
            .range(prefix.clone()..)
            .take_while(|(path, _)| path.starts_with(&prefix))
            .map(|(path, _)| path.clone())
            .collect();
        for path in doomed {
            self.nodes.remove(&path);
        }
    }
}

/// `path` of a tar entry as a tree path: `./usr/bin/` → `usr/bin`.
pub fn tree_path(path: &str) -> String {
    path.trim_start_matches("./").trim_matches('/').to_string()
}

/// The tree of `base`, every layer read once, bottom first.
pub fn base_tree(base: &BaseImage) -> Result<BaseTree, GlibcError> {
    let mut tree = BaseTree::default();
    let layer_error = |digest, source| GlibcError::Layer { digest, source };
    base.walk_layers(layer_error, |digest, path, entry| {
        apply(&mut tree, path, entry).map_err(|source| layer_error(digest.to_string(), source))
    })?;
    Ok(tree)
}

/// One tar entry applied to `tree`.
fn apply(
    tree: &mut BaseTree,
    path: &str,
    entry: &mut tar::Entry<'_, Box<dyn Read>>,
) -> std::io::Result<()> {
    let path = tree_path(path);
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
    if name == ".wh..wh..opq" {
        tree.clear_beneath(dir);
        return Ok(());
    }
    if let Some(hidden) = name.strip_prefix(".wh.") {
        let gone = if dir.is_empty() {
            hidden.to_string()
        } else {
            format!("{dir}/{hidden}")
        };
        tree.remove_tree(&gone);
        return Ok(());
    }
    let header = entry.header();
    let node = match header.entry_type() {
        EntryType::Directory => Node::Directory,
        EntryType::Symlink => Node::Symlink(link_target(entry)?),
        // A hard link is its target's file.
        EntryType::Link => {
            let target = tree_path(&link_target(entry)?);
            tree.get(&target)
                .cloned()
                .unwrap_or(Node::File { head: None })
        }
        EntryType::Regular | EntryType::Continuous => {
            let executable = header.mode().unwrap_or(0) & 0o111 != 0;
            let head = match executable && tree.head_bytes < MAX_HEADS {
                true => Some(read_head(entry)?),
                false => None,
            };
            tree.head_bytes += head.as_ref().map_or(0, Vec::len);
            Node::File { head }
        }
        // Devices and fifos run nothing.
        _ => return Ok(()),
    };
    if !path.is_empty() {
        tree.insert(path, node);
    }
    Ok(())
}

fn link_target(entry: &tar::Entry<'_, Box<dyn Read>>) -> std::io::Result<String> {
    Ok(entry
        .link_name()?
        .map(|target| target.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// The first [`HEAD`] bytes of `reader`.
pub fn read_head(reader: impl Read) -> std::io::Result<Vec<u8>> {
    crate::fs::read_stream(reader.take(HEAD as u64), HEAD as u64).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_remove_what_lower_layers_put() {
        let mut tree = BaseTree::default();
        for path in ["usr", "usr/bin", "usr/bin/sh", "usr/lib", "usr/lib/a"] {
            tree.insert(path.to_string(), Node::Directory);
        }
        tree.remove_tree("usr/bin");
        tree.clear_beneath("usr/lib");
        assert_eq!(tree.get("usr/bin/sh"), None);
        assert_eq!(tree.get("usr/bin"), None);
        assert_eq!(tree.get("usr/lib/a"), None);
        assert_eq!(tree.get("usr/lib"), Some(&Node::Directory));
        assert_eq!(tree_path("./usr/bin/"), "usr/bin");
    }
}
