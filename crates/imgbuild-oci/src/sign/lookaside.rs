//! Where signatures of an image are stored: the lookaside ("sigstore" before
//! containers/image 5.19) areas that `registries.d` configures (containers-registries.d(5)),
//! read the way skopeo and podman read them, and the `NAME@sha256=HEX/signature-N` layout
//! they look signatures up in.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::reference::Reference;

/// registries.d files larger than this are refused unread: one configures a few scopes in
/// a few hundred bytes.
pub(crate) const MAX_REGISTRIES_D_FILE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LookasideError {
    #[error("Cannot read the registries.d configuration `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is not a registries.d file: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("registries.d configures `{scope}` twice, in `{}` and `{}`; skopeo and podman refuse that too", first.display(), second.display())]
    Duplicate {
        scope: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("registries.d (`{}`) gives `{scope}` no lookaside or lookaside-staging: there is nowhere to write its signatures", file.display())]
    NoStaging { scope: String, file: PathBuf },
    #[error(
        "the lookaside `{url}` for `{scope}` is not a file:// URL; signatures are written to a file:// staging area (`lookaside-staging`) and published from there, as with skopeo"
    )]
    NotFile { scope: String, url: String },
    #[error("`{reference}` cannot be a path in a lookaside area")]
    BadName { reference: String },
    #[error("Cannot write the signature `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One configuration section: where a scope's signatures are read and written. The older
/// `sigstore`/`sigstore-staging` keys (containers/image before 5.19) are read too.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Section {
    lookaside: Option<String>,
    lookaside_staging: Option<String>,
    sigstore: Option<String>,
    sigstore_staging: Option<String>,
}

impl Section {
    /// The URL signatures are written to: the staging one when there is one.
    fn write_url(&self) -> Option<&str> {
        [
            &self.lookaside_staging,
            &self.sigstore_staging,
            &self.lookaside,
            &self.sigstore,
        ]
        .into_iter()
        .find_map(|url| url.as_deref())
    }
}

#[derive(Debug, Default, serde::Deserialize)]
struct File {
    #[serde(rename = "default-docker")]
    default_docker: Option<Section>,
    docker: Option<BTreeMap<String, Section>>,
}

/// The merged `*.yaml` files of a registries.d directory, each section with the file it came
/// from (for messages).
#[derive(Debug, Default)]
pub struct RegistriesD {
    default_docker: Option<(Section, PathBuf)>,
    docker: BTreeMap<String, (Section, PathBuf)>,
}

/// A lookaside area signatures are written into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookaside {
    pub dir: PathBuf,
    /// The scope whose section chose it (`default-docker`, or the built-in default).
    pub scope: String,
}

/// The directory skopeo and podman read: the user's `~/.config/containers/registries.d` if
/// it exists, otherwise `/etc/containers/registries.d`.
pub(crate) fn default_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let user = PathBuf::from(home).join(".config/containers/registries.d");
        if user.is_dir() {
            return user;
        }
    }
    PathBuf::from("/etc/containers/registries.d")
}

/// Where containers/image keeps signatures when nothing is configured.
fn builtin_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) if !root => PathBuf::from(home).join(".local/share/containers/sigstore"),
        _ => PathBuf::from("/var/lib/containers/sigstore"),
    }
}

