//! `imgbuild init`: a commented starter recipe, or a recipe converted from a conda
//! `environment.yml`, read as conda reads it (the `environment` module), or one imported
//! with its lock from pixi or conda-lock (`import`: pixi.lock, pixi.toml, pyproject.toml,
//! conda-lock.yml and `@EXPLICIT` files), which keeps their pins exactly.

use std::path::{Path, PathBuf};

use crate::recipe::RecipeError;

mod conda_lock;
mod cuda;
mod environment;
mod explicit;
mod import;
mod lockfile;
mod pins;
mod pip;
mod pixi;

pub use environment::{DEFAULTS_CHANNEL_URLS, from_environment_yaml};
pub use import::{Converted, convert_file, lock_path_for};
pub use pins::ImportedLock;

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
    #[error(
        "The recipe made from `{}` would hold `{key}`, which `init` never writes; refusing to write it",
        path.display()
    )]
    Unwritten { path: PathBuf, key: String },
    #[error("`{}` cannot be imported: {reason}", path.display())]
    Import { path: PathBuf, reason: String },
    #[error("`{}` is not a lock file rattler_lock reads", path.display())]
    LockParse {
        path: PathBuf,
        #[source]
        source: Box<rattler_lock::ParseCondaLockError>,
    },
    #[error(
        "`{}` has no environment `{name}`; it has {available} (pick one with `--environment`)",
        path.display()
    )]
    NoEnvironment {
        path: PathBuf,
        name: String,
        available: String,
    },
    #[error(
        "`init --from {}` writes a recipe and the lock beside it: name the recipe with `-o FILE.toml`",
        path.display()
    )]
    NeedsOutput { path: PathBuf },
    #[error("The imported lock is refused")]
    Lock(#[source] Box<crate::lock::LockError>),
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
            InitError::Lock(lock) if matches!(**lock, crate::lock::LockError::Write { .. }) => 2,
            _ => 1,
        }
    }
}

/// `text` as a TOML basic string on one line, for a value or a comment alike: toml_writer's
/// basic encoding escapes every control character, newlines included (the `toml` crate's
/// default would pick a multi-line string for text with a newline, which in a comment ends
/// the comment), and the characters that reorder or break a line on screen (bidi controls,
/// zero-widths, U+2028/2029, C1 controls) are escaped as `\uXXXX` too, so what a reviewer
/// reads is what TOML reads. The decoded string is `text`, unchanged.
pub(crate) fn quote(text: &str) -> String {
    use toml_writer::ToTomlValue as _;
    let basic = toml_writer::TomlStringBuilder::new(text)
        .as_basic()
        .to_toml_value();
    let mut quoted = String::with_capacity(basic.len());
    for c in basic.chars() {
        if hides_text(c) {
            quoted.push_str(&format!("\\u{:04X}", u32::from(c)));
        } else {
            quoted.push(c);
        }
    }
    quoted
}

/// `text` as it may stand in a comment: as it is when it holds no control character (a
/// newline would end the comment and start a line TOML reads) and nothing [`hides_text`],
/// else as [`quote`] writes it, on one line.
pub(crate) fn comment_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(|c| c.is_control() || hides_text(c)) {
        quote(text).into()
    } else {
        text.into()
    }
}

