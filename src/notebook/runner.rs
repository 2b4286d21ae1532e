//! Running a notebook in its image: the plan (which image, as whom, with what bounds) apart
//! from its execution under podman (or runc where podman is absent, `super::runc`). The image's own Python runs nbclient ([`DRIVER`]); the
//! host's Jupyter is never used. The container has no network, no capabilities and the
//! notebook read-only; what it prints back is read up to a bound.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde::Deserialize;

/// The program that runs in the image: nbclient executing the notebook at `argv[1]`, each
/// cell within `argv[2]` seconds. Its result, one JSON object (the executed notebook as
/// nbformat writes it, the kernel, and the first failing cell), goes to the original
/// stdout; everything else that prints (the kernel manager, warnings) goes to stderr, so
/// nothing else can mix into the result. Refuses to run as uid 0 (a named user can still
/// be root inside the image) with exit 17, and an image without nbclient with exit 18.
pub(crate) const DRIVER: &str = r#"
import json, os, sys
result = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
if os.getuid() == 0:
    sys.stderr.write("the image's user is uid 0 (root) inside the image\n")
    sys.exit(17)
try:
    import nbformat
    from nbclient import NotebookClient
except ImportError as e:
    sys.stderr.write("%s cannot import nbclient: %s\n" % (sys.executable, e))
    sys.exit(18)
nb = nbformat.read(sys.argv[1], as_version=4)
current, kernel = [None], [""]
def started(cell, cell_index, **_):
    current[0] = cell_index
    kernel[0] = getattr(client.km, "kernel_name", "")
client = NotebookClient(nb, timeout=int(sys.argv[2]), startup_timeout=120,
                        on_cell_start=started,
                        resources={"metadata": {"path": os.getcwd()}})
error = None
try:
    client.execute()
except Exception as e:
    error = {"cell": current[0], "ename": getattr(e, "ename", None) or type(e).__name__}
    sys.stderr.write("%s: %s\n" % (type(e).__name__, str(e)[-2000:]))
info = nb.metadata.get("language_info", {})
json.dump({"notebook": nbformat.writes(nb),
           "kernel": kernel[0] or client.kernel_name or "",
           "language": info.get("name", ""), "version": info.get("version", ""),
           "error": error}, result)
result.close()
"#;

/// Where the notebook's directory is mounted in the container (read-only).
pub(crate) const NOTEBOOK_DIR: &str = "/tmp/imgbuild-notebook";

/// How much of the container's stderr is read (its last lines go into errors).
const MAX_STDERR_BYTES: u64 = 1 << 20;

/// One run to make.
#[derive(Debug, Clone)]
pub(crate) struct RunPlan {
    /// The layout directory and tag of the image.
    pub layout: PathBuf,
    pub tag: String,
    /// `--user`: overrides the image's user (never root).
    pub user: Option<String>,
    /// The image's Python, by name on its `PATH` or absolute.
    pub python: String,
    /// Seconds each cell may run (nbclient's `timeout`).
    pub cell_timeout: u64,
    /// The most bytes of result read back.
    pub max_output: u64,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("Cannot run `{program}` (podman, else runc, runs the notebook's container): {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("The image `{reference}` could not be loaded for the run: {stderr}")]
    Load { reference: String, stderr: String },
    #[error("Cannot stage the notebook for the container: {0}")]
    Stage(#[source] std::io::Error),
    #[error("The notebook's run printed more than {max} bytes of result; it was stopped")]
    TooLarge { max: u64 },
    #[error("The image refused to run the notebook: {0}")]
    Image(String),
    #[error("The notebook's container failed ({status}): {stderr}")]
    Container { status: String, stderr: String },
    #[error("The notebook's kernel did not start or died before a cell ran ({error}): {stderr}")]
    Kernel { error: String, stderr: String },
    #[error("The run's result is not what the driver writes: {0}")]
    Result(String),
}

/// What the driver reports.
#[derive(Debug, Deserialize)]
pub(crate) struct DriverResult {
    /// The executed notebook, as nbformat writes it.
    pub notebook: String,
    pub kernel: String,
    pub language: String,
    pub version: String,
    pub error: Option<DriverError>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct DriverError {
    pub cell: Option<usize>,
    pub ename: String,
}

/// Loads the layout into podman's storage; the image's id. podman names an `oci:` image
/// after its path, which must be a lowercase repository name: the layout is reached through
/// a link of a name of our own in a fresh directory, and that name is taken off again once
/// loaded (the image stays, nameless, so a later run of it loads nothing new).
pub(crate) fn load(plan: &RunPlan) -> Result<String, RunError> {
    let layout = std::path::absolute(&plan.layout).map_err(RunError::Stage)?;
    let links = tempfile::Builder::new()
        .prefix("imgbuild-notebook-")
        .rand_bytes(0)
        .suffix(&unique())
        .tempdir()
        .map_err(RunError::Stage)?;
    let link = links.path().join("image");
    std::os::unix::fs::symlink(&layout, &link).map_err(RunError::Stage)?;
    let reference = format!("oci:{}:{}", link.display(), plan.tag);
    let output = podman(&["pull", "-q", &reference])?;
    if !output.status.success() {
        return Err(RunError::Load {
            reference: format!("oci:{}:{}", layout.display(), plan.tag),
            stderr: tail(&output.stderr),
        });
    }
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let name = format!("localhost{}:{}", link.display(), plan.tag);
    let _ = podman(&["untag", &id, &name]);
    Ok(id)
}

/// A lowercase name no other run uses: this process's id, a count and the time.
pub(crate) fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{count}-{nanos}", std::process::id())
}

fn podman(args: &[&str]) -> Result<std::process::Output, RunError> {
    tool("podman", args)
}

/// Runs `program ARGS` to its end with no input.
pub(super) fn tool(program: &str, args: &[&str]) -> Result<std::process::Output, RunError> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RunError::Spawn {
            program: program.into(),
            source,
        })
}