impl RegistriesD {
    /// Reads every `*.yaml` file of `dir` (the default directory when `None`); a missing
    /// directory configures nothing, as for skopeo.
    pub fn load(dir: Option<&Path>) -> Result<RegistriesD, LookasideError> {
        let dir = dir.map_or_else(default_dir, Path::to_path_buf);
        let read_err = |source| LookasideError::Read {
            path: dir.clone(),
            source,
        };
        let mut files = Vec::new();
        match fs_err::read_dir(&dir) {
            Ok(entries) => {
                for entry in entries {
                    let path = entry.map_err(read_err)?.path();
                    if path.extension().is_some_and(|e| e == "yaml") {
                        files.push(path);
                    }
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(read_err(err)),
        }
        files.sort();
        let mut config = RegistriesD::default();
        for path in files {
            let text =
                crate::fs::read_input_text(&path, MAX_REGISTRIES_D_FILE).map_err(|source| {
                    LookasideError::Read {
                        path: path.clone(),
                        source: source.into(),
                    }
                })?;
            config.merge(parse(&text, &path)?, &path)?;
        }
        Ok(config)
    }

    fn merge(&mut self, file: File, path: &Path) -> Result<(), LookasideError> {
        let duplicate = |scope: &str, first: &Path| LookasideError::Duplicate {
            scope: scope.to_string(),
            first: first.to_path_buf(),
            second: path.to_path_buf(),
        };
        if let Some(section) = file.default_docker {
            if let Some((_, first)) = &self.default_docker {
                return Err(duplicate("default-docker", first));
            }
            self.default_docker = Some((section, path.to_path_buf()));
        }
        for (scope, section) in file.docker.unwrap_or_default() {
            if let Some((_, first)) = self.docker.get(&scope) {
                return Err(duplicate(&scope, first));
            }
            self.docker.insert(scope, (section, path.to_path_buf()));
        }
        Ok(())
    }

    /// The area signatures of `reference` are written to: the most precisely matching scope's
    /// section only (a more general one is ignored even where the precise one is silent),
    /// else `default-docker`, else the built-in default.
    pub fn staging_for(&self, reference: &Reference) -> Result<Lookaside, LookasideError> {
        let found = scopes(reference)
            .into_iter()
            .find_map(|scope| self.docker.get(&scope).map(|(s, f)| (scope, s, f)))
            .or_else(|| {
                let (section, file) = self.default_docker.as_ref()?;
                Some(("default-docker".to_string(), section, file))
            });
        let Some((scope, section, file)) = found else {
            return Ok(Lookaside {
                dir: builtin_dir(),
                scope: "the built-in default".to_string(),
            });
        };
        let url = section
            .write_url()
            .ok_or_else(|| LookasideError::NoStaging {
                scope: scope.clone(),
                file: file.clone(),
            })?;
        let dir = url::Url::parse(url)
            .ok()
            .filter(|u| u.scheme() == "file")
            .and_then(|u| u.to_file_path().ok())
            .ok_or_else(|| LookasideError::NotFile {
                scope: scope.clone(),
                url: url.to_string(),
            })?;
        Ok(Lookaside { dir, scope })
    }
}

fn parse(text: &str, path: &Path) -> Result<File, LookasideError> {
    // An empty file (or one of comments only) configures nothing.
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Ok(File::default());
    }
    serde_yaml::from_str(text).map_err(|err| LookasideError::Parse {
        path: path.to_path_buf(),
        reason: err.to_string(),
    })
}

/// The scopes that may configure `reference`, most precise first: the image
/// (`host/repo:tag` or `host/repo@digest`), the repository, its namespaces, the host.
fn scopes(reference: &Reference) -> Vec<String> {
    let repository = format!("{}/{}", reference.registry, reference.repository);
    let mut scopes = Vec::new();
    if let Some(digest) = &reference.digest {
        scopes.push(format!("{repository}@{digest}"));
    }
    if let Some(tag) = &reference.tag {
        scopes.push(format!("{repository}:{tag}"));
    }
    let mut namespace = repository.as_str();
    loop {
        scopes.push(namespace.to_string());
        match namespace.rsplit_once('/') {
            Some((parent, _)) => namespace = parent,
            None => break,
        }
    }
    scopes
}

impl Lookaside {
    /// Stores `signature` of the manifest `digest` of `reference`'s repository as the next
    /// `REPOSITORY@sha256=HEX/signature-N`; a signature already there with the same bytes is
    /// kept and not added twice. Returns its path.
    pub fn write(
        &self,
        reference: &Reference,
        digest: &str,
        signature: &[u8],
    ) -> Result<PathBuf, LookasideError> {
        let dir = self.dir.join(image_dir(reference, digest)?);
        let write_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LookasideError::Write { path, source }
        };
        fs_err::create_dir_all(&dir).map_err(write_err(&dir))?;
        for n in 1.. {
            let path = dir.join(format!("signature-{n}"));
            // Read no more than the signature's own size: a larger file is another one.
            let max = signature.len() as u64;
            match crate::fs::read_input(&path, max) {
                Ok(existing) if existing == signature => return Ok(path),
                Ok(_) | Err(crate::fs::InputError::TooLarge { .. }) => continue,
                Err(err) if err.is_not_found() => {
                    crate::fs::write_atomic(&path, signature).map_err(write_err(&path))?;
                    return Ok(path);
                }
                Err(err) => return Err(write_err(&path)(err.into())),
            }
        }
        unreachable!("the loop returns")
    }
}

