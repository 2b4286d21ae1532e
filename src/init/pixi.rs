//! A pixi manifest (`pixi.toml`, or `pyproject.toml` with `[tool.pixi]`): its pins come
//! from the `pixi.lock` beside it; without one, the recipe carries the manifest's own
//! specs (its default feature's `[dependencies]` and `[pypi-dependencies]`) for
//! `imgbuild lock` to solve.

use std::path::{Path, PathBuf};

use super::{InitError, InitRecipe, checked_recipe, comment_text, pins::linux_platform, quote};

/// The parts of a pixi manifest an import reads.
#[derive(Debug, Clone, Default)]
pub(super) struct Manifest {
    pub name: Option<String>,
    channels: Vec<String>,
    platforms: Vec<String>,
    dependencies: Vec<String>,
    pypi_dependencies: Vec<String>,
}

/// The pixi table of a manifest: the whole file for pixi.toml, `[tool.pixi]` for
/// pyproject.toml; `None` when a pyproject.toml has none.
fn pixi_table(top: &toml::Table, pyproject: bool) -> Option<&toml::Table> {
    match pyproject {
        false => Some(top),
        true => top.get("tool")?.get("pixi")?.as_table(),
    }
}

impl Manifest {
    /// Reads the manifest `text` of `path`.
    pub(super) fn parse(text: &str, path: &Path) -> Result<Manifest, InitError> {
        let not_manifest = |reason: String| InitError::Import {
            path: path.to_path_buf(),
            reason,
        };
        let top: toml::Table = toml::from_str(text)
            .map_err(|e| not_manifest(format!("it is not TOML: {}", e.message())))?;
        let pyproject = path.file_name().is_some_and(|f| f == "pyproject.toml");
        let pixi = pixi_table(&top, pyproject).ok_or_else(|| {
            not_manifest("it has no `[tool.pixi]` table: not a pixi project".into())
        })?;
        // pixi's `[workspace]`, or `[project]` as older manifests call it.
        let workspace = pixi
            .get("workspace")
            .or_else(|| pixi.get("project"))
            .and_then(toml::Value::as_table);
        let strings = |key: &str| -> Vec<String> {
            workspace
                .and_then(|w| w.get(key))
                .and_then(toml::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().or_else(|| v.get("channel")?.as_str()))
                .map(str::to_string)
                .collect()
        };
        let name = workspace
            .and_then(|w| w.get("name"))
            .or_else(|| top.get("project")?.get("name"))
            .and_then(toml::Value::as_str)
            .map(str::to_string);
        Ok(Manifest {
            name,
            channels: strings("channels"),
            platforms: strings("platforms"),
            dependencies: specs(pixi.get("dependencies"), " "),
            pypi_dependencies: specs(pixi.get("pypi-dependencies"), ""),
        })
    }

    /// The recipe made from the manifest alone, when no pixi.lock is beside it.
    pub(super) fn recipe(&self, path: &Path, name: &str) -> Result<InitRecipe, InitError> {
        let file_name = super::pins::file_name(path);
        let mut notes = vec![format!(
            "no pixi.lock beside {file_name}: nothing is pinned, so no lock is written; the recipe carries {file_name}'s specs (its default feature only) and `imgbuild lock` solves them"
        )];
        let mut platforms: Vec<String> = Vec::new();
        let mut dropped: Vec<String> = Vec::new();
        for platform in &self.platforms {
            match linux_platform(platform) {
                Some(subdir) => platforms.push(subdir.to_string()),
                None => dropped.push(format!("`{platform}`")),
            }
        }
        if !dropped.is_empty() {
            notes.push(format!(
                "platforms {} are not Linux (an image runs Linux); left out",
                dropped.join(", ")
            ));
        }
        if platforms.is_empty() {
            platforms.push("linux-64".to_string());
        }
        let list = |items: &[String]| {
            items
                .iter()
                .map(|i| format!("    {},\n", quote(i)))
                .collect::<String>()
        };
        let mut text = format!(
            "# Made by `imgbuild init --from {}` (no pixi.lock beside it).\n\
             # Solve it with `imgbuild lock <this file>`.\n\n\
             [image]\nname = {}\nplatforms = [{}]\nentrypoint = [\"/opt/conda/bin/python\"]\n\n\
             [conda]\nchannels = [\n{}]\ndependencies = [\n{}]\n",
            comment_text(&file_name),
            quote(name),
            platforms
                .iter()
                .map(|p| quote(p))
                .collect::<Vec<_>>()
                .join(", "),
            list(&self.channels),
            list(&self.dependencies),
        );
        if !self.pypi_dependencies.is_empty() {
            text.push_str(&format!(
                "\n[pypi]\ndependencies = [\n{}]\n",
                list(&self.pypi_dependencies)
            ));
        }
        checked_recipe(&text, Path::new("recipe.toml"), path)?;
        Ok(InitRecipe { text, notes })
    }
}

/// The pixi.lock beside a manifest.
pub(super) fn lock_beside(manifest: &Path) -> PathBuf {
    manifest.with_file_name("pixi.lock")
}

/// A pixi dependency table as specs: `name = "1.2.*"` or `name = { version = "…" }`, the
/// version written after the name (`sep` between them: conda's space, PEP 508's nothing);
/// `*` and a table without a version as the name alone.
fn specs(table: Option<&toml::Value>, sep: &str) -> Vec<String> {
    let Some(table) = table.and_then(toml::Value::as_table) else {
        return Vec::new();
    };
    table
        .iter()
        .map(|(name, value)| {
            let version = value
                .as_str()
                .or_else(|| value.get("version")?.as_str())
                .filter(|v| *v != "*" && !v.is_empty());
            match version {
                Some(version) => format!("{name}{sep}{version}"),
                None => name.clone(),
            }
        })
        .collect()
}
