//! Simple-signing signatures of what a publish put in a registry, staged where
//! `registries.d` says skopeo and podman will look for them.

use std::path::{Path, PathBuf};

use crate::{
    fs::InputError,
    reference::Reference,
    sign::{KeyringSigner, LookasideError, RegistriesD, SignError, Signer, payload},
};

/// Passphrase files larger than this are refused unread: a passphrase is a line.
const MAX_PASSPHRASE_BYTES: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SigningError {
    #[error("Cannot read the passphrase file `{}`", path.display())]
    Passphrase {
        path: PathBuf,
        #[source]
        source: InputError,
    },
    #[error(transparent)]
    Key(#[from] SignError),
    #[error(transparent)]
    Lookaside(#[from] LookasideError),
}

impl SigningError {
    /// 2 when a signature could not be written (the machine's fault), else 1.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            SigningError::Lookaside(LookasideError::Write { source, .. }) => {
                super::fault::io_exit_code(source)
            }
            _ => 1,
        }
    }
}

/// One signature written.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Signed {
    /// The identity it claims (`registry/repository[:tag]`).
    pub identity: String,
    pub digest: String,
    pub path: PathBuf,
    pub fingerprint: String,
}

/// A key loaded and registries.d read, before anything is pushed: a wrong passphrase or a bad
/// configuration fails the command before the registry changes.
pub(crate) struct Signing {
    signer: Key,
    registries: RegistriesD,
}

/// What `--sign-by` names: a secret key file, or a key of the GnuPG keyring.
enum Key {
    // Boxed: a loaded secret key is a kilobyte, the keyring's a fingerprint.
    File(Box<Signer>),
    Keyring(KeyringSigner),
}

impl Key {
    /// A file that is there is a key file; otherwise a fingerprint, key ID or e-mail
    /// address is looked up in the keyring, as podman's `--sign-by` does.
    fn load(key: &Path, passphrase_file: Option<&Path>) -> Result<Key, SigningError> {
        let name = key.to_string_lossy();
        if !key.exists() && KeyringSigner::names_a_key(&name) {
            // Read here as any passphrase file is (bounded, a regular file), then given to gpg.
            passphrase_file.map(read_passphrase).transpose()?;
            return Ok(Key::Keyring(KeyringSigner::find(&name, passphrase_file)?));
        }
        Ok(Key::File(Box::new(load_key_file(key, passphrase_file)?)))
    }

    fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, SignError> {
        match self {
            Key::File(signer) => signer.sign(payload),
            Key::Keyring(signer) => signer.sign(payload),
        }
    }

    fn fingerprint(&self) -> String {
        match self {
            Key::File(signer) => signer.fingerprint(),
            Key::Keyring(signer) => signer.fingerprint(),
        }
    }
}

impl Signing {
    /// Loads `key` (unlocked with the first line of `passphrase_file`) and the lookaside
    /// areas of `registries_d` (else the default directories).
    pub(crate) fn prepare(
        key: &Path,
        passphrase_file: Option<&Path>,
        registries_d: Option<&Path>,
    ) -> Result<Signing, SigningError> {
        let signer = Key::load(key, passphrase_file)?;
        // The key must unlock now, not after the push.
        signer.sign(b"")?;
        let registries = RegistriesD::load(registries_d)?;
        Ok(Signing { signer, registries })
    }

    /// Signs `digest` as each of `identities`, each into its lookaside area.
    pub(crate) fn sign(
        &self,
        identities: &[Reference],
        digest: &str,
    ) -> Result<Vec<Signed>, SigningError> {
        let now = jiff::Timestamp::now().as_second();
        let mut signed = Vec::new();
        for identity in identities {
            let area = self.registries.staging_for(identity)?;
            let signature = self.signer.sign(&payload::payload(identity, digest, now))?;
            signed.push(Signed {
                identity: payload::docker_reference(identity),
                digest: digest.to_string(),
                path: area.write(identity, digest, &signature)?,
                fingerprint: self.signer.fingerprint(),
            });
        }
        Ok(signed)
    }

    /// Signs the untagged artifact `digest` of `reference`'s repository: its signature
    /// claims the repository.
    pub(crate) fn sign_artifact(
        &self,
        reference: &Reference,
        digest: &str,
    ) -> Result<Vec<Signed>, SigningError> {
        let repository = Reference {
            tag: None,
            digest: None,
            ..reference.clone()
        };
        self.sign(std::slice::from_ref(&repository), digest)
    }
}

/// The OpenPGP secret key file `key`, unlocked with the first line of `passphrase_file`.
pub(crate) fn load_key_file(
    key: &Path,
    passphrase_file: Option<&Path>,
) -> Result<Signer, SigningError> {
    let passphrase = passphrase_file.map(read_passphrase).transpose()?;
    Ok(Signer::load(key, passphrase.as_deref())?)
}

fn read_passphrase(path: &Path) -> Result<String, SigningError> {
    let text = crate::fs::read_input_text(path, MAX_PASSPHRASE_BYTES).map_err(|source| {
        SigningError::Passphrase {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}
