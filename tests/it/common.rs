//! Helpers for driving the real `imgbuild` binary and reading what it wrote.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
};

use serde_json::Value;

use crate::support::imgbuild_bin;

/// What a run of the CLI did.
#[derive(Debug)]
pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics with the output unless the run succeeded.
    #[track_caller]
    pub(crate) fn success(self) -> Self {
        assert_eq!(self.code, 0, "imgbuild failed:\n{}", self.stderr);
        self
    }

    /// The manifest digest printed on stdout (`layout:tag@sha256:…`).
    pub(crate) fn digest(&self) -> String {
        let line = self.stdout.lines().next().expect("a result line on stdout");
        line.rsplit_once('@')
            .expect("layout:tag@digest")
            .1
            .to_string()
    }

    /// A clean failure with `code` whose stderr names every one of `needles`.
    #[track_caller]
    pub(crate) fn assert_failure_naming(&self, code: i32, needles: &[&str]) {
        self.assert_clean_failure(code);
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "expected `{needle}` in:\n{}",
                self.stderr
            );
        }
    }

    /// A failure must be an error the user can read, never a crash.
    #[track_caller]
    pub(crate) fn assert_clean_failure(&self, code: i32) {
        assert_eq!(self.code, code, "exit code; stderr:\n{}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "panic:\n{}", self.stderr);
        assert!(
            self.stderr.starts_with("error: ") || self.stderr.contains("\nerror: "),
            "{}",
            self.stderr
        );
        assert!(
            self.stdout.is_empty(),
            "no result on failure: {}",
            self.stdout
        );
    }
}

/// A project directory with one recipe, its own cache, and the commands to build it.
pub(crate) struct Project {
    pub dir: tempfile::TempDir,
    pub cache: PathBuf,
}

impl Project {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let cache = dir.path().join("cache");
        Project { dir, cache }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn recipe_path(&self) -> PathBuf {
        self.path().join("recipes/image.toml")
    }

    pub(crate) fn lock_path(&self) -> PathBuf {
        self.path().join("recipes/image.lock")
    }

    /// A failed build left no image behind.
    #[track_caller]
    pub(crate) fn assert_no_image(&self) {
        assert!(!self.path().join("images").exists(), "no output on failure");
    }

    pub(crate) fn write_recipe(&self, text: &str) {
        fs_err::create_dir_all(self.path().join("recipes")).unwrap();
        fs_err::write(self.recipe_path(), text).unwrap();
    }

    /// Runs imgbuild in the project directory with this project's cache.
    pub(crate) fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, &[], None)
    }

    /// Runs imgbuild with extra environment variables and, optionally, a umask.
    /// imgbuild with `args` in this project: its cache, and none of the caller's environment
    /// that would change a build.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(imgbuild_bin());
        command
            .args(args)
            .current_dir(self.path())
            .env("IMGBUILD_CACHE_DIR", &self.cache)
            // The project's own "machine": never the user's key under ~/.local/state.
            .env(
                "IMGBUILD_CACHE_KEY_FILE",
                self.path().join("state/cache-key"),
            )
            .env_remove("SOURCE_DATE_EPOCH")
            .env_remove("IMGBUILD_JOBS")
            .env_remove("IMGBUILD_CHANNEL_ALIAS");
        command
    }

    pub(crate) fn run_with(
        &self,
        args: &[&str],
        envs: &[(&str, &str)],
        umask: Option<&str>,
    ) -> Run {
        let bin = imgbuild_bin();
        let mut command = match umask {
            Some(mask) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("umask {mask} && exec \"$0\" \"$@\""))
                    .arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        command
            .args(args)
            .current_dir(self.path())
            .env("IMGBUILD_CACHE_DIR", &self.cache)
            // The project's own "machine": never the user's key under ~/.local/state.
            .env(
                "IMGBUILD_CACHE_KEY_FILE",
                self.path().join("state/cache-key"),
            )
            .env_remove("SOURCE_DATE_EPOCH")
            .env_remove("IMGBUILD_JOBS")
            .env_remove("IMGBUILD_CHANNEL_ALIAS");
        for (key, value) in envs {
            command.env(key, value);
        }
        let output = command.output().expect("running imgbuild");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// `imgbuild build recipes/image.toml`.
    pub(crate) fn build(&self, extra: &[&str]) -> Run {
        let mut args = vec!["build", "recipes/image.toml"];
        args.extend_from_slice(extra);
        self.run(&args)
    }
}

/// Runs `command` (an imgbuild invocation, `args` for the message) in `project` with its
/// output in files and a deadline: an input that makes imgbuild hang fails the test that
/// gave it instead of the whole run. The deadline guards against hangs, it times nothing.
#[allow(clippy::disallowed_methods, reason = "Stdio takes a std::fs::File")]
pub(crate) fn run_with_deadline(mut command: Command, project: &Project, args: &[&str]) -> Run {
    use std::time::{Duration, Instant};
    let out = project.path().join("run.out");
    let err = project.path().join("run.err");
    let mut child = command
        .current_dir(project.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "imgbuild {args:?} hung; stderr:\n{}",
                fs_err::read_to_string(&err).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: fs_err::read_to_string(&out).unwrap(),
        stderr: String::from_utf8_lossy(&fs_err::read(&err).unwrap()).into_owned(),
    }
}

