//! `--build-job --shards N`: how the variant pods (the assembly) wait for the shards Job.
//! Kubernetes has no dependencies between Jobs, so each assembly pod starts with two init
//! containers that read the shards Job through the API, under a ServiceAccount whose Role may
//! read that one Job and nothing else.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{Container, EnvVar, SecurityContext, ServiceAccount, VolumeMount},
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::container_security;

/// `--kubectl-image`'s default: the Kubernetes project's own kubectl image, of the API version
/// the manifests are written for. It is distroless (kubectl, CA certificates, no shell), so
/// the waits below are plain `kubectl` commands.
pub(crate) const DEFAULT_KUBECTL_IMAGE: &str = "registry.k8s.io/kubectl:v1.33.0";

/// How long an assembly pod waits for the shards Job to finish before it fails: longer than
/// compressing a matrix's layers should ever take, short enough that a stuck shard does not
/// hold the assembly pods' CPU and memory requests for good.
const SHARDS_TIMEOUT: &str = "24h";

/// The status of the shards Job's terminal condition, once it has one. `kubectl wait` takes
/// one condition and its JSONPath has no `||`, but its filters compare strings: of the Job
/// condition types (`Complete`, `Failed`, `FailureTarget`, `SuccessCriteriaMet`,
/// `Suspended`) exactly the two terminal ones sort before `Failed~`, and a Job never has
/// both. So this is `True` as soon as the Job has completed or failed, and empty before.
const TERMINAL_STATUS: &str = r#"{.status.conditions[?(@.type<"Failed~")].status}"#;

/// The ServiceAccount, Role and RoleBinding (all named `account`) and the init containers
/// that hold the assembly pods back until the Job `shards_job` has completed.
pub(super) struct ShardWait<'a> {
    pub account: &'a str,
    pub namespace: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
    pub shards_job: &'a str,
    pub kubectl_image: &'a str,
}

impl ShardWait<'_> {
    fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            name: Some(self.account.to_string()),
            namespace: self.namespace.map(str::to_string),
            labels: Some(self.labels.clone()),
            ..Default::default()
        }
    }

    /// The identity the assembly pods run as.
    pub(super) fn service_account(&self) -> ServiceAccount {
        ServiceAccount {
            metadata: self.metadata(),
            ..Default::default()
        }
    }

    /// Reading the shards Job and nothing else: `kubectl wait` gets it, then lists and
    /// watches it with a `metadata.name` field selector, which is what lets RBAC hold
    /// `list` and `watch` to the one name.
    pub(super) fn role(&self) -> Role {
        Role {
            metadata: self.metadata(),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["batch".into()]),
                resources: Some(vec!["jobs".into()]),
                resource_names: Some(vec![self.shards_job.to_string()]),
                verbs: ["get", "list", "watch"].map(str::to_string).to_vec(),
                ..Default::default()
            }]),
        }
    }

    /// The Role for the ServiceAccount. Without `--set namespace` the subject names none: a
    /// RoleBinding's ServiceAccount is then the one of the binding's own namespace, wherever
    /// `kubectl apply` puts them.
    pub(super) fn role_binding(&self) -> RoleBinding {
        RoleBinding {
            metadata: self.metadata(),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: self.account.to_string(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: self.account.to_string(),
                namespace: self.namespace.map(str::to_string),
                ..Default::default()
            }]),
        }
    }

    /// Two waits, in order (init containers run one after the other): the first until the
    /// shards Job has completed or failed, so a failed shard fails the assembly at once
    /// rather than after the timeout; the second checks once (`--timeout=0s`) that it
    /// completed, and fails the pod otherwise. The shards Job is written before the
    /// assembly, so `kubectl apply` has created it by the time these run. `home` is a
    /// scratch volume for kubectl's discovery cache: the root file system is read-only.
    pub(super) fn init_containers(&self, home: &VolumeMount) -> Vec<Container> {
        let job = format!("job/{}", self.shards_job);
        vec![
            self.kubectl(
                "wait-for-shards",
                [
                    "wait",
                    &job,
                    &format!("--for=jsonpath={TERMINAL_STATUS}=True"),
                    &format!("--timeout={SHARDS_TIMEOUT}"),
                ],
                home,
            ),
            self.kubectl(
                "shards-complete",
                ["wait", &job, "--for=condition=Complete", "--timeout=0s"],
                home,
            ),
        ]
    }

    /// A container running `kubectl ARGS` as the pod's non-root user, on a read-only root.
    fn kubectl(&self, name: &str, args: [&str; 4], home: &VolumeMount) -> Container {
        Container {
            name: name.into(),
            image: Some(self.kubectl_image.to_string()),
            // `kubectl` by name, not the image's entrypoint: any image with kubectl on its
            // PATH does.
            command: Some(vec!["kubectl".into()]),
            args: Some(args.map(str::to_string).to_vec()),
            env: Some(vec![EnvVar {
                name: "HOME".into(),
                value: Some(home.mount_path.clone()),
                ..Default::default()
            }]),
            volume_mounts: Some(vec![home.clone()]),
            security_context: Some(SecurityContext {
                read_only_root_filesystem: Some(true),
                ..container_security()
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter's bound against every condition type batch/v1 Jobs have (Kubernetes 1.33):
    /// Go compares strings byte by byte, as Rust does.
    #[test]
    fn the_filter_holds_for_the_terminal_conditions_only() {
        let bound = TERMINAL_STATUS.split('"').nth(1).expect("a quoted bound");
        let terminal: Vec<&str> = [
            "Complete",
            "Failed",
            "FailureTarget",
            "SuccessCriteriaMet",
            "Suspended",
        ]
        .into_iter()
        .filter(|t| *t < bound)
        .collect();
        assert_eq!(terminal, ["Complete", "Failed"]);
    }
}
