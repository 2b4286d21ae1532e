//! `imgbuild k8s` for the researcher's images (issue 29): a named image user runs as the uid
//! and gid of the image's own /etc/passwd (Kubernetes checks runAsNonRoot only against a
//! number), and `--jupyter` writes a Deployment and a ClusterIP Service for the JupyterLab
//! image of tests/it/jupyter.rs, with its token from a Secret; kubernetes-validate (strict,
//! 1.33 and 1.37) accepts both.

use serde_json::Value;

use crate::{
    common::Project,
    hostile_base::{Base, layer_tar},
    k8s::validated,
    support::{channel::tiny_recipe, jupyter::build_image, shared_channel},
    trust::Canary,
};

const ACCOUNTS: &str = "\n[[accounts.groups]]\nname = \"lab\"\ngid = 2345\n\n\
    [[accounts.users]]\nname = \"analyst\"\nuid = 1234\ngid = 2345\nhome = \"/home/analyst\"\nshell = \"/bin/sh\"\n";

fn security(pod: &Value) -> (&Value, &Value, &Value) {
    let context = &pod["spec"]["securityContext"];
    (
        &context["runAsUser"],
        &context["runAsGroup"],
        &context["runAsNonRoot"],
    )
}

#[test]
fn a_named_image_user_runs_as_the_ids_of_the_images_own_passwd() {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "named", &["hello 1.0"])
        .replace("[image]\n", "[image]\nuser = \"analyst\"\n")
        + ACCOUNTS;
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let run = project.run(&[
        "k8s",
        "images/named",
        "--repository",
        "registry.example/ml/named",
        "--set",
        "gpus=0",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let docs = validated(&project, &run.stdout);
    let pod = &docs[0]["spec"]["template"];
    assert_eq!(
        security(pod),
        (&Value::from(1234), &Value::from(2345), &Value::from(true)),
        "{}",
        run.stdout
    );
    // A group given by name resolves through the image's /etc/group.
    let recipe = recipe.replace("user = \"analyst\"", "user = \"analyst:lab\"");
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let run = project.run(&["k8s", "images/named", "--repository", "r.example/ml/n"]);
    let docs = validated(&project, &run.stdout);
    assert_eq!(security(&docs[0]["spec"]["template"]).1, &Value::from(2345));
    // This image has no JupyterLab: `--jupyter` says so, and prints no manifest.
    let run = project.run(&[
        "k8s",
        "images/named",
        "--repository",
        "r.example/ml/n",
        "--jupyter",
    ]);
    run.assert_failure_naming(1, &["images/named", "has no JupyterLab"]);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

#[test]
fn the_jupyter_deployment_and_service_validate_and_say_how_to_reach_the_lab() {
    let project = Project::new();
    build_image(&project, "jupyter-e2e", "");
    let run = project.run(&[
        "k8s",
        "images/jupyter-e2e",
        "--repository",
        "registry.example/ml/jupyter",
        "--jupyter",
        "--local-port",
        "9999",
        "--set",
        "namespace=research",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let docs = validated(&project, &run.stdout);
    assert_eq!(docs.len(), 2, "{}", run.stdout);
    let (deployment, service) = (&docs[0], &docs[1]);
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    let pod = &deployment["spec"]["template"];
    // The recipe's user is `jovyan`, a name: its uid and gid come from the image.
    assert_eq!(
        security(pod),
        (&Value::from(1000), &Value::from(1000), &Value::from(true))
    );
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["command"][0], "/opt/conda/bin/jupyter");
    assert_eq!(container["command"][1], "lab");
    assert!(
        !run.stdout.contains("allow-root") && !run.stdout.contains("--ServerApp.token"),
        "{}",
        run.stdout
    );
    let token = &container["env"][0];
    assert_eq!(token["name"], "JUPYTER_TOKEN");
    assert_eq!(
        token["valueFrom"]["secretKeyRef"]["name"],
        "jupyter-e2e-jupyter-token"
    );
    assert_eq!(container["ports"][0]["containerPort"], 8888);
    assert_eq!(service["kind"], "Service");
    assert_eq!(service["metadata"]["namespace"], "research");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["selector"], pod["metadata"]["labels"],
        "the Service selects the pod"
    );
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        container["ports"][0]["name"]
    );
    for line in [
        "kubectl -n research create secret generic jupyter-e2e-jupyter-token --from-literal=token=\"$(openssl rand -hex 24)\"",
        "kubectl -n research port-forward service/jupyter-e2e 9999:8888",
        "http://localhost:9999/lab?token=",
    ] {
        assert!(run.stderr.contains(line), "`{line}` in:\n{}", run.stderr);
    }
    // The token is the Secret's alone.
    let run = project.run(&[
        "k8s",
        "images/jupyter-e2e",
        "--repository",
        "registry.example/ml/jupyter",
        "--jupyter",
        "--env",
        "JUPYTER_TOKEN=known",
    ]);
    run.assert_failure_naming(1, &["JUPYTER_TOKEN"]);
}

/// A one-layer base whose `etc/passwd` is a link to `target`, beside a good `etc/group`.
fn linked_passwd_layer(target: &std::path::Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    header.set_mtime(0);
    builder
        .append_link(&mut header, "etc/passwd", target)
        .unwrap();
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(10);
    header.set_mode(0o644);
    header.set_mtime(0);
    builder
        .append_data(&mut header, "etc/group", &b"root:x:0:\n"[..])
        .unwrap();
    builder.into_inner().unwrap()
}

/// An image on a base of one layer, `tar`, whose config names the user `analyst`.
fn image_on(tar: &[u8]) -> Project {
    let project = Project::new();
    Base::write_layer(&project.path().join("base"), tar);
    let recipe = tiny_recipe(shared_channel(), "named", &["hello 1.0"])
        .replace(
            "base = \"scratch\"",
            "base = \"oci:../base:latest\"\nuser = \"analyst\"",
        )
        .replace("platforms", "glibc = \"2.28\"\nplatforms");
    project.write_recipe(&recipe);
    project.build(&[]).success();
    project
}

#[test]
fn a_named_user_is_never_read_through_a_link_nor_past_its_bound() {
    let canary = Canary::new();
    let project = image_on(&linked_passwd_layer(&canary.file()));
    let run = project.run(&["k8s", "images/named", "--repository", "r.example/ml/n"]);
    run.assert_failure_naming(1, &["images/named", "analyst", "is not a regular file"]);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(!run.stderr.contains(&canary.secret), "{}", run.stderr);
    canary.assert_untouched();

    // 5 MiB of /etc/passwd: past the 4 MiB an account file may hold.
    let big = "x:x:1:1::/:/bin/sh\n".repeat(5 << 20 >> 4);
    let project = image_on(&layer_tar(&big));
    let run = project.run(&["k8s", "images/named", "--repository", "r.example/ml/n"]);
    run.assert_failure_naming(1, &["etc/passwd", "the most an account file may hold"]);

    // A name the image's files lack is named, with the file.
    let project = image_on(&layer_tar("root:x:0:0::/root:/bin/sh\n"));
    let run = project.run(&["k8s", "images/named", "--repository", "r.example/ml/n"]);
    run.assert_failure_naming(1, &["`analyst`", "is not in the image's /etc/passwd"]);
}
