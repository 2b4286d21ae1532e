//! Partial pulls of eStargz and zstd:chunked images by podman (Debian 12's 4.3, containers/storage 1.43) with
//! the overlay driver and `enable_partial_images`: after one file of a large package layer
//! changes, the node fetches only that file's ranges (HTTP 206 from the local
//! `docker-registry`, counted in its log), not the layer; the files it puts together are the
//! image's, as a full pull gives them.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::{
    common::{LayoutView, Project, require_root},
    registry::{Auth, Registry},
    support::{
        base::have,
        channel::{executable, file, index_channel, linux64_index, write_package},
        kept_channel_dir,
        podman::{Podman, Storage},
    },
};

/// Bytes of the package's large library: most of the layer.
const LIBRARY: usize = 24 << 20;

/// Bytes that do not compress (xorshift), the same every run: a layer of real size.
pub(crate) fn library() -> Vec<u8> {
    crate::common::noise(0x9E37_79B9_7F4A_7C15, LIBRARY)
}

/// `biglib` 1.0 and 1.1: the same library and data, one small file differs.
pub(crate) fn channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        kept_channel_dir("partial-pull channel", |dir| {
            let linux64 = dir.join("linux-64");
            fs_err::create_dir_all(&linux64)?;
            fs_err::create_dir_all(dir.join("noarch"))?;
            for version in ["1.0", "1.1"] {
                write_biglib(&linux64, version)?;
            }
            index_channel(dir)
        })
    })
}

/// `biglib VERSION` into the channel directory `linux64`: the library, its VERSION and 40
/// small data files.
pub(crate) fn write_biglib(linux64: &Path, version: &str) -> anyhow::Result<()> {
    let mut entries = vec![
        executable("lib/libbig.so.1", library()),
        file("share/biglib/VERSION", format!("{version}\n")),
    ];
    for i in 0..40 {
        entries.push(file(
            format!("share/biglib/data/{i:02}.txt"),
            format!("data file {i}\n").repeat(200),
        ));
    }
    write_package(
        &linux64.join(format!("biglib-{version}-h0_0.conda")),
        linux64_index("biglib", version, &[]),
        &entries,
        None,
    )
}

/// Builds the image with `biglib VERSION`, pushes it as `target`; its biglib layer's digest
/// and size, and the image's config.
fn build_and_push(
    version: &str,
    compression: &str,
    target: &str,
) -> (String, u64, serde_json::Value) {
    let project = Project::new();
    let url = url::Url::from_file_path(channel()).unwrap();
    project.write_recipe(&format!(
        "[image]\nname = \"pp\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"{url}\"]\ndependencies = [\"biglib {version}\"]\n\n\
         [layers]\ncompression = \"{compression}\"\n"
    ));
    project.build(&[]).success();
    project
        .run(&["push", "images/pp", target, "--insecure"])
        .success();
    let layout = LayoutView::new(project.path().join("images/pp"));
    let (digest, size) = biglib_layer(&layout);
    (digest, size, layout.config())
}

/// The digest and size of the layer of `layout`'s image that holds `biglib`.
pub(crate) fn biglib_layer(layout: &LayoutView) -> (String, u64) {
    let manifest = layout.manifest();
    let layer = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["annotations"]["dev.imgbuild.layer.packages"]
                .as_str()
                .is_some_and(|p| p.contains("biglib"))
        })
        .unwrap_or_else(|| panic!("no biglib layer: {manifest}"));
    (
        layer["digest"].as_str().unwrap().to_string(),
        layer["size"].as_u64().unwrap(),
    )
}

/// The bytes the registry sent for `digest`'s blob, and how many of its responses were 206.
fn served(registry: &Registry, digest: &str) -> (u64, usize) {
    crate::support::registry_log::bytes_sent(&registry.log(), digest)
}

#[test]
fn a_one_file_change_pulls_only_that_file_with_partial_pulls_on() {
    require_root!("podman's overlay storage needs root here");
    assert!(
        have("podman"),
        "podman is required: run tests/install-deps.sh"
    );
    for compression in ["estargz", "zstd:chunked"] {
        partial_pull(compression);
    }
}

fn partial_pull(compression: &str) {
    let registry = Registry::start(Auth::None);
    let v1 = format!("{}/pp/app:v1", registry.host);
    let v2 = format!("{}/pp/app:v2", registry.host);
    let (layer_v1, size_v1, _) = build_and_push("1.0", compression, &v1);
    let (layer_v2, size_v2, config_v2) = build_and_push("1.1", compression, &v2);
    assert_ne!(layer_v1, layer_v2);

    // Partial pulls off: the second pull fetches the whole changed layer.
    let nodes = tempfile::tempdir().unwrap();
    let node = |name: &str, partial_pulls| {
        Podman::new(&nodes.path().join(name), Storage::Overlay { partial_pulls }).unwrap()
    };
    let full = node("full", false);
    full.ok(&["pull", "--tls-verify=false", &v1]);
    full.ok(&["pull", "--tls-verify=false", &v2]);
    let (whole, ranges_off) = served(&registry, &layer_v2);
    assert!(whole >= size_v2, "{whole} of {size_v2}");
    let before = (served(&registry, &layer_v1).0, whole);

    let podman = node("partial", true);
    podman.ok(&["pull", "--tls-verify=false", &v1]);
    let first = served(&registry, &layer_v1).0 - before.0;
    podman.ok(&["pull", "--tls-verify=false", &v2]);
    let (served_v2, ranges) = served(&registry, &layer_v2);
    let (second, ranges) = (served_v2 - before.1, ranges - ranges_off);
    eprintln!(
        "{compression}: v1 layer {layer_v1}: {size_v1} bytes, {first} served on the first pull; \
         v2 layer {layer_v2}: {size_v2} bytes, {second} served in {ranges} range responses \
         ({whole} with partial pulls off)"
    );
    assert!(
        ranges > 0,
        "no range requests: the second pull was not partial"
    );
    assert!(
        second * 10 <= size_v2,
        "{second} of {size_v2} bytes fetched: more than 10 %"
    );

    // podman's image has the config's diff_ids.
    let inspect: serde_json::Value =
        serde_json::from_str(&podman.ok(&["image", "inspect", &v2])).unwrap();
    assert_eq!(
        inspect[0]["RootFS"]["Layers"], config_v2["rootfs"]["diff_ids"],
        "{inspect}"
    );

    // The files are the image's: the changed one is new, the library the same bytes.
    let mount = podman.ok(&["image", "mount", &v2]);
    let root = PathBuf::from(mount.trim());
    assert_eq!(
        fs_err::read_to_string(root.join("opt/conda/share/biglib/VERSION")).unwrap(),
        "1.1\n"
    );
    assert!(fs_err::read(root.join("opt/conda/lib/libbig.so.1")).unwrap() == library());
    podman.ok(&["image", "unmount", &v2]);
}
