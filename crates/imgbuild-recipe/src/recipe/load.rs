//! Turns a recipe file into a validated [`Recipe`].

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
};

use rattler_conda_types::{Channel, ChannelConfig, MatchSpec, ParseStrictness, Subdir, Version};
use rattler_solve::ChannelPriority;
use toml::Spanned;
use url::Url;

use crate::cuda::compat::{
    CudaVersion, DriverVersion, Support, minor_version_minimum, release_minimum, support,
};
use crate::{
    compression::Compression,
    cuda::CudaTarget,
    image_config::ImageConfig,
    names::{is_valid_tag, oci_architecture},
    reference::Base,
};

use super::{Platforms, matrix::Variant};

use super::{
    DEFAULT_CHANNEL_ALIAS, DEFAULT_LAYER_BUDGET, DEFAULT_PREFIX, DEFAULT_SPLIT_BYTES,
    MAX_RECIPE_BYTES, MIN_SPLIT_BYTES,
    checker::{Checker, MAX_ID, UserPart, lexical_path, user_part, visible},
    error::RecipeError,
    schema::{CondaSection, ImageSection, LayersSection, RecipeFile, SplitSetting},
};

/// Settings that change how a recipe is read but are not part of it.
#[derive(Debug, Clone)]
pub struct RecipeOptions {
    /// Base URL that channel names resolve against (`conda-forge` → `<alias>/conda-forge`).
    pub channel_alias: Url,
    /// The variant of a recipe with a `[matrix]` to read; required for such a recipe.
    pub variant: Option<Variant>,
}

impl Default for RecipeOptions {
    fn default() -> Self {
        Self {
            channel_alias: Url::parse(DEFAULT_CHANNEL_ALIAS).expect("valid default alias"),
            variant: None,
        }
    }
}

/// The values of `[conda] channel-priority`.
const CHANNEL_PRIORITIES: [&str; 2] = ["strict", "disabled"];

/// A validated recipe. Every field holds a value later stages can use as it is.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The recipe file, as given.
    pub path: PathBuf,
    /// Image name (`[a-z0-9][a-z0-9._-]*`).
    pub name: String,
    /// Tags for `index.json`, never empty.
    pub tags: Vec<String>,
    pub base: Base,
    /// The base as the recipe wrote it (`oci:../base:v1`), for annotations: unlike
    /// [`Base`], it holds no path of the build host.
    pub base_reference: String,
    /// The conda subdirs the environment is solved and installed for, one image per
    /// platform (an image index when there are several).
    pub platforms: Platforms,
    /// Absolute in-image path of the environment, without a trailing slash.
    pub prefix: String,
    /// glibc version of the target; `None` means "take it from the base, else 2.17".
    pub glibc: Option<Version>,
    /// Channels in priority order.
    pub channels: Vec<Channel>,
    /// The channel strings as written, for the lock and messages.
    pub channel_names: Vec<String>,
    /// `[conda] channel-priority`: `Strict` (the default) or `Disabled`, never `Flexible`.
    pub channel_priority: ChannelPriority,
    pub specs: Vec<MatchSpec>,
    pub cuda: Option<CudaTarget>,
    /// How the image runs: `[image]`'s env, entrypoint, cmd, workdir, user, labels, ports
    /// and stop signal, as the image config takes them.
    pub config: ImageConfig,
    /// `[accounts]`: users and groups added to the image; empty without the section.
    pub accounts: super::accounts::Accounts,
    /// `[[files]]`: the recipe's own files, a layer each above the environment's.
    pub files: Vec<super::files::FileCopy>,
    /// Most layers the image may have, base layers included.
    pub layer_budget: u32,
    /// `[layers] split`: a package of more bytes is split by file into layers of at most
    /// this many; `None` keeps every package whole.
    pub split: Option<u64>,
    /// How new layers are compressed.
    pub compression: Compression,
    /// `[layers] prefetch` (eStargz): globs of image paths (no leading `/`) put first in each
    /// layer, before its prefetch landmark.
    pub prefetch: Vec<glob::Pattern>,
    /// The matrix variant this recipe is (`cuda11.8-python3.9`), if any.
    pub variant: Option<String>,
    /// `[smoke] embed`: the image carries the `imgbuild-smoke` executable.
    pub embed_smoke: bool,
    /// `[image] check-entrypoint`: the build checks that the entrypoint (or cmd) can start.
    pub check_entrypoint: bool,
    /// `[pypi]`: wheels installed into the environment; `None` without the section.
    pub pypi: Option<super::pypi::PypiRecipe>,
    /// `[[models]]`: model weights, each an artifact beside the image, pinned in the lock.
    pub models: Vec<super::models::Model>,
    /// `[[checks]]`: notebooks to run in the built image; not part of the image or its lock.
    pub checks: Vec<super::checks::NotebookCheck>,
}

impl Recipe {
    /// Reads and validates a recipe file.
    pub fn load(path: &Path, options: &RecipeOptions) -> Result<Recipe, RecipeError> {
        let text = read_recipe_text(path)?;
        Self::from_str_at(&text, path, options)
    }

    /// Parses recipe text as if it had been read from `path` (relative paths in the recipe
    /// resolve against the directory of `path`).
    pub fn from_str_at(
        text: &str,
        path: &Path,
        options: &RecipeOptions,
    ) -> Result<Recipe, RecipeError> {
        let variants = super::matrix::variants(text, path)?;
        let text = match &options.variant {
            Some(variant) if variants.contains(variant) => variant.apply(text),
            Some(variant) => {
                return Err(RecipeError::Invalid {
                    path: path.to_path_buf(),
                    message: format!("the recipe has no matrix variant `{}`", variant.suffix()),
                    span: None,
                });
            }
            None if !variants.is_empty() => {
                return Err(RecipeError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "the recipe has a [matrix] of {} variants; `imgbuild build` locks and builds them all",
                        variants.len()
                    ),
                    span: None,
                });
            }
            None => text.to_string(),
        };
        let text = text.as_str();
        let checker = Checker {
            path: path.to_path_buf(),
            text: Arc::from(text),
        };
        let file: RecipeFile = toml::from_str(text).map_err(|err| RecipeError::Invalid {
            path: path.to_path_buf(),
            message: err.message().trim_end().to_string(),
            span: err.span().map(|range| checker.span(range)),
        })?;
        let mut recipe = checker.validate(file, options)?;
        if let Some(variant) = &options.variant {
            recipe.name = format!("{}-{}", recipe.name, variant.suffix());
            recipe.variant = Some(variant.suffix());
        }
        Ok(recipe)
    }

    /// The lock file that belongs to this recipe: the recipe path with extension `.lock`,
    /// or `.VARIANT.lock` for a matrix variant.
    pub fn lock_path(&self) -> PathBuf {
        match &self.variant {
            Some(suffix) => self.path.with_extension(format!("{suffix}.lock")),
            None => self.path.with_extension("lock"),
        }
    }

    /// Directory that relative paths in the recipe are resolved against.
    pub fn directory(&self) -> PathBuf {
        recipe_dir(&self.path)
    }
}

