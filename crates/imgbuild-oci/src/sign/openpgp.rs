//! Signing a payload with an OpenPGP secret key file, as `gpg --sign` would: a "Signed
//! Message" (RFC 4880 section 11.3) holding the payload as literal data, the form
//! containers/image verifies. rPGP does the OpenPGP work; no gpg agent or keyring is needed,
//! so a build pod signs with a key mounted from a secret.

use std::path::{Path, PathBuf};

use pgp::{
    composed::{Deserializable, MessageBuilder, SignedSecretKey},
    crypto::hash::HashAlgorithm,
    types::{KeyDetails, Password},
};

/// Key files larger than this are refused unread: an armored RSA-4096 secret key with its
/// subkeys and signatures is a few KiB, one with a photo ID some hundred; a 5 GiB file must
/// not be loaded to find out it is not a key.
pub(crate) const MAX_KEY_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("Cannot read the signing key `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`{}` is not an OpenPGP secret key (export one with `gpg --export-secret-keys --armor FINGERPRINT`): {reason}",
        path.display()
    )]
    NotAKey { path: PathBuf, reason: String },
    #[error("The signing key `{}` cannot sign (wrong passphrase, or a key without a signing part?): {reason}", path.display())]
    Sign { path: PathBuf, reason: String },
    /// `--sign-by` naming a key of the GnuPG keyring.
    #[error("Cannot sign with `{id}` of the GnuPG keyring: {reason}")]
    Keyring { id: String, reason: String },
}

/// A secret key ready to sign, with its passphrase.
pub struct Signer {
    key: SignedSecretKey,
    /// Kept as text: rPGP's `Password` is consumed by each signing.
    passphrase: Option<String>,
    path: PathBuf,
}

impl Signer {
    /// Loads the secret key in `path`, ASCII-armored or binary, as `gpg
    /// --export-secret-keys` writes it. `passphrase` unlocks it when it is protected.
    pub fn load(path: &Path, passphrase: Option<&str>) -> Result<Signer, SignError> {
        // A regular file, bounded, opened without blocking (a fifo is refused, not waited
        // on). A link is followed: a Kubernetes secret volume mounts its keys as links.
        let key: SignedSecretKey = read_key(path)?;
        key.verify_bindings().map_err(not_a_key(path))?;
        Ok(Signer {
            key,
            passphrase: passphrase.map(str::to_string),
            path: path.to_path_buf(),
        })
    }

    /// The primary key's fingerprint, upper-case hex as gpg prints it.
    pub fn fingerprint(&self) -> String {
        hex::encode_upper(self.key.primary_key.fingerprint().as_bytes())
    }

    /// `payload` as a signed message, made by the primary key (containers/image matches the
    /// signer against the fingerprints of the keys a policy trusts, which are primary keys).
    pub fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, SignError> {
        let mut builder = MessageBuilder::from_bytes("", payload.to_vec());
        builder.sign(
            &self.key.primary_key,
            self.passphrase
                .as_deref()
                .map_or_else(Password::empty, Password::from),
            HashAlgorithm::Sha256,
        );
        builder
            .to_vec(rand::thread_rng())
            .map_err(|err| SignError::Sign {
                path: self.path.clone(),
                reason: err.to_string(),
            })
    }
}

/// The key in `path`, ASCII-armored or binary: a regular file of at most [`MAX_KEY_BYTES`],
/// read without blocking.
fn read_key<K: Deserializable>(path: &Path) -> Result<K, SignError> {
    let bytes = crate::fs::read_input(path, MAX_KEY_BYTES).map_err(|source| SignError::Read {
        path: path.to_path_buf(),
        source: source.into(),
    })?;
    let not_a_key = not_a_key(path);
    if bytes.starts_with(b"-----BEGIN PGP") {
        Ok(K::from_armor_single(bytes.as_slice()).map_err(not_a_key)?.0)
    } else {
        K::from_bytes(bytes.as_slice()).map_err(not_a_key)
    }
}

