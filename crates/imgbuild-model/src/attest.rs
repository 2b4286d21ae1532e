//! in-toto attestations: a Statement v1 naming its subject (an image, by manifest digest)
//! and carrying a typed predicate. It is the envelope admission policies (Kyverno's
//! `verifyImages` attestations, sigstore's policy-controller, in-toto verifiers) read, so
//! imgbuild's own evidence about an image travels in the form they already check.
//!
//! A leaf: the predicate is plain JSON made by the stage that knows it (the smoke run, the
//! build's provenance).

use serde_json::{Value, json};

/// `_type` of an in-toto Statement v1.
pub const STATEMENT_V1: &str = "https://in-toto.io/Statement/v1";

/// The media type of a Statement (in-toto's), as an attached artifact's type.
pub const MEDIA_TYPE: &str = "application/vnd.in-toto+json";

/// `predicateType` of `imgbuild smoke --attest`: the report of one GPU smoke run of the
/// subject image on one machine.
pub const GPU_SMOKE_V1: &str = "https://imgbuild.dev/attestations/gpu-smoke/v1";

/// `predicateType` of the build provenance every build writes beside its layout
/// (`crate::provenance`): SLSA Provenance v1.
pub const SLSA_PROVENANCE_V1: &str = "https://slsa.dev/provenance/v1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttestError {
    #[error("`{0}` is not a sha256 manifest digest (`sha256:` and 64 hex digits)")]
    Digest(String),
    #[error("an attestation's predicate is a JSON object, not `{0}`")]
    Predicate(String),
}

/// The Statement for the image `name` whose manifest is `manifest_digest`
/// (`sha256:<hex>`), with `predicate` (a JSON object) of `predicate_type`.
pub fn statement(
    name: &str,
    manifest_digest: &str,
    predicate_type: &str,
    predicate: Value,
) -> Result<Value, AttestError> {
    let hex = manifest_digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .ok_or_else(|| AttestError::Digest(manifest_digest.to_string()))?;
    if !predicate.is_object() {
        return Err(AttestError::Predicate(predicate.to_string()));
    }
    Ok(json!({
        "_type": STATEMENT_V1,
        "subject": [{"name": name, "digest": {"sha256": hex}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_names_its_subject_by_digest_and_refuses_what_is_not_one() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let statement = statement(
            "images/x:latest",
            &digest,
            GPU_SMOKE_V1,
            json!({"verdict": "pass"}),
        )
        .unwrap();
        assert_eq!(statement["_type"], STATEMENT_V1);
        assert_eq!(statement["subject"][0]["digest"]["sha256"], "ab".repeat(32));
        assert_eq!(statement["predicate"]["verdict"], "pass");
        for bad in [
            "sha256:AB",
            "md5:00",
            &format!("sha256:{}", "AB".repeat(32)),
        ] {
            assert_eq!(
                super::statement("x", bad, GPU_SMOKE_V1, json!({})),
                Err(AttestError::Digest(bad.to_string()))
            );
        }
        assert!(matches!(
            super::statement("x", &digest, GPU_SMOKE_V1, json!([1])),
            Err(AttestError::Predicate(_))
        ));
    }
}
