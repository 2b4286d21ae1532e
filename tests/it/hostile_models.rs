//! Hostile `[[models]]` sources through the real CLI (issue 33): a source that climbs out,
//! links (the source itself, a file, a directory) that lead to host files, a fifo, a name
//! that is not UTF-8, an empty model, and mounts that would hide the environment or each
//! other. Each is a clear error naming the model or the recipe's value, exit 1, no hang,
//! and neither a lock nor an image is written.

use std::{os::unix::ffi::OsStrExt, path::Path};

use crate::{
    common::Project,
    support::{channel::tiny_recipe, shared_channel},
};

fn recipe(models: &str) -> String {
    tiny_recipe(shared_channel(), "served", &["hello 1.0"]) + "\n" + models
}

fn model(name: &str, mount: &str, source: &str) -> String {
    format!("[[models]]\nname = \"{name}\"\nmount = \"{mount}\"\nsource = \"{source}\"\n")
}

/// A project whose `recipes/models/m` holds one honest file, then what `prepare` adds.
fn project(models: &str, prepare: impl FnOnce(&Path)) -> Project {
    let project = Project::new();
    project.write_recipe(&recipe(models));
    let dir = project.path().join("recipes/models/m");
    fs_err::create_dir_all(&dir).unwrap();
    fs_err::write(dir.join("config.json"), "{}").unwrap();
    prepare(&dir);
    project
}

/// What a case adds to the model's directory.
type Prepare = Box<dyn FnOnce(&Path)>;

#[track_caller]
fn refused(project: &Project, needles: &[&str]) {
    let run = project.run(&["build", "recipes/image.toml"]);
    run.assert_failure_naming(1, needles);
    project.assert_no_image();
    assert!(
        !project.lock_path().exists(),
        "a refused model leaves no lock"
    );
}

#[test]
fn sources_that_lead_out_or_are_not_files_are_refused_naming_the_model() {
    let m = model("m", "/models/m", "models/m");
    let cases: Vec<(&str, Prepare, &[&str])> = vec![
        (
            "a link to a host file",
            Box::new(|dir| std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd")).unwrap()),
            &["model `m`", "passwd", "symbolic link"],
        ),
        (
            "a link to a host directory",
            Box::new(|dir| std::os::unix::fs::symlink("/etc", dir.join("etc")).unwrap()),
            &["model `m`", "etc", "symbolic link"],
        ),
        (
            "a fifo",
            Box::new(|dir| {
                let path = std::ffi::CString::new(dir.join("pipe").as_os_str().as_bytes()).unwrap();
                assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
            }),
            &["model `m`", "pipe", "a named pipe"],
        ),
        (
            "a name that is not UTF-8",
            Box::new(|dir| {
                let name = std::ffi::OsStr::from_bytes(b"weights-\xff.bin");
                fs_err::write(dir.join(name), "x").unwrap();
            }),
            &["model `m`", "not UTF-8"],
        ),
    ];
    for (what, prepare, needles) in cases {
        eprintln!("case: {what}");
        refused(&project(&m, prepare), needles);
    }
    // The source itself a link out.
    let linked = project(&model("m", "/models/m", "models/out"), |dir| {
        std::os::unix::fs::symlink("/etc", dir.parent().unwrap().join("out")).unwrap();
    });
    refused(&linked, &["model `m`", "out", "symbolic link"]);
    // An empty model, and one that is not there.
    let empty = project(&model("m", "/models/m", "models/empty"), |dir| {
        fs_err::create_dir_all(dir.parent().unwrap().join("empty")).unwrap();
    });
    refused(&empty, &["model `m`", "holds no file"]);
    let missing = project(&model("m", "/models/m", "models/none"), |_| {});
    refused(&missing, &["model `m`", "none"]);
}

#[test]
fn recipe_values_that_climb_out_or_hide_the_environment_are_refused_at_the_value() {
    let two = model("m", "/models/m", "models/m") + &model("m", "/models/n", "models/m");
    let nested = model("m", "/models", "models/m") + &model("n", "/models/n", "models/m");
    let cases: Vec<(String, &[&str])> = vec![
        (
            model("m", "/models/m", "../outside"),
            &["`source`", "beneath the recipe's directory"],
        ),
        (
            model("m", "/models/m", "/etc"),
            &["`source`", "beneath the recipe's directory"],
        ),
        (
            model("m", "/opt/conda/models", "models/m"),
            &["`mount`", "overlaps the environment"],
        ),
        (model("m", "/", "models/m"), &["`mount`", "other than `/`"]),
        (model("m", "models/m", "models/m"), &["`mount`", "absolute"]),
        (model("M", "/models/m", "models/m"), &["model name `M`"]),
        (two, &["named twice"]),
        (nested, &["overlaps model `m`"]),
    ];
    for (models, needles) in cases {
        refused(&project(&models, |_| {}), needles);
    }
}
