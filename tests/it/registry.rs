//! Push and pull against Debian's real `docker-registry` (distribution 2.8) started by the
//! tests on 127.0.0.1: plain, with htpasswd basic auth, and with a bearer-token service.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    common::{LayoutView, Project, require_root, run_bundle, run_tool, unpack},
    support::{
        base::{busybox_base_layout, have},
        channel::tiny_recipe,
        shared_channel,
    },
};

/// Blobs a push adds for the documents `build` writes beside the layout: the empty artifact
/// config, the SPDX and the CycloneDX SBOM, the provenance.
const SBOM_BLOBS: usize = 4;

/// How a test registry authenticates.
pub(crate) enum Auth {
    None,
    /// htpasswd (bcrypt) with one user.
    Basic {
        user: String,
        password: String,
    },
    /// Bearer tokens from a token service at `realm`, signed by the key whose certificate is
    /// `cert`.
    Token {
        realm: String,
        cert: PathBuf,
    },
}

/// A `docker-registry` process on 127.0.0.1, stopped on drop.
pub(crate) struct Registry {
    pub host: String,
    child: Child,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Registry {
    /// A registry serving HTTPS with `cert` and `key`.
    pub(crate) fn start_tls(cert: &Path, key: &Path) -> Registry {
        Self::start_with(
            Auth::None,
            &format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ),
        )
    }

    pub(crate) fn start(auth: Auth) -> Registry {
        Self::start_with(auth, "")
    }

    /// A registry authenticating with `auth`, with `http_extra` added to its `http:` section.
    pub(crate) fn start_with(auth: Auth, http_extra: &str) -> Registry {
        assert!(
            have("docker-registry"),
            "docker-registry is required: run tests/install-deps.sh"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let auth_section = match &auth {
            Auth::None => String::new(),
            Auth::Basic { user, password } => {
                let htpasswd = dir.path().join("htpasswd");
                run_tool(
                    "htpasswd",
                    &["-Bbc", htpasswd.to_str().unwrap(), user, password],
                );
                format!(
                    "auth:\n  htpasswd:\n    realm: imgbuild-test\n    path: {}\n",
                    htpasswd.display()
                )
            }
            Auth::Token { realm, cert } => format!(
                "auth:\n  token:\n    realm: {realm}\n    service: imgbuild-test\n    issuer: imgbuild-test-issuer\n    rootcertbundle: {}\n",
                cert.display()
            ),
        };
        let config = dir.path().join("config.yml");
        fs_err::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{http_extra}{auth_section}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = dir.path().join("registry.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::from(fs_err::File::create(&log).unwrap().into_file()))
            .stderr(Stdio::from(
                fs_err::OpenOptions::new()
                    .append(true)
                    .open(&log)
                    .unwrap()
                    .into_file(),
            ))
            .spawn()
            .unwrap();
        let host = format!("127.0.0.1:{port}");
        let started = Instant::now();
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the registry did not start:\n{}",
                fs_err::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            host,
            child,
            _dir: dir,
            log,
        }
    }

    /// Where the registry keeps blobs and manifests: its filesystem storage.
    pub(crate) fn storage(&self) -> PathBuf {
        self._dir.path().join("data/docker/registry/v2")
    }

    /// The registry's access log so far.
    pub(crate) fn log(&self) -> String {
        fs_err::read_to_string(&self.log).unwrap_or_default()
    }

    /// Requests in the access log whose request line starts with `method` and holds `path`.
    pub(crate) fn count(&self, method: &str, path: &str) -> usize {
        let needle = format!("\"{method} ");
        self.log()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains(path))
            .count()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A project with a built image `app` (hello, pyhello, cuda-cudart) and an empty Docker
/// config, so the host's credentials never leak into a test.
fn built_project() -> (Project, PathBuf) {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        "app",
        &["hello 1.0", "pyhello"],
    ));
    project.build(&[]).success();
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    (project, docker)
}

