//! The recipe's `[pypi]` section as later stages read it: the requirements and where their
//! distributions are looked up. Plain values: the PyPI stage (`imgbuild_install::pypi`) resolves and
//! installs them, the lock records and compares them.

use std::{path::PathBuf, str::FromStr};

use pep508_rs::Requirement;
use url::Url;

/// The index used when the recipe names none.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";

/// The `[pypi]` section of a recipe, validated.
#[derive(Debug, Clone)]
pub struct PypiRecipe {
    pub requirements: Vec<Requirement>,
    pub sources: Sources,
}

/// Where distributions are looked up: indexes in order (the first that knows a project
/// answers for it, so a later index can never shadow a project of an earlier one), plus
/// `find-links` locations whose files join every answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    pub indexes: Vec<Url>,
    pub find_links: Vec<FindLinks>,
}

impl Sources {
    /// Resolving from these asks a server (an index or a find-links page).
    pub fn needs_network(&self) -> bool {
        !self.indexes.is_empty()
            || self
                .find_links
                .iter()
                .any(|f| matches!(f, FindLinks::Page(url) if url.scheme() != "file"))
    }
}

impl std::fmt::Display for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut places: Vec<String> = self.indexes.iter().map(|u| format!("`{u}`")).collect();
        places.extend(self.find_links.iter().map(|l| match l {
            FindLinks::Directory(path) => format!("`{}`", path.display()),
            FindLinks::Page(url) => format!("`{url}`"),
        }));
        f.write_str(&places.join(", "))
    }
}

/// A `find-links` location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindLinks {
    Directory(PathBuf),
    Page(Url),
}

impl FromStr for FindLinks {
    type Err = String;
    /// A URL, or else a path (absolute here; the recipe resolves relative paths first).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match Url::parse(text) {
            Ok(url) if url.scheme() == "file" => url
                .to_file_path()
                .map(FindLinks::Directory)
                .map_err(|()| format!("`{text}` is not a local path")),
            Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(FindLinks::Page(url)),
            Ok(url) => Err(format!("`{}` URLs are not supported", url.scheme())),
            Err(_) => Ok(FindLinks::Directory(PathBuf::from(text))),
        }
    }
}
