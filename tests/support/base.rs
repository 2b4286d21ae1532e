//! A runnable base image for tests: an OCI image layout holding Debian's static busybox.
//!
//! Docker Hub is not reachable from our machines, so tests that need `base = "oci:…"` get this
//! one-layer image instead. It is made with the real `umoci` CLI, so the layout is a
//! third-party one (not written by our own OCI code), and every time input is pinned, so the
//! same busybox and umoci give the same manifest digest on every run.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

/// `created` of the base image config, its history entry and every file's mtime in its layer.
pub(crate) const BASE_CREATED: &str = "2023-10-01T00:00:00Z";

/// The busybox applets the base image links to `/bin/busybox`.
pub(crate) const BUSYBOX_APPLETS: &[&str] = &["sh", "cat", "ls", "echo", "test"];

/// Whether `cmd` is an executable file on `$PATH`.
pub(crate) fn have(cmd: &str) -> bool {
    find_on_path(cmd).is_some()
}

fn find_on_path(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(cmd))
        .find(|candidate| {
            fs_err::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Creates an OCI image layout at `dir`, tag `latest`, whose single layer holds `/bin/busybox`
/// (copied from the host's busybox-static), symlinks for [`BUSYBOX_APPLETS`], and the
/// directories `/tmp` (mode 1777) and `/etc`. `dir` must not exist or be empty.
///
/// Runs `umoci` as the current user; as root (our machines) the layer's files are owned by 0:0.
pub(crate) fn busybox_base_layout(dir: &Path) -> anyhow::Result<()> {
    ensure!(
        have("umoci"),
        "umoci is not installed (Debian: apt-get install umoci); it builds the busybox base image"
    );
    let busybox = Path::new("/bin/busybox");
    ensure!(
        busybox.is_file(),
        "/bin/busybox is missing (Debian: apt-get install busybox-static)"
    );
    umoci_image(
        dir,
        "imgbuild tests: busybox base",
        Some("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        |rootfs| {
            for sub in ["bin", "etc", "tmp"] {
                fs_err::create_dir_all(rootfs.join(sub))?;
            }
            fs_err::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
            fs_err::copy(busybox, rootfs.join("bin/busybox"))?;
            fs_err::set_permissions(
                rootfs.join("bin/busybox"),
                std::fs::Permissions::from_mode(0o755),
            )?;
            for applet in BUSYBOX_APPLETS {
                let link = rootfs.join("bin").join(applet);
                symlink("busybox", &link).with_context(|| format!("symlink {}", link.display()))?;
            }
            Ok(())
        },
    )
}

/// Makes the one-layer image `dir:latest` with the real umoci: `fill` writes its rootfs, whose
/// mtimes are then pinned to [`BASE_CREATED`]. `dir` must not exist or be empty.
fn umoci_image(
    dir: &Path,
    created_by: &str,
    env: Option<&str>,
    fill: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    // `umoci init` refuses an existing directory; accept an empty one (e.g. a fresh tempdir).
    if dir.exists() {
        ensure!(
            fs_err::read_dir(dir)?.next().is_none(),
            "{} exists and is not empty",
            dir.display()
        );
        fs_err::remove_dir(dir)?;
    }

    let image = format!("{}:latest", dir.display());
    let work = tempfile::tempdir()?;
    let bundle = work.path().join("bundle");

    umoci(&["init", "--layout", &dir.display().to_string()])?;
    umoci(&["new", "--image", &image])?;
    umoci(&["unpack", "--image", &image, &bundle.display().to_string()])?;
    let rootfs = bundle.join("rootfs");
    fill(&rootfs)?;
    pin_mtimes(&rootfs)?;

    // Fixed history and config timestamps, and `gc` to drop the blobs `new` and `repack`
    // superseded (they carry the current time), so the whole layout is reproducible.
    umoci(&[
        "repack",
        "--history.created",
        BASE_CREATED,
        "--history.created_by",
        created_by,
        "--image",
        &image,
        &bundle.display().to_string(),
    ])?;
    let mut config = vec!["config", "--no-history", "--created", BASE_CREATED];
    if let Some(env) = env {
        config.extend(["--config.env", env]);
    }
    config.extend([
        "--os",
        "linux",
        "--architecture",
        "amd64",
        "--image",
        &image,
    ]);
    umoci(&config)?;
    umoci(&["gc", "--layout", &dir.display().to_string()])?;
    Ok(())
}

/// Sets the mtime of every entry under `root` (symlinks themselves included) to
/// [`BASE_CREATED`]: umoci puts mtimes into the layer tar. std cannot set a symlink's mtime,
/// so this uses `touch -h`.
fn pin_mtimes(root: &Path) -> anyhow::Result<()> {
    let mut paths = Vec::new();
    for entry in walkdir::WalkDir::new(root) {
        paths.push(entry?.into_path());
    }
    let status = Command::new("touch")
        .args(["-h", "-d", BASE_CREATED])
        .args(&paths)
        .status()
        .context("running touch")?;
    ensure!(status.success(), "touch -h failed: {status}");
    Ok(())
}

/// Runs `umoci ARGS`, failing with its output when it fails.
pub(crate) fn umoci(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("umoci")
        .args(args)
        .output()
        .with_context(|| format!("running umoci {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "umoci {} failed ({}):\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The Debian release whose glibc (2.31) stands for an old distribution in tests.
pub(crate) const OLD_GLIBC_SUITE: &str = "bullseye";

/// The Debian release of this machine (`VERSION_CODENAME` of `/etc/os-release`): a base of
/// that release has the glibc that binaries built here need.
pub(crate) fn host_debian_suite() -> anyhow::Result<String> {
    let text = fs_err::read_to_string("/etc/os-release")?;
    text.lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .context("/etc/os-release names no VERSION_CODENAME: these tests need a Debian host")
}

/// Creates an OCI image layout at `dir`, tag `latest`, holding only the Debian `suite`'s
/// `packages` (bullseye's `libc6` is glibc 2.31) and what they depend on (see
/// [`debian_rootfs_tar`]), plus `/tmp` (mode 1777).
pub(crate) fn debian_base_layout(
    dir: &Path,
    cache_dir: &Path,
    suite: &str,
    packages: &[&str],
) -> anyhow::Result<()> {
    ensure!(
        have("umoci"),
        "umoci is required (tests/install-deps.sh installs it)"
    );
    let rootfs_tar = debian_rootfs_tar(cache_dir, suite, packages)?;
    let created_by = format!("imgbuild tests: {suite} {}", packages.join(" "));
    umoci_image(dir, &created_by, None, |rootfs| {
        let status = Command::new("tar")
            .arg("-xf")
            .arg(&rootfs_tar)
            .arg("-C")
            .arg(rootfs)
            .status()
            .context("running tar")?;
        ensure!(
            status.success(),
            "unpacking {} failed",
            rootfs_tar.display()
        );
        fs_err::create_dir_all(rootfs.join("tmp"))?;
        Ok(())
    })
}

/// The rootfs tar of the Debian `suite`'s `packages` and what they depend on, unpacked by
/// `mmdebstrap --variant=extract` from deb.debian.org (no maintainer script runs). It is kept
/// in `cache_dir`, so the network is needed once per suite and package list; other helpers
/// take files from it (the PyPI tests' Python interpreter).
pub(crate) fn debian_rootfs_tar(
    cache_dir: &Path,
    suite: &str,
    packages: &[&str],
) -> anyhow::Result<PathBuf> {
    let rootfs_tar = cache_dir.join(format!("{suite}-{}.tar", packages.join("+")));
    // Tests of this process wait for one download.
    static DOWNLOAD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = DOWNLOAD.lock().unwrap_or_else(|e| e.into_inner());
    if !rootfs_tar.is_file() {
        ensure!(
            have("mmdebstrap"),
            "mmdebstrap is required (tests/install-deps.sh installs it)"
        );
        // mmdebstrap picks the output format from the extension: keep `.tar`. A name of
        // this process's own, renamed into place, so concurrent tests never see half a tar.
        let partial = rootfs_tar.with_extension(format!("partial-{}.tar", std::process::id()));
        let status = Command::new("mmdebstrap")
            .args([
                "--quiet",
                "--variant=extract",
                &format!("--include={}", packages.join(",")),
                "--mode=root",
                suite,
            ])
            .arg(&partial)
            .arg("http://deb.debian.org/debian")
            .status()
            .context("running mmdebstrap")?;
        ensure!(status.success(), "mmdebstrap {suite} failed: {status}");
        fs_err::rename(&partial, &rootfs_tar)?;
    }
    Ok(rootfs_tar)
}
