//! The smoke run in a child process, so that no library can take the caller down.
//!
//! Loading a library runs its code in the process that loads it: a truncated
//! `libnvrtc.so.12` makes the loader touch pages past the end of the file (SIGBUS), a broken
//! initialiser can SIGSEGV or abort. In the process that was to print the report, that is a
//! death without a word. So the caller runs its own executable again with [`CHILD_ARG`]
//! ([`run_in_child`]); the child ([`child_main`]) does the whole run, says on stdout which
//! library it is about to load and when it has loaded it, and prints its report last. A child
//! that dies instead becomes a `kernel-failure` report naming the library it was loading and
//! the signal that killed it.
//!
//! The protocol is lines on the child's stdout, each starting with a marker that no library
//! prints; anything else a library writes there is ignored.

use std::{
    ffi::OsString,
    io::{BufRead, BufReader, Read, Write},
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, ExitStatus, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

use crate::{
    gpu,
    libraries::{CudaLibraries, LoadEvent},
    report::{SmokeReport, Verdict},
};

/// The first argument that makes an executable the smoke child (`imgbuild __smoke-child …`,
/// `imgbuild-smoke __smoke-child …`): not a command anyone types.
pub const CHILD_ARG: &str = "__smoke-child";

const LOADING: &str = "imgbuild-smoke-child:loading ";
const LOADED: &str = "imgbuild-smoke-child:loaded ";
const REPORT: &str = "imgbuild-smoke-child:report ";

/// How long the child may take before it is taken for hung and killed: loading the
/// libraries, compiling the kernel and running it take seconds on any GPU, but a library
/// whose initialiser never returns would otherwise hang the caller for good.
const DEFAULT_LIMIT: Duration = Duration::from_secs(300);
/// Overrides [`DEFAULT_LIMIT`], in whole seconds.
pub(crate) const LIMIT_VAR: &str = "IMGBUILD_SMOKE_TIMEOUT";

/// The limit of a smoke child, and of each framework probe: [`DEFAULT_LIMIT`] or
/// [`LIMIT_VAR`].
pub fn time_limit() -> Duration {
    std::env::var(LIMIT_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(DEFAULT_LIMIT, Duration::from_secs)
}

/// The options that pass the libraries to the child, as paths (not JSON, which cannot hold a
/// path that is not UTF-8).
const CUDART: &str = "--cudart";
const NVRTC: &str = "--nvrtc";
const NVRTC_BUILTINS: &str = "--nvrtc-builtins";

/// Runs the smoke test on `libraries` in a child process (`exe` run with [`CHILD_ARG`]: the
/// caller's own executable, which must call [`child_main`] for it) and returns its report; a
/// child that crashed or ended without a report is a [`Verdict::KernelFailure`] naming the
/// library it was loading. Fails only when the child cannot be started or waited for.
pub fn run_in_child(
    exe: &Path,
    libraries: &CudaLibraries,
    report: SmokeReport,
) -> std::io::Result<SmokeReport> {
    let request = serde_json::to_string(&report).map_err(std::io::Error::other)?;
    let mut command = Command::new(exe);
    command.arg(CHILD_ARG).arg(request);
    for (option, path) in [
        (CUDART, &libraries.cudart),
        (NVRTC, &libraries.nvrtc),
        (NVRTC_BUILTINS, &libraries.nvrtc_builtins),
    ] {
        if let Some(path) = path {
            command.arg(option).arg(path);
        }
    }
    if let Some(dir) = compat_first(libraries, &report) {
        // The loader reads LD_LIBRARY_PATH once, at start: the child finds the compat
        // `libcuda.so.1` before the host's, as the toolkit's ld.so.conf.d entry makes it.
        command.env("LD_LIBRARY_PATH", dir);
    }
    // stderr is the caller's: the loader's and the libraries' own complaints stay visible.
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take();
    let child = Arc::new(Mutex::new(child));
    let (done, watchdog) = watch(child.clone(), time_limit());
    let mut transcript = stdout.map(Transcript::read).unwrap_or_default();
    let status = wait(&child)?;
    let _ = done.send(());
    let killed = watchdog.join().unwrap_or(None);
    // A child killed by the watchdog dies of SIGKILL; one that finished just as the time ran
    // out keeps its own status.
    transcript.timed_out = killed.filter(|_| status.signal() == Some(9));
    Ok(transcript.conclude(report, status))
}

/// `LD_LIBRARY_PATH` with the extracted compat libraries first, when the report's
/// forward-compatibility decision uses them.
fn compat_first(libraries: &CudaLibraries, report: &SmokeReport) -> Option<OsString> {
    let dir = libraries.compat_dir.as_ref()?;
    if !report.forward_compat.as_ref().is_some_and(|d| d.used) {
        return None;
    }
    let mut path = dir.clone().into_os_string();
    if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(rest);
    }
    Some(path)
}

/// Kills `child` once `limit` has passed without a word on the returned sender; the thread
/// returns the limit when it killed.
pub(crate) fn watch(
    child: Arc<Mutex<Child>>,
    limit: Duration,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<Option<Duration>>) {
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(limit) != Err(mpsc::RecvTimeoutError::Timeout) {
            return None;
        }
        // `Child::kill` does nothing to a child already waited for, so no other process
        // that took its pid can be hit.
        let _ = child.lock().map(|mut c| c.kill());
        Some(limit)
    });
    (done, watchdog)
}

