//! The example commands of the README and of the book's pages (their ```sh blocks) and of
//! every `--help` (its `Examples:` block) run, so the docs cannot drift from the code.
//!
//! Each source runs in a project of its own, in order, as a reader would type them: a temp
//! directory holding the checkout's `recipes/*.toml`, the demo's channel and busybox base at
//! `images/.demo/` (what `cargo run --example make_demo_channel -- images/.demo` writes, made
//! by the same code in `tests/support`), an `environment.yml`, and a `$HOME` of its own with
//! the directories the completion and man page examples write into. `recipes/demo.lock` is
//! written there with `imgbuild lock` first (the checkout's pins its own absolute channel
//! path). `imgbuild` on `PATH` is the binary under test; commands run under
//! `bash -o pipefail -c` and must exit 0.
//!
//! Two rewrites keep them inside the project: `cargo run -- ` becomes `imgbuild ` (the same
//! binary, without compiling it again) and `/tmp/` becomes the project's `tmp/`. What cannot
//! run offline, on a plain machine, is skipped by [`SKIPS`], each rule with its reason; the
//! tests assert how many ran, so a new example has to be run or skipped on purpose.

use std::{path::Path, process::Command};

use crate::support::{base::busybox_base_layout, imgbuild_bin, shared_channel};

/// Commands not run, by the first rule whose pattern the command contains.
const SKIPS: &[(&str, &str)] = &[
    (
        "make_demo_channel",
        "the test makes the same channel and base with the same code (tests/support)",
    ),
    (
        "cargo ",
        "compiles with cargo (minutes); the test runs the binary cargo built for it",
    ),
    (
        "tests/install-deps.sh",
        "installs Debian and PyPI packages (root, network)",
    ),
    ("just ", "just recipes: cargo and zig builds (minutes)"),
    (
        "cd fuzz",
        "fuzzing needs the nightly toolchain and cargo-fuzz",
    ),
    (
        "umoci unpack",
        "the demo's runc part: unpacks and runs the image with runc (root)",
    ),
    (
        "sed -i",
        "the demo's runc part: edits the unpacked bundle of `umoci unpack`",
    ),
    (
        "runc ",
        "the demo's runc part: runs the image with runc (root)",
    ),
    ("kubectl", "needs a Kubernetes cluster"),
    ("docker run", "needs docker and a GPU"),
    ("imgbuild smoke", "needs an NVIDIA GPU and driver"),
    (
        "imgbuild notebook",
        "needs podman and an image with Jupyter (tests/it/notebook.rs runs the command)",
    ),
    (
        "imgbuild push",
        "needs a registry (a remote one, or docker-registry on 127.0.0.1:5000)",
    ),
    (
        "imgbuild sign",
        "needs a registry holding the image (tests/it/signing.rs signs against docker-registry)",
    ),
    (
        "imgbuild login",
        "needs a registry (a remote one, or docker-registry on 127.0.0.1:5000)",
    ),
    ("--push ", "needs a registry"),
    (
        "cache ls",
        "needs a registry (tests/it/cache_repo.rs lists one on docker-registry)",
    ),
    (
        "IMGBUILD_CACHE_REPO=",
        "needs a registry (tests/it/cache_repo.rs builds against docker-registry on 127.0.0.1)",
    ),
    (
        "--cache-repo",
        "needs a registry (tests/it/cache_repo.rs builds against docker-registry on 127.0.0.1)",
    ),
    (
        "py39-torch21",
        "solved against the public conda channels (its lock and image come from that build)",
    ),
    (
        "torch21-matrix",
        "solved against the public conda channels (its locks come from that build)",
    ),
    ("https://", "needs the network (a mirror)"),
    (
        "recipes/x.toml",
        "a placeholder for the reader's own recipe, not in the checkout",
    ),
    (
        "recipes/multi.toml",
        "a placeholder for the reader's own recipe, not in the checkout",
    ),
    (
        "images/app",
        "a placeholder for the reader's own images, not built here",
    ),
    (
        "images/a:",
        "a placeholder for the reader's own images, not built here",
    ),
    (
        "images/multi",
        "a placeholder for the reader's own images, not built here",
    ),
    (
        "images/train",
        "a placeholder for the reader's own images, not built here",
    ),
    (
        "images/serve",
        "a placeholder for the reader's own images, not built here",
    ),
    (
        "recipes/jupyter.toml",
        "its base is Debian's image from Docker Hub (tests/it/jupyter.rs builds the same image offline)",
    ),
    (
        "images/jupyter ",
        "a placeholder for the reader's pushed Jupyter image, not built here",
    ),
    (
        "sbatch ",
        "needs a Slurm cluster (tests/it/slurm_jupyter.rs submits to one of its own)",
    ),
    ("jupyter-4242.out", "the output file of a Slurm job"),
    (
        "ssh -N",
        "needs the site's login node (tests/it/slurm_jupyter.rs runs it against its sshd)",
    ),
    ("scancel", "needs a Slurm cluster"),
    (
        "served.models",
        "a placeholder for the reader's model layout (tests/it/models.rs copies one into podman)",
    ),
    (
        "--mount type=image",
        "needs podman as root (tests/it/models.rs mounts a model so)",
    ),
    (
        "bash build.sh",
        "needs a Slurm cluster (tests/it/slurm_build.rs runs the script on one of its own)",
    ),
    ("skopeo copy docker://", "needs a registry (Docker Hub)"),
    (
        "lock recipes/env.toml",
        "solved against the public channels the environment file names",
    ),
];

