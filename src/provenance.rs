//! Build provenance: an in-toto Statement v1 whose subject is the image (its manifest
//! digest, or its index digest for several platforms) and whose predicate is SLSA
//! Provenance v1. It says who built the image (imgbuild, and its version), from what (the
//! recipe and the lock, by sha256) with which parameters (platforms, compression,
//! `SOURCE_DATE_EPOCH`, the `[[files]]` sources as the lock pins them), and every material
//! the lock resolved: the base by digest, each conda package and each wheel by URL and
//! sha256.
//!
//! Like the image and its SBOMs, it is a pure function of the build's inputs: no clock, no
//! host name, no invocation id, no path but those the user gave. The same lock built twice
//! gives the same bytes, so a provenance can be compared, cached and signed like the image.
//!
//! The build writes it beside the layout ([`write_beside`]); `imgbuild verify --provenance`
//! reads one back ([`Recorded::parse`]) and compares it with the layout and the lock
//! ([`compare_dependencies`]).

use std::{
    collections::BTreeSet,
    fmt,
    path::{Path, PathBuf},
};

use serde_json::{Map, Value, json};

use crate::{
    attest::{AttestError, SLSA_PROVENANCE_V1, STATEMENT_V1},
    compression::Compression,
    lock::{Lock, LockedBase, MAX_LOCK_BYTES, ModelPin, SourceDigest},
};

/// The media type of the provenance file, for attaching it as an OCI artifact: an in-toto
/// statement's.
pub(crate) const MEDIA_TYPE: &str = crate::attest::MEDIA_TYPE;

/// `runDetails.builder.id`: the builder, whatever machine runs it. Its version is beside it.
pub(crate) const BUILDER_ID: &str = "https://imgbuild.dev/builder";

/// `buildDefinition.buildType`: a build of a recipe from its lock, as the book's "What a
/// build writes" describes; `externalParameters` hold what [`Build`] holds.
pub(crate) const BUILD_TYPE: &str = "https://imgbuild.dev/buildtypes/recipe/v1";

/// The file name suffix beside a layout.
const SUFFIX: &str = ".provenance.json";

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProvenanceError {
    #[error("Failed to read `{}` for the provenance", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: crate::fs::InputError,
    },
    #[error("Failed to write provenance `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Attest(#[from] AttestError),
    /// A provenance read back that is not one imgbuild can compare.
    #[error("`{}` is not an imgbuild SLSA provenance: {reason}", path.display())]
    Shape { path: PathBuf, reason: String },
}

impl ProvenanceError {
    /// 2 when the machine is at fault (a file the build just used cannot be read, the
    /// provenance cannot be written), 1 for a provenance that is not one.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            ProvenanceError::Read { .. } | ProvenanceError::Write { .. } => 2,
            ProvenanceError::Attest(_) | ProvenanceError::Shape { .. } => 1,
        }
    }
}

/// A file the build read, by the path it was given as and the sha256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputFile {
    pub path: String,
    /// Lowercase hex.
    pub sha256: String,
}

impl InputFile {
    /// Hashes the file at `path` (bounded: a lock is at most [`MAX_LOCK_BYTES`], a recipe
    /// far less).
    pub(crate) fn read(path: &Path) -> Result<Self, ProvenanceError> {
        let bytes = crate::fs::read_input(path, MAX_LOCK_BYTES).map_err(|source| {
            ProvenanceError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(InputFile {
            path: path.display().to_string(),
            sha256: sha256_hex(&bytes),
        })
    }

    fn to_json(&self) -> Value {
        json!({"path": self.path, "digest": {"sha256": self.sha256}})
    }
}

/// Where `SOURCE_DATE_EPOCH`'s value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EpochSource {
    /// The `SOURCE_DATE_EPOCH` environment variable.
    Environment,
    /// The newest package build time in the lock, imgbuild's default.
    Lock,
}

/// One build, as the provenance describes it: plain data the build already has.
#[derive(Debug, Clone)]
pub(crate) struct Build<'a> {
    /// The subject's name: the recipe's `[image] name`, never a host path (the layout's
    /// directory differs from build to build; the image does not).
    pub name: &'a str,
    /// What the tags name: the manifest, or the image index of several platforms.
    pub image_digest: &'a str,
    pub recipe: InputFile,
    pub lock: InputFile,
    /// The base as the recipe wrote it (`oci:../base:latest`); `None` for scratch.
    pub base_reference: Option<&'a str>,
    /// The conda subdirs built, in the recipe's order.
    pub platforms: Vec<String>,
    pub compression: Compression,
    /// The image's `created` time, seconds since the epoch.
    pub source_date_epoch: i64,
    pub epoch_source: EpochSource,
    /// The `[matrix]` variant, if any.
    pub variant: Option<&'a str>,
    /// The `[[files]]` sources, in the recipe's order, with the digests the lock pins.
    pub files: Vec<SourceDigest>,
    /// The files of the `[[models]]` beside the image, as the lock pins them.
    pub models: Vec<ModelPin>,
    /// The `imgbuild-smoke` executables `[smoke] embed = true` put into the image.
    pub smoke_executables: Vec<EmbeddedSmoke>,
}