/// Reads a recipe file's text. What is not a regular file (`/dev/zero`, a fifo, a
/// directory) or is larger than [`MAX_RECIPE_BYTES`] is refused before it is read: it would
/// otherwise be read until memory runs out, or forever.
pub fn read_recipe_text(path: &Path) -> Result<String, RecipeError> {
    use crate::fs::InputError;
    crate::fs::read_input_text(path, MAX_RECIPE_BYTES).map_err(|e| match e {
        InputError::NotAFile(kind) => RecipeError::NotAFile {
            path: path.to_path_buf(),
            kind,
        },
        InputError::TooLarge { size, .. } => RecipeError::TooLarge {
            path: path.to_path_buf(),
            size,
        },
        other => RecipeError::Read {
            path: path.to_path_buf(),
            source: other.into(),
        },
    })
}

fn recipe_dir(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new(""));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

impl Checker {
    /// Checks the sections in the order their errors are reported: what the image is, the
    /// conda environment, `[cuda]`, `[pypi]`, how the image runs, `[accounts]`,
    /// `[[files]]`, then `[layers]`.
    fn validate(&self, file: RecipeFile, options: &RecipeOptions) -> Result<Recipe, RecipeError> {
        let target = self.image_target(&file.image)?;
        let conda = self.conda(&file.conda, &options.channel_alias)?;
        let cuda = file.cuda.as_ref().map(|cuda| self.cuda(cuda)).transpose()?;
        let pypi = file.pypi.as_ref().map(|pypi| self.pypi(pypi)).transpose()?;
        let specs = with_cuda_compat(conda.specs, cuda.as_ref());
        let config = self.image_config(&file.image)?;
        let accounts = self.accounts(&file.accounts, &target.prefix)?;
        // The workdir of `[image] user` is made and given to that user.
        if let (Some(dir), Some(_)) = (&file.image.workdir, &config.user) {
            self.owned_directory(dir, dir.get_ref(), "workdir", &target.prefix, false)?;
        }
        let files = self.files(&file.files, &recipe_dir(&self.path))?;
        let models = self.models(&file.models, &recipe_dir(&self.path), &target.prefix)?;
        let layers = self.layers(&file.layers)?;
        let checks = self.checks(&file.checks)?;
        Ok(Recipe {
            path: self.path.clone(),
            name: target.name,
            tags: target.tags,
            base: target.base,
            base_reference: target.base_reference,
            platforms: target.platforms,
            prefix: target.prefix,
            glibc: target.glibc,
            channels: conda.channels,
            channel_names: conda.channel_names,
            channel_priority: conda.channel_priority,
            specs,
            cuda,
            config,
            accounts,
            files,
            models,
            layer_budget: layers.budget,
            split: layers.split,
            compression: layers.compression,
            prefetch: layers.prefetch,
            variant: None,
            embed_smoke: file.smoke.embed,
            check_entrypoint: file
                .image
                .check_entrypoint
                .as_ref()
                .is_none_or(|check| *check.get_ref()),
            pypi,
            checks,
        })
    }

    /// The `[image]` keys that say what is built and for which platforms.
    fn image_target(&self, image: &ImageSection) -> Result<ImageTarget, RecipeError> {
        let name = self.image_name(&image.name)?;
        let tags = match &image.tags {
            None => vec!["latest".to_string()],
            Some(tags) if tags.get_ref().is_empty() => {
                return Err(self.error(tags, "`tags` must name at least one tag"));
            }
            Some(tags) => self.tags(tags.get_ref())?,
        };
        let base = match &image.base {
            None => Base::Scratch,
            Some(base) => self.base(base)?,
        };
        let platforms = match &image.platforms {
            None => Platforms::single(Subdir::Linux64),
            Some(platforms) => self.platforms(platforms)?,
        };
        let prefix = match &image.prefix {
            None => DEFAULT_PREFIX.to_string(),
            Some(prefix) => self.prefix(prefix)?,
        };
        let glibc = image
            .glibc
            .as_ref()
            .map(|glibc| self.version(glibc, "glibc version"))
            .transpose()?;
        Ok(ImageTarget {
            name,
            tags,
            base,
            base_reference: image
                .base
                .as_ref()
                .map_or_else(|| "scratch".to_string(), |b| b.get_ref().clone()),
            platforms,
            prefix,
            glibc,
        })
    }

    fn image_name(&self, name: &Spanned<String>) -> Result<String, RecipeError> {
        let raw = name.get_ref();
        if !is_valid_image_name(raw) {
            return Err(self.error(
                name,
                format!(
                    "invalid image name `{raw}`: expected lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit"
                ),
            ));
        }
        Ok(raw.clone())
    }

    /// `[conda]`: channels resolved against `channel_alias`, the priority and the specs.
    fn conda(
        &self,
        conda: &CondaSection,
        channel_alias: &Url,
    ) -> Result<CondaEnvironment, RecipeError> {
        if conda.channels.is_empty() && !conda.dependencies.is_empty() {
            return Err(RecipeError::Invalid {
                path: self.path.clone(),
                message: "`[conda] dependencies` need at least one entry in `[conda] channels`"
                    .into(),
                span: None,
            });
        }
        let config = self.channel_config(channel_alias);
        let channels = self.channels(&conda.channels, &config)?;
        let channel_priority = conda
            .channel_priority
            .as_ref()
            .map(|priority| self.channel_priority(priority))
            .transpose()?
            .unwrap_or_default();
        let specs = self.specs(&conda.dependencies, &config, &channels)?;
        Ok(CondaEnvironment {
            channels,
            channel_names: conda.channels.iter().map(|c| c.get_ref().clone()).collect(),
            channel_priority,
            specs,
        })
    }

    /// Where channel names and relative channel paths resolve.
    fn channel_config(&self, channel_alias: &Url) -> ChannelConfig {
        // `Url::join` drops the last path segment unless it ends with `/`, so a mirror alias
        // like `https://mirror/conda` would lose `conda` without this.
        let mut channel_alias = channel_alias.clone();
        if !channel_alias.path().ends_with('/') {
            let path = format!("{}/", channel_alias.path());
            channel_alias.set_path(&path);
        }
        ChannelConfig {
            channel_alias,
            root_dir: recipe_dir(&self.path),
        }
    }

    /// A channel-qualified spec (`pytorch::pytorch`, `pkg[channel=pytorch]`) with its channel
    /// resolved as the recipe's own: rattler parses the channel with conda.anaconda.org and
    /// the working directory, so behind a mirror (`--channel-alias`) or with a path relative
    /// to the recipe it would name another channel than the recipe's, and no candidate would
    /// ever match. The channel must be one of `[conda] channels`: the solve reads no other.
    fn with_recipe_channel(
        &self,
        mut spec: MatchSpec,
        raw: &Spanned<String>,
        config: &ChannelConfig,
        channels: &[Channel],
    ) -> Result<MatchSpec, RecipeError> {
        let Some(parsed) = spec.channel.as_ref() else {
            return Ok(spec);
        };
        let named = qualifier(raw.get_ref()).unwrap_or_else(|| parsed.canonical_name());
        let channel = Channel::from_str(&named, config).map_err(|err| {
            self.error(
                raw,
                format!("invalid channel `{named}` in `{}`: {err}", raw.get_ref()),
            )
        })?;
        let same = |c: &Channel| {
            c.base_url.as_str().trim_end_matches('/')
                == channel.base_url.as_str().trim_end_matches('/')
        };
        if !channels.iter().any(same) {
            return Err(self.error(
                raw,
                format!(
                    "`{}` names the channel `{named}` ({}), which is not in `[conda] channels`; add it there (the solve reads only those)",
                    raw.get_ref(),
                    channel.base_url,
                ),
            ));
        }
        spec.channel = Some(Arc::new(channel));
        Ok(spec)
    }

