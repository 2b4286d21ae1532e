//! `imgbuild push` and `imgbuild login`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{CommandFailure, Printer, human_bytes};
use super::sign::print_signed;
use crate::oci::read::LayoutRef;
use crate::publish::{self, PublishError, PublishOptions, PublishReport, Signing};
use crate::registry::{
    ClientOptions, Reference, RepositoryClient,
    auth::{self, Credentials},
    client,
    push::{PushProgress, PushReport},
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

pub(super) const PUSH_EXAMPLES: &str = "\
Examples:
  imgbuild push images/py39-torch21 registry.example/ml/torch:2.1
  imgbuild push images/py39-torch21:cuda11.8 ghcr.io/org/torch --tag latest --tag 2.1
  imgbuild push images/demo 127.0.0.1:5000/demo:v1 --insecure   # plain HTTP, loopback only

Credentials come from $REGISTRY_AUTH_FILE, $DOCKER_CONFIG/config.json or
~/.docker/config.json (auths, credHelpers, credsStore), as `docker login` and
`podman login` write them, or from `imgbuild login`.";

pub(super) const LOGIN_EXAMPLES: &str = "\
Examples:
  echo \"$TOKEN\" | imgbuild login ghcr.io -u alice --password-stdin
  imgbuild login 127.0.0.1:5000 -u ci --password-stdin --insecure < secret.txt

The password is read from stdin, never from the command line (where other users of the
machine could see it), checked against the registry, then stored in
$REGISTRY_AUTH_FILE or $DOCKER_CONFIG/config.json (~/.docker/config.json), mode 0600.";

#[derive(Debug, Args)]
pub(crate) struct PushArgs {
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
    /// Push the image alone, not the models beside its layout (`IMAGE.models/MODEL`, which
    /// otherwise go to `REGISTRY/REPO/models/MODEL` under the same tags)
    #[arg(long)]
    pub no_models: bool,
    #[command(flatten)]
    pub signing: super::sign::SigningArgs,
}

#[derive(Debug, Args)]
pub(crate) struct LoginArgs {
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
pub(super) fn parse_timeout(value: &str) -> Result<std::time::Duration, String> {
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

/// The push's source and target: the layout image, and the reference it goes to.
pub(super) struct PushOf<'a> {
    pub image: &'a str,
    pub reference: &'a str,
    /// A repository of the target's registry to mount missing blobs from before the base's
    /// (`build --push` with a `--cache-repo` there, whose layers the build took).
    pub mount_first: Option<&'a Reference>,
    /// Whether the models beside the layout go too.
    pub models: bool,
}

/// Publishes the image to the reference with the documents beside its layout, mounting
/// blobs from `mount_first` when it is on the target's registry, else from its base; the
/// push drawn as a bar.
pub(super) async fn publish_layout(
    push: &PushOf<'_>,
    tags: &[String],
    signing: Option<&Signing>,
    registry: &ClientOptions,
    printer: &Printer,
) -> Result<PublishReport, PublishError> {
    let (image, reference) = (push.image, push.reference);
    let image = LayoutRef::parse(image);
    let same_registry = |from: &&Reference| {
        Reference::parse(reference).is_ok_and(|target| target.registry == from.registry)
    };
    let mount_from = push
        .mount_first
        .filter(same_registry)
        .cloned()
        .or_else(|| publish::base_of(&image));
    let options = PublishOptions {
        tags,
        mount_from: mount_from.as_ref(),
        signing,
        attach: true,
        models: push.models,
        registry,
    };
    let report = publish::publish(&image, reference, &options, &PushBar::new(printer)).await?;
    for path in &report.not_attached {
        printer.warning(&format!(
            "`{}` describes another image of the layout than {}; not attached",
            path.display(),
            report.push.digest
        ));
    }
    Ok(report)
}

/// The push's status lines, then the pushed `REF@sha256:…` on stdout.
pub(super) fn print_push(report: &PushReport, printer: &Printer) {
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

/// The models pushed beside the image: each one's name, and the `pushed` reference, digest
/// and counts of both its forms.
pub(super) fn models_json(models: &[publish::PushedModel]) -> serde_json::Value {
    serde_json::to_value(models).expect("the models serialize")
}

/// A status line per model pushed beside the image.
pub(super) fn print_models(models: &[publish::PushedModel], printer: &Printer) {
    for model in models {
        let sent = model.image.bytes_uploaded + model.artifact.bytes_uploaded;
        let uploaded = model.image.blobs_uploaded + model.artifact.blobs_uploaded;
        printer.status(
            "Pushed",
            format_args!(
                "model {}: {uploaded} blobs uploaded ({}); {} and {}",
                model.name,
                human_bytes(sent),
                model.image.pushed,
                model.artifact.pushed
            ),
        );
    }
}

pub(super) async fn run_push(
    args: &PushArgs,
    options: &ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let signing = args.signing.prepare()?;
    let push = PushOf {
        image: &args.image,
        reference: &args.reference,
        mount_first: None,
        models: !args.no_models,
    };
    let report = publish_layout(&push, &args.tags, signing.as_ref(), options, printer).await?;
    if args.json {
        let mut value = serde_json::to_value(&report.push).expect("the report serializes");
        value["signatures"] = serde_json::to_value(&report.signed).expect("signatures serialize");
        value["models"] = models_json(&report.models);
        printer.result(value);
    } else {
        print_signed(&report.signed, printer);
        print_models(&report.models, printer);
        print_push(&report.push, printer);
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn run_login(
    args: &LoginArgs,
    options: &ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    // Bounded: a token is a few KiB, and `< /dev/zero` must end the read, not fill memory.
    const MAX_PASSWORD_BYTES: u64 = 64 << 10;
    let password = crate::fs::read_stream(std::io::stdin().lock(), MAX_PASSWORD_BYTES)
        .map_err(|err| CommandFailure::new(format!("the password on stdin {err}"), 1))?;
    let password = String::from_utf8(password)
        .map_err(|_| CommandFailure::new("the password on stdin is not UTF-8", 1))?;
    let password = password.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(CommandFailure::new("no password on stdin", 1));
    }
    let credentials = Credentials::new(args.username.clone(), password);
    // Any repository name does: `/v2/` is what is checked.
    let reference = Reference::parse(&format!("{}/imgbuild-login-check", args.registry))
        .map_err(|err| CommandFailure::new(err, 1))?;
    let client = RepositoryClient::new(&reference, Some(credentials.clone()), options)
        .map_err(|err| CommandFailure::new(err, 1))?;
    client
        .check_login()
        .await
        .map_err(|err| CommandFailure::new(err, 1))?;
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
    auth::store(&file, &reference.registry, &credentials)
        .map_err(|err| CommandFailure::new(err, 2))?;
    printer.notice(format_args!(
        "Login succeeded; credentials for {} stored in {}",
        reference.registry,
        file.display()
    ));
    Ok(ExitCode::SUCCESS)
}
