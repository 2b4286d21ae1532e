//! Simple-signing signatures (`push --sign-by`, `imgbuild sign`) checked by the real
//! consumers in Debian: `skopeo copy` and `podman pull` under a `policy.json` that requires
//! `signedBy` with the test key, reading signatures from the lookaside area registries.d
//! names. The keys are made by gpg itself, exported the way a user would export theirs.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::{
    common::{Project, run_tool},
    registry::{Auth, Registry},
    support::{base::have, channel::tiny_recipe, shared_channel},
};

/// A gpg home with one fresh Ed25519 signing key, protected by `passphrase` (none when
/// empty).
pub(crate) struct Gpg {
    home: PathBuf,
    passphrase: &'static str,
}

impl Gpg {
    pub(crate) fn new(dir: &Path, name: &str) -> Gpg {
        Gpg::with_passphrase(dir, name, "")
    }

    fn with_passphrase(dir: &Path, name: &str, passphrase: &'static str) -> Gpg {
        let home = dir.join(format!("gnupg-{name}"));
        fs_err::create_dir_all(&home).unwrap();
        run_tool("chmod", &["700", home.to_str().unwrap()]);
        let gpg = Gpg { home, passphrase };
        gpg.run(&[
            "--quick-gen-key",
            &format!("{name} <{name}@imgbuild.invalid>"),
            "ed25519",
            "sign",
            "never",
        ]);
        gpg
    }

    fn run(&self, args: &[&str]) -> Vec<u8> {
        let output = Command::new("gpg")
            .env("GNUPGHOME", &self.home)
            .args(["--batch", "--pinentry-mode", "loopback", "--passphrase"])
            .arg(self.passphrase)
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    }

    /// The secret key as `gpg --export-secret-keys --armor` writes it.
    pub(crate) fn secret_key(&self, path: &Path) -> PathBuf {
        fs_err::write(path, self.run(&["--export-secret-keys", "--armor"])).unwrap();
        path.to_path_buf()
    }

    pub(crate) fn public_key(&self, path: &Path) -> PathBuf {
        fs_err::write(path, self.run(&["--export"])).unwrap();
        path.to_path_buf()
    }

    /// What `skopeo standalone-verify` says of `signature` for the manifest in
    /// `manifest_file` as `reference`, checked against this keyring: accepted, and its words.
    pub(crate) fn standalone_verify(
        &self,
        manifest_file: &Path,
        reference: &str,
        signature: &Path,
    ) -> (bool, String) {
        let mut verify = Command::new("skopeo");
        verify
            .env("GNUPGHOME", &self.home)
            .arg("standalone-verify")
            .arg(manifest_file)
            .arg(reference)
            .arg(self.fingerprint())
            .arg(signature);
        consumer(verify)
    }

    fn fingerprint(&self) -> String {
        let listing = String::from_utf8(self.run(&["--with-colons", "--list-keys"])).unwrap();
        let fpr = listing.lines().find(|l| l.starts_with("fpr:")).unwrap();
        fpr.split(':').nth(9).unwrap().to_string()
    }
}

/// A built image `name` of the shared test channel.
pub(crate) fn built(name: &str, deps: &[&str]) -> Project {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), name, deps));
    project.build(&[]).success();
    fs_err::create_dir_all(project.path().join("docker-config")).unwrap();
    project
}

pub(crate) fn imgbuild(project: &Project, args: &[&str], home: &Path) -> crate::common::Run {
    let docker = project.path().join("docker-config");
    let docker = docker.to_str().unwrap();
    let auth = format!("{docker}/auth.json");
    let home = home.to_str().unwrap();
    project.run_with(
        args,
        &[
            ("DOCKER_CONFIG", docker),
            ("REGISTRY_AUTH_FILE", &auth),
            ("HOME", home),
        ],
        None,
    )
}

