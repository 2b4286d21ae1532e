//! Hostile registries, through the real CLI: answers without end (manifests, tokens,
//! referrers, error bodies), Content-Lengths over the limits, bodies dripped a byte at a
//! time, blobs longer or shorter than their descriptors or with the wrong digest, and
//! challenges and redirects that would carry the user's credentials elsewhere.
//!
//! The registries are `Scripted` servers on 127.0.0.1 whose every answer the case writes,
//! and which record the headers they got. A realm or redirect "on another host" is a second
//! server on 127.0.0.2: another host to a client, on the same loopback interface. A plain
//! HTTP realm from an HTTPS registry is the one case with TLS: Debian's `docker-registry`
//! serving HTTPS with a CA of the test's own (`--ca-cert`) and token auth whose realm is
//! `http://`. (A plain-HTTP registry not under `--insecure` cannot be set up at all:
//! without `--insecure` imgbuild speaks only HTTPS, so a plain-HTTP registry is never
//! reached and its realm never read.)
//!
//! Every refusal is asserted as exit 1 with `error: ` naming the URL or realm and the
//! limit, no panic (and so no exit 134), the previous image and the layout intact, the
//! cache grown by no more than the base's own bytes.

use std::{path::Path, sync::Arc, time::Duration};

use base64::Engine;
use sha2::Digest;

use crate::{
    common::{Project, Run, run_with_deadline},
    registry::{Auth, Registry, tls_files},
    servers::scripted::{Reply, Request, Scripted},
    support::{channel::tiny_recipe, hostile::sha256_hex, shared_channel},
    trust::{Tree, bytes_under},
};

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const USER: &str = "alice";
const PASSWORD: &str = "s3cret-registry-password";

/// A one-layer base image: its manifest, config and layer, and their digests.
struct Base {
    manifest: Vec<u8>,
    config: Vec<u8>,
    layer: Vec<u8>,
    config_digest: String,
    layer_digest: String,
}

impl Base {
    fn new() -> Base {
        Base::holding(b"from the hostile base\n".to_vec())
    }

    /// A base whose one layer holds one file of `content`.
    fn holding(content: Vec<u8>) -> Base {
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        tar.append_data(&mut header, "etc/hostile-base", content.as_slice())
            .unwrap();
        let tar = tar.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        let layer = gz.finish().unwrap();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256_hex(&tar))]},
        }))
        .unwrap();
        let (config_digest, layer_digest) = (
            format!("sha256:{}", sha256_hex(&config)),
            format!("sha256:{}", sha256_hex(&layer)),
        );
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": layer.len()}],
        }))
        .unwrap();
        Base {
            manifest,
            config,
            layer,
            config_digest,
            layer_digest,
        }
    }

    /// This base as an OCI layout in `dir`, tagged `1`.
    fn write_layout(&self, dir: &Path) {
        let blobs = dir.join("blobs/sha256");
        fs_err::create_dir_all(&blobs).unwrap();
        for bytes in [&self.manifest, &self.config, &self.layer] {
            fs_err::write(blobs.join(sha256_hex(bytes)), bytes).unwrap();
        }
        fs_err::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": MANIFEST,
                "digest": format!("sha256:{}", sha256_hex(&self.manifest)),
                "size": self.manifest.len(),
                "annotations": {"org.opencontainers.image.ref.name": "1"},
            }],
        });
        fs_err::write(dir.join("index.json"), index.to_string()).unwrap();
    }

    /// The answer of a registry that serves this base as `hostile/base:1`, if `request`
    /// asks for part of it.
    fn serve(&self, request: &Request) -> Option<Reply> {
        let path = request.path();
        if path == "/v2/hostile/base/manifests/1" {
            return Some(Reply::bytes(200, self.manifest.clone()).header("Content-Type", MANIFEST));
        }
        if path == format!("/v2/hostile/base/blobs/{}", self.config_digest) {
            return Some(Reply::bytes(200, self.config.clone()));
        }
        if path == format!("/v2/hostile/base/blobs/{}", self.layer_digest) {
            return Some(Reply::bytes(200, self.layer.clone()));
        }
        None
    }
}

/// The answers of a registry that takes any push: every blob is there, every manifest
/// stored.
fn accepts_pushes(request: &Request) -> Option<Reply> {
    match request.method.as_str() {
        "HEAD" if request.path().contains("/blobs/") => Some(Reply::status(200)),
        "PUT" if request.path().contains("/manifests/") => Some(Reply::status(201)),
        _ => None,
    }
}

