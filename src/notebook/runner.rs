//! Running a notebook in its image: the plan (which image, as whom, with what bounds) apart
//! from its execution under podman. The image's own Python runs nbclient ([`DRIVER`]); the
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

/// Where the notebook is mounted in the container (read-only).
const NOTEBOOK_IN_CONTAINER: &str = "/tmp/imgbuild-notebook/notebook.ipynb";

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
    #[error("Cannot run `{program}` (podman runs the notebook's container): {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("podman could not load the image `{reference}`: {stderr}")]
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
fn load(plan: &RunPlan) -> Result<String, RunError> {
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
fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{count}-{nanos}", std::process::id())
}

fn podman(args: &[&str]) -> Result<std::process::Output, RunError> {
    Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RunError::Spawn {
            program: "podman".into(),
            source,
        })
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
    args.push(format!(
        "--volume={}:{NOTEBOOK_IN_CONTAINER}:ro",
        staged.display()
    ));
    args.push("--env=JUPYTER_RUNTIME_DIR=/tmp/imgbuild-jupyter".into());
    if let Some(user) = &plan.user {
        args.push(format!("--user={user}"));
    }
    args.push(format!("--entrypoint={}", plan.python));
    args.extend([
        image.to_string(),
        "-c".into(),
        DRIVER.into(),
        NOTEBOOK_IN_CONTAINER.into(),
        plan.cell_timeout.to_string(),
    ]);
    args
}

/// Runs `notebook` (its bytes) as `plan` says: the driver's result.
pub(crate) fn run(plan: &RunPlan, notebook: &[u8]) -> Result<DriverResult, RunError> {
    let image = load(plan)?;
    // The bytes that were read and hashed are what runs: a private copy, readable by the
    // container's user.
    let staged = tempfile::Builder::new()
        .prefix("imgbuild-notebook-")
        .tempdir()
        .map_err(RunError::Stage)?;
    let file = staged.path().join("notebook.ipynb");
    crate::fs::write_atomic(&file, notebook).map_err(RunError::Stage)?;
    crate::fs::set_mode(staged.path(), 0o755).map_err(RunError::Stage)?;
    let name = format!("imgbuild-notebook-{}", unique());
    let args = run_args(plan, &image, &name, &file);
    let (status, stdout, stderr) = execute(&args, plan.max_output, &name)?;
    match status.code() {
        Some(0) => {}
        Some(17 | 18) => return Err(RunError::Image(tail(&stderr))),
        _ => {
            return Err(RunError::Container {
                status: status.to_string(),
                stderr: tail(&stderr),
            });
        }
    }
    let result: DriverResult =
        serde_json::from_slice(&stdout).map_err(|e| RunError::Result(e.to_string()))?;
    if let Some(error) = &result.error
        && error.cell.is_none()
    {
        return Err(RunError::Kernel {
            error: error.ename.clone(),
            stderr: tail(&stderr),
        });
    }
    Ok(result)
}

/// Runs `podman ARGS`, reading at most `max` bytes of stdout; past that, the container is
/// removed. Its status, stdout and stderr (bounded too).
fn execute(
    args: &[String],
    max: u64,
    name: &str,
) -> Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>), RunError> {
    let spawn = |source| RunError::Spawn {
        program: "podman".into(),
        source,
    };
    let mut child = Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || read_tail(stderr));
    let stdout = crate::fs::read_stream(child.stdout.take().expect("piped"), max);
    let stdout = match stdout {
        Ok(bytes) => bytes,
        Err(_) => {
            let _ = podman(&["rm", "--force", "--time=0", name]);
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::TooLarge { max });
        }
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
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
