//! Registry credentials from where Docker and podman keep them: `$REGISTRY_AUTH_FILE`,
//! `$DOCKER_CONFIG/config.json` or `~/.docker/config.json` (`auths`, `credHelpers`,
//! `credsStore`), and `$XDG_RUNTIME_DIR/containers/auth.json`. Secrets never reach `Debug`,
//! `Display`, logs or errors.

use std::{
    collections::BTreeMap,
    fmt,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// A username and a secret (password or token).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    secret: String,
}

impl Credentials {
    pub fn new(username: impl Into<String>, secret: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            secret: secret.into(),
        }
    }

    /// The `Basic` authorization value.
    pub(crate) fn basic(&self) -> String {
        let raw = format!("{}:{}", self.username, self.secret);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("Failed to read the registry auth file `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("The registry auth file `{}` is not valid JSON", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("The entry for `{registry}` in `{}` is not base64 `user:password`", path.display())]
    BadEntry { registry: String, path: PathBuf },
    #[error("Credential helper `docker-credential-{helper}` failed for `{registry}`: {reason}")]
    Helper {
        helper: String,
        registry: String,
        reason: String,
    },
    #[error("Failed to write the registry auth file `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The part of Docker's `config.json` (and podman's `auth.json`) we read and write; other
/// keys are kept as they are.
#[derive(Debug, Default, Serialize, Deserialize)]
struct AuthFile {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(
        default,
        rename = "credHelpers",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    cred_helpers: BTreeMap<String, String>,
    #[serde(
        default,
        rename = "credsStore",
        skip_serializing_if = "Option::is_none"
    )]
    creds_store: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct AuthEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auth: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    password: Option<String>,
    #[serde(
        default,
        rename = "identitytoken",
        skip_serializing_if = "Option::is_none"
    )]
    identity_token: Option<String>,
}

/// The auth files consulted, first match wins.
pub(crate) fn auth_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Some(file) = std::env::var_os("REGISTRY_AUTH_FILE").filter(|v| !v.is_empty()) {
        files.push(PathBuf::from(file));
    }
    files.push(docker_config_file());
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        files.push(PathBuf::from(runtime).join("containers/auth.json"));
    }
    files
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
pub fn docker_config_file() -> PathBuf {
    match std::env::var_os("DOCKER_CONFIG").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".docker/config.json"),
    }
}

/// Keys a registry may be stored under (Docker Hub's legacy key included).
fn keys_for(registry: &str) -> Vec<String> {
    let mut keys = vec![
        registry.to_string(),
        format!("https://{registry}"),
        format!("http://{registry}"),
        format!("https://{registry}/v1/"),
        format!("https://{registry}/v2/"),
    ];
    if registry == "docker.io" {
        keys.push("https://index.docker.io/v1/".to_string());
        keys.push("index.docker.io".to_string());
        keys.push("registry-1.docker.io".to_string());
    }
    keys
}

/// Auth files larger than this are refused unread: one entry is a few hundred bytes, and
/// containerd and podman read their configs whole too.
pub(crate) const MAX_AUTH_FILE_BYTES: u64 = 4 << 20;

