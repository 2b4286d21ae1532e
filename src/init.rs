//! `imgbuild init`: a commented starter recipe, or a recipe converted from a conda
//! `environment.yml`.
//!
//! The environment file is read with rattler's [`EnvironmentYaml`], so match specs are
//! parsed exactly as conda reads them. The `pip:` section becomes `[pypi]`: requirements,
//! `--index-url`, `--extra-index-url` and `--find-links`. What a recipe cannot express (pip's
//! other options, `-r`/`-e` lines, other package managers' sections, the `prefix`) is kept in
//! a comment block of the recipe and returned as notes for the CLI to report, never dropped
//! silently.

use std::path::{Path, PathBuf};

use rattler_conda_types::{EnvironmentYaml, MatchSpecOrSubSection};

use crate::recipe::{Recipe, RecipeError, RecipeOptions};

/// conda's `defaults` channel is not a channel name but an alias for Anaconda's own
/// repositories; `main` is the one that holds the packages most environments ask for.
pub const DEFAULTS_CHANNEL_URL: &str = "https://repo.anaconda.com/pkgs/main";

/// A recipe made by `init`, with what the user should know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitRecipe {
    /// The recipe text (TOML with comments).
    pub text: String,
    /// Things that were not carried over, or carried over differently, one sentence each.
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("Failed to read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is not a valid conda environment file", path.display())]
    Parse {
        path: PathBuf,
        // serde_yaml's error, which rattler does not re-export.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("The recipe made from `{}` does not validate", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: RecipeError,
    },
    #[error("`{}` already exists; refusing to overwrite it", path.display())]
    Exists { path: PathBuf },
    #[error("Failed to write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl InitError {
    /// 1 when the input is at fault, 2 when the machine is.
    pub fn exit_code(&self) -> i32 {
        match self {
            InitError::Write { .. } => 2,
            _ => 1,
        }
    }
}

