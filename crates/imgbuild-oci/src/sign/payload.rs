//! The JSON payload of a simple-signing signature (containers-signature(5)).

use crate::reference::Reference;

/// `critical.type`: the only value consumers accept.
pub(crate) const SIGNATURE_TYPE: &str = "atomic container signature";

/// The payload claiming that `manifest_digest` is the image `identity` names. `identity` is
/// written in the fully explicit form (registry host included), as the format asks; the
/// `optional` object says who made it and when (seconds since the epoch).
pub fn payload(identity: &Reference, manifest_digest: &str, timestamp: i64) -> Vec<u8> {
    let document = serde_json::json!({
        "critical": {
            "type": SIGNATURE_TYPE,
            "image": {"docker-manifest-digest": manifest_digest},
            "identity": {"docker-reference": docker_reference(identity)},
        },
        "optional": {
            "creator": concat!("imgbuild ", env!("CARGO_PKG_VERSION")),
            "timestamp": timestamp,
        },
    });
    serde_json::to_vec(&document).expect("JSON serializes")
}

/// `registry/repository[:tag]`: the identity a signature claims. A digest is never part of
/// it (the digest is `critical.image`); a reference without a tag names the repository,
/// which `matchRepository` policies accept.
pub fn docker_reference(reference: &Reference) -> String {
    let mut text = format!("{}/{}", reference.registry, reference.repository);
    if let Some(tag) = &reference.tag {
        text.push(':');
        text.push_str(tag);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_names_the_digest_and_the_explicit_reference() {
        let reference = Reference::parse("busybox:latest").unwrap();
        let digest = format!("sha256:{}", "ab".repeat(32));
        let bytes = payload(&reference, &digest, 1_483_228_800);
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["critical"]["type"], SIGNATURE_TYPE);
        assert_eq!(
            value["critical"]["image"]["docker-manifest-digest"],
            digest.as_str()
        );
        assert_eq!(
            value["critical"]["identity"]["docker-reference"],
            "docker.io/library/busybox:latest"
        );
        assert_eq!(value["optional"]["timestamp"], 1_483_228_800);
        // Consumers refuse any member of `critical` they do not know.
        assert_eq!(value["critical"].as_object().unwrap().len(), 3);
    }

    #[test]
    fn a_reference_by_digest_claims_its_repository() {
        let digest = format!("sha256:{}", "cd".repeat(32));
        let reference = Reference::parse(&format!("127.0.0.1:5000/ml/app@{digest}")).unwrap();
        assert_eq!(docker_reference(&reference), "127.0.0.1:5000/ml/app");
    }
}