/// A project with a built image `app` (the previous image), a Docker config holding
/// credentials for `registries`, and the environment that points imgbuild at it.
struct Setup {
    project: Project,
    docker: std::path::PathBuf,
}

impl Setup {
    fn new(registries: &[&str]) -> Setup {
        let project = Project::new();
        project.write_recipe(&tiny_recipe(shared_channel(), "app", &["hello 1.0"]));
        project.build(&[]).success();
        let docker = project.path().join("docker-config");
        fs_err::create_dir_all(&docker).unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        let auths: serde_json::Map<String, serde_json::Value> = registries
            .iter()
            .map(|r| (r.to_string(), serde_json::json!({ "auth": auth })))
            .collect();
        fs_err::write(
            docker.join("config.json"),
            serde_json::to_vec(&serde_json::json!({ "auths": auths })).unwrap(),
        )
        .unwrap();
        Setup { project, docker }
    }

    fn images(&self) -> Tree {
        Tree::of(&self.project.path().join("images"))
    }

    /// imgbuild `args` with this setup's credentials, under a deadline.
    fn run(&self, args: &[&str]) -> Run {
        let mut command = self.project.command(args);
        command
            .env("DOCKER_CONFIG", &self.docker)
            .env("REGISTRY_AUTH_FILE", self.docker.join("auth.json"));
        run_with_deadline(command, &self.project, args)
    }

    /// Pushes the previous image to `host`; the layout must come out of it intact.
    fn push(&self, host: &str, extra: &[&str]) -> Run {
        let before = self.images();
        let target = format!("{host}/hostile/app:v1");
        let mut args = vec!["push", "images/app", &target];
        args.extend_from_slice(extra);
        let run = self.run(&args);
        assert_eq!(before, self.images(), "the layout changed");
        run
    }

    /// Builds `app` on the base `host/hostile/base:1`; on failure, the previous image must
    /// be intact and the cache grown by no more than `grow`.
    fn build_on(&self, host: &str, extra: &[&str], grow: u64) -> Run {
        let recipe = tiny_recipe(shared_channel(), "app", &["hello 1.0"]).replace(
            "base = \"scratch\"",
            &format!("base = \"{host}/hostile/base:1\""),
        );
        self.project.write_recipe(&recipe);
        let (before, cache) = (self.images(), bytes_under(&self.project.cache));
        let mut args = vec!["build", "recipes/image.toml"];
        args.extend_from_slice(extra);
        let run = self.run(&args);
        if run.code != 0 {
            assert_eq!(before, self.images(), "the previous image changed");
            let grown = bytes_under(&self.project.cache).saturating_sub(cache);
            assert!(grown <= grow, "the cache grew by {grown} bytes");
        }
        run
    }
}

/// A registry on 127.0.0.1 serving `base`, with `answer` tried first.
fn base_registry(
    base: Base,
    answer: impl Fn(&Base, &Request) -> Option<Reply> + Send + Sync + 'static,
) -> Scripted {
    let base = Arc::new(base);
    Scripted::start("127.0.0.1", move |request| {
        answer(&base, request)
            .or_else(|| base.serve(request))
            .unwrap_or_else(|| Reply::status(404))
    })
}

fn is_manifest(request: &Request) -> bool {
    request.path() == "/v2/hostile/base/manifests/1"
}

fn is_layer(base: &Base, request: &Request) -> bool {
    request.method == "GET" && request.path().ends_with(&base.layer_digest)
}

/// What a base build's refusal says: the base, and `needles`.
#[track_caller]
fn assert_pull_refused(run: &Run, needles: &[&str]) {
    run.assert_failure_naming(1, &["hostile/base:1"]);
    run.assert_failure_naming(1, needles);
}

#[test]
fn an_endless_manifest_is_refused_at_4_mib() {
    let registry = base_registry(Base::new(), |_, r| {
        is_manifest(r).then(|| Reply::endless(200, "{\"schemaVersion\": 2, \"x\": \""))
    });
    let setup = Setup::new(&[]);
    let run = setup.build_on(&registry.host, &["--insecure"], 0);
    assert_pull_refused(
        &run,
        &[
            "/v2/hostile/base/manifests/1",
            "4 MiB",
            "a manifest or index",
        ],
    );
}

