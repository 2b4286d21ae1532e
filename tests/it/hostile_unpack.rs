//! Issue 30, the image root of `smoke --framework`: every layer of a stranger's image is
//! unpacked into a private root (`smoke::unpack`), often as root, and the image's Python runs
//! there (`smoke::sandbox`). Each case is a one-layer layout written by hand, run through the
//! real `imgbuild smoke --framework --json`:
//! - an entry or a hard link that climbs out with `..` is refused, naming it and its layer;
//! - a planted link (`usr/local -> /`, `-> <host dir>`, `-> ../../..`) followed by an entry
//!   beneath it is refused, and nothing appears on the host;
//! - a hard link to `/etc/passwd` is the image's own file, never the host's;
//! - device nodes and fifos are not made, set-user-ID and set-group-ID bits are dropped: seen
//!   from inside the sandbox by a stand-in `python3` (a busybox script that reports what the
//!   root holds as the probe's facts, so it comes back in the `--json` report);
//! - a root past `IMGBUILD_SMOKE_MAX_ROOTFS_BYTES` is refused naming the bound;
//! - a whiteout that names no file (`.wh...` would remove the directory's parent) is refused.
//!
//! Every run has its own `TMPDIR`, where the private root is made: it must be empty again
//! afterwards, whatever the outcome.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{
    common::{Project, Run, require_root},
    hostile_base::Base,
};

/// One tar entry, its name and link target written verbatim into the header.
enum Entry {
    File(String, Vec<u8>, u32),
    Symlink(String, String),
    Hardlink(String, String),
    CharDevice(String),
    BlockDevice(String),
    Fifo(String),
}

fn file(path: &str, bytes: impl Into<Vec<u8>>) -> Entry {
    Entry::File(path.into(), bytes.into(), 0o644)
}

fn symlink(path: &str, target: &str) -> Entry {
    Entry::Symlink(path.into(), target.into())
}

fn hardlink(path: &str, target: &str) -> Entry {
    Entry::Hardlink(path.into(), target.into())
}

/// Copies `value` into a fixed-size header field, NUL-padded; no checks, by design.
fn put(field: &mut [u8], value: &str) {
    assert!(value.len() < field.len(), "`{value}` does not fit");
    field.fill(0);
    field[..value.len()].copy_from_slice(value.as_bytes());
}

/// A GNU tar of `entries`, names and link targets as given (the `tar` crate's own setters
/// refuse `..`).
fn layer(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(1_696_118_400);
        header.set_mode(0o644);
        header.set_size(0);
        let (path, link, data, kind): (&str, Option<&str>, &[u8], _) = match entry {
            Entry::File(path, bytes, mode) => {
                header.set_mode(*mode);
                header.set_size(bytes.len() as u64);
                (path, None, bytes, tar::EntryType::Regular)
            }
            Entry::Symlink(path, target) => (path, Some(target), &[], tar::EntryType::Symlink),
            Entry::Hardlink(path, target) => (path, Some(target), &[], tar::EntryType::Link),
            Entry::CharDevice(path) => (path, None, &[], tar::EntryType::Char),
            Entry::BlockDevice(path) => (path, None, &[], tar::EntryType::Block),
            Entry::Fifo(path) => (path, None, &[], tar::EntryType::Fifo),
        };
        header.set_entry_type(kind);
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            // 1:3 is /dev/null, 8:0 the first disk.
            let (major, minor) = if kind == tar::EntryType::Char {
                (1, 3)
            } else {
                (8, 0)
            };
            header.set_device_major(major).unwrap();
            header.set_device_minor(minor).unwrap();
        }
        let gnu = header.as_gnu_mut().unwrap();
        put(&mut gnu.name, path);
        if let Some(link) = link {
            put(&mut gnu.linkname, link);
        }
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// A project holding `images/hostile`, a one-layer layout whose layer is `entries`, and an
/// empty `tmp/` for the runs' `TMPDIR`. Also the layer's digest, `sha256:…`.
fn case(entries: &[Entry]) -> (Project, String) {
    let project = Project::new();
    let tar = layer(entries);
    Base::write_layer(&project.path().join("images/hostile"), &tar);
    fs_err::create_dir_all(project.path().join("tmp")).unwrap();
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
    (project, digest)
}

/// `imgbuild smoke --framework --json images/hostile` with the project's `tmp/` as `TMPDIR`
/// and `envs`; the private root must be gone afterwards, whatever the outcome.
#[track_caller]
fn smoke(project: &Project, envs: &[(&str, &str)]) -> Run {
    let tmp = project.path().join("tmp");
    let mut all = vec![("TMPDIR", tmp.to_str().unwrap())];
    all.extend_from_slice(envs);
    let run = project.run_with(
        &["smoke", "--framework", "--json", "images/hostile"],
        &all,
        None,
    );
    let left: Vec<PathBuf> = fs_err::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}\n{}", run.stderr);
    run
}

