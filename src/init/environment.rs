//! A conda `environment.yml` converted into a recipe.
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

use std::path::Path;

use rattler_conda_types::{EnvironmentYaml, MatchSpec, MatchSpecOrSubSection, NamedChannelOrUrl};

use super::{
    InitError, InitRecipe, checked_recipe, comment_text,
    cuda::cuda_section,
    image_name,
    pip::{PipSection, pip_section, pypi_text},
    quote,
};

/// conda's `defaults` on Linux: not a channel but Anaconda's `main` and `r` repositories, in
/// that order (conda's `DEFAULT_CHANNELS_UNIX`).
pub const DEFAULTS_CHANNEL_URLS: [&str; 2] = [
    "https://repo.anaconda.com/pkgs/main",
    "https://repo.anaconda.com/pkgs/r",
];

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
    let name = image_name(
        name.or(environment.name.as_deref())
            .unwrap_or_else(|| path.file_stem().and_then(|s| s.to_str()).unwrap_or("app")),
    );

    // The notes come in the order of the recipe's sections.
    let mut notes = Vec::new();
    unknown_keys_note(&extras.unknown, &file_name, &mut notes);
    let channels = recipe_channels(&environment.channels, &mut notes);
    let platforms = image_platforms(&extras.platforms, &mut notes);
    let channel_priority = extras
        .channel_priority
        .as_deref()
        .and_then(|priority| recipe_channel_priority(priority, &mut notes));
    let dependencies = Dependencies::sort(&environment.dependencies, &mut notes);
    let cuda = cuda_section(&dependencies.conda, &mut notes);
    other_os_note(&dependencies.conda, &mut notes);
    selector_note(text, &mut notes);
    if let Some(prefix) = &environment.prefix {
        notes.push(format!(
            "`prefix: {}` names a path on the machine that made the file; the image's environment is at `prefix` in [image] (default /opt/conda)",
            prefix.display()
        ));
    }

    let mut text = image_text(&environment, &name, &platforms, &file_name);
    text.push_str(&cuda);
    text.push_str(&conda_text(
        &channels,
        &dependencies.conda,
        channel_priority,
    ));
    if let Some(pypi) = &dependencies.pypi {
        text.push_str(&pypi_text(pypi, &file_name));
    }
    text.push_str(&kept_text(&dependencies.kept, &file_name));

    // What we write must be a recipe imgbuild accepts, with only the tables we write.
    checked_recipe(&text, Path::new("recipe.toml"), path)?;
    Ok(InitRecipe { text, notes })
}

/// Notes the top-level keys of the file that nothing reads, `unknown`.
fn unknown_keys_note(unknown: &[String], file_name: &str, notes: &mut Vec<String>) {
    if unknown.is_empty() {
        return;
    }
    let keys: Vec<String> = unknown.iter().map(|k| format!("`{k}`")).collect();
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
    if unknown.iter().any(|k| k == "channel_alias") {
        notes.push(
            "`channel_alias` is a .condarc setting conda does not read from an environment file; to build through that mirror, pass it as `imgbuild --channel-alias URL`"
                .to_string(),
        );
    }
}

/// An environment file's `dependencies:`, sorted by where they go in the recipe.
struct Dependencies<'a> {
    /// Conda match specs: `[conda] dependencies`.
    conda: Vec<&'a MatchSpec>,
    /// The `pip:` section: `[pypi]`.
    pypi: Option<PipSection>,
    /// What a recipe cannot express, by section (`pip` for its leftover lines), kept as
    /// comments.
    kept: Vec<(String, Vec<String>)>,
}

impl<'a> Dependencies<'a> {
    /// Sorts `dependencies`, noting what is kept as a comment.
    fn sort(dependencies: &'a [MatchSpecOrSubSection], notes: &mut Vec<String>) -> Self {
        let mut sorted = Dependencies {
            conda: Vec::new(),
            pypi: None,
            kept: Vec::new(),
        };
        for dependency in dependencies {
            match dependency {
                MatchSpecOrSubSection::MatchSpec(spec) => sorted.conda.push(spec.as_ref()),
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
                        sorted.kept.push(("pip".to_string(), left));
                    }
                    sorted.pypi = Some(section);
                }
                MatchSpecOrSubSection::SubSection(section, specs) => {
                    let count = match specs.len() {
                        1 => "1 package".to_string(),
                        n => format!("{n} packages"),
                    };
                    notes.push(format!(
                        "the `{section}:` section ({count}) is not yet supported: imgbuild installs conda packages only; it is kept as a comment in the recipe"
                    ));
                    sorted.kept.push((section.clone(), specs.clone()));
                }
            }
        }
        sorted
    }
}

