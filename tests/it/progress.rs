//! Build output: `--json` events, `--quiet`, and plain progress lines when stderr is not a
//! terminal (it never is under the tests).

use serde_json::Value;

use crate::{
    common::{FileServer, LayoutView, Project},
    support::{channel::tiny_recipe, shared_channel},
};

pub(crate) fn project() -> Project {
    let project = Project::new();
    // hello pulls in the CUDA runtime: the recipe says so, so that the build has nothing
    // to warn about (a runtime without `[cuda]` is a warning, issue 16).
    project.write_recipe(
        &(tiny_recipe(shared_channel(), "progress", &["hello 1.0"])
            + "\n[cuda]\nversion = \"11.8\"\n"),
    );
    project
}

#[test]
fn json_events_parse_line_by_line_and_end_with_the_result() {
    let project = project();
    let run = project.build(&["--json"]).success();
    let events: Vec<Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap(),
                e["stage"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let mut expected = Vec::new();
    for stage in ["solve", "install", "layers", "write"] {
        expected.push(("stage-started", stage));
        expected.push(("stage-finished", stage));
    }
    expected.push(("lock", ""));
    expected.push(("result", ""));
    assert_eq!(kinds, expected, "{}", run.stdout);

    let result = events.last().unwrap();
    let layout = LayoutView::new(project.path().join("images/progress"));
    assert_eq!(result["digest"], layout.manifest_digest().as_str());
    assert_eq!(
        result["images"][0],
        format!("images/progress:latest@{}", layout.manifest_digest()).as_str()
    );
    let manifest_layers = layout.manifest()["layers"].as_array().unwrap().clone();
    assert_eq!(result["layers"], manifest_layers.len());
    let compressed: u64 = manifest_layers
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    assert_eq!(result["compressed_size"], compressed);
    assert!(result["total_size"].as_u64().unwrap() > compressed);
    for stage in ["solve", "install", "layers", "write"] {
        assert!(result["timings"][stage].is_number(), "{result}");
    }

    let finished = |stage: &str| {
        events
            .iter()
            .find(|e| e["event"] == "stage-finished" && e["stage"] == stage)
            .unwrap()
            .clone()
    };
    assert_eq!(finished("install")["items"], result["packages"]);
    // A local channel is read in place: nothing to download, but the field is there.
    assert!(finished("install")["downloaded_bytes"].is_u64());
    assert_eq!(finished("layers")["items"], result["new_layers"]);
    assert_eq!(finished("layers")["bytes"], compressed);
    assert!(finished("solve")["seconds"].is_number());
    assert_eq!(events[events.len() - 2]["outcome"], "written");
}

#[test]
fn json_failures_before_the_build_starts_end_with_an_error_event_too() {
    // A bad SOURCE_DATE_EPOCH and an unknown --variant are refused before any stage
    // starts: each is the one event (they used to print text only).
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "x", &["hello 1.0"]));
    // (extra arguments, environment, what the message names)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 2] = [
        (
            &["--json"],
            &[("SOURCE_DATE_EPOCH", "yesterday")],
            "SOURCE_DATE_EPOCH",
        ),
        (&["--json", "--variant", "nope"], &[], "nope"),
    ];
    for (args, envs, named) in cases {
        let mut all = vec!["build", "recipes/image.toml"];
        all.extend_from_slice(args);
        let run = project.run_with(&all, envs, None);
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        assert_eq!(run.stdout.lines().count(), 1, "{args:?}: {}", run.stdout);
        let event: Value = serde_json::from_str(run.stdout.trim()).unwrap();
        assert_eq!(event["event"], "error", "{args:?}");
        assert_eq!(event["exit_code"], 1, "{args:?}");
        assert!(
            event["message"].as_str().unwrap().contains(named),
            "{args:?}: {event}"
        );
        // The text is still on stderr for a person reading the log.
        assert!(run.stderr.contains("error:"), "{args:?}: {}", run.stderr);
    }
}