/// An embedded smoke executable: the builder's own tool in the image, so recorded with the
/// builder's parameters (by digest only: its host path differs from machine to machine).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct EmbeddedSmoke {
    /// The conda subdir whose image holds it.
    pub platform: String,
    /// `sha256:<hex>` of the executable.
    pub digest: String,
}

/// A material the build used: an SLSA ResourceDescriptor with a name, a URI and a digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Dependency {
    pub uri: String,
    /// `sha256`, or `md5` for a conda record an old channel gives no sha256 for.
    pub algorithm: String,
    /// Lowercase hex.
    pub digest: String,
    /// What messages call it: a package's file name, the base's reference.
    pub name: String,
}

impl Dependency {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "uri": self.uri,
            "digest": {self.algorithm.as_str(): self.digest},
        })
    }

    /// What two dependencies are compared by: the name is only for people.
    fn key(&self) -> (&str, &str, &str) {
        (&self.uri, &self.algorithm, &self.digest)
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} {})", self.name, self.algorithm, self.digest)
    }
}

/// Where the provenance of the layout at `layout_dir` goes: beside it, as the SBOMs do.
/// `images/demo` gets `images/demo.provenance.json`.
pub(crate) fn path_beside(layout_dir: &Path) -> PathBuf {
    let mut name = layout_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "image".into());
    name.push(SUFFIX);
    layout_dir.with_file_name(name)
}

/// The base as a containers-transports reference (`oci:DIR:TAG`, `docker://REF`), the URI
/// form skopeo and podman take, as the recipe wrote it.
fn base_uri(reference: Option<&str>) -> String {
    match reference {
        Some(reference) if reference.starts_with("oci:") => reference.to_string(),
        Some(reference) => format!("docker://{reference}"),
        // Only a provenance without its base recorded gets here: the lock's base still has
        // to be listed, and this names it as missing.
        None => "base".to_string(),
    }
}

/// Every material of `lock`, each once, sorted: the base of each platform (one entry when
/// they share it, none for scratch), each conda package by URL (a noarch package locked
/// for two platforms is one file), each wheel by URL.
pub(crate) fn dependencies(lock: &Lock, base_reference: Option<&str>) -> Vec<Dependency> {
    let mut out = BTreeSet::new();
    let uri = base_uri(base_reference);
    for platform in &lock.platforms {
        if let LockedBase::Digest(digest) = &platform.base {
            let (algorithm, hex) = digest.split_once(':').unwrap_or(("sha256", digest));
            out.insert(Dependency {
                uri: uri.clone(),
                algorithm: algorithm.to_string(),
                digest: hex.to_string(),
                name: base_reference.unwrap_or("base").to_string(),
            });
        }
        for record in &platform.records {
            let package = &record.package_record;
            // The lock refuses a record with neither digest; md5 is what an old channel's
            // repodata gives and what the archive is checked against then.
            let (algorithm, digest) = match (package.sha256, package.md5) {
                (Some(sha256), _) => ("sha256", hex::encode(sha256)),
                (None, Some(md5)) => ("md5", hex::encode(md5)),
                (None, None) => continue,
            };
            out.insert(Dependency {
                uri: record.url.to_string(),
                algorithm: algorithm.to_string(),
                digest,
                name: record.identifier.to_string(),
            });
        }
        for wheel in &platform.wheels {
            out.insert(Dependency {
                uri: wheel.url.to_string(),
                algorithm: "sha256".to_string(),
                digest: hex::encode(wheel.sha256),
                name: wheel.filename.clone(),
            });
        }
    }
    out.into_iter().collect()
}