/// The image is configured for the NVIDIA container toolkit as a recipe with `[cuda] version
/// = "11.8"` and `min-driver = "520.61.05"` configures it (on the shared channel's 11.8.89
/// runtime): its environment and its annotations.
#[track_caller]
pub(crate) fn assert_cuda_11_8_config(layout: &LayoutView) {
    let config = layout.config();
    let env = env_of(&config);
    for expected in [
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        "NVIDIA_REQUIRE_CUDA=cuda>=11.8",
        "CUDA_VERSION=11.8.89",
        "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    ] {
        assert!(env.contains(&expected), "{expected} in {env:?}");
    }
    let annotations = &layout.manifest()["annotations"];
    assert_eq!(annotations["dev.imgbuild.cuda.version"], "11.8");
    assert_eq!(annotations["dev.imgbuild.cuda.min-driver"], "520.61.05");
}

/// A parsed OCI layout.
pub(crate) struct LayoutView {
    pub dir: PathBuf,
}

impl LayoutView {
    pub(crate) fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub(crate) fn blob(&self, digest: &str) -> Vec<u8> {
        fs_err::read(
            self.dir
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:")),
        )
        .unwrap()
    }

    pub(crate) fn json_blob(&self, digest: &str) -> Value {
        serde_json::from_slice(&self.blob(digest)).unwrap()
    }

    pub(crate) fn index(&self) -> Value {
        serde_json::from_slice(&fs_err::read(self.dir.join("index.json")).unwrap()).unwrap()
    }