/// How many README commands run (the others are skipped by [`SKIPS`]): the demo's build and
/// inspect.
const README_RUN: usize = 2;
/// How many commands of the book's pages run; among them `verify --provenance --lock` and
/// `version`.
const BOOK_RUN: usize = 28;
/// How many distinct `--help` example commands run.
const HELP_RUN: usize = 20;

/// The commands of a text's lines: `\` continuations joined, blank and `#` comment lines
/// left out.
fn commands<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in lines {
        if current.is_empty() {
            current = line.trim().to_string();
        } else {
            current.push(' ');
            current.push_str(line.trim());
        }
        if let Some(head) = current.strip_suffix('\\') {
            current = head.trim_end().to_string();
            continue;
        }
        let command = std::mem::take(&mut current);
        if !command.is_empty() && !command.starts_with('#') {
            out.push(command);
        }
    }
    assert!(
        current.is_empty(),
        "a `\\` continuation ends the block: {current}"
    );
    out
}

/// The commands of a Markdown text's ```sh blocks, in order.
fn sh_commands(readme: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = readme;
    while let Some(start) = rest.find("```sh\n") {
        let block = &rest[start + "```sh\n".len()..];
        let end = block.find("```").expect("a ```sh block is closed");
        out.extend(commands(block[..end].lines()));
        rest = &block[end..][3..];
    }
    out
}

/// The commands of a `--help` text's `Examples:` block (indented lines up to the first
/// blank one).
fn help_commands(help: &str) -> Vec<String> {
    let Some((_, examples)) = help.split_once("\nExamples:\n") else {
        return Vec::new();
    };
    commands(
        examples
            .lines()
            .take_while(|line| line.starts_with("  ") && !line.trim().is_empty()),
    )
}

/// `cargo run -- ARGS` is `imgbuild ARGS`, run by the binary under test.
fn rewrite(command: &str) -> String {
    command.replace("cargo run -- ", "imgbuild ")
}

fn skip_reason(command: &str) -> Option<&'static str> {
    SKIPS
        .iter()
        .find(|(pattern, _)| command.contains(pattern))
        .map(|(_, reason)| *reason)
}

/// A project as described in the module docs.
struct DocsProject {
    dir: tempfile::TempDir,
}

impl DocsProject {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
        let recipes = root.join("recipes");
        fs_err::create_dir_all(&recipes).unwrap();
        for entry in fs_err::read_dir(checkout.join("recipes")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                fs_err::copy(&path, recipes.join(path.file_name().unwrap())).unwrap();
            }
        }
        let demo = root.join("images/.demo");
        fs_err::create_dir_all(&demo).unwrap();
        std::os::unix::fs::symlink(shared_channel(), demo.join("channel")).unwrap();
        busybox_base_layout(&demo.join("base")).unwrap();
        fs_err::copy(
            checkout.join("tests/data/environment-yml/conda-lock-test-env-nodefaults.yml"),
            root.join("environment.yml"),
        )
        .unwrap();
        // The lock files `init --help` imports: real ones (tests/data/locks/MANIFEST.md).
        for (from, to) in [
            ("pixi-multi-env/pixi.lock", "pixi.lock"),
            ("repro-course-ci/conda-lock.yml", "conda-lock.yml"),
            ("esmvalcore/conda-linux-64.lock", "conda-linux-64.lock"),
        ] {
            fs_err::copy(checkout.join("tests/data/locks").join(from), root.join(to)).unwrap();
        }
        for sub in [
            "home/.local/share/bash-completion/completions",
            "home/.local/share/man/man1",
            "home/.zfunc",
            "home/.config/fish/completions",
            "tmp",
            "bin",
        ] {
            fs_err::create_dir_all(root.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(imgbuild_bin(), root.join("bin/imgbuild")).unwrap();
        let project = DocsProject { dir };
        let (code, output) = project.sh("imgbuild lock recipes/demo.toml");
        assert_eq!(code, 0, "setup: imgbuild lock recipes/demo.toml\n{output}");
        project
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `command` (rewritten as the module docs say) in the project; the exit code and
    /// stdout and stderr together.
    fn sh(&self, command: &str) -> (i32, String) {
        let root = self.path();
        let command = command.replace("/tmp/", &format!("{}/tmp/", root.display()));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![root.join("bin")];
        paths.extend(std::env::split_paths(&path));
        let home = root.join("home");
        let output = Command::new("bash")
            .args(["-o", "pipefail", "-c", &command])
            .current_dir(root)
            .env("PATH", std::env::join_paths(paths).unwrap())
            .env("HOME", &home)
            .env("XDG_CACHE_HOME", root.join("xdg-cache"))
            .env("IMGBUILD_CACHE_DIR", root.join("cache"))
            .env("MANPATH", home.join(".local/share/man"))
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env_remove("SOURCE_DATE_EPOCH")
            .env_remove("IMGBUILD_JOBS")
            .env_remove("IMGBUILD_CHANNEL_ALIAS")
            .env_remove("IMGBUILD_SMOKE_EXE")
            .output()
            .expect("running bash");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code().unwrap_or(-1), text)
    }

    /// Runs every command not skipped, in order; panics naming the first that fails.
    /// Returns how many ran.
    fn run_all(&self, source: &str, commands: &[String]) -> usize {
        let mut ran = 0;
        for command in commands {
            let command = &rewrite(command);
            if let Some(reason) = skip_reason(command) {
                eprintln!("{source}: skipped ({reason}): {command}");
                continue;
            }
            let (code, output) = self.sh(command);
            assert_eq!(code, 0, "{source}: `{command}` exited {code}:\n{output}");
            eprintln!("{source}: ran: {command}");
            ran += 1;
        }
        ran
    }
}

