//! `[layers] compression = "estargz"` read by its real consumers: the stargz snapshotter's
//! own `estargz` package (Debian's golang-github-containerd-stargz-snapshotter-dev, built
//! into `tests/tools/estargz-check` by Debian's Go) opens each layer from its footer, checks
//! the TOC against the manifest's annotation and reads every file through the TOC, chunk by
//! chunk, as a lazy pull does; and plain-gzip readers (oci-image-tool, umoci) unpack the same
//! image as any gzip image. No FUSE snapshotter runs here: Debian packages only its
//! `ctr-remote` client, not `containerd-stargz-grpc` (docs/src/contributing/tests.md).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::{
    common::{LayoutView, Project, run_tool, validate_layout},
    support::{
        channel::{executable, file, index_channel, linux64_index, write_package, write_tiny},
        kept_channel_dir,
    },
};

/// A library bigger than two chunks, so its file has three members.
const BIG: usize = 9 << 20 | 12345;

fn big_library() -> Vec<u8> {
    // Not too compressible, not random: the bytes are the same every run.
    (0..BIG)
        .map(|i| ((i * 2654435761usize) >> 13) as u8)
        .collect()
}

/// A channel with `biglib` (a 9 MiB library, a small file, a script) and `tiny`.
pub(crate) fn channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        kept_channel_dir("estargz channel", |dir| {
            let linux64 = dir.join("linux-64");
            fs_err::create_dir_all(&linux64)?;
            fs_err::create_dir_all(dir.join("noarch"))?;
            write_package(
                &linux64.join("biglib-1.0-h0_0.conda"),
                linux64_index("biglib", "1.0", &[]),
                &[
                    executable("lib/libbig.so.1", big_library()),
                    file("share/biglib/README", "a big library\n"),
                    executable("bin/big", "#!/bin/sh\necho big\n"),
                ],
                None,
            )?;
            write_tiny(&linux64)?;
            index_channel(dir)
        })
    })
}

fn estargz_project() -> Project {
    let project = Project::new();
    let url = url::Url::from_file_path(channel()).unwrap();
    project.write_recipe(&format!(
        "[image]\nname = \"lazy\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"{url}\"]\ndependencies = [\"biglib\", \"tiny\"]\n\n\
         [layers]\ncompression = \"estargz\"\n"
    ));
    project
}

/// The checker, built once from `tests/tools/estargz-check` with Debian's Go, offline
/// (GOPATH mode over `/usr/share/gocode`).
fn checker() -> &'static Path {
    static CHECKER: OnceLock<PathBuf> = OnceLock::new();
    CHECKER.get_or_init(|| {
        let gocode =
            Path::new("/usr/share/gocode/src/github.com/containerd/stargz-snapshotter/estargz");
        assert!(
            crate::support::base::have("go") && gocode.is_dir(),
            "Go and the estargz package are required: run tests/install-deps.sh"
        );
        let dir = kept_channel_dir("estargz-check", |_| Ok(()));
        let out = dir.join("estargz-check");
        crate::support::go::build_tool("estargz-check", &out, &dir.join("gocache"))
            .unwrap_or_else(|message| panic!("{message}"));
        out
    })
}