/// A name no host has: the project directory's own, unique to this run.
fn unique(project: &Project) -> String {
    let name = project.path().file_name().unwrap().to_string_lossy();
    format!("imgbuild-escaped-{}", name.trim_start_matches('.'))
}

#[test]
fn entries_that_climb_out_are_refused_naming_the_entry_and_its_layer() {
    for path in ["../escape", "a/../../escape", "./a/b/../../../escape"] {
        let (project, digest) = case(&[file("etc/hostname", "image\n"), file(path, "out\n")]);
        let run = smoke(&project, &[]);
        run.assert_failure_naming(
            1,
            &[
                "Cannot unpack image `images/hostile` to run its frameworks",
                &format!("`{path}` in layer `{digest}` leads outside the image's root"),
            ],
        );
        // The root was `tmp/imgbuild-rootfs-…`: one `..` is `tmp/`, two the project.
        for host in [
            project.path().join("tmp/escape"),
            project.path().join("escape"),
        ] {
            assert!(!host.exists(), "{path}: {} was written", host.display());
        }
    }
}

#[test]
fn a_planted_link_leads_no_write_onto_the_host() {
    let probe = Project::new();
    let host_dir = probe.path().join("host");
    fs_err::create_dir_all(&host_dir).unwrap();
    let name = unique(&probe);
    // `/`; a host directory that exists; and, from `tmp/imgbuild-rootfs-…/usr/local`, the
    // project directory.
    for target in ["/", host_dir.to_str().unwrap(), "../../.."] {
        let (project, digest) = case(&[
            file("etc/hostname", "image\n"),
            symlink("usr/local", target),
            file(&format!("usr/local/{name}"), "escaped\n"),
        ]);
        let run = smoke(&project, &[]);
        let entry = format!("usr/local/{name}");
        run.assert_failure_naming(
            1,
            &[
                "Cannot unpack image `images/hostile` to run its frameworks",
                &format!(
                    "`{entry}` in layer `{digest}` lies beneath `usr/local`, a link to \
                     `{target}` that leads to no directory inside the image's root"
                ),
            ],
        );
        for host in [
            Path::new("/").join(&name),
            host_dir.join(&name),
            project.path().join(&name),
            project.path().join("tmp").join(&name),
        ] {
            assert!(
                !host.exists(),
                "-> {target}: {} was written",
                host.display()
            );
        }
    }
    assert_eq!(fs_err::read_dir(&host_dir).unwrap().count(), 0);
}

#[test]
fn a_hard_link_out_of_the_root_is_refused_naming_its_target() {
    for target in ["../../etc/passwd", "etc/../../../etc/passwd"] {
        let (project, digest) = case(&[
            file("etc/passwd", "root:x:0:0:image:/root:/bin/sh\n"),
            hardlink("x", target),
        ]);
        smoke(&project, &[]).assert_failure_naming(
            1,
            &[&format!(
                "`x` in layer `{digest}` is a hard link to `{target}`, outside the image's root"
            )],
        );
    }
    // An absolute target is the image's own path: one the image lacks is no host file.
    let (project, digest) = case(&[hardlink("shadow", "/etc/shadow")]);
    smoke(&project, &[])
        .assert_failure_naming(1, &[&format!("cannot unpack `shadow` of layer `{digest}`")]);
}

/// A stand-in for the image's Python (`/usr/bin/python3`, the first on the default `PATH`):
/// its `detect` run names PyTorch, and its PyTorch run reports, as the probe's `error`, what
/// each of `paths` is in the root it runs in (`busybox stat`: name, type, octal mode) and the
/// contents of each of `read`. The verdict is `broken`, its message those facts.
fn stand_in_python(paths: &[&str], read: &[&str]) -> Vec<Entry> {
    let script = format!(
        "#!/bin/busybox sh\n\
         if [ \"$3\" = detect ]; then echo '{{\"frameworks\": [\"pytorch\"]}}'; exit 0; fi\n\
         seen=''\n\
         for p in {paths}; do\n\
           if [ -e \"$p\" ] || [ -L \"$p\" ]; then s=$(/bin/busybox stat -c '%n %F %a' \"$p\"); else s=\"$p absent\"; fi\n\
           seen=\"$seen$s; \"\n\
         done\n\
         for p in {read}; do seen=\"$seen$p holds $(/bin/busybox cat \"$p\"); \"; done\n\
         echo \"{{\\\"framework\\\": \\\"pytorch\\\", \\\"stage\\\": \\\"run\\\", \\\"error\\\": \\\"$seen\\\"}}\"\n",
        paths = paths.join(" "),
        read = read.join(" "),
    );
    vec![
        Entry::File(
            "bin/busybox".into(),
            fs_err::read("/bin/busybox").expect("/bin/busybox (Debian: busybox-static)"),
            0o755,
        ),
        Entry::File("usr/bin/python3".into(), script.into_bytes(), 0o755),
    ]
}