#[test]
fn json_failure_ends_with_an_error_event() {
    let project = Project::new();
    project.write_recipe("[image]\nname = \"x\"\nnmae = \"y\"\n");
    let run = project.build(&["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let last: Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "error");
    assert_eq!(last["exit_code"], 1);
    // A recipe error happens before any stage starts.
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("did you mean `name`?")
    );
}

#[test]
fn quiet_prints_nothing_but_the_result_line() {
    let project = project();
    let run = project.build(&["--quiet"]).success();
    assert_eq!(run.stderr, "", "stderr must be empty");
    let layout = LayoutView::new(project.path().join("images/progress"));
    assert_eq!(
        run.stdout,
        format!("images/progress:latest@{}\n", layout.manifest_digest())
    );
}

#[test]
fn plain_lines_when_stderr_is_not_a_terminal() {
    let project = project();
    let run = project.build(&[]).success();
    for needle in [
        "Solving 1 dependency for linux-64",
        "Installing",
        "Installed 2 packages in",
        "Wrote 3 layers (",
        "Built",
    ] {
        assert!(
            run.stderr.contains(needle),
            "`{needle}` in:\n{}",
            run.stderr
        );
    }
    assert!(
        !run.stderr.contains('\r'),
        "no bar redraws:\n{}",
        run.stderr
    );
}

#[test]
fn the_took_line_names_the_stages_as_the_json_events_do() {
    let project = project();
    let run = project.build(&[]).success();
    let took = run
        .stderr
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Took "))
        .unwrap_or_else(|| panic!("a `Took` line in:\n{}", run.stderr));
    // `stage seconds` pairs: the stage names of `stage-started` and of `timings` (the
    // solve stage was once `lock` here).
    let stages: Vec<&str> = took
        .split(", ")
        .map(|timing| timing.split(' ').next().unwrap())
        .collect();
    assert_eq!(stages, ["solve", "install", "layers", "write"], "{took}");
}

#[test]
fn json_counts_bytes_downloaded_from_a_served_channel() {
    let served = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(shared_channel(), served.path().join("testchan")).unwrap();
    let server = FileServer::serve(served.path().to_path_buf());
    let project = Project::new();
    project.write_recipe(
        "[image]\nname = \"remote\"\n[conda]\nchannels = [\"testchan\"]\ndependencies = [\"hello 1.0\"]\n",
    );
    let run = project
        .run_with(
            &["build", "recipes/image.toml", "--json"],
            &[("IMGBUILD_CHANNEL_ALIAS", server.url.as_str())],
            None,
        )
        .success();
    let install: Value = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|e| e["event"] == "stage-finished" && e["stage"] == "install")
        .expect("an install stage-finished event");
    // hello and its dependency, as package archives of a few hundred bytes at least.
    assert!(
        install["downloaded_bytes"].as_u64().unwrap() > 500,
        "{install}"
    );
    assert_eq!(install["ok"], true);
}

/// The count of the stage line `{verb} N package(s)` in `stderr`.
fn packages_after(stderr: &str, verb: &str) -> usize {
    let line = stderr
        .lines()
        .map(str::trim_start)
        .find_map(|l| l.strip_prefix(verb))
        .unwrap_or_else(|| panic!("a `{verb}` line in:\n{stderr}"));
    line.trim_start()
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count in `{line}`"))
}

#[test]
fn one_package_is_counted_in_the_singular() {
    let project = Project::new();
    // The libgcc-ng stand-in depends on nothing: one package in all.
    project.write_recipe(&tiny_recipe(shared_channel(), "single", &["libgcc-ng"]));
    let run = project.build(&[]).success();
    for needle in ["Installing 1 package\n", "Installed 1 package in"] {
        assert!(
            run.stderr.contains(needle),
            "`{needle}` in:\n{}",
            run.stderr
        );
    }
    assert!(!run.stderr.contains("1 packages"), "{}", run.stderr);
}