fn env(docker: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("DOCKER_CONFIG", docker.display().to_string()),
        (
            "REGISTRY_AUTH_FILE",
            docker.join("auth.json").display().to_string(),
        ),
    ]
}

fn run(project: &Project, docker: &Path, args: &[&str]) -> crate::common::Run {
    let envs = env(docker);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    project.run_with(args, &envs, None)
}

#[test]
fn push_is_read_back_by_skopeo_and_a_second_push_uploads_nothing() {
    let registry = Registry::start(Auth::None);
    let (project, docker) = built_project();
    let local = LayoutView::new(project.path().join("images/app"));
    let target = format!("{}/ml/app:v1", registry.host);

    let first = run(
        &project,
        &docker,
        &[
            "push",
            "images/app",
            &target,
            "--insecure",
            "--tag",
            "stable",
        ],
    )
    .success();
    assert_eq!(
        first.stdout.trim(),
        format!("{target}@{}", local.manifest_digest())
    );
    let blobs = local.manifest()["layers"].as_array().unwrap().len() + 1;
    assert!(
        first
            .stderr
            .contains(&format!("{blobs} blobs: {blobs} uploaded")),
        "{}",
        first.stderr
    );

    // skopeo sees the same digest under both tags, and copies it back unchanged.
    for tag in ["v1", "stable"] {
        let inspect: serde_json::Value = serde_json::from_str(&run_tool(
            "skopeo",
            &[
                "inspect",
                "--tls-verify=false",
                &format!("docker://{}/ml/app:{tag}", registry.host),
            ],
        ))
        .unwrap();
        assert_eq!(inspect["Digest"], local.manifest_digest());
    }
    let copied = project.path().join("copied");
    run_tool(
        "skopeo",
        &[
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{target}"),
            &format!("oci:{}:v1", copied.display()),
        ],
    );
    let index: serde_json::Value =
        serde_json::from_slice(&fs_err::read(copied.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"][0]["digest"], local.manifest_digest());

    // Without --insecure the plain-HTTP registry is told in one line, at the first answer:
    // before, rustls's `received corrupt message of type InvalidContentType` came after six
    // retries.
    let plain = run(&project, &docker, &["push", "images/app", &target]);
    plain.assert_failure_naming(
        1,
        &[
            "answered in plain HTTP where imgbuild speaks HTTPS",
            "pass --insecure",
        ],
    );
    assert!(!plain.stderr.contains("attempts"), "{}", plain.stderr);
    assert!(
        !plain.stderr.contains("InvalidContentType"),
        "{}",
        plain.stderr
    );

    // The second push finds every blob there (HEAD) and uploads none.
    let uploads_before =
        registry.count("PUT", "/blobs/uploads/") + registry.count("PATCH", "/blobs/uploads/");
    let second = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    )
    .success();
    assert!(
        second.stderr.contains(&format!(
            "{blobs} blobs: 0 uploaded (0 B), 0 mounted, {blobs} already there"
        )),
        "{}",
        second.stderr
    );
    // The same as JSON, for CI.
    let json = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure", "--json"],
    )
    .success();
    let report: serde_json::Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(report["digest"], local.manifest_digest());
    assert_eq!(report["blobs_total"], blobs);
    assert_eq!(report["blobs_uploaded"], 0);
    assert_eq!(
        report["pushed"],
        format!("{target}@{}", local.manifest_digest())
    );
    let uploads_after =
        registry.count("PUT", "/blobs/uploads/") + registry.count("PATCH", "/blobs/uploads/");
    assert_eq!(uploads_before, uploads_after, "the registry saw no upload");
    // One upload session per blob, the image's and the SBOM artifacts' (their empty config
    // and the two documents), all in the first push.
    assert_eq!(
        registry.count("POST", "/v2/ml/app/blobs/uploads/"),
        blobs + SBOM_BLOBS
    );
}

