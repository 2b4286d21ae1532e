//! The layer cache and no-op rebuilds (issue 7): a layer whose inputs did not change is taken
//! from the cache, byte for byte what a cold build writes; a rebuild with the inputs of the
//! image in place changes nothing; zstd layers are read by real consumers.

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, Run, run_tool, unpack},
    support::{channel::tiny_recipe, shared_channel},
};

/// The `result` event of `build --json`.
fn result(run: &Run) -> Value {
    run.stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "result")
        .unwrap_or_else(|| panic!("no result event in:\n{}", run.stdout))
}

fn build_json(project: &Project, extra: &[&str]) -> Value {
    let mut args = vec!["build", "recipes/image.toml", "--json"];
    args.extend_from_slice(extra);
    result(&project.run(&args).success())
}

#[test]
fn cached_layers_are_the_bytes_a_cold_build_writes() {
    let channel = shared_channel();
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        channel,
        "cached",
        &["hello 1.0", "pyhello", "other"],
    ));
    let first = build_json(&project, &[]);
    assert_eq!(
        first["reused_layers"], 0,
        "a cold cache has nothing to reuse"
    );

    // One package changes; every other package layer comes from the cache.
    project.write_recipe(&tiny_recipe(
        channel,
        "cached",
        &["hello 2.0", "pyhello", "other"],
    ));
    let second = build_json(&project, &[]);
    let new_layers = second["new_layers"].as_u64().unwrap();
    let reused = second["reused_layers"].as_u64().unwrap();
    // Written again: hello's layer and the image's own files; everything else is reused.
    assert_eq!(reused, new_layers - 2, "{second}");
    assert!(reused >= 2, "{second}");

    // The same lock built with an empty cache: the same image, blob for blob.
    let cold = Project::new();
    cold.write_recipe(&tiny_recipe(
        channel,
        "cached",
        &["hello 2.0", "pyhello", "other"],
    ));
    fs_err::copy(project.lock_path(), cold.lock_path()).unwrap();
    let cold_result = build_json(&cold, &["--locked"]);
    assert_eq!(cold_result["reused_layers"], 0);
    assert_eq!(second["digest"], cold_result["digest"]);
    assert_eq!(
        LayoutView::new(project.path().join("images/cached")).blob_names(),
        LayoutView::new(cold.path().join("images/cached")).blob_names()
    );
    project.run(&["verify", "images/cached"]).success();
}

#[test]
fn rebuild_with_the_same_inputs_changes_nothing() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        "noop",
        &["hello 1.0", "pyhello"],
    ));
    let first = build_json(&project, &[]);
    assert_eq!(first["unchanged"], false);
    let layout = LayoutView::new(project.path().join("images/noop"));
    let index_before = fs_err::read(layout.dir.join("index.json")).unwrap();

    let again = build_json(&project, &[]);
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["digest"], first["digest"]);
    assert_eq!(again["reused_layers"], again["new_layers"]);
    assert_eq!(
        again["compressed_size"], first["compressed_size"],
        "the report describes the image in place"
    );
    assert_eq!(
        fs_err::read(layout.dir.join("index.json")).unwrap(),
        index_before
    );

    // A layer blob gone from the layout: the shortcut is not taken, the image is made whole.
    let (_, digest) = layout.layers().last().unwrap().clone();
    fs_err::remove_file(layout.dir.join("blobs/sha256").join(&digest[7..])).unwrap();
    let repaired = build_json(&project, &[]);
    assert_eq!(repaired["unchanged"], false);
    assert_eq!(repaired["digest"], first["digest"]);
    project.run(&["verify", "images/noop"]).success();

    // Another input (the creation time) is another image.
    let dated = result(
        &project
            .run_with(
                &["build", "recipes/image.toml", "--json"],
                &[("SOURCE_DATE_EPOCH", "1700000000")],
                None,
            )
            .success(),
    );
    assert_eq!(dated["unchanged"], false);
    assert_ne!(dated["digest"], first["digest"]);
}

#[test]
fn zstd_layers_are_advertised_and_read_by_consumers() {
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "zstd", &["hello 1.0", "pyhello"]);
    project.write_recipe(&format!("{recipe}\n[layers]\ncompression = \"zstd\"\n"));
    project.build(&[]).success();

    let layout = LayoutView::new(project.path().join("images/zstd"));
    let manifest = layout.manifest();
    for layer in manifest["layers"].as_array().unwrap() {
        assert_eq!(
            layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+zstd",
            "{layer}"
        );
        let blob = layout.blob(layer["digest"].as_str().unwrap());
        assert_eq!(&blob[..4], &[0x28, 0xb5, 0x2f, 0xfd], "zstd frame magic");
    }
    assert!(
        manifest["annotations"]["dev.imgbuild.compression"]
            .as_str()
            .unwrap()
            .starts_with("zstd;level=3"),
        "{manifest}"
    );
    project.run(&["verify", "images/zstd"]).success();

    // skopeo (containers/image, as in podman and CRI-O) decompresses every zstd layer to
    // recompress it as gzip; umoci 0.4.7 reads gzip only, so it unpacks the copy.
    let copy = project.path().join("copy");
    run_tool(
        "skopeo",
        &[
            "copy",
            "--dest-compress-format",
            "gzip",
            &format!("oci:{}:latest", layout.dir.display()),
            &format!("oci:{}:latest", copy.display()),
        ],
    );
    let copied = LayoutView::new(&copy).manifest();
    assert_eq!(
        copied["layers"].as_array().unwrap().len(),
        manifest["layers"].as_array().unwrap().len()
    );
    assert_eq!(
        copied["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    // Same diff_ids: the tars inside the zstd layers are the tars skopeo recompressed.
    assert_eq!(
        LayoutView::new(&copy).config()["rootfs"],
        layout.config()["rootfs"]
    );
    let rootfs = unpack(&copy, "latest", &project.path().join("bundle"));
    let hello = rootfs.join("opt/conda/bin/hello");
    let script = fs_err::read_to_string(&hello).unwrap();
    assert!(script.contains("hello from /opt/conda"), "{script}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs_err::metadata(&hello).unwrap().permissions().mode() & 0o111,
        0o111
    );
}
