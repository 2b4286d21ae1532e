//! Signing with a key of the user's GnuPG keyring, as `podman push --sign-by FINGERPRINT`
//! does through gpgme: gpg itself signs, its agent holding the secret key and its
//! passphrase, so the key never leaves the keyring. The signature is the same "Signed
//! Message" a key file gives (see [`super::openpgp`]).

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::compression::bounded::{Bound, read_to_end_bounded};

use super::openpgp::SignError;

/// The most gpg may print for one signature or one key listing: a signature is the payload
/// (under 1 KiB) and a few hundred bytes; a keyring's listing of one key is a few KiB.
const MAX_GPG_OUTPUT: u64 = 1 << 20;

const NO_KEY: &str = "the GnuPG keyring (GNUPGHOME, else ~/.gnupg) has no secret key of that name";
/// How a failure of gpg itself (not of starting it) begins.
const GPG_EXITED: &str = "gpg exited";

/// A key of the GnuPG keyring (`GNUPGHOME`, else `~/.gnupg`), found by the fingerprint,
/// key ID or e-mail address the user gave.
#[derive(Debug, Clone)]
pub struct KeyringSigner {
    /// The primary key's fingerprint, upper-case hex.
    fingerprint: String,
    passphrase_file: Option<PathBuf>,
}

impl KeyringSigner {
    /// Whether `text`, given to `--sign-by` and naming no file, is what gpg finds a key by:
    /// a fingerprint or key ID (hex, `0x` allowed) or an e-mail address.
    pub fn names_a_key(text: &str) -> bool {
        let hex = text.strip_prefix("0x").unwrap_or(text);
        let is_hex =
            matches!(hex.len(), 8 | 16 | 40 | 64) && hex.bytes().all(|b| b.is_ascii_hexdigit());
        let is_mail = text.contains('@') && !text.contains(['/', ' ']) && !text.starts_with('-');
        is_hex || is_mail
    }

    /// The one secret key of the keyring that `id` names. None, or more than one, is an
    /// error naming `id`: gpg would otherwise sign with whichever it lists first.
    pub fn find(id: &str, passphrase_file: Option<&Path>) -> Result<KeyringSigner, SignError> {
        let listing =
            gpg(id, &["--with-colons", "--list-secret-keys", "--", id], None).map_err(|err| {
                match err {
                    // gpg's listing of a name it has no key of ends in "No secret key".
                    SignError::Keyring { id, reason } if reason.starts_with(GPG_EXITED) => {
                        SignError::Keyring {
                            id,
                            reason: format!("{NO_KEY} ({reason})"),
                        }
                    }
                    other => other,
                }
            })?;
        let fingerprints = primary_fingerprints(&String::from_utf8_lossy(&listing));
        match fingerprints.as_slice() {
            [fingerprint] => Ok(KeyringSigner {
                fingerprint: fingerprint.clone(),
                passphrase_file: passphrase_file.map(Path::to_path_buf),
            }),
            [] => Err(SignError::Keyring {
                id: id.to_string(),
                reason: NO_KEY.into(),
            }),
            many => Err(SignError::Keyring {
                id: id.to_string(),
                reason: format!(
                    "it names {} secret keys ({}); give the fingerprint of one",
                    many.len(),
                    many.join(", ")
                ),
            }),
        }
    }

    pub fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    /// `payload` as a signed message made by the primary key (`FINGERPRINT!`: not a signing
    /// subkey, since containers/image matches primary keys), uncompressed as a key file's is.
    pub fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, SignError> {
        let user = format!("{}!", self.fingerprint);
        let mut args = vec!["--local-user", &user, "--compress-algo", "none", "--sign"];
        let passphrase_file;
        if let Some(file) = &self.passphrase_file {
            passphrase_file = file.display().to_string();
            args.splice(
                0..0,
                [
                    "--pinentry-mode",
                    "loopback",
                    "--passphrase-file",
                    &passphrase_file,
                ],
            );
        }
        gpg(&self.fingerprint, &args, Some(payload))
    }
}

/// The fingerprints of the primary keys in gpg's `--with-colons` listing: each `fpr` record
/// that follows a `sec` (a subkey's follows `ssb`).
fn primary_fingerprints(listing: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut after_primary = false;
    for line in listing.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.first().copied() {
            Some("sec") => after_primary = true,
            Some("fpr") if after_primary => {
                if let Some(fpr) = fields.get(9).filter(|f| !f.is_empty()) {
                    found.push(fpr.to_ascii_uppercase());
                }
                after_primary = false;
            }
            Some("ssb" | "sub") => after_primary = false,
            _ => {}
        }
    }
    found
}

/// Runs `gpg --batch --no-tty ARGS` with `stdin`, returning its stdout (at most
/// [`MAX_GPG_OUTPUT`]). A failure carries gpg's own last line, which names the problem
/// (`No secret key`, `Bad passphrase`).
fn gpg(id: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, SignError> {
    let fail = |reason: String| SignError::Keyring {
        id: id.to_string(),
        reason,
    };
    let mut child = Command::new("gpg")
        .args(["--batch", "--no-tty"])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            fail(format!(
                "cannot run `gpg` (GnuPG), which signs with a keyring's key: {e}"
            ))
        })?;
    if let (Some(bytes), Some(mut input)) = (stdin, child.stdin.take()) {
        // A payload is under 1 KiB: the pipe takes it before gpg answers.
        input.write_all(bytes).map_err(|e| fail(e.to_string()))?;
    }
    let bound = Bound::new(
        MAX_GPG_OUTPUT,
        "gpg's output",
        "one signature or key listing",
    );
    let stdout = child.stdout.take().expect("piped");
    let out = read_to_end_bounded(stdout, bound).map_err(|e| fail(e.to_string()))?;
    let stderr = child.stderr.take().expect("piped");
    let err = read_to_end_bounded(
        stderr,
        Bound::new(MAX_GPG_OUTPUT, "gpg's messages", "its messages"),
    )
    .unwrap_or_default();
    let status = child.wait().map_err(|e| fail(e.to_string()))?;
    if !status.success() {
        let said = String::from_utf8_lossy(&err);
        let last = said
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(fail(format!("{GPG_EXITED} with {status}: {}", last.trim())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ids_and_addresses_name_keys_and_paths_do_not() {
        for id in [
            "0x1234ABCD",
            "89ABCDEF01234567",
            "A1B2C3D4E5F60718293A4B5C6D7E8F9012345678",
            "release@example.org",
        ] {
            assert!(KeyringSigner::names_a_key(id), "{id}");
        }
        for not in [
            "key.asc",
            "keys/release.asc",
            "--homedir=/tmp",
            "1234",
            "a@b/c",
        ] {
            assert!(!KeyringSigner::names_a_key(not), "{not}");
        }
    }

    #[test]
    fn only_primary_key_fingerprints_are_taken_from_a_listing() {
        let listing = "sec:u:255:22:AAAA:1700000000:::u:::scESC:::+:::ed25519:::0:\n\
            fpr:::::::::A1B2C3D4E5F60718293A4B5C6D7E8F9012345678:\n\
            grp:::::::::0123:\n\
            uid:u::::1700000000::HASH::Release <release@example.org>::::::::::0:\n\
            ssb:u:255:18:BBBB:1700000000::::::e:::+:::cv25519::\n\
            fpr:::::::::FFFFEEEEDDDDCCCCBBBBAAAA9999888877776666:\n";
        assert_eq!(
            primary_fingerprints(listing),
            ["A1B2C3D4E5F60718293A4B5C6D7E8F9012345678"]
        );
    }
}
