//! `[layers] split` (issue 32): a package larger than the bound is split by file into layers
//! of at most the bound, the same at any `-j` and from the layer cache; each part names its
//! package and which part it is, and `inspect` and `diff` read them back; umoci unpacks every
//! file of the package with its bytes.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, noise, unpack, validate_layout},
    support::{
        channel::{executable, index_channel, linux64_index, write_package, write_tiny},
        kept_channel_dir,
    },
};

/// `bigpkg`'s libraries: 5 of 7 MiB (35 MiB, incompressible), so a 16 MiB bound makes
/// 3 parts.
const LIBRARIES: u64 = 5;
const LIBRARY_BYTES: usize = 7 << 20;

fn library(i: u64) -> Vec<u8> {
    noise(0x5eed + i, LIBRARY_BYTES)
}

/// A channel with `bigpkg` (5 libraries and a script) and `tiny`.
fn channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        kept_channel_dir("split channel", |dir| {
            let linux64 = dir.join("linux-64");
            fs_err::create_dir_all(&linux64)?;
            fs_err::create_dir_all(dir.join("noarch"))?;
            let mut files: Vec<_> = (0..LIBRARIES)
                .map(|i| executable(format!("lib/libbig{i}.so"), library(i)))
                .collect();
            files.push(executable("bin/big", "#!/bin/sh\necho big\n"));
            write_package(
                &linux64.join("bigpkg-1.0-h0_0.conda"),
                linux64_index("bigpkg", "1.0", &[]),
                &files,
                None,
            )?;
            write_tiny(&linux64)?;
            index_channel(dir)
        })
    })
}

fn write_recipe(project: &Project, dependencies: &[&str], split: &str) {
    let url = url::Url::from_file_path(channel()).unwrap();
    let dependencies: Vec<String> = dependencies.iter().map(|d| format!("\"{d}\"")).collect();
    project.write_recipe(&format!(
        "[image]\nname = \"split\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"{url}\"]\ndependencies = [{}]\n\n\
         [layers]\n{split}\n",
        dependencies.join(", ")
    ));
}

