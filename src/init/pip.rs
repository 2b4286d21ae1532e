//! An environment file's `pip:` section, as the recipe's `[pypi]`.

use super::{comment_text, quote};

/// The `[pypi]` section made from an environment file's `pip:` lines.
#[derive(Debug, Default)]
pub(super) struct PipSection {
    no_index: bool,
    index_url: Option<String>,
    extra_index_urls: Vec<String>,
    find_links: Vec<String>,
    dependencies: Vec<String>,
}

/// Splits `pip:` lines (requirements-file syntax) into what `[pypi]` expresses and what it
/// does not.
pub(super) fn pip_section(lines: &[String]) -> (PipSection, Vec<String>) {
    let mut section = PipSection::default();
    let mut left = Vec::new();
    for line in lines {
        let line = line.trim();
        let option = |names: &[&str]| {
            names.iter().find_map(|name| {
                let rest = line.strip_prefix(name)?;
                let value = rest.strip_prefix('=').unwrap_or(rest).trim();
                (!value.is_empty() && (rest.starts_with([' ', '=']) || name.len() == 2))
                    .then(|| value.to_string())
            })
        };
        if line == "--no-index" {
            section.no_index = true;
        } else if let Some(url) = option(&["--index-url", "-i"]) {
            section.index_url = Some(url);
        } else if let Some(url) = option(&["--extra-index-url"]) {
            section.extra_index_urls.push(url);
        } else if let Some(location) = option(&["--find-links", "-f"]) {
            section.find_links.push(location);
        } else if !line.starts_with('-')
            && crate::python::requirement::parse(line)
                .is_ok_and(|r| !matches!(r.version_or_url, Some(pep508_rs::VersionOrUrl::Url(_))))
        {
            section.dependencies.push(line.to_string());
        } else {
            left.push(line.to_string());
        }
    }
    (section, left)
}

/// The `[pypi]` section's text.
pub(super) fn pypi_text(pypi: &PipSection, file_name: &str) -> String {
    let mut text = format!(
        "\n# The `pip:` section of {}: wheels resolved for the image's Python.\n[pypi]\n",
        comment_text(file_name)
    );
    if pypi.no_index {
        text.push_str("no-index = true\n");
    } else if let Some(index) = &pypi.index_url {
        text.push_str(&format!("index-url = {}\n", quote(index)));
    }
    let list = |key: &str, values: &[String]| {
        if values.is_empty() {
            return String::new();
        }
        let items: Vec<String> = values
            .iter()
            .map(|v| format!("    {},\n", quote(v)))
            .collect();
        format!("{key} = [\n{}]\n", items.concat())
    };
    if !pypi.no_index {
        text.push_str(&list("extra-index-urls", &pypi.extra_index_urls));
    }
    text.push_str(&list("find-links", &pypi.find_links));
    text.push_str(&list("dependencies", &pypi.dependencies));
    if pypi.dependencies.is_empty() {
        text.push_str("dependencies = []\n");
    }
    text
}