/// A containers-policy.json that takes images of `host` only when signed by `trusted`.
fn signed_by_policy(work: &Path, host: &str, trusted: &Gpg) -> PathBuf {
    let policy = work.join("policy.json");
    let policy_json = serde_json::json!({
        "default": [{"type": "reject"}],
        "transports": {"docker": {host: [{
            "type": "signedBy",
            "keyType": "GPGKeys",
            "keyPath": trusted.public_key(&work.join("trusted.gpg")),
        }]}},
    });
    fs_err::write(&policy, serde_json::to_vec_pretty(&policy_json).unwrap()).unwrap();
    policy
}

/// What a consumer said: whether it accepted the image, and its messages.
fn consumer(mut command: Command) -> (bool, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.success(), text)
}

#[derive(Clone)]
struct Consumers {
    policy: PathBuf,
    registries_d: PathBuf,
    home: PathBuf,
    work: PathBuf,
}

impl Consumers {
    fn skopeo_copy(&self, reference: &str) -> (bool, String) {
        // A fresh directory each time: `dir:` keeps what a copy wrote.
        let out = tempfile::tempdir_in(&self.work).unwrap().keep();
        let mut command = Command::new("skopeo");
        command
            .arg("--policy")
            .arg(&self.policy)
            .arg("--registries.d")
            .arg(&self.registries_d)
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{reference}"))
            .arg(format!("dir:{}", out.display()));
        consumer(command)
    }

    /// podman finds the lookaside through `~/.config/containers/registries.d`, as a user's
    /// configuration would give it.
    fn podman_pull(&self, reference: &str) -> (bool, String) {
        let storage = self.work.join("podman");
        let mut command = Command::new("podman");
        command
            .env("HOME", &self.home)
            .arg("--root")
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(["--storage-driver", "vfs", "--events-backend", "none"])
            .args(["pull", "--tls-verify=false", "--signature-policy"])
            .arg(&self.policy)
            .arg(reference);
        consumer(command)
    }
}

