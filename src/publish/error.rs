//! What can stop a publish, and the exit code each failure gives.

use crate::{
    oci::read::ReadError,
    reference::ReferenceError,
    registry::{RegistryError, auth::AuthError, push::PushError},
};

use super::{fault::io_exit_code, signing::SigningError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum PublishError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// The target names a digest: a push gives the registry a tag to point at.
    #[error("push to a tag, not a digest: `{0}`")]
    DigestTarget(String),
    #[error("invalid tag `{0}`")]
    InvalidTag(String),
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The registry refused, could not be reached, or could not be talked to.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Push(#[from] PushError),
    /// The pushed image, read back from its layout to attach documents to it.
    #[error(transparent)]
    Layout(#[from] ReadError),
    /// The models beside the layout, found before anything is pushed.
    #[error(transparent)]
    Model(#[from] crate::models::ModelError),
    /// The key, its passphrase or registries.d (read before anything is pushed), or a
    /// signature of an artifact whose attachment was already reported.
    #[error(transparent)]
    Signing(#[from] SigningError),
    /// The push (or attachment) went through, its signing did not: `pushed` is in the
    /// registry now, unsigned.
    #[error("{pushed} was pushed but not signed")]
    NotSigned {
        /// `REF@sha256:…` of what was pushed.
        pushed: String,
        /// Its manifest digest.
        digest: String,
        #[source]
        source: SigningError,
    },
    /// The registry serves another manifest than the digest asked to be signed.
    #[error("the registry serves {served} for `{reference}`")]
    Moved { reference: String, served: String },
}

impl PublishError {
    /// The build's rule: 1 when the input is at fault (the layout, a reference, a key, the
    /// credentials, or what the registry answered), 2 when the machine is (a local read or
    /// write failed, a full disk). Documented in docs/src/reference/exit-codes.md.
    pub(crate) fn exit_code(&self) -> i32 {
        if crate::fs::is_disk_full(self) {
            return 2;
        }
        match self {
            PublishError::Push(PushError::Layout(err)) | PublishError::Layout(err) => {
                read_exit_code(err)
            }
            PublishError::Push(PushError::Blob { source, .. }) => io_exit_code(source),
            PublishError::Signing(err) | PublishError::NotSigned { source: err, .. } => {
                err.exit_code()
            }
            _ => 1,
        }
    }
}

/// A layout that cannot be read is the machine's fault only when the system refused the
/// read; a missing, malformed or mismatched file is the layout's.
fn read_exit_code(err: &ReadError) -> i32 {
    match err {
        ReadError::Read { source, .. } => io_exit_code(source),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use std::{io, path::PathBuf};

    use super::*;
    use crate::sign::LookasideError;

    fn blob(source: io::Error) -> PublishError {
        PublishError::Push(PushError::Blob {
            path: PathBuf::from("blobs/sha256/ab"),
            source,
        })
    }

    #[test]
    fn a_blob_the_system_refuses_is_the_machines_fault_a_missing_one_the_layouts() {
        assert_eq!(
            blob(io::Error::from_raw_os_error(libc::EACCES)).exit_code(),
            2
        );
        assert_eq!(blob(io::Error::from_raw_os_error(libc::EIO)).exit_code(), 2);
        assert_eq!(
            blob(io::Error::from_raw_os_error(libc::ENOENT)).exit_code(),
            1
        );
        // What the bounded readers refuse (a fifo, a link) carries no OS error.
        assert_eq!(
            blob(io::Error::other("is a fifo, not a regular file")).exit_code(),
            1
        );
        let wrapped = fs_err::metadata("/proc/self/fd/999999/x").unwrap_err();
        assert_eq!(
            blob(wrapped).exit_code(),
            1,
            "a missing file stays the layout's"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        fs_err::write(&file, "").unwrap();
        let wrapped = fs_err::create_dir_all(file.join("x")).unwrap_err();
        assert_eq!(
            blob(wrapped).exit_code(),
            2,
            "fs_err keeps the OS error as a cause"
        );
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(blob(full).exit_code(), 2);
    }

    #[test]
    fn a_signature_that_cannot_be_written_after_the_push_exits_2() {
        let not_signed = PublishError::NotSigned {
            pushed: "127.0.0.1:5000/ml/app:v1@sha256:ab".to_string(),
            digest: "sha256:ab".to_string(),
            source: SigningError::Lookaside(LookasideError::Write {
                path: PathBuf::from("/sigs/ml/app@sha256=ab/signature-1"),
                source: io::Error::from_raw_os_error(libc::ENOTDIR),
            }),
        };
        assert_eq!(not_signed.exit_code(), 2);
        assert_eq!(
            not_signed.to_string(),
            "127.0.0.1:5000/ml/app:v1@sha256:ab was pushed but not signed"
        );
        let bad_name = SigningError::Lookaside(LookasideError::BadName {
            reference: "a/../b".to_string(),
        });
        assert_eq!(PublishError::Signing(bad_name).exit_code(), 1);
        assert_eq!(PublishError::InvalidTag("-x".to_string()).exit_code(), 1);
    }
}
