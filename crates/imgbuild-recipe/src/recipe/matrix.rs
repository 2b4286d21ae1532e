//! Build matrices: a recipe's `[matrix]` table (`python = ["3.9", "3.11"]`) expands into one
//! variant per combination of values. Each `{{key}}` in the recipe's text is replaced by the
//! variant's value before the recipe is read, so a variant is an ordinary recipe with its
//! own name (`NAME-python3.9-cuda11.8`) and lock (`NAME.python3.9-cuda11.8.lock`).

use std::{collections::BTreeMap, path::Path};

use super::error::RecipeError;

/// One combination of the matrix's values, keys in sorted order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub values: Vec<(String, String)>,
}

impl Variant {
    /// `python3.9-cuda11.8`: appended to the image name and the lock file's name.
    pub fn suffix(&self) -> String {
        self.values
            .iter()
            .map(|(key, value)| format!("{key}{value}"))
            .collect::<Vec<_>>()
            .join("-")
    }

    /// The recipe text with every `{{key}}` replaced.
    pub fn apply(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (key, value) in &self.values {
            text = text.replace(&format!("{{{{{key}}}}}"), value);
        }
        text
    }
}

/// The variant named `wanted`: its 0-based index in [`variants`]' order, or its suffix.
pub fn select<'a>(variants: &'a [Variant], wanted: &str) -> Option<&'a Variant> {
    match wanted.parse::<usize>() {
        Ok(index) => variants.get(index),
        Err(_) => variants.iter().find(|v| v.suffix() == wanted),
    }
}

/// The variants of a recipe text, or none when it has no `[matrix]`.
pub fn variants(text: &str, path: &Path) -> Result<Vec<Variant>, RecipeError> {
    let invalid = |message: String| RecipeError::Invalid {
        path: path.to_path_buf(),
        message,
        span: None,
    };
    // Syntax errors are reported, with their place, when the recipe itself is read.
    let Ok(table) = text.parse::<toml::Table>() else {
        return Ok(Vec::new());
    };
    let Some(matrix) = table.get("matrix") else {
        return Ok(Vec::new());
    };
    let Some(matrix) = matrix.as_table() else {
        return Err(invalid(
            "`matrix` must be a table of arrays, e.g. `python = [\"3.9\", \"3.11\"]`".into(),
        ));
    };
    let mut axes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, values) in matrix {
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(invalid(format!(
                "matrix key `{key}` must be lower-case letters, digits and `_`"
            )));
        }
        let values: Vec<String> = values
            .as_array()
            .filter(|a| !a.is_empty())
            .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect())
            .ok_or_else(|| {
                invalid(format!(
                    "`matrix.{key}` must be a non-empty array of strings"
                ))
            })?;
        for value in &values {
            // Values end up in image names: `[a-z0-9._]`.
            if value.is_empty()
                || !value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_')
            {
                return Err(invalid(format!(
                    "`matrix.{key}` value `{value}` must be lower-case letters, digits, `.` and `_` (it becomes part of image names)"
                )));
            }
        }
        axes.insert(key.clone(), values);
    }
    // Every placeholder must name an axis.
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        let name = &after[..end];
        if !axes.contains_key(name) {
            return Err(invalid(format!(
                "`{{{{{name}}}}}` names no key of `[matrix]` (keys: {})",
                axes.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        rest = &after[end + 2..];
    }

    for key in axes.keys() {
        if !text.contains(&format!("{{{{{key}}}}}")) {
            return Err(invalid(format!(
                "`matrix.{key}` is never used: write `{{{{{key}}}}}` where its value goes"
            )));
        }
    }

    let mut variants = vec![Variant { values: Vec::new() }];
    for (key, values) in &axes {
        variants = variants
            .into_iter()
            .flat_map(|variant| {
                values.iter().map(move |value| {
                    let mut values = variant.values.clone();
                    values.push((key.clone(), value.clone()));
                    Variant { values }
                })
            })
            .collect();
    }
    Ok(variants)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPE: &str = "[image]\nname = \"m\"\n[conda]\ndependencies = [\"python={{python}}\", \"cuda-cudart={{cuda}}\"]\n[matrix]\npython = [\"3.9\", \"3.11\"]\ncuda = [\"11.8\", \"12.1\"]\n";

    #[test]
    fn every_combination_in_key_order() {
        let variants = variants(RECIPE, Path::new("r.toml")).unwrap();
        let suffixes: Vec<String> = variants.iter().map(Variant::suffix).collect();
        assert_eq!(
            suffixes,
            [
                "cuda11.8-python3.9",
                "cuda11.8-python3.11",
                "cuda12.1-python3.9",
                "cuda12.1-python3.11"
            ]
        );
        assert!(
            variants[1]
                .apply(RECIPE)
                .contains("\"python=3.11\", \"cuda-cudart=11.8\"")
        );
    }

    #[test]
    fn unused_keys_and_unknown_placeholders_are_errors() {
        let unused = RECIPE.replace("{{cuda}}", "11.8");
        let err = variants(&unused, Path::new("r.toml")).unwrap_err();
        assert!(
            err.to_string().contains("`matrix.cuda` is never used"),
            "{err}"
        );
        let unknown = RECIPE.replace("{{cuda}}", "{{cdua}}");
        let err = variants(&unknown, Path::new("r.toml")).unwrap_err();
        assert!(err.to_string().contains("{{cdua}}"), "{err}");
        let upper = RECIPE.replace("\"3.9\"", "\"Py3\"");
        assert!(variants(&upper, Path::new("r.toml")).is_err());
        assert!(
            variants("[image]\nname = \"x\"\n", Path::new("r.toml"))
                .unwrap()
                .is_empty()
        );
    }
}
