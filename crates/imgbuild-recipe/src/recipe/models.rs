//! `[[models]]`: model weights that ship beside the image as artifacts of their own, each
//! mounted into the container at its path. What only the file system can say (that the
//! source exists, what it holds) is checked when the model is read, at these spans.

use std::path::PathBuf;

use toml::Spanned;

use super::{
    checker::{Checker, lexical_path},
    error::{RecipeError, SourceSpan},
    schema::ModelEntry,
};

/// The longest model name: a Kubernetes volume name is a DNS label.
const MAX_NAME: usize = 63;

/// One `[[models]]` entry, checked.
#[derive(Debug, Clone)]
pub struct Model {
    /// `[a-z0-9]([a-z0-9-]*[a-z0-9])?`, unique in the recipe: the artifact's layout
    /// directory and the volume's name.
    pub name: String,
    /// Absolute in-container path the model is mounted at, no `.`, `..`, `//` or trailing `/`.
    pub mount: String,
    /// `source` as written, for messages.
    pub source_text: String,
    /// `source` beneath `context`, lexically: only names, never `..`; empty for its top.
    pub source: PathBuf,
    pub source_span: SourceSpan,
    /// The directory the source is read beneath, and nothing outside it: the recipe's.
    pub context: PathBuf,
}

impl Checker {
    /// `[[models]]`, each `source` beneath `recipe_dir`, none mounted over `prefix`.
    pub(super) fn models(
        &self,
        entries: &[Spanned<ModelEntry>],
        recipe_dir: &std::path::Path,
        prefix: &str,
    ) -> Result<Vec<Model>, RecipeError> {
        let mut models: Vec<Model> = Vec::with_capacity(entries.len());
        for entry in entries {
            let model = self.model(entry.get_ref(), recipe_dir, prefix)?;
            let entry = entry.get_ref();
            if models.iter().any(|m| m.name == model.name) {
                return Err(self.error(
                    &entry.name,
                    format!("model `{}` is named twice", model.name),
                ));
            }
            if let Some(other) = models.iter().find(|m| nested(&m.mount, &model.mount)) {
                return Err(self.error(
                    &entry.mount,
                    format!(
                        "`mount` `{}` overlaps model `{}`'s `{}`: each model needs a path of its own",
                        model.mount, other.name, other.mount
                    ),
                ));
            }
            models.push(model);
        }
        Ok(models)
    }

    fn model(
        &self,
        entry: &ModelEntry,
        recipe_dir: &std::path::Path,
        prefix: &str,
    ) -> Result<Model, RecipeError> {
        let name = entry.name.get_ref();
        if !is_model_name(name) {
            return Err(self.error(
                &entry.name,
                format!(
                    "model name `{name}` must be lowercase letters, digits and `-`, starting and ending with a letter or digit, at most {MAX_NAME} characters"
                ),
            ));
        }
        let mount = self.mount(&entry.mount, prefix)?;
        let source = &entry.source;
        self.visible_only(source, "`source`")?;
        let relative = source.get_ref();
        let beneath = (!relative.is_empty() && !relative.starts_with('/'))
            .then(|| lexical_beneath(relative))
            .flatten();
        let Some(source_rel) = beneath else {
            return Err(self.error(
                source,
                format!(
                    "`source` `{relative}` must be a file or directory beneath the recipe's directory `{}`",
                    recipe_dir.display()
                ),
            ));
        };
        Ok(Model {
            name: name.clone(),
            mount,
            source_text: relative.clone(),
            source: source_rel,
            source_span: self.span(source.span()),
            context: recipe_dir.to_path_buf(),
        })
    }

    /// `mount`: absolute and normal, not `/`, and neither over nor inside the environment.
    fn mount(&self, mount: &Spanned<String>, prefix: &str) -> Result<String, RecipeError> {
        self.visible_only(mount, "`mount`")?;
        let raw = mount.get_ref();
        let normal = raw.starts_with('/')
            && raw.len() > 1
            && raw
                .split('/')
                .skip(1)
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !normal {
            return Err(self.error(
                mount,
                format!(
                    "`mount` `{raw}` must be an absolute path in the container other than `/`, without `.`, `..`, `//` or a trailing `/`"
                ),
            ));
        }
        if nested(raw, prefix) {
            return Err(self.error(
                mount,
                format!("`mount` `{raw}` overlaps the environment at `{prefix}`, which the mount would hide"),
            ));
        }
        Ok(raw.clone())
    }
}

/// Whether one of two absolute paths is the other or lies beneath it.
fn nested(a: &str, b: &str) -> bool {
    let under = |inner: &str, outer: &str| {
        inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    under(a, b) || under(b, a)
}

/// Whether `name` may name a model: a DNS label, as a Kubernetes volume name is.
pub fn is_model_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !name.is_empty()
        && name.len() <= MAX_NAME
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(|b| edge(b) || *b == b'-')
}

/// `path` as names beneath its top, `.` and `..` resolved lexically; `None` when it climbs
/// out.
fn lexical_beneath(path: &str) -> Option<PathBuf> {
    let mut depth = 0usize;
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if depth == 0 => return None,
            ".." => depth -= 1,
            _ => depth += 1,
        }
    }
    Some(lexical_path(std::path::Path::new(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for good in ["llama", "tiny-7b", "a", "m0"] {
            assert!(is_model_name(good), "{good}");
        }
        for bad in ["", "Llama", "-a", "a-", "a_b", "a.b", &"x".repeat(64)] {
            assert!(!is_model_name(bad), "{bad}");
        }
    }

    #[test]
    fn paths_nest_by_component() {
        assert!(nested("/models", "/models/llama"));
        assert!(nested("/opt/conda", "/opt/conda"));
        assert!(!nested("/models/llama", "/models/llama2"));
    }

    #[test]
    fn sources_stay_beneath() {
        assert_eq!(lexical_beneath("a/./b/../c"), Some(PathBuf::from("a/c")));
        assert_eq!(lexical_beneath("."), Some(PathBuf::new()));
        assert_eq!(lexical_beneath("a/../../b"), None);
        assert_eq!(lexical_beneath(".."), None);
    }
}