#[test]
fn a_base_from_the_registry_is_pulled_pinned_mounted_and_runs() {
    if !(have("runc") && have("umoci") && Path::new("/bin/busybox").exists()) {
        panic!("runc, umoci and busybox-static are required: run tests/install-deps.sh");
    }
    let registry = Registry::start(Auth::None);
    let project = Project::new();
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let base_ref = format!("{}/base/busybox:1", registry.host);
    run(
        &project,
        &docker,
        &["push", base.to_str().unwrap(), &base_ref, "--insecure"],
    )
    .success();

    let recipe = tiny_recipe(shared_channel(), "onbase", &["hello 1.0"]).replace(
        "base = \"scratch\"",
        &format!(
            "base = \"{base_ref}\"\nentrypoint = [\"/bin/sh\", \"-c\", \"hello; echo base ok\"]"
        ),
    );
    project.write_recipe(&recipe);
    let target = format!("{}/apps/onbase:v1", registry.host);
    let built = run(
        &project,
        &docker,
        &[
            "build",
            "recipes/image.toml",
            "--insecure",
            "--push",
            &target,
        ],
    )
    .success();
    // The base is pinned in the lock by the digest of its manifest.
    let base_digest = LayoutView::new(&base).manifest_digest();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(
        lock.contains(&format!("# imgbuild-base: {base_digest}")),
        "{lock}"
    );
    // Its layer was mounted from the base's repository, not uploaded again.
    assert!(built.stderr.contains("1 mounted"), "{}", built.stderr);
    // Every missing blob asks for a mount (a refused mount starts a normal upload, so it
    // costs no extra request); the registry granted exactly one: the base layer's.
    let granted = registry
        .log()
        .lines()
        .filter(|l| l.contains("\"POST ") && l.contains("mount=") && l.contains("HTTP/1.1\" 201 "))
        .count();
    assert_eq!(granted, 1, "{}", registry.log());

    // Offline, from the lock and the cache alone, the same image.
    let offline = run(
        &project,
        &docker,
        &[
            "build",
            "recipes/image.toml",
            "--offline",
            "--locked",
            "-o",
            "out/offline",
        ],
    )
    .success();
    assert_eq!(
        offline.digest(),
        built
            .stdout
            .lines()
            .next()
            .unwrap()
            .rsplit_once('@')
            .unwrap()
            .1
    );

    require_root!("runc needs root here");
    let bundle = project.path().join("bundle");
    unpack(&project.path().join("images/onbase"), "latest", &bundle);
    assert_eq!(
        run_bundle(&bundle, "registry"),
        "hello from /opt/conda\nbase ok\n"
    );
}

#[test]
fn basic_auth_login_push_and_wrong_credentials() {
    let registry = Registry::start(Auth::Basic {
        user: "ci".into(),
        password: "correct-horse-battery".into(),
    });
    let (project, docker) = built_project();
    let target = format!("{}/secure/app:v1", registry.host);

    // No credentials: refused, and the message says how to fix it.
    let anonymous = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    );
    anonymous.assert_clean_failure(1);
    assert!(
        anonymous.stderr.contains(&format!(
            "Registry `{}` refused the credentials (none were found; run `imgbuild login`)",
            registry.host
        )),
        "{}",
        anonymous.stderr
    );

    // Wrong password: refused at login, naming the registry, never showing the password.
    let wrong = login(
        &project,
        &docker,
        &registry.host,
        "ci",
        "wrong-password-123",
    );
    wrong.assert_clean_failure(1);
    assert!(
        wrong.stderr.contains(&format!(
            "Registry `{}` refused the credentials of user `ci`",
            registry.host
        )),
        "{}",
        wrong.stderr
    );
    assert!(
        !wrong.stderr.contains("wrong-password-123")
            && !wrong.stdout.contains("wrong-password-123")
    );
    assert!(
        !docker.join("auth.json").exists(),
        "nothing stored on failure"
    );

    // The right one is stored (0600) and used by push.
    let ok = login(
        &project,
        &docker,
        &registry.host,
        "ci",
        "correct-horse-battery",
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(!ok.stderr.contains("correct-horse-battery"));
    use std::os::unix::fs::PermissionsExt;
    let stored = docker.join("auth.json");
    assert_eq!(
        fs_err::metadata(&stored).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let pushed = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    )
    .success();
    assert!(pushed.stdout.starts_with(&target), "{}", pushed.stdout);
    assert!(!pushed.stderr.contains("correct-horse-battery"));
    // The secret is in no image or lock.
    for file in walkdir::WalkDir::new(project.path().join("images"))
        .into_iter()
        .chain(walkdir::WalkDir::new(project.path().join("recipes")))
    {
        let file = file.unwrap();
        if file.file_type().is_file() {
            let bytes = fs_err::read(file.path()).unwrap();
            assert!(
                !bytes.windows(21).any(|w| w == b"correct-horse-battery"),
                "{}",
                file.path().display()
            );
        }
    }
}