#[test]
fn signed_images_pass_skopeo_and_podman_signed_by_policies_and_others_are_refused() {
    if !(have("gpg") && have("skopeo") && have("podman")) {
        panic!("gpg, skopeo and podman are required: run tests/install-deps.sh");
    }
    let registry = Registry::start(Auth::None);
    let host = &registry.host;
    let app = built("app", &["hello 1.0", "pyhello"]);
    let other_image = built("app", &["hello 1.0"]);
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let trusted = Gpg::new(work, "trusted");
    let stranger = Gpg::new(work, "stranger");
    let key = trusted.secret_key(&work.join("trusted.asc"));
    let stranger_key = stranger.secret_key(&work.join("stranger.asc"));

    // Signatures are staged in one area and published to the one readers use, as
    // containers-registries.d(5) describes.
    let staging = work.join("staging");
    let published = work.join("published");
    let home = work.join("home");
    let registries_d = home.join(".config/containers/registries.d");
    fs_err::create_dir_all(&registries_d).unwrap();
    fs_err::write(
        registries_d.join("test.yaml"),
        format!(
            "docker:\n  {host}:\n    lookaside: file://{}\n    lookaside-staging: file://{}\n",
            published.display(),
            staging.display()
        ),
    )
    .unwrap();
    let policy = signed_by_policy(work, host, &trusted);
    let consumers = Consumers {
        policy,
        registries_d: registries_d.clone(),
        home: home.clone(),
        work: work.to_path_buf(),
    };
    let registries_d_arg = registries_d.to_str().unwrap();

    // push --sign-by: one signature per tag pushed, in the staging area only.
    let signed_ref = format!("{host}/ml/signed:v1");
    let push = imgbuild(
        &app,
        &[
            "push",
            "images/app",
            &signed_ref,
            "--insecure",
            "--tag",
            "stable",
            "--sign-by",
            key.to_str().unwrap(),
            "--registries.d",
            registries_d_arg,
            "--json",
        ],
        &home,
    )
    .success();
    let report: serde_json::Value = serde_json::from_str(push.stdout.trim()).unwrap();
    let digest = report["digest"].as_str().unwrap().to_string();
    let signatures = report["signatures"].as_array().unwrap();
    // The two tags, then the three attached documents (two SBOMs and the provenance).
    assert_eq!(signatures.len(), 5, "{report}");
    let hex = digest.trim_start_matches("sha256:");
    let sig_dir = staging.join(format!("ml/signed@sha256={hex}"));
    assert!(sig_dir.join("signature-1").is_file() && sig_dir.join("signature-2").is_file());
    assert_eq!(signatures[0]["fingerprint"], trusted.fingerprint());
    assert!(
        !published.exists(),
        "nothing is written to the read-only area"
    );
    // gpg itself reads the payload back, naming the digest and the reference.
    let payload = String::from_utf8(
        trusted.run(&["--decrypt", sig_dir.join("signature-1").to_str().unwrap()]),
    )
    .unwrap();
    assert!(
        payload.contains(&digest) && payload.contains(&signed_ref),
        "{payload}"
    );

    // The provenance artifact's signature, checked by skopeo against gpg's keyring.
    let provenance = report["provenance"].as_str().unwrap();
    let manifest_file = work.join("provenance-manifest.json");
    fs_err::write(
        &manifest_file,
        registry_get(
            host,
            &format!("ml/signed/manifests/{provenance}"),
            "application/vnd.oci.image.manifest.v1+json",
        ),
    )
    .unwrap();
    let provenance_sig = staging.join(format!(
        "ml/signed@sha256={}/signature-1",
        provenance.trim_start_matches("sha256:")
    ));
    let (ok, said) = trusted.standalone_verify(
        &manifest_file,
        &format!("{host}/ml/signed"),
        &provenance_sig,
    );
    eprintln!("skopeo standalone-verify of the provenance's signature:\n{said}");
    assert!(ok, "{said}");

    // Before publishing, readers find no signature and refuse.
    let (ok, said) = consumers.skopeo_copy(&signed_ref);
    assert!(!ok, "unpublished signature accepted:\n{said}");
    run_tool(
        "cp",
        &["-a", staging.to_str().unwrap(), published.to_str().unwrap()],
    );

    // The signed image is accepted under both tags, by skopeo and by podman.
    for reference in [signed_ref.clone(), format!("{host}/ml/signed:stable")] {
        let (ok, said) = consumers.skopeo_copy(&reference);
        eprintln!("skopeo copy docker://{reference} (signed by the trusted key):\n{said}");
        assert!(ok, "{said}");
    }
    let (ok, said) = consumers.podman_pull(&signed_ref);
    eprintln!("podman pull {signed_ref} (signed by the trusted key):\n{said}");
    assert!(ok, "{said}");

    // Unsigned: refused.
    let unsigned_ref = format!("{host}/ml/unsigned:v1");
    imgbuild(
        &app,
        &["push", "images/app", &unsigned_ref, "--insecure"],
        &home,
    )
    .success();
    // Signed by another key: refused.
    let stranger_ref = format!("{host}/ml/stranger:v1");
    imgbuild(
        &app,
        &[
            "push",
            "images/app",
            &stranger_ref,
            "--insecure",
            "--sign-by",
            stranger_key.to_str().unwrap(),
        ],
        &home,
    )
    .success();
    run_tool(
        "cp",
        &[
            "-a",
            &format!("{}/.", staging.display()),
            published.to_str().unwrap(),
        ],
    );
    // The signed tag re-pushed with another manifest after signing: refused.
    imgbuild(
        &other_image,
        &["push", "images/app", &signed_ref, "--insecure"],
        &home,
    )
    .success();

    for (reference, why) in [
        (&unsigned_ref, "unsigned"),
        (&stranger_ref, "signed by another key"),
        (&signed_ref, "re-pushed after signing"),
    ] {
        let (ok, said) = consumers.skopeo_copy(reference);
        eprintln!("skopeo copy docker://{reference} ({why}):\n{said}");
        assert!(!ok, "skopeo accepted an image {why}:\n{said}");
        let (ok, said) = consumers.podman_pull(reference);
        eprintln!("podman pull {reference} ({why}):\n{said}");
        assert!(!ok, "podman accepted an image {why}:\n{said}");
    }

    // `imgbuild sign` signs what the registry serves now, found through the user's
    // registries.d (no --registries.d): the re-pushed tag is accepted again.
    let sign = imgbuild(
        &other_image,
        &[
            "sign",
            &signed_ref,
            "--sign-by",
            key.to_str().unwrap(),
            "--insecure",
        ],
        &home,
    )
    .success();
    assert!(
        sign.stdout.trim().starts_with(staging.to_str().unwrap()),
        "{}",
        sign.stdout
    );
    run_tool(
        "cp",
        &[
            "-a",
            &format!("{}/.", staging.display()),
            published.to_str().unwrap(),
        ],
    );
    let (ok, said) = consumers.skopeo_copy(&signed_ref);
    eprintln!("skopeo copy docker://{signed_ref} (re-signed with imgbuild sign):\n{said}");
    assert!(ok, "{said}");
}

