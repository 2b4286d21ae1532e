//! `[image] ports` and `stop-signal` (issue 17, section 3): written into the image config
//! as skopeo and oci-image-tool read it, shown by `inspect`, compared by `diff`, and refused
//! at the value when they are not what a runtime could use.

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, run_tool, validate_layout},
    support::{channel::tiny_recipe, shared_channel},
};

fn recipe(name: &str, image_lines: &str) -> String {
    tiny_recipe(shared_channel(), name, &["hello 1.0"]).replace(
        "base = \"scratch\"",
        &format!("base = \"scratch\"\n{image_lines}"),
    )
}

fn json(project: &Project, args: &[&str]) -> Value {
    serde_json::from_str(&project.run(args).success().stdout).unwrap()
}

#[test]
fn ports_and_stop_signal_reach_the_config_inspect_and_diff() {
    let project = Project::new();
    let recipes = project.path().join("recipes");
    fs_err::create_dir_all(&recipes).unwrap();
    fs_err::write(recipes.join("plain.toml"), recipe("plain", "")).unwrap();
    fs_err::write(
        recipes.join("served.toml"),
        recipe(
            "served",
            "ports = [\"8888/tcp\", \"53/udp\", \"9000\"]\nstop-signal = \"SIGINT\"",
        ),
    )
    .unwrap();
    project.run(&["build", "recipes/plain.toml"]).success();
    project.run(&["build", "recipes/served.toml"]).success();

    let layout_dir = project.path().join("images/served");
    validate_layout(layout_dir.to_str().unwrap());
    // skopeo reads the config as a runtime would.
    let config: Value = serde_json::from_str(&run_tool(
        "skopeo",
        &[
            "inspect",
            "--config",
            &format!("oci:{}:latest", layout_dir.display()),
        ],
    ))
    .unwrap();
    assert_eq!(
        config["config"]["ExposedPorts"],
        serde_json::json!({"53/udp": {}, "8888/tcp": {}, "9000/tcp": {}}),
        "{config}"
    );
    assert_eq!(config["config"]["StopSignal"], "SIGINT", "{config}");
    // An image without either has neither key: its config is what it was before.
    let plain = LayoutView::new(project.path().join("images/plain")).config();
    assert!(plain["config"].get("ExposedPorts").is_none(), "{plain}");
    assert!(plain["config"].get("StopSignal").is_none(), "{plain}");

    let text = project.run(&["inspect", "images/served"]).success().stdout;
    assert!(
        text.contains("ports        53/udp 8888/tcp 9000/tcp\n"),
        "{text}"
    );
    assert!(text.contains("stop-signal  SIGINT\n"), "{text}");
    let summary = json(&project, &["inspect", "images/served", "--json"]);
    assert_eq!(
        summary["config"]["ports"],
        serde_json::json!(["53/udp", "8888/tcp", "9000/tcp"])
    );
    assert_eq!(summary["config"]["stop_signal"], "SIGINT");
    let plain = json(&project, &["inspect", "images/plain", "--json"]);
    assert!(plain["config"].get("stop_signal").is_none(), "{plain}");

    let text = project
        .run(&["diff", "images/plain", "images/served"])
        .success()
        .stdout;
    assert!(
        text.contains("config       ports: - -> 53/udp 8888/tcp 9000/tcp\n"),
        "{text}"
    );
    assert!(
        text.contains("config       stop-signal: - -> SIGINT\n"),
        "{text}"
    );
    let diff = json(
        &project,
        &["diff", "images/served", "images/plain", "--json"],
    );
    let changes = diff["config"].as_array().unwrap();
    let change = |field: &str| {
        changes
            .iter()
            .find(|c| c["field"] == field)
            .unwrap_or_else(|| panic!("{field} in {diff}"))
    };
    assert_eq!(change("ports")["from"], "53/udp 8888/tcp 9000/tcp");
    assert_eq!(change("ports")["to"], Value::Null);
    assert_eq!(change("stop-signal")["from"], "SIGINT");
    assert_eq!(change("stop-signal")["to"], Value::Null);
}

#[test]
fn a_bad_port_or_stop_signal_is_refused_at_its_line() {
    for (line, needles) in [
        (
            "ports = [\"8888/tcp\", \"70000\"]",
            &["recipes/image.toml:3:", "port `70000` is not a port number"][..],
        ),
        (
            "ports = [\"22/icmp\"]",
            &["recipes/image.toml:3:", "protocol `icmp`"][..],
        ),
        (
            "stop-signal = \"TERM\"",
            &["recipes/image.toml:3:", "write `SIGTERM`"][..],
        ),
    ] {
        let project = Project::new();
        // Line 3: right after `[image]` and `name`.
        let text = tiny_recipe(shared_channel(), "bad", &["hello 1.0"])
            .replace("base = \"scratch\"", &format!("{line}\nbase = \"scratch\""));
        project.write_recipe(&text);
        let run = project.build(&[]);
        run.assert_failure_naming(1, needles);
        project.assert_no_image();
    }
}