#[test]
fn the_finished_install_line_counts_the_pypi_wheels_it_announced() {
    use crate::support::pypi::{SIX_1_16_0, pinned_dists, pypi_channel};
    let project = Project::new();
    let wheels = project.path().join("recipes/wheels");
    fs_err::create_dir_all(&wheels).unwrap();
    for (path, _) in pinned_dists(&[SIX_1_16_0]).unwrap() {
        fs_err::copy(&path, wheels.join(path.file_name().unwrap())).unwrap();
    }
    project.write_recipe(
        &(tiny_recipe(pypi_channel(), "pycount", &["python"])
            + "\n[pypi]\nno-index = true\nfind-links = [\"wheels\"]\ndependencies = [\"six\"]\n"),
    );
    let run = project.build(&[]).success();
    let announced = packages_after(&run.stderr, "Installing");
    assert_eq!(
        packages_after(&run.stderr, "Installed"),
        announced,
        "{}",
        run.stderr
    );
    // The one local wheel is read once (for its metadata, whose sha256 the lock keeps), and
    // said to be read, not fetched.
    let fetched = run
        .stderr
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("Fetched "))
        .unwrap_or_else(|| panic!("a Fetched line in:\n{}", run.stderr));
    assert!(
        fetched.starts_with("Fetched 1 local wheel read (") && fetched.ends_with(" KiB)"),
        "{fetched}"
    );
    fs_err::remove_file(project.path().join("recipes/image.lock")).unwrap();
    let lock = project
        .run(&["lock", "recipes/image.toml", "--json"])
        .success();
    let solve = stage_finished(&events(&lock.stdout), "solve");
    assert_eq!(
        (&solve["pypi_wheels"], &solve["pypi_local_wheels"]),
        (&Value::from(0), &Value::from(1)),
        "{solve}"
    );

    // The JSON event counts the same packages as the lock (the image removed, so the
    // build installs again instead of finding it unchanged).
    fs_err::remove_dir_all(project.path().join("images/pycount")).unwrap();
    let run = project.build(&["--json", "--locked"]).success();
    let events: Vec<Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let result = events.iter().find(|e| e["event"] == "result").unwrap();
    let install = events
        .iter()
        .find(|e| e["event"] == "stage-finished" && e["stage"] == "install")
        .unwrap_or_else(|| panic!("an install stage:\n{}", run.stdout));
    assert_eq!(install["items"], result["packages"], "{}", run.stdout);
    assert_eq!(result["packages"], announced, "{}", run.stdout);
}

/// A wheel `zzbad-1.0` whose METADATA resolves and whose one file climbs out of the
/// environment, so that its install, not its lock, fails.
fn write_escaping_wheel(dir: &std::path::Path) {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("zzbad-1.0.dist-info/METADATA", options)
        .unwrap();
    zip.write_all(b"Metadata-Version: 2.1\nName: zzbad\nVersion: 1.0\n")
        .unwrap();
    zip.start_file("../escape.txt", options).unwrap();
    zip.write_all(b"out\n").unwrap();
    let bytes = zip.finish().unwrap().into_inner();
    fs_err::write(dir.join("zzbad-1.0-py3-none-any.whl"), bytes).unwrap();
}

#[test]
fn wheels_count_as_each_is_installed() {
    use crate::support::pypi::{SIX_1_16_0, pinned_dists, pypi_channel};
    let project = Project::new();
    let wheels = project.path().join("recipes/wheels");
    fs_err::create_dir_all(&wheels).unwrap();
    for (path, _) in pinned_dists(&[SIX_1_16_0]).unwrap() {
        fs_err::copy(&path, wheels.join(path.file_name().unwrap())).unwrap();
    }
    let recipe = |requirements: &str| {
        tiny_recipe(pypi_channel(), "pyeach", &["python"])
            + &format!(
                "\n[pypi]\nno-index = true\nfind-links = [\"wheels\"]\ndependencies = [{requirements}]\n"
            )
    };
    project.write_recipe(&recipe("\"six\""));
    let run = project.build(&["--json"]).success();
    let installed = stage_finished(&events(&run.stdout), "install")["items"].clone();
    // A second wheel whose install fails: six, installed before it, is counted already.
    write_escaping_wheel(&wheels);
    project.write_recipe(&recipe("\"six\", \"zzbad\""));
    fs_err::remove_file(project.path().join("recipes/image.lock")).unwrap();
    let run = project.build(&["--json"]);
    assert_ne!(run.code, 0, "{}", run.stderr);
    let install = stage_finished(&events(&run.stdout), "install");
    assert_eq!(install["ok"], false, "{install}");
    assert_eq!(install["items"], installed, "{install}");
}