    pub(crate) fn manifest_digest(&self) -> String {
        self.index()["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub(crate) fn manifest(&self) -> Value {
        self.json_blob(&self.manifest_digest())
    }

    pub(crate) fn config(&self) -> Value {
        let manifest = self.manifest();
        self.json_blob(manifest["config"]["digest"].as_str().unwrap())
    }

    /// `(packages annotation, digest)` for every layer, bottom first.
    pub(crate) fn layers(&self) -> Vec<(String, String)> {
        layers_of(&self.manifest())
    }

    /// Every blob file name, sorted.
    pub(crate) fn blob_names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs_err::read_dir(self.dir.join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// The `Env` of an image config, `KEY=value` each.
/// (packages annotation, digest) of each layer of `manifest`, bottom first.
pub(crate) fn layers_of(manifest: &Value) -> Vec<(String, String)> {
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["annotations"]["dev.imgbuild.layer.packages"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                l["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(crate) fn env_of(config: &Value) -> Vec<&str> {
    config["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

/// The `sha256:<hex>` an in-toto statement's one subject names.
#[track_caller]
pub(crate) fn subject_digest(statement: &serde_json::Value) -> String {
    let hex = statement["subject"][0]["digest"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("no subject sha256 in {statement}"));
    format!("sha256:{hex}")
}

/// Runs a command and returns its stdout, panicking with its output on failure.
#[track_caller]
pub(crate) fn run_tool(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `oci-image-tool validate` of the `latest` image of a layout: the layout, the manifest,
/// the config and every descriptor.
#[track_caller]
pub(crate) fn validate_layout(dir: &str) {
    run_tool(
        "oci-image-tool",
        &["validate", "--type", "image", "--ref", "name=latest", dir],
    );
}

/// `umoci unpack` of `layout:tag` into `bundle`; returns the rootfs.
pub(crate) fn unpack(layout: &Path, tag: &str, bundle: &Path) -> PathBuf {
    run_tool(
        "umoci",
        &[
            "unpack",
            "--image",
            &format!("{}:{tag}", layout.display()),
            bundle.to_str().unwrap(),
        ],
    );
    bundle.join("rootfs")
}

/// Runs the unpacked `bundle` with runc (no terminal: a test has none to give) and returns
/// its stdout, failing the test with runc's stderr when it fails.
#[track_caller]
pub(crate) fn run_bundle(bundle: &Path, name: &str) -> String {
    let output = run_bundle_output(bundle, name, None);
    assert!(
        output.status.success(),
        "runc failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs the unpacked `bundle` with runc, with `args` as the process's arguments when given,
/// and returns what it did, whatever its exit status.
pub(crate) fn run_bundle_output(bundle: &Path, name: &str, args: Option<&[&str]>) -> Output {
    let config_path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs_err::read(&config_path).unwrap()).unwrap();
    config["process"]["terminal"] = Value::Bool(false);
    if let Some(args) = args {
        config["process"]["args"] = serde_json::json!(args);
    }
    fs_err::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
    Command::new("runc")
        .args([
            "run",
            "--bundle",
            bundle.to_str().unwrap(),
            &format!("imgbuild-{name}-{}", std::process::id()),
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// Set to `1` by a run that knows it is not root: only then do root-needing tests skip.
pub(crate) const UNPRIVILEGED: &str = "IMGBUILD_TESTS_UNPRIVILEGED";

/// Fails the test unless this process runs as root. Where the run says it is unprivileged
/// (`IMGBUILD_TESTS_UNPRIVILEGED=1`) it says why on stderr and returns from the enclosing
/// function instead, with `$skipped` where that function returns a value. A runner that
/// loses root so fails loudly rather than passing tests that did not run.
macro_rules! require_root {
    ($why:expr) => {
        if !$crate::common::is_root() {
            $crate::common::skip_unprivileged($why);
            return;
        }
    };
    ($why:expr, $skipped:expr) => {
        if !$crate::common::is_root() {
            $crate::common::skip_unprivileged($why);
            return $skipped;
        }
    };
}
pub(crate) use require_root;

/// Panics, naming `why` and [`UNPRIVILEGED`], unless the run says it is unprivileged; then
/// says on stderr where the test stops (some run their unprivileged part first).
#[track_caller]
pub(crate) fn skip_unprivileged(why: &str) {
    if unprivileged(std::env::var_os(UNPRIVILEGED).as_deref()) {
        let at = std::panic::Location::caller();
        eprintln!("skipped from {at} on, as {UNPRIVILEGED}=1: {why}");
    } else {
        panic!("this test needs root: {why}; run it as root, or set {UNPRIVILEGED}=1 to skip it");
    }
}

/// Whether [`UNPRIVILEGED`]'s value says the run is unprivileged: `1` only, so a typo or
/// `0` keeps the root-needing tests failing.
fn unprivileged(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|value| value == "1")
}

#[test]
fn only_unprivileged_1_lets_root_needing_tests_skip() {
    assert!(unprivileged(Some("1".as_ref())));
    for value in [None, Some("0"), Some(""), Some("true"), Some("1 ")] {
        assert!(!unprivileged(value.map(AsRef::as_ref)), "{value:?}");
    }
}

/// No test skips for want of root but through [`require_root!`]: a bare `is_root()` check
/// that returns would pass without running on a runner that lost root.
#[test]
fn root_needing_tests_go_through_require_root() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut bare = Vec::new();
    for entry in fs_err::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("common.rs") {
            continue;
        }
        let text = fs_err::read_to_string(&path).unwrap();
        let code: String = text.split_whitespace().collect();
        if code.contains("if!is_root()") {
            bare.push(path.display().to_string());
        }
    }
    assert!(bare.is_empty(), "use require_root!() in {bare:?}");
}

/// Whether this process runs as root (runc needs it here).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { geteuid() == 0 }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// A minimal HTTP/1.1 file server on 127.0.0.1 for channel tests: GET and HEAD of files
/// under `root`, 404 otherwise; it counts requests so tests can prove a run stayed offline.
pub(crate) struct FileServer {
    pub url: String,
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FileServer {
    pub(crate) fn serve(root: PathBuf) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                // Bounded: the server lives at most as long as the test that made it.
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            requests.fetch_add(1, Ordering::Relaxed);
                            let _ = handle(stream, &root);
                        }
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    }
                }
            })
        };
        FileServer {
            url,
            requests,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn handle(stream: TcpStream, root: &Path) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("/").split('?').next().unwrap_or("/");
    let file = root.join(path.trim_start_matches('/'));
    let mut out = stream;
    let safe = !path.contains("..");
    match (safe, fs_err::File::open(&file)) {
        (true, Ok(mut f)) if file.is_file() => {
            let mut body = Vec::new();
            f.read_to_end(&mut body)?;
            write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                body.len()
            )?;
            if method != "HEAD" {
                out.write_all(&body)?;
            }
        }
        _ => {
            write!(
                out,
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
        }
    }
    out.flush()
}

/// A tool from the validators' virtual environment that `tests/install-deps.sh` makes
/// (SBOM validators, kubernetes-validate).
pub(crate) fn venv_tool(name: &str) -> PathBuf {
    let path = crate::support::test_cache_dir().join("venv/bin").join(name);
    assert!(
        path.exists(),
        "`{}` is missing: run tests/install-deps.sh (it installs the validators from PyPI)",
        path.display()
    );
    path
}

/// The in-toto project's own check of a Statement v1 (`in_toto_attestation`'s
/// `Statement.validate`), run by [`venv_python_check`]: prints `valid PREDICATE_TYPE HEX`.
pub(crate) const IN_TOTO_STATEMENT_CHECK: &str = "import sys, google.protobuf.json_format as j\n\
    from in_toto_attestation.v1 import statement, statement_pb2\n\
    pb = j.Parse(open(sys.argv[1]).read(), statement_pb2.Statement())\n\
    statement.Statement.copy_from_pb(pb).validate()\n\
    print('valid', pb.predicate_type, pb.subject[0].digest['sha256'])";

/// Runs the Python `script` of the validators' venv on `file`: its stdout; panics with both
/// outputs when it fails.
#[track_caller]
pub(crate) fn venv_python_check(script: &str, file: &Path) -> String {
    let out = Command::new(venv_tool("python"))
        .args(["-c", script, file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the check refused {}:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `len` bytes that do not compress, the same for the same `seed` every run (xorshift64).
pub(crate) fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