/// How an OpenPGP error about the key in `path` is told.
fn not_a_key(path: &Path) -> impl Fn(pgp::errors::Error) -> SignError + '_ {
    move |err| SignError::NotAKey {
        path: path.to_path_buf(),
        reason: err.to_string(),
    }
}

/// The largest signed message [`Verifier::payload`] reads: a signature over a few hundred
/// bytes of payload.
const MAX_SIGNED_BYTES: usize = 64 << 10;

/// A public key that checks signed messages (`--cache-verify-key`), as gpg would.
pub struct Verifier {
    key: pgp::composed::SignedPublicKey,
    path: PathBuf,
}

impl Verifier {
    /// Loads the public key in `path`, ASCII-armored or binary, as `gpg --export` writes it.
    pub fn load(path: &Path) -> Result<Verifier, SignError> {
        let key: pgp::composed::SignedPublicKey = read_key(path)?;
        key.verify_bindings().map_err(not_a_key(path))?;
        Ok(Verifier {
            key,
            path: path.to_path_buf(),
        })
    }

    /// The primary key's fingerprint, upper-case hex as gpg prints it.
    pub fn fingerprint(&self) -> String {
        hex::encode_upper(self.key.primary_key.fingerprint().as_bytes())
    }

    /// The payload of `signed`, a signed message (compressed or not, as [`Signer::sign`] and
    /// gpg write them), once its signature is this key's primary key's; else why not.
    pub fn payload(&self, signed: &[u8]) -> Result<Vec<u8>, String> {
        if signed.len() > MAX_SIGNED_BYTES {
            return Err(format!("a signature of {} bytes", signed.len()));
        }
        let mut message = pgp::composed::Message::from_bytes(signed)
            .map_err(|e| format!("not an OpenPGP message: {e}"))?;
        if message.is_compressed() {
            message = message
                .decompress()
                .map_err(|e| format!("its compression: {e}"))?;
        }
        if !message.is_signed() {
            return Err("an OpenPGP message without a signature".into());
        }
        let payload = crate::fs::read_stream(&mut message, MAX_SIGNED_BYTES as u64)
            .map_err(|e| format!("its payload {e}"))?;
        message.verify(&self.key.primary_key).map_err(|e| {
            format!(
                "not signed by {} ({}): {e}",
                self.fingerprint(),
                self.path.display()
            )
        })?;
        Ok(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_read_back_only_with_the_signers_key() {
        use pgp::composed::{KeyType, SecretKeyParamsBuilder};
        let make = |id: &str| {
            let params = SecretKeyParamsBuilder::default()
                .key_type(KeyType::Ed25519Legacy)
                .can_sign(true)
                .primary_user_id(id.into())
                .build()
                .unwrap();
            params.generate(rand::thread_rng()).unwrap()
        };
        let (ours, theirs) = (make("ours <a@example>"), make("theirs <b@example>"));
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, key: &pgp::composed::SignedSecretKey, public: bool| {
            let path = dir.path().join(name);
            let bytes = if public {
                key.to_public_key().to_armored_bytes(None.into()).unwrap()
            } else {
                key.to_armored_bytes(None.into()).unwrap()
            };
            fs_err::write(&path, bytes).unwrap();
            path
        };
        let signer = Signer::load(&write("ours.asc", &ours, false), None).unwrap();
        let signed = signer.sign(b"the entry").unwrap();
        let verifier = Verifier::load(&write("ours.pub", &ours, true)).unwrap();
        assert_eq!(verifier.payload(&signed).unwrap(), b"the entry");
        let other = Verifier::load(&write("theirs.pub", &theirs, true)).unwrap();
        assert!(other.payload(&signed).is_err());
        let mut flipped = signed.clone();
        let last = flipped.len() - 5;
        flipped[last] ^= 1;
        assert!(verifier.payload(&flipped).is_err());
        assert!(verifier.payload(b"not a message").is_err());
    }
}