/// Waits for `child` without holding its lock, so the watchdog can always kill it.
pub(crate) fn wait(child: &Mutex<Child>) -> std::io::Result<ExitStatus> {
    loop {
        let status = child
            .lock()
            .map_err(|_| std::io::Error::other("the smoke child's lock is poisoned"))?
            .try_wait()?;
        if let Some(status) = status {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the child said before it ended.
#[derive(Debug, Default)]
struct Transcript {
    /// The library being loaded when the child last spoke, if it had not finished loading.
    loading: Option<String>,
    /// The libraries loaded, in order.
    loaded: Vec<String>,
    report: Option<SmokeReport>,
    /// The limit after which the child was killed, when it was.
    timed_out: Option<Duration>,
}

impl Transcript {
    /// Reads the child's stdout to its end.
    fn read(stdout: impl Read) -> Transcript {
        let mut transcript = Transcript::default();
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            transcript.hear(&String::from_utf8_lossy(&line));
            line.clear();
        }
        transcript
    }

    /// One line of the child's stdout; a marker may follow what a library printed without
    /// a newline, so it is looked for anywhere in the line.
    fn hear(&mut self, line: &str) {
        let line = line.trim_end_matches('\n');
        let after = |marker: &str| line.find(marker).map(|at| &line[at + marker.len()..]);
        if let Some(name) = after(LOADING).and_then(decode) {
            self.loading = Some(name);
        } else if let Some(name) = after(LOADED).and_then(decode) {
            self.loading = None;
            self.loaded.push(name);
        } else if let Some(json) = after(REPORT) {
            self.report = serde_json::from_str(json).ok();
        }
    }

    /// The report: the child's when it ended as it should, else `report` (what the caller
    /// knew before the run) as a kernel failure saying how the child died.
    fn conclude(mut self, report: SmokeReport, status: ExitStatus) -> SmokeReport {
        let death = match self.timed_out {
            Some(limit) => Some(format!(
                "hung: it had not finished after {} s and was killed ({LIMIT_VAR} sets the limit)",
                limit.as_secs()
            )),
            None => death(status),
        };
        match (self.report.take(), death) {
            (Some(report), None)
                if status.code() == Some(i32::from(report.verdict.exit_code())) =>
            {
                report
            }
            (Some(mut finished), death) => {
                let how = death.unwrap_or_else(|| format!("exited with {status}"));
                finished.message = format!(
                    "the smoke test finished ({}: {}), but its process then {how}",
                    finished.verdict.as_str(),
                    finished.message
                );
                finished.verdict = Verdict::KernelFailure;
                finished
            }
            (None, death) => {
                let how = death.unwrap_or_else(|| "ended without a report".to_string());
                let message = self.what_crashed(&report.libraries, &how);
                SmokeReport {
                    verdict: Verdict::KernelFailure,
                    message,
                    ..report
                }
            }
        }
    }

    /// The message for a child that died: the library it was loading (with its place in the
    /// image when the caller listed it), else what it had loaded.
    fn what_crashed(&self, in_image: &[String], how: &str) -> String {
        match &self.loading {
            Some(path) => {
                let name = file_name(path);
                let place = in_image
                    .iter()
                    .find(|p| file_name(p) == name)
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default();
                let verb = if self.timed_out.is_some() {
                    "stopped"
                } else {
                    "crashed"
                };
                format!("loading `{name}`{place} {verb} the smoke test: its process {how}")
            }
            None if self.loaded.is_empty() => {
                format!("the smoke test's process {how} before loading any library")
            }
            None => format!(
                "the smoke test's process {how} after loading {}",
                self.loaded
                    .iter()
                    .map(|p| format!("`{}`", file_name(p)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// How a child that did not exit normally died: `killed by signal 7 (SIGBUS)`,
/// `exited with status 101`; None for a status that is a verdict's exit code.
fn death(status: ExitStatus) -> Option<String> {
    if let Some(signal) = status.signal() {
        let name = signal_name(signal).map_or_else(String::new, |n| format!(" ({n})"));
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        return Some(format!("was killed by signal {signal}{name}{core}"));
    }
    match status.code() {
        Some(0 | 3 | 4 | 5) => None,
        Some(code) => Some(format!("exited with status {code}")),
        None => Some(format!("ended with {status}")),
    }
}

/// Linux's names of the signals a crashing library raises, or a person sends.
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        31 => "SIGSYS",
        _ => return None,
    })
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A path as one line: JSON-quoted, so that a newline in a file name cannot end it.
fn encode(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).unwrap_or_default()
}

fn decode(text: &str) -> Option<String> {
    serde_json::from_str(text.trim()).ok()
}

/// The child: `args` are what follows [`CHILD_ARG`] (the report so far as JSON, then the
/// libraries' options). Runs the test, saying on stdout which library it loads, and prints
/// the report last; its exit code is the verdict's. Exit 2 for arguments it cannot read.
#[allow(clippy::print_stderr)]
pub fn child_main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let (report, libraries) = match parse_child_args(args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("imgbuild-smoke child: {message}");
            return ExitCode::from(2);
        }
    };
    let report = gpu::run_observed(&libraries, report, &mut |event| match event {
        LoadEvent::Loading(path) => say(LOADING, &encode(path)),
        LoadEvent::Loaded(path) => say(LOADED, &encode(path)),
    });
    let verdict = report.verdict;
    say(REPORT, &serde_json::to_string(&report).unwrap_or_default());
    ExitCode::from(verdict.exit_code())
}

/// One line to the parent, flushed before the next library can crash this process. A
/// parent that stopped listening changes nothing here, so errors are dropped.
fn say(marker: &str, text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{marker}{text}");
    let _ = stdout.flush();
}

fn parse_child_args(
    args: impl IntoIterator<Item = OsString>,
) -> Result<(SmokeReport, CudaLibraries), String> {
    let mut args = args.into_iter();
    let report = args.next().ok_or("no report given")?;
    let report: SmokeReport = serde_json::from_str(report.to_str().ok_or("report not UTF-8")?)
        .map_err(|e| format!("the report does not parse: {e}"))?;
    let mut libraries = CudaLibraries {
        cuda_version: report.image_cuda.clone(),
        ..CudaLibraries::default()
    };
    while let Some(option) = args.next() {
        let slot = match option.to_str() {
            Some(CUDART) => &mut libraries.cudart,
            Some(NVRTC) => &mut libraries.nvrtc,
            Some(NVRTC_BUILTINS) => &mut libraries.nvrtc_builtins,
            _ => return Err(format!("unknown argument {option:?}")),
        };
        let path = args.next().ok_or(format!("{option:?} needs a path"))?;
        *slot = Some(PathBuf::from(path));
    }
    Ok((report, libraries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> SmokeReport {
        SmokeReport::new(
            "images/x".into(),
            Some("12.1".into()),
            vec![
                "opt/conda/lib/libcudart.so.12".into(),
                "opt/conda/lib/libnvrtc.so.12".into(),
            ],
        )
    }

    fn heard(lines: &[String]) -> Transcript {
        let mut transcript = Transcript::default();
        for line in lines {
            transcript.hear(line);
        }
        transcript
    }

    #[test]
    fn a_child_killed_while_loading_names_the_library_and_the_signal() {
        let transcript = heard(&[
            format!("{LOADING}{}", encode(Path::new("/tmp/s/libcudart.so.12"))),
            format!("{LOADED}{}", encode(Path::new("/tmp/s/libcudart.so.12"))),
            format!("{LOADING}{}", encode(Path::new("/tmp/s/libnvrtc.so.12"))),
        ]);
        let report = transcript.conclude(report(), ExitStatus::from_raw(7));
        assert_eq!(report.verdict, Verdict::KernelFailure);
        assert_eq!(
            report.message,
            "loading `libnvrtc.so.12` (opt/conda/lib/libnvrtc.so.12) crashed the smoke test: \
             its process was killed by signal 7 (SIGBUS)"
        );
        assert_eq!(report.image_cuda.as_deref(), Some("12.1"));
    }

    #[test]
    fn a_child_that_reported_and_exited_with_its_verdict_is_believed() {
        let mut sent = report();
        sent.message = "no NVIDIA driver found".into();
        let line = format!("noise{REPORT}{}", serde_json::to_string(&sent).unwrap());
        let report = heard(&[line]).conclude(report(), ExitStatus::from_raw(3 << 8));
        assert_eq!(report.verdict, Verdict::NoDevice);
        assert_eq!(report.message, "no NVIDIA driver found");
    }

    #[test]
    fn a_child_that_exits_without_a_report_is_a_kernel_failure() {
        let report = heard(&[]).conclude(report(), ExitStatus::from_raw(1 << 8));
        assert_eq!(report.verdict, Verdict::KernelFailure);
        assert_eq!(
            report.message,
            "the smoke test's process exited with status 1 before loading any library"
        );
    }

    #[test]
    fn child_arguments_round_trip() {
        let args = [
            serde_json::to_string(&report()).unwrap(),
            NVRTC.into(),
            "/tmp/s/libnvrtc.so.12".into(),
        ];
        let (parsed, libraries) = parse_child_args(args.map(OsString::from)).unwrap();
        assert_eq!(parsed.image, "images/x");
        assert_eq!(
            libraries.nvrtc.as_deref(),
            Some(Path::new("/tmp/s/libnvrtc.so.12"))
        );
        assert_eq!(libraries.cuda_version.as_deref(), Some("12.1"));
        assert!(parse_child_args([OsString::from("{}"), "--x".into()]).is_err());
    }
}