#[test]
fn a_bad_key_or_passphrase_fails_before_anything_is_pushed() {
    let registry = Registry::start(Auth::None);
    let app = built("app", &["hello 1.0"]);
    let work = tempfile::tempdir().unwrap();
    let not_a_key = work.path().join("not-a-key.asc");
    fs_err::write(
        &not_a_key,
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nnope\n",
    )
    .unwrap();
    let reference = format!("{}/ml/app:v1", registry.host);
    // `push … --sign-by KEY EXTRA…`, from the work directory.
    let push = |key: &Path, extra: &[&str]| {
        let mut args = vec![
            "push",
            "images/app",
            &reference,
            "--insecure",
            "--sign-by",
            key.to_str().unwrap(),
        ];
        args.extend(extra);
        imgbuild(&app, &args, work.path())
    };
    let nothing_pushed = || {
        assert_eq!(
            registry.count("PUT", "/manifests/"),
            0,
            "nothing was pushed"
        )
    };
    push(&not_a_key, &[]).assert_failure_naming(1, &["not-a-key.asc", "not an OpenPGP secret key"]);
    nothing_pushed();

    // A protected key without its passphrase.
    let gpg = Gpg::with_passphrase(work.path(), "locked", "s3cret");
    let locked = gpg.secret_key(&work.path().join("locked.asc"));
    push(&locked, &[]).assert_failure_naming(1, &["locked.asc", "cannot sign"]);
    nothing_pushed();
    // With it, the push is signed.
    let passphrase = work.path().join("passphrase");
    fs_err::write(&passphrase, "s3cret\n").unwrap();
    let registries_d = registries_d_staging_in(work.path(), work.path());
    let run = push(
        &locked,
        &[
            "--sign-passphrase-file",
            passphrase.to_str().unwrap(),
            "--registries.d",
            registries_d.to_str().unwrap(),
        ],
    )
    .success();
    assert!(run.stderr.contains("Signed"), "{}", run.stderr);
    assert!(work.path().join("sigs/ml").is_dir());
}

/// A `registries.d` in `dir` whose default staging area is `staging/sigs`.
pub(crate) fn registries_d_staging_in(dir: &Path, staging: &Path) -> PathBuf {
    let registries_d = dir.join("registries.d");
    fs_err::create_dir_all(&registries_d).unwrap();
    fs_err::write(
        registries_d.join("a.yaml"),
        format!(
            "default-docker:\n  lookaside-staging: file://{}/sigs\n",
            staging.display()
        ),
    )
    .unwrap();
    registries_d
}

/// GETs `path` of the registry's API.
fn registry_get(host: &str, path: &str, accept: &str) -> Vec<u8> {
    let output = Command::new("curl")
        .args(["-sf", "-H", &format!("Accept: {accept}")])
        .arg(format!("http://{host}/v2/{path}"))
        .output()
        .unwrap();
    assert!(output.status.success(), "GET {path}");
    output.stdout
}