#[test]
fn login_to_a_registry_that_asks_for_no_credentials_stores_nothing() {
    let registry = Registry::start(Auth::None);
    let project = Project::new();
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    let run = login(&project, &docker, &registry.host, "ci", "unneeded-secret-7");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stderr,
        format!(
            "Registry {} asks for no credentials; nothing stored\n",
            registry.host
        )
    );
    assert!(
        !docker.join("auth.json").exists(),
        "no auth file for a registry that needs none"
    );
}

fn login(
    project: &Project,
    docker: &Path,
    host: &str,
    user: &str,
    password: &str,
) -> crate::common::Run {
    use std::io::Write;
    let mut child = Command::new(crate::support::imgbuild_bin())
        .args(["login", host, "-u", user, "--password-stdin", "--insecure"])
        .current_dir(project.path())
        .envs(env(docker))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    crate::common::Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn bearer_token_flow() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = crate::servers::token::TokenServer::start(dir.path(), "ci", "token-pass-42");
    let registry = Registry::start(Auth::Token {
        realm: tokens.realm.clone(),
        cert: tokens.cert.clone(),
    });
    let (project, docker) = built_project();
    let target = format!("{}/tokened/app:v1", registry.host);

    // Without credentials the token service refuses, and so does the push.
    let refused = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    );
    refused.assert_clean_failure(1);
    assert!(
        refused.stderr.contains(&format!(
            "Registry `{}` refused the credentials",
            registry.host
        )),
        "{}",
        refused.stderr
    );
    assert!(tokens.refused.load(std::sync::atomic::Ordering::Relaxed) >= 1);

    let ok = login(&project, &docker, &registry.host, "ci", "token-pass-42");
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let pushed = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    )
    .success();
    let digest = LayoutView::new(project.path().join("images/app")).manifest_digest();
    assert_eq!(pushed.stdout.trim(), format!("{target}@{digest}"));
    assert!(
        tokens
            .tokens_issued
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    // The registry accepted the bearer token for every upload: nothing was refused after it.
    assert!(!pushed.stderr.contains("refused"), "{}", pushed.stderr);
}