/// The SLSA Provenance v1 predicate of `build`, whose materials are `dependencies`.
fn predicate(build: &Build<'_>, dependencies: &[Dependency]) -> Value {
    let mut external = Map::new();
    external.insert("recipe".into(), build.recipe.to_json());
    external.insert("lock".into(), build.lock.to_json());
    if let Some(base) = build.base_reference {
        external.insert("base".into(), json!(base));
    }
    external.insert("platforms".into(), json!(build.platforms));
    external.insert("compression".into(), json!(build.compression.name()));
    external.insert("sourceDateEpoch".into(), json!(build.source_date_epoch));
    if let Some(variant) = build.variant {
        external.insert("variant".into(), json!(variant));
    }
    // A source's digest covers its entries (paths, kinds, modes, link targets, file
    // sha256s), not one file's bytes: a string, so no reader takes it for a DigestSet.
    if !build.files.is_empty() {
        external.insert("files".into(), json!(build.files));
    }
    // The models are built beside the image from these files, each pinned by path, size
    // and sha256: inputs of the build, though not materials of the image's layers.
    if !build.models.is_empty() {
        external.insert("models".into(), json!(build.models));
    }
    let epoch_source = match build.epoch_source {
        EpochSource::Environment => "environment",
        EpochSource::Lock => "lock",
    };
    let mut internal = Map::new();
    // The compressor's backend and settings, as the layers' annotation names them: they
    // decide the layers' bytes as much as the recipe does.
    internal.insert("compressor".into(), json!(build.compression.describe()));
    internal.insert("sourceDateEpochFrom".into(), json!(epoch_source));
    if !build.smoke_executables.is_empty() {
        internal.insert("smokeExecutables".into(), json!(build.smoke_executables));
    }
    json!({
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": external,
            "internalParameters": internal,
            "resolvedDependencies": dependencies.iter().map(Dependency::to_json).collect::<Vec<_>>(),
        },
        // No metadata: startedOn, finishedOn and an invocation id would make two builds of
        // one lock differ, and the image's `created` time is already sourceDateEpoch.
        "runDetails": {
            "builder": {
                "id": BUILDER_ID,
                "version": {"imgbuild": env!("CARGO_PKG_VERSION")},
            },
        },
    })
}

/// The provenance statement of `build` from `lock`.
pub(crate) fn statement(build: &Build<'_>, lock: &Lock) -> Result<Value, ProvenanceError> {
    let dependencies = dependencies(lock, build.base_reference);
    Ok(crate::attest::statement(
        build.name,
        build.image_digest,
        SLSA_PROVENANCE_V1,
        predicate(build, &dependencies),
    )?)
}

/// The statement as pretty JSON text, ending in a newline. serde_json's maps are ordered
/// (as inserted here with `preserve_order`, which a dependency turns on; else by key), never
/// by hash, so the bytes are fixed.
pub(crate) fn render(build: &Build<'_>, lock: &Lock) -> Result<String, ProvenanceError> {
    let mut text =
        serde_json::to_string_pretty(&statement(build, lock)?).expect("JSON values serialize");
    text.push('\n');
    Ok(text)
}

