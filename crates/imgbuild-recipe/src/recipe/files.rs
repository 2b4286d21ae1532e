//! `[[files]]`: the recipe's own files and directories, checked as written. What only the
//! file system can say (that `src` exists, what is in it, where its links point) is checked
//! when the layer is made, at these spans, so those errors point at the recipe too.

use std::path::PathBuf;

use glob::{MatchOptions, Pattern};
use toml::Spanned;

use super::{
    checker::{Checker, MAX_ID, UserPart, lexical_path, user_part},
    error::{RecipeError, SourceSpan},
    schema::FilesEntry,
};

/// One `[[files]]` entry, checked.
#[derive(Debug, Clone)]
pub struct FileCopy {
    /// `src` as written, for messages and the layer's name.
    pub src_text: String,
    /// `src` relative to `context`, lexically (`a/../b` is `b`): only names, never `..`;
    /// empty for the context's top.
    pub src: PathBuf,
    pub src_span: SourceSpan,
    /// The build context: the directory `src` is read beneath and nothing outside it, the
    /// recipe's own unless `context` names another.
    pub context: PathBuf,
    /// Where `context` is written, when it is: a context other than the recipe's
    /// directory must lie beneath the directory imgbuild runs in.
    pub context_span: Option<SourceSpan>,
    /// Absolute in-image path, as written but without a trailing `/`; `ends_with_slash`
    /// says a file goes into it rather than becoming it.
    pub dest: String,
    pub dest_is_dir: bool,
    pub dest_span: SourceSpan,
    /// `UID:GID`, `uid`, `name` or `name:group`, resolved against the image's accounts when
    /// the layer is made; `None`: root.
    pub owner: Option<(String, SourceSpan)>,
    /// Permission bits of files (`0o644`); directories get the matching x bits. `None`:
    /// 0755 for executables, else 0644, and 0755 for directories, as package layers.
    pub mode: Option<u32>,
    /// `exclude`, in the recipe's order.
    pub exclude: Excludes,
}

/// Paths to leave out: `exclude` globs and the lines of an `.imgbuildignore` or
/// `.dockerignore`, gitignore-style. A pattern without `/` matches a name at any depth, one
/// with `/` the path from the top of `src`; a trailing `/` matches directories only; `!`
/// takes a path back in; the last pattern that matches decides. A directory left out is
/// left out whole.
#[derive(Debug, Clone, Default)]
pub struct Excludes {
    rules: Vec<IgnoreRule>,
}

#[derive(Debug, Clone)]
struct IgnoreRule {
    pattern: Pattern,
    negated: bool,
    dir_only: bool,
}

impl Excludes {
    /// Adds one pattern; `Ok(false)` for a blank line or a `#` comment.
    pub fn push(&mut self, line: &str) -> Result<bool, glob::PatternError> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(false);
        }
        let (negated, line) = match line.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let (dir_only, line) = match line.strip_suffix('/') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let line = line.trim_start_matches("./");
        let pattern = match line.strip_prefix('/') {
            Some(anchored) => anchored.to_string(),
            None if line.contains('/') => line.to_string(),
            None => format!("**/{line}"),
        };
        self.rules.push(IgnoreRule {
            pattern: Pattern::new(&pattern)?,
            negated,
            dir_only,
        });
        Ok(true)
    }

    /// Whether `path` (relative to `src`, `/`-separated) is left out.
    pub fn excludes(&self, path: &str, is_dir: bool) -> bool {
        let options = MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        self.rules
            .iter()
            .rev()
            .find(|rule| (!rule.dir_only || is_dir) && rule.pattern.matches_with(path, options))
            .is_some_and(|rule| !rule.negated)
    }
}

impl Checker {
    /// `[[files]]`, resolving each `src` against `recipe_dir`.
    pub(super) fn files(
        &self,
        entries: &[Spanned<FilesEntry>],
        recipe_dir: &std::path::Path,
    ) -> Result<Vec<FileCopy>, RecipeError> {
        entries
            .iter()
            .map(|entry| self.file_copy(entry.get_ref(), recipe_dir))
            .collect()
    }