#[test]
fn a_post_link_script_is_warned_about_by_package_and_script() {
    use crate::support::channel::{executable, index_channel, linux64_index, write_package};
    let channel = tempfile::tempdir().unwrap();
    let linux64 = channel.path().join("linux-64");
    fs_err::create_dir_all(&linux64).unwrap();
    fs_err::create_dir_all(channel.path().join("noarch")).unwrap();
    write_package(
        &linux64.join("postlinker-1.0-h0_0.tar.bz2"),
        linux64_index("postlinker", "1.0", &[]),
        &[
            executable("bin/postlinker", "#!/bin/sh\necho hi\n"),
            executable(
                "bin/.postlinker-post-link.sh",
                "#!/bin/sh\necho installing >> \"$PREFIX/.messages.txt\"\n",
            ),
        ],
        None,
    )
    .unwrap();
    index_channel(channel.path()).unwrap();
    let project = Project::new();
    project.write_recipe(&tiny_recipe(channel.path(), "postlink", &["postlinker"]));
    let run = project.build(&[]).success();
    assert!(
        run.stderr.contains(
            "warning: package `postlinker-1.0-h0_0` has a post-link script \
             `bin/.postlinker-post-link.sh` that is not run at build time"
        ),
        "{}",
        run.stderr
    );
}

/// The JSON events of a run's stdout.
pub(crate) fn events(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn stage_finished(events: &[Value], stage: &str) -> Value {
    events
        .iter()
        .find(|e| e["event"] == "stage-finished" && e["stage"] == stage)
        .unwrap_or_else(|| panic!("a {stage} stage-finished event in {events:?}"))
        .clone()
}

/// The bytes of the archives of `channel` that the project's lock names.
fn locked_archive_bytes(project: &Project, channel: &std::path::Path) -> u64 {
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    let mut total = 0;
    for subdir in ["linux-64", "noarch"] {
        for entry in fs_err::read_dir(channel.join(subdir)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if (name.ends_with(".conda") || name.ends_with(".tar.bz2")) && lock.contains(&name) {
                total += entry.metadata().unwrap().len();
            }
        }
    }
    total
}

#[test]
fn install_counts_the_bytes_of_the_archives_it_checks_and_extracts() {
    let project = project();
    let run = project.build(&["--json"]).success();
    let expected = locked_archive_bytes(&project, shared_channel());
    assert!(expected > 500, "hello and the CUDA runtime: {expected}");
    let install = stage_finished(&events(&run.stdout), "install");
    assert_eq!(install["package_bytes"], expected, "{install}");

    // From the cache (checked before, nothing extracted again) the packages count whole.
    fs_err::remove_dir_all(project.path().join("images/progress")).unwrap();
    let run = project.build(&["--json", "--locked"]).success();
    let install = stage_finished(&events(&run.stdout), "install");
    assert_eq!(install["package_bytes"], expected, "{install}");

    // Without a terminal, one line once the archives are through, before the link.
    fs_err::remove_dir_all(project.path().join("images/progress")).unwrap();
    let run = project.build(&["--locked"]).success();
    let lines: Vec<&str> = run.stderr.lines().map(str::trim_start).collect();
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("`{prefix}` in:\n{}", run.stderr))
    };
    assert!(
        lines[at("Extracted ")].contains(" of package archives in "),
        "{}",
        run.stderr
    );
    assert!(at("Installing") < at("Extracted ") && at("Extracted ") < at("Installed"));
}

