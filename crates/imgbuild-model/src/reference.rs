//! Image references: registry references as Docker reads them
//! (`[registry/]repository[:tag][@digest]`, [`Reference`]) and images of a local OCI layout
//! as a user names them (`DIR[:TAG]`, [`LayoutRef`]; `imgbuild_oci::oci::read` reads them), and
//! the [`Base`] a recipe builds on.

use std::{fmt, path::PathBuf};

/// Docker Hub's name in references and its API endpoint.
const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// The image a recipe builds on, as checked when the recipe is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// An empty root filesystem.
    Scratch,
    /// An image in a local OCI image layout, selected by tag (`latest` when none is given).
    OciLayout { path: PathBuf, tag: String },
    /// An image in a registry, by tag or digest.
    Registry(Reference),
}

impl fmt::Display for Base {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Base::Scratch => f.write_str("scratch"),
            Base::OciLayout { path, tag } => write!(f, "oci:{}:{tag}", path.display()),
            Base::Registry(reference) => write!(f, "{reference}"),
        }
    }
}

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry host (and port), e.g. `ghcr.io`, `127.0.0.1:5000`, `docker.io`.
    pub registry: String,
    /// Repository path, e.g. `library/ubuntu`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<hex>`.
    pub digest: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Invalid image reference `{reference}`: {reason}")]
pub struct ReferenceError {
    pub reference: String,
    pub reason: &'static str,
}

/// Whether `text` (what follows an `@`) is a digest, `algorithm:hex` with at least 32 hex
/// digits: anything else after an `@` means the `@` ends credentials (`user:password@host`).
fn looks_like_digest(text: &str) -> bool {
    text.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && algorithm
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '_' | '-'))
            && hex.len() >= 32
            && hex.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// `reference` as it may be shown in messages and logs: credentials written into it
/// (`user:password@host/…`, `https://user:password@host/…`, a password holding `@` or `/`)
/// become `***`. Everything before the last `@` that does not start a digest is
/// credentials.
pub fn redacted(reference: &str) -> String {
    let start = reference.find("://").map_or(0, |i| i + 3);
    let body = &reference[start..];
    let end = body
        .match_indices('@')
        .map(|(i, _)| i)
        .rfind(|&i| !looks_like_digest(&body[i + 1..]));
    match end {
        Some(end) => format!("{}***{}", &reference[..start], &body[end..]),
        None => reference.to_string(),
    }
}

/// Whether the first component of a reference is a registry rather than part of a Docker
/// Hub name: it has a `.` or `:`, or is `localhost`.
fn is_registry_host(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost"
}

impl Reference {
    /// Whether `reference` names its registry (`registry.example/x`, `127.0.0.1:5000/x`)
    /// instead of leaving it to be Docker Hub.
    pub fn names_registry(reference: &str) -> bool {
        reference
            .split_once('/')
            .is_some_and(|(first, _)| is_registry_host(first))
    }

