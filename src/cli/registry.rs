//! `imgbuild push` and `imgbuild login`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{Failure, Printer, human_bytes};
use super::sign::{Signing, print_signed};
use crate::oci::read::LayoutRef;
use crate::registry::{
    ClientOptions, Reference, RepositoryClient,
    auth::{self, Credentials},
    client,
    push::{PushProgress, PushReport, push},
};

/// A progress bar of bytes made present in the registry, on stderr when it is a terminal.
struct PushBar {
    bar: indicatif::ProgressBar,
    blobs: std::sync::atomic::AtomicUsize,
    done: std::sync::atomic::AtomicUsize,
}

impl PushBar {
    fn new(printer: &Printer) -> PushBar {
        let bar = if printer.bars() {
            indicatif::ProgressBar::new(0)
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>12.bold} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix("Pushing");
        PushBar {
            bar,
            blobs: Default::default(),
            done: Default::default(),
        }
    }
}

impl PushProgress for PushBar {
    fn start(&self, blobs: usize, bytes: u64) {
        self.blobs
            .store(blobs, std::sync::atomic::Ordering::Relaxed);
        self.bar.set_length(bytes);
        self.bar.set_message(format!("0/{blobs} blobs"));
    }

    fn blob_done(&self, _digest: &str, size: u64, _sent: bool) {
        let done = self.done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let blobs = self.blobs.load(std::sync::atomic::Ordering::Relaxed);
        self.bar.inc(size);
        self.bar.set_message(format!("{done}/{blobs} blobs"));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

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
    /// Print the push report as one JSON object on stdout (instead of `REF@sha256:…`)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub signing: super::sign::SigningArgs,
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

/// `--registry-timeout` / `IMGBUILD_REGISTRY_TIMEOUT`: a positive number of seconds (a
/// fraction allowed), at most a day.
pub fn parse_timeout(value: &str) -> Result<std::time::Duration, String> {
    let seconds: f64 = value
        .trim()
        .parse()
        .map_err(|_| format!("`{value}` is not a number of seconds"))?;
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        return Err(format!(
            "`{value}`: the registry timeout is more than 0 and at most 86400 seconds"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
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
    printer: &Printer,
) -> Result<PushReport, Box<dyn std::error::Error>> {
    let image = LayoutRef::parse(image);
    let target = Reference::parse(reference)?;
    if target.digest.is_some() {
        return Err(format!(
            "push to a tag, not a digest: `{}`",
            crate::registry::reference::redacted(reference)
        )
        .into());
    }
    for extra in tags {
        if !crate::recipe::is_valid_tag(extra) {
            return Err(format!("invalid tag `{extra}`").into());
        }
    }
    let client = client_for(&target, options)?;
    let bar = PushBar::new(printer);
    let mut report = push(&image.dir, image.tag(), &client, tags, mount_from, &bar).await?;
    attach_sboms(&client, &image.dir, &mut report).await?;
    Ok(report)
}

/// Attaches the SBOMs and the provenance `build` wrote beside the layout (those that name
/// the pushed image) to it.
async fn attach_sboms(
    client: &RepositoryClient,
    layout: &std::path::Path,
    report: &mut PushReport,
) -> Result<(), Box<dyn std::error::Error>> {
    use crate::registry::referrers::{Attachment, Subject, attach};
    use crate::sbom::{SbomFormat, path_beside};
    let mut attachments = Vec::new();
    let documents = [
        (
            path_beside(layout, SbomFormat::Spdx),
            "application/spdx+json",
            None,
        ),
        (
            path_beside(layout, SbomFormat::Cyclonedx),
            "application/vnd.cyclonedx+json",
            None,
        ),
        (
            crate::provenance::path_beside(layout),
            crate::provenance::MEDIA_TYPE,
            Some(crate::attest::SLSA_PROVENANCE_V1),
        ),
    ];
    for (path, media_type, predicate_type) in documents {
        // Bounded as a lock is (they list what it lists); a fifo or a device is skipped.
        let Ok(bytes) = crate::fs::read_input(&path, crate::lock::MAX_LOCK_BYTES) else {
            continue;
        };
        // A layout holds many images, but beside it lies what the last build into it wrote:
        // attached to another tag's image it would describe the wrong image.
        if describes(&bytes, &report.digest) {
            attachments.push(Attachment {
                media_type,
                bytes,
                predicate_type,
            });
        } else {
            tracing::warn!(
                "`{}` describes another image of the layout than {}; not attached",
                path.display(),
                report.digest
            );
        }
    }
    if attachments.is_empty() {
        return Ok(());
    }
    let manifest_bytes = crate::oci::layout::Layout::new(layout)
        .blobs()
        .read_named(&report.digest, crate::oci::blobs::MAX_JSON_BLOB)?;
    let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes)?;
    let size = manifest_bytes.len() as u64;
    let created = manifest["annotations"]["org.opencontainers.image.created"]
        .as_str()
        .unwrap_or("1970-01-01T00:00:00Z")
        .to_string();
    // A multi-platform image's documents describe its index.
    let media_type = manifest["mediaType"]
        .as_str()
        .unwrap_or("application/vnd.oci.image.manifest.v1+json");
    let subject = Subject {
        digest: &report.digest,
        size,
        media_type,
    };
    let (digests, found_by) = attach(client, subject, &created, &attachments).await?;
    for (attachment, digest) in attachments.iter().zip(digests) {
        if attachment.predicate_type.is_some() {
            report.provenance = Some(digest);
        } else {
            report.sboms.push(digest);
        }
    }
    // The attachment's requests and retries count too.
    report.requests = client.requests.load(std::sync::atomic::Ordering::Relaxed);
    report.retries = client.retries.load(std::sync::atomic::Ordering::Relaxed);
    report.sboms_found_by = Some(found_by.name());
    Ok(())
}

/// A document attached to an image in a registry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Attached {
    /// The artifact manifest's digest.
    pub digest: String,
    /// `referrers-api` or the fallback tag.
    pub found_by: String,
}

/// Attaches `attachment` to the manifest `subject_digest` of `reference`'s repository, as an
/// OCI 1.1 artifact whose `subject` is that manifest.
pub async fn attach_document(
    reference: &Reference,
    subject_digest: &str,
    attachment: crate::registry::referrers::Attachment,
    options: &ClientOptions,
) -> Result<Attached, Box<dyn std::error::Error>> {
    use crate::registry::{
        pull::manifest_descriptor,
        referrers::{Subject, attach},
    };
    let client = client_for(reference, options)?;
    let subject = manifest_descriptor(&client, Some(subject_digest)).await?;
    let created = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let subject = Subject {
        digest: &subject.digest,
        size: subject.size,
        media_type: &subject.media_type,
    };
    let (digests, found_by) = attach(&client, subject, &created, &[attachment]).await?;
    Ok(Attached {
        digest: digests.into_iter().next().unwrap_or_default(),
        found_by: found_by.name(),
    })
}

/// Whether a document `build` wrote names the image `digest` (an SPDX `versionInfo` and
/// checksum, a CycloneDX `version` and purl, the provenance's subject all carry it).
fn describes(sbom: &[u8], digest: &str) -> bool {
    let hex = digest.trim_start_matches("sha256:");
    !hex.is_empty()
        && sbom
            .windows(hex.len())
            .any(|window| window == hex.as_bytes())
}

/// The push's status lines, then the pushed `REF@sha256:…` on stdout.
pub fn print_push(report: &PushReport, printer: &Printer) {
    printer.status(
        "Pushed",
        format_args!(
            "{} blobs: {} uploaded ({}), {} mounted, {} already there; {} requests, {} retries",
            report.blobs_total,
            report.blobs_uploaded,
            human_bytes(report.bytes_uploaded),
            report.blobs_mounted,
            report.blobs_total - report.blobs_uploaded - report.blobs_mounted,
            report.requests,
            report.retries,
        ),
    );
    if let Some(found_by) = &report.sboms_found_by {
        let provenance = if report.provenance.is_some() {
            " and its provenance"
        } else {
            ""
        };
        printer.status(
            "Attached",
            format_args!(
                "{} SBOM(s){provenance} to the image, found by {found_by}",
                report.sboms.len()
            ),
        );
    }
    printer.result(&report.pushed);
}

pub(super) async fn run_push(
    args: &PushArgs,
    options: &ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, Failure> {
    let mount_from = base_of(&args.image);
    let signing = Signing::prepare(&args.signing).map_err(|err| Failure::new(err, 1))?;
    let report = push_layout(
        &args.image,
        &args.reference,
        &args.tags,
        options,
        mount_from.as_ref(),
        printer,
    )
    .await
    .map_err(|err| Failure::new(err, 1))?;
    let signed = match &signing {
        // The error with its causes (a lookaside file that is a fifo), after the line that
        // says the push itself went through.
        Some(signing) => sign_pushed(signing, &report, &args.tags).map_err(|err| {
            Failure::new(err, 1).after(vec![format!("{} was pushed but not signed", report.pushed)])
        })?,
        None => Vec::new(),
    };
    if args.json {
        let mut value = serde_json::to_value(&report).expect("the report serializes");
        value["signatures"] = serde_json::to_value(&signed).expect("signatures serialize");
        printer.result(value);
    } else {
        print_signed(&signed, printer);
        print_push(&report, printer);
    }
    Ok(ExitCode::SUCCESS)
}

/// Signs the pushed image as each of its tags, and each document attached to it (the
/// artifacts are untagged: their signatures claim the repository).
fn sign_pushed(
    signing: &Signing,
    report: &PushReport,
    tags: &[String],
) -> Result<Vec<super::sign::Signed>, Box<dyn std::error::Error>> {
    let identities = pushed_identities(report, tags);
    let mut signed = signing.sign(&identities, &report.digest)?;
    if let Some(image) = identities.first() {
        let repository = Reference {
            tag: None,
            ..image.clone()
        };
        for artifact in report.sboms.iter().chain(&report.provenance) {
            signed.extend(signing.sign(std::slice::from_ref(&repository), artifact)?);
        }
    }
    Ok(signed)
}

/// The references a push made point at its image: the target's tag and each `--tag`; what
/// signatures of the push claim.
fn pushed_identities(report: &PushReport, tags: &[String]) -> Vec<Reference> {
    let Ok(pushed) = Reference::parse(&report.pushed) else {
        return Vec::new();
    };
    let target = Reference {
        digest: None,
        ..pushed
    };
    let mut identities = vec![target.clone()];
    identities.extend(tags.iter().map(|tag| target.with_tag(tag)));
    identities
}

/// The registry base an image was built on (its `org.opencontainers.image.base.name`), for
/// cross-repository mounts.
pub fn base_of(image: &str) -> Option<Reference> {
    let image = LayoutRef::parse(image);
    let layout = image.layout();
    // Every platform of a multi-platform image is built on the same base repository.
    let (_, manifest) = layout
        .platform_manifests(&layout.entry(image.tag()).ok()?)
        .ok()?
        .into_iter()
        .next()?;
    let name = manifest
        .annotations()
        .as_ref()?
        .get("org.opencontainers.image.base.name")?;
    Reference::parse(name).ok()
}

pub(super) async fn run_login(
    args: &LoginArgs,
    options: &ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, Failure> {
    // Bounded: a token is a few KiB, and `< /dev/zero` must end the read, not fill memory.
    const MAX_PASSWORD_BYTES: u64 = 64 << 10;
    let password = crate::fs::read_stream(std::io::stdin().lock(), MAX_PASSWORD_BYTES)
        .map_err(|err| Failure::new(format!("the password on stdin {err}"), 1))?;
    let password = String::from_utf8(password)
        .map_err(|_| Failure::new("the password on stdin is not UTF-8", 1))?;
    let password = password.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(Failure::new("no password on stdin", 1));
    }
    let credentials = Credentials::new(args.username.clone(), password);
    // Any repository name does: `/v2/` is what is checked.
    let reference = Reference::parse(&format!("{}/imgbuild-login-check", args.registry))
        .map_err(|err| Failure::new(err, 1))?;
    let client = RepositoryClient::new(&reference, Some(credentials.clone()), options)
        .map_err(|err| Failure::new(err, 1))?;
    client
        .check_login()
        .await
        .map_err(|err| Failure::new(err, 1))?;
    // A registry that answers anyone needs no login: storing credentials would only put a
    // secret on disk for nothing (issue 18).
    if client::asks_for_no_credentials(&reference, options).await {
        printer.notice(format_args!(
            "Registry {} asks for no credentials; nothing stored",
            reference.registry
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let file = std::env::var_os("REGISTRY_AUTH_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(auth::docker_config_file);
    auth::store(&file, &reference.registry, &credentials).map_err(|err| Failure::new(err, 2))?;
    printer.notice(format_args!(
        "Login succeeded; credentials for {} stored in {}",
        reference.registry,
        file.display()
    ));
    Ok(ExitCode::SUCCESS)
}