#[test]
fn a_base_pull_reports_its_blobs_and_bytes() {
    use crate::{
        registry::{Auth, Registry},
        support::base::busybox_base_layout,
    };
    let registry = Registry::start(Auth::None);
    let project = Project::new();
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    let docker = docker.display().to_string();
    let auth = format!("{docker}/auth.json");
    let envs = [
        ("DOCKER_CONFIG", docker.as_str()),
        ("REGISTRY_AUTH_FILE", auth.as_str()),
    ];
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let base_ref = format!("{}/base/busybox:1", registry.host);
    let push = ["push", base.to_str().unwrap(), &base_ref, "--insecure"];
    project.run_with(&push, &envs, None).success();
    project.write_recipe(
        &tiny_recipe(shared_channel(), "onbase", &["libgcc-ng"])
            .replace("base = \"scratch\"", &format!("base = \"{base_ref}\"")),
    );

    let build = ["build", "recipes/image.toml", "--insecure", "--json"];
    let run = project.run_with(&build, &envs, None).success();
    let events = events(&run.stdout);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds[..3],
        ["pull-started", "pull-finished", "stage-started"]
    );
    // The manifest's config and its one layer, with their sizes.
    let manifest = LayoutView::new(&base).manifest();
    let sizes: Vec<u64> = std::iter::once(&manifest["config"])
        .chain(manifest["layers"].as_array().unwrap())
        .map(|d| d["size"].as_u64().unwrap())
        .collect();
    let (started, finished) = (&events[0], &events[1]);
    assert_eq!(started["reference"], base_ref.as_str(), "{started}");
    assert_eq!(started["platform"], "linux/amd64");
    assert_eq!(started["blobs"], 2);
    assert_eq!(started["bytes"], sizes.iter().sum::<u64>());
    assert_eq!(finished["blobs"], 2, "{finished}");
    assert_eq!(finished["downloaded_blobs"], 2);
    assert_eq!(finished["downloaded_bytes"], started["bytes"]);

    // Again, without a terminal: both blobs come from the cache.
    let again = [
        "build",
        "recipes/image.toml",
        "--insecure",
        "-o",
        "out/again",
    ];
    let run = project.run_with(&again, &envs, None).success();
    let lines: Vec<&str> = run.stderr.lines().map(str::trim_start).collect();
    let pulling = format!("Pulling {base_ref} for linux/amd64: 2 blobs, ");
    assert!(
        lines.iter().any(|l| l.starts_with(&pulling)),
        "{}",
        run.stderr
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("Pulled 2 blobs (none downloaded) in ")),
        "{}",
        run.stderr
    );
}

/// A scratch project (glibc 2.17) whose `[pypi]` section asks `requirements` of `index`.
fn pypi_project(index: &crate::support::pypi::SimpleIndex, requirements: &str) -> Project {
    let project = Project::new();
    project.write_recipe(
        &(tiny_recipe(
            crate::support::pypi::pypi_channel(),
            "pyprogress",
            &["python"],
        ) + &format!(
            "\n[pypi]\nindex-url = \"{}\"\ndependencies = [{requirements}]\n",
            index.url()
        )),
    );
    project
}

#[test]
fn the_pypi_resolution_counts_the_projects_and_wheels_it_fetched() {
    use crate::support::pypi::{DATEUTIL_2_9_0_POST0, SIX_1_16_0, SimpleIndex, pinned_dists};
    let dists = pinned_dists(&[SIX_1_16_0, DATEUTIL_2_9_0_POST0]).unwrap();
    let wheel_bytes: u64 = dists
        .iter()
        .map(|(path, _)| fs_err::metadata(path).unwrap().len())
        .sum();
    // No PEP 658 metadata: the resolution reads both wheels whole.
    let index = SimpleIndex::builder()
        .dists(&dists)
        .metadata(false)
        .serve()
        .unwrap();
    let project = pypi_project(&index, "\"python-dateutil\"");
    let run = project
        .run(&["lock", "recipes/image.toml", "--json"])
        .success();
    let solve = stage_finished(&events(&run.stdout), "solve");
    assert_eq!(solve["pypi_projects"], 2, "{solve}");
    assert_eq!(solve["pypi_metadata"], 0, "{solve}");
    assert_eq!(solve["pypi_wheels"], 2, "{solve}");
    assert_eq!(solve["pypi_wheel_bytes"], wheel_bytes, "{solve}");
    // The conda packages were read for the Python distributions they provide.
    let conda = locked_archive_bytes(&project, crate::support::pypi::pypi_channel());
    assert!(conda > 0);
    assert_eq!(solve["package_bytes"], conda, "{solve}");

    // With metadata, no wheel is read; without a terminal, one line says what was.
    let index = SimpleIndex::serve(&dists).unwrap();
    let project = pypi_project(&index, "\"python-dateutil\"");
    let run = project.run(&["lock", "recipes/image.toml"]).success();
    let lines: Vec<&str> = run.stderr.lines().map(str::trim_start).collect();
    let fetched = lines
        .iter()
        .position(|l| *l == "Fetched 2 PyPI projects and 2 metadata files")
        .unwrap_or_else(|| panic!("the Fetched line in:\n{}", run.stderr));
    assert!(
        lines[fetched + 1].starts_with("Solved in "),
        "{}",
        run.stderr
    );
    // Before the resolution, the conda packages it reads.
    assert!(
        lines[..fetched]
            .iter()
            .any(|l| l.starts_with("Extracted ") && l.contains(" of package archives in ")),
        "{}",
        run.stderr
    );
}

