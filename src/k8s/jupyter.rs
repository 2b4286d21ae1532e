//! `imgbuild k8s --jupyter`: the image's JupyterLab as a Deployment of one pod behind a
//! ClusterIP Service, reached from a laptop through `kubectl port-forward`, never exposed
//! outside the cluster. The token comes from a Secret the user creates (so no token is
//! written into a manifest that may be committed), through `JUPYTER_TOKEN`, which
//! jupyter_server reads; the server runs as the image's non-root user.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerPort, EnvVar, EnvVarSource, Probe, SecretKeySelector, Service,
        ServicePort, ServiceSpec, TCPSocketAction,
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

use super::{K8sError, WorkloadOptions};
use crate::inspect::ImageSummary;

/// The port JupyterLab listens on in the pod, and the Service's.
pub(crate) const PORT: i32 = 8888;

/// The port's name, which the Service and the probe refer to.
const PORT_NAME: &str = "jupyter";

/// The Secret's key that holds the token.
const TOKEN_KEY: &str = "token";

/// The Secret the workload `name` reads its token from.
pub(crate) fn token_secret(name: &str) -> String {
    format!("{name}-jupyter-token")
}

/// Why `image` cannot serve JupyterLab as `uid` under `options`, if it cannot.
pub(super) fn check(
    image: &ImageSummary,
    options: &WorkloadOptions,
    uid: i64,
) -> Result<(), K8sError> {
    let refuse = |reason: &str| K8sError::Jupyter {
        image: image.image.clone(),
        reason: reason.to_string(),
    };
    if options.command.is_some() || options.args.is_some() {
        return Err(refuse(
            "runs JupyterLab's own command with `--jupyter`, so `--set command` and `--set args` do not apply",
        ));
    }
    if options.env.iter().any(|(name, _)| name == "JUPYTER_TOKEN") {
        return Err(refuse(
            "reads `JUPYTER_TOKEN` from its Secret with `--jupyter`: drop `--env JUPYTER_TOKEN`",
        ));
    }
    if !image.has_jupyterlab() {
        return Err(refuse(
            "has no JupyterLab (no `jupyterlab` conda package or wheel): add `jupyterlab` to the recipe's `[conda]` or `[pypi]` dependencies",
        ));
    }
    if uid == 0 {
        return Err(refuse(
            "runs as root, and JupyterLab must not (it would need `--allow-root`): give the recipe's `[image] user` a non-root account, or pass `--set user=UID[:GID]`",
        ));
    }
    Ok(())
}

/// `container` made JupyterLab's: its command, port, token and a readiness probe on the
/// port (the API itself answers 403 without the token, which a probe cannot send).
pub(super) fn serve(container: &mut Container, image: &ImageSummary, name: &str) {
    let prefix = image
        .conda
        .as_ref()
        .and_then(|c| c.prefix.clone())
        .unwrap_or_else(|| "/opt/conda".into());
    container.command = Some(vec![
        format!("{}/bin/jupyter", prefix.trim_end_matches('/')),
        "lab".into(),
        "--no-browser".into(),
        "--ip=0.0.0.0".into(),
        format!("--port={PORT}"),
        "--ServerApp.port_retries=0".into(),
    ]);
    container.args = None;
    let token = EnvVar {
        name: "JUPYTER_TOKEN".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: token_secret(name),
                key: TOKEN_KEY.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    container.env.get_or_insert_with(Vec::new).insert(0, token);
    container.ports = Some(vec![ContainerPort {
        name: Some(PORT_NAME.into()),
        container_port: PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    }]);
    container.readiness_probe = Some(Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(5),
        ..Default::default()
    });
}

/// The ClusterIP Service in front of the Deployment's pods (selected by `labels`).
pub(super) fn service(
    name: &str,
    namespace: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: namespace.map(str::to_string),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(labels.clone()),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: PORT,
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The commands that create the token's Secret and reach the lab from a laptop.
pub(crate) fn instructions(name: &str, namespace: Option<&str>, local_port: u16) -> Vec<String> {
    let ns = namespace.map(|n| format!(" -n {n}")).unwrap_or_default();
    let secret = token_secret(name);
    vec![
        format!(
            "kubectl{ns} create secret generic {secret} --from-literal={TOKEN_KEY}=\"$(openssl rand -hex 24)\""
        ),
        "kubectl apply -f MANIFEST.yaml".to_string(),
        format!("kubectl{ns} port-forward service/{name} {local_port}:{PORT}"),
        format!(
            "open http://localhost:{local_port}/lab?token=$(kubectl{ns} get secret {secret} -o jsonpath='{{.data.{TOKEN_KEY}}}' | base64 -d)"
        ),
    ]
}