fn read_auth_file(path: &Path) -> Result<Option<AuthFile>, AuthError> {
    let text = match crate::fs::read_input_text(path, MAX_AUTH_FILE_BYTES) {
        Ok(text) => text,
        Err(err) if err.is_not_found() => return Ok(None),
        Err(source) => {
            return Err(AuthError::Read {
                path: path.to_path_buf(),
                source: source.into(),
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| AuthError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

/// Finds credentials for `registry` (a host, `docker.io` for Docker Hub).
pub fn credentials_for(registry: &str) -> Result<Option<Credentials>, AuthError> {
    for path in auth_files() {
        let Some(file) = read_auth_file(&path)? else {
            continue;
        };
        let keys = keys_for(registry);
        if let Some(helper) = keys.iter().find_map(|k| file.cred_helpers.get(k)) {
            return run_helper(helper, registry);
        }
        if let Some(entry) = keys.iter().find_map(|k| file.auths.get(k)) {
            if let Some(auth) = &entry.auth {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .and_then(|s| s.split_once(':').map(|(u, p)| Credentials::new(u, p)))
                    .ok_or_else(|| AuthError::BadEntry {
                        registry: registry.to_string(),
                        path: path.clone(),
                    })?;
                return Ok(Some(decoded));
            }
            if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
                return Ok(Some(Credentials::new(user.clone(), password.clone())));
            }
            if let Some(token) = &entry.identity_token {
                // An identity token is a refresh token sent as the password with a fixed user.
                return Ok(Some(Credentials::new("<token>", token.clone())));
            }
        }
        if let Some(store) = &file.creds_store
            && let Some(found) = run_helper(store, registry)?
        {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// `docker-credential-<helper> get` with the registry on stdin.
fn run_helper(helper: &str, registry: &str) -> Result<Option<Credentials>, AuthError> {
    let program = format!("docker-credential-{helper}");
    let fail = |reason: String| AuthError::Helper {
        helper: helper.to_string(),
        registry: registry.to_string(),
        reason,
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run `{program}`: {e}")))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(registry.as_bytes())
        .map_err(|e| fail(e.to_string()))?;
    let output = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if !output.status.success() {
        let message = String::from_utf8_lossy(&output.stdout);
        if message.contains("credentials not found") {
            return Ok(None);
        }
        // The helper's stderr may echo what it was given; report only its status.
        return Err(fail(format!("exited with {}", output.status)));
    }
    #[derive(Deserialize)]
    struct HelperOutput {
        #[serde(rename = "Username")]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let parsed: HelperOutput = serde_json::from_slice(&output.stdout)
        .map_err(|_| fail("its output is not the expected JSON".to_string()))?;
    Ok(Some(Credentials::new(parsed.username, parsed.secret)))
}

/// Stores `credentials` for `registry` in `path` (`auths`, base64), keeping everything else
/// in the file; the file is written atomically and readable by its owner only.
pub fn store(path: &Path, registry: &str, credentials: &Credentials) -> Result<(), AuthError> {
    let mut file = read_auth_file(path)?.unwrap_or_default();
    let raw = format!("{}:{}", credentials.username, credentials.secret);
    file.auths.insert(
        registry.to_string(),
        AuthEntry {
            auth: Some(base64::engine::general_purpose::STANDARD.encode(raw)),
            ..AuthEntry::default()
        },
    );
    let write = |source| AuthError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        fs_err::create_dir_all(dir).map_err(write)?;
    }
    let mut bytes = serde_json::to_vec_pretty(&file).expect("serializable");
    bytes.push(b'\n');
    crate::fs::write_atomic(path, &bytes).map_err(write)?;
    crate::fs::set_mode(path, 0o600).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let c = Credentials::new("alice", "hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.basic(), "Basic YWxpY2U6aHVudGVyMg==");
    }

    #[test]
    fn store_then_read_back_keeps_other_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs_err::write(
            &path,
            r#"{"psFormat": "table", "auths": {"other.io": {"auth": "eDp5"}}}"#,
        )
        .unwrap();
        store(&path, "127.0.0.1:5000", &Credentials::new("bob", "s3cret")).unwrap();
        let file = read_auth_file(&path).unwrap().unwrap();
        assert_eq!(file.other["psFormat"], "table");
        assert!(file.auths.contains_key("other.io"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs_err::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // SAFETY: tests in this module do not read these variables concurrently.
        unsafe { std::env::set_var("REGISTRY_AUTH_FILE", &path) };
        let found = credentials_for("127.0.0.1:5000").unwrap().unwrap();
        unsafe { std::env::remove_var("REGISTRY_AUTH_FILE") };
        assert_eq!(
            (found.username.as_str(), found.secret.as_str()),
            ("bob", "s3cret")
        );
    }
}
