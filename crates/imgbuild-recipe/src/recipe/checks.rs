//! `[[checks]]`: notebooks that `imgbuild notebook --recipe` runs in the built image, each
//! optionally against the statement of an earlier run, so that CI proves the results
//! reproduce with the image that ships. The paths are the recipe's, so they are held to its
//! directory: relative, no `..` above it, and read beneath it, never through a link out.

use std::path::PathBuf;

use toml::Spanned;

use super::{checker::Checker, error::RecipeError, schema::CheckEntry};

/// One `[[checks]]` entry, its paths relative to the recipe's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotebookCheck {
    /// The notebook (`notebooks/analysis.ipynb`).
    pub notebook: PathBuf,
    /// The statement of an earlier run the run must match, cell by cell (`--verify`).
    pub expect: Option<PathBuf>,
}

impl Checker {
    /// `[[checks]]`, each path checked to stay beneath the recipe's directory.
    pub(super) fn checks(
        &self,
        entries: &[Spanned<CheckEntry>],
    ) -> Result<Vec<NotebookCheck>, RecipeError> {
        entries
            .iter()
            .map(|entry| {
                let entry = entry.get_ref();
                Ok(NotebookCheck {
                    notebook: self.check_path(&entry.notebook, "notebook")?,
                    expect: entry
                        .expect
                        .as_ref()
                        .map(|expect| self.check_path(expect, "expect"))
                        .transpose()?,
                })
            })
            .collect()
    }

    fn check_path(&self, path: &Spanned<String>, key: &str) -> Result<PathBuf, RecipeError> {
        self.visible_only(path, &format!("`{key}`"))?;
        let text = path.get_ref();
        let parts: Vec<&str> = text
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if text.starts_with('/') || parts.is_empty() || parts.contains(&"..") {
            return Err(self.error(
                path,
                format!(
                    "`{key}` must be a file beneath the recipe's directory, written relative to it without `..`"
                ),
            ));
        }
        Ok(parts.iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::recipe::parse_with as parse;

    #[test]
    fn checks_keep_their_paths_beneath_the_recipe() {
        let recipe = parse(
            "[[checks]]\nnotebook = \"nb/./a.ipynb\"\nexpect = \"nb/a.intoto.json\"\n\
             [[checks]]\nnotebook = \"b.ipynb\"",
        )
        .unwrap();
        assert_eq!(recipe.checks.len(), 2);
        assert_eq!(recipe.checks[0].notebook, Path::new("nb/a.ipynb"));
        assert_eq!(
            recipe.checks[0].expect.as_deref(),
            Some(Path::new("nb/a.intoto.json"))
        );
        assert_eq!(recipe.checks[1].expect, None);
        for bad in ["/etc/passwd", "../x.ipynb", "a/../../x", "", "."] {
            let err = parse(&format!("[[checks]]\nnotebook = \"{bad}\"")).unwrap_err();
            assert!(
                err.contains("beneath the recipe's directory"),
                "{bad}: {err}"
            );
        }
        let err = parse("[[checks]]\nnotebook = \"a\"\nexpect = \"../e\"").unwrap_err();
        assert!(err.contains("`expect`"), "{err}");
        let err = parse("[[checks]]\nnotbook = \"a\"").unwrap_err();
        assert!(err.contains("notbook"), "{err}");
    }
}