#[test]
fn a_manifest_content_length_over_the_limit_is_refused_before_reading() {
    let registry = base_registry(Base::new(), |_, r| {
        is_manifest(r).then(|| Reply::bytes(200, "{}").declaring(5 << 30))
    });
    let setup = Setup::new(&[]);
    let run = setup.build_on(&registry.host, &["--insecure"], 0);
    assert_pull_refused(
        &run,
        &["a body of 5368709120 bytes (its Content-Length)", "4 MiB"],
    );
}

#[test]
fn a_manifest_dripped_a_byte_at_a_time_ends_within_the_retry_budget() {
    // A byte every 300 ms never leaves the connection silent for the 1 s timeout; the answer
    // as a whole gets 3 timeouts.
    let registry = base_registry(Base::new(), |_, r| {
        is_manifest(r).then(|| Reply::drip(200, "{", Duration::from_millis(300)))
    });
    let setup = Setup::new(&[]);
    let run = setup.build_on(
        &registry.host,
        &["--insecure", "--registry-timeout", "1"],
        0,
    );
    assert_pull_refused(&run, &["took more than 3s", "/v2/hostile/base/manifests/1"]);
}

#[test]
fn an_endless_error_body_is_cut_short_and_named() {
    let registry = base_registry(Base::new(), |_, r| {
        is_manifest(r).then(|| Reply::endless(404, "{\"errors\": \"no such manifest"))
    });
    let setup = Setup::new(&[]);
    let run = setup.build_on(&registry.host, &["--insecure"], 0);
    assert_pull_refused(&run, &["answered 404", "no such manifest"]);
    assert!(
        run.stderr.len() < 64 << 10,
        "{} bytes of stderr",
        run.stderr.len()
    );
}

#[test]
fn a_layer_longer_than_its_descriptor_is_stopped_at_its_size() {
    let registry = base_registry(Base::new(), |base, r| {
        let mut longer = base.layer.clone();
        longer.extend(std::iter::repeat_n(b'x', 8 << 20));
        is_layer(base, r).then(|| Reply::bytes(200, longer).close_delimited())
    });
    let size = Base::new().layer.len();
    let setup = Setup::new(&[]);
    // The manifest and config are cached; of the layer, nothing stays.
    let run = setup.build_on(&registry.host, &["--insecure"], 64 << 10);
    assert_pull_refused(
        &run,
        &[
            "more than",
            &format!("not the {size} bytes its descriptor gives"),
            "nothing past",
        ],
    );
}

#[test]
fn a_layer_content_length_other_than_its_size_is_refused_before_reading() {
    let registry = base_registry(Base::new(), |base, r| {
        is_layer(base, r).then(|| Reply::bytes(200, base.layer.clone()).declaring(15 << 30))
    });
    let setup = Setup::new(&[]);
    let run = setup.build_on(&registry.host, &["--insecure"], 64 << 10);
    assert_pull_refused(&run, &["sent 16106127360 bytes, not the"]);
}

#[test]
fn a_layer_shorter_than_its_descriptor_is_refused() {
    let registry = base_registry(Base::new(), |base, r| {
        let short = base.layer[..base.layer.len() - 10].to_vec();
        is_layer(base, r).then(|| Reply::bytes(200, short).close_delimited())
    });
    let size = Base::new().layer.len();
    let setup = Setup::new(&[]);
    let run = setup.build_on(&registry.host, &["--insecure"], 64 << 10);
    assert_pull_refused(
        &run,
        &[&format!("sent {} bytes, not the {size} bytes", size - 10)],
    );
}

#[test]
fn a_layer_with_the_wrong_digest_is_refused() {
    let registry = base_registry(Base::new(), |base, r| {
        let mut wrong = base.layer.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 0xff;
        is_layer(base, r).then(|| Reply::bytes(200, wrong))
    });
    let digest = Base::new().layer_digest;
    let setup = Setup::new(&[]);
    let run = setup.build_on(&registry.host, &["--insecure"], 64 << 10);
    assert_pull_refused(&run, &["does not match digest", &digest]);
}