/// Characters that display as nothing, reorder the text around them, or break a line in an
/// editor although TOML reads no newline there.
fn hides_text(c: char) -> bool {
    matches!(
        c,
        '\u{80}'..='\u{9f}'
            | '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

/// The tables and keys `init --from` writes, and nothing else. The recipe it makes is held to
/// them before it is returned (the input's text is only ever in quoted strings, so it cannot
/// add a table, but this says so by checking), and the `init_from` fuzz target holds it to
/// them too.
pub const WRITTEN_KEYS: &[(&str, &[&str])] = &[
    (
        "image",
        &["name", "base", "platforms", "glibc", "entrypoint", "env"],
    ),
    ("cuda", &["version"]),
    ("conda", &["channels", "dependencies", "channel-priority"]),
    (
        "pypi",
        &[
            "index-url",
            "extra-index-urls",
            "find-links",
            "dependencies",
            "no-index",
        ],
    ),
];

/// The first table or key of the TOML `text` that is not one of [`WRITTEN_KEYS`] (or is not
/// a table where one is written, or an `[image.env]` value that is not a string), as
/// `section.key`; `None` when it has only those.
/// `text` as `init` may write it: a recipe imgbuild accepts (read as if at `recipe_path`)
/// holding only the tables and keys `init` writes. `input`, the file it was made from,
/// names the error.
pub(crate) fn checked_recipe(
    text: &str,
    recipe_path: &Path,
    input: &Path,
) -> Result<crate::recipe::Recipe, InitError> {
    let options = crate::recipe::RecipeOptions::default();
    let recipe =
        crate::recipe::Recipe::from_str_at(text, recipe_path, &options).map_err(|source| {
            InitError::Invalid {
                path: input.to_path_buf(),
                source,
            }
        })?;
    if let Some(key) = unwritten_key(text) {
        return Err(InitError::Unwritten {
            path: input.to_path_buf(),
            key,
        });
    }
    Ok(recipe)
}

pub fn unwritten_key(text: &str) -> Option<String> {
    let Ok(top) = toml::from_str::<toml::Table>(text) else {
        return Some("(text that is not TOML)".to_string());
    };
    for (section, value) in &top {
        let keys = WRITTEN_KEYS
            .iter()
            .find(|(name, _)| name == section)
            .map(|(_, keys)| *keys);
        let (Some(keys), Some(table)) = (keys, value.as_table()) else {
            return Some(section.clone());
        };
        for (key, value) in table {
            let env_ok = || {
                value
                    .as_table()
                    .is_some_and(|env| env.values().all(toml::Value::is_str))
            };
            if !keys.contains(&key.as_str()) || (key == "env" && !env_ok()) {
                return Some(format!("{section}.{key}"));
            }
        }
    }
    None
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
# Every key is shown below, most of them commented out, and documented in imgbuild's book
# (docs/src/reference/recipe.md); unknown keys are errors.

[image]
name = {quoted}                 # also the output directory images/<name>
tags = ["latest"]
# The root filesystem under the environment: Debian 12 (glibc 2.36 and a shell), what the
# shipped recipes use; the lock pins its manifest digest, so a --locked build always gets
# the same one. Or a local OCI layout "oci:PATH[:TAG]" (offline; e.g. one made with
#   skopeo copy docker://docker.io/library/debian:12-slim oci:images/debian:12-slim),
# another registry image with glibc, or "scratch" (empty: only the environment, whose
# python cannot start there; the build says so unless check-entrypoint = false).
base = "docker.io/library/debian:12-slim"
platforms = ["linux-64"]        # conda subdir of the target: linux-64 or linux-aarch64
prefix = "/opt/conda"           # where the environment lives in the image
# glibc = "2.28"                # the oldest glibc the image must run on (default: the base's)
entrypoint = ["/opt/conda/bin/python"]
# cmd = ["-c", "print('hello')"]
# workdir = "/workspace"
# user = "1000:1000"            # run as non-root
# ports = ["8888/tcp"]          # exposed ports: N, N/tcp, N/udp or N/sctp
# stop-signal = "SIGTERM"       # the signal that stops a container (a name or a number)
# check-entrypoint = true       # fail the build when the entrypoint cannot start in the image

# [image.env]                   # set after conda's activation variables
# MY_SETTING = "value"

# [image.labels]
# "org.opencontainers.image.description" = "What this image is for"

# [accounts]                    # users and groups added to the base's /etc/passwd, /etc/group
# groups = [{{ name = "app", gid = 1000 }}]
# users = [{{ name = "app", uid = 1000, gid = 1000, home = "/home/app", shell = "/bin/sh" }}]

# [[files]]                     # your own files: a layer each, above the environment's
# src = "src"                   # relative to this file: a file or a directory
# context = ".."                # where src is read from and confined to (default: this
#                               # file's directory; beneath the directory you build in)
# dest = "/app"                 # absolute path in the image
# owner = "app"                 # UID:GID, or a name from [accounts] or the base
# mode = "0644"                 # files; directories get the matching x bits
# exclude = ["*.tmp", "__pycache__/"]   # also .imgbuildignore or .dockerignore in src

# [[models]]                    # model weights beside the image, mounted at `mount`
# name = "tiny-llama"           # its layout: images/NAME.models/tiny-llama
# mount = "/models/tiny-llama"  # absolute path in the container
# source = "models/tiny-llama"  # a file or directory beneath this file's directory

# [[checks]]                    # notebooks `imgbuild notebook --recipe` runs in the image
# notebook = "notebooks/analysis.ipynb"      # relative to this file, beneath its directory
# expect = "notebooks/analysis.intoto.json"  # an earlier run's statement to match

# [cuda]                        # for GPU images
# version = "12.4"              # CUDA runtime the image targets
# min-driver = "550.54.14"      # oldest host driver it must run on (default: the release's)
# compat = false                # add NVIDIA's forward-compatibility libraries (cuda-compat)
# architectures = ["sm_80", "sm_90"]   # GPUs it must run kernels on: a library that runs
#                               # on none of them fails the build

[conda]
channels = ["conda-forge"]      # names, https:// or file:// URLs, or paths
dependencies = [                # conda match specs
    "python 3.12.*",
]
# channel-priority = "strict"   # or "disabled": the best version from any channel

# [pypi]                        # wheels, resolved for the image's Python, installed after conda
# dependencies = ["requests>=2.31"]    # PEP 508 requirements
# index-url = "https://pypi.org/simple"
# extra-index-urls = []         # asked in order for projects the earlier ones lack
# find-links = []               # directories (relative to this file) or HTML pages of wheels
# no-index = false              # true: ask no index, only find-links

# [layers]
# max = 60                      # layer budget, base layers included
# compression = "gzip"          # or "zstd", "estargz", "zstd:chunked" (lazy pulls)
# split = "512MiB"              # a larger package becomes layers of at most this; or false
# prefetch = []                 # estargz: globs of image paths fetched before the start

# [smoke]
# embed = false                 # true: add imgbuild-smoke, so `imgbuild k8s --smoke-job`
#                               # can run the GPU smoke test inside the image

# Build variants: one image per combination of the values, each placeholder {{{{KEY}}}} in
# the recipe taking every value of its key (see recipes/torch21-matrix.toml):
#   [matrix]
#   python = ["3.11", "3.12"]   # with dependencies = ["python {{{{python}}}}.*"]
"#,
        quoted = quote(name),
    )
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
    use crate::recipe::{Recipe, RecipeOptions};

    #[test]
    fn the_starter_recipe_is_a_valid_recipe() {
        let text = starter_recipe("my-app");
        let recipe =
            Recipe::from_str_at(&text, Path::new("r.toml"), &RecipeOptions::default()).unwrap();
        assert_eq!(recipe.name, "my-app");
        assert_eq!(recipe.specs[0].to_string(), "python 3.12.*");
    }

    /// The starter with every commented-out key and section (`# key = …`, `# [section]`)
    /// uncommented; the indented `#   [matrix]` example stays a comment, since a matrix
    /// recipe is built variant by variant.
    fn uncommented_starter() -> String {
        starter_recipe("my-app")
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest.split_once(" = ").is_some_and(|(key, _)| {
                            !key.is_empty()
                                && key
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || "-_.\"".contains(c))
                        }) =>
                {
                    rest.to_string()
                }
                _ => line.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_starter_recipe_with_every_key_uncommented_is_a_valid_recipe() {
        let text = uncommented_starter();
        let recipe = Recipe::from_str_at(&text, Path::new("r.toml"), &RecipeOptions::default())
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(recipe.name, "my-app");
        for key in [
            "compression = ",
            "[pypi]",
            "[smoke]",
            "channel-priority = ",
            "compat = ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(key)), "{key}\n{text}");
        }
    }

    /// The keys serde accepts in `section` (`None`: the top level), read from the
    /// `deny_unknown_fields` error of a recipe with an unknown key there, so the list comes
    /// from the schema types themselves.
    fn schema_keys(section: Option<&str>) -> Vec<String> {
        let text = match section {
            None => "zzz-unknown = 1\n[image]\nname = \"x\"\n".to_string(),
            Some("image") => "[image]\nname = \"x\"\nzzz-unknown = 1\n".to_string(),
            // An array of tables.
            Some(array @ ("files" | "checks" | "models")) => {
                format!("[image]\nname = \"x\"\n[[{array}]]\nzzz-unknown = 1\n")
            }
            Some(section) => format!("[image]\nname = \"x\"\n[{section}]\nzzz-unknown = 1\n"),
        };
        let err = Recipe::from_str_at(&text, Path::new("r.toml"), &RecipeOptions::default())
            .expect_err("an unknown key is an error")
            .to_string();
        // serde: "expected `a`", "expected `a` or `b`", "expected one of `a`, `b`, `c`".
        let (_, expected) = err
            .split_once("`, expected ")
            .unwrap_or_else(|| panic!("{section:?}: no key list in {err}"));
        let expected = expected.lines().next().unwrap_or_default();
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_starter_recipe_shows_every_schema_key() {
        // (section, key) for every `key = ` and `[section.key]` line, commented or not.
        let text = starter_recipe("my-app");
        let mut shown = std::collections::BTreeSet::new();
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim_start_matches('#').trim();
            if let Some(header) = line.strip_prefix('[') {
                // `[[files]]` as `[files]`.
                let header = header.trim_start_matches('[');
                let header = header.split(']').next().unwrap_or_default();
                match header.split_once('.') {
                    Some((parent, key)) => {
                        shown.insert((parent.to_string(), key.to_string()));
                    }
                    None => section = header.to_string(),
                }
                shown.insert((String::new(), header.to_string()));
            } else if let Some((key, _)) = line.split_once(" = ") {
                shown.insert((section.clone(), key.trim().to_string()));
            }
        }
        let sections = schema_keys(None);
        assert!(sections.len() >= 7, "{sections:?}");
        let mut missing = Vec::new();
        for section in &sections {
            if !shown.contains(&(String::new(), section.clone())) {
                missing.push(format!("[{section}]"));
            }
            if section == "matrix" {
                continue; // a free table of variant keys
            }
            let keys = schema_keys(Some(section));
            assert!(!keys.is_empty(), "[{section}]");
            for key in keys {
                if !shown.contains(&(section.clone(), key.clone())) {
                    missing.push(format!("[{section}] {key}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "not in the starter recipe: {missing:?}\n{text}"
        );
    }

    #[test]
    fn image_names_are_made_valid() {
        assert_eq!(image_name("My Env"), "my-env");
        assert_eq!(image_name("_private"), "private");
        assert_eq!(image_name("py3.11"), "py3.11");
        assert_eq!(image_name("!!"), "app");
    }
}
