//! `imgbuild k8s --require-smoke-attestation`: a sample Kyverno `ClusterPolicy` (kyverno.io/v1)
//! that admits a pod of the image's repository only when every imgbuild GPU smoke attestation
//! of its image (`imgbuild smoke --attest`, predicate type [`crate::attest::GPU_SMOKE_V1`]),
//! signed by the policy's key, says `pass` on a GPU of a compute capability the workload's
//! node affinity admits: the GPU class its nodes have.
//!
//! Kyverno reads the attestations as signed sigstore bundles attached to the image as OCI 1.1
//! referrers (`type: SigstoreBundle`), checks them with a static public key and no
//! transparency log (the signatures are made offline), and evaluates the conditions on the
//! predicate, the smoke report, whose fields are the JMESPath roots (`verdict`,
//! `gpu.compute_capability`). Admission comes before scheduling, so the node's own GPU is
//! not known then: the policy holds the image to the same compute capabilities the pod's
//! required node affinity holds its node to, read from the same GPU feature discovery terms.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::NodeSelectorRequirement, apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::Serialize;

use super::{COMPUTE_MAJOR_LABEL, COMPUTE_MINOR_LABEL, K8sError};

/// What the key placeholder of the policy says; the user puts their public key there.
pub(crate) const PUBLIC_KEY_PLACEHOLDER: &str = "-----BEGIN PUBLIC KEY-----\nREPLACE-WITH-THE-PUBLIC-KEY-THAT-SIGNS-THE-SMOKE-ATTESTATIONS\n-----END PUBLIC KEY-----";

/// The comment written above the policy document.
const HEADER: &str = "\
# Sample admission policy (imgbuild k8s --require-smoke-attestation), for Kyverno 1.13 or newer.
# It admits a pod whose image of this repository carries imgbuild GPU smoke attestations
# (`imgbuild smoke IMAGE --attest FILE`, predicate type
# https://imgbuild.dev/attestations/gpu-smoke/v1) that all say `pass`, run on a GPU whose
# compute capability the workload's node affinity admits. Kyverno verifies attestations
# attached to the image as signed sigstore bundles (OCI 1.1 referrers, with the referrers-tag
# fallback), not the statement file nor imgbuild's simple-signing signatures: see the
# book's k8s page (docs/src/commands/k8s.md); e.g. `cosign attest --key cosign.key --type
# https://imgbuild.dev/attestations/gpu-smoke/v1 --predicate PREDICATE IMAGE@DIGEST` (cosign 3,
# or 2.4 to 2.6 with --new-bundle-format). Replace the placeholder below with the PEM public
# key whose private key signs the attestations (cosign.pub); no transparency log is used.
";

/// The GPU class the workload's node affinity targets, as the policy checks it against the
/// attestation's `gpu.compute_capability` (`9.0`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct GpuClass {
    /// Capabilities, `8.*` for a whole major, or `8.6` one by one above a minor.
    pub capabilities: Vec<String>,
    /// Every capability from this major up (the affinity's `major Gt N`: N + 1).
    pub from_major: Option<u32>,
}