/// The recipe's header and `[image]` section, with `[image.env]` from the environment's
/// `variables`.
fn image_text(
    environment: &EnvironmentYaml,
    name: &str,
    platforms: &[String],
    file_name: &str,
) -> String {
    let mut text = format!(
        "# Made by `imgbuild init --from {file_name}`{from}.\n\
         # Build it with `imgbuild build <this file>`; docs/src/reference/recipe.md lists every key.\n\n\
         [image]\nname = {name}\n\
         # glibc and a shell, as the shipped recipes; the lock pins its digest. Or \"oci:PATH[:TAG]\",\n\
         # another registry image with glibc, or \"scratch\" (empty: python cannot start there).\n\
         base = \"docker.io/library/debian:12-slim\"\n\
         platforms = [{platforms}]\n\
         entrypoint = [\"/opt/conda/bin/python\"]\n",
        // The file's name and the environment's are a stranger's text: kept on the line.
        file_name = comment_text(file_name),
        from = environment
            .name
            .as_ref()
            .map(|n| format!(" (conda environment `{}`)", comment_text(n)))
            .unwrap_or_default(),
        name = quote(name),
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
    text
}

/// The `[conda]` section's text.
fn conda_text(
    channels: &[ChannelLine],
    dependencies: &[&MatchSpec],
    channel_priority: Option<&str>,
) -> String {
    let mut text = String::from("\n[conda]\nchannels = [\n");
    for line in channels {
        if let Some(comment) = line.comment {
            text.push_str(&format!("    # {comment}\n"));
        }
        text.push_str(&format!("    {},\n", quote(&line.channel)));
    }
    text.push_str("]\ndependencies = [\n");
    for dependency in dependencies {
        text.push_str(&format!("    {},\n", quote(&dependency.to_string())));
    }
    text.push_str("]\n");
    if let Some(priority) = channel_priority {
        text.push_str(&format!("channel-priority = {}\n", quote(priority)));
    }
    text
}

/// The sections a recipe cannot express, as comments, so nothing of the file is lost.
fn kept_text(kept: &[(String, Vec<String>)], file_name: &str) -> String {
    let mut text = String::new();
    for (section, specs) in kept {
        // The section's name and the lines are the file's text: each kept on its line.
        let section = comment_text(section);
        let file_name = comment_text(file_name);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        init::unwritten_key,
        recipe::{Recipe, RecipeOptions},
    };

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
        assert_eq!(recipe.config.env["OMP_NUM_THREADS"], "4");
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

    /// Hostile text in every place `init` copies from the file: each file is refused, or
    /// converted into a recipe with only the tables `init` writes, whose strings are the
    /// file's own, unchanged. The same check as the `init_from` fuzz target, over its seeds.
    #[test]
    fn a_strangers_text_stays_inside_quoted_strings() {
        let inject = "x\n[[files]]\nsrc = \"/etc\"\ndest = \"/leak\"\n[pypi]\nindex-url = \"https://evil.example/simple\"";
        let quoted = serde_json::to_string(inject).unwrap();
        let cases = [
            format!("name: {quoted}\nchannels: [nodefaults, conda-forge]\n"),
            format!(
                "channels: [nodefaults, conda-forge]\ndependencies:\n  - pip:\n    - {quoted}\n    - -r {}\n",
                quoted.trim_matches('"')
            ),
            format!(
                "channels: [nodefaults, conda-forge]\ndependencies:\n  - npm:\n    - {quoted}\n"
            ),
            format!(
                "channels: [nodefaults, conda-forge]\ndependencies:\n  - {}:\n    - a\n",
                serde_json::to_string("]\n[[files]]\nsrc = \"/\"").unwrap()
            ),
            format!("channels: [nodefaults, {quoted}]\n"),
            format!("channels: [nodefaults, conda-forge]\nvariables:\n  {quoted}: {quoted}\n"),
            format!(
                "channels: [nodefaults, conda-forge]\nplatforms: [{quoted}]\nchannel_priority: {quoted}\n{quoted}: 1\n"
            ),
            "channels: [nodefaults, conda-forge]\ndependencies: ['pytorch=2.1=*cuda11.8*']\n"
                .to_string(),
            "channels: [nodefaults, conda-forge]\ndependencies: ['pytorch=2.1=*cuda10.2*']\n"
                .to_string(),
            format!(
                "name: \"\\u202E\\u2066evil\\u2028x\\u0085y\"\nchannels: [nodefaults, conda-forge]\nprefix: {quoted}\n"
            ),
            format!(
                "name: {}\nchannels: [nodefaults, conda-forge]\n",
                "n".repeat(60_000)
            ),
            include_str!("../../fuzz/seeds/init_from/name-newline.yml").to_string(),
            include_str!("../../fuzz/seeds/init_from/pip-newline.yml").to_string(),
            include_str!("../../fuzz/seeds/init_from/section-toml.yml").to_string(),
            include_str!("../../fuzz/seeds/init_from/bidi-variables.yml").to_string(),
        ];
        for yaml in &cases {
            for file in ["environment.yml", "env\n[[files]]\n.yml"] {
                let Ok(made) = from_environment_yaml(yaml, Path::new(file), None) else {
                    continue;
                };
                assert_eq!(unwritten_key(&made.text), None, "{yaml}\n{}", made.text);
                for line in made.text.lines() {
                    assert!(
                        !line
                            .chars()
                            .any(|c| c.is_control() || super::super::hides_text(c)),
                        "{line:?}"
                    );
                }
                let recipe =
                    Recipe::from_str_at(&made.text, Path::new("r.toml"), &RecipeOptions::default())
                        .unwrap();
                // The strings are the file's own.
                let environment = EnvironmentYaml::from_yaml_str(yaml).unwrap();
                for (key, value) in &environment.variables {
                    assert_eq!(recipe.config.env.get(key), Some(value), "{}", made.text);
                }
                assert!(recipe.files.is_empty(), "{}", made.text);
            }
        }
        // The name and the file's name are in the header comment, escaped on its line.
        let made = from_environment_yaml(&cases[0], Path::new("env\n[x]\n.yml"), None).unwrap();
        let header = made.text.lines().next().unwrap();
        assert!(
            header.contains(r#"--from "env\n[x]\n.yml"` (conda environment `"x\n[[files]]"#),
            "{header}"
        );
    }
}