#[test]
fn a_blob_redirected_to_another_host_goes_without_authorization() {
    // The registry wants Basic credentials and sends the layer's GET to a "CDN" on
    // 127.0.0.2, which serves it: the build succeeds, and the CDN got no Authorization.
    let base = Base::new();
    let layer = base.layer.clone();
    let cdn = Scripted::start("127.0.0.2", move |_| Reply::bytes(200, layer.clone()));
    let cdn_url = cdn.url();
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let registry = base_registry(base, move |base, r| {
        if r.header("authorization") != Some(expected.as_str()) {
            return Some(Reply::status(401).header("WWW-Authenticate", "Basic realm=\"hostile\""));
        }
        is_layer(base, r).then(|| {
            Reply::status(307).header("Location", &format!("{cdn_url}/cdn/{}", base.layer_digest))
        })
    });
    let setup = Setup::new(&[&registry.host]);
    setup
        .build_on(&registry.host, &["--insecure"], u64::MAX)
        .success();
    let got = cdn.requests();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].header("authorization"), None, "{got:?}");
    assert!(
        registry.requests().iter().any(|r| r
            .header("authorization")
            .is_some_and(|a| a.starts_with("Basic "))),
        "the registry itself got the credentials"
    );
}

/// A registry on 127.0.0.1 that answers everything with a Bearer challenge naming `realm`.
fn bearer_registry(realm: String) -> Scripted {
    Scripted::start("127.0.0.1", move |_| {
        Reply::status(401).header(
            "WWW-Authenticate",
            &format!("Bearer realm=\"{realm}\",service=\"hostile\""),
        )
    })
}

#[test]
fn an_endless_token_answer_is_refused_at_1_mib() {
    let token = Scripted::start("127.0.0.1", |_| {
        Reply::endless(200, "{\"token\": \"").header("Content-Type", "application/json")
    });
    let realm = format!("{}/token", token.url());
    let registry = bearer_registry(realm.clone());
    let setup = Setup::new(&[&registry.host]);
    let run = setup.push(&registry.host, &["--insecure"]);
    run.assert_failure_naming(1, &[&realm, "1 MiB", "a token answer"]);
}

#[test]
fn a_realm_on_another_host_gets_no_credentials() {
    // 127.0.0.2 is not the registry's host: its token request goes without the password,
    // and its refusal says why. A realm on the registry's own host (another port) gets them.
    let elsewhere = Scripted::start("127.0.0.2", |_| Reply::status(401));
    let realm = format!("{}/token", elsewhere.url());
    let registry = bearer_registry(realm.clone());
    let setup = Setup::new(&[&registry.host]);
    let run = setup.push(&registry.host, &["--insecure"]);
    run.assert_failure_naming(1, &[&realm, "another host", USER, "anonymous token"]);
    let got = elsewhere.requests();
    assert!(!got.is_empty(), "the realm was asked");
    assert!(
        got.iter().all(|r| r.header("authorization").is_none()),
        "{got:?}"
    );

    let own_host = Scripted::start("127.0.0.1", |_| Reply::status(401));
    let registry = bearer_registry(format!("{}/token", own_host.url()));
    let setup = Setup::new(&[&registry.host]);
    setup
        .push(&registry.host, &["--insecure"])
        .assert_failure_naming(1, &["refused the credentials"]);
    assert!(
        own_host.requests().iter().all(|r| r
            .header("authorization")
            .is_some_and(|a| a.starts_with("Basic "))),
        "{:?}",
        own_host.requests()
    );
}

#[test]
fn a_plain_http_realm_from_an_https_registry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_files(dir.path());
    let token = Scripted::start("127.0.0.1", |_| Reply::status(500));
    let realm = format!("{}/token", token.url());
    let registry = Registry::start_with(
        Auth::Token {
            realm: realm.clone(),
            cert: ca.clone(),
        },
        &format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            cert.display(),
            key.display()
        ),
    );
    let setup = Setup::new(&[&registry.host]);
    let run = setup.push(&registry.host, &["--ca-cert", ca.to_str().unwrap()]);
    run.assert_failure_naming(1, &[&realm, "not HTTPS"]);
    assert_eq!(token.requests().len(), 0, "{:?}", token.requests());
}

#[test]
fn an_upload_location_on_another_host_gets_no_authorization() {
    let elsewhere = Scripted::start("127.0.0.2", |_| Reply::status(201));
    let upload = format!("{}/upload/1", elsewhere.url());
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let registry = Scripted::start("127.0.0.1", move |r| {
        if r.header("authorization") != Some(expected.as_str()) {
            return Reply::status(401).header("WWW-Authenticate", "Basic realm=\"hostile\"");
        }
        match r.method.as_str() {
            "HEAD" => Reply::status(404),
            "POST" => Reply::status(202).header("Location", &upload),
            "PUT" => Reply::status(201),
            _ => Reply::status(404),
        }
    });
    let setup = Setup::new(&[&registry.host]);
    setup.push(&registry.host, &["--insecure"]).success();
    let got = elsewhere.requests();
    assert!(got.iter().any(|r| r.method == "PUT"), "{got:?}");
    assert!(
        got.iter().all(|r| r.header("authorization").is_none()),
        "{got:?}"
    );
}