impl GpuClass {
    /// The class of the affinity's compute capability terms (ORed; requirements within a term
    /// ANDed, as [`super::compute_terms`] writes them).
    pub(crate) fn of_terms(terms: &[Vec<NodeSelectorRequirement>]) -> GpuClass {
        let mut class = GpuClass::default();
        let values = |r: &NodeSelectorRequirement| r.values.clone().unwrap_or_default();
        for term in terms {
            let find = |key: &str| term.iter().find(|r| r.key == key);
            let Some(major) = find(COMPUTE_MAJOR_LABEL) else {
                continue;
            };
            let minor_above = find(COMPUTE_MINOR_LABEL)
                .filter(|r| r.operator == "Gt")
                .and_then(|r| values(r).first()?.parse::<u32>().ok());
            match (major.operator.as_str(), minor_above) {
                ("In", None) => class
                    .capabilities
                    .extend(values(major).iter().map(|m| format!("{m}.*"))),
                ("In", Some(above)) => {
                    for m in values(major) {
                        class
                            .capabilities
                            .extend((above + 1..=9).map(|minor| format!("{m}.{minor}")));
                    }
                }
                ("Gt", _) => {
                    let from = values(major)
                        .first()
                        .and_then(|n| n.parse::<u32>().ok())
                        .map(|n| n + 1);
                    class.from_major = match (class.from_major, from) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                _ => {}
            }
        }
        class
    }

    /// The class in words, for the policy's messages: `8.*, 9.* or 13.0 and newer`.
    pub(crate) fn describe(&self) -> String {
        let mut parts = self.capabilities.clone();
        if let Some(major) = self.from_major {
            parts.push(format!("{major}.0 and newer"));
        }
        match parts.len() {
            0 => "none".to_string(),
            1 => parts.remove(0),
            _ => {
                let last = parts.pop().unwrap_or_default();
                format!("{} or {last}", parts.join(", "))
            }
        }
    }
}

/// What the policy is about: the workload's name and namespace, the repository its image
/// is pulled from, and the GPU class (none when the workload targets no compute capability).
#[derive(Debug, Clone)]
pub(super) struct SmokePolicyOptions<'a> {
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub repository: &'a str,
    pub gpu_class: Option<&'a GpuClass>,
}

