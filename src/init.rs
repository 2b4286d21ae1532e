//! `imgbuild init`: a commented starter recipe, or a recipe converted from a conda
//! `environment.yml`.
//!
//! The environment file is read with rattler's [`EnvironmentYaml`], so match specs are
//! parsed exactly as conda reads them. The `pip:` section becomes `[pypi]`: requirements,
//! `--index-url`, `--extra-index-url` and `--find-links`. What a recipe cannot express (pip's
//! other options, `-r`/`-e` lines, other package managers' sections, the `prefix`) is kept in
//! a comment block of the recipe and returned as notes for the CLI to report, never dropped
//! silently.
//!
//! The rest keeps what conda would do with the file on Linux: the channels it would search
//! (`nodefaults`, or else its implicit `defaults`), the CUDA its packages ask for as
//! `[cuda] version`, conda-lock's `platforms:` as `[image] platforms`, and `channel_priority`
//! as `[conda] channel-priority`. What conda would do differently on Linux (a file exported
//! on macOS, a `flexible` priority imgbuild does not solve with) and top-level keys nothing
//! reads are notes too.

use std::path::{Path, PathBuf};

use rattler_conda_types::{EnvironmentYaml, MatchSpec, MatchSpecOrSubSection, NamedChannelOrUrl};

use crate::recipe::{Recipe, RecipeError, RecipeOptions};

/// conda's `defaults` on Linux: not a channel but Anaconda's `main` and `r` repositories, in
/// that order (conda's `DEFAULT_CHANNELS_UNIX`).
pub const DEFAULTS_CHANNEL_URLS: [&str; 2] = [
    "https://repo.anaconda.com/pkgs/main",
    "https://repo.anaconda.com/pkgs/r",
];

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
# Every key is shown below, most of them commented out, and documented in the README's
# "Recipe schema"; unknown keys are errors.

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
# compression = "gzip"          # or "zstd"

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