/// `REPOSITORY@sha256=HEX`, relative, for a repository whose components are plain names.
fn image_dir(reference: &Reference, digest: &str) -> Result<PathBuf, LookasideError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    let plain = |c: &str| !c.is_empty() && c != "." && c != ".." && !c.contains('\\');
    if hex.len() != 64
        || !hex.chars().all(|c| c.is_ascii_hexdigit())
        || !reference.repository.split('/').all(plain)
    {
        return Err(LookasideError::BadName {
            reference: format!("{}@{digest}", reference.repository),
        });
    }
    Ok(PathBuf::from(format!(
        "{}@sha256={hex}",
        reference.repository
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(files: &[(&str, &str)]) -> (tempfile::TempDir, Result<RegistriesD, LookasideError>) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            fs_err::write(dir.path().join(name), text).unwrap();
        }
        let loaded = RegistriesD::load(Some(dir.path()));
        (dir, loaded)
    }

    fn reference(text: &str) -> Reference {
        Reference::parse(text).unwrap()
    }

    const SITE: &str = "\
docker:
  registry.example:
    lookaside: https://sigs.example/all
  registry.example/ml:
    lookaside: https://sigs.example/ml
    lookaside-staging: file:///srv/staging/ml
  registry.example/ml/torch:2.1:
    sigstore-staging: file:///srv/old-style
default-docker:
  lookaside: file:///srv/default
";

    #[test]
    fn the_most_precise_scope_wins_and_staging_is_preferred() {
        let (_dir, config) = config(&[("site.yaml", SITE), ("ignored.yml", "not: [yaml")]);
        let config = config.unwrap();
        let staging = |r: &str| config.staging_for(&reference(r));
        assert_eq!(
            staging("registry.example/ml/app:v1").unwrap().dir,
            PathBuf::from("/srv/staging/ml")
        );
        // The old key names still count, and an image scope beats its namespace.
        let torch = staging("registry.example/ml/torch:2.1").unwrap();
        assert_eq!(torch.dir, PathBuf::from("/srv/old-style"));
        assert_eq!(torch.scope, "registry.example/ml/torch:2.1");
        assert_eq!(
            staging("other.example/x").unwrap().dir,
            PathBuf::from("/srv/default")
        );
        // Only file:// areas are written.
        let err = staging("registry.example/web").unwrap_err();
        assert!(matches!(err, LookasideError::NotFile { .. }), "{err}");
        assert!(
            err.to_string().contains("https://sigs.example/all"),
            "{err}"
        );
    }

    #[test]
    fn a_scope_configured_twice_or_bad_yaml_is_an_error_naming_the_file() {
        let twice = "docker:\n  registry.example:\n    lookaside: file:///a\n";
        let (_dir, loaded) = config(&[("a.yaml", twice), ("b.yaml", twice)]);
        let err = loaded.unwrap_err().to_string();
        assert!(err.contains("a.yaml") && err.contains("b.yaml"), "{err}");
        let (_dir, loaded) = config(&[("bad.yaml", "docker: [1, 2")]);
        assert!(loaded.unwrap_err().to_string().contains("bad.yaml"));
    }

    #[test]
    fn a_section_without_a_lookaside_has_nowhere_to_write() {
        let text = "docker:\n  registry.example:\n    use-sigstore-attachments: true\n";
        let (_dir, loaded) = config(&[("a.yaml", text)]);
        let err = loaded
            .unwrap()
            .staging_for(&reference("registry.example/x:1"))
            .unwrap_err();
        assert!(matches!(err, LookasideError::NoStaging { .. }), "{err}");
    }

    #[test]
    fn signatures_go_in_the_layout_skopeo_reads_and_are_not_added_twice() {
        let dir = tempfile::tempdir().unwrap();
        let area = Lookaside {
            dir: dir.path().to_path_buf(),
            scope: "test".into(),
        };
        let digest = format!("sha256:{}", "0f".repeat(32));
        let r = reference("127.0.0.1:5000/ml/app:v1");
        let first = area.write(&r, &digest, b"one").unwrap();
        assert_eq!(
            first,
            dir.path()
                .join(format!("ml/app@sha256={}/signature-1", "0f".repeat(32)))
        );
        assert_eq!(area.write(&r, &digest, b"one").unwrap(), first);
        let second = area.write(&r, &digest, b"two").unwrap();
        assert!(second.ends_with("signature-2"));
        let bad = Reference {
            repository: "../etc".into(),
            ..r
        };
        assert!(area.write(&bad, &digest, b"x").is_err());
    }
}