/// A Kyverno `ClusterPolicy` (kyverno.io/v1) with one `verifyImages` rule.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterPolicy {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: PolicySpec,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PolicySpec {
    /// Image verification needs the admission request; Kyverno skips it in background scans.
    pub background: bool,
    pub webhook_configuration: WebhookConfiguration,
    pub rules: Vec<PolicyRule>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WebhookConfiguration {
    pub failure_policy: &'static str,
    pub timeout_seconds: i32,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PolicyRule {
    pub name: String,
    #[serde(rename = "match")]
    pub match_: Match,
    pub verify_images: Vec<ImageVerification>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Match {
    pub any: Vec<ResourceFilter>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ResourceFilter {
    pub resources: ResourceDescription,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ResourceDescription {
    pub kinds: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ImageVerification {
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub image_references: Vec<String>,
    pub failure_action: &'static str,
    /// The manifests reference images by digest already; a tag is refused, not rewritten.
    pub mutate_digest: bool,
    pub verify_digest: bool,
    pub required: bool,
    pub attestations: Vec<Attestation>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Attestation {
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub attestors: Vec<AttestorSet>,
    pub conditions: Vec<AnyAllConditions>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct AttestorSet {
    pub count: u32,
    pub entries: Vec<Attestor>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Attestor {
    pub keys: StaticKey,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StaticKey {
    pub public_keys: String,
    pub rekor: Rekor,
    pub ctlog: CtLog,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rekor {
    pub ignore_tlog: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CtLog {
    #[serde(rename = "ignoreSCT")]
    pub ignore_sct: bool,
}

/// Kyverno's `any`/`all` block: every `all` condition and at least one `any` condition hold.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AnyAllConditions {
    pub all: Vec<Condition>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub any: Vec<Condition>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Condition {
    pub key: String,
    pub operator: &'static str,
    pub value: serde_json::Value,
    pub message: String,
}

/// The policy for `options`.
pub(super) fn cluster_policy(options: &SmokePolicyOptions) -> ClusterPolicy {
    let repository = options.repository.trim_end_matches('/');
    let all = vec![Condition {
        key: "{{ verdict }}".to_string(),
        operator: "Equals",
        value: "pass".into(),
        message: "an imgbuild GPU smoke attestation of the image does not say `pass`".to_string(),
    }];
    let mut any = Vec::new();
    if let Some(class) = options.gpu_class {
        let message = format!(
            "an imgbuild GPU smoke attestation of the image is of a GPU outside the workload's class (compute capability {})",
            class.describe()
        );
        if !class.capabilities.is_empty() {
            any.push(Condition {
                key: "{{ gpu.compute_capability }}".to_string(),
                operator: "AnyIn",
                value: class.capabilities.clone().into(),
                message: message.clone(),
            });
        }
        if let Some(major) = class.from_major {
            any.push(Condition {
                key: "{{ gpu.compute_capability }}".to_string(),
                operator: "GreaterThanOrEquals",
                value: format!("{major}.0").into(),
                message,
            });
        }
    }
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            options.name.to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "imgbuild".to_string(),
        ),
    ]);
    let description = match options.gpu_class {
        Some(class) => format!(
            "Admits pods of {repository} only with signed imgbuild GPU smoke attestations that pass on a GPU of compute capability {}.",
            class.describe()
        ),
        None => format!(
            "Admits pods of {repository} only with signed imgbuild GPU smoke attestations that pass on a GPU."
        ),
    };
    ClusterPolicy {
        api_version: "kyverno.io/v1",
        kind: "ClusterPolicy",
        metadata: ObjectMeta {
            name: Some(format!("{}-gpu-smoke", options.name)),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (
                    "policies.kyverno.io/title".to_string(),
                    "Require a passing imgbuild GPU smoke attestation".to_string(),
                ),
                ("policies.kyverno.io/subject".to_string(), "Pod".to_string()),
                ("policies.kyverno.io/description".to_string(), description),
            ])),
            ..Default::default()
        },
        spec: PolicySpec {
            background: false,
            webhook_configuration: WebhookConfiguration {
                failure_policy: "Fail",
                timeout_seconds: 30,
            },
            rules: vec![PolicyRule {
                name: "gpu-smoke-attestation".to_string(),
                match_: Match {
                    any: vec![ResourceFilter {
                        resources: ResourceDescription {
                            kinds: vec!["Pod".to_string()],
                            namespaces: options.namespace.map(|n| vec![n.to_string()]),
                        },
                    }],
                },
                verify_images: vec![ImageVerification {
                    type_: "SigstoreBundle",
                    image_references: vec![format!("{repository}@*"), format!("{repository}:*")],
                    failure_action: "Enforce",
                    mutate_digest: false,
                    verify_digest: true,
                    required: true,
                    attestations: vec![Attestation {
                        type_: crate::attest::GPU_SMOKE_V1,
                        attestors: vec![AttestorSet {
                            count: 1,
                            entries: vec![Attestor {
                                keys: StaticKey {
                                    public_keys: PUBLIC_KEY_PLACEHOLDER.to_string(),
                                    rekor: Rekor { ignore_tlog: true },
                                    ctlog: CtLog { ignore_sct: true },
                                },
                            }],
                        }],
                        conditions: vec![AnyAllConditions { all, any }],
                    }],
                }],
            }],
        },
    }
}

impl ClusterPolicy {
    /// The policy as a YAML document, with the comment that says what it needs.
    pub(crate) fn to_yaml(&self) -> Result<String, K8sError> {
        let body = super::yaml::to_string(self).map_err(K8sError::Yaml)?;
        Ok(format!("{HEADER}{body}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn the_class_is_the_affinity_compute_capabilities() {
        let class = GpuClass::of_terms(&[
            vec![requirement(COMPUTE_MAJOR_LABEL, "In", &["9", "10"])],
            vec![
                requirement(COMPUTE_MAJOR_LABEL, "In", &["8"]),
                requirement(COMPUTE_MINOR_LABEL, "Gt", &["5"]),
            ],
            vec![requirement(COMPUTE_MAJOR_LABEL, "Gt", &["12"])],
        ]);
        assert_eq!(
            class.capabilities,
            ["9.*", "10.*", "8.6", "8.7", "8.8", "8.9"]
        );
        assert_eq!(class.from_major, Some(13));
        assert_eq!(
            class.describe(),
            "9.*, 10.*, 8.6, 8.7, 8.8, 8.9 or 13.0 and newer"
        );
        assert_eq!(GpuClass::of_terms(&[]).describe(), "none");
    }
}