/// Converts a conda `environment.yml` (read from `path`) into a recipe. `name` overrides the
/// environment's own name.
pub fn from_environment_yaml(
    text: &str,
    path: &Path,
    name: Option<&str>,
) -> Result<InitRecipe, InitError> {
    let parse_error = |source: serde_yaml::Error| InitError::Parse {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let environment = EnvironmentYaml::from_yaml_str(text).map_err(parse_error)?;
    // rattler drops the keys it does not model; read them from the YAML itself.
    let extras = Extras::read(text).map_err(parse_error)?;
    let file_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let mut notes = Vec::new();
    let name = image_name(
        name.or(environment.name.as_deref())
            .unwrap_or_else(|| path.file_stem().and_then(|s| s.to_str()).unwrap_or("app")),
    );

    if !extras.unknown.is_empty() {
        let keys: Vec<String> = extras.unknown.iter().map(|k| format!("`{k}`")).collect();
        notes.push(format!(
            "top-level {} {} of {file_name}: not {} imgbuild reads; left out",
            if keys.len() == 1 { "key" } else { "keys" },
            keys.join(", "),
            if keys.len() == 1 {
                "an environment-file key"
            } else {
                "environment-file keys"
            },
        ));
        // A mirror's alias is a build setting for imgbuild, as it is a .condarc one for conda.
        if extras.unknown.iter().any(|k| k == "channel_alias") {
            notes.push(
                "`channel_alias` is a .condarc setting conda does not read from an environment file; to build through that mirror, pass it as `imgbuild --channel-alias URL`"
                    .to_string(),
            );
        }
    }
    let channels = recipe_channels(&environment.channels, &mut notes);
    let platforms = image_platforms(&extras.platforms, &mut notes);
    let channel_priority = extras
        .channel_priority
        .as_deref()
        .and_then(|priority| recipe_channel_priority(priority, &mut notes));

    let mut dependencies = Vec::new();
    let mut specs = Vec::new();
    let mut kept: Vec<(String, Vec<String>)> = Vec::new();
    let mut pypi: Option<PipSection> = None;
    for dependency in &environment.dependencies {
        match dependency {
            MatchSpecOrSubSection::MatchSpec(spec) => {
                dependencies.push(spec.to_string());
                specs.push(spec.as_ref());
            }
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
    let cuda = cuda_section(&specs, &mut notes);
    other_os_note(&specs, &mut notes);
    selector_note(text, &mut notes);
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
         platforms = [{platforms}]\n\
         entrypoint = [\"/opt/conda/bin/python\"]\n",
        from = environment
            .name
            .as_ref()
            .map(|n| format!(" (conda environment `{n}`)"))
            .unwrap_or_default(),
        name = quote(&name),
        platforms = platforms
            .iter()
            .map(|p| quote(p))
            .collect::<Vec<_>>()
            .join(", "),
    );
    if !environment.variables.is_empty() {
        // conda sets an environment's `variables` on activation; an image sets them always.
        text.push_str("\n[image.env]\n");
        for (key, value) in &environment.variables {
            text.push_str(&format!("{} = {}\n", quote(key), quote(value)));
        }
    }
    text.push_str(&cuda);
    text.push_str("\n[conda]\nchannels = [\n");
    for line in &channels {
        if let Some(comment) = line.comment {
            text.push_str(&format!("    # {comment}\n"));
        }
        text.push_str(&format!("    {},\n", quote(&line.channel)));
    }
    text.push_str("]\ndependencies = [\n");
    for dependency in &dependencies {
        text.push_str(&format!("    {},\n", quote(dependency)));
    }
    text.push_str("]\n");
    if let Some(priority) = channel_priority {
        text.push_str(&format!("channel-priority = {}\n", quote(priority)));
    }
    if let Some(pypi) = &pypi {
        text.push_str(&pypi_text(pypi, &file_name));
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

/// The `[pypi]` section's text.
fn pypi_text(pypi: &PipSection, file_name: &str) -> String {
    let mut text = format!(
        "\n# The `pip:` section of {file_name}: wheels resolved for the image's Python.\n[pypi]\n"
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

/// The top-level keys of an environment file that `init` reads: conda's own, conda-lock's
/// `platforms`, and `channel_priority` (a `.condarc` setting some files carry).
const KNOWN_KEYS: &[&str] = &[
    "name",
    "channels",
    "dependencies",
    "prefix",
    "variables",
    "platforms",
    "channel_priority",
];

/// What `init` reads from an environment file beside rattler's [`EnvironmentYaml`], which
/// drops the keys it does not model.
#[derive(Debug, Default, PartialEq, Eq)]
struct Extras {
    /// `platforms:`, as written.
    platforms: Vec<String>,
    /// `channel_priority:`, as written (`true`/`false` as conda's old boolean form).
    channel_priority: Option<String>,
    /// Top-level keys no tool `init` knows of reads, in file order.
    unknown: Vec<String>,
}

impl Extras {
    fn read(text: &str) -> Result<Self, serde_yaml::Error> {
        let mut extras = Extras::default();
        let serde_yaml::Value::Mapping(top) = serde_yaml::from_str(text)? else {
            return Ok(extras);
        };
        for (key, value) in &top {
            let key = match key {
                serde_yaml::Value::String(key) => key.clone(),
                other => serde_yaml::to_string(other)
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            };
            match key.as_str() {
                "platforms" => extras.platforms = scalars(value),
                "channel_priority" => extras.channel_priority = scalars(value).into_iter().next(),
                known if KNOWN_KEYS.contains(&known) => {}
                _ => extras.unknown.push(key),
            }
        }
        Ok(extras)
    }
}

/// A scalar, or a list of them, as strings; anything else is none.
fn scalars(value: &serde_yaml::Value) -> Vec<String> {
    let one = |value: &serde_yaml::Value| match value {
        serde_yaml::Value::String(s) => Some(s.clone()),
        serde_yaml::Value::Bool(b) => Some(b.to_string()),
        serde_yaml::Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match value {
        serde_yaml::Value::Sequence(items) => items.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    }
}

/// One entry of the recipe's `[conda] channels`, with the comment that says why it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ChannelLine {
    channel: String,
    comment: Option<&'static str>,
}

/// The channels conda would search on Linux for a file that lists `listed`: `nodefaults` is
/// an instruction (do not add `defaults`), not a channel; `defaults` and `pkgs/main`/`pkgs/r`
/// are Anaconda's repositories; and unless the file says `nodefaults`, conda appends its
/// `defaults` after the file's own channels (`conda env create` extends them with the
/// configured channels, `defaults` when nothing is configured).
fn recipe_channels(listed: &[NamedChannelOrUrl], notes: &mut Vec<String>) -> Vec<ChannelLine> {
    let listed: Vec<String> = listed
        .iter()
        .map(|c| c.to_string().trim_end_matches('/').to_string())
        .collect();
    let no_defaults = listed.iter().any(|c| c == "nodefaults");
    let mut lines: Vec<ChannelLine> = Vec::new();
    // conda searches a channel once, at its first place.
    let push = |lines: &mut Vec<ChannelLine>, channel: &str, comment| {
        if !lines.iter().any(|l| l.channel == channel) {
            lines.push(ChannelLine {
                channel: channel.to_string(),
                comment,
            });
        }
    };
    for channel in &listed {
        match channel.as_str() {
            "nodefaults" => {}
            "defaults" => {
                push(
                    &mut lines,
                    DEFAULTS_CHANNEL_URLS[0],
                    Some("`defaults`: Anaconda's repositories, as conda reads it on Linux"),
                );
                push(&mut lines, DEFAULTS_CHANNEL_URLS[1], None);
            }
            "pkgs/main" => push(&mut lines, DEFAULTS_CHANNEL_URLS[0], Some("`pkgs/main`")),
            "pkgs/r" => push(&mut lines, DEFAULTS_CHANNEL_URLS[1], Some("`pkgs/r`")),
            _ => push(&mut lines, channel, None),
        }
    }
    let anaconda: Vec<String> = listed
        .iter()
        .filter(|c| matches!(c.as_str(), "defaults" | "pkgs/main" | "pkgs/r"))
        .map(|c| format!("`{c}`"))
        .collect();
    if !anaconda.is_empty() {
        notes.push(format!(
            "channel {} names Anaconda's repositories; written as their URLs, as conda resolves {} on Linux (mind Anaconda's terms of service)",
            anaconda.join(", "),
            if anaconda.len() == 1 { "it" } else { "them" },
        ));
    }
    if !no_defaults && !listed.iter().any(|c| c == "defaults") {
        push(
            &mut lines,
            DEFAULTS_CHANNEL_URLS[0],
            Some("conda adds `defaults` after the file's channels (the file has no `nodefaults`)"),
        );
        push(&mut lines, DEFAULTS_CHANNEL_URLS[1], None);
        notes.push(format!(
            "{}, so conda also searches its `defaults` channels, {}; the recipe lists them too (mind Anaconda's terms of service; remove them, or add `nodefaults` to the file's channels, to leave them out)",
            if listed.is_empty() { "the file names no channel" } else { "the file's channels do not list `nodefaults`" },
            DEFAULTS_CHANNEL_URLS.join(" and "),
        ));
    }
    lines
}

/// `[image] platforms` from a file's `platforms:`: its Linux subdirs (an image runs Linux),
/// `linux-64` when it names none.
fn image_platforms(listed: &[String], notes: &mut Vec<String>) -> Vec<String> {
    let mut platforms: Vec<String> = Vec::new();
    let mut left_out: Vec<String> = Vec::new();
    for platform in listed {
        let linux = platform
            .parse::<rattler_conda_types::Subdir>()
            .ok()
            .filter(|subdir| crate::recipe::OciPlatform::of(*subdir).is_some());
        let (list, name) = match linux {
            Some(subdir) => (&mut platforms, subdir.to_string()),
            None => (&mut left_out, platform.clone()),
        };
        if !list.contains(&name) {
            list.push(name);
        }
    }
    if !left_out.is_empty() {
        let names: Vec<String> = left_out.iter().map(|p| format!("`{p}`")).collect();
        notes.push(format!(
            "`platforms:` {} not Linux (an image runs Linux); left out of [image] platforms",
            if names.len() == 1 {
                format!("{} is", names[0])
            } else {
                format!("{} are", names.join(", "))
            }
        ));
    }
    if platforms.is_empty() {
        platforms.push("linux-64".to_string());
    }
    platforms
}

/// A file's `channel_priority` as `[conda] channel-priority`: `strict` and `disabled` (`false`
/// in conda's old boolean form) carry over; `flexible` (`true`) has no equivalent, so the
/// recipe keeps the default, strict, and a note says so.
fn recipe_channel_priority(priority: &str, notes: &mut Vec<String>) -> Option<&'static str> {
    match priority {
        "strict" => Some("strict"),
        "disabled" | "false" => Some("disabled"),
        "flexible" | "true" => {
            notes.push(format!(
                "`channel_priority: {priority}`: imgbuild has no flexible priority; the recipe solves with strict channel priority (a package comes from the first channel that has it), so it may pick other builds than conda, or not solve where conda does; `channel-priority = \"disabled\"` in [conda] takes the best version from any channel instead"
            ));
            None
        }
        other => {
            notes.push(format!(
                "`channel_priority: {other}` is not a priority conda knows (`strict`, `flexible`, `disabled`); left out"
            ));
            None
        }
    }
}

/// The packages whose version is the CUDA an environment is for: conda-forge's and NVIDIA's
/// `cuda-version`, `cuda-toolkit` and `cuda-runtime`, the old `cudatoolkit`, and pytorch's
/// `pytorch-cuda`.
const CUDA_VERSION_PACKAGES: &[&str] = &[
    "cuda-version",
    "cudatoolkit",
    "pytorch-cuda",
    "cuda-toolkit",
    "cuda-runtime",
];

/// What one match spec says about the CUDA an environment is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CudaHint {
    /// `MAJOR.MINOR`.
    Version(String),
    /// It asks for CUDA without a MAJOR.MINOR, and why.
    Vague(&'static str),
}

/// The CUDA `spec` asks for: the version of a CUDA package, or the one in a `*cuda*` build
/// string (`py3.10_cuda11.8_cudnn8.7.0_0`, conda-forge's `cuda118py310h…`).
fn cuda_hint(spec: &MatchSpec) -> Option<CudaHint> {
    let name = spec.name.as_exact()?.as_normalized();
    if CUDA_VERSION_PACKAGES.contains(&name) {
        return Some(match &spec.version {
            None => CudaHint::Vague("no version"),
            Some(version) => major_minor(&version.to_string()),
        });
    }
    let build = spec.build.as_ref()?.to_string();
    let at = build.find("cuda")? + "cuda".len();
    let digits: String = build[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let digits = digits.trim_end_matches('.');
    Some(if digits.contains('.') {
        major_minor(digits)
    } else {
        // conda-forge writes MAJOR and MINOR without a dot: `cuda118`, `cuda120`.
        match digits.len() {
            3 => CudaHint::Version(format!("{}.{}", &digits[..2], &digits[2..])),
            0 => CudaHint::Vague("a CUDA build without a CUDA version"),
            _ => CudaHint::Vague("a CUDA build without a MAJOR.MINOR"),
        }
    })
}

/// `MAJOR.MINOR` of a version spec that pins one release (`11.8`, `11.8.*`, `==11.8.0`);
/// a range or a bare major names none.
fn major_minor(spec: &str) -> CudaHint {
    let text = spec.trim().trim_start_matches("==");
    let text = text.strip_suffix(".*").unwrap_or(text);
    if text.contains(['<', '>', '!', ',', '|', '~', '*', ' ', '=']) {
        return CudaHint::Vague("a version range");
    }
    fn number(part: Option<&str>) -> Option<&str> {
        part.filter(|p| p.parse::<u32>().is_ok())
    }
    let mut parts = text.split('.');
    match (number(parts.next()), number(parts.next())) {
        (Some(major), Some(minor)) => CudaHint::Version(format!("{major}.{minor}")),
        (Some(_), None) => CudaHint::Vague("a major version only"),
        _ => CudaHint::Vague("no MAJOR.MINOR"),
    }
}

/// The `[cuda]` section for `specs` (empty text when nothing asks for CUDA): the first
/// MAJOR.MINOR they name. Without one, or with one imgbuild does not know, the section is
/// written commented out and a note says why.
fn cuda_section(specs: &[&MatchSpec], notes: &mut Vec<String>) -> String {
    let hints: Vec<(String, CudaHint)> = specs
        .iter()
        .filter_map(|spec| Some((spec.to_string(), cuda_hint(spec)?)))
        .collect();
    let versions: Vec<(&str, &str)> = hints
        .iter()
        .filter_map(|(spec, hint)| match hint {
            CudaHint::Version(v) => Some((spec.as_str(), v.as_str())),
            CudaHint::Vague(_) => None,
        })
        .collect();
    let Some(&(source, version)) = versions.first() else {
        let Some((spec, CudaHint::Vague(why))) = hints.first() else {
            return String::new();
        };
        notes.push(format!(
            "`{spec}` asks for CUDA but names no MAJOR.MINOR ({why}); set `version` in the recipe's commented-out [cuda] section, or the solve has no `__cuda` and CUDA builds cannot be chosen"
        ));
        return "\n# [cuda]                       # the file asks for CUDA without naming a version\n# version = \"12.4\"\n".to_string();
    };
    if let Some((other, other_version)) = versions.iter().find(|(_, v)| *v != version) {
        notes.push(format!(
            "the file names CUDA {version} (`{source}`) and {other_version} (`{other}`); [cuda] version is the first, {version}"
        ));
    }
    let known = version
        .parse::<crate::cuda::compat::CudaVersion>()
        .ok()
        .is_some_and(|v| crate::cuda::compat::minor_version_minimum(v.major).is_some());
    if !known {
        notes.push(format!(
            "CUDA {version} (`{source}`) is not a release imgbuild builds for (11.x, 12.x and 13.x are); the recipe's [cuda] section is commented out"
        ));
        return format!(
            "\n# [cuda]                       # from `{source}`\n# version = {}\n",
            quote(version)
        );
    }
    format!(
        "\n[cuda]\nversion = {}              # from `{source}`\n",
        quote(version)
    )
}

/// Packages that exist only for macOS or Windows, which an environment exported there pins.
const OTHER_OS_PACKAGES: &[&str] = &[
    "__osx",
    "__win",
    "libcxx",
    "libcxxabi",
    "appnope",
    "vc",
    "vc14_runtime",
    "vs2015_runtime",
    "ucrt",
    "pywin32",
    "winpty",
];

/// Whether `spec` is for macOS or Windows: one of [`OTHER_OS_PACKAGES`], a cross toolchain
/// or MSYS2 package, or a build string of those systems.
fn other_os(spec: &MatchSpec) -> bool {
    let Some(name) = spec.name.as_exact().map(|n| n.as_normalized()) else {
        return false;
    };
    let build = spec
        .build
        .as_ref()
        .map(|b| b.to_string())
        .unwrap_or_default();
    OTHER_OS_PACKAGES.contains(&name)
        || ["m2-", "m2w64-", "msys2-"]
            .iter()
            .any(|p| name.starts_with(p))
        || ["_osx-64", "_osx-arm64", "_win-64", "_win-32"]
            .iter()
            .any(|s| name.ends_with(s))
        || ["osx", "darwin", "macos", "win", "vc14"]
            .iter()
            .any(|w| build.contains(w))
}

/// Warns about a file made on macOS or Windows (`conda env export` pins that machine's
/// packages): the image is Linux, so such pins may not solve.
fn other_os_note(specs: &[&MatchSpec], notes: &mut Vec<String>) {
    let found: Vec<String> = specs
        .iter()
        .filter(|s| other_os(s))
        .map(|s| format!("`{s}`"))
        .collect();
    if found.is_empty() {
        return;
    }
    let shown = found.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
    let more = match found.len() {
        0..=4 => String::new(),
        n => format!(" and {} more", n - 4),
    };
    notes.push(format!(
        "{shown}{more} {}: the file looks made on another system (`conda env export` pins that machine's packages) and the image is Linux, so the recipe may not solve as it is: remove {}, or export with `conda env export --from-history`",
        if found.len() == 1 { "is for macOS or Windows" } else { "are for macOS or Windows" },
        if found.len() == 1 { "it" } else { "them" },
    ));
}

/// Warns about conda-lock's platform selectors (`- pkg  # [osx64]`): YAML comments, so
/// every such line is a dependency of the recipe, whatever platform it was for.
fn selector_note(text: &str, notes: &mut Vec<String>) {
    let selected = text
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            line.starts_with('-')
                && line.split_once('#').is_some_and(|(_, comment)| {
                    let comment = comment.trim();
                    comment.starts_with('[') && comment.ends_with(']')
                })
        })
        .count();
    if selected > 0 {
        notes.push(format!(
            "{selected} {} a platform selector comment (`# [osx64]`, conda-lock's); imgbuild, like conda, reads them as comments, so the recipe has every such dependency: remove the ones not for Linux",
            if selected == 1 { "dependency has" } else { "dependencies have" }
        ));
    }
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
            recipe.channel_names, DEFAULTS_CHANNEL_URLS,
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

    /// The recipe made from `yaml`, parsed, with the notes.
    fn convert(yaml: &str) -> (Recipe, InitRecipe) {
        let made = from_environment_yaml(yaml, Path::new("environment.yml"), None).unwrap();
        let recipe =
            Recipe::from_str_at(&made.text, Path::new("r.toml"), &RecipeOptions::default())
                .unwrap_or_else(|e| panic!("{e}\n{}", made.text));
        (recipe, made)
    }

    fn hint(spec: &str) -> Option<CudaHint> {
        cuda_hint(
            &MatchSpec::from_str(spec, rattler_conda_types::ParseStrictness::Lenient).unwrap(),
        )
    }

    #[test]
    fn cuda_packages_and_cuda_builds_name_the_cuda_version() {
        let version = |v: &str| Some(CudaHint::Version(v.to_string()));
        assert_eq!(hint("cudatoolkit=11.3"), version("11.3"));
        assert_eq!(hint("cudatoolkit =11.0"), version("11.0"));
        assert_eq!(hint("pytorch-cuda=12.1"), version("12.1"));
        assert_eq!(hint("pytorch::pytorch-cuda=11.7.0"), version("11.7"));
        assert_eq!(hint("cuda-version=12.4"), version("12.4"));
        assert_eq!(hint("cuda-version==12.2"), version("12.2"));
        assert_eq!(hint("cuda-toolkit=12.2.2"), version("12.2"));
        assert_eq!(hint("cuda-runtime 12.1.*"), version("12.1"));
        assert_eq!(
            hint("pytorch=2.1.0=py3.10_cuda11.8_cudnn8.7.0_0"),
            version("11.8")
        );
        assert_eq!(hint("pytorch=2.1=*cuda12.1*"), version("12.1"));
        assert_eq!(
            hint("jaxlib=0.4.23=cuda120py311h8f8a1a1_200"),
            version("12.0")
        );
        assert_eq!(hint("tensorflow=2.15=cuda118py310h*"), version("11.8"));

        assert!(matches!(hint("pytorch=*=*cuda*"), Some(CudaHint::Vague(_))));
        assert!(matches!(hint("cudatoolkit"), Some(CudaHint::Vague(_))));
        assert!(matches!(
            hint("cuda-version>=12.0,<13"),
            Some(CudaHint::Vague(_))
        ));
        assert!(matches!(hint("cuda-version=12"), Some(CudaHint::Vague(_))));
        assert_eq!(hint("numpy=1.26"), None);
        assert_eq!(hint("pytorch=2.1=py3.10_cpu_0"), None);
        assert_eq!(hint("cudnn=8.0"), None);
    }

    #[test]
    fn cuda_becomes_the_cuda_section() {
        let (recipe, made) = convert(
            "channels: [conda-forge, nodefaults]\ndependencies:\n  - python=3.10\n  - pytorch=2.1.0=py3.10_cuda11.8_cudnn8.7.0_0\n  - cuda-version=12.1\n",
        );
        assert_eq!(recipe.cuda.as_ref().unwrap().version.to_string(), "11.8");
        assert_eq!(made.notes.len(), 1, "{:?}", made.notes);
        assert!(
            made.notes[0].contains(
                "names CUDA 11.8 (`pytorch ==2.1.0 py3.10_cuda11.8_cudnn8.7.0_0`) and 12.1"
            ),
            "{:?}",
            made.notes
        );

        // A CUDA imgbuild cannot build for, or one without a version, is left commented out.
        let (recipe, made) =
            convert("channels: [nodefaults, conda-forge]\ndependencies: [cudatoolkit=10.2]\n");
        assert!(recipe.cuda.is_none());
        assert!(made.text.contains("# [cuda]"), "{}", made.text);
        assert!(
            made.notes[0]
                .contains("CUDA 10.2 (`cudatoolkit 10.2.*`) is not a release imgbuild builds for"),
            "{:?}",
            made.notes
        );
        let (recipe, made) =
            convert("channels: [nodefaults, conda-forge]\ndependencies: ['pytorch=*=*cuda*']\n");
        assert!(recipe.cuda.is_none());
        assert!(
            made.notes[0].contains("asks for CUDA but names no MAJOR.MINOR"),
            "{:?}",
            made.notes
        );

        let (recipe, made) =
            convert("channels: [nodefaults, conda-forge]\ndependencies: [numpy]\n");
        assert!(
            recipe.cuda.is_none() && !made.text.contains("cuda"),
            "{}",
            made.text
        );
    }

    #[test]
    fn channels_are_the_ones_conda_searches() {
        let channels = |yaml: &str| convert(yaml).0.channel_names;
        let [main, r] = DEFAULTS_CHANNEL_URLS;
        // `nodefaults` is an instruction, not a channel.
        assert_eq!(
            channels("channels: [conda-forge, nodefaults]\n"),
            ["conda-forge"]
        );
        assert_eq!(
            channels("channels: [nodefaults, conda-forge]\n"),
            ["conda-forge"]
        );
        // Without it, conda appends its `defaults`.
        let (recipe, made) = convert("channels: [pytorch, conda-forge]\n");
        assert_eq!(recipe.channel_names, ["pytorch", "conda-forge", main, r]);
        assert!(made.text.contains("    # conda adds `defaults` after the file's channels (the file has no `nodefaults`)\n    \"https://repo.anaconda.com/pkgs/main\",\n"), "{}", made.text);
        assert!(
            made.notes[0]
                .contains("do not list `nodefaults`, so conda also searches its `defaults`"),
            "{:?}",
            made.notes
        );
        assert_eq!(channels("dependencies: []\n"), [main, r]);
        // `defaults` where the file puts it; `pkgs/main` and `pkgs/r` as conda resolves them.
        assert_eq!(
            channels("channels: [defaults, conda-forge]\n"),
            [main, r, "conda-forge"]
        );
        assert_eq!(
            channels("channels: [pkgs/r, conda-forge, nodefaults]\n"),
            [r, "conda-forge"]
        );
        assert_eq!(
            channels("channels: [pkgs/main, conda-forge]\n"),
            [main, "conda-forge", r]
        );
        assert_eq!(
            channels("channels: [conda-forge, defaults, conda-forge]\n"),
            ["conda-forge", main, r]
        );
    }

    #[test]
    fn platforms_become_image_platforms() {
        let (recipe, made) = convert(
            "channels: [nodefaults, conda-forge]\nplatforms: [linux-64, osx-arm64, linux-aarch64, win-64]\n",
        );
        let platforms: Vec<String> = recipe.platforms.iter().map(|p| p.to_string()).collect();
        assert_eq!(platforms, ["linux-64", "linux-aarch64"]);
        assert_eq!(
            made.notes,
            [
                "`platforms:` `osx-arm64`, `win-64` are not Linux (an image runs Linux); left out of [image] platforms"
            ]
        );
        let (recipe, _) = convert("channels: [nodefaults, conda-forge]\nplatforms: [osx-64]\n");
        assert_eq!(
            recipe
                .platforms
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>(),
            ["linux-64"]
        );
    }

    #[test]
    fn other_systems_unknown_keys_and_channel_priority_are_warned_about() {
        let (_, made) = convert(
            "name: x\ncategory: ml\nchannel_priority: flexible\nchannels: [nodefaults, conda-forge]\ndependencies:\n  - python=3.9\n  - libcxx=14.0.6\n  - __osx>=10.15\n  - vc=14.2=h21ff451_1\n  - pywin32\n  - numpy=1.23.0=py39h_osx_0\n",
        );
        let notes = made.notes.join("\n");
        assert!(notes.contains("top-level key `category` of environment.yml: not an environment-file key imgbuild reads"), "{notes}");
        assert!(
            notes.contains(
                "`channel_priority: flexible`: imgbuild has no flexible priority; the recipe solves with strict channel priority"
            ),
            "{notes}"
        );
        assert!(
            notes.contains("`libcxx 14.0.6.*`, `__osx >=10.15`, `vc ==14.2 h21ff451_1`, `pywin32` and 1 more are for macOS or Windows"),
            "{notes}"
        );
        assert_eq!(made.notes.len(), 3, "{notes}");

        // What conda reads, and `channel_priority: strict` (imgbuild's own), say nothing.
        let (_, made) = convert(
            "name: x\nprefix: /p\nvariables: {A: b}\nchannel_priority: strict\nchannels: [nodefaults, conda-forge]\ndependencies: [python=3.9, libgcc-ng]\nplatforms: [linux-64]\n",
        );
        assert_eq!(made.notes.len(), 1, "only the prefix: {:?}", made.notes);
    }

    #[test]
    fn channel_priority_becomes_the_recipes_key() {
        use rattler_solve::ChannelPriority;
        let with = |priority: &str| {
            convert(&format!(
                "name: x\nchannel_priority: {priority}\nchannels: [nodefaults, conda-forge]\ndependencies: [python=3.9]\n"
            ))
        };
        for (priority, wanted) in [
            ("disabled", ChannelPriority::Disabled),
            // conda's old boolean form.
            ("false", ChannelPriority::Disabled),
            ("strict", ChannelPriority::Strict),
        ] {
            let (recipe, made) = with(priority);
            assert_eq!(recipe.channel_priority, wanted, "{}", made.text);
            assert!(made.notes.is_empty(), "{priority}: {:?}", made.notes);
        }
        let (_, made) = with("disabled");
        assert!(
            made.text.contains("]\nchannel-priority = \"disabled\"\n"),
            "{}",
            made.text
        );
        // Flexible (or `true`) has no equivalent: strict, the default, and a note.
        for priority in ["flexible", "true"] {
            let (recipe, made) = with(priority);
            assert_eq!(recipe.channel_priority, ChannelPriority::Strict);
            assert!(!made.text.contains("channel-priority"), "{}", made.text);
            assert_eq!(made.notes.len(), 1, "{:?}", made.notes);
        }
        // No `channel_priority:`, no key.
        let (_, made) =
            convert("name: x\nchannels: [nodefaults, conda-forge]\ndependencies: [python=3.9]\n");
        assert!(!made.text.contains("channel-priority"), "{}", made.text);
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