#[test]
fn an_endless_referrers_answer_is_refused_at_4_mib() {
    let registry = Scripted::start("127.0.0.1", |r| {
        if r.path().contains("/referrers/") {
            return Reply::endless(200, "{\"manifests\": [");
        }
        accepts_pushes(r).unwrap_or_else(|| Reply::status(404))
    });
    let setup = Setup::new(&[]);
    let run = setup.push(&registry.host, &["--insecure"]);
    run.assert_failure_naming(1, &["/v2/hostile/app/referrers/sha256:", "4 MiB"]);
}

#[test]
fn a_referrers_index_over_the_limit_is_refused() {
    // No referrers API; the fallback tag's index lists 40 000 referrers (7.6 MB).
    let entry = serde_json::json!({"mediaType": MANIFEST, "digest": format!("sha256:{}", "a".repeat(64)), "size": 1, "artifactType": "application/spdx+json"});
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": vec![entry; 40_000],
    }))
    .unwrap();
    assert!(index.len() > 4 << 20);
    let registry = Scripted::start("127.0.0.1", move |r| {
        if r.method == "GET" && r.path().contains("/manifests/sha256-") {
            return Reply::bytes(200, index.clone());
        }
        accepts_pushes(r).unwrap_or_else(|| Reply::status(404))
    });
    let setup = Setup::new(&[]);
    let run = setup.push(&registry.host, &["--insecure"]);
    run.assert_failure_naming(
        1,
        &[
            "/v2/hostile/app/manifests/sha256-",
            "4 MiB",
            "(its Content-Length)",
        ],
    );
}

#[test]
fn a_base_over_https_and_http2_with_a_layer_over_1_mib_is_pulled() {
    // Over HTTP/2 (docker-registry with TLS speaks it), the answer to HEAD of a blob
    // reports the blob's Content-Length as its own: it must not count against the 1 MiB
    // read of an answer's body, which a HEAD does not have.
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_files(dir.path());
    let registry = Registry::start_tls(&cert, &key);
    let noise: Vec<u8> = (0u32..(3 << 15))
        .flat_map(|i| sha2::Sha256::digest(i.to_le_bytes()).to_vec())
        .collect();
    let base = Base::holding(noise);
    assert!(base.layer.len() > 2 << 20);
    let setup = Setup::new(&[]);
    let layout = setup.project.path().join("base-layout");
    base.write_layout(&layout);
    let ca = ca.to_str().unwrap();
    let target = format!("{}/hostile/base:1", registry.host);
    let source = format!("{}:1", layout.display());
    setup
        .run(&["push", &source, &target, "--ca-cert", ca])
        .success();
    setup
        .build_on(&registry.host, &["--ca-cert", ca], 0)
        .success();
}

#[test]
fn inspect_refuses_a_config_the_manifest_says_is_huge_without_fetching_it() {
    let base = Base::new();
    // The same manifest, but its config claims 5 MiB.
    let mut manifest: serde_json::Value = serde_json::from_slice(&base.manifest).unwrap();
    manifest["config"]["size"] = serde_json::json!(5 << 20);
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let config_path = format!("/v2/hostile/base/blobs/{}", base.config_digest);
    let registry = base_registry(base, move |_, request| {
        is_manifest(request)
            .then(|| Reply::bytes(200, manifest.clone()).header("Content-Type", MANIFEST))
    });
    let project = Project::new();
    let image = format!(
        "{}/hostile/base:1",
        registry.url().trim_start_matches("http://")
    );
    let args = ["inspect", image.as_str(), "--insecure"];
    let run = run_with_deadline(project.command(&args), &project, &args);
    run.assert_failure_naming(
        1,
        &[
            &image,
            "an image config of 5242880 bytes (at most 4194304 are read)",
        ],
    );
    assert!(
        !registry.requests().iter().any(|r| r.path() == config_path),
        "the config was fetched"
    );
}