#[test]
fn every_offline_readme_example_runs() {
    let readme =
        fs_err::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let commands = sh_commands(&readme);
    assert!(commands.len() > README_RUN, "{commands:#?}");
    let project = DocsProject::new();
    let ran = project.run_all("README.md", &commands);
    assert_eq!(
        ran, README_RUN,
        "README commands run (the rest skipped by SKIPS): update README_RUN on purpose"
    );
    assert!(project.path().join("images/demo/index.json").exists());
    // The demo carries no CUDA: no runtime warning on its build, no NVIDIA settings in it.
    let (code, built) = project.sh("imgbuild build recipes/demo.toml");
    assert_eq!(code, 0, "{built}");
    assert!(!built.contains("CUDA"), "{built}");
    let (code, inspected) = project.sh("imgbuild inspect images/demo --json");
    assert_eq!(code, 0, "{inspected}");
    assert!(!inspected.contains("NVIDIA_"), "{inspected}");
    assert!(!inspected.contains("cuda-cudart"), "{inspected}");
}

#[test]
fn every_offline_book_example_runs() {
    let project = DocsProject::new();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src");
    let mut ran = 0;
    for page in crate::book::summary_pages() {
        let text = fs_err::read_to_string(src.join(&page)).unwrap();
        ran += project.run_all(&page, &sh_commands(&text));
    }
    assert_eq!(
        ran, BOOK_RUN,
        "book commands run (the rest skipped by SKIPS): update BOOK_RUN on purpose"
    );
    // What they wrote is there: the build examples' images and the init examples' recipes.
    for path in [
        "images/demo/index.json",
        "tmp/demo-image/index.json",
        "tmp/demo.spdx.json",
        "recipes/app.toml",
        "recipes/ds.toml",
        "recipes/env.toml",
        "home/.local/share/man/man1/imgbuild.1",
    ] {
        assert!(project.path().join(path).exists(), "{path}");
    }
}

#[test]
fn every_offline_help_example_runs() {
    let project = DocsProject::new();
    let help = |args: &[&str]| {
        let output = Command::new(imgbuild_bin())
            .args(args)
            .output()
            .expect("imgbuild --help");
        assert!(output.status.success(), "{args:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let top = help(&["--help"]);
    let (_, listed) = top.split_once("\nCommands:\n").expect("a command list");
    let subcommands: Vec<&str> = listed
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(subcommands.len() >= 13, "{subcommands:?}");

    let mut commands: Vec<String> = Vec::new();
    for (name, text) in std::iter::once(("imgbuild", top.clone()))
        .chain(subcommands.iter().map(|sub| (*sub, help(&[sub, "--help"]))))
    {
        let examples = help_commands(&text);
        assert!(!examples.is_empty(), "`{name} --help` has no examples");
        for command in examples {
            if !commands.contains(&command) {
                commands.push(command);
            }
        }
    }
    let ran = project.run_all("--help", &commands);
    assert_eq!(
        ran, HELP_RUN,
        "--help examples run (the rest skipped by SKIPS): update HELP_RUN on purpose"
    );
}

#[test]
fn examples_are_read_whole() {
    let readme = "text\n```sh\na \\\n  --b   # c\n# comment\n\nd\n```\n```text\nnot this\n```\n";
    assert_eq!(sh_commands(readme), ["a --b   # c", "d"]);
    let help =
        "Usage: x\n\nExamples:\n  imgbuild x \\\n      --y\n  imgbuild z\n\nMore text\n  not this";
    assert_eq!(help_commands(help), ["imgbuild x --y", "imgbuild z"]);
    assert!(skip_reason("imgbuild smoke images/x").is_some());
    assert!(skip_reason("imgbuild build recipes/demo.toml").is_none());
}