/// What runs the container: podman when it is on `PATH`, else runc (with umoci).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runtime {
    Podman,
    Runc,
}

impl Runtime {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Runtime::Podman => "podman",
            Runtime::Runc => "runc",
        }
    }

    pub(crate) fn find() -> Result<Runtime, RunError> {
        let on_path = |name: &str| {
            std::env::var_os("PATH")
                .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
        };
        if on_path("podman") {
            Ok(Runtime::Podman)
        } else if on_path("runc") && on_path("umoci") {
            Ok(Runtime::Runc)
        } else {
            Err(RunError::Spawn {
                program: "podman".into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither podman nor runc with umoci is on PATH",
                ),
            })
        }
    }
}

/// The arguments of `podman run` for `image` with the notebook staged at `staged`.
pub(crate) fn run_args(plan: &RunPlan, image: &str, name: &str, staged: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--rm",
        "--name",
        name,
        "--network=none",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--pull=never",
        "--tmpfs=/tmp:rw,nosuid,nodev,mode=1777",
    ]
    .map(String::from)
    .to_vec();
    args.push(format!("--volume={}:{NOTEBOOK_DIR}:ro", staged.display()));
    args.push("--env=JUPYTER_RUNTIME_DIR=/tmp/imgbuild-jupyter".into());
    if let Some(user) = &plan.user {
        args.push(format!("--user={user}"));
    }
    args.push(format!("--entrypoint={}", plan.python));
    args.extend([
        image.to_string(),
        "-c".into(),
        DRIVER.into(),
        format!("{NOTEBOOK_DIR}/notebook.ipynb"),
        plan.cell_timeout.to_string(),
    ]);
    args
}

/// The driver's result from how its container ended and what it printed.
pub(crate) fn driver_result(
    status: std::process::ExitStatus,
    stdout: &[u8],
    stderr: &[u8],
) -> Result<DriverResult, RunError> {
    match status.code() {
        Some(0) => {}
        Some(17 | 18) => return Err(RunError::Image(tail(stderr))),
        _ => {
            return Err(RunError::Container {
                status: status.to_string(),
                stderr: tail(stderr),
            });
        }
    }
    let result: DriverResult =
        serde_json::from_slice(stdout).map_err(|e| RunError::Result(e.to_string()))?;
    if let Some(error) = &result.error
        && error.cell.is_none()
    {
        return Err(RunError::Kernel {
            error: error.ename.clone(),
            stderr: tail(stderr),
        });
    }
    Ok(result)
}

/// Runs `program ARGS`, reading at most `max` bytes of stdout; past that, the container is
/// removed (`program CLEANUP`). Its status, stdout and stderr (bounded too).
pub(crate) fn execute(
    program: &str,
    args: &[String],
    max: u64,
    cleanup: &[&str],
) -> Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>), RunError> {
    let spawn = |source| RunError::Spawn {
        program: program.into(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || read_tail(stderr));
    let stdout = crate::fs::read_stream(child.stdout.take().expect("piped"), max);
    let Ok(stdout) = stdout else {
        let _ = tool(program, cleanup);
        let _ = child.kill();
        let _ = child.wait();
        return Err(RunError::TooLarge { max });
    };
    let status = child.wait().map_err(spawn)?;
    let stderr = errors.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}

/// The first [`MAX_STDERR_BYTES`] of `reader`, then the rest drained unread, so the
/// container never blocks on a full pipe.
fn read_tail(reader: impl Read) -> Vec<u8> {
    let mut reader = reader;
    let kept = crate::fs::read_stream((&mut reader).take(MAX_STDERR_BYTES), MAX_STDERR_BYTES)
        .unwrap_or_default();
    let _ = std::io::copy(&mut reader, &mut std::io::sink());
    kept
}

/// The last lines of a process's stderr, for an error message.
pub(super) fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
