//! `imgbuild push` and `imgbuild login`.

use std::{io::Read, path::PathBuf, process::ExitCode};

use clap::Args;

use crate::registry::{
    ClientOptions, Reference, RepositoryClient,
    auth::{self, Credentials},
    push::{PushReport, push},
};

pub const PUSH_EXAMPLES: &str = "\
Examples:
  imgbuild push images/py39-torch21 registry.example/ml/torch:2.1
  imgbuild push images/py39-torch21:cuda11.8 ghcr.io/org/torch --tag latest --tag 2.1
  imgbuild push images/demo 127.0.0.1:5000/demo:v1 --insecure   # plain HTTP, loopback only

Credentials come from $REGISTRY_AUTH_FILE, $DOCKER_CONFIG/config.json or
~/.docker/config.json (auths, credHelpers, credsStore), as `docker login` and
`podman login` write them, or from `imgbuild login`.";

pub const LOGIN_EXAMPLES: &str = "\
Examples:
  echo \"$TOKEN\" | imgbuild login ghcr.io -u alice --password-stdin
  imgbuild login 127.0.0.1:5000 -u ci --password-stdin --insecure < secret.txt

The password is read from stdin, never from the command line (where other users of the
machine could see it), checked against the registry, then stored in
$REGISTRY_AUTH_FILE or $DOCKER_CONFIG/config.json (~/.docker/config.json), mode 0600.";

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The image: an OCI layout directory, optionally with `:TAG` (default `latest`)
    pub image: String,
    /// Where to push: `registry/repository[:tag]` (default tag: the layout's)
    pub reference: String,
    /// Also tag the pushed image with these tags
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The registry, e.g. ghcr.io or 127.0.0.1:5000
    pub registry: String,
    /// User name
    #[arg(short, long)]
    pub username: String,
    /// Read the password or token from stdin (the only way: never from arguments)
    #[arg(long, required = true)]
    pub password_stdin: bool,
}

/// `layout[:tag]` → (layout, tag).
pub fn split_layout(image: &str) -> (PathBuf, String) {
    match image.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') && !path.is_empty() => (path.into(), tag.into()),
        _ => (image.into(), "latest".into()),
    }
}

/// Opens a client for `reference` with the credentials on file for its registry.
pub fn client_for(
    reference: &Reference,
    options: &ClientOptions,
) -> Result<RepositoryClient, Box<dyn std::error::Error>> {
    let credentials = auth::credentials_for(&reference.registry)?;
    Ok(RepositoryClient::new(reference, credentials, options)?)
}

/// Pushes `layout:tag` to `reference`; the report on success.
pub async fn push_layout(
    image: &str,
    reference: &str,
    tags: &[String],
    options: &ClientOptions,
    mount_from: Option<&Reference>,
) -> Result<PushReport, Box<dyn std::error::Error>> {
    let (layout, tag) = split_layout(image);
    let target = Reference::parse(reference)?;
    if target.digest.is_some() {
        return Err(format!("push to a tag, not a digest: `{reference}`").into());
    }
    for extra in tags {
        if !crate::recipe::is_valid_tag(extra) {
            return Err(format!("invalid tag `{extra}`").into());
        }
    }
    let client = client_for(&target, options)?;
    Ok(push(&layout, &tag, &client, tags, mount_from).await?)
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn print_push(report: &PushReport, quiet: bool) {
    if !quiet {
        eprintln!(
            "{:>12} {} blobs: {} uploaded ({}), {} mounted, {} already there; {} requests, {} retries",
            "Pushed",
            report.blobs_total,
            report.blobs_uploaded,
            super::human_bytes(report.bytes_uploaded),
            report.blobs_mounted,
            report.blobs_total - report.blobs_uploaded - report.blobs_mounted,
            report.requests,
            report.retries,
        );
    }
    println!("{}", report.pushed);
}

pub async fn run_push(args: &PushArgs, options: &ClientOptions, quiet: bool) -> ExitCode {
    let mount_from = base_of(&args.image);
    match push_layout(
        &args.image,
        &args.reference,
        &args.tags,
        options,
        mount_from.as_ref(),
    )
    .await
    {
        Ok(report) => {
            print_push(&report, quiet);
            ExitCode::SUCCESS
        }
        Err(err) => super::fail(err.as_ref(), 1),
    }
}

/// The registry base an image was built on (its `org.opencontainers.image.base.name`), for
/// cross-repository mounts.
pub fn base_of(image: &str) -> Option<Reference> {
    let (layout, tag) = split_layout(image);
    let index = oci_spec::image::ImageIndex::from_file(layout.join("index.json")).ok()?;
    let descriptor = index.manifests().iter().find(|d| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get("org.opencontainers.image.ref.name"))
            .is_some_and(|t| *t == tag)
    })?;
    let manifest = oci_spec::image::ImageManifest::from_file(
        layout
            .join("blobs/sha256")
            .join(descriptor.digest().digest()),
    )
    .ok()?;
    let name = manifest
        .annotations()
        .as_ref()?
        .get("org.opencontainers.image.base.name")?;
    Reference::parse(name).ok()
}

#[allow(clippy::print_stderr)]
pub async fn run_login(args: &LoginArgs, options: &ClientOptions) -> ExitCode {
    let mut password = String::new();
    if let Err(err) = std::io::stdin().read_to_string(&mut password) {
        return super::fail(&err, 1);
    }
    let password = password.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        eprintln!("error: no password on stdin");
        return ExitCode::from(1);
    }
    let credentials = Credentials::new(args.username.clone(), password);
    // Any repository name does: `/v2/` is what is checked.
    let reference = match Reference::parse(&format!("{}/imgbuild-login-check", args.registry)) {
        Ok(reference) => reference,
        Err(err) => return super::fail(&err, 1),
    };
    let client = match RepositoryClient::new(&reference, Some(credentials.clone()), options) {
        Ok(client) => client,
        Err(err) => return super::fail(&err, 1),
    };
    if let Err(err) = client.check_login().await {
        return super::fail(&err, 1);
    }
    let file = std::env::var_os("REGISTRY_AUTH_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(auth::docker_config_file);
    match auth::store(&file, &reference.registry, &credentials) {
        Ok(()) => {
            eprintln!(
                "Login succeeded; credentials for {} stored in {}",
                reference.registry,
                file.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => super::fail(&err, 2),
    }
}
