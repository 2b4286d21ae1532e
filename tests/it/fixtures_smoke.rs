//! Smoke tests of the test fixtures themselves: if these fail, every other integration test's
//! failure is suspect.

use std::collections::BTreeSet;
use std::path::Path;

use rattler_conda_types::package::{IndexJson, LinkJson, PackageFile, PathType, PathsJson};

use crate::support::{self, base, channel};

fn indexed_names(channel_dir: &Path, subdir: &str) -> Vec<String> {
    let path = channel_dir.join(subdir).join("repodata.json");
    let json: serde_json::Value = serde_json::from_slice(&fs_err::read(&path).unwrap()).unwrap();
    let mut names: Vec<String> = ["packages", "packages.conda"]
        .iter()
        .filter_map(|key| json[key].as_object())
        .flat_map(|records| records.keys().cloned())
        .collect();
    names.sort();
    names
}

fn extract(channel_dir: &Path, subdir: &str, file: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    rattler_package_streaming::fs::extract(&channel_dir.join(subdir).join(file), dir.path())
        .unwrap_or_else(|e| panic!("extracting {file}: {e}"));
    dir
}

#[test]
fn test_channel_has_every_package_and_rattler_reads_them() {
    let channel_dir = support::shared_channel();

    assert_eq!(
        indexed_names(channel_dir, "linux-64"),
        [
            "bcj-cffi-0.5.1-py310h295c915_0.tar.bz2",
            "cuda-cudart-11.8.89-h0_0.conda",
            "hello-1.0-h0_0.tar.bz2",
            "hello-2.0-h0_0.tar.bz2",
            "other-1.0-h0_0.tar.bz2",
            "python-3.9.18-h0_0.tar.bz2",
            "xtensor-io-0.10.3-hb585cf6_0.tar.bz2",
            "zlib-1.2.11-h7b6447c_3.conda",
            "zlib-1.2.11-h7b6447c_3.tar.bz2",
        ]
    );
    assert_eq!(
        indexed_names(channel_dir, "noarch"),
        [
            "_r-mutex-1.0.1-anacondar_1.tar.bz2",
            "pyhello-1.0-pyh0_0.conda"
        ]
    );
    assert_eq!(
        indexed_names(channel_dir, "linux-64"),
        channel::channel_packages("linux-64")
    );

    // cuda-cudart carries NVIDIA's real ELF and its development symlink.
    let cudart = extract(channel_dir, "linux-64", "cuda-cudart-11.8.89-h0_0.conda");
    let lib = fs_err::read(cudart.path().join("lib/libcudart.so.11.0")).unwrap();
    assert_eq!(&lib[..4], b"\x7fELF");
    assert_eq!(
        fs_err::read_link(cudart.path().join("lib/libcudart.so")).unwrap(),
        Path::new("libcudart.so.11.0")
    );
    let index = IndexJson::from_package_directory(cudart.path()).unwrap();
    assert_eq!(index.name.as_normalized(), "cuda-cudart");
    assert_eq!(index.depends, ["__glibc >=2.17"]);

    // hello: three patched files, a symlink, an executable script.
    let hello = extract(channel_dir, "linux-64", "hello-1.0-h0_0.tar.bz2");
    let paths = PathsJson::from_package_directory(hello.path()).unwrap();
    let patched: BTreeSet<String> = paths
        .paths
        .iter()
        .filter(|p| p.prefix_placeholder.is_some())
        .map(|p| p.relative_path.display().to_string())
        .collect();
    assert_eq!(
        patched,
        BTreeSet::from(["bin/hello", "etc/hello.conf", "lib/libhello.data"].map(String::from))
    );
    let hi = paths
        .paths
        .iter()
        .find(|p| p.relative_path == Path::new("bin/hi"))
        .unwrap();
    assert_eq!(hi.path_type, PathType::SoftLink);
    let script = fs_err::read_to_string(hello.path().join("bin/hello")).unwrap();
    assert!(script.contains(&format!("hello from {}", channel::PLACEHOLDER)));
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs_err::metadata(hello.path().join("bin/hello"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
    }
    assert_eq!(
        channel::PLACEHOLDER.len(),
        255,
        "conda-build's placeholder length"
    );

    // pyhello is noarch: python with an entry point.
    let pyhello = extract(channel_dir, "noarch", "pyhello-1.0-pyh0_0.conda");
    LinkJson::from_package_directory(pyhello.path()).unwrap();
    assert!(
        pyhello
            .path()
            .join("site-packages/pyhello/__init__.py")
            .is_file()
    );
}

/// Made packages and the pinned repodata are byte-identical when written twice, so lock files
/// solved against two copies of the channel are identical too.
#[test]
fn test_channel_is_reproducible() {
    let first = support::shared_channel();
    let second = tempfile::tempdir().unwrap();
    channel::write_test_channel(second.path(), &support::test_cache_dir()).unwrap();
    let made = channel::MADE_PACKAGES
        .iter()
        .map(|(subdir, file)| format!("{subdir}/{file}"));
    for rel in made.chain([
        "linux-64/repodata.json".into(),
        "noarch/repodata.json".into(),
    ]) {
        assert!(
            fs_err::read(first.join(&rel)).unwrap()
                == fs_err::read(second.path().join(&rel)).unwrap(),
            "{rel} differs between two writes of the test channel"
        );
    }
}

#[test]
fn busybox_base_layout_unpacks_with_umoci() {
    if !base::have("umoci") || !Path::new("/bin/busybox").is_file() {
        eprintln!("skipped: needs umoci and /bin/busybox");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("base");
    base::busybox_base_layout(&layout).unwrap();
    assert!(layout.join("oci-layout").is_file());

    let bundle = work.path().join("bundle");
    base::umoci(&[
        "unpack",
        "--image",
        &format!("{}:latest", layout.display()),
        &bundle.display().to_string(),
    ])
    .unwrap();
    let rootfs = bundle.join("rootfs");
    assert!(rootfs.join("bin/busybox").is_file());
    for applet in base::BUSYBOX_APPLETS {
        assert_eq!(
            fs_err::read_link(rootfs.join("bin").join(applet)).unwrap(),
            Path::new("busybox")
        );
    }
    assert!(rootfs.join("etc").is_dir() && rootfs.join("tmp").is_dir());

    // The same inputs give the same manifest digest.
    let again = work.path().join("again");
    base::busybox_base_layout(&again).unwrap();
    assert_eq!(
        fs_err::read(layout.join("index.json")).unwrap(),
        fs_err::read(again.join("index.json")).unwrap()
    );
}