/// The manifest's layers of `bigpkg`: `(part annotation, size, digest)`.
fn bigpkg_layers(layout: &LayoutView) -> Vec<(String, u64, String)> {
    layout.manifest()["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["annotations"]["dev.imgbuild.layer.packages"] == "bigpkg-1.0-h0_0")
        .map(|l| {
            (
                l["annotations"]["dev.imgbuild.layer.part"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                l["size"].as_u64().unwrap(),
                l["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn result(project: &Project, args: &[&str]) -> Value {
    let mut all = vec!["build", "recipes/image.toml", "--json"];
    all.extend_from_slice(args);
    let run = project.run(&all).success();
    run.stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "result")
        .unwrap_or_else(|| panic!("no result event in:\n{}", run.stdout))
}

#[test]
fn a_large_package_is_split_into_bounded_parts_the_same_everywhere() {
    let project = Project::new();
    write_recipe(&project, &["bigpkg"], "split = \"16MiB\"");
    let first = result(&project, &["--jobs", "1"]);
    let layout = LayoutView::new(project.path().join("images/split"));
    let parts = bigpkg_layers(&layout);
    let names: Vec<&str> = parts.iter().map(|(part, _, _)| part.as_str()).collect();
    assert_eq!(names, ["1/3", "2/3", "3/3"], "{parts:?}");
    // Each part holds at most 16 MiB of files; gzip of noise adds a little.
    for (part, size, _) in &parts {
        assert!(
            *size <= (16 << 20) + (64 << 10),
            "part {part}: {size} bytes"
        );
    }
    validate_layout(layout.dir.to_str().unwrap());
    let rootfs = unpack(&layout.dir, "latest", &project.path().join("bundle"));
    for i in 0..LIBRARIES {
        let bytes = fs_err::read(rootfs.join(format!("opt/conda/lib/libbig{i}.so"))).unwrap();
        assert!(bytes == library(i), "libbig{i}.so differs after unpacking");
    }
    assert!(
        rootfs
            .join("opt/conda/conda-meta/bigpkg-1.0-h0_0.json")
            .is_file()
    );

    // Elsewhere, from the lock, at another -j and with an empty layer cache: the same image.
    let elsewhere = Project::new();
    write_recipe(&elsewhere, &["bigpkg"], "split = \"16MiB\"");
    fs_err::copy(project.lock_path(), elsewhere.lock_path()).unwrap();
    let second = result(&elsewhere, &["--locked", "--jobs", "4"]);
    assert_eq!(first["digest"], second["digest"]);
    assert_eq!(second["reused_layers"], 0);

    // Another package added: every part comes from the layer cache, byte for byte.
    write_recipe(&project, &["bigpkg", "tiny"], "split = \"16MiB\"");
    let third = result(&project, &[]);
    assert!(third["reused_layers"].as_u64().unwrap() >= 3, "{third}");
    assert_eq!(bigpkg_layers(&layout), parts);
    project.run(&["verify", "images/split"]).success();
}

#[test]
fn inspect_and_diff_name_the_parts_of_a_package() {
    let project = Project::new();
    write_recipe(&project, &["bigpkg"], "split = \"16MiB\"");
    project.build(&[]).success();
    let json: Value = serde_json::from_str(
        &project
            .run(&["inspect", "images/split", "--json"])
            .success()
            .stdout,
    )
    .unwrap();
    let parts: Vec<&str> = json["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["part"].as_str())
        .collect();
    assert_eq!(parts, ["1/3", "2/3", "3/3"], "{json}");
    // One package, however many layers hold it.
    assert_eq!(json["packages"], serde_json::json!(["bigpkg-1.0-h0_0"]));
    let text = project.run(&["inspect", "images/split"]).success().stdout;
    assert!(text.contains("bigpkg-1.0-h0_0 (part 2/3)"), "{text}");
    // --sizes: each part's layer says which it is, and the package's bytes are all of them.
    let sizes = project
        .run(&["inspect", "images/split", "--sizes"])
        .success()
        .stdout;
    assert!(sizes.contains("bigpkg-1.0-h0_0 (part 3/3)"), "{sizes}");
    let report: Value = serde_json::from_str(
        &project
            .run(&["inspect", "images/split", "--sizes", "--json"])
            .success()
            .stdout,
    )
    .unwrap();
    let bigpkg = report["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["package"] == "bigpkg-1.0-h0_0")
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        bigpkg["uncompressed"].as_u64().unwrap() >= LIBRARIES * LIBRARY_BYTES as u64,
        "{bigpkg}"
    );

    // The same lock unsplit: diff sees the same package in other layers, and names them.
    let whole = project.path().join("images/whole");
    write_recipe(&project, &["bigpkg"], "split = false");
    project
        .run(&[
            "build",
            "recipes/image.toml",
            "--locked",
            "-o",
            whole.to_str().unwrap(),
        ])
        .success();
    assert_eq!(bigpkg_layers(&LayoutView::new(&whole)).len(), 1);
    let diff = project
        .run(&["diff", whole.to_str().unwrap(), "images/split"])
        .success()
        .stdout;
    assert!(diff.contains("packages     unchanged"), "{diff}");
    for part in ["1/3", "2/3", "3/3"] {
        assert!(
            diff.contains(&format!("bigpkg-1.0-h0_0 (part {part})")),
            "{diff}"
        );
    }
}

#[test]
fn a_split_bound_that_is_not_a_size_of_16_mib_or_more_is_refused() {
    let project = Project::new();
    for (value, needle) in [
        ("\"1MiB\"", "at least 16MiB"),
        ("\"lots\"", "must be a size such as"),
        ("3", "a size such as \"512MiB\", or false"),
    ] {
        write_recipe(&project, &["tiny"], &format!("split = {value}"));
        project
            .build(&[])
            .assert_failure_naming(1, &["recipes/image.toml", needle]);
    }
    project.assert_no_image();
}