#[test]
fn wheels_skipped_for_a_newer_glibc_than_scratch_are_named_with_the_setting() {
    use crate::support::pypi::{SIX_1_16_0, SimpleIndex, pinned_dists};
    let mut dists = pinned_dists(&[SIX_1_16_0]).unwrap();
    // A newer six built for glibc 2.28 only (its bytes are 1.16.0's: it is never read).
    let newer = tempfile::tempdir().unwrap();
    let file = "six-1.17.0-cp39-cp39-manylinux_2_28_x86_64.whl";
    fs_err::copy(&dists[0].0, newer.path().join(file)).unwrap();
    dists.push((newer.path().join(file), "six".to_string()));
    let index = SimpleIndex::serve(&dists).unwrap();
    let project = pypi_project(&index, "\"six\"");

    let run = project.run(&["lock", "recipes/image.toml"]).success();
    let warning = run
        .stderr
        .lines()
        .find(|l| l.starts_with("warning: wheels for a newer glibc"))
        .unwrap_or_else(|| panic!("a glibc warning in:\n{}", run.stderr));
    for needle in [
        "than 2.17 were skipped: `six-1.17.0-cp39-cp39-manylinux_2_28_x86_64.whl`.",
        "a `scratch` base",
        "`[image] glibc = \"2.28\"`",
    ] {
        assert!(warning.contains(needle), "`{needle}` in {warning}");
    }
    // The lock holds the wheel 2.17 takes.
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("six-1.16.0-py2.py3-none-any.whl"), "{lock}");

    let run = project
        .run(&["lock", "recipes/image.toml", "--json"])
        .success();
    let warned = events(&run.stdout)
        .into_iter()
        .any(|e| e["event"] == "warning" && e["message"] == warning["warning: ".len()..]);
    assert!(warned, "{}", run.stdout);
}

/// `bigdata-1.0-py3-none-any.whl` in `dir`, whose `METADATA` comes first and 300 KiB of
/// data after it, as a wheel built by a tool that writes its dist-info first: its metadata
/// is not in the tail. Returns the offset of the member's local header.
fn write_metadata_first_wheel(dir: &std::path::Path) -> u64 {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file(
        "bigdata-1.0.dist-info/METADATA",
        zip::write::SimpleFileOptions::default(),
    )
    .unwrap();
    zip.write_all(b"Metadata-Version: 2.1\nName: bigdata\nVersion: 1.0\nRequires-Dist: six\n")
        .unwrap();
    zip.start_file("bigdata/data.bin", stored).unwrap();
    let data: Vec<u8> = (0..300u32 << 10).map(|i| (i * 7919 % 251) as u8).collect();
    zip.write_all(&data).unwrap();
    fs_err::write(
        dir.join("bigdata-1.0-py3-none-any.whl"),
        zip.finish().unwrap().into_inner(),
    )
    .unwrap();
    0
}