    /// Parses `reference` the way Docker does: a first component with a `.` or `:`, or
    /// `localhost`, is a registry; otherwise the registry is Docker Hub, where one-part names
    /// live under `library/`.
    pub fn parse(reference: &str) -> Result<Reference, ReferenceError> {
        // The message never repeats a password the reference holds.
        let shown = redacted(reference);
        let err = |reason| ReferenceError {
            reference: shown.clone(),
            reason,
        };
        if shown != reference {
            return Err(err(
                "credentials do not belong in an image reference; store them with `imgbuild login` (or `docker login`)",
            ));
        }
        if reference.contains("://") {
            return Err(err(
                "an image reference has no scheme; write `registry/repository[:tag]`",
            ));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => {
                let hex = digest
                    .strip_prefix("sha256:")
                    .ok_or_else(|| err("only sha256 digests are supported"))?;
                if hex.len() != 64
                    || !hex
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                {
                    return Err(err("a digest is `sha256:` and 64 lowercase hex digits"));
                }
                (rest, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((first, path)) if is_registry_host(first) => (first.to_string(), path),
            _ => (DOCKER_HUB.to_string(), rest),
        };
        // A tag is after the last `:` of the last path component.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag.to_string())),
            _ => (path, None),
        };
        if repository.is_empty() {
            return Err(err("the repository name is empty"));
        }
        let valid_component = |c: &str| {
            !c.is_empty()
                && c.chars().all(|ch| {
                    ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-')
                })
                && c.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
        };
        if !repository.split('/').all(valid_component) {
            return Err(err(
                "repository components are lowercase letters, digits, `.`, `_` and `-`",
            ));
        }
        if let Some(tag) = &tag
            && !crate::names::is_valid_tag(tag)
        {
            return Err(err(
                "a tag is up to 128 of `A-Za-z0-9_.-`, not starting with `.` or `-`",
            ));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository.to_string()
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host the API is served on (Docker Hub's differs from its name).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// Whether the registry is on this machine (`localhost`, `127.0.0.0/8`, `[::1]`), where
    /// plain HTTP may be allowed.
    pub fn is_loopback(&self) -> bool {
        let host = self
            .registry
            .rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(self.registry.as_str(), |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host == "::1"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// What to ask the registry for: the digest if there is one, else the tag (`latest`).
    pub fn manifest_reference(&self) -> String {
        self.digest
            .clone()
            .or_else(|| self.tag.clone())
            .unwrap_or_else(|| "latest".to_string())
    }

    /// The same repository at `digest`.
    pub fn with_digest(&self, digest: &str) -> Reference {
        Reference {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// The same repository at `tag`.
    pub fn with_tag(&self, tag: &str) -> Reference {
        Reference {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// The tag a reference without one names.
pub const DEFAULT_TAG: &str = "latest";

/// An image of a layout directory as a user names it: `DIR[:TAG]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRef {
    pub dir: PathBuf,
    /// The tag, when the reference names one ([`Self::tag`] gives [`DEFAULT_TAG`] else).
    pub tag: Option<String>,
}

impl LayoutRef {
    /// `DIR[:TAG]`: the text after the last colon is the tag, unless it holds a `/` (then
    /// the colon is part of a path, `/a:b/x`) or nothing comes before the colon.
    pub fn parse(text: &str) -> Self {
        let (dir, tag) = split_layout(text);
        Self {
            dir: dir.into(),
            tag: tag.map(str::to_string),
        }
    }

    /// The tag named, else [`DEFAULT_TAG`].
    pub fn tag(&self) -> &str {
        self.tag.as_deref().unwrap_or(DEFAULT_TAG)
    }
}

/// [`LayoutRef::parse`] without copying: the directory, and the tag when one is named.
pub fn split_layout(text: &str) -> (&str, Option<&str>) {
    match text.rsplit_once(':') {
        Some((dir, tag)) if !tag.contains('/') && !dir.is_empty() => (dir, Some(tag)),
        _ => (text, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    #[test]
    fn docker_short_names() {
        let r = parse("ubuntu:22.04");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "library/ubuntu")
        );
        assert_eq!(r.tag.as_deref(), Some("22.04"));
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(
            parse("docker.io/library/ubuntu").to_string(),
            "docker.io/library/ubuntu"
        );
        assert_eq!(parse("nvidia/cuda:12.4.1-base").repository, "nvidia/cuda");
        assert_eq!(parse("ubuntu").manifest_reference(), "latest");
    }

    #[test]
    fn registries_ports_and_digests() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let r = parse(&format!("127.0.0.1:5000/ml/torch:v1@{digest}"));
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "ml/torch");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.manifest_reference(), digest);
        assert!(r.is_loopback());
        assert!(parse("localhost/x").is_loopback());
        assert!(parse("[::1]:5000/x").is_loopback());
        assert!(!parse("ghcr.io/org/x").is_loopback());
        assert_eq!(parse("localhost:5000/x").registry, "localhost:5000");
    }

    #[test]
    fn credentials_are_refused_and_never_shown() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for (reference, shown) in [
            (
                "user:s3cret@127.0.0.1:5000/x:y".to_string(),
                "***@127.0.0.1:5000/x:y".to_string(),
            ),
            (
                "https://user:s3cret@host.io/x".to_string(),
                "https://***@host.io/x".to_string(),
            ),
            (
                "user:s3/cr@t@host.io/x".to_string(),
                "***@host.io/x".to_string(),
            ),
            (
                format!("u:s3cret@host.io/x@{digest}"),
                format!("***@host.io/x@{digest}"),
            ),
            (
                "user:s3cret@registry:5000".to_string(),
                "***@registry:5000".to_string(),
            ),
        ] {
            assert_eq!(redacted(&reference), shown);
            let err = Reference::parse(&reference).unwrap_err();
            assert!(!err.to_string().contains("s3cret"), "{err}");
            assert!(!err.to_string().contains("s3/cr"), "{err}");
        }
        let plain = format!("host.io/x:v1@{digest}");
        assert_eq!(redacted(&plain), plain);
        assert!(
            Reference::parse("https://host.io/x")
                .unwrap_err()
                .to_string()
                .contains("no scheme")
        );
    }

    #[test]
    fn bad_references() {
        for bad in [
            "",
            "UPPER/case",
            "x@sha256:123",
            "x@md5:abc",
            "host.io/",
            "x:-bad",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }
}
