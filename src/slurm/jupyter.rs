//! `imgbuild slurm --jupyter`: the image's JupyterLab as a batch job that a laptop reaches
//! through an SSH port forward over the login node.
//!
//! The job picks a port that is free on its node when it starts, and a token from the
//! kernel's random source; both reach the server through `JUPYTER_PORT` and `JUPYTER_TOKEN`
//! (which jupyter_server reads), never through its command line, which every user of the node
//! can read in `ps`. The job's output file, where the tunnel line and the token go, is made
//! readable by the job's user alone. When Slurm ends the job (its time limit, `scancel`), the
//! batch shell passes the SIGTERM on to the step and waits for JupyterLab to stop.

use super::{JobOptions, Runner, SlurmError, shell_quote};
use crate::inspect::ImageSummary;

/// What `--jupyter` is given: where the laptop's tunnel goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Jupyter {
    /// The host the laptop reaches by SSH; default: `SLURM_SUBMIT_HOST`, the host `sbatch`
    /// ran on, which is the login node.
    pub login_host: Option<String>,
    /// The user on it; default: the job's user (`SLURM_JOB_USER`).
    pub login_user: Option<String>,
    /// The port on the laptop.
    pub local_port: u16,
}

/// The environment the server reads its port and token from, set by the job and passed to
/// the container by name.
pub(super) const SERVER_ENV: &[&str] = &["JUPYTER_TOKEN", "JUPYTER_PORT", "JUPYTER_PORT_RETRIES"];

/// The podman container's name, which the job removes after the step, whatever ended it.
pub(super) const CONTAINER_NAME: &str = "\"imgbuild-jupyter-${SLURM_JOB_ID:-$$}\"";

/// The job's output file, named so the note on stderr can say where the tunnel line is.
pub(super) const OUTPUT: &str = "jupyter-%j.out";

/// How the job runs JupyterLab in `image`.
#[derive(Debug)]
pub(super) struct JupyterPlan {
    /// Replaces the image's entrypoint and cmd.
    pub command: Vec<String>,
    /// Shell lines before the step: the port, the token and the tunnel line.
    pub prelude: String,
}

/// The plan for `image`, or why it cannot serve JupyterLab under `options`.
pub(super) fn plan(
    image: &ImageSummary,
    options: &JobOptions,
    jupyter: &Jupyter,
) -> Result<JupyterPlan, SlurmError> {
    let refuse = |reason: String| SlurmError::Jupyter {
        image: image.image.clone(),
        reason,
    };
    if options.command.is_some() || options.args.is_some() {
        return Err(refuse(
            "runs JupyterLab's own command with `--jupyter`, so `--set command` and `--set args` do not apply".into(),
        ));
    }
    if options.nodes.is_some_and(|n| n > 1) || options.ntasks_per_node.is_some_and(|n| n > 1) {
        return Err(refuse(
            "serves JupyterLab from one task on one node: drop `--set nodes` and `--set ntasks-per-node`".into(),
        ));
    }
    if let Some((name, _)) = options
        .env
        .iter()
        .find(|(n, _)| SERVER_ENV.contains(&n.as_str()))
    {
        return Err(refuse(format!(
            "gets `{name}` from the job with `--jupyter`: drop `--env {name}`"
        )));
    }
    if !image.has_jupyterlab() {
        return Err(refuse(
            "has no JupyterLab (no `jupyterlab` conda package or wheel): add `jupyterlab` to the recipe's `[conda]` or `[pypi]` dependencies".into(),
        ));
    }
    if options.runner == Runner::Podman && runs_as_root(image.config.user.as_deref()) {
        return Err(refuse(
            "runs as root, and JupyterLab must not (it would need `--allow-root`): give the recipe's `[image] user` a non-root account (`[accounts]` adds one)".into(),
        ));
    }
    let prefix = image
        .conda
        .as_ref()
        .and_then(|c| c.prefix.clone())
        .unwrap_or_else(|| "/opt/conda".into());
    Ok(JupyterPlan {
        command: vec![
            format!("{}/bin/jupyter", prefix.trim_end_matches('/')),
            "lab".into(),
            "--no-browser".into(),
            "--ip=0.0.0.0".into(),
        ],
        prelude: prelude(options.runner, jupyter),
    })
}

/// An image user of root: none, `root`, uid 0, with or without a group.
pub(crate) fn runs_as_root(user: Option<&str>) -> bool {
    let user = user.unwrap_or_default();
    let name = user.split(':').next().unwrap_or_default();
    name.is_empty() || name == "root" || name == "0"
}

