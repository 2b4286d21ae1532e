//! Image signatures in containers/image's "simple signing" format, as `skopeo copy
//! --sign-by` writes them and `podman pull` / `skopeo copy` check them under a `signedBy`
//! policy (containers-signature(5)): an OpenPGP signed message whose payload is a JSON
//! document naming the manifest digest and the reference the signer vouches for.
//!
//! The three parts are plain data in, bytes out, and know nothing of registries:
//! [`payload`] makes the JSON, [`openpgp`] signs it with a key file (or [`gnupg`] with a key
//! of the user's GnuPG keyring, as podman's `--sign-by FINGERPRINT`), [`lookaside`] finds
//! where `registries.d` says signatures of a reference are staged and writes them there.

pub(crate) mod gnupg;
pub(crate) mod lookaside;
pub(crate) mod openpgp;
pub mod payload;

pub use gnupg::KeyringSigner;
pub use lookaside::{LookasideError, RegistriesD};
pub use openpgp::{SignError, Signer, Verifier};
