//! The layer of one `[[files]]` entry: `src` (a file, or a directory walked in sorted
//! order) read from the build host into entries at `dest`, with the entry's owner and mode.
//!
//! Nothing is written on the host and nothing outside `src` is read: `src` itself may not
//! be a link, a link inside it must point inside it (relative, not climbing out), and only
//! files, directories and links are taken. Each file's sha256 is part of the layer's cache
//! key, so a changed file makes a new layer and an unchanged tree is taken from the cache.
//!
//! The directories above `dest` are not in the layer: they are the base's (or the accounts
//! layer's, with their owners) or made by the runtime as it unpacks.

use std::{
    io::Read,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Component, Path},
};

use sha2::{Digest, Sha256};

use super::{
    BuildError,
    accounts::{Merged, resolve},
};
use crate::{
    layers::{LayerKind, OwnedEntry, OwnedLayer, owned::Content},
    lock::SourceDigest,
    recipe::{Recipe, RecipeError, SourceSpan, files::FileCopy},
};

/// The most entries one `[[files]]` source may hold: more is a mistake (a home directory, a
/// whole disk), refused before the layer is made.
pub(super) const MAX_ENTRIES: usize = 100_000;

/// The ignore files read from the top of a directory `src`, the first found.
const IGNORE_FILES: [&str; 2] = [".imgbuildignore", ".dockerignore"];

/// The most bytes of an ignore file.
const MAX_IGNORE_BYTES: u64 = 1 << 20;

/// The layer of `copy`, with names in `owner` resolved in `tables`.
pub(super) fn files_layer(
    recipe: &Recipe,
    copy: &FileCopy,
    tables: Option<&Merged>,
    mtime: u64,
) -> Result<OwnedLayer, BuildError> {
    let (uid, gid) = match (&copy.owner, tables) {
        (Some((owner, span)), Some(tables)) => {
            resolve(recipe, "`owner`", owner, Some(span), tables)?
        }
        _ => (0, 0),
    };
    let walker = Walker {
        recipe,
        copy,
        uid,
        gid,
        entries: Vec::new(),
    };
    let entries = walker.walk()?;
    Ok(OwnedLayer::without_parents(
        LayerKind::Files,
        format!("files {}", copy.dest),
        entries,
        mtime,
    ))
}

/// What the lock pins of each `[[files]]` source, in the recipe's order: the digest of the
/// entries its layer would hold (paths, modes, kinds, link targets, file sha256s), owners
/// left out (they are the recipe's). Walks every source; a source that cannot be walked
/// is the same error the layer would give.
pub fn source_digests(recipe: &Recipe) -> Result<Vec<SourceDigest>, BuildError> {
    recipe
        .files
        .iter()
        .map(|copy| {
            Ok(SourceDigest {
                src: copy.src_text.clone(),
                digest: files_layer(recipe, copy, None, 0)?.content_digest(),
            })
        })
        .collect()
}

/// One source's walk, collecting entries.
struct Walker<'a> {
    recipe: &'a Recipe,
    copy: &'a FileCopy,
    uid: u32,
    gid: u32,
    entries: Vec<OwnedEntry>,
}