/// Runs the checker on one blob; its JSON report, or its error.
fn check(blob: &Path, toc_digest: &str) -> Result<serde_json::Value, String> {
    let output = Command::new(checker())
        .arg(blob)
        .arg(toc_digest)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Each layer's blob path, TOC digest and uncompressed size annotation.
fn estargz_layers(layout: &LayoutView) -> Vec<(PathBuf, String, u64)> {
    let manifest = layout.manifest();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|layer| {
            let digest = layer["digest"].as_str().unwrap();
            let annotations = &layer["annotations"];
            assert_eq!(
                layer["mediaType"],
                "application/vnd.oci.image.layer.v1.tar+gzip"
            );
            let toc = annotations["containerd.io/snapshot/stargz/toc.digest"]
                .as_str()
                .unwrap_or_else(|| panic!("layer {digest} has no TOC digest: {layer}"));
            let size = annotations["io.containers.estargz.uncompressed-size"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let blob = layout_blob(layout, digest);
            (blob, toc.to_string(), size)
        })
        .collect()
}

fn layout_blob(layout: &LayoutView, digest: &str) -> PathBuf {
    layout
        .dir
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

#[test]
fn estargz_layers_are_read_lazily_by_the_snapshotters_code_and_as_gzip_by_everyone() {
    let project = estargz_project();
    project.build(&[]).success();
    let layout = LayoutView::new(project.path().join("images/lazy"));
    let layers = estargz_layers(&layout);
    assert!(layers.len() >= 2, "{layers:?}");
    let mut chunks = 0;
    for (blob, toc, size) in &layers {
        let report = check(blob, toc).unwrap_or_else(|e| panic!("{}: {e}", blob.display()));
        eprintln!("estargz-check {}: {report}", blob.display());
        chunks += report["chunks"].as_u64().unwrap();
        // The annotation is the size of the stream the diff_id names.
        let mut plain = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::MultiGzDecoder::new(fs_err::File::open(blob).unwrap()),
            &mut plain,
        )
        .unwrap();
        assert_eq!(plain.len() as u64, *size);
    }
    // The library's three chunks, the README and the script, the tiny file.
    assert!(chunks >= 6, "{chunks} chunks");

    // The checker is not a rubber stamp: another TOC digest is refused.
    let (blob, _, _) = &layers[0];
    let wrong = format!("sha256:{}", "0".repeat(64));
    let err = check(blob, &wrong).unwrap_err();
    assert!(err.contains("VerifyTOC"), "{err}");

    // To plain-gzip readers it is an ordinary image.
    validate_layout(layout.dir.to_str().unwrap());
    let bundle = project.path().join("bundle");
    run_tool(
        "umoci",
        &[
            "unpack",
            "--rootless",
            "--image",
            &format!("{}:latest", layout.dir.display()),
            bundle.to_str().unwrap(),
        ],
    );
    let lib = fs_err::read(bundle.join("rootfs/opt/conda/lib/libbig.so.1")).unwrap();
    assert!(lib == big_library(), "the library unpacks to its bytes");
    assert_eq!(
        fs_err::read_to_string(bundle.join("rootfs/opt/conda/share/tiny/hello")).unwrap(),
        "hello\n"
    );
}

#[test]
fn estargz_images_are_reproducible_for_any_thread_count_and_from_the_layer_cache() {
    let project = estargz_project();
    let first = project.build(&["--jobs", "1"]).success().digest();
    // A second build in another directory, with its own cache, and more threads.
    let other = estargz_project();
    fs_err::copy(project.lock_path(), other.lock_path()).unwrap();
    let second = other.build(&["--locked", "--jobs", "4"]).success().digest();
    assert_eq!(first, second);
    // From the layer cache (the TOC digests come back with the blobs).
    fs_err::remove_dir_all(other.path().join("images/lazy")).unwrap();
    let keys: Vec<String> = fs_err::read_dir(other.cache.join("layers/keys"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| fs_err::read_to_string(p).unwrap())
        .collect();
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.contains("toc.digest")),
        "{keys:?}"
    );
    let warm = other.build(&["--locked"]).success();
    assert_eq!(warm.digest(), first);
}

/// The tar entry names of a gzip layer blob, in order.
fn tar_names(blob: &Path) -> Vec<String> {
    let decoder = flate2::read::MultiGzDecoder::new(fs_err::File::open(blob).unwrap());
    tar::Archive::new(decoder)
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect()
}

#[test]
fn prefetch_puts_the_listed_files_first_then_the_landmark() {
    let project = estargz_project();
    let recipe = fs_err::read_to_string(project.recipe_path()).unwrap()
        + "prefetch = [\"opt/conda/share/biglib/*\", \"/opt/conda/bin/big\"]\n";
    project.write_recipe(&recipe);
    project.build(&[]).success();
    let layout = LayoutView::new(project.path().join("images/lazy"));
    let mut layers_with_landmark = 0;
    for (blob, toc, _) in estargz_layers(&layout) {
        // Still a valid eStargz layer to the snapshotter's code.
        check(&blob, &toc).unwrap_or_else(|e| panic!("{}: {e}", blob.display()));
        let names = tar_names(&blob);
        if names.iter().any(|n| n.ends_with("libbig.so.1")) {
            let landmark = names
                .iter()
                .position(|n| n == ".prefetch.landmark")
                .unwrap();
            let first: Vec<&str> = names[..landmark].iter().map(String::as_str).collect();
            // The listed files and the directories above them, nothing else.
            assert!(
                first.contains(&"opt/conda/share/biglib/README"),
                "{first:?}"
            );
            assert!(first.contains(&"opt/conda/bin/big"), "{first:?}");
            assert!(
                !first.iter().any(|n| n.ends_with("libbig.so.1")),
                "{first:?}"
            );
            assert!(
                first
                    .iter()
                    .all(|n| n.ends_with('/') || n.contains("biglib/") || n.ends_with("bin/big")),
                "{first:?}"
            );
            layers_with_landmark += 1;
        } else if names.iter().any(|n| n.contains("tiny")) {
            // A layer with none of them says so first.
            assert_eq!(names[0], ".no.prefetch.landmark", "{names:?}");
        }
    }
    assert_eq!(layers_with_landmark, 1);

    // Without eStargz, prefetch is an error naming the key.
    let gzip = recipe.replace("compression = \"estargz\"", "compression = \"gzip\"");
    project.write_recipe(&gzip);
    project
        .build(&[])
        .assert_failure_naming(1, &["layers.prefetch", "estargz"]);
}