    fn file_copy(
        &self,
        entry: &FilesEntry,
        recipe_dir: &std::path::Path,
    ) -> Result<FileCopy, RecipeError> {
        let src = &entry.src;
        self.visible_only(src, "`src`")?;
        if src.get_ref().is_empty() || src.get_ref().starts_with('/') {
            return Err(self.error(
                src,
                "`src` must be a path relative to the recipe (a file or a directory)",
            ));
        }
        let (context, context_span) = self.context(entry.context.as_ref(), recipe_dir)?;
        let Some(src_rel) = beneath(src.get_ref()) else {
            return Err(self.error(
                src,
                format!(
                    "`src` `{}` climbs out of the build context `{}`: files are read beneath the recipe's directory, or beneath the directory `context` names (`context = \"..\"` widens it)",
                    src.get_ref(),
                    context.display()
                ),
            ));
        };
        let (dest, dest_is_dir) = self.dest(&entry.dest)?;
        let owner = entry
            .owner
            .as_ref()
            .map(|owner| self.owner(owner))
            .transpose()?;
        let mode = entry
            .mode
            .as_ref()
            .map(|mode| self.mode(mode))
            .transpose()?;
        let mut exclude = Excludes::default();
        for glob in &entry.exclude {
            exclude
                .push(glob.get_ref())
                .map_err(|err| self.error(glob, format!("invalid `exclude` glob: {err}")))?;
        }
        Ok(FileCopy {
            src_text: src.get_ref().clone(),
            src: src_rel,
            src_span: self.span(src.span()),
            context,
            context_span,
            dest,
            dest_is_dir,
            dest_span: self.span(entry.dest.span()),
            owner,
            mode,
            exclude,
        })
    }

    /// `context`: a directory relative to the recipe's (or absolute); the recipe's own
    /// directory without it.
    fn context(
        &self,
        context: Option<&Spanned<String>>,
        recipe_dir: &std::path::Path,
    ) -> Result<(PathBuf, Option<SourceSpan>), RecipeError> {
        let Some(context) = context else {
            return Ok((recipe_dir.to_path_buf(), None));
        };
        self.visible_only(context, "`context`")?;
        if context.get_ref().is_empty() {
            return Err(self.error(
                context,
                "`context` must name a directory, relative to the recipe (`..`) or absolute",
            ));
        }
        let dir = lexical_path(&recipe_dir.join(context.get_ref()));
        Ok((dir, Some(self.span(context.span()))))
    }

    /// `dest`: absolute, no `.` or `..` or empty components, nothing hidden. A trailing `/`
    /// is kept as a flag.
    fn dest(&self, dest: &Spanned<String>) -> Result<(String, bool), RecipeError> {
        self.visible_only(dest, "`dest`")?;
        let raw = dest.get_ref();
        let trimmed = raw.trim_end_matches('/');
        let valid = raw.starts_with('/')
            && trimmed
                .split('/')
                .skip(1)
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !valid {
            return Err(self.error(
                dest,
                format!(
                    "`dest` `{raw}` must be an absolute path in the image without `.`, `..` or `//`"
                ),
            ));
        }
        let dest = if trimmed.is_empty() { "/" } else { trimmed };
        Ok((dest.to_string(), raw.ends_with('/')))
    }

    /// `owner`: `UID:GID`, `uid`, `name` or `name:group`, as `[image] user`.
    fn owner(&self, owner: &Spanned<String>) -> Result<(String, SourceSpan), RecipeError> {
        let raw = owner.get_ref();
        let parts: Vec<&str> = raw.splitn(2, ':').collect();
        for part in &parts {
            match user_part(part) {
                UserPart::Id | UserPart::Name => {}
                UserPart::IdOutOfRange => {
                    return Err(
                        self.error(owner, format!("`owner` ID `{part}` is outside 0..{MAX_ID}"))
                    );
                }
                UserPart::Invalid => {
                    return Err(self.error(
                        owner,
                        "`owner` must be `UID:GID`, `uid`, `name` or `name:group`",
                    ));
                }
            }
        }
        Ok((raw.clone(), self.span(owner.span())))
    }

    /// `mode`: three octal digits, optionally after a `0` (`0644`, `755`).
    fn mode(&self, mode: &Spanned<String>) -> Result<u32, RecipeError> {
        let raw = mode.get_ref();
        let digits = if raw.len() == 4 {
            raw.strip_prefix('0').unwrap_or(raw)
        } else {
            raw
        };
        match u32::from_str_radix(digits, 8) {
            Ok(bits) if digits.len() == 3 && digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) => {
                Ok(bits)
            }
            _ => Err(self.error(
                mode,
                format!(
                    "`mode` `{raw}` must be octal permission bits like `0644` or `755` (no setuid, setgid or sticky bits)"
                ),
            )),
        }
    }
}

