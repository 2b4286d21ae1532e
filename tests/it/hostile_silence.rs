//! Servers that stop answering (issue 26: every network wait has a timeout). A conda channel
//! that takes the request and never answers, one whose package download stops mid-body,
//! and a PyPI index that never answers: each build fails once the server has been silent
//! for `IMGBUILD_HTTP_TIMEOUT` seconds, with an error naming the server, and leaves the
//! previous image as it was. A timeout that is not a number of seconds is refused up front.
//! The deadline of `run_with_deadline` only guards against a hang; nothing here is timed.

use std::time::Duration;

use crate::{
    common::{Project, Run, run_with_deadline},
    servers::scripted::{Reply, Scripted},
    support::{channel::tiny_recipe, shared_channel},
    trust::Tree,
};

/// How long the servers here stay silent: far past any timeout the tests set.
const SILENCE: Duration = Duration::from_secs(3_600);

/// Serves `channel`'s `linux-64` and `noarch` files under `/chan/`; a request for which
/// `stalls` holds gets its reply head, then nothing more.
fn channel_server(stalls: impl Fn(&str) -> bool + Send + Sync + 'static) -> Scripted {
    let root = shared_channel().to_path_buf();
    Scripted::start("127.0.0.1", move |request| {
        let Some(rel) = request.path().strip_prefix("/chan/") else {
            return Reply::status(404);
        };
        match fs_err::read(root.join(rel)) {
            Ok(bytes) if stalls(rel) => Reply::drip(200, "", SILENCE).declaring(bytes.len() as u64),
            Ok(bytes) => Reply::bytes(200, bytes),
            Err(_) => Reply::status(404),
        }
    })
}

/// A server that takes every request and never sends a byte back.
fn mute_server() -> Scripted {
    Scripted::start("127.0.0.1", |_| {
        std::thread::sleep(SILENCE);
        Reply::status(500)
    })
}

/// A project holding a first image (from the local channel), its recipe then pointed at
/// the channel `url` for `specs`.
fn project_on(url: &str, specs: &[&str]) -> (Project, Tree) {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "silence", &["hello 1.0"]));
    project.build(&[]).success();
    let images = Tree::of(&project.path().join("images"));
    let local = url::Url::from_file_path(shared_channel())
        .unwrap()
        .to_string();
    let recipe = tiny_recipe(shared_channel(), "silence", specs).replace(&local, url);
    project.write_recipe(&recipe);
    (project, images)
}

/// `imgbuild build` (a fresh lock) with the servers allowed `timeout` of silence.
fn build(project: &Project, timeout: &str, extra: &[(&str, &str)]) -> Run {
    let args = ["build", "recipes/image.toml"];
    let mut command = project.command(&args);
    command.env("IMGBUILD_HTTP_TIMEOUT", timeout);
    for (key, value) in extra {
        command.env(key, value);
    }
    run_with_deadline(command, project, &args)
}

#[track_caller]
fn assert_gave_up(project: &Project, images: &Tree, run: &Run, needles: &[&str]) {
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "`{needle}` in:\n{}",
            run.stderr
        );
    }
    assert_eq!(
        &Tree::of(&project.path().join("images")),
        images,
        "the previous image changed"
    );
}

#[test]
fn a_channel_that_never_answers_fails_the_build_naming_it() {
    let server = mute_server();
    let url = format!("{}/chan/", server.url());
    let (project, images) = project_on(&url, &["hello 1.0"]);
    let run = build(&project, "2", &[]);
    assert_gave_up(&project, &images, &run, &[&server.host, "timed out"]);
    assert!(!server.requests().is_empty(), "the channel was asked");
}

#[test]
fn a_package_download_that_stops_fails_the_build_naming_it() {
    let server = channel_server(|path| path.ends_with(".tar.bz2") || path.ends_with(".conda"));
    let url = format!("{}/chan/", server.url());
    let (project, images) = project_on(&url, &["hello 1.0"]);
    // A cache of its own: the package must come from the server, not from the first build.
    let cache = tempfile::tempdir().unwrap();
    let cache = cache.path().to_str().unwrap();
    let run = build(&project, "2", &[("IMGBUILD_CACHE_DIR", cache)]);
    assert_gave_up(
        &project,
        &images,
        &run,
        &[&server.host, "could not be downloaded", "timed out"],
    );
}

#[test]
fn a_pypi_index_that_never_answers_fails_the_build_naming_it() {
    let server = mute_server();
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "silence", &["hello 1.0"]));
    project.build(&[]).success();
    let images = Tree::of(&project.path().join("images"));
    let conda = tiny_recipe(shared_channel(), "silence", &["hello 1.0", "python"]);
    let index = format!("{}/simple", server.url());
    project.write_recipe(&format!(
        "{conda}\n[pypi]\nindex-url = \"{index}\"\ndependencies = [\"six\"]\n"
    ));
    let run = build(&project, "2", &[]);
    assert_gave_up(&project, &images, &run, &[&server.host, "timed out"]);
}

#[test]
fn a_timeout_that_is_not_a_number_of_seconds_is_refused() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "silence", &["hello 1.0"]));
    for bad in ["soon", "0", "-5", "1.5", "86401"] {
        let run = build(&project, bad, &[]);
        run.assert_failure_naming(1, &["IMGBUILD_HTTP_TIMEOUT", bad]);
    }
}