/// A TOML basic string.
fn quote(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// Turns any name into a valid image name (`[a-z0-9][a-z0-9._-]*`).
pub fn image_name(name: &str) -> String {
    let mut out: String = name
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    out = out
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    if out.is_empty() {
        "app".to_string()
    } else {
        out
    }
}

/// The commented starter recipe for an image called `name`.
pub fn starter_recipe(name: &str) -> String {
    format!(
        r#"# An imgbuild recipe: a conda environment as a reproducible OCI image.
#
#   imgbuild build THIS_FILE      # solves, writes THIS_FILE.lock and images/{name}/
#
# Every key is documented in the README's "Recipe schema"; unknown keys are errors.

[image]
name = {quoted}                 # also the output directory images/<name>
tags = ["latest"]
# The root filesystem under the environment: "scratch" (empty, the default), a local OCI
# layout "oci:PATH[:TAG]", or a registry image. A base with glibc lets the image run
# ordinary binaries, e.g. one made with
#   skopeo copy docker://docker.io/library/ubuntu:22.04 oci:images/ubuntu:22.04
base = "scratch"
platforms = ["linux-64"]        # conda subdir of the target: linux-64 or linux-aarch64
prefix = "/opt/conda"           # where the environment lives in the image
# glibc = "2.28"                # the oldest glibc the image must run on (default: the base's)
entrypoint = ["/opt/conda/bin/python"]
# cmd = ["-c", "print('hello')"]
# workdir = "/workspace"
# user = "1000:1000"            # run as non-root

# [image.env]                   # set after conda's activation variables
# MY_SETTING = "value"

# [image.labels]
# "org.opencontainers.image.description" = "What this image is for"

# [cuda]                        # for GPU images
# version = "12.4"              # CUDA runtime the image targets
# min-driver = "550.54.14"      # oldest host driver it must run on (default: the release's)

[conda]
channels = ["conda-forge"]      # names, https:// or file:// URLs, or paths
dependencies = [                # conda match specs
    "python 3.12.*",
]

# [layers]
# max = 60                      # layer budget, base layers included
"#,
        quoted = quote(name),
    )
}

/// Converts a conda `environment.yml` (read from `path`) into a recipe. `name` overrides the
/// environment's own name.
pub fn from_environment_yaml(
    text: &str,
    path: &Path,
    name: Option<&str>,
) -> Result<InitRecipe, InitError> {
    let environment = EnvironmentYaml::from_yaml_str(text).map_err(|source| InitError::Parse {
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let mut notes = Vec::new();
    let name = image_name(
        name.or(environment.name.as_deref())
            .unwrap_or_else(|| path.file_stem().and_then(|s| s.to_str()).unwrap_or("app")),
    );

    let mut channels: Vec<String> = Vec::new();
    for channel in &environment.channels {
        let channel = channel.to_string();
        if channel == "defaults" {
            notes.push(format!(
                "channel `defaults` is conda's alias for Anaconda's repositories; written as `{DEFAULTS_CHANNEL_URL}` (mind Anaconda's terms of service)"
            ));
            channels.push(DEFAULTS_CHANNEL_URL.to_string());
        } else {
            channels.push(channel);
        }
    }
    if channels.is_empty() {
        notes.push(
            "the environment names no channel (conda would use `defaults`); written as `conda-forge`"
                .to_string(),
        );
        channels.push("conda-forge".to_string());
    }

    let mut dependencies = Vec::new();
    let mut kept: Vec<(String, Vec<String>)> = Vec::new();
    let mut pypi: Option<PipSection> = None;
    for dependency in &environment.dependencies {
        match dependency {
            MatchSpecOrSubSection::MatchSpec(spec) => dependencies.push(spec.to_string()),
            MatchSpecOrSubSection::SubSection(section, specs) if section == "pip" => {
                let (section, left) = pip_section(specs);
                if !left.is_empty() {
                    notes.push(format!(
                        "{} of the `pip:` section cannot be expressed in a recipe (`-r`/`-e` lines, direct URLs, other pip options); kept as a comment in the recipe",
                        match left.len() {
                            1 => "1 line".to_string(),
                            n => format!("{n} lines"),
                        }
                    ));
                    kept.push(("pip".to_string(), left));
                }
                pypi = Some(section);
            }
            MatchSpecOrSubSection::SubSection(section, specs) => {
                let count = match specs.len() {
                    1 => "1 package".to_string(),
                    n => format!("{n} packages"),
                };
                notes.push(format!(
                    "the `{section}:` section ({count}) is not yet supported: imgbuild installs conda packages only; it is kept as a comment in the recipe"
                ));
                kept.push((section.clone(), specs.clone()));
            }
        }
    }
    if let Some(prefix) = &environment.prefix {
        notes.push(format!(
            "`prefix: {}` names a path on the machine that made the file; the image's environment is at `prefix` in [image] (default /opt/conda)",
            prefix.display()
        ));
    }

    let mut text = format!(
        "# Made by `imgbuild init --from {file_name}`{from}.\n\
         # Build it with `imgbuild build <this file>`; the README's \"Recipe schema\" lists every key.\n\n\
         [image]\nname = {name}\n\
         # base = \"scratch\"          # or \"oci:PATH[:TAG]\" or a registry image with glibc\n\
         platforms = [\"linux-64\"]\n\
         entrypoint = [\"/opt/conda/bin/python\"]\n",
        from = environment
            .name
            .as_ref()
            .map(|n| format!(" (conda environment `{n}`)"))
            .unwrap_or_default(),
        name = quote(&name),
    );
    if !environment.variables.is_empty() {
        // conda sets an environment's `variables` on activation; an image sets them always.
        text.push_str("\n[image.env]\n");
        for (key, value) in &environment.variables {
            text.push_str(&format!("{} = {}\n", quote(key), quote(value)));
        }
    }
    text.push_str("\n[conda]\nchannels = [");
    text.push_str(
        &channels
            .iter()
            .map(|c| quote(c))
            .collect::<Vec<_>>()
            .join(", "),
    );
    text.push_str("]\ndependencies = [\n");
    for dependency in &dependencies {
        text.push_str(&format!("    {},\n", quote(dependency)));
    }
    text.push_str("]\n");
    if let Some(pypi) = &pypi {
        text.push_str(&format!(
            "\n# The `pip:` section of {file_name}: wheels resolved for the image's Python.\n[pypi]\n"
        ));
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
    }
    for (section, specs) in &kept {
        text.push_str(&format!(
            "\n# Not yet supported: these `{section}:` lines of {file_name}. imgbuild installs\n\
             # conda packages and PyPI wheels from indexes; these are kept here so nothing is\n\
             # lost.\n\
             # {section} = [\n"
        ));
        for spec in specs {
            text.push_str(&format!("#     {},\n", quote(spec)));
        }
        text.push_str("# ]\n");
    }

    // What we write must be a recipe imgbuild accepts.
    Recipe::from_str_at(&text, Path::new("recipe.toml"), &RecipeOptions::default()).map_err(
        |source| InitError::Invalid {
            path: path.to_path_buf(),
            source,
        },
    )?;
    Ok(InitRecipe { text, notes })
}

/// The `[pypi]` section made from an environment file's `pip:` lines.
#[derive(Debug, Default)]
struct PipSection {
    no_index: bool,
    index_url: Option<String>,
    extra_index_urls: Vec<String>,
    find_links: Vec<String>,
    dependencies: Vec<String>,
}

/// Splits `pip:` lines (requirements-file syntax) into what `[pypi]` expresses and what it
/// does not.
fn pip_section(lines: &[String]) -> (PipSection, Vec<String>) {
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
            && line
                .parse::<pep508_rs::Requirement>()
                .is_ok_and(|r| !matches!(r.version_or_url, Some(pep508_rs::VersionOrUrl::Url(_))))
        {
            section.dependencies.push(line.to_string());
        } else {
            left.push(line.to_string());
        }
    }
    (section, left)
}

/// Writes `text` to `path`, refusing to replace an existing file.
pub fn write_new(path: &Path, text: &str) -> Result<(), InitError> {
    use std::io::Write;
    let mut file = match fs_err::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(InitError::Exists {
                path: path.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(InitError::Write {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    file.write_all(text.as_bytes())
        .map_err(|source| InitError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads an environment file and converts it.
pub fn from_environment_file(path: &Path, name: Option<&str>) -> Result<InitRecipe, InitError> {
    // environment.yml files come from strangers' repositories: bounded like a recipe.
    let text = crate::fs::read_input_text(path, crate::recipe::MAX_RECIPE_BYTES).map_err(|e| {
        InitError::Read {
            path: path.to_path_buf(),
            source: match e {
                crate::fs::InputError::Io(source) => source,
                other => std::io::Error::other(other),
            },
        }
    })?;
    from_environment_yaml(&text, path, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_starter_recipe_is_a_valid_recipe() {
        let text = starter_recipe("my-app");
        let recipe =
            Recipe::from_str_at(&text, Path::new("r.toml"), &RecipeOptions::default()).unwrap();
        assert_eq!(recipe.name, "my-app");
        assert_eq!(recipe.specs[0].to_string(), "python 3.12.*");
    }

    #[test]
    fn image_names_are_made_valid() {
        assert_eq!(image_name("My Env"), "my-env");
        assert_eq!(image_name("_private"), "private");
        assert_eq!(image_name("py3.11"), "py3.11");
        assert_eq!(image_name("!!"), "app");
    }

    #[test]
    fn environment_files_convert_with_notes() {
        let yaml = "\
name: Data Science
prefix: /home/me/miniconda3/envs/ds
channels:
  - defaults
dependencies:
  - python=3.11
  - numpy>=1.26,<2
  - pip
  - pip:
      - requests==2.31.0
      - --extra-index-url https://example.org/simple
      - -f ./wheels
      - -r requirements.txt
      - torch @ https://download.pytorch.org/whl/torch-2.1.0.whl
variables:
  OMP_NUM_THREADS: '4'
";
        let made = from_environment_yaml(yaml, Path::new("environment.yml"), None).unwrap();
        let recipe =
            Recipe::from_str_at(&made.text, Path::new("r.toml"), &RecipeOptions::default())
                .unwrap();
        assert_eq!(recipe.name, "data-science");
        assert_eq!(
            recipe.channel_names,
            [DEFAULTS_CHANNEL_URL],
            "defaults is an alias, not a channel"
        );
        let specs: Vec<String> = recipe.specs.iter().map(|s| s.to_string()).collect();
        assert_eq!(specs, ["python 3.11.*", "numpy >=1.26,<2", "pip"]);
        assert_eq!(recipe.env["OMP_NUM_THREADS"], "4");
        let pypi = recipe
            .pypi
            .as_ref()
            .expect("the pip: section becomes [pypi]");
        let requirements: Vec<String> = pypi.requirements.iter().map(|r| r.to_string()).collect();
        assert_eq!(requirements, ["requests==2.31.0"]);
        let indexes: Vec<&str> = pypi.sources.indexes.iter().map(|u| u.as_str()).collect();
        assert_eq!(
            indexes,
            ["https://pypi.org/simple", "https://example.org/simple"]
        );
        assert_eq!(pypi.sources.find_links.len(), 1);
        // What [pypi] cannot say is kept, not dropped.
        assert!(
            made.text.contains(
                "# pip = [\n#     \"-r requirements.txt\",\n#     \"torch @ https://download.pytorch.org/whl/torch-2.1.0.whl\",\n# ]"
            ),
            "{}",
            made.text
        );
        assert_eq!(made.notes.len(), 3, "{:?}", made.notes);
        assert!(
            made.notes
                .iter()
                .any(|n| n.contains("2 lines of the `pip:` section cannot be expressed")),
            "{:?}",
            made.notes
        );
        assert!(made.notes.iter().any(|n| n.contains("prefix: /home/me")));
    }

    #[test]
    fn a_bad_environment_file_names_itself() {
        let err = from_environment_yaml(
            "dependencies:\n  - 'python >>= 3'\n",
            Path::new("env.yml"),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, InitError::Parse { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "`env.yml` is not a valid conda environment file"
        );
    }
}
