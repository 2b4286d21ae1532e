//! The Jupyter-over-SSH workflow of the second design document, end to end (issue 17): a
//! JupyterLab image built from JupyterLab's real PyPI wheels through `[pypi]` (no conda
//! channel is reachable here), over the venv `python` 3.9 on Debian bullseye that the PyPI
//! tests use, with a non-root user from `[accounts]`, port 8888 exposed and the token
//! required. It runs under podman with 8888 published on 127.0.0.1 only, and is driven
//! through Jupyter's REST API (contents, kernel specs) and `jupyter execute` (nbclient) as
//! the image's user.

use std::{net::TcpListener, path::Path, process::Command};

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, require_root},
    support::{
        jupyter,
        podman::{Podman, Storage},
    },
};

const TOKEN: &str = "imgbuild-test-token";

/// A running container, removed when dropped.
struct Container<'a> {
    podman: &'a Podman,
    name: String,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.podman.command(&["rm", "-f", &self.name]).output();
    }
}

/// `curl` of `url` on the published port: (HTTP status, body).
pub(crate) fn http(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-X", method, "-w", "\n%{http_code}", url]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: token {token}")]);
    }
    if let Some(body) = body {
        command.args(["-H", "Content-Type: application/json", "--data-binary"]);
        command.arg(body.to_string());
    }
    let output = command.output().expect("running curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until the server answers on `base` (any HTTP status); the logs when it never does.
fn wait_for_server(podman: &Podman, container: &str, base: &str) {
    // A bound on the wait, not a timing: a server that never starts must not hang the suite.
    for _ in 0..600 {
        if http("GET", &format!("{base}/api"), None, None).0 != 0 {
            return;
        }
        let running = podman.ok(&["inspect", "-f", "{{.State.Running}}", container]);
        if running.trim() != "true" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let logs = podman.command(&["logs", container]).output().unwrap();
    panic!(
        "JupyterLab never answered on {base}:\n{}{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    );
}

/// A notebook of one cell that prints who runs it.
fn notebook() -> Value {
    serde_json::json!({
        "type": "notebook",
        "format": "json",
        "content": {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{
                "cell_type": "code",
                "id": "c1",
                "metadata": {},
                "execution_count": null,
                "outputs": [],
                "source": "import os, sys\nprint('cell ran as', os.getuid(), 'in', sys.prefix, 6 * 7)"
            }]
        }
    })
}

#[test]
fn a_jupyterlab_image_serves_its_kernel_to_its_user_behind_the_token() {
    require_root!("podman's rootful runs need root here");
    let project = Project::new();
    jupyter::build_image(&project, "jupyter-e2e", "");
    let layout = LayoutView::new(project.path().join("images/jupyter-e2e"));
    let config = layout.config();
    assert_eq!(config["config"]["User"], "jovyan");
    assert_eq!(config["config"]["WorkingDir"], "/home/jovyan/work");
    assert_eq!(
        config["config"]["ExposedPorts"],
        serde_json::json!({"8888/tcp": {}})
    );

    let podman = Podman::new(&project.path().join("podman"), Storage::Vfs).unwrap();
    let layout_dir = project.path().join("images/jupyter-e2e");
    // Copied under a name of our own: podman names an `oci:` image after its path, which a
    // temporary directory's capitals make invalid.
    let image = "localhost/jupyter-e2e:latest";
    let storage = podman.storage_reference(image);
    crate::common::run_tool(
        "skopeo",
        &[
            "copy",
            "-q",
            &format!("oci:{}:latest", layout_dir.display()),
            &storage,
        ],
    );
    let port = free_port();
    let container = Container {
        podman: &podman,
        name: format!("imgbuild-jupyter-{port}"),
    };
    podman.ok(&[
        "run",
        "-d",
        "--name",
        &container.name,
        "-p",
        &format!("127.0.0.1:{port}:8888"),
        "-e",
        &format!("JUPYTER_TOKEN={TOKEN}"),
        image,
    ]);
    let base = format!("http://127.0.0.1:{port}");
    wait_for_server(&podman, &container.name, &base);

    // The token is required.
    let (refused, _) = http("GET", &format!("{base}/api/kernelspecs"), None, None);
    assert_eq!(refused, 403, "the API answers without the token");
    let (wrong, _) = http(
        "GET",
        &format!("{base}/api/kernelspecs"),
        Some("not-the-token"),
        None,
    );
    assert_eq!(wrong, 403, "the API answers a wrong token");
    let (ok, specs) = http("GET", &format!("{base}/api/kernelspecs"), Some(TOKEN), None);
    assert_eq!(ok, 200, "{specs}");

    // The environment's ipykernel is the registered kernel.
    let specs: Value = serde_json::from_str(&specs).unwrap();
    assert_eq!(specs["default"], "python3", "{specs}");
    let argv = &specs["kernelspecs"]["python3"]["spec"]["argv"];
    assert_eq!(argv[1], "-m", "{specs}");
    assert_eq!(argv[2], "ipykernel_launcher", "{specs}");

    // The server runs as the recipe's user, not root.
    // (The bullseye base holds python3.9 and what it needs, no coreutils.)
    let status = podman.ok(&[
        "exec",
        &container.name,
        "/opt/conda/bin/python",
        "-c",
        "print(open('/proc/1/status').read())",
    ]);
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap();
    assert_eq!(uid, "1000", "{status}");

    // A notebook written through the contents API (into the user's workdir) runs in the
    // environment's kernel, and its output comes back through the API.
    let (created, body) = http(
        "PUT",
        &format!("{base}/api/contents/hello.ipynb"),
        Some(TOKEN),
        Some(&notebook()),
    );
    assert!(created == 201 || created == 200, "{created}: {body}");
    let executed = podman.ok(&[
        "exec",
        &container.name,
        "/opt/conda/bin/jupyter",
        "execute",
        "--inplace",
        "/home/jovyan/work/hello.ipynb",
    ]);
    let (read, body) = http(
        "GET",
        &format!("{base}/api/contents/hello.ipynb"),
        Some(TOKEN),
        None,
    );
    assert_eq!(read, 200, "{body}");
    let read: Value = serde_json::from_str(&body).unwrap();
    let output = &read["content"]["cells"][0]["outputs"][0];
    assert_eq!(
        output["text"].as_str().map(str::trim),
        Some("cell ran as 1000 in /opt/conda 42"),
        "{executed}{read}"
    );
    transcript(project.path(), &specs, output);
}

/// What the run showed, for the README's evidence section (printed with `--nocapture`).
fn transcript(dir: &Path, specs: &Value, output: &Value) {
    let text = format!(
        "kernelspecs: {}\ncell output: {}\n",
        specs["kernelspecs"]["python3"]["spec"], output["text"]
    );
    fs_err::write(dir.join("jupyter-transcript.txt"), &text).unwrap();
    eprintln!("{text}");
}

#[test]
fn the_wheel_pins_are_well_formed() {
    let wheels = jupyter::pinned_wheels();
    assert_eq!(wheels.len(), 95);
    for wheel in &wheels {
        assert!(wheel.file_name.ends_with(".whl"), "{}", wheel.file_name);
        assert!(wheel.url.ends_with(wheel.file_name), "{}", wheel.url);
        assert_eq!(wheel.sha256.len(), 64, "{}", wheel.file_name);
    }
    assert!(
        wheels
            .iter()
            .any(|w| w.file_name.starts_with("jupyterlab-4.3.8-"))
    );
}