#[test]
fn without_pep_658_a_wheels_metadata_is_read_by_ranges_where_the_server_takes_them() {
    use crate::{
        servers::range::{Drops, RangeServer, Ranges},
        support::{
            channel::sha256_file,
            pypi::{DATEUTIL_2_9_0_POST0, SIX_1_16_0, pinned_dists},
        },
    };
    let served = tempfile::tempdir().unwrap();
    let mut links = String::new();
    let mut wheel_bytes = 0;
    for (path, _) in pinned_dists(&[SIX_1_16_0, DATEUTIL_2_9_0_POST0]).unwrap() {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        fs_err::copy(&path, served.path().join(&name)).unwrap();
        wheel_bytes += fs_err::metadata(&path).unwrap().len();
        let sha256 = sha256_file(&path).unwrap();
        links.push_str(&format!("<a href=\"{name}#sha256={sha256}\">{name}</a>\n"));
    }
    let big = "bigdata-1.0-py3-none-any.whl";
    let metadata_at = write_metadata_first_wheel(served.path());
    let big_path = served.path().join(big);
    wheel_bytes += fs_err::metadata(&big_path).unwrap().len();
    let sha256 = sha256_file(&big_path).unwrap();
    links.push_str(&format!("<a href=\"{big}#sha256={sha256}\">{big}</a>\n"));
    fs_err::write(served.path().join("links.html"), links).unwrap();

    let lock = |ranges: Ranges| {
        let server = RangeServer::serve(served.path().to_path_buf(), ranges, Drops::Never);
        let project = Project::new();
        project.write_recipe(
            &(tiny_recipe(crate::support::pypi::pypi_channel(), "ranged", &["python"])
                + &format!(
                    "\n[pypi]\nno-index = true\nfind-links = [\"{}links.html\"]\n\
                     dependencies = [\"python-dateutil\", \"bigdata\"]\n",
                    server.url
                )),
        );
        let run = project
            .run(&["lock", "recipes/image.toml", "--json"])
            .success();
        let lock = fs_err::read_to_string(project.lock_path()).unwrap();
        assert!(lock.contains("python_dateutil-2.9.0.post0"), "{lock}");
        assert!(lock.contains("six-1.16.0"), "{lock}");
        (stage_finished(&events(&run.stdout), "solve"), server)
    };

    let (solve, server) = lock(Ranges::Honour);
    assert_eq!(solve["pypi_metadata"], 3, "{solve}");
    assert_eq!(solve["pypi_wheels"], 0, "{solve}");
    // six's and dateutil's METADATA lie in their last 64 KiB: a HEAD and one range each.
    for wheel in [SIX_1_16_0.file_name, DATEUTIL_2_9_0_POST0.file_name] {
        let requests = server.requests_for(wheel);
        let ranges: Vec<Option<&str>> = requests.iter().map(|r| r.range.as_deref()).collect();
        assert!(matches!(ranges[..], [None, Some(_)]), "{requests:#?}");
        assert_eq!(requests[1].status, 206, "{requests:#?}");
    }
    // bigdata's is not: one range more, from its local header.
    let requests = server.requests_for(big);
    let ranges: Vec<Option<&str>> = requests.iter().map(|r| r.range.as_deref()).collect();
    let member = format!("bytes={metadata_at}-");
    assert!(
        matches!(ranges[..], [None, Some(_), Some(m)] if m == member),
        "{requests:#?}"
    );
    // What arrived for the metadata, of 530 KiB of wheels: dateutil's tail is a third of
    // it, six (11 KiB) is all tail, and bigdata's member range is dropped once read.
    let read = solve["pypi_metadata_bytes"].as_u64().unwrap();
    assert!(read < wheel_bytes / 2, "{read} of {wheel_bytes}");

    // A server without ranges: the wheels whole, as before.
    let (solve, server) = lock(Ranges::Ignore);
    assert_eq!(solve["pypi_metadata"], 0, "{solve}");
    assert_eq!(solve["pypi_wheels"], 3, "{solve}");
    assert_eq!(solve["pypi_wheel_bytes"], wheel_bytes, "{solve}");
    let gets: Vec<_> = server
        .requests_for(".whl")
        .into_iter()
        .filter(|r| r.range.is_some())
        .collect();
    assert!(gets.is_empty(), "no range asked of it: {gets:#?}");
}