#[test]
fn pushes_through_errors_and_resumes_after_an_outage() {
    let registry = Registry::start(Auth::None);
    let (project, docker) = built_project();
    let digest = LayoutView::new(project.path().join("images/app")).manifest_digest();

    // Every 4th request answered 500, every 7th connection dropped: the push still lands,
    // with the right digest.
    let flaky = crate::servers::fault_proxy::FaultProxy::start(&registry.host, 4, 7);
    let target = format!("{}/flaky/app:v1", flaky.host);
    let pushed = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    )
    .success();
    assert_eq!(pushed.stdout.trim(), format!("{target}@{digest}"));
    let counters = &flaky.counters;
    let faults = counters
        .errors_500
        .load(std::sync::atomic::Ordering::Relaxed)
        + counters.dropped.load(std::sync::atomic::Ordering::Relaxed);
    assert!(faults >= 3, "faults injected: {faults}");
    let retries: usize = pushed
        .stderr
        .split("requests, ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the push reports its retries");
    assert!(
        retries >= faults,
        "{retries} retries for {faults} faults:\n{}",
        pushed.stderr
    );
    // For the record (`cargo test -- --nocapture`): what the push did under faults.
    eprintln!("{faults} faults injected; {}", pushed.stderr.trim());
    let inspect: serde_json::Value = serde_json::from_str(&run_tool(
        "skopeo",
        &[
            "inspect",
            "--tls-verify=false",
            &format!("docker://{}/flaky/app:v1", registry.host),
        ],
    ))
    .unwrap();
    assert_eq!(inspect["Digest"], digest);

    // A registry that goes down mid-push: a clear error after bounded retries...
    let outage = crate::servers::fault_proxy::FaultProxy::start(&registry.host, 0, 0);
    let target = format!("{}/outage/app:v1", outage.host);
    // Let the first blob uploads through, then fail everything: with 4 blobs at a time
    // (HEAD, POST, PUT each), at least one PUT is among the first 10 requests.
    outage
        .down_after
        .store(10, std::sync::atomic::Ordering::Relaxed);
    let failed = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    );
    failed.assert_clean_failure(1);
    assert!(
        failed
            .stderr
            .contains(&format!("Cannot reach registry `{}`", outage.host))
            && failed.stderr.contains("after 6 attempts"),
        "{}",
        failed.stderr
    );
    let arrived = registry.count("PUT", "/v2/outage/app/blobs/uploads/");
    assert!(arrived >= 1, "some blobs arrived before the outage");

    // ...and once it is back, a re-run sends only what had not arrived.
    outage
        .down_after
        .store(usize::MAX, std::sync::atomic::Ordering::Relaxed);
    outage
        .down
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let resumed = run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    )
    .success();
    assert_eq!(resumed.stdout.trim(), format!("{target}@{digest}"));
    let blobs = LayoutView::new(project.path().join("images/app")).manifest()["layers"]
        .as_array()
        .unwrap()
        .len()
        + 1;
    let uploads_in_total = registry
        .log()
        .lines()
        .filter(|l| {
            l.contains("\"PUT /v2/outage/app/blobs/uploads/") && l.contains("HTTP/1.1\" 201 ")
        })
        .count();
    assert_eq!(
        uploads_in_total,
        blobs + SBOM_BLOBS,
        "each blob uploaded once across both runs:\n{}",
        resumed.stderr
    );
    assert!(
        resumed
            .stderr
            .contains(&format!("{} uploaded", blobs - arrived)),
        "{}",
        resumed.stderr
    );
}

#[test]
fn large_blobs_go_in_chunks() {
    let registry = Registry::start(Auth::None);
    let (project, docker) = built_project();
    let target = format!("{}/chunked/app:v1", registry.host);
    let mut envs = env(&docker);
    // 64 KiB chunks: the 290 KiB cuda-cudart layer takes 5 PATCH requests.
    envs.push(("IMGBUILD_PUSH_CHUNK_SIZE", "65536".to_string()));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let pushed = project
        .run_with(&["push", "images/app", &target, "--insecure"], &envs, None)
        .success();
    let digest = LayoutView::new(project.path().join("images/app")).manifest_digest();
    assert_eq!(pushed.stdout.trim(), format!("{target}@{digest}"));
    assert!(
        registry.count("PATCH", "/v2/chunked/app/blobs/uploads/") >= 5,
        "{}",
        registry.log()
    );
    let copied = project.path().join("copied");
    run_tool(
        "skopeo",
        &[
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{target}"),
            &format!("oci:{}:v1", copied.display()),
        ],
    );
    assert_eq!(LayoutView::new(&copied).manifest_digest(), digest);
}

