//! `imgbuild sign` and the `--sign-by` arguments of `push` and `smoke`: arguments and
//! printing; the signatures are [`crate::publish`]'s.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{CommandFailure, Printer};
use crate::publish::{PublishError, Signed, Signing};
use crate::registry::ClientOptions;

pub(super) const SIGN_EXAMPLES: &str = "\
Examples:
  imgbuild sign registry.example/ml/torch:2.1 --sign-by release-key.asc
  imgbuild sign registry.example/ml/torch:2.1 --sign-by 3A1F…C0DE   # a key of ~/.gnupg
  imgbuild sign 127.0.0.1:5000/demo:v1 --sign-by key.asc --registries.d ./registries.d --insecure
  imgbuild push images/demo registry.example/ml/demo:v1 --sign-by key.asc   # push, then sign

KEY is an OpenPGP secret key file, as `gpg --export-secret-keys --armor FINGERPRINT > KEY`
writes it (no gpg agent or keyring is used). The signature names the manifest digest the
registry serves for the reference and the reference itself (containers-signature(5)); it is
written under the `lookaside-staging` (else `lookaside`) file:// area that registries.d
configures for the reference, as REPOSITORY@sha256=HEX/signature-N, the layout `podman pull`
and `skopeo copy` read under a `signedBy` policy. Publish that directory at the `lookaside`
URL readers use.";

/// How to sign: the key, its passphrase, where the lookaside areas are configured.
#[derive(Debug, Clone, Args)]
pub(crate) struct SigningArgs {
    /// Sign with this OpenPGP secret key file (armored or binary, from `gpg
    /// --export-secret-keys`), or, naming no file, the key of your GnuPG keyring with this
    /// fingerprint, key ID or e-mail address (as podman's `--sign-by`): a simple-signing
    /// signature in the lookaside area registries.d configures
    #[arg(long = "sign-by", value_name = "KEY|FINGERPRINT")]
    pub sign_by: Option<PathBuf>,
    /// A file whose first line is the key's passphrase (never an argument, which other users
    /// of the machine could see)
    #[arg(
        long = "sign-passphrase-file",
        value_name = "FILE",
        requires = "sign_by"
    )]
    pub passphrase_file: Option<PathBuf>,
    /// Read lookaside areas from DIR's *.yaml files instead of
    /// ~/.config/containers/registries.d (if it exists) or /etc/containers/registries.d
    #[arg(long = "registries.d", value_name = "DIR")]
    pub registries_d: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct SignArgs {
    /// The pushed image: `registry/repository[:tag]` or `…@sha256:…`
    pub reference: String,
    #[command(flatten)]
    pub signing: SigningArgs,
}

impl SigningArgs {
    /// The signing these arguments ask for, its key loaded and unlocked; `None` when they
    /// name no key.
    pub(super) fn prepare(&self) -> Result<Option<Signing>, CommandFailure> {
        let Some(key) = &self.sign_by else {
            return Ok(None);
        };
        Signing::prepare(
            key,
            self.passphrase_file.as_deref(),
            self.registries_d.as_deref(),
        )
        .map(Some)
        .map_err(|err| PublishError::from(err).into())
    }
}

impl From<PublishError> for CommandFailure {
    fn from(err: PublishError) -> Self {
        let code = err.exit_code() as u8;
        match err {
            // The error with its causes (a lookaside file that is a fifo), after the line
            // that says the push itself went through.
            PublishError::NotSigned { pushed, source, .. } => CommandFailure::new(source, code)
                .after(vec![format!("{pushed} was pushed but not signed")]),
            err => CommandFailure::new(err, code),
        }
    }
}

/// The status line of each signature.
pub(super) fn print_signed(signed: &[Signed], printer: &Printer) {
    for s in signed {
        printer.status(
            "Signed",
            format_args!(
                "{} as {} by {} into {}",
                s.digest,
                s.identity,
                s.fingerprint,
                s.path.display()
            ),
        );
    }
}

pub(super) async fn run_sign(
    args: &SignArgs,
    options: &ClientOptions,
    printer: &Printer,
) -> Result<ExitCode, CommandFailure> {
    let Some(signing) = args.signing.prepare()? else {
        return Err(CommandFailure::new("sign needs --sign-by KEY", 2));
    };
    let signed = crate::publish::sign_image(&args.reference, &signing, options).await?;
    print_signed(&signed, printer);
    for s in &signed {
        printer.result(s.path.display().to_string());
    }
    Ok(ExitCode::SUCCESS)
}