/// The lines before the step. Pyxis runs the container as the job's user, so a job of root
/// is refused there; podman runs it as the image's user, checked before.
fn prelude(runner: Runner, jupyter: &Jupyter) -> String {
    let mut lines =
        String::from("\n# JupyterLab: a port free on this node, a token, the tunnel.\n");
    if runner == Runner::Pyxis {
        lines.push_str(
            "[ \"$(id -u)\" != 0 ] || { echo \"imgbuild: JupyterLab must not run as root; submit the job as your own user\" >&2; exit 1; }\n",
        );
    }
    lines.push_str(concat!(
        "out=$(scontrol show job \"${SLURM_JOB_ID:-}\" 2>/dev/null | sed -n 's/^ *StdOut=//p')\n",
        "if [ -f \"$out\" ]; then chmod go-rwx \"$out\"; else\n",
        "    echo \"imgbuild: warning: could not make the job's output file private; others may read the token in it\" >&2\n",
        "fi\n",
        "port=\n",
        "for _ in $(seq 200); do\n",
        "    candidate=$(( 49152 + $(od -An -N2 -tu2 /dev/urandom) % 16384 ))\n",
        "    if ! (exec 3<>\"/dev/tcp/127.0.0.1/$candidate\") 2>/dev/null; then port=$candidate; break; fi\n",
        "done\n",
        "[ -n \"$port\" ] || { echo \"imgbuild: found no free port on $(hostname)\" >&2; exit 1; }\n",
        "JUPYTER_TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \\n')\n",
        "export JUPYTER_TOKEN JUPYTER_PORT=\"$port\" JUPYTER_PORT_RETRIES=0\n",
        "node=$(hostname)\n",
    ));
    let login_user = match &jupyter.login_user {
        Some(user) => shell_quote(user),
        None => "\"${SLURM_JOB_USER:-$(id -un)}\"".into(),
    };
    let login_host = match &jupyter.login_host {
        Some(host) => shell_quote(host),
        None => "\"${SLURM_SUBMIT_HOST:-LOGIN_HOST}\"".into(),
    };
    let local = jupyter.local_port;
    lines.push_str(&format!(
        "login_user={login_user}\nlogin_host={login_host}\n\
         echo \"imgbuild: JupyterLab starts on $node:$port (job ${{SLURM_JOB_ID:-}}). On your laptop run\"\n\
         echo \"    ssh -N -L {local}:$node:$port $login_user@$login_host\"\n\
         echo \"and open\"\n\
         echo \"    http://localhost:{local}/lab?token=$JUPYTER_TOKEN\"\n\n"
    ));
    lines
}

/// The lines after `step` started the container in the background as `$step`. When Slurm
/// ends the job (the time limit, `scancel`) it signals every process of the job at once,
/// podman's own helpers too, so podman's forwarding of the signal to the container can be
/// lost; the batch shell therefore stops podman's container itself, with a `podman stop`
/// started after the signal, and only then ends the step and removes the container. Pyxis's
/// container is a process of the step, which the signal reaches directly.
pub(super) fn supervise(runner: Runner) -> String {
    let (stop, remove) = match runner {
        Runner::Podman => (
            format!(
                "    podman stop --ignore --time 20 {CONTAINER_NAME} >/dev/null 2>&1 || true\n"
            ),
            format!("podman rm --force --ignore {CONTAINER_NAME} >/dev/null 2>&1 || true\n"),
        ),
        Runner::Pyxis => (String::new(), String::new()),
    };
    let indented = if remove.is_empty() {
        String::new()
    } else {
        format!("    {remove}")
    };
    format!(
        "step=$!\n\
         stop() {{\n\
         \x20   trap - TERM INT\n\
         \x20   echo \"imgbuild: stopping JupyterLab\" >&2\n\
         {stop}\
         \x20   kill -TERM \"$step\" 2>/dev/null || true\n\
         \x20   wait \"$step\" || true\n\
         {indented}\
         \x20   echo \"imgbuild: JupyterLab stopped\" >&2\n\
         \x20   exit 0\n\
         }}\n\
         trap stop TERM INT\n\
         status=0\n\
         wait \"$step\" || status=$?\n\
         {remove}\
         exit \"$status\"\n"
    )
}

/// Checks `--login-host`: a host name or address as ssh takes it, nothing a shell or ssh
/// reads as an option.
pub(crate) fn check_login_host(value: &str) -> Result<(), String> {
    let valid = !value.is_empty()
        && !value.starts_with(['-', '.'])
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`--login-host {}` is not a host name or address (letters, digits, `.`, `-`, `:`)",
            value.escape_debug()
        ))
    }
}

/// Checks `--login-user`: a POSIX user name.
pub(crate) fn check_login_user(value: &str) -> Result<(), String> {
    let valid = value.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`--login-user {}` is not a user name (letters, digits, `.`, `_`, `-`, not starting with `-` or a digit)",
            value.escape_debug()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_users_are_told_apart() {
        for root in [None, Some(""), Some("root"), Some("0"), Some("0:100")] {
            assert!(runs_as_root(root), "{root:?}");
        }
        for user in [Some("jovyan"), Some("1000:1000"), Some("app:root")] {
            assert!(!runs_as_root(user), "{user:?}");
        }
    }

    #[test]
    fn login_values_are_checked() {
        assert!(check_login_host("login1.cluster.example").is_ok());
        assert!(check_login_host("::1").is_ok());
        for bad in ["", "-oProxyCommand=x", "a b", "a;b", "$(id)", "a\nb", "h@x"] {
            assert!(check_login_host(bad).is_err(), "{bad:?}");
        }
        assert!(check_login_user("alice_1").is_ok());
        for bad in ["", "-x", "1a", "a b", "a@b", "$(id)"] {
            assert!(check_login_user(bad).is_err(), "{bad:?}");
        }
    }
}
