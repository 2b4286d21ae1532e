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
            "activation-1.0-h0_0.tar.bz2",
            "bcj-cffi-0.5.1-py310h295c915_0.tar.bz2",
            "cuda-cudart-11.8.89-h0_0.conda",
            "greeting-1.0-h0_0.tar.bz2",
            "hello-1.0-h0_0.tar.bz2",
            "hello-2.0-h0_0.tar.bz2",
            "libgcc-ng-13.2.0-h0_0.tar.bz2",
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

/// The made packages solve and install with plain rattler (no imgbuild code), placeholders
/// patched for an in-image prefix: when an imgbuild test fails, the fixtures are not the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_packages_solve_and_install_with_rattler() {
    use rattler::install::{Installer, LinkOptions};
    use rattler_conda_types::{
        Channel, GenericVirtualPackage, MatchSpec, PackageName, ParseMatchSpecOptions, Subdir,
        package::BuildString,
    };
    use rattler_solve::{SolverImpl, SolverTask};

    let channel_dir = support::shared_channel();
    let cache = tempfile::tempdir().unwrap();
    let gateway = rattler_repodata_gateway::Gateway::builder()
        .with_cache_dir(cache.path().join("repodata"))
        .with_package_cache(rattler_cache::package_cache::PackageCache::new(
            cache.path().join("pkgs"),
        ))
        .finish();
    let channel = Channel::try_from_directory(channel_dir).unwrap();
    let specs: Vec<MatchSpec> = ["hello 1.0.*", "pyhello", "other"]
        .iter()
        .map(|s| MatchSpec::from_str(s, ParseMatchSpecOptions::strict()).unwrap())
        .collect();
    let repodata = gateway
        .query([channel], [Subdir::Linux64, Subdir::NoArch], specs.clone())
        .recursive(true)
        .await
        .unwrap();
    let task = SolverTask {
        // The target's virtual packages, never the build host's.
        virtual_packages: [("__unix", "0"), ("__linux", "4.18"), ("__glibc", "2.17")]
            .map(|(name, version)| GenericVirtualPackage {
                name: PackageName::new_unchecked(name),
                version: version.parse().unwrap(),
                build_string: BuildString::new_unchecked("0"),
            })
            .to_vec(),
        specs,
        ..SolverTask::from_iter(repodata.iter())
    };
    let records = tokio::task::block_in_place(|| rattler_solve::resolvo::Solver.solve(task))
        .unwrap()
        .records;
    let mut solved: Vec<String> = records
        .iter()
        .map(|r| {
            format!(
                "{}-{}",
                r.package_record.name.as_normalized(),
                r.package_record.version
            )
        })
        .collect();
    solved.sort();
    assert_eq!(
        solved,
        [
            "cuda-cudart-11.8.89",
            "hello-1.0",
            "other-1.0",
            "pyhello-1.0",
            "python-3.9.18"
        ]
    );

    let staging = tempfile::tempdir().unwrap();
    Installer::new()
        .with_target_platform(Subdir::Linux64)
        .with_package_cache(rattler_cache::package_cache::PackageCache::new(
            cache.path().join("pkgs"),
        ))
        .with_alternative_target_prefix("/opt/conda")
        .with_link_options(LinkOptions {
            allow_symbolic_links: Some(true),
            allow_hard_links: Some(false),
            allow_ref_links: Some(false),
        })
        .with_execute_link_scripts(false)
        .install(staging.path(), records)
        .await
        .unwrap();
    let prefix = staging.path();

    let conf = fs_err::read_to_string(prefix.join("etc/hello.conf")).unwrap();
    assert_eq!(conf, "prefix=/opt/conda/share/hello\n");
    let output = std::process::Command::new(prefix.join("bin/hi"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "hello from /opt/conda\n"
    );
    // Binary replacement keeps the length and NUL-pads the shortened C string.
    let data = fs_err::read(prefix.join("lib/libhello.data")).unwrap();
    let hello = extract(channel_dir, "linux-64", "hello-1.0-h0_0.tar.bz2");
    let original = fs_err::read(hello.path().join("lib/libhello.data")).unwrap();
    assert_eq!(data.len(), original.len());
    assert!(data.windows(23).any(|w| w == b"/opt/conda/share/hello\0"));
    assert!(!String::from_utf8_lossy(&data).contains("placehold"));
    // noarch python: linked into the stand-in python's site-packages, with an entry point.
    assert!(
        prefix
            .join("lib/python3.9/site-packages/pyhello/__init__.py")
            .is_file()
    );
    let entry_point = fs_err::read_to_string(prefix.join("bin/pyhello")).unwrap();
    assert!(
        entry_point.starts_with("#!/opt/conda/bin/python3.9"),
        "{entry_point}"
    );
    assert_eq!(
        fs_err::read_link(prefix.join("lib/libcudart.so")).unwrap(),
        Path::new("libcudart.so.11.0")
    );
}