#[test]
fn a_smoke_attestation_of_a_registry_image_is_attached_and_its_signature_verifies() {
    if Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!(
            "skipped: this machine has an NVIDIA driver; the GPU path is tested on the device"
        );
        return;
    }
    let registry = Registry::start(Auth::None);
    let host = &registry.host;
    let project = crate::smoke::cuda_image();
    let reference = format!("{host}/ml/cudaimg:v1");
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let gpg = Gpg::new(work, "smoke");
    let key = gpg.secret_key(&work.join("smoke.asc"));
    let registries_d = work.join("registries.d");
    fs_err::create_dir_all(&registries_d).unwrap();
    let staging = work.join("staging");
    fs_err::write(
        registries_d.join("a.yaml"),
        format!(
            "docker:\n  {host}:\n    lookaside-staging: file://{}\n",
            staging.display()
        ),
    )
    .unwrap();
    let home = project.path().to_path_buf();
    imgbuild(
        &project,
        &["push", "images/cudaimg", &reference, "--insecure"],
        &home,
    )
    .success();

    // Signing needs an attestation of a registry image.
    let refused = imgbuild(
        &project,
        &[
            "smoke",
            "images/cudaimg",
            "--attest",
            "x.json",
            "--sign-by",
            key.to_str().unwrap(),
        ],
        &home,
    );
    refused.assert_failure_naming(2, &["--sign-by", "registry"]);
    assert!(!project.path().join("x.json").exists());

    // No GPU here: the verdict is no-device (exit 3), attested all the same.
    let statement_path = work.join("smoke.intoto.json");
    let run = imgbuild(
        &project,
        &[
            "smoke",
            &reference,
            "--insecure",
            "--attest",
            statement_path.to_str().unwrap(),
            "--sign-by",
            key.to_str().unwrap(),
            "--registries.d",
            registries_d.to_str().unwrap(),
        ],
        &home,
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    let statement_bytes = fs_err::read(&statement_path).unwrap();
    let statement: serde_json::Value = serde_json::from_slice(&statement_bytes).unwrap();
    let subject = crate::common::subject_digest(&statement);
    assert_eq!(statement["predicate"]["verdict"], "no-device");

    // distribution 2.8 has no referrers API: the referrers tag lists the artifact, whose one
    // layer is the statement written to the file, byte for byte.
    let index: serde_json::Value = serde_json::from_slice(&registry_get(
        host,
        &format!("ml/cudaimg/manifests/{}", subject.replace(':', "-")),
        "application/vnd.oci.image.index.v1+json",
    ))
    .unwrap();
    let artifact = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["artifactType"] == "application/vnd.in-toto+json"
                && m["annotations"]["in-toto.io/predicate-type"]
                    == "https://imgbuild.dev/attestations/gpu-smoke/v1"
        })
        .unwrap_or_else(|| panic!("no attestation among the referrers: {index}"));
    let artifact_digest = artifact["digest"].as_str().unwrap();
    let manifest_bytes = registry_get(
        host,
        &format!("ml/cudaimg/manifests/{artifact_digest}"),
        "application/vnd.oci.image.manifest.v1+json",
    );
    let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest["subject"]["digest"], subject.as_str());
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    assert_eq!(
        registry_get(host, &format!("ml/cudaimg/blobs/{layer}"), "*/*"),
        statement_bytes
    );

    // The signature of the artifact manifest, checked by skopeo against gpg's keyring.
    let hex = artifact_digest.trim_start_matches("sha256:");
    let signature = staging.join(format!("ml/cudaimg@sha256={hex}/signature-1"));
    let manifest_file = work.join("artifact-manifest.json");
    fs_err::write(&manifest_file, &manifest_bytes).unwrap();
    let verify = |identity: &str, fingerprint: &str| {
        consumer({
            let mut command = Command::new("skopeo");
            command
                .env("GNUPGHOME", &gpg.home)
                .arg("standalone-verify")
                .arg(&manifest_file)
                .arg(identity)
                .arg(fingerprint)
                .arg(&signature);
            command
        })
    };
    let (ok, said) = verify(&format!("{host}/ml/cudaimg"), &gpg.fingerprint());
    eprintln!("skopeo standalone-verify of the attestation's signature:\n{said}");
    assert!(ok, "{said}");
    assert!(said.contains(artifact_digest), "{said}");
    // Under another identity it does not verify.
    let (ok, said) = verify(&format!("{host}/ml/other"), &gpg.fingerprint());
    assert!(!ok, "{said}");
}