/// `src` as names beneath the context's top, `.` and `..` resolved lexically; `None` when
/// a `..` climbs above the top.
fn beneath(src: &str) -> Option<PathBuf> {
    let mut names: Vec<&str> = Vec::new();
    for part in src.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                names.pop()?;
            }
            name => names.push(name),
        }
    }
    Some(names.iter().collect())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::recipe::Recipe;

    fn parse(files: &str) -> Result<Recipe, String> {
        crate::recipe::parse_with(&format!("[[files]]\n{files}"))
    }

    #[test]
    fn entries_resolve_src_beneath_the_context_and_keep_dest_and_mode() {
        let recipe = parse(
            "src = \"./app/../app\"\ndest = \"/srv/app/\"\nowner = \"1000:1000\"\nmode = \"0640\"",
        )
        .unwrap();
        let copy = &recipe.files[0];
        assert_eq!(copy.src, Path::new("app"));
        assert_eq!(copy.context, Path::new("/p/recipes"));
        assert!(copy.context_span.is_none());
        let widened = parse("context = \"..\"\nsrc = \"app\"\ndest = \"/srv/app\"").unwrap();
        assert_eq!(widened.files[0].context, Path::new("/p"));
        assert_eq!(widened.files[0].src, Path::new("app"));
        assert_eq!((copy.dest.as_str(), copy.dest_is_dir), ("/srv/app", true));
        assert_eq!(copy.mode, Some(0o640));
        assert_eq!(copy.owner.as_ref().unwrap().0, "1000:1000");
    }

    #[test]
    fn bad_entries_are_refused_at_the_value() {
        for (text, needle) in [
            (
                "src = \"/etc/shadow\"\ndest = \"/x\"",
                "relative to the recipe",
            ),
            ("src = \"\"\ndest = \"/x\"", "relative to the recipe"),
            (
                "src = \"../app\"\ndest = \"/x\"",
                "climbs out of the build context",
            ),
            (
                "src = \"a/../../app\"\ndest = \"/x\"",
                "climbs out of the build context `/p/recipes`",
            ),
            (
                "context = \"..\"\nsrc = \"../app\"\ndest = \"/x\"",
                "climbs out of the build context `/p`",
            ),
            (
                "context = \"\"\nsrc = \"a\"\ndest = \"/x\"",
                "`context` must name",
            ),
            (
                "context = \"a\\u001b\"\nsrc = \"a\"\ndest = \"/x\"",
                "`context` `a<U+001B>` contains the control character U+001B",
            ),
            ("src = \"a\"\ndest = \"x\"", "must be an absolute path"),
            ("src = \"a\"\ndest = \"/srv/../etc\"", "without `.`, `..`"),
            ("src = \"a\"\ndest = \"/srv//x\"", "without `.`, `..`"),
            ("src = \"a\"\ndest = \"/x\"\nmode = \"4755\"", "no setuid"),
            ("src = \"a\"\ndest = \"/x\"\nmode = \"rw\"", "octal"),
            (
                "src = \"a\"\ndest = \"/x\"\nowner = \"a b\"",
                "`owner` must be",
            ),
            (
                "src = \"a\"\ndest = \"/x\"\nexclude = [\"[\"]",
                "invalid `exclude` glob",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(err.contains("x.toml:"), "{text}: {err}");
        }
    }

    #[test]
    fn excludes_read_like_gitignore() {
        let mut ex = Excludes::default();
        for line in [
            "# comment",
            "",
            "*.tmp",
            ".ipynb_checkpoints/",
            "/build",
            "docs/*.md",
            "!keep.tmp",
        ] {
            ex.push(line).unwrap();
        }
        assert!(ex.excludes("a.tmp", false));
        assert!(ex.excludes("deep/er/a.tmp", false));
        assert!(!ex.excludes("deep/keep.tmp", false));
        assert!(ex.excludes("nb/.ipynb_checkpoints", true));
        assert!(!ex.excludes("nb/.ipynb_checkpoints", false));
        assert!(ex.excludes("build", true));
        assert!(!ex.excludes("src/build", true));
        assert!(ex.excludes("docs/a.md", false));
        assert!(!ex.excludes("docs/sub/a.md", false));
        assert!(!ex.excludes("main.py", false));
    }
}
