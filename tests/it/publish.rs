//! `push` through the library's publish stage, against Debian's `docker-registry` on
//! 127.0.0.1: its failures exit by whose fault they are (docs/src/reference/exit-codes.md), a signing
//! failure after the push says the push went through, and the image the SBOMs are attached
//! to is read through the layout reader, its digest checked.

use std::path::Path;

use crate::{
    common::{LayoutView, Project, Run},
    registry::{Auth, Registry},
    signing::{Gpg, built, imgbuild, registries_d_staging_in},
};

/// `push images/app HOST/ml/app:v1 --insecure EXTRA…` of `app`, from `work`.
fn push_app(app: &Project, host: &str, work: &Path, extra: &[&str]) -> Run {
    let target = format!("{host}/ml/app:v1");
    let mut args = vec!["push", "images/app", &target, "--insecure"];
    args.extend(extra);
    imgbuild(app, &args, work)
}

#[test]
fn a_refused_push_exits_1_and_an_unwritable_signature_after_the_push_exits_2() {
    let app = built("app", &["hello 1.0"]);
    let work = tempfile::tempdir().unwrap();

    // The registry refuses: the input (here, the credentials) is at fault.
    let guarded = Registry::start(Auth::Basic {
        user: "ci".to_string(),
        password: "secret".to_string(),
    });
    let refused = push_app(&app, &guarded.host, work.path(), &[]);
    refused.assert_failure_naming(1, &["refused the credentials"]);

    // The push goes through, the signature cannot be written: the machine is at fault.
    let registry = Registry::start(Auth::None);
    let key = Gpg::new(work.path(), "release").secret_key(&work.path().join("release.asc"));
    let blocked = work.path().join("blocked");
    fs_err::write(
        &blocked,
        "a file where the lookaside area should be a directory",
    )
    .unwrap();
    let registries_d = registries_d_staging_in(work.path(), &blocked);
    let unsigned = push_app(
        &app,
        &registry.host,
        work.path(),
        &[
            "--sign-by",
            key.to_str().unwrap(),
            "--registries.d",
            registries_d.to_str().unwrap(),
        ],
    );
    let digest = LayoutView::new(app.path().join("images/app")).manifest_digest();
    unsigned.assert_failure_naming(
        2,
        &[
            &format!(
                "error: {}/ml/app:v1@{digest} was pushed but not signed",
                registry.host
            ),
            "Cannot write the signature",
            blocked.to_str().unwrap(),
        ],
    );
    assert_eq!(
        registry.count("PUT", "/v2/ml/app/manifests/v1"),
        1,
        "the image was pushed before the signing failed"
    );
}

#[test]
fn a_corrupted_manifest_is_refused_instead_of_getting_the_sboms_attached() {
    let registry = Registry::start(Auth::None);
    let app = built("app", &["hello 1.0"]);
    let work = tempfile::tempdir().unwrap();
    let images = app.path().join("images");
    assert!(images.join("app.spdx.json").is_file(), "an SBOM to attach");
    let digest = LayoutView::new(images.join("app")).manifest_digest();
    // Same size, other bytes: only the digest check can tell.
    let blob = images
        .join("app/blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let mut bytes = fs_err::read(&blob).unwrap();
    bytes[0] = if bytes[0] == b'{' { b'[' } else { b'{' };
    fs_err::write(&blob, &bytes).unwrap();

    let run = push_app(&app, &registry.host, work.path(), &[]);
    run.assert_failure_naming(1, &[&digest, "does not match its digest"]);
    assert_eq!(
        registry.count("HEAD", "/v2/"),
        0,
        "nothing was asked of the registry"
    );
    assert_eq!(
        registry.count("PUT", "/v2/"),
        0,
        "nothing was pushed or attached"
    );
}