/// A CA of our own and a server certificate it signed for 127.0.0.1, made in `dir` with
/// the real openssl CLI: the CA certificate, the server certificate and its key.
pub(crate) fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let path = |name: &str| dir.join(name).display().to_string();
    run_tool(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=imgbuild test CA",
            "-keyout",
            &path("ca.key"),
            "-out",
            &path("ca.crt"),
        ],
    );
    run_tool(
        "openssl",
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &path("server.key"),
            "-out",
            &path("server.csr"),
        ],
    );
    fs_err::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run_tool(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &path("server.csr"),
            "-CA",
            &path("ca.crt"),
            "-CAkey",
            &path("ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &path("server.ext"),
            "-out",
            &path("server.crt"),
        ],
    );
    (
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    )
}

#[test]
fn https_registry_with_a_custom_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, server_cert, key) = tls_files(dir.path());
    let registry = Registry::start_tls(&server_cert, &key);
    let (project, docker) = built_project();
    let target = format!("{}/tls/app:v1", registry.host);

    // Not trusted: a clear error naming the registry.
    let untrusted = run(&project, &docker, &["push", "images/app", &target]);
    untrusted.assert_clean_failure(1);
    assert!(
        untrusted
            .stderr
            .contains(&format!("Cannot reach registry `{}`", registry.host)),
        "{}",
        untrusted.stderr
    );

    let trusted = run(
        &project,
        &docker,
        &[
            "push",
            "images/app",
            &target,
            "--ca-cert",
            cert.to_str().unwrap(),
        ],
    )
    .success();
    let digest = LayoutView::new(project.path().join("images/app")).manifest_digest();
    assert_eq!(trusted.stdout.trim(), format!("{target}@{digest}"));
}

#[test]
fn credentials_from_a_docker_credential_helper() {
    let registry = Registry::start(Auth::Basic {
        user: "helped".into(),
        password: "from-the-helper-77".into(),
    });
    let (project, docker) = built_project();
    // A credential helper as Docker runs them: `docker-credential-NAME get`, the registry on
    // stdin, JSON on stdout.
    let bin = project.path().join("bin");
    fs_err::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-imgbuildtest");
    fs_err::write(
        &helper,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 1\nread host\n[ \"$host\" = \"{}\" ] || {{ echo 'credentials not found'; exit 1; }}\necho '{{\"ServerURL\":\"'$host'\",\"Username\":\"helped\",\"Secret\":\"from-the-helper-77\"}}'\n",
            registry.host
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs_err::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    fs_err::write(
        docker.join("config.json"),
        format!(
            "{{\"credHelpers\": {{\"{}\": \"imgbuildtest\"}}}}",
            registry.host
        ),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let envs = [
        ("DOCKER_CONFIG", docker.display().to_string()),
        ("PATH", path),
    ];
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let target = format!("{}/helped/app:v1", registry.host);
    let pushed = project
        .run_with(&["push", "images/app", &target, "--insecure"], &envs, None)
        .success();
    assert!(pushed.stdout.starts_with(&target), "{}", pushed.stdout);
    assert!(!pushed.stderr.contains("from-the-helper-77"));
}

#[test]
fn sboms_and_provenance_are_attached_to_the_pushed_image() {
    let registry = Registry::start(Auth::None);
    let (project, docker) = built_project();
    let local = LayoutView::new(project.path().join("images/app"));
    let image_digest = local.manifest_digest();
    let target = format!("{}/withsbom/app:v1", registry.host);
    for _ in 0..2 {
        let pushed = run(
            &project,
            &docker,
            &["push", "images/app", &target, "--insecure", "--json"],
        )
        .success();
        let report: serde_json::Value = serde_json::from_str(pushed.stdout.trim()).unwrap();
        let fallback_tag = image_digest.replace(':', "-");
        assert_eq!(report["sboms_found_by"], fallback_tag.as_str());
        assert_eq!(report["sboms"].as_array().unwrap().len(), 2);
        assert!(report["provenance"].is_string(), "{report}");
    }
    // distribution 2.8 has no referrers API: the fallback tag lists all three, once.
    let raw = |reference: &str| -> serde_json::Value {
        serde_json::from_str(&run_tool(
            "skopeo",
            &[
                "inspect",
                "--raw",
                "--tls-verify=false",
                &format!("docker://{}/withsbom/app{reference}", registry.host),
            ],
        ))
        .unwrap()
    };
    let index = raw(&format!(":{}", image_digest.replace(':', "-")));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 3, "{index}");
    for (artifact_type, file) in [
        ("application/spdx+json", "app.spdx.json"),
        ("application/vnd.cyclonedx+json", "app.cdx.json"),
        ("application/vnd.in-toto+json", "app.provenance.json"),
    ] {
        let entry = manifests
            .iter()
            .find(|m| m["artifactType"] == artifact_type)
            .expect(artifact_type);
        let artifact = raw(&format!("@{}", entry["digest"].as_str().unwrap()));
        assert_eq!(artifact["subject"]["digest"], image_digest.as_str());
        if artifact_type == "application/vnd.in-toto+json" {
            let predicate = "https://slsa.dev/provenance/v1";
            assert_eq!(entry["annotations"]["in-toto.io/predicate-type"], predicate);
            assert_eq!(
                artifact["annotations"]["in-toto.io/predicate-type"],
                predicate
            );
        }
        assert_eq!(artifact["artifactType"], artifact_type);
        let sbom = fs_err::read(project.path().join("images").join(file)).unwrap();
        use sha2::Digest;
        assert_eq!(
            artifact["layers"][0]["digest"],
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(&sbom))).as_str()
        );
    }
}