#[test]
fn a_key_of_the_gnupg_keyring_signs_by_fingerprint_as_podman_does() {
    if !(have("gpg") && have("skopeo")) {
        panic!("gpg and skopeo are required: run tests/install-deps.sh");
    }
    let registry = Registry::start(Auth::None);
    let host = &registry.host;
    let app = built("app", &["hello 1.0"]);
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    let trusted = Gpg::new(work, "trusted");
    let registries_d = registries_d_staging_in(work, work);
    let policy = signed_by_policy(work, host, &trusted);
    let consumers = Consumers {
        policy,
        registries_d: registries_d.clone(),
        home: work.join("home"),
        work: work.to_path_buf(),
    };
    // `push` of the image to `repo`, signed by `by` of the keyring in `home`.
    let push = |home: &Path, repo: &str, by: &str, extra: &[&str]| {
        let reference = format!("{host}/ml/{repo}:v1");
        let mut args = vec![
            "push",
            "images/app",
            &reference,
            "--insecure",
            "--sign-by",
            by,
        ];
        args.extend_from_slice(&["--registries.d", registries_d.to_str().unwrap(), "--json"]);
        args.extend_from_slice(extra);
        app.run_with(&args, &[("GNUPGHOME", home.to_str().unwrap())], None)
    };

    // By fingerprint: gpg signs with the keyring's key, and skopeo's signedBy policy takes it.
    let fingerprint = trusted.fingerprint();
    let run = push(&trusted.home, "byfpr", &fingerprint, &[]).success();
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(
        report["signatures"][0]["fingerprint"],
        fingerprint.as_str(),
        "{report}"
    );
    // The lookaside staging is what readers are pointed at here (`default-docker`).
    let (ok, said) = Consumers {
        registries_d: published_registries_d(work),
        ..consumers.clone()
    }
    .skopeo_copy(&format!("{host}/ml/byfpr:v1"));
    assert!(ok, "skopeo refused the keyring's signature:\n{said}");
    // By e-mail address, as gpg finds keys.
    push(&trusted.home, "bymail", "trusted@imgbuild.invalid", &[]).success();

    // A name the keyring has no secret key of, and one naming two keys: nothing is pushed.
    let before = registry.count("PUT", "/manifests/");
    push(&trusted.home, "none", "0xDEADBEEFDEADBEEF", &[]).assert_failure_naming(
        1,
        &["`0xDEADBEEFDEADBEEF` of the GnuPG keyring", "no secret key"],
    );
    trusted.run(&[
        "--quick-gen-key",
        "again <trusted@imgbuild.invalid>",
        "ed25519",
        "sign",
        "never",
    ]);
    push(&trusted.home, "two", "trusted@imgbuild.invalid", &[])
        .assert_failure_naming(1, &["names 2 secret keys", &fingerprint]);
    assert_eq!(
        registry.count("PUT", "/manifests/"),
        before,
        "nothing pushed"
    );

    // A protected key: its passphrase from a file, through gpg's loopback pinentry.
    let locked = Gpg::with_passphrase(work, "locked", "s3cret");
    let passphrase = work.join("passphrase");
    fs_err::write(&passphrase, "wrong\n").unwrap();
    let locked_fpr = locked.fingerprint();
    let file = ["--sign-passphrase-file", passphrase.to_str().unwrap()];
    push(&locked.home, "locked", &locked_fpr, &file).assert_failure_naming(
        1,
        &[
            &format!("`{locked_fpr}` of the GnuPG keyring"),
            "gpg exited",
        ],
    );
    assert_eq!(
        registry.count("PUT", "/manifests/"),
        before,
        "nothing pushed"
    );
    fs_err::write(&passphrase, "s3cret\n").unwrap();
    push(&locked.home, "locked", &locked_fpr, &file).success();
}

/// A `registries.d` whose readers' `lookaside` is where [`registries_d_staging_in`] stages.
fn published_registries_d(work: &Path) -> PathBuf {
    let dir = work.join("registries.d-published");
    fs_err::create_dir_all(&dir).unwrap();
    fs_err::write(
        dir.join("a.yaml"),
        format!(
            "default-docker:\n  lookaside: file://{}/sigs\n",
            work.display()
        ),
    )
    .unwrap();
    dir
}