/// Writes the provenance beside the layout, atomically; returns its path.
pub(crate) fn write_beside(
    layout_dir: &Path,
    build: &Build<'_>,
    lock: &Lock,
) -> Result<PathBuf, ProvenanceError> {
    let path = path_beside(layout_dir);
    let text = render(build, lock)?;
    crate::fs::write_atomic(&path, text.as_bytes()).map_err(|source| ProvenanceError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// What a provenance read back says, as far as `verify` compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// The subject's digest, `sha256:<hex>`.
    pub subject: String,
    pub recipe: InputFile,
    pub lock: InputFile,
    pub base_reference: Option<String>,
    pub platforms: Vec<String>,
    pub dependencies: Vec<Dependency>,
    /// The `[[files]]` sources it lists (none when it lists none).
    pub files: Vec<SourceDigest>,
    /// The model files it lists (none when it lists none).
    pub models: Vec<ModelPin>,
}

impl Recorded {
    /// Reads the parts of `statement` (the file at `path`, for messages) that `verify`
    /// compares; anything else in it is left alone.
    pub(crate) fn parse(statement: &Value, path: &Path) -> Result<Recorded, ProvenanceError> {
        let shape = |reason: String| ProvenanceError::Shape {
            path: path.to_path_buf(),
            reason,
        };
        let text = |value: &Value, what: &str| -> Result<String, ProvenanceError> {
            value
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| shape(format!("it has no {what}")))
        };
        if statement["_type"] != STATEMENT_V1 {
            return Err(shape(format!("its _type is not {STATEMENT_V1}")));
        }
        if statement["predicateType"] != SLSA_PROVENANCE_V1 {
            return Err(shape(format!(
                "its predicateType is not {SLSA_PROVENANCE_V1}"
            )));
        }
        let subjects = statement["subject"].as_array().map_or(0, Vec::len);
        if subjects != 1 {
            return Err(shape(format!("it has {subjects} subjects, not one image")));
        }
        let subject = text(
            &statement["subject"][0]["digest"]["sha256"],
            "subject sha256",
        )?;
        let definition = &statement["predicate"]["buildDefinition"];
        let external = &definition["externalParameters"];
        let input = |key: &str| -> Result<InputFile, ProvenanceError> {
            Ok(InputFile {
                path: text(&external[key]["path"], &format!("{key} path"))?,
                sha256: text(&external[key]["digest"]["sha256"], &format!("{key} sha256"))?,
            })
        };
        let platforms = external["platforms"]
            .as_array()
            .ok_or_else(|| shape("it has no platforms".into()))?
            .iter()
            .map(|p| text(p, "platform name"))
            .collect::<Result<_, _>>()?;
        let dependencies = definition["resolvedDependencies"]
            .as_array()
            .ok_or_else(|| shape("it has no resolvedDependencies".into()))?
            .iter()
            .map(|d| {
                parse_dependency(d)
                    .ok_or_else(|| shape(format!("a dependency {d} has no uri and one digest")))
            })
            .collect::<Result<_, _>>()?;
        let files = match &external["files"] {
            Value::Null => Vec::new(),
            files => serde_json::from_value(files.clone())
                .map_err(|e| shape(format!("its `[[files]]` sources do not read: {e}")))?,
        };
        let models = match &external["models"] {
            Value::Null => Vec::new(),
            models => serde_json::from_value(models.clone())
                .map_err(|e| shape(format!("its model files do not read: {e}")))?,
        };
        Ok(Recorded {
            subject: format!("sha256:{subject}"),
            recipe: input("recipe")?,
            lock: input("lock")?,
            base_reference: external["base"].as_str().map(str::to_string),
            platforms,
            dependencies,
            files,
            models,
        })
    }
}

/// A ResourceDescriptor with a URI and exactly one digest.
fn parse_dependency(value: &Value) -> Option<Dependency> {
    let digests = value["digest"].as_object()?;
    let [(algorithm, digest)] = digests.iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    Some(Dependency {
        uri: value["uri"].as_str()?.to_string(),
        algorithm: algorithm.clone(),
        digest: digest.as_str()?.to_string(),
        name: value["name"].as_str().unwrap_or_default().to_string(),
    })
}

/// How the materials a provenance lists differ from those of the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Difference {
    /// The lock has it; the provenance does not list it.
    Unlisted(Dependency),
    /// The provenance lists it; the lock does not have it.
    Extra(Dependency),
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Unlisted(d) => {
                write!(f, "the lock has {d} that the provenance does not list")
            }
            Difference::Extra(d) => {
                write!(f, "the provenance lists {d}, which the lock does not have")
            }
        }
    }
}