impl Walker<'_> {
    fn walk(mut self) -> Result<Vec<OwnedEntry>, BuildError> {
        let copy = self.copy;
        let meta = match std::fs::symlink_metadata(&copy.src) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(self.at_src(format!(
                    "`src` `{}` does not exist (looked for `{}`)",
                    copy.src_text,
                    copy.src.display()
                )));
            }
            Err(err) => return Err(self.read_error(&copy.src, err)),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(self.at_src(format!(
                "`src` `{}` is a symbolic link; name the file or directory itself",
                copy.src_text
            )));
        }
        if kind.is_dir() {
            let excludes = self.excludes()?;
            let top = in_image(&copy.dest).to_string();
            self.push_dir(top.clone())?;
            self.walk_dir(&copy.src, "", &top, &excludes)?;
        } else if kind.is_file() {
            let dest = if copy.dest_is_dir || copy.dest == "/" {
                let name = copy.src.file_name().unwrap_or_default().to_string_lossy();
                join(in_image(&copy.dest), &name)
            } else {
                in_image(&copy.dest).to_string()
            };
            self.push_file(&copy.src, dest, &meta)?;
        } else {
            return Err(self.at_src(format!(
                "`src` `{}` is a {}; only files and directories can be copied",
                copy.src_text,
                crate::fs::file_kind(&kind)
            )));
        }
        Ok(self.entries)
    }

    /// `exclude`, then the lines of the first ignore file at the top of `src`.
    fn excludes(&self) -> Result<crate::recipe::files::Excludes, BuildError> {
        let mut excludes = self.copy.exclude.clone();
        for name in IGNORE_FILES {
            let path = self.copy.src.join(name);
            if std::fs::symlink_metadata(&path).is_err() {
                continue;
            }
            let text = crate::fs::read_input_text(&path, MAX_IGNORE_BYTES)
                .map_err(|e| self.at_src(format!("cannot read `{}`: {e}", path.display())))?;
            for (number, line) in text.lines().enumerate() {
                excludes.push(line).map_err(|e| {
                    self.at_src(format!("`{}` line {}: {e}", path.display(), number + 1))
                })?;
            }
            // The ignore file says what to leave out; it is not part of the image.
            excludes.push(&format!("/{name}")).expect("a plain pattern");
            break;
        }
        Ok(excludes)
    }

    /// The directory `dir` (at `rel` under `src`, `at` in the image), its entries sorted by
    /// name.
    fn walk_dir(
        &mut self,
        dir: &Path,
        rel: &str,
        at: &str,
        excludes: &crate::recipe::files::Excludes,
    ) -> Result<(), BuildError> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| self.read_error(dir, e))? {
            let entry = entry.map_err(|e| self.read_error(dir, e))?;
            let name = entry.file_name().into_string().map_err(|name| {
                self.at_src(format!(
                    "`{}` has a name that is not UTF-8, which an image layer cannot carry faithfully",
                    dir.join(name).display()
                ))
            })?;
            names.push(name);
        }
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let rel = join(rel, &name);
            let meta = std::fs::symlink_metadata(&path).map_err(|e| self.read_error(&path, e))?;
            let kind = meta.file_type();
            if excludes.excludes(&rel, kind.is_dir()) {
                continue;
            }
            let dest = join(at, &name);
            if kind.is_dir() {
                self.push_dir(dest.clone())?;
                self.walk_dir(&path, &rel, &dest, excludes)?;
            } else if kind.is_symlink() {
                self.push_link(&path, &rel, dest)?;
            } else if kind.is_file() {
                self.push_file(&path, dest, &meta)?;
            } else {
                return Err(self.at_src(format!(
                    "`{}` is a {}; only files, directories and links can be copied",
                    path.display(),
                    if kind.is_fifo() {
                        "named pipe"
                    } else {
                        crate::fs::file_kind(&kind)
                    }
                )));
            }
        }
        Ok(())
    }

    fn push(&mut self, path: String, mode: u32, content: Content) -> Result<(), BuildError> {
        if self.entries.len() >= MAX_ENTRIES {
            return Err(self.at_src(format!(
                "`src` `{}` holds more than {MAX_ENTRIES} files, directories and links; copy less, or leave some out with `exclude`",
                self.copy.src_text
            )));
        }
        self.entries.push(OwnedEntry {
            path,
            uid: self.uid,
            gid: self.gid,
            mode,
            content,
        });
        Ok(())
    }

    fn push_dir(&mut self, path: String) -> Result<(), BuildError> {
        // `/` itself is never an entry.
        if path.is_empty() {
            return Ok(());
        }
        let mode = self.copy.mode.map_or(0o755, directory_mode);
        self.push(path, mode, Content::Directory)
    }

    /// A link kept as it is, when it points inside `src`: relative, and not climbing above
    /// the top of `src` from where it is.
    fn push_link(&mut self, path: &Path, rel: &str, dest: String) -> Result<(), BuildError> {
        let target = std::fs::read_link(path).map_err(|e| self.read_error(path, e))?;
        let mut depth = rel.matches('/').count() as i64;
        let mut inside = !target.as_os_str().is_empty();
        for component in target.components() {
            match component {
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::ParentDir => depth -= 1,
                Component::RootDir | Component::Prefix(_) => inside = false,
            }
            if depth < 0 {
                inside = false;
            }
        }
        if !inside || target.to_str().is_none() {
            return Err(self.at_src(format!(
                "`{}` is a link to `{}`, outside `src` `{}`: links must point inside the directory copied",
                path.display(),
                target.display(),
                self.copy.src_text
            )));
        }
        self.push(dest, 0o777, Content::Symlink(target))
    }

    /// A file with its size and sha256 as they are now; the tar writer checks them again.
    fn push_file(
        &mut self,
        path: &Path,
        dest: String,
        meta: &std::fs::Metadata,
    ) -> Result<(), BuildError> {
        let mode = self.copy.mode.unwrap_or(if meta.mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        });
        let mut hasher = Sha256::new();
        let mut file = fs_err::File::open(path).map_err(|e| self.read_error(path, e))?;
        let mut buffer = vec![0; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = file
                .read(&mut buffer)
                .map_err(|e| self.read_error(path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            size += n as u64;
        }
        let content = Content::File {
            source: path.to_path_buf(),
            size,
            sha256: hex::encode(hasher.finalize()),
        };
        self.push(dest, mode, content)
    }

    fn at_src(&self, message: String) -> BuildError {
        at(self.recipe, &self.copy.src_span, message)
    }

    fn read_error(&self, path: &Path, err: std::io::Error) -> BuildError {
        self.at_src(format!("cannot read `{}`: {err}", path.display()))
    }
}

fn at(recipe: &Recipe, span: &SourceSpan, message: String) -> BuildError {
    BuildError::Recipe(RecipeError::Invalid {
        path: recipe.path.clone(),
        message,
        span: Some(span.clone()),
    })
}

/// A file mode's directory counterpart: x wherever r is (`0644` → `0755`, `0640` → `0750`).
fn directory_mode(mode: u32) -> u32 {
    mode | ((mode & 0o444) >> 2)
}

/// An absolute in-image path as a layer entry's path (`/` is empty).
fn in_image(path: &str) -> &str {
    path.trim_matches('/')
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_get_x_where_files_have_r() {
        assert_eq!(directory_mode(0o644), 0o755);
        assert_eq!(directory_mode(0o640), 0o750);
        assert_eq!(directory_mode(0o600), 0o700);
        assert_eq!(directory_mode(0o755), 0o755);
    }
}