#[test]
fn build_push_json_is_json_line_by_line() {
    let registry = Registry::start(Auth::None);
    let (project, docker) = built_project();
    let target = format!("{}/jsonpush/app:v1", registry.host);
    let run = run(
        &project,
        &docker,
        &[
            "build",
            "recipes/image.toml",
            "--json",
            "--insecure",
            "--push",
            &target,
        ],
    )
    .success();
    let events: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["event"], "push");
    let digest = LayoutView::new(project.path().join("images/app")).manifest_digest();
    assert_eq!(last["pushed"], format!("{target}@{digest}"));
    assert!(events.iter().any(|e| e["event"] == "result"));
}

#[test]
fn inspect_reads_a_registry_image_from_its_manifest_and_config_alone() {
    let registry = Registry::start(Auth::None);
    let (project, docker) = built_project();
    let target = format!("{}/ml/app:v1", registry.host);
    run(
        &project,
        &docker,
        &["push", "images/app", &target, "--insecure"],
    )
    .success();
    let summary = |image: &str| -> serde_json::Value {
        let args = ["inspect", image, "--json", "--insecure"];
        serde_json::from_str(&run(&project, &docker, &args).success().stdout).unwrap()
    };
    let (local, remote) = (summary("images/app"), summary(&target));
    for key in [
        "manifest_digest",
        "config_digest",
        "config",
        "layers",
        "packages",
        "cuda",
        "total_size",
    ] {
        assert_eq!(remote[key], local[key], "{key}");
    }
    assert_eq!(remote["image"], target.as_str());
    // Only the config blob was fetched, never a layer.
    for layer in local["layers"].as_array().unwrap() {
        let digest = layer["digest"].as_str().unwrap();
        assert_eq!(
            registry.count("GET", &format!("/blobs/{digest}")),
            0,
            "{digest}"
        );
    }
    let config = local["config_digest"].as_str().unwrap();
    assert_eq!(registry.count("GET", &format!("/blobs/{config}")), 1);
    // A tag the registry lacks is named, exit 1.
    let missing = format!("{}/ml/app:nope", registry.host);
    let run = run(&project, &docker, &["inspect", &missing, "--insecure"]);
    run.assert_failure_naming(1, &[&format!("Cannot read the registry image `{missing}`")]);
}