/// The first difference between the materials a provenance lists and those the lock has
/// (both by URI and digest, whatever their order or names); `None` when they are the same.
pub(crate) fn compare_dependencies(
    listed: &[Dependency],
    locked: &[Dependency],
) -> Option<Difference> {
    let listed_keys: BTreeSet<_> = listed.iter().map(Dependency::key).collect();
    let locked_keys: BTreeSet<_> = locked.iter().map(Dependency::key).collect();
    if let Some(missing) = locked.iter().find(|d| !listed_keys.contains(&d.key())) {
        return Some(Difference::Unlisted(missing.clone()));
    }
    listed
        .iter()
        .find(|d| !locked_keys.contains(&d.key()))
        .map(|extra| Difference::Extra(extra.clone()))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rattler_conda_types::Subdir;
    use rattler_solve::ChannelPriority;

    use super::*;
    use crate::{
        lock::{PlatformLock, ResolvedWheel, fixtures::record},
        recipe::{Recipe, RecipeOptions},
        resolve::Target,
    };

    fn wheel() -> ResolvedWheel {
        ResolvedWheel {
            name: "six".parse().unwrap(),
            version: "1.16.0".parse().unwrap(),
            filename: "six-1.16.0-py2.py3-none-any.whl".into(),
            url: "https://files.example/six-1.16.0-py2.py3-none-any.whl"
                .parse()
                .unwrap(),
            sha256: [7; 32].into(),
            index: None,
            requires_dist: Vec::new(),
            requires_python: None,
        }
    }

    /// Two platforms on two bases, sharing the noarch `lib` and the pure wheel.
    fn lock() -> Lock {
        let recipe = Recipe::from_str_at(
            "[image]\nname = \"x\"\nplatforms = [\"linux-64\", \"linux-aarch64\"]\n[conda]\nchannels = [\"file:///ch\"]\ndependencies = [\"app\"]\n",
            Path::new("/work/recipes/x.toml"),
            &RecipeOptions::default(),
        )
        .unwrap();
        let platform = |subdir: Subdir, base: char, sha: u8| PlatformLock {
            target: Target::for_recipe(&recipe, subdir, None),
            base: LockedBase::Digest(format!("sha256:{}", base.to_string().repeat(64))),
            records: vec![
                record("app", subdir.as_str(), sha),
                record("lib", "noarch", 9),
            ],
            wheels: vec![wheel()],
        };
        Lock {
            channels: vec!["file:///ch/".into()],
            channel_priority: ChannelPriority::Strict,
            pypi: None,
            platforms: vec![
                platform(Subdir::Linux64, 'a', 1),
                platform(Subdir::LinuxAarch64, 'b', 2),
            ],
        }
    }

    fn build() -> Build<'static> {
        Build {
            name: "x",
            image_digest: "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
            recipe: InputFile {
                path: "recipes/x.toml".into(),
                sha256: "11".repeat(32),
            },
            lock: InputFile {
                path: "recipes/x.lock".into(),
                sha256: "22".repeat(32),
            },
            base_reference: Some("docker.io/library/debian:12-slim"),
            platforms: vec!["linux-64".into(), "linux-aarch64".into()],
            compression: Compression::Zstd,
            source_date_epoch: 1_700_000_000,
            epoch_source: EpochSource::Lock,
            variant: None,
            files: Vec::new(),
            models: Vec::new(),
            smoke_executables: Vec::new(),
        }
    }

    #[test]
    fn every_material_is_listed_once_and_sorted() {
        let deps = dependencies(&lock(), Some("docker.io/library/debian:12-slim"));
        let uris: Vec<&str> = deps.iter().map(|d| d.uri.as_str()).collect();
        assert_eq!(
            uris,
            [
                "docker://docker.io/library/debian:12-slim",
                "docker://docker.io/library/debian:12-slim",
                "file:///ch/linux-64/app-1.0-0.conda",
                "file:///ch/linux-aarch64/app-1.0-0.conda",
                "file:///ch/noarch/lib-1.0-0.conda",
                "https://files.example/six-1.16.0-py2.py3-none-any.whl",
            ]
        );
        assert_eq!(deps[0].digest, "a".repeat(64));
        assert_eq!(deps[1].digest, "b".repeat(64));
        assert_eq!(deps[4].digest, "09".repeat(32));
        assert!(deps.iter().all(|d| d.algorithm == "sha256"));
        // A local base keeps its transport; scratch has none.
        assert_eq!(base_uri(Some("oci:../base:latest")), "oci:../base:latest");
    }

    #[test]
    fn a_statement_is_slsa_provenance_of_the_image_and_reads_back() {
        let (build, lock) = (build(), lock());
        let text = render(&build, &lock).unwrap();
        assert_eq!(text, render(&build, &lock).unwrap(), "deterministic");
        let statement: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(statement["predicateType"], SLSA_PROVENANCE_V1);
        assert_eq!(statement["subject"][0]["name"], "x");
        let predicate = &statement["predicate"];
        assert_eq!(predicate["runDetails"]["builder"]["id"], BUILDER_ID);
        assert_eq!(
            predicate["runDetails"]["builder"]["version"]["imgbuild"],
            env!("CARGO_PKG_VERSION")
        );
        let external = &predicate["buildDefinition"]["externalParameters"];
        assert_eq!(external["compression"], "zstd");
        assert_eq!(external["sourceDateEpoch"], 1_700_000_000);
        assert_eq!(external["lock"]["digest"]["sha256"], "22".repeat(32));
        assert!(external.get("variant").is_none());
        assert!(
            predicate["runDetails"].get("metadata").is_none(),
            "no clock"
        );

        let recorded = Recorded::parse(&statement, Path::new("p.json")).unwrap();
        assert_eq!(recorded.subject, build.image_digest);
        assert_eq!(recorded.lock, build.lock);
        assert_eq!(recorded.recipe, build.recipe);
        assert_eq!(recorded.platforms, build.platforms);
        assert_eq!(
            recorded.base_reference.as_deref(),
            Some("docker.io/library/debian:12-slim")
        );
        let locked = dependencies(&lock, recorded.base_reference.as_deref());
        assert_eq!(recorded.dependencies, locked);
        assert_eq!(compare_dependencies(&recorded.dependencies, &locked), None);
    }

    #[test]
    fn files_sources_are_external_parameters_and_read_back() {
        let files = vec![SourceDigest {
            src: "app".into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
        }];
        let plain = statement(&build(), &lock()).unwrap();
        assert!(
            plain["predicate"]["buildDefinition"]["externalParameters"]
                .get("files")
                .is_none(),
            "no [[files]], no key: {plain}"
        );
        let with_files = statement(
            &Build {
                files: files.clone(),
                ..build()
            },
            &lock(),
        )
        .unwrap();
        assert_eq!(
            with_files["predicate"]["buildDefinition"]["externalParameters"]["files"],
            json!([{"src": "app", "digest": files[0].digest}])
        );
        let recorded = Recorded::parse(&with_files, Path::new("p.json")).unwrap();
        assert_eq!(recorded.files, files);
        assert!(
            Recorded::parse(&plain, Path::new("p.json"))
                .unwrap()
                .files
                .is_empty()
        );
    }

    #[test]
    fn a_missing_or_extra_material_is_named() {
        let locked = dependencies(&lock(), None);
        let mut listed = locked.clone();
        let dropped = listed.remove(2);
        let difference = compare_dependencies(&listed, &locked).unwrap();
        assert_eq!(difference, Difference::Unlisted(dropped.clone()));
        assert_eq!(
            difference.to_string(),
            format!(
                "the lock has app-1.0-0.conda (sha256 {}) that the provenance does not list",
                "01".repeat(32)
            )
        );
        listed.insert(
            0,
            Dependency {
                digest: "ff".repeat(32),
                ..dropped.clone()
            },
        );
        assert!(matches!(
            compare_dependencies(&listed, &locked),
            Some(Difference::Unlisted(_))
        ));
        let mut extra = locked.clone();
        extra.push(Dependency {
            uri: "https://elsewhere/x.whl".into(),
            ..dropped
        });
        assert!(
            compare_dependencies(&extra, &locked)
                .unwrap()
                .to_string()
                .starts_with("the provenance lists app-1.0-0.conda")
        );
    }

    #[test]
    fn what_is_not_a_provenance_is_refused_by_name() {
        let statement = statement(&build(), &lock()).unwrap();
        let path = Path::new("p.json");
        let mut other = statement.clone();
        other["predicateType"] = json!("https://example/other");
        let err = Recorded::parse(&other, path).unwrap_err();
        assert!(err.to_string().contains("predicateType"), "{err}");
        let mut other = statement.clone();
        other["predicate"]["buildDefinition"]["externalParameters"]["lock"] = json!(null);
        let err = Recorded::parse(&other, path).unwrap_err();
        assert!(err.to_string().contains("lock path"), "{err}");
        let mut other = statement;
        other["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"] =
            json!({"sha256": "a", "md5": "b"});
        assert!(Recorded::parse(&other, path).is_err());
    }

    #[test]
    fn provenance_goes_beside_the_layout() {
        assert_eq!(
            path_beside(Path::new("images/demo")),
            Path::new("images/demo.provenance.json")
        );
        assert_eq!(
            path_beside(Path::new("/tmp/out/")),
            Path::new("/tmp/out.provenance.json")
        );
    }
}