/// The one framework check of a run that got as far as the sandbox: its `message`. The run's
/// exit code is its verdict's: without a GPU a broken framework turns `no-device` into
/// `framework-failure` (6), since a broken framework fails on any machine.
#[track_caller]
fn framework_message(run: &Run) -> String {
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", run.stdout, run.stderr));
    if !Path::new("/proc/driver/nvidia/version").exists() {
        assert_eq!(report["verdict"], "framework-failure", "{report}");
        assert_eq!(run.code, 6, "{report}");
    }
    let checks = report["framework"].as_array().expect("a framework section");
    assert_eq!(checks.len(), 1, "{report}");
    assert_eq!(checks[0]["framework"], "pytorch");
    assert_eq!(checks[0]["python"], "/usr/bin/python3");
    assert_eq!(checks[0]["verdict"], "broken", "{report}");
    checks[0]["message"].as_str().unwrap().to_string()
}

#[test]
fn devices_fifos_and_set_id_bits_never_reach_the_root() {
    require_root!("the sandbox's chroot path, the one CI runs, needs root");
    let mut entries = stand_in_python(
        &[
            "/opt/null",
            "/opt/disk",
            "/opt/fifo",
            "/opt/suid",
            "/opt/sgid",
        ],
        &[],
    );
    entries.extend([
        Entry::CharDevice("opt/null".into()),
        Entry::BlockDevice("opt/disk".into()),
        Entry::Fifo("opt/fifo".into()),
        Entry::File(
            "opt/suid".into(),
            b"#!/bin/busybox sh\nid -u\n".to_vec(),
            0o4755,
        ),
        Entry::File(
            "opt/sgid".into(),
            b"#!/bin/busybox sh\nid -g\n".to_vec(),
            0o2755,
        ),
    ]);
    let (project, _) = case(&entries);
    let message = framework_message(&smoke(&project, &[]));
    assert_eq!(
        message,
        "the check failed: /opt/null absent; /opt/disk absent; /opt/fifo absent; \
         /opt/suid regular file 755; /opt/sgid regular file 755; "
    );
}

#[test]
fn a_hard_link_to_etc_passwd_is_the_images_own() {
    require_root!("the sandbox's chroot path, the one CI runs, needs root");
    let host_before = fs_err::read("/etc/passwd").unwrap();
    let mut entries = stand_in_python(&["/x"], &["/x"]);
    entries.extend([
        file("etc/passwd", "image-passwd\n"),
        hardlink("x", "/etc/passwd"),
    ]);
    let (project, _) = case(&entries);
    let message = framework_message(&smoke(&project, &[]));
    assert_eq!(
        message,
        "the check failed: /x regular file 644; /x holds image-passwd; "
    );
    assert_eq!(fs_err::read("/etc/passwd").unwrap(), host_before);
}

#[test]
fn a_root_past_its_bound_is_refused_naming_the_bound() {
    // Each file is under the bound, the two together are not.
    let (project, digest) = case(&[
        file("opt/a", vec![1u8; 600 << 10]),
        file("opt/b", vec![2u8; 600 << 10]),
    ]);
    let bound = [("IMGBUILD_SMOKE_MAX_ROOTFS_BYTES", "1048576")];
    smoke(&project, &bound).assert_failure_naming(
        1,
        &[
            "Cannot unpack image `images/hostile` to run its frameworks",
            &format!("`opt/b` in layer `{digest}` unpacks to more than 434176 bytes"),
            "what is left of the 1048576 bytes an unpacked image may hold; \
             IMGBUILD_SMOKE_MAX_ROOTFS_BYTES sets it",
        ],
    );
    // A bound that is no number is said to be ignored, and the default holds.
    let run = smoke(&project, &[("IMGBUILD_SMOKE_MAX_ROOTFS_BYTES", "1MiB")]);
    assert!(
        run.stderr
            .contains("IMGBUILD_SMOKE_MAX_ROOTFS_BYTES=1MiB is not a positive integer"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("Cannot unpack"), "{}", run.stderr);
}

#[test]
fn whiteouts_that_name_no_file_are_refused() {
    // `.wh...` would white out `..`: the directory's parent, up to the root itself.
    for whiteout in [".wh...", "opt/.wh...", "opt/sub/.wh..", "opt/.wh."] {
        let (project, digest) = case(&[
            file("opt/keep", "kept\n"),
            file("opt/sub/x", "x\n"),
            file(whiteout, ""),
        ]);
        smoke(&project, &[]).assert_failure_naming(
            1,
            &[&format!(
                "`{whiteout}` in layer `{digest}` is a whiteout that names no file"
            )],
        );
    }
}
