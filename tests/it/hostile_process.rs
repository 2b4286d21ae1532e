//! Issue 15, the process around imgbuild: output to a pipe whose reader is gone, and a thread
//! count far beyond the machine.
//!
//! - A closed stdout or stderr (`imgbuild completions bash | head -1`, `imgbuild lock X 2>&1
//!   | head -1`) ends imgbuild the way it ends `cat`: killed by SIGPIPE, silently; it used to
//!   panic (exit 101, a panic message and a backtrace). The pipes here have their read end
//!   closed before imgbuild starts, so its first write fails, whatever the timing.
//! - `IMGBUILD_JOBS=100000` used to start 100 000 compression threads (over 5 minutes for
//!   3 layers); it is cut down to 4 per CPU with a warning, and gives the bytes `-j 1` gives.
//!   `-j 0` is refused.

use std::{
    os::unix::process::ExitStatusExt,
    path::Path,
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use crate::{
    common::Project,
    support::{channel::tiny_recipe, shared_channel},
};

const SIGPIPE: i32 = 13;

/// imgbuild with `args` in `project`, its cache and a clean environment plus `envs`.
fn imgbuild(project: &Project, args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut command = project.command(args);
    command.envs(envs.iter().copied()).stdin(Stdio::null());
    command
}

/// Runs `command` to its end; a run past a generous deadline is a hang, killed and reported.
fn wait(mut command: Command, what: &str) -> ExitStatus {
    let mut child = command.spawn().expect("starting imgbuild");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("imgbuild {what} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The write end of a pipe whose read end is already closed.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    writer
}

/// Ended as a process that writes to a closed pipe should: by SIGPIPE, never a panic's 101.
#[track_caller]
fn assert_ended_by_sigpipe(status: ExitStatus, stderr: &str) {
    assert_ne!(status.code(), Some(101), "a panic: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.signal(), Some(SIGPIPE), "{status}: {stderr}");
}

#[allow(clippy::disallowed_methods, reason = "Stdio takes a std::fs::File")]
#[test]
fn completions_into_a_closed_pipe_end_quietly() {
    let project = Project::new();
    let stderr_path = project.path().join("stderr");
    let mut command = imgbuild(&project, &["completions", "bash"], &[]);
    command
        .stdout(closed_pipe())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    let status = wait(command, "completions bash");
    let stderr = fs_err::read_to_string(&stderr_path).unwrap();
    assert_ended_by_sigpipe(status, &stderr);
    assert_eq!(stderr, "", "nothing said on stderr either");
}

/// `imgbuild lock X 2>&1 | head -1`: progress lines go to stderr, the result to stdout, both
/// into a pipe nobody reads.
#[allow(clippy::disallowed_methods, reason = "Stdio takes a std::fs::File")]
#[test]
fn progress_into_a_closed_pipe_ends_quietly() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "pipe", &["hello 1.0"]));
    let pipe = closed_pipe();
    let mut command = imgbuild(&project, &["lock", "recipes/image.toml"], &[]);
    command.stdout(pipe.try_clone().unwrap()).stderr(pipe);
    let status = wait(command, "lock 2>&1 into a closed pipe");
    // stderr is the closed pipe, so a panic message would be lost: the status tells.
    assert_ended_by_sigpipe(status, "");

    // With only stderr closed (a progress reader that went away), the same.
    let stdout_path = project.path().join("stdout");
    let mut command = imgbuild(&project, &["build", "recipes/image.toml"], &[]);
    command
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(closed_pipe());
    assert_ended_by_sigpipe(wait(command, "build 2>closed"), "");
}

/// Builds `project`'s recipe (its lock given) with `args` and `envs`; the digest and stderr.
#[allow(clippy::disallowed_methods, reason = "Stdio takes a std::fs::File")]
fn build(project: &Project, args: &[&str], envs: &[(&str, &str)]) -> (String, String) {
    let out = project.path().join("build.out");
    let err = project.path().join("build.err");
    let mut all = vec!["build", "recipes/image.toml", "--locked"];
    all.extend_from_slice(args);
    let mut command = imgbuild(project, &all, envs);
    command
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let status = wait(command, &format!("build {args:?} {envs:?}"));
    let stderr = fs_err::read_to_string(&err).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    let stdout = fs_err::read_to_string(&out).unwrap();
    let digest = stdout
        .lines()
        .next()
        .and_then(|l| l.rsplit_once('@'))
        .map(|(_, d)| d.to_string())
        .unwrap_or_else(|| panic!("no result line: {stdout}"));
    (digest, stderr)
}

#[test]
fn a_huge_job_count_is_cut_down_and_changes_no_byte() {
    let recipe = tiny_recipe(shared_channel(), "jobs", &["hello 1.0", "pyhello", "other"]);
    let one = Project::new();
    one.write_recipe(&recipe);
    one.run(&["lock", "recipes/image.toml"]).success();
    let (digest_1, _) = build(&one, &["-j", "1"], &[]);

    let many = Project::new();
    many.write_recipe(&recipe);
    fs_err::copy(one.lock_path(), many.lock_path()).unwrap();
    let (digest_many, stderr) = build(&many, &[], &[("IMGBUILD_JOBS", "100000")]);
    assert_eq!(digest_many, digest_1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let warning = format!(
        "warning: --jobs 100000 is more than 4 compression threads per CPU; using {} ({cpus} CPUs)",
        4 * cpus
    );
    assert!(stderr.contains(&warning), "{stderr}");

    // 0 threads is no request imgbuild can meet: a usage error, from the flag or the variable.
    for (args, envs) in [
        (&["-j", "0"][..], &[][..]),
        (&[][..], &[("IMGBUILD_JOBS", "0")][..]),
    ] {
        let mut all = vec!["build", "recipes/image.toml", "--locked"];
        all.extend_from_slice(args);
        let output = imgbuild(&many, &all, envs).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("0 threads cannot compress anything"),
            "{stderr}"
        );
    }
    assert!(Path::new(&many.path().join("images/jobs")).is_dir());
}
