//! `imgbuild sign` and `push --sign-by`: simple-signing signatures of pushed images, staged
//! where `registries.d` says skopeo and podman will look for them.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;

use super::printer::{Failure, Printer};
use crate::registry::{ClientOptions, Reference, pull::manifest_descriptor};
use crate::sign::{RegistriesD, Signer, payload::payload};

pub const SIGN_EXAMPLES: &str = "\
Examples:
  imgbuild sign registry.example/ml/torch:2.1 --sign-by release-key.asc
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
pub struct SigningArgs {
    /// Sign with this OpenPGP secret key file (armored or binary, from `gpg
    /// --export-secret-keys`): a simple-signing signature in the lookaside area registries.d
    /// configures
    #[arg(long = "sign-by", value_name = "KEY")]
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
pub struct SignArgs {
    /// The pushed image: `registry/repository[:tag]` or `…@sha256:…`
    pub reference: String,
    #[command(flatten)]
    pub signing: SigningArgs,
}

/// One signature written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Signed {
    /// The identity it claims (`registry/repository[:tag]`).
    pub identity: String,
    pub digest: String,
    pub path: PathBuf,
    pub fingerprint: String,
}

/// A key loaded and registries.d read, before anything is pushed: a wrong passphrase or a bad
/// configuration fails the command before the registry changes.
pub struct Signing {
    signer: Signer,
    registries: RegistriesD,
}

impl Signing {
    /// The signing `args` ask for; `None` when they name no key.
    pub fn prepare(args: &SigningArgs) -> Result<Option<Signing>, Box<dyn std::error::Error>> {
        let Some(key) = &args.sign_by else {
            return Ok(None);
        };
        let passphrase = match &args.passphrase_file {
            Some(path) => Some(read_passphrase(path)?),
            None => None,
        };
        let signer = Signer::load(key, passphrase.as_deref())?;
        // The key must unlock now, not after the push.
        signer.sign(b"")?;
        let registries = RegistriesD::load(args.registries_d.as_deref())?;
        Ok(Some(Signing { signer, registries }))
    }

    /// Signs `digest` as each of `identities`, each into its lookaside area.
    pub fn sign(
        &self,
        identities: &[Reference],
        digest: &str,
    ) -> Result<Vec<Signed>, Box<dyn std::error::Error>> {
        let now = jiff::Timestamp::now().as_second();
        let mut signed = Vec::new();
        for identity in identities {
            let area = self.registries.staging_for(identity)?;
            let signature = self.signer.sign(&payload(identity, digest, now))?;
            signed.push(Signed {
                identity: crate::sign::payload::docker_reference(identity),
                digest: digest.to_string(),
                path: area.write(identity, digest, &signature)?,
                fingerprint: self.signer.fingerprint(),
            });
        }
        Ok(signed)
    }
}

/// Passphrase files larger than this are refused unread: a passphrase is a line.
const MAX_PASSPHRASE_BYTES: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
#[error("Cannot read the passphrase file `{}`", path.display())]
struct PassphraseError {
    path: std::path::PathBuf,
    #[source]
    source: crate::fs::InputError,
}

fn read_passphrase(path: &std::path::Path) -> Result<String, Box<dyn std::error::Error>> {
    let text = crate::fs::read_input_text(path, MAX_PASSPHRASE_BYTES).map_err(|source| {
        PassphraseError {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// The status line of each signature.
pub fn print_signed(signed: &[Signed], printer: &Printer) {
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
) -> Result<ExitCode, Failure> {
    let failure = |err: Box<dyn std::error::Error>| Failure::new(err, 1);
    let Some(signing) = Signing::prepare(&args.signing).map_err(failure)? else {
        return Err(Failure::new("sign needs --sign-by KEY", 2));
    };
    let mut reference = Reference::parse(&args.reference).map_err(|e| failure(e.into()))?;
    if reference.tag.is_none() && reference.digest.is_none() {
        reference.tag = Some("latest".to_string());
    }
    // The digest is the one the registry serves, from its bytes: a signature of a digest
    // nobody can pull would vouch for nothing.
    let client = super::registry::client_for(&reference, options).map_err(failure)?;
    let digest = manifest_descriptor(&client, None)
        .await
        .map_err(|e| failure(e.into()))?
        .digest;
    if let Some(asked) = &reference.digest
        && *asked != digest
    {
        return Err(Failure::new(
            format!("the registry serves {digest} for `{}`", args.reference),
            1,
        ));
    }
    let identity = Reference {
        digest: None,
        ..reference
    };
    let signed = signing.sign(&[identity], &digest).map_err(failure)?;
    print_signed(&signed, printer);
    for s in &signed {
        printer.result(s.path.display().to_string());
    }
    Ok(ExitCode::SUCCESS)
}
