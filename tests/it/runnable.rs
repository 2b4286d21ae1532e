//! The entrypoint check (issue 31, "runnable from the first init"): a build whose entrypoint
//! (or cmd) cannot start on its base fails before anything is written, naming the file that
//! is missing: a script's `#!` interpreter, an ELF's loader, a program that is not there or
//! not on the PATH. A base that has them builds, and `check-entrypoint = false` turns it off.

use std::path::Path;

use crate::{
    common::Project,
    support::{base::busybox_base_layout, channel::tiny_recipe, shared_channel},
};

/// A recipe of `hello` (a `#!/bin/sh` script) on `base`, with `run` (the `[image]` lines
/// that say how it runs) and a `[[files]]` copy of the host's dynamically linked `true`.
fn runnable_project(base: &str, run: &str) -> Project {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "runnable", &["hello 1.0"])
        .replace("base = \"scratch\"", &format!("base = \"{base}\"\n{run}"));
    let files = "\n[[files]]\nsrc = \"true\"\ndest = \"/app/true\"\nmode = \"0755\"\n";
    project.write_recipe(&(recipe + files));
    fs_err::copy(host_true(), project.path().join("recipes/true")).unwrap();
    project
}

/// A dynamically linked ELF of the host (Debian's coreutils).
fn host_true() -> &'static Path {
    Path::new("/usr/bin/true")
}

/// [`runnable_project`] on a busybox base layout of its own (static, no glibc).
fn busybox_project(run: &str) -> Project {
    let project = runnable_project("BASE", run);
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    let recipe = fs_err::read_to_string(project.recipe_path()).unwrap();
    project.write_recipe(&recipe.replace("BASE", &format!("oci:{}:latest", base.display())));
    project
}

#[test]
fn an_entrypoint_the_base_cannot_start_fails_naming_what_is_missing() {
    let cases: &[(&str, &[&str])] = &[
        // The demo's script on an empty base: no /bin/sh.
        (
            "entrypoint = [\"/opt/conda/bin/hello\"]",
            &["`/opt/conda/bin/hello` is a script whose interpreter `/bin/sh`"],
        ),
        // A bare name is looked up on the image's PATH (the environment's bin first).
        (
            "entrypoint = [\"hello\"]",
            &["`hello` is a script whose interpreter `/bin/sh`"],
        ),
        (
            "cmd = [\"/opt/conda/bin/hello\"]",
            &["interpreter `/bin/sh`"],
        ),
        (
            "entrypoint = [\"nope\"]",
            &["`nope` is in no directory of the image's PATH (/opt/conda/bin"],
        ),
        (
            "entrypoint = [\"/opt/conda/bin/gone\", \"-x\"]",
            &["`/opt/conda/bin/gone` is not in the image (`/opt/conda/bin/gone` is missing)"],
        ),
        // An ELF needs its loader: the `python` of a glibc build on `scratch`.
        (
            "entrypoint = [\"/app/true\"]",
            &["`/app/true` is an ELF executable whose loader `/lib"],
        ),
    ];
    for (run, needles) in cases {
        let project = runnable_project("scratch", run);
        let built = project.build(&[]);
        built.assert_failure_naming(
            1,
            &[
                &["The image for linux-64 cannot start its entrypoint"][..],
                needles,
                &["check-entrypoint = false", "this one is `scratch`"],
            ]
            .concat(),
        );
        project.assert_no_image();
    }
}

#[test]
fn a_static_base_without_glibc_cannot_start_a_glibc_program() {
    let project = busybox_project("entrypoint = [\"/app/true\"]");
    project
        .build(&[])
        .assert_failure_naming(1, &["`/app/true` is an ELF executable whose loader"]);
    project.assert_no_image();
}

#[test]
fn a_base_with_the_interpreter_builds_and_the_check_can_be_turned_off() {
    // busybox's /bin/sh is a link to a static busybox: no loader needed.
    let project = busybox_project("entrypoint = [\"/opt/conda/bin/hello\"]");
    project.build(&[]).success();

    let off = runnable_project(
        "scratch",
        "entrypoint = [\"/opt/conda/bin/hello\"]\ncheck-entrypoint = false",
    );
    off.build(&[]).success();
    // No entrypoint and no cmd: the base's own, which is the base's.
    runnable_project("scratch", "").build(&[]).success();
}
