//! The runtime where podman is absent: the layout unpacked by umoci into an OCI runtime
//! bundle, whose `config.json` (umoci's, with the image's user, env and workdir) is given
//! the same confinement the podman run has, then `runc run`. umoci's config already puts
//! the container in a network namespace of its own with no interface but loopback.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::runner::{DRIVER, NOTEBOOK_DIR, RunError, RunPlan};

/// The largest `config.json` read back from umoci.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Unpacks the plan's image into a bundle under `dir` and confines it; the bundle's path.
pub(super) fn bundle(plan: &RunPlan, staged: &Path, dir: &Path) -> Result<PathBuf, RunError> {
    let bundle = dir.join("bundle");
    let image = format!("{}:{}", plan.layout.display(), plan.tag);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut args = vec!["unpack"];
    if !root {
        args.push("--rootless");
    }
    let bundle_arg = bundle.display().to_string();
    args.extend(["--image", &image, &bundle_arg]);
    let output = super::runner::tool("umoci", &args)?;
    if !output.status.success() {
        return Err(RunError::Load {
            reference: image,
            stderr: super::runner::tail(&output.stderr),
        });
    }
    let path = bundle.join("config.json");
    let bytes =
        crate::fs::read_input(&path, MAX_CONFIG_BYTES).map_err(|e| RunError::Stage(e.into()))?;
    let mut config: Value =
        serde_json::from_slice(&bytes).map_err(|e| RunError::Result(e.to_string()))?;
    confine(&mut config, plan, staged)?;
    let text = serde_json::to_vec_pretty(&config).expect("JSON serializes");
    crate::fs::write_atomic(&path, &text).map_err(RunError::Stage)?;
    Ok(bundle)
}

/// The process and mounts of the run in umoci's `config`: the driver as the program, no
/// capabilities, no new privileges, a fresh `/tmp` and the notebook's directory read-only.
fn confine(config: &mut Value, plan: &RunPlan, staged: &Path) -> Result<(), RunError> {
    let process = &mut config["process"];
    process["terminal"] = false.into();
    process["args"] = json!([
        plan.python,
        "-c",
        DRIVER,
        format!("{NOTEBOOK_DIR}/notebook.ipynb"),
        plan.cell_timeout.to_string()
    ]);
    if let Some(env) = process["env"].as_array_mut() {
        env.push("JUPYTER_RUNTIME_DIR=/tmp/imgbuild-jupyter".into());
    }
    if let Some(user) = &plan.user {
        process["user"] = numeric_user(user)?;
    }
    process["capabilities"] = json!({
        "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
    });
    process["noNewPrivileges"] = true.into();
    let mounts = config["mounts"]
        .as_array_mut()
        .ok_or_else(|| RunError::Result("umoci's config.json has no `mounts`".to_string()))?;
    mounts.push(
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=1777"]}),
    );
    mounts.push(json!({"destination": NOTEBOOK_DIR, "type": "bind",
        "source": staged.display().to_string(), "options": ["rbind", "ro"]}));
    Ok(())
}

/// `--user UID[:GID]` as an OCI runtime user; runc resolves no names.
fn numeric_user(user: &str) -> Result<Value, RunError> {
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    match (uid.parse::<u32>(), gid.parse::<u32>()) {
        (Ok(uid), Ok(gid)) => Ok(json!({"uid": uid, "gid": gid})),
        _ => Err(RunError::Image(format!(
            "under runc, `--user` is UID[:GID] in numbers, not `{user}`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umocis_config_is_confined() {
        let plan = RunPlan {
            layout: "images/x".into(),
            tag: "latest".into(),
            user: Some("1000".into()),
            python: "python3".into(),
            cell_timeout: 60,
            max_output: 1,
        };
        let mut config =
            json!({"process": {"env": ["PATH=/bin"], "user": {"uid": 0}}, "mounts": []});
        confine(&mut config, &plan, Path::new("/s")).unwrap();
        assert_eq!(config["process"]["user"], json!({"uid": 1000, "gid": 1000}));
        assert_eq!(config["process"]["args"][0], "python3");
        assert_eq!(config["process"]["capabilities"]["bounding"], json!([]));
        assert_eq!(config["mounts"][1]["options"], json!(["rbind", "ro"]));
        let named = RunPlan {
            user: Some("jovyan".into()),
            ..plan
        };
        assert!(confine(&mut config, &named, Path::new("/s")).is_err());
    }
}