    fn channels(
        &self,
        channels: &[Spanned<String>],
        config: &ChannelConfig,
    ) -> Result<Vec<Channel>, RecipeError> {
        channels
            .iter()
            .map(|channel| {
                Channel::from_str(channel.get_ref(), config).map_err(|err| {
                    self.error(
                        channel,
                        format!("invalid channel `{}`: {err}", channel.get_ref()),
                    )
                })
            })
            .collect()
    }

    /// `[conda] dependencies`: every entry parsed first, then each must name one package,
    /// and a channel it names is resolved as the recipe's channels are.
    fn specs(
        &self,
        dependencies: &[Spanned<String>],
        config: &ChannelConfig,
        channels: &[Channel],
    ) -> Result<Vec<MatchSpec>, RecipeError> {
        let specs = dependencies
            .iter()
            .map(|dep| {
                // Lenient, as conda itself: `python 3.9` means `3.9.*`, as users write in environment.yml.
                let spec = MatchSpec::from_str(dep.get_ref(), ParseStrictness::Lenient).map_err(
                    |err| {
                        self.error(
                            dep,
                            format!("invalid dependency `{}`: {err}", dep.get_ref()),
                        )
                    },
                )?;
                self.with_recipe_channel(spec, dep, config, channels)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (spec, raw) in specs.iter().zip(dependencies) {
            if spec.name.as_exact().is_none() {
                return Err(self.error(
                    raw,
                    "a dependency must name one package exactly (no globs or regexes)",
                ));
            }
        }
        Ok(specs)
    }

    /// The `[image]` keys that say how the image runs.
    fn image_config(&self, image: &ImageSection) -> Result<ImageConfig, RecipeError> {
        let workdir = image
            .workdir
            .as_ref()
            .map(|dir| self.workdir(dir))
            .transpose()?;
        let user = image.user.as_ref().map(|u| self.user(u)).transpose()?;
        let env = self.env(&image.env)?;
        let labels = self.labels(&image.labels)?;
        let entrypoint = image
            .entrypoint
            .as_ref()
            .map(|args| self.command(args, "entrypoint"))
            .transpose()?;
        let cmd = image
            .cmd
            .as_ref()
            .map(|args| self.command(args, "cmd"))
            .transpose()?;
        let ports = self.ports(&image.ports)?;
        let stop_signal = image
            .stop_signal
            .as_ref()
            .map(|signal| self.stop_signal(signal))
            .transpose()?;
        Ok(ImageConfig {
            env,
            entrypoint,
            cmd,
            workdir,
            user,
            labels,
            ports,
            stop_signal,
        })
    }

    /// `[layers]`: the layer budget and the compression of new layers.
    fn layers(&self, layers: &LayersSection) -> Result<LayerSettings, RecipeError> {
        let budget = match &layers.max {
            None => DEFAULT_LAYER_BUDGET,
            Some(max) => match u32::try_from(*max.get_ref()) {
                Ok(n @ 2..=127) => n,
                _ => {
                    return Err(self.error(
                        max,
                        "`layers.max` must be between 2 and 127 (overlay filesystems stop near 127 layers)",
                    ));
                }
            },
        };
        let compression = match &layers.compression {
            None => Compression::default(),
            Some(name) => Compression::from_name(name.get_ref()).ok_or_else(|| {
                self.error(
                    name,
                    "`layers.compression` must be `gzip` (read by every runtime), `zstd` (smaller and faster; containerd 1.5+, podman, CRI-O), `estargz` (gzip that the stargz snapshotter pulls lazily) or `zstd:chunked` (zstd that podman pulls partially)",
                )
            })?,
        };
        let prefetch = match &layers.prefetch {
            None => Vec::new(),
            Some(globs) => {
                if compression != Compression::Estargz && !globs.get_ref().is_empty() {
                    return Err(self.error(
                        globs,
                        "`layers.prefetch` orders eStargz layers for the stargz snapshotter: it needs `compression = \"estargz\"`",
                    ));
                }
                let mut patterns = Vec::new();
                for glob in globs.get_ref() {
                    let pattern =
                        glob::Pattern::new(glob.trim_start_matches('/')).map_err(|e| {
                            self.error(
                                globs,
                                format!("`layers.prefetch`: `{glob}` is not a glob: {e}"),
                            )
                        })?;
                    patterns.push(pattern);
                }
                patterns
            }
        };
        Ok(LayerSettings {
            budget,
            split: self.split(layers.split.as_ref())?,
            compression,
            prefetch,
        })
    }

    /// `[layers] split`: a size of at least [`MIN_SPLIT_BYTES`], `false`, or
    /// [`DEFAULT_SPLIT_BYTES`] when unset.
    fn split(&self, raw: Option<&Spanned<SplitSetting>>) -> Result<Option<u64>, RecipeError> {
        let Some(raw) = raw else {
            return Ok(Some(DEFAULT_SPLIT_BYTES));
        };
        let text = match raw.get_ref() {
            SplitSetting::Enabled(false) => return Ok(None),
            SplitSetting::Enabled(true) => return Ok(Some(DEFAULT_SPLIT_BYTES)),
            SplitSetting::Size(text) => text,
        };
        match text.parse::<bytesize::ByteSize>() {
            Ok(size) if size.as_u64() >= MIN_SPLIT_BYTES => Ok(Some(size.as_u64())),
            Ok(_) => Err(self.error(
                raw,
                format!("`layers.split` must be at least 16MiB, not `{text}`: smaller layers slow pulls down"),
            )),
            Err(_) => Err(self.error(
                raw,
                format!("`layers.split` must be a size such as `512MiB` or `1GB`, or `false`, not `{text}`"),
            )),
        }
    }

    /// `[conda] channel-priority`: `strict` or `disabled`, with the closer one suggested for
    /// anything else (`flexible`, which imgbuild does not offer, gets none).
    fn channel_priority(&self, raw: &Spanned<String>) -> Result<ChannelPriority, RecipeError> {
        match raw.get_ref().as_str() {
            "strict" => Ok(ChannelPriority::Strict),
            "disabled" => Ok(ChannelPriority::Disabled),
            other => {
                let hint = super::suggest::closest(other, CHANNEL_PRIORITIES, 1)
                    .first()
                    .map(|close| format!("; did you mean `{close}`?"))
                    .unwrap_or_default();
                Err(self.error(
                    raw,
                    format!(
                        "`conda.channel-priority` must be `strict` (a package comes only from the first channel that has it) or `disabled` (the best version from any channel), not `{other}`{hint}"
                    ),
                ))
            }
        }
    }

    fn tags(&self, tags: &[Spanned<String>]) -> Result<Vec<String>, RecipeError> {
        let mut valid: Vec<String> = Vec::with_capacity(tags.len());
        for tag in tags {
            let raw = tag.get_ref();
            if !is_valid_tag(raw) {
                return Err(self.error(
                    tag,
                    format!(
                        "invalid tag `{}`: expected {}",
                        visible(raw),
                        crate::names::TAG_RULE
                    ),
                ));
            }
            // `index.json` would name one image twice under the tag; a typo is likelier.
            if valid.contains(raw) {
                return Err(self.error(tag, format!("tag `{raw}` is listed twice")));
            }
            valid.push(raw.clone());
        }
        Ok(valid)
    }

    fn platforms(
        &self,
        platforms: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<Platforms, RecipeError> {
        let mut subdirs: Vec<Subdir> = Vec::new();
        for entry in platforms.get_ref() {
            let subdir = Subdir::from_str(entry.get_ref()).map_err(|_| {
                self.error(
                    entry,
                    format!(
                        "unknown platform `{}`: expected a conda subdir such as `linux-64` or `linux-aarch64`",
                        entry.get_ref()
                    ),
                )
            })?;
            if !subdir.is_linux() || oci_architecture(subdir).is_none() {
                return Err(self.error(
                    entry,
                    format!("platform `{subdir}` cannot run in a Linux container image"),
                ));
            }
            if subdirs.contains(&subdir) {
                return Err(self.error(entry, format!("platform `{subdir}` is listed twice")));
            }
            subdirs.push(subdir);
        }
        Platforms::new(subdirs)
            .ok_or_else(|| self.error(platforms, "`platforms` must name at least one platform"))
    }

    fn base(&self, base: &Spanned<String>) -> Result<Base, RecipeError> {
        let raw = base.get_ref().as_str();
        if raw == "scratch" {
            return Ok(Base::Scratch);
        }
        let Some(rest) = raw.strip_prefix("oci:") else {
            return crate::reference::Reference::parse(raw)
                .map(Base::Registry)
                .map_err(|err| {
                    self.error(
                        base,
                        format!(
                            "{err}; expected `scratch`, `oci:PATH[:TAG]` (a local OCI image layout) or `registry/repository[:tag][@sha256:…]`"
                        ),
                    )
                });
        };
        // `oci:PATH:TAG`, read as every `DIR[:TAG]` is.
        let (path, tag) = crate::reference::split_layout(rest);
        let tag = tag.unwrap_or(crate::reference::DEFAULT_TAG);
        if path.is_empty() {
            return Err(self.error(base, "`oci:` needs a path to an OCI image layout"));
        }
        if !is_valid_tag(tag) {
            return Err(self.error(base, format!("invalid tag `{tag}` in base `{raw}`")));
        }
        Ok(Base::OciLayout {
            path: recipe_dir(&self.path).join(path),
            tag: tag.to_string(),
        })
    }

    fn pypi(
        &self,
        pypi: &super::schema::PypiSection,
    ) -> Result<super::pypi::PypiRecipe, RecipeError> {
        let requirements = pypi
            .dependencies
            .iter()
            .map(|dep| {
                // The error is one line: pep508_rs draws its own caret on further
                // lines, ours points into the recipe.
                let requirement =
                    crate::python::requirement::parse(dep.get_ref()).map_err(|reason| {
                        self.error(
                            dep,
                            format!("invalid PyPI requirement `{}`: {reason}", dep.get_ref()),
                        )
                    })?;
                if matches!(
                    requirement.version_or_url,
                    Some(pep508_rs::VersionOrUrl::Url(_))
                ) {
                    return Err(self.error(
                        dep,
                        "direct URL requirements are not supported: put the wheel in a `find-links` directory and require it by name",
                    ));
                }
                Ok(requirement)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let index_url = |value: &Spanned<String>| {
            let url = Url::parse(value.get_ref().trim_end_matches('/')).map_err(|err| {
                self.error(
                    value,
                    format!("invalid index URL `{}`: {err}", value.get_ref()),
                )
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(self.error(
                    value,
                    "an index URL must be `http://` or `https://`; use `find-links` for a local directory of wheels",
                ));
            }
            Ok(url)
        };
        let no_index = pypi.no_index.as_ref().is_some_and(|n| *n.get_ref());
        let mut indexes = Vec::new();
        if no_index {
            if let Some(url) = pypi.index_url.as_ref().or(pypi.extra_index_urls.first()) {
                return Err(self.error(
                    url,
                    "`no-index = true` asks no index: remove this URL or `no-index`",
                ));
            }
            if pypi.find_links.is_empty() {
                let flag = pypi.no_index.as_ref().expect("set");
                return Err(self.error(
                    flag,
                    "`no-index = true` needs `find-links`: with neither, no wheel can be found",
                ));
            }
        } else {
            indexes.push(match &pypi.index_url {
                Some(url) => index_url(url)?,
                None => Url::parse(super::pypi::DEFAULT_INDEX_URL).expect("a valid URL"),
            });
            for url in &pypi.extra_index_urls {
                indexes.push(index_url(url)?);
            }
        }
        let find_links = pypi
            .find_links
            .iter()
            .map(|location| {
                let parsed =
                    super::pypi::FindLinks::from_str(location.get_ref()).map_err(|reason| {
                        self.error(location, format!("invalid `find-links` entry: {reason}"))
                    })?;
                Ok(match parsed {
                    // By name, so the lock, which writes it relative to itself, reads
                    // back the same directory.
                    super::pypi::FindLinks::Directory(dir) => super::pypi::FindLinks::Directory(
                        lexical_path(&recipe_dir(&self.path).join(dir)),
                    ),
                    other => other,
                })
            })
            .collect::<Result<Vec<_>, RecipeError>>()?;
        Ok(super::pypi::PypiRecipe {
            requirements,
            sources: super::pypi::Sources {
                indexes,
                find_links,
            },
        })
    }

    fn cuda(&self, cuda: &super::schema::CudaSection) -> Result<CudaTarget, RecipeError> {
        let version: CudaVersion = cuda
            .version
            .get_ref()
            .parse()
            .ok()
            .filter(|_| cuda.version.get_ref().matches('.').count() == 1)
            .ok_or_else(|| {
                self.error(
                    &cuda.version,
                    format!(
                        "invalid CUDA version `{}`: expected `MAJOR.MINOR`, e.g. `11.8`",
                        cuda.version.get_ref()
                    ),
                )
            })?;
        if minor_version_minimum(version.major).is_none() {
            return Err(self.error(
                &cuda.version,
                format!("CUDA {version} is not a release imgbuild knows (11.x, 12.x and 13.x are)"),
            ));
        }
        if let Some(releases) = not_a_release(version) {
            return Err(self.error(
                &cuda.version,
                format!(
                    "CUDA {version} is not a CUDA release; NVIDIA's {}.x releases are {releases}",
                    version.major
                ),
            ));
        }
        let min_driver = match &cuda.min_driver {
            Some(raw) => raw
                .get_ref()
                .parse::<DriverVersion>()
                .map_err(|message| self.error(raw, format!("invalid `min-driver`: {message}")))?,
            None => release_minimum(version)
                .or_else(|| minor_version_minimum(version.major))
                .expect("known major"),
        };
        let support = support(version, &min_driver);
        if let (Support::Unsupported { needs }, false) = (&support, cuda.compat) {
            let span = cuda
                .min_driver
                .as_ref()
                .map_or_else(|| cuda.version.span(), |d| d.span());
            let full = release_minimum(version)
                .map(|d| format!("; {d} or newer for full support"))
                .unwrap_or_default();
            return Err(RecipeError::Invalid {
                path: self.path.clone(),
                message: format!(
                    "CUDA {version} cannot run on driver {min_driver}: it needs driver {needs} or newer (minor-version compatibility){full}. Raise `min-driver`, lower `version`, or set `compat = true` for NVIDIA's forward-compatibility libraries"
                ),
                span: Some(self.span(span)),
            });
        }
        Ok(CudaTarget {
            version,
            min_driver,
            compat: cuda.compat,
            support,
            architectures: self.gpu_architectures(&cuda.architectures)?,
        })
    }

    /// `[cuda] architectures`: devices, so `sm_XX` only (`compute_XX` is what a library
    /// carries, not a GPU).
    fn gpu_architectures(
        &self,
        list: &[Spanned<String>],
    ) -> Result<crate::cuda::fatbin::Architectures, RecipeError> {
        use crate::cuda::fatbin::{Arch, ArchKind};
        list.iter()
            .map(|raw| match raw.get_ref().parse::<Arch>() {
                Ok(arch) if arch.kind == ArchKind::Sass => Ok(arch),
                _ => Err(self.error(
                    raw,
                    format!(
                        "invalid GPU architecture `{}` in `architectures`: name a device as `sm_` and its compute capability, e.g. `sm_80` for 8.0",
                        raw.get_ref()
                    ),
                )),
            })
            .collect()
    }

    fn workdir(&self, dir: &Spanned<String>) -> Result<String, RecipeError> {
        let raw = dir.get_ref();
        self.visible_only(dir, "`workdir`")?;
        if !raw.starts_with('/') {
            return Err(self.error(dir, "`workdir` must be an absolute path"));
        }
        // The runtime resolves the working directory in the container's root; `..` in it
        // says something other than where the process starts.
        if raw.split('/').any(|part| part == "..") {
            return Err(self.error(
                dir,
                format!("`workdir` `{raw}` contains `..`: write the directory it means"),
            ));
        }
        Ok(raw.clone())
    }

    /// `uid`, `uid:gid`, `name` or `name:group` (a name or an ID on either side), as
    /// runtimes read the OCI config's `User`.
    fn user(&self, user: &Spanned<String>) -> Result<String, RecipeError> {
        let raw = user.get_ref();
        let (name, group) = match raw.split_once(':') {
            Some((name, group)) => (name, Some(group)),
            None => (raw.as_str(), None),
        };
        for part in std::iter::once(name).chain(group) {
            match user_part(part) {
                UserPart::Name | UserPart::Id => {}
                UserPart::IdOutOfRange => {
                    return Err(self.error(
                        user,
                        format!(
                            "`user` ID `{part}` is outside 0..{MAX_ID} (the IDs Linux can give; 4294967295 means \"no ID\")"
                        ),
                    ));
                }
                UserPart::Invalid => {
                    return Err(self.error(
                        user,
                        "`user` must be `uid`, `uid:gid`, `name` or `name:group`",
                    ));
                }
            }
        }
        Ok(raw.clone())
    }

    /// `[image.env]`: every key non-empty and without `=`, nothing hidden in keys or values.
    fn env(
        &self,
        env: &BTreeMap<Spanned<String>, Spanned<String>>,
    ) -> Result<BTreeMap<String, String>, RecipeError> {
        for (key, value) in env {
            let name = key.get_ref();
            if name.is_empty() {
                return Err(self.error(key, "an `[image.env]` key must not be empty"));
            }
            self.visible_only(key, "the `[image.env]` key")?;
            // The config holds `KEY=value`: a runtime would cut the key at its first `=`.
            if name.contains('=') {
                return Err(self.error(
                    key,
                    format!(
                        "the `[image.env]` key `{name}` contains `=`, which ends a variable's name"
                    ),
                ));
            }
            self.visible_only(value, &format!("the value of `{name}` in `[image.env]`"))?;
        }
        Ok(plain(env))
    }

    /// `[image.labels]`: nothing hidden in keys or values.
    fn labels(
        &self,
        labels: &BTreeMap<Spanned<String>, Spanned<String>>,
    ) -> Result<BTreeMap<String, String>, RecipeError> {
        for (key, value) in labels {
            self.visible_only(key, "the `[image.labels]` key")?;
            let name = key.get_ref();
            self.visible_only(value, &format!("the value of `{name}` in `[image.labels]`"))?;
        }
        Ok(plain(labels))
    }

    /// `entrypoint` or `cmd`: no empty element (an empty path or argument is a value that
    /// went missing, and an empty first element runs nothing).
    fn command(&self, args: &[Spanned<String>], what: &str) -> Result<Vec<String>, RecipeError> {
        if let Some(empty) = args.iter().find(|a| a.get_ref().is_empty()) {
            return Err(self.error(empty, format!("an element of `{what}` must not be empty")));
        }
        Ok(args.iter().map(|a| a.get_ref().clone()).collect())
    }

    fn prefix(&self, prefix: &Spanned<String>) -> Result<String, RecipeError> {
        self.visible_only(prefix, "the prefix")?;
        let raw = prefix.get_ref();
        let trimmed = raw.trim_end_matches('/');
        let valid = trimmed.starts_with('/')
            && trimmed.len() > 1
            && trimmed
                .split('/')
                .skip(1)
                .all(|part| !part.is_empty() && part != "." && part != "..")
            && !trimmed.contains(['\0', '\n', ' ']);
        if !valid {
            return Err(self.error(
                prefix,
                format!(
                    "invalid prefix `{raw}`: expected an absolute path like `/opt/conda`, without `..`, spaces or `/` alone"
                ),
            ));
        }
        Ok(trimmed.to_string())
    }

    fn version(&self, value: &Spanned<String>, what: &str) -> Result<Version, RecipeError> {
        Version::from_str(value.get_ref()).map_err(|err| {
            self.error(
                value,
                format!("invalid {what} `{}`: {err}", value.get_ref()),
            )
        })
    }
}

/// The `[image]` keys that say what is built, checked.
struct ImageTarget {
    name: String,
    tags: Vec<String>,
    base: Base,
    base_reference: String,
    platforms: Platforms,
    prefix: String,
    glibc: Option<Version>,
}

/// `[conda]`, checked.
struct CondaEnvironment {
    channels: Vec<Channel>,
    channel_names: Vec<String>,
    channel_priority: ChannelPriority,
    specs: Vec<MatchSpec>,
}

/// `[layers]`, checked.
struct LayerSettings {
    budget: u32,
    split: Option<u64>,
    compression: Compression,
    prefetch: Vec<glob::Pattern>,
}

/// `specs` with NVIDIA's forward-compatibility libraries for the runtime when `[cuda]`
/// asks for them (conda-forge and the nvidia channel name them `cuda-compat`).
/// The releases of `version`'s major, when `version` is not one of them but lies within
/// NVIDIA's list (`11.9`, `12.7`): a version after the newest release the list knows is
/// taken as a release to come.
fn not_a_release(version: CudaVersion) -> Option<String> {
    let releases = crate::cuda::compat::RELEASE_MINIMUM_DRIVER;
    let newest = releases.iter().map(|(v, _)| *v).max()?;
    if version > newest || release_minimum(version).is_some() {
        return None;
    }
    let same_major: Vec<String> = releases
        .iter()
        .filter(|(v, _)| v.major == version.major)
        .map(|(v, _)| v.to_string())
        .collect();
    Some(same_major.join(", "))
}

/// The channel a spec names as written: `CHANNEL[/SUBDIR]::…` or `…[channel=CHANNEL]`, the
/// subdir left off.
fn qualifier(spec: &str) -> Option<String> {
    let spec = spec.trim();
    let named = match spec.split_once("::") {
        Some((channel, _)) => channel.to_string(),
        None => {
            let (_, rest) = spec.split_once("channel=")?;
            let end = rest.find([',', ']']).unwrap_or(rest.len());
            rest[..end].trim().trim_matches(['"', '\'']).to_string()
        }
    };
    let without_subdir = match named.rsplit_once('/') {
        Some((channel, subdir)) if Subdir::from_str(subdir).is_ok() => channel.to_string(),
        _ => named,
    };
    Some(without_subdir).filter(|c| !c.is_empty())
}

fn with_cuda_compat(mut specs: Vec<MatchSpec>, cuda: Option<&CudaTarget>) -> Vec<MatchSpec> {
    if let Some(cuda) = cuda.filter(|c| c.compat) {
        specs.push(
            MatchSpec::from_str(
                &format!("cuda-compat {}.*", cuda.version),
                ParseStrictness::Lenient,
            )
            .expect("a valid spec"),
        );
    }
    specs
}

/// A checked map without its spans.
fn plain(map: &BTreeMap<Spanned<String>, Spanned<String>>) -> BTreeMap<String, String> {
    map.iter()
        .map(|(k, v)| (k.get_ref().clone(), v.get_ref().clone()))
        .collect()
}

/// OCI image names: lowercase alphanumerics with `.`, `_`, `-` separators.
fn is_valid_image_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::super::checker::forbidden;
    use super::*;

    fn parse(text: &str) -> Result<Recipe, RecipeError> {
        Recipe::from_str_at(
            text,
            Path::new("/work/recipes/x.toml"),
            &RecipeOptions::default(),
        )
    }

    const MINIMAL: &str = r#"
[image]
name = "x"

[conda]
channels = ["conda-forge", "https://example.org/ch", "file:///srv/ch", "../local"]
dependencies = ["python=3.9", "numpy >=1.20"]
"#;

    /// `[conda]` with `channels` and `dependencies`, read with `alias`.
    fn with_specs(channels: &str, dependencies: &str, alias: &str) -> Result<Recipe, RecipeError> {
        let text = format!(
            "[image]\nname = \"x\"\n\n[conda]\nchannels = {channels}\ndependencies = {dependencies}\n"
        );
        let options = RecipeOptions {
            channel_alias: Url::parse(alias).unwrap(),
            variant: None,
        };
        Recipe::from_str_at(&text, Path::new("/work/recipes/x.toml"), &options)
    }

    fn spec_channel(recipe: &Recipe, at: usize) -> String {
        recipe.specs[at]
            .channel
            .as_ref()
            .unwrap()
            .base_url
            .to_string()
    }

    #[test]
    fn a_channel_qualified_spec_resolves_through_the_recipes_alias() {
        let recipe = with_specs(
            r#"["conda-forge", "pytorch"]"#,
            r#"["pytorch::pytorch=2.0.0", "pytorch/linux-64::torchvision", "numpy[channel=conda-forge]"]"#,
            "https://mirror.example/conda",
        )
        .unwrap();
        assert_eq!(
            spec_channel(&recipe, 0),
            "https://mirror.example/conda/pytorch/"
        );
        assert_eq!(
            spec_channel(&recipe, 1),
            "https://mirror.example/conda/pytorch/"
        );
        assert_eq!(
            spec_channel(&recipe, 2),
            "https://mirror.example/conda/conda-forge/"
        );
        assert_eq!(recipe.specs[1].subdir.as_deref(), Some("linux-64"));
    }

    #[test]
    fn layers_split_is_a_size_false_or_the_default() {
        let split = |tables: &str| crate::recipe::parse_with(tables).map(|r| r.split);
        assert_eq!(split(""), Ok(Some(DEFAULT_SPLIT_BYTES)));
        assert_eq!(
            split("[layers]\nsplit = true"),
            Ok(Some(DEFAULT_SPLIT_BYTES))
        );
        assert_eq!(split("[layers]\nsplit = false"), Ok(None));
        assert_eq!(split("[layers]\nsplit = \"1GiB\""), Ok(Some(1 << 30)));
        assert_eq!(split("[layers]\nsplit = \"300 MB\""), Ok(Some(300_000_000)));
        assert_eq!(
            split("[layers]\nsplit = \"16MiB\""),
            Ok(Some(MIN_SPLIT_BYTES))
        );
        for (bad, needle) in [
            ("\"15MiB\"", "at least 16MiB"),
            ("\"lots\"", "must be a size such as"),
            ("\"-5MB\"", "must be a size such as"),
            ("512", "a size such as \"512MiB\", or false"),
        ] {
            let err = split(&format!("[layers]\nsplit = {bad}")).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn a_channel_qualified_by_a_path_is_the_recipes_path() {
        let recipe = with_specs(
            r#"["../local", "file:///srv/ch"]"#,
            r#"["../local::pkg", "file:///srv/ch::other"]"#,
            DEFAULT_CHANNEL_ALIAS,
        )
        .unwrap();
        assert_eq!(spec_channel(&recipe, 0), "file:///work/local/");
        assert_eq!(spec_channel(&recipe, 1), "file:///srv/ch/");
    }

    #[test]
    fn a_spec_naming_a_channel_the_recipe_lacks_is_refused() {
        let err = with_specs(
            r#"["conda-forge"]"#,
            r#"["xformers::xformers=0.0.18"]"#,
            DEFAULT_CHANNEL_ALIAS,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("names the channel `xformers`"), "{err}");
        assert!(err.contains("not in `[conda] channels`"), "{err}");
    }

    #[test]
    fn minimal_recipe_gets_defaults() {
        let recipe = parse(MINIMAL).unwrap();
        assert_eq!(recipe.tags, vec!["latest"]);
        assert_eq!(recipe.base, Base::Scratch);
        assert_eq!(recipe.platforms.as_slice(), [Subdir::Linux64]);
        assert_eq!(recipe.prefix, "/opt/conda");
        assert_eq!(recipe.layer_budget, DEFAULT_LAYER_BUDGET);
        let urls: Vec<String> = recipe
            .channels
            .iter()
            .map(|c| c.base_url.to_string())
            .collect();
        assert_eq!(
            urls,
            [
                "https://conda.anaconda.org/conda-forge/",
                "https://example.org/ch/",
                "file:///srv/ch/",
                "file:///work/local/"
            ]
        );
    }

    #[test]
    fn channel_priority_is_strict_unless_disabled() {
        assert_eq!(
            parse(MINIMAL).unwrap().channel_priority,
            ChannelPriority::Strict
        );
        let with = |value: &str| {
            parse(&format!("{MINIMAL}channel-priority = \"{value}\"\n"))
                .map(|r| r.channel_priority)
                .map_err(|e| e.message())
        };
        assert_eq!(with("strict"), Ok(ChannelPriority::Strict));
        assert_eq!(with("disabled"), Ok(ChannelPriority::Disabled));
        let err = with("disabeld").unwrap_err();
        assert!(
            err.ends_with("not `disabeld`; did you mean `disabled`?"),
            "{err}"
        );
        // conda's third value has no equivalent, and nothing close to suggest.
        let err = with("flexible").unwrap_err();
        assert!(err.ends_with("not `flexible`"), "{err}");
    }

    #[test]
    fn several_platforms_keep_the_recipes_order() {
        let text = MINIMAL.replace(
            "name = \"x\"",
            "name = \"x\"\nplatforms = [\"linux-aarch64\", \"linux-64\"]",
        );
        let recipe = parse(&text).unwrap();
        assert_eq!(
            recipe.platforms.as_slice(),
            [Subdir::LinuxAarch64, Subdir::Linux64]
        );
        assert!(recipe.platforms.is_multi());
    }

    #[test]
    fn channel_alias_applies_to_names_only() {
        let options = RecipeOptions {
            channel_alias: Url::parse("https://mirror.example/conda").unwrap(),
            variant: None,
        };
        let recipe =
            Recipe::from_str_at(MINIMAL, Path::new("/work/recipes/x.toml"), &options).unwrap();
        assert_eq!(
            recipe.channels[0].base_url.to_string(),
            "https://mirror.example/conda/conda-forge/"
        );
        assert_eq!(
            recipe.channels[1].base_url.to_string(),
            "https://example.org/ch/"
        );
    }

    #[test]
    fn unknown_key_names_line_and_column() {
        let err = parse("[image]\nname = \"x\"\nnmae = \"y\"\n").unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("unknown field `nmae`"), "{shown}");
        assert!(shown.contains("x.toml:3:1"), "{shown}");
    }

    #[test]
    fn wrong_type_is_reported_at_the_value() {
        let err = parse("[image]\nname = 5\n").unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("x.toml:2:8"), "{shown}");
        assert!(shown.contains("string"), "{shown}");
    }

    #[test]
    fn invalid_match_spec_is_reported_at_the_entry() {
        let text = "[image]\nname = \"x\"\n[conda]\nchannels = [\"c\"]\ndependencies = [\"ok\", \"python >=>3\"]\n";
        let shown = parse(text).unwrap_err().to_string();
        assert!(
            shown.contains("invalid dependency `python >=>3`"),
            "{shown}"
        );
        assert!(shown.contains("x.toml:5:23"), "{shown}");
    }

    #[test]
    fn cuda_that_cannot_run_on_min_driver_fails_naming_the_driver_it_needs() {
        let text =
            "[image]\nname = \"x\"\n[cuda]\nversion = \"12.1\"\nmin-driver = \"520.61.05\"\n";
        let shown = parse(text).unwrap_err().to_string();
        assert!(
            shown.contains("CUDA 12.1 cannot run on driver 520.61.05: it needs driver 525.60.13 or newer (minor-version compatibility); 530.30.02 or newer for full support"),
            "{shown}"
        );
        assert!(shown.contains("x.toml:5:14"), "{shown}");
        // Forward compatibility lifts the check and adds NVIDIA's libraries.
        let compat = parse(&format!("{text}compat = true\n")).unwrap();
        assert!(compat.cuda.unwrap().compat);
        assert_eq!(
            compat.specs.last().unwrap().to_string(),
            "cuda-compat 12.1.*"
        );
    }

    #[test]
    fn virtual_cuda_follows_min_driver() {
        let with = |body: &str| {
            parse(&format!("[image]\nname = \"x\"\n[cuda]\n{body}"))
                .unwrap()
                .cuda
                .unwrap()
        };
        let full = with("version = \"11.8\"\n");
        assert_eq!(full.min_driver.to_string(), "520.61.05");
        assert_eq!(full.support, Support::Full);
        assert_eq!(full.virtual_cuda().to_string(), "11.8");
        // 12.4 on a 12.0 driver: minor-version compatibility, and the solver sees 12.0.
        let minor = with("version = \"12.4\"\nmin-driver = \"525.60.13\"\n");
        assert_eq!(minor.support, Support::MinorVersion);
        assert_eq!(minor.virtual_cuda().to_string(), "12.0");
        let newer = with("version = \"11.8\"\nmin-driver = \"535.104.05\"\n");
        assert_eq!(newer.virtual_cuda().to_string(), "12.2");
    }

    #[test]
    fn cuda_architectures_name_devices() {
        let recipe = |list: &str| {
            parse(&format!(
                "[image]\nname = \"x\"\n[cuda]\nversion = \"12.1\"\narchitectures = {list}\n"
            ))
        };
        let cuda = recipe("[\"sm_90\", \"sm_80\"]").unwrap().cuda.unwrap();
        assert_eq!(
            crate::cuda::fatbin::format_list(&cuda.architectures),
            "sm_80,sm_90"
        );
        for bad in ["[\"compute_90\"]", "[\"ampere\"]", "[\"sm_8\"]"] {
            let err = recipe(bad).unwrap_err().to_string();
            assert!(err.contains("invalid GPU architecture"), "{bad}: {err}");
        }
        let none = parse("[image]\nname = \"x\"\n[cuda]\nversion = \"12.1\"\n").unwrap();
        assert!(none.cuda.unwrap().architectures.is_empty());
    }

    #[test]
    fn base_forms() {
        let with = |base: &str| parse(&format!("[image]\nname = \"x\"\nbase = \"{base}\"\n"));
        assert_eq!(
            with("oci:../base:v1").unwrap().base,
            Base::OciLayout {
                path: "/work/recipes/../base".into(),
                tag: "v1".into()
            }
        );
        assert_eq!(
            with("oci:/abs/layout").unwrap().base,
            Base::OciLayout {
                path: "/abs/layout".into(),
                tag: "latest".into()
            }
        );
        match with("ubuntu:22.04").unwrap().base {
            Base::Registry(reference) => {
                assert_eq!(reference.to_string(), "docker.io/library/ubuntu:22.04")
            }
            other => panic!("expected a registry base, got {other:?}"),
        }
        let err = with("Not A Reference").unwrap_err().to_string();
        assert!(
            err.contains("expected `scratch`, `oci:PATH[:TAG]`"),
            "{err}"
        );
    }

    #[test]
    fn rejects_bad_values() {
        for (text, needle) in [
            ("[image]\nname = \"X\"\n", "invalid image name"),
            (
                "[image]\nname = \"x\"\nprefix = \"opt\"\n",
                "invalid prefix",
            ),
            (
                "[image]\nname = \"x\"\nprefix = \"/opt/../x\"\n",
                "invalid prefix",
            ),
            (
                "[image]\nname = \"x\"\nplatforms = [\"win-64\"]\n",
                "cannot run",
            ),
            (
                "[image]\nname = \"x\"\nplatforms = [\"linux-65\"]\n",
                "unknown platform",
            ),
            (
                "[image]\nname = \"x\"\nplatforms = [\"linux-64\", \"linux-aarch64\", \"linux-64\"]\n",
                "platform `linux-64` is listed twice",
            ),
            (
                "[image]\nname = \"x\"\nplatforms = [\"linux-64\", \"osx-arm64\"]\n",
                "platform `osx-arm64` cannot run",
            ),
            (
                "[image]\nname = \"x\"\nplatforms = []\n",
                "must name at least one platform",
            ),
            ("[image]\nname = \"x\"\ntags = [\"-x\"]\n", "invalid tag"),
            (
                "[image]\nname = \"x\"\n[layers]\nmax = 500\n",
                "between 2 and 127",
            ),
            (
                "[image]\nname = \"x\"\n[cuda]\nversion = \"eleven\"\n",
                "invalid CUDA version",
            ),
            (
                "[image]\nname = \"x\"\n[cuda]\nversion = \"11.8.0\"\n",
                "invalid CUDA version",
            ),
            (
                "[image]\nname = \"x\"\n[cuda]\nversion = \"10.2\"\n",
                "not a release imgbuild knows",
            ),
            (
                "[image]\nname = \"x\"\n[cuda]\nversion = \"11.8\"\nmin-driver = \"new\"\n",
                "invalid `min-driver`",
            ),
            ("[image]\nname = \"x\"\nworkdir = \"rel\"\n", "absolute"),
            ("[image]\n", "missing field `name`"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    /// `[image]` with `name = "x"` and `rest`: the error's message and the `line:column`
    /// of the value it points at.
    fn refused(rest: &str) -> (String, String) {
        let text = format!("[image]\nname = \"x\"\n{rest}");
        match parse(&text).unwrap_err() {
            RecipeError::Invalid {
                message,
                span: Some(span),
                ..
            } => {
                let (line, column) = span.line_column();
                (message, format!("{line}:{column}"))
            }
            other => panic!("{rest:?}: no span in {other}"),
        }
    }

    #[test]
    fn values_that_make_broken_images_are_refused_at_the_value() {
        for (rest, needle, at) in [
            ("[image.env]\n\"A=B\" = \"x\"\n", "contains `=`", "4:1"),
            ("[image.env]\n\"\" = \"x\"\n", "must not be empty", "4:1"),
            ("[image.env]\nA = \"x\\ny\"\n", "a newline (U+000A)", "4:5"),
            ("[image.env]\nA = \"x\\ty\"\n", "a TAB (U+0009)", "4:5"),
            ("[image.env]\nA = \"x\u{202e}y\"\n", "U+202E", "4:5"),
            ("[image.env]\n\"A\\u2066\" = \"x\"\n", "U+2066", "4:1"),
            ("[image.env]\nA = \"\\u200F\"\n", "U+200F", "4:5"),
            ("[image.labels]\n\"a\\u2069\" = \"x\"\n", "U+2069", "4:1"),
            ("[image.labels]\na = \"x\\u200e\"\n", "U+200E", "4:5"),
            ("[image.labels]\na = \"x\\u001b[31m\"\n", "U+001B", "4:5"),
            ("prefix = \"/opt/c\\u202Eonda\"\n", "U+202E", "3:10"),
            ("prefix = \"/opt/con\\tda\"\n", "a TAB", "3:10"),
            ("user = \"root:\"\n", "`user` must be", "3:8"),
            ("user = \"Root\"\n", "`user` must be", "3:8"),
            ("user = \"1000:1000:1\"\n", "`user` must be", "3:8"),
            ("user = \"-x\"\n", "`user` must be", "3:8"),
            ("user = \"a$b\"\n", "`user` must be", "3:8"),
            ("user = \"4294967295\"\n", "outside 0..4294967294", "3:8"),
            (
                "user = \"0:99999999999999999999\"\n",
                "outside 0..4294967294",
                "3:8",
            ),
            (
                "entrypoint = [\"/bin/sh\", \"\"]\n",
                "`entrypoint` must not be empty",
                "3:26",
            ),
            ("cmd = [\"\"]\n", "`cmd` must not be empty", "3:8"),
            ("workdir = \"/srv/../etc\"\n", "contains `..`", "3:11"),
            ("workdir = \"/srv/..\"\n", "contains `..`", "3:11"),
            ("workdir = \"/srv\\nx\"\n", "a newline", "3:11"),
            (
                "tags = [\"a\", \"b\", \"a\"]\n",
                "tag `a` is listed twice",
                "3:19",
            ),
        ] {
            let (message, place) = refused(rest);
            assert!(message.contains(needle), "{rest:?}: {message}");
            assert_eq!(place, at, "{rest:?}: {message}");
            assert!(!message.chars().any(forbidden), "{rest:?}: {message:?}");
        }
    }

    #[test]
    fn users_ids_and_names_that_runtimes_read_are_kept() {
        for user in [
            "0",
            "1000",
            "1000:1000",
            "4294967294:4294967294",
            "root",
            "nobody:nogroup",
            "_apt",
            "build-bot_2",
            "machine$",
            "jovyan:100",
            "1000:users",
        ] {
            let text = format!("[image]\nname = \"x\"\nuser = \"{user}\"\n");
            assert_eq!(parse(&text).unwrap().config.user.as_deref(), Some(user));
        }
    }

    #[test]
    fn plain_values_are_kept_as_written() {
        let text = "[image]\nname = \"x\"\ntags = [\"a\", \"b\"]\nworkdir = \"/srv/a..b\"\n\
                    entrypoint = []\ncmd = [\"-c\", \"echo 'a=b'\"]\n\
                    [image.env]\nPATH_EXTRA = \"/x=y\"\n[image.labels]\n\"a.b\" = \"caf\u{e9}\"\n";
        let recipe = parse(text).unwrap();
        assert_eq!(recipe.tags, ["a", "b"]);
        assert_eq!(recipe.config.workdir.as_deref(), Some("/srv/a..b"));
        assert_eq!(recipe.config.entrypoint, Some(Vec::new()));
        assert_eq!(recipe.config.cmd.unwrap()[1], "echo 'a=b'");
        assert_eq!(recipe.config.env["PATH_EXTRA"], "/x=y");
        assert_eq!(recipe.config.labels["a.b"], "caf\u{e9}");
    }

    #[test]
    fn a_recipe_that_is_not_a_regular_file_or_too_large_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let options = RecipeOptions::default();
        let shown = |path: &Path| Recipe::load(path, &options).unwrap_err().to_string();
        assert!(shown(dir.path()).contains("is a directory, not a regular file"));
        assert!(
            shown(Path::new("/dev/zero")).contains("is a character device, not a regular file")
        );
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // Without a writer: opening must not wait for one.
        assert!(shown(&fifo).contains("is a fifo, not a regular file"));
        let big = dir.path().join("big.toml");
        let mut text = MINIMAL.to_string();
        text.push('#');
        text.push_str(&"x".repeat(MAX_RECIPE_BYTES as usize - text.len()));
        text.push('\n');
        assert_eq!(text.len() as u64, MAX_RECIPE_BYTES + 1);
        fs_err::write(&big, &text).unwrap();
        assert!(shown(&big).contains("has 1048577 bytes; a recipe may have at most 1048576"));
        // One byte less is read and parsed.
        fs_err::write(&big, &text[1..]).unwrap();
        Recipe::load(&big, &options).unwrap();
    }
}
