//! The layer of one `[[files]]` entry: `src` (a file, or a directory walked in sorted
//! order) read from the build host into entries at `dest`, with the entry's owner and mode.
//!
//! Nothing is written on the host and nothing outside the build context is read: every
//! read resolves beneath one handle on the context ([`crate::fs::context`]). `src` itself
//! may not be a link, a link inside it must point inside it (relative, not climbing out),
//! only files, directories and links are taken, and every name taken follows the recipe's
//! rule for names (no control or bidirectional characters). Each file's sha256 is part of the layer's cache
//! key, so a changed file makes a new layer and an unchanged tree is taken from the cache.
//!
//! The directories above `dest` are not in the layer: they are the base's (or the accounts
//! layer's, with their owners) or made by the runtime as it unpacks.

use std::{
    io::Read,
    os::unix::fs::MetadataExt,
    path::{Component, Path},
    sync::Arc,
};

use sha2::{Digest, Sha256};

use super::{
    accounts_layer::{Merged, resolve},
    error::BuildError,
};
use crate::{
    fs::context::{BuildContext, ContextError, ContextFile, special_kind},
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
        context: open_context(recipe, copy)?,
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

/// The build context of `copy`: the recipe's directory, or the one `context` names, which
/// must then lie beneath the directory imgbuild runs in (the invoker's choice, as
/// `docker build DIR` is), so a recipe cannot widen its reach to the whole host.
fn open_context(recipe: &Recipe, copy: &FileCopy) -> Result<Arc<BuildContext>, BuildError> {
    let shown = || crate::recipe::visible(&copy.context.to_string_lossy());
    let Some(span) = &copy.context_span else {
        return BuildContext::open(&copy.context).map_err(|e| {
            at(
                recipe,
                &copy.src_span,
                format!("cannot open the build context `{}`: {e}", shown()),
            )
        });
    };
    let cwd = std::env::current_dir().map_err(|e| {
        at(
            recipe,
            span,
            format!("cannot tell the working directory: {e}"),
        )
    })?;
    BuildContext::open_beneath(&cwd, &copy.context).map_err(|e| {
        let why = match e {
            ContextError::Outside(_) => format!(
                "is not beneath the directory imgbuild runs in (`{}`); a `context` may widen the build context up to it, no further",
                cwd.display()
            ),
            other => format!("cannot be opened: {other}"),
        };
        at(recipe, span, format!("`context` `{}` {why}", shown()))
    })
}

/// What the lock pins of each `[[files]]` source, in the recipe's order: the digest of the
/// entries its layer would hold (paths, modes, kinds, link targets, file sha256s), owners
/// left out (they are the recipe's). Walks every source; a source that cannot be walked
/// is the same error the layer would give.
pub(crate) fn source_digests(recipe: &Recipe) -> Result<Vec<SourceDigest>, BuildError> {
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

/// One source's walk, collecting entries. Every read goes through `context`.
struct Walker<'a> {
    recipe: &'a Recipe,
    copy: &'a FileCopy,
    context: Arc<BuildContext>,
    uid: u32,
    gid: u32,
    entries: Vec<OwnedEntry>,
}

impl Walker<'_> {
    fn walk(mut self) -> Result<Vec<OwnedEntry>, BuildError> {
        let copy = self.copy;
        let kind = match self.context.file_type(&copy.src) {
            Ok(kind) => kind,
            Err(err) if err.is_not_found() => {
                return Err(self.at_src(format!(
                    "`src` `{}` does not exist (looked for `{}`)",
                    copy.src_text,
                    self.shown(&copy.src)
                )));
            }
            Err(err) => return Err(self.read_error(&copy.src, err)),
        };
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
            self.push_file(&copy.src, dest)?;
        } else {
            return Err(self.at_src(format!(
                "`src` `{}` is {}; only files and directories can be copied",
                copy.src_text,
                special_kind(&kind)
            )));
        }
        Ok(self.entries)
    }

    /// `exclude`, then the lines of the first ignore file at the top of `src`: a regular
    /// file, read beneath the context like every other (a link or a fifo is refused).
    fn excludes(&self) -> Result<crate::recipe::files::Excludes, BuildError> {
        let mut excludes = self.copy.exclude.clone();
        for name in IGNORE_FILES {
            let path = self.copy.src.join(name);
            let bytes = match self.context.read_bounded(&path, MAX_IGNORE_BYTES) {
                Ok(bytes) => bytes,
                Err(err) if err.is_not_found() => continue,
                Err(err) => return Err(self.read_error(&path, err)),
            };
            let text = String::from_utf8(bytes)
                .map_err(|_| self.at_src(format!("`{}` is not UTF-8 text", self.shown(&path))))?;
            for (number, line) in text.lines().enumerate() {
                excludes.push(line).map_err(|e| {
                    self.at_src(format!("`{}` line {}: {e}", self.shown(&path), number + 1))
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
        let mut entries = Vec::new();
        for (name, kind) in self
            .context
            .read_dir(dir)
            .map_err(|e| self.read_error(dir, e))?
        {
            let name = name.into_string().map_err(|name| {
                self.at_src(format!(
                    "`{}` has a name that is not UTF-8, which an image layer cannot carry faithfully",
                    self.shown(&dir.join(name))
                ))
            })?;
            entries.push((name, kind));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind) in entries {
            let path = dir.join(&name);
            let rel = join(rel, &name);
            if excludes.excludes(&rel, kind.is_dir()) {
                continue;
            }
            self.check_name(&path, &name, "has a name that")?;
            let dest = join(at, &name);
            if kind.is_dir() {
                self.push_dir(dest.clone())?;
                self.walk_dir(&path, &rel, &dest, excludes)?;
            } else if kind.is_symlink() {
                self.push_link(&path, &rel, dest)?;
            } else if kind.is_file() {
                self.push_file(&path, dest)?;
            } else {
                return Err(self.at_src(format!(
                    "`{}` is {}; only files, directories and links can be copied",
                    self.shown(&path),
                    special_kind(&kind)
                )));
            }
        }
        Ok(())
    }

    /// `name` (of `path`) follows the recipe's rule for names: no control or bidirectional
    /// characters, which would go into the layer and reorder or hide what a listing shows.
    fn check_name(&self, path: &Path, name: &str, what: &str) -> Result<(), BuildError> {
        match crate::recipe::name_problem(name) {
            None => Ok(()),
            Some(problem) => Err(self.at_src(format!("`{}` {what} {problem}", self.shown(path)))),
        }
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
        let target = self
            .context
            .read_link(path)
            .map_err(|e| self.read_error(path, e))?;
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
        let Some(text) = target.to_str().filter(|_| inside) else {
            return Err(self.at_src(format!(
                "`{}` is a link to `{}`, outside `src` `{}`: links must point inside the directory copied",
                self.shown(path),
                crate::recipe::visible(&target.to_string_lossy()),
                self.copy.src_text
            )));
        };
        self.check_name(path, text, "is a link whose target")?;
        self.push(dest, 0o777, Content::Symlink(target))
    }

    /// A file with its size and sha256 as they are now, read from the descriptor the
    /// context opened; the tar writer opens it again the same way and checks both.
    fn push_file(&mut self, path: &Path, dest: String) -> Result<(), BuildError> {
        let (mut file, meta) = self
            .context
            .open_file(path)
            .map_err(|e| self.read_error(path, e))?;
        let mode = self.copy.mode.unwrap_or(if meta.mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        });
        let mut hasher = Sha256::new();
        let mut buffer = vec![0; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = file
                .read(&mut buffer)
                .map_err(|e| self.read_error(path, ContextError::Io(e)))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            size += n as u64;
        }
        let content = Content::File {
            source: ContextFile {
                context: self.context.clone(),
                path: path.to_path_buf(),
            },
            size,
            sha256: hex::encode(hasher.finalize()),
        };
        self.push(dest, mode, content)
    }

    /// `rel` on the host, safe to print.
    fn shown(&self, rel: &Path) -> String {
        crate::recipe::visible(&self.context.host_path(rel).to_string_lossy())
    }

    fn at_src(&self, message: String) -> BuildError {
        at(self.recipe, &self.copy.src_span, message)
    }

    fn read_error(&self, path: &Path, err: ContextError) -> BuildError {
        self.at_src(format!("cannot read `{}`: {err}", self.shown(path)))
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
