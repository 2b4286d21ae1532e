//! An image's root filesystem unpacked into a private directory, where the framework check
//! runs the image's own Python (see [`super::sandbox`]).
//!
//! The layers are strangers' archives and imgbuild often runs as root, so every write is
//! confined by construction: the root is opened once as a `cap-std` directory and every
//! path is resolved beneath it, so no `..`, absolute link or link planted by an earlier
//! entry can lead a write outside; links themselves are kept as written, absolute ones
//! included, for the sandbox's `chroot` to resolve, and an entry that would need one
//! followed out of the root is refused, naming it. What a container could use against the
//! host is left out: device nodes and fifos are not made, set-user-ID and set-group-ID bits
//! are dropped, and `dev`, `proc` and `sys` stay empty for the sandbox to mount. Whiteouts
//! and opaque directories apply as a container runtime applies them (one that names no file
//! is refused). Bytes and entries are bounded.

use std::{
    io::Read,
    os::unix::fs::PermissionsExt,
    path::{Component, Path, PathBuf},
};

use cap_std::fs::{Dir, OpenOptions, Permissions};
use tar::EntryType;

use crate::{
    compression::bounded::{self, Bound, Bounded},
    oci::base::BaseImage,
};

/// The most bytes the files of an unpacked image may hold: the largest real ML images are
/// 20 to 30 GB unpacked.
pub const MAX_ROOTFS: u64 = 64 << 30;
/// Replaces [`MAX_ROOTFS`] (bytes, a positive integer).
pub const MAX_ROOTFS_ENV: &str = "IMGBUILD_SMOKE_MAX_ROOTFS_BYTES";
/// The most entries all layers together may hold.
const MAX_ENTRIES: usize = 4_000_000;
/// Top-level directories the sandbox mounts; an image's own are not unpacked.
const MOUNTED: [&str; 3] = ["dev", "proc", "sys"];
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    TooLarge(bounded::TooLarge),
    #[error("layer `{layer}` has more than {MAX_ENTRIES} entries")]
    TooManyEntries { layer: String },
    #[error("`{path}` in layer `{layer}` leads outside the image's root (`..` above it)")]
    Outside { layer: String, path: String },
    #[error("`{path}` in layer `{layer}` is a hard link to `{target}`, outside the image's root")]
    LinkOutside {
        layer: String,
        path: String,
        target: String,
    },
    #[error(
        "`{path}` in layer `{layer}` lies beneath `{link}`, a link to `{target}` that leads to no directory inside the image's root"
    )]
    BeneathLink {
        layer: String,
        path: String,
        link: String,
        target: String,
    },
    #[error("`{path}` in layer `{layer}` is a whiteout that names no file")]
    BadWhiteout { layer: String, path: String },
    #[error("cannot unpack `{path}` of layer `{layer}`")]
    Entry {
        layer: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("Failed to read layer `{digest}` of the image")]
    Layer {
        digest: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the private root in `{}`", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An unpacked image; removed on drop.
#[derive(Debug)]
pub struct UnpackedRoot {
    pub dir: tempfile::TempDir,
}

impl UnpackedRoot {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Unpacks `image`, later layers over earlier ones.
pub fn unpack(image: &BaseImage) -> Result<UnpackedRoot, UnpackError> {
    let root_error = |source| UnpackError::Root {
        path: std::env::temp_dir(),
        source,
    };
    let dir = tempfile::Builder::new()
        .prefix("imgbuild-rootfs-")
        .tempdir()
        .map_err(root_error)?;
    // Others must reach the tree: the check runs as a user that is not root.
    fs_err::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(root_error)?;
    let root =
        Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).map_err(root_error)?;
    let max = bounded::env_u64(MAX_ROOTFS_ENV).unwrap_or(MAX_ROOTFS);
    let mut writer = RootWriter {
        root,
        max,
        left: max,
        entries: 0,
    };
    let layer_error = |digest, source| UnpackError::Layer { digest, source };
    image.walk_layers(layer_error, |layer, path, entry| {
        writer.apply(layer, path, entry)
    })?;
    for name in MOUNTED {
        writer
            .root
            .create_dir_all(name)
            .map_err(|source| writer.error(".", name, source))?;
    }
    Ok(UnpackedRoot { dir })
}

struct RootWriter {
    root: Dir,
    /// The most the files may hold, all layers together.
    max: u64,
    left: u64,
    entries: usize,
}

impl RootWriter {
    fn error(&self, layer: &str, path: &str, source: std::io::Error) -> UnpackError {
        UnpackError::Entry {
            layer: layer.into(),
            path: path.into(),
            source,
        }
    }

    fn apply(
        &mut self,
        layer: &str,
        path: &str,
        entry: &mut tar::Entry<'_, Box<dyn Read>>,
    ) -> Result<(), UnpackError> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(UnpackError::TooManyEntries {
                layer: layer.into(),
            });
        }
        let rel = plain(path).ok_or_else(|| UnpackError::Outside {
            layer: layer.into(),
            path: path.into(),
        })?;
        let top = rel.components().next();
        if top.is_none_or(|c| MOUNTED.iter().any(|m| c.as_os_str() == *m)) {
            return Ok(());
        }
        let io = |source| self.error(layer, path, source);
        let name = rel.file_name().unwrap_or_default().to_string_lossy();
        let parent = rel.parent().unwrap_or(Path::new(""));
        if name == OPAQUE {
            return self.clear(parent).map_err(io);
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            // `.wh.`, `.wh..` and `.wh...` would remove their own directory or its parent.
            if matches!(hidden, "" | "." | "..") {
                return Err(UnpackError::BadWhiteout {
                    layer: layer.into(),
                    path: path.into(),
                });
            }
            return self.remove(&parent.join(hidden)).map_err(io);
        }
        if !parent.as_os_str().is_empty() {
            self.root
                .create_dir_all(parent)
                .map_err(|source| match self.planted_link(parent) {
                    Some((link, target)) => UnpackError::BeneathLink {
                        layer: layer.into(),
                        path: path.into(),
                        link: link.display().to_string(),
                        target: target.display().to_string(),
                    },
                    None => io(source),
                })?;
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
        match entry.header().entry_type() {
            EntryType::Directory => self.directory(&rel, mode).map_err(io),
            EntryType::Regular | EntryType::Continuous => {
                self.remove(&rel).map_err(io)?;
                self.file(layer, path, &rel, mode, entry)
            }
            EntryType::Symlink => {
                let target = entry.link_name().map_err(io)?.unwrap_or_default();
                self.remove(&rel).map_err(io)?;
                // Kept as written, absolute (`/etc/alternatives/…`) or not: it is resolved in
                // the sandbox's chroot, and never followed here, where every path is
                // resolved beneath the root.
                self.root.symlink_contents(&target, &rel).map_err(io)
            }
            EntryType::Link => {
                let target = entry.link_name().map_err(io)?.unwrap_or_default();
                let target = target.to_string_lossy();
                let target = plain(&target).ok_or_else(|| UnpackError::LinkOutside {
                    layer: layer.into(),
                    path: path.into(),
                    target: target.to_string(),
                })?;
                self.remove(&rel).map_err(io)?;
                self.root.hard_link(&target, &self.root, &rel).map_err(io)
            }
            // Devices and fifos: nothing a Python check needs, and nothing to give it.
            _ => Ok(()),
        }
    }

    fn directory(&self, rel: &Path, mode: u32) -> std::io::Result<()> {
        match self.root.symlink_metadata(rel) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                self.root.remove_file(rel)?;
                self.root.create_dir(rel)?;
            }
            Err(_) => self.root.create_dir(rel)?,
        }
        // The owner keeps write access: later layers write beneath it.
        self.root
            .set_permissions(rel, Permissions::from_std(mode_bits(mode | 0o700)))
    }

    fn file(
        &mut self,
        layer: &str,
        path: &str,
        rel: &Path,
        mode: u32,
        entry: &mut tar::Entry<'_, Box<dyn Read>>,
    ) -> Result<(), UnpackError> {
        let io = |source| UnpackError::Entry {
            layer: layer.into(),
            path: path.into(),
            source,
        };
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        let mut out = self.root.open_with(rel, &options).map_err(io)?;
        let bound = Bound::new(
            self.left,
            format!("`{path}` in layer `{layer}`"),
            format!(
                "what is left of the {} bytes an unpacked image may hold; {MAX_ROOTFS_ENV} sets it",
                self.max
            ),
        );
        let written = std::io::copy(&mut Bounded::new(entry, bound), &mut out).map_err(|err| {
            match bounded::TooLarge::in_io(&err) {
                Some(too_large) => UnpackError::TooLarge(too_large.clone()),
                None => io(err),
            }
        })?;
        self.left = self.left.saturating_sub(written);
        out.set_permissions(Permissions::from_std(mode_bits(mode)))
            .map_err(io)
    }

    /// The first link among `dir` and its ancestors that leads to no directory beneath the
    /// root (out of it, as `usr/local -> /`, or nowhere), and its target: why `dir` cannot
    /// be made. Links are never followed out of the root, so an entry beneath one is refused.
    fn planted_link(&self, dir: &Path) -> Option<(PathBuf, PathBuf)> {
        let mut ancestors: Vec<&Path> = dir.ancestors().collect();
        ancestors.reverse();
        ancestors
            .into_iter()
            .filter(|a| !a.as_os_str().is_empty())
            .find(|a| {
                self.root
                    .symlink_metadata(a)
                    .is_ok_and(|m| m.file_type().is_symlink())
                    && !self.root.metadata(a).is_ok_and(|m| m.is_dir())
            })
            .map(|a| {
                let target = self.root.read_link_contents(a).unwrap_or_default();
                (a.to_path_buf(), target)
            })
    }

    /// Removes whatever is at `rel`, if anything.
    fn remove(&self, rel: &Path) -> std::io::Result<()> {
        match self.root.symlink_metadata(rel) {
            Ok(meta) if meta.is_dir() => self.root.remove_dir_all(rel),
            Ok(_) => self.root.remove_file(rel),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// An opaque directory: what lower layers put in `dir` is gone.
    fn clear(&self, dir: &Path) -> std::io::Result<()> {
        let Ok(entries) = self.root.read_dir(dir) else {
            return Ok(());
        };
        for entry in entries {
            self.remove(&dir.join(entry?.file_name()))?;
        }
        Ok(())
    }
}

fn mode_bits(mode: u32) -> std::fs::Permissions {
    std::fs::Permissions::from_mode(mode)
}

/// `path` as plain names beneath the root (`./a/b/`, `/a/b` and `a/./b` are `a/b`); `None`
/// when a `..` would climb out. An empty path is the root itself.
fn plain(path: &str) -> Option<PathBuf> {
    let mut names = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if !names.pop() {
                    return None;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_plain_names_or_refused() {
        assert_eq!(plain("./usr/bin/"), Some(PathBuf::from("usr/bin")));
        assert_eq!(plain("/a/./b/../c"), Some(PathBuf::from("a/c")));
        assert_eq!(plain("./"), Some(PathBuf::new()));
        assert_eq!(plain("../etc/passwd"), None);
        assert_eq!(plain("a/../../etc"), None);
    }
}
