//! `imgbuild smoke`: the GPU smoke test of an image on this machine.

use std::process::ExitCode;

use clap::Args;

use super::printer::{CommandFailure, Printer};
use super::sign::print_signed;
use crate::publish::{PublishError, Signing};

pub(super) const SMOKE_EXAMPLES: &str = "\
Examples:
  imgbuild smoke images/py39-torch21              # the `latest` tag of a layout
  imgbuild smoke images/py39-torch21:cuda11.8 --json
  imgbuild smoke registry.example/ml/py39-torch21@sha256:…   # pulled into the cache first
  imgbuild smoke images/py39-torch21 --attest smoke.intoto.json   # and an in-toto statement
  imgbuild smoke images/debian-torch --framework   # PyTorch of a base imgbuild did not build
  imgbuild smoke registry.example/ml/torch@sha256:… --attest smoke.json --sign-by key.asc

Exit codes: 0 pass, 3 no NVIDIA driver or GPU, 4 the image's CUDA cannot run on this
driver, 5 the kernel failed or computed wrong values, or a library crashed or hung the test
(it runs in a child process), 6 the CUDA stack passed but a framework of the image did not
(a CPU build, a missing library, a CUDA the driver is too old for), 1 the image cannot be read or pulled, 2 `--sign-by` without
`--attest` and a registry image.";

#[derive(Debug, Args)]
pub(crate) struct SmokeArgs {
    /// The image: an OCI layout directory, optionally with `:TAG`, or a registry reference
    /// naming its registry (`registry.example/ml/x:tag`, `…@sha256:…`)
    pub image: String,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
    /// Also check the image's GPU frameworks (PyTorch, CuPy, JAX) in the image's own Python,
    /// run in its unpacked root with this host's driver visible, as a user that is not root.
    /// Default: when a layer holds one of their packages
    #[arg(long, conflicts_with = "no_framework")]
    pub framework: bool,
    /// Do not check the image's frameworks
    #[arg(long)]
    pub no_framework: bool,
    /// Also write the run as an in-toto attestation to FILE: a Statement v1 whose subject is
    /// the image's manifest digest and whose predicate (`https://imgbuild.dev/attestations/
    /// gpu-smoke/v1`) is the report, verdict included, whatever it is
    /// For a registry image, the statement is also attached to the image as an OCI 1.1
    /// artifact (`application/vnd.in-toto+json`)
    #[arg(long, value_name = "FILE")]
    pub attest: Option<std::path::PathBuf>,
    /// With `--attest` and a registry image: sign the attached attestation's manifest
    #[command(flatten)]
    pub signing: super::sign::SigningArgs,
}

/// Runs the test and prints its report; the exit code is the verdict's.
pub(super) async fn run_smoke(
    args: &SmokeArgs,
    cache_dir: &std::path::Path,
    registry: &crate::registry::ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let registry_image = match crate::smoke::ImageSource::of(&args.image) {
        crate::smoke::ImageSource::Registry(reference) => Some(reference),
        crate::smoke::ImageSource::Layout(_) => None,
    };
    let signing = args.signing.prepare()?;
    if signing.is_some() && (args.attest.is_none() || registry_image.is_none()) {
        return Err(CommandFailure::new(
            "--sign-by signs the attestation attached to a registry image: give --attest FILE and a registry reference",
            2,
        ));
    }
    let frameworks = match (args.framework, args.no_framework) {
        (true, _) => crate::smoke::framework::FrameworkMode::On,
        (_, true) => crate::smoke::framework::FrameworkMode::Off,
        _ => crate::smoke::framework::FrameworkMode::Auto,
    };
    let run = crate::smoke::smoke(&args.image, cache_dir, registry, frameworks)
        .await
        .map_err(|err| CommandFailure::new(err, 1))?;
    if let Some(path) = &args.attest {
        let statement = write_attestation(path, &args.image, &run)
            .map_err(|err| CommandFailure::new(err, 1))?;
        if let Some(reference) = &registry_image {
            publish(
                reference,
                &run,
                statement,
                signing.as_ref(),
                registry,
                printer,
            )
            .await?;
        }
    }
    printer.document(&run.report.render(args.json));
    Ok(ExitCode::from(run.report.verdict.exit_code()))
}

/// Attaches the statement to the registry image it is about, and signs the attachment.
async fn publish(
    reference: &crate::registry::Reference,
    run: &crate::smoke::SmokeRun,
    statement: Vec<u8>,
    signing: Option<&Signing>,
    options: &crate::registry::ClientOptions,
    printer: &Printer,
) -> Result<(), PublishError> {
    let attachment = crate::registry::referrers::Attachment {
        media_type: crate::attest::MEDIA_TYPE,
        bytes: statement,
        predicate_type: Some(crate::attest::GPU_SMOKE_V1),
    };
    let attached =
        crate::publish::attach_document(reference, &run.manifest_digest, attachment, options)
            .await?;
    printer.status(
        "Attached",
        format_args!(
            "the attestation to {} as {}, found by {}",
            run.manifest_digest, attached.digest, attached.found_by
        ),
    );
    if let Some(signing) = signing {
        // The artifact is untagged: the signature claims its repository.
        print_signed(
            &signing.sign_artifact(reference, &attached.digest)?,
            printer,
        );
    }
    Ok(())
}

/// Writes the run's attestation to `path`, atomically: a failed write leaves no file.
/// Returns the bytes written.
fn write_attestation(
    path: &std::path::Path,
    image: &str,
    run: &crate::smoke::SmokeRun,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut predicate = serde_json::to_value(&run.report)?;
    predicate["imgbuild"] = env!("CARGO_PKG_VERSION").into();
    let statement = crate::attest::statement(
        image,
        &run.manifest_digest,
        crate::attest::GPU_SMOKE_V1,
        predicate,
    )?;
    let text = serde_json::to_string_pretty(&statement)? + "\n";
    crate::fs::write_atomic(path, text.as_bytes())
        .map_err(|e| format!("Failed to write the attestation `{}`: {e}", path.display()))?;
    Ok(text.into_bytes())
}
