//! Issue 15, the machine and the network misbehaving while imgbuild runs:
//!
//! - a layout is a store of many images: building one image into a layout that holds others
//!   (other tags, an image another tool copied in) keeps them and every blob they reach,
//!   checked by `imgbuild verify`, `oci-image-tool validate`, `umoci unpack` and `skopeo`;
//! - a registry that accepts connections and never answers (or stops in the middle of an
//!   answer) makes `push` and base pulls fail by themselves, naming the registry and saying
//!   it timed out (`IMGBUILD_REGISTRY_TIMEOUT` keeps the tests short);
//! - a password written into a push reference is never shown;
//! - a full disk (a 1 MiB tmpfs as the output or the cache, root only) exits 2 naming the
//!   path, and leaves the image already in place intact.
//!
//! Every imgbuild run here goes through [`run`], which kills the process and fails the test
//! if it does not end by itself: a hang is a failure, never a stuck test.

use std::{
    io::Read,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::{
    common::{LayoutView, Project, Run, require_root, run_tool, skip_unprivileged, unpack},
    registry::{Auth, Registry},
    support::{base::busybox_base_layout, channel::tiny_recipe, shared_channel},
};

/// Runs imgbuild in `project` with `envs`, an empty Docker config (no host credentials),
/// and a guard against hangs: past two minutes it is killed and the test fails.
fn run(project: &Project, args: &[&str], envs: &[(&str, &str)]) -> Run {
    let docker = project.path().join("docker-config");
    fs_err::create_dir_all(&docker).unwrap();
    let mut command = project.command(args);
    command
        .env("DOCKER_CONFIG", &docker)
        .env("REGISTRY_AUTH_FILE", docker.join("auth.json"))
        .env_remove("IMGBUILD_REGISTRY_TIMEOUT");
    for (key, value) in envs {
        command.env(key, value);
    }
    crate::common::run_with_deadline(command, project, args)
}

/// A recipe of the test channel named `name` with `tags`.
fn recipe(name: &str, tags: &[&str], deps: &[&str]) -> String {
    let tags: Vec<String> = tags.iter().map(|t| format!("\"{t}\"")).collect();
    tiny_recipe(shared_channel(), name, deps).replacen(
        "[image]\n",
        &format!("[image]\ntags = [{}]\n", tags.join(", ")),
        1,
    )
}

/// The digest `layout`'s `index.json` gives `tag`.
fn tagged_digest(layout: &LayoutView, tag: &str) -> Option<String> {
    layout.index()["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .map(|entry| entry["digest"].as_str().unwrap().to_string())
}

/// The manifest, config and layer digests of the image `tag` names.
fn blobs_of(layout: &LayoutView, tag: &str) -> Vec<String> {
    let digest = tagged_digest(layout, tag).unwrap_or_else(|| panic!("no tag {tag}"));
    let manifest = layout.json_blob(&digest);
    let mut blobs = vec![
        digest,
        manifest["config"]["digest"].as_str().unwrap().into(),
    ];
    for layer in manifest["layers"].as_array().unwrap() {
        blobs.push(layer["digest"].as_str().unwrap().to_string());
    }
    blobs
}

/// What real consumers say about the image `tag` of the layout at `dir`: oci-image-tool
/// validates it, umoci unpacks it, skopeo reads its digest.
fn check_with_tools(dir: &Path, tag: &str, digest: &str) {
    let arg = dir.to_str().unwrap();
    run_tool(
        "oci-image-tool",
        &[
            "validate",
            "--type",
            "image",
            "--ref",
            &format!("name={tag}"),
            arg,
        ],
    );
    let bundles = tempfile::tempdir().unwrap();
    let rootfs = unpack(dir, tag, &bundles.path().join("bundle"));
    assert!(rootfs.join("opt/conda").is_dir(), "{tag}: no prefix");
    let inspect: serde_json::Value = serde_json::from_str(&run_tool(
        "skopeo",
        &["inspect", &format!("oci:{arg}:{tag}")],
    ))
    .unwrap();
    assert_eq!(inspect["Digest"], digest, "{tag}");
}

/// Two recipes, tags `x` and `y`, built into one `-o` layout: both images stay whole; when
/// `x` moves to a new image, `y` and every blob it needs stay and only what the old `x`
/// alone held is removed.
#[test]
fn two_recipes_share_one_output_layout() {
    let project = Project::new();
    let store = project.path().join("store");
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    let write = |file: &str, text: String| {
        fs_err::write(project.path().join("recipes").join(file), text).unwrap();
    };
    write("a.toml", recipe("a", &["x"], &["hello 1.0"]));
    write("b.toml", recipe("b", &["y"], &["pyhello", "other"]));

    let a = run(&project, &["build", "recipes/a.toml", "-o", "store"], &[]).success();
    let b = run(&project, &["build", "recipes/b.toml", "-o", "store"], &[]).success();
    let layout = LayoutView::new(&store);
    assert_eq!(tagged_digest(&layout, "x"), Some(a.digest()));
    assert_eq!(tagged_digest(&layout, "y"), Some(b.digest()));
    let a_blobs = blobs_of(&layout, "x");
    for blob in blobs_of(&layout, "x").iter().chain(&blobs_of(&layout, "y")) {
        assert!(
            store.join("blobs/sha256").join(&blob[7..]).is_file(),
            "{blob} was removed"
        );
    }
    // verify checks every blob every entry reaches.
    run(&project, &["verify", "store"], &[]).success();
    check_with_tools(&store, "x", &a.digest());
    check_with_tools(&store, "y", &b.digest());
    // A rebuild of `a` with `y` beside it is a no-op, as it is in a layout of its own.
    let again = run(&project, &["build", "recipes/a.toml", "-o", "store"], &[]).success();
    assert!(again.stderr.contains("Unchanged"), "{}", again.stderr);
    assert_eq!(again.digest(), a.digest());

    // `x` moves: `y` stays whole, the blobs only the old `x` held go.
    write("a.toml", recipe("a", &["x"], &["hello 2.0"]));
    let moved = run(&project, &["build", "recipes/a.toml", "-o", "store"], &[]).success();
    assert_ne!(moved.digest(), a.digest());
    assert_eq!(tagged_digest(&layout, "x"), Some(moved.digest()));
    assert_eq!(tagged_digest(&layout, "y"), Some(b.digest()));
    let y_blobs = blobs_of(&layout, "y");
    let x_blobs = blobs_of(&layout, "x");
    for blob in &a_blobs {
        let kept = store.join("blobs/sha256").join(&blob[7..]).is_file();
        let needed = y_blobs.contains(blob) || x_blobs.contains(blob);
        assert_eq!(kept, needed, "{blob}: kept {kept}, still needed {needed}");
    }
    assert_eq!(
        layout.blob_names().len(),
        y_blobs
            .iter()
            .chain(&x_blobs)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        "only blobs some image reaches are left"
    );
    run(&project, &["verify", "store"], &[]).success();
    check_with_tools(&store, "y", &b.digest());
    check_with_tools(&store, "x", &moved.digest());
}

/// Beside a shared layout lies the SBOM of the last build into it: pushing another tag's
/// image must not attach it (it would describe the wrong image).
#[test]
fn a_push_attaches_only_the_sboms_of_its_own_image() {
    let registry = Registry::start(Auth::None);
    let project = Project::new();
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    for (file, name, tag, deps) in [
        ("a.toml", "a", "x", &["pyhello"][..]),
        ("b.toml", "b", "y", &["other"][..]),
    ] {
        fs_err::write(
            project.path().join("recipes").join(file),
            recipe(name, &[tag], deps),
        )
        .unwrap();
        let path = format!("recipes/{file}");
        run(&project, &["build", &path, "-o", "store"], &[]).success();
    }
    let sboms_of_push = |tag: &str| {
        let target = format!("{}/shared/{tag}:v1", registry.host);
        let pushed = run(
            &project,
            &[
                "push",
                &format!("store:{tag}"),
                &target,
                "--insecure",
                "--json",
            ],
            &[],
        )
        .success();
        let report: serde_json::Value = serde_json::from_str(&pushed.stdout).unwrap();
        report["sboms"].as_array().unwrap().len()
    };
    // store.spdx.json and store.cdx.json describe `y`, built last.
    assert_eq!(sboms_of_push("y"), 2);
    assert_eq!(sboms_of_push("x"), 0);
}

/// An image another tool put into the default layout `images/<name>` (skopeo copying it
/// under tag `other`) survives a rebuild of the recipe's own image there.
#[test]
fn a_rebuild_keeps_an_image_skopeo_copied_into_the_layout() {
    let project = Project::new();
    project.write_recipe(&recipe("app", &["latest"], &["hello 1.0"]));
    run(&project, &["build", "recipes/image.toml"], &[]).success();
    fs_err::write(
        project.path().join("recipes/other.toml"),
        recipe("donor", &["latest"], &["pyhello"]),
    )
    .unwrap();
    let donor = run(&project, &["build", "recipes/other.toml"], &[]).success();
    let images = project.path().join("images");
    run_tool(
        "skopeo",
        &[
            "copy",
            &format!("oci:{}:latest", images.join("donor").display()),
            &format!("oci:{}:other", images.join("app").display()),
        ],
    );
    let layout = LayoutView::new(images.join("app"));
    let copied = tagged_digest(&layout, "other").expect("skopeo tagged it");
    let copied_blobs = blobs_of(&layout, "other");

    project.write_recipe(&recipe("app", &["latest"], &["hello 2.0"]));
    let rebuilt = run(&project, &["build", "recipes/image.toml"], &[]).success();
    assert_eq!(tagged_digest(&layout, "latest"), Some(rebuilt.digest()));
    assert_eq!(tagged_digest(&layout, "other"), Some(copied.clone()));
    assert_eq!(blobs_of(&layout, "other"), copied_blobs);
    run(&project, &["verify", "images/app"], &[]).success();
    check_with_tools(&images.join("app"), "other", &copied);
    // skopeo copies the bytes as they are: the same image as the donor's.
    assert_eq!(copied, donor.digest());
}

/// How a [`SilentRegistry`] treats a connection.
#[derive(Clone, Copy)]
enum Silence {
    /// Accepts it and never sends a byte.
    Total,
    /// Reads the request, sends the head of a 200 with a body, then nothing more.
    AfterHead,
}

/// A TCP listener on 127.0.0.1 playing a registry that has stopped answering. Connections
/// are held open until the listener is dropped, so the client sees silence, not a close.
struct SilentRegistry {
    host: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SilentRegistry {
    fn start(silence: Silence) -> SilentRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut held: Vec<TcpStream> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if let Silence::AfterHead = silence {
                                answer_head_only(&stream);
                            }
                            held.push(stream);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        SilentRegistry {
            host,
            stop,
            thread: Some(thread),
        }
    }
}

/// Reads what arrives within a moment (the request head), then sends a response head that
/// promises a body which never comes.
fn answer_head_only(mut stream: &TcpStream) {
    use std::io::Write;
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buffer = [0u8; 4096];
    let _ = stream.read(&mut buffer);
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: 1000\r\n\r\n{",
    );
}

impl Drop for SilentRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The short timeout the silent-registry tests run with.
const TIMEOUT: (&str, &str) = ("IMGBUILD_REGISTRY_TIMEOUT", "1");

#[track_caller]
fn assert_timed_out(run: &Run, registry: &SilentRegistry) {
    run.assert_failure_naming(1, &[&format!("`{}`", registry.host), "timed out"]);
}

/// `push` to a registry that never answers ends by itself, naming it.
#[test]
fn push_to_a_silent_registry_fails_by_itself() {
    let registry = SilentRegistry::start(Silence::Total);
    let project = Project::new();
    project.write_recipe(&recipe("app", &["latest"], &["hello 1.0"]));
    run(&project, &["build", "recipes/image.toml"], &[]).success();
    let target = format!("{}/ml/app:v1", registry.host);
    let pushed = run(
        &project,
        &["push", "images/app", &target, "--insecure"],
        &[TIMEOUT],
    );
    assert_timed_out(&pushed, &registry);
    // The flag says the same as the variable.
    let flagged = run(
        &project,
        &[
            "push",
            "images/app",
            &target,
            "--insecure",
            "--registry-timeout",
            "0.5",
        ],
        &[],
    );
    assert_timed_out(&flagged, &registry);
    // `build --push` too (the build itself succeeded and printed its result).
    let built = run(
        &project,
        &[
            "build",
            "recipes/image.toml",
            "--push",
            &target,
            "--insecure",
        ],
        &[TIMEOUT],
    );
    assert_eq!(built.code, 1, "{}", built.stderr);
    for needle in [format!("`{}`", registry.host), "timed out".to_string()] {
        assert!(
            built.stderr.contains(&needle),
            "{needle}:\n{}",
            built.stderr
        );
    }
}

/// A base on a registry that never answers (over HTTPS: the TLS handshake gets no reply),
/// or that stops in the middle of its answer (plain HTTP), fails the build by itself before
/// anything is written.
#[test]
fn a_base_on_a_silent_registry_fails_the_build_by_itself() {
    for (silence, insecure) in [(Silence::Total, false), (Silence::AfterHead, true)] {
        let registry = SilentRegistry::start(silence);
        let project = Project::new();
        project.write_recipe(&recipe("app", &["latest"], &["hello 1.0"]).replace(
            "base = \"scratch\"",
            &format!("base = \"{}/base/busybox:1\"", registry.host),
        ));
        let mut args = vec!["build", "recipes/image.toml"];
        if insecure {
            args.push("--insecure");
        }
        let built = run(&project, &args, &[TIMEOUT]);
        assert_timed_out(&built, &registry);
        assert!(built.stderr.contains("base"), "{}", built.stderr);
        project.assert_no_image();
        assert!(!project.lock_path().exists());
    }
}

/// A password written into a push reference (`user:password@host/…`, a URL with
/// credentials, a password holding `/` or `@`) appears in no output, whatever the failure.
#[test]
fn a_password_in_a_push_reference_is_never_shown() {
    let registry = SilentRegistry::start(Silence::Total);
    let project = Project::new();
    project.write_recipe(&recipe("app", &["latest"], &["hello 1.0"]));
    run(&project, &["build", "recipes/image.toml"], &[]).success();
    let host = &registry.host;
    let secret = "Pa55w0rd-never-shown";
    let references = [
        format!("alice:{secret}@{host}/ml/app:v1"),
        format!("https://alice:{secret}@{host}/ml/app:v1"),
        format!("http://alice:{secret}@{host}/ml/app"),
        format!("alice:{secret}/x@y@{host}/ml/app:v1"),
        format!("alice:{secret}@{host}"),
    ];
    for reference in &references {
        for args in [
            vec!["push", "images/app", reference.as_str(), "--insecure"],
            vec!["push", "images/app", reference.as_str(), "--json"],
            vec![
                "build",
                "recipes/image.toml",
                "--push",
                reference.as_str(),
                "--insecure",
                "--json",
            ],
        ] {
            let failed = run(&project, &args, &[TIMEOUT]);
            assert_eq!(failed.code, 1, "{args:?}: {}", failed.stderr);
            assert!(!failed.stderr.contains("panicked"), "{}", failed.stderr);
            for (what, output) in [("stderr", &failed.stderr), ("stdout", &failed.stdout)] {
                assert!(
                    !output.contains("Pa55w0rd"),
                    "{args:?}: the password is in {what}:\n{output}"
                );
            }
            assert!(
                failed.stderr.contains("imgbuild login"),
                "{args:?}: says where credentials go:\n{}",
                failed.stderr
            );
        }
    }
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop; where this process
/// may not mount, a failure, or `None` (said on stderr) with `IMGBUILD_TESTS_UNPRIVILEGED=1`.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(parent: &Path, name: &str, size: &str) -> Option<Tmpfs> {
        require_root!("mounting a tmpfs needs root", None);
        let dir = parent.join(name);
        fs_err::create_dir_all(&dir).unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output();
        match output {
            Ok(output) if output.status.success() => Some(Tmpfs { dir }),
            // Root without the right to mount (a container's) has lost privilege too.
            Ok(output) => {
                let said = String::from_utf8_lossy(&output.stderr);
                skip_unprivileged(&format!("cannot mount a tmpfs here: {}", said.trim()));
                None
            }
            Err(err) => {
                skip_unprivileged(&format!("cannot run mount: {err}"));
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a process the test killed): detach it, it goes once unused.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Every file under `dir`: path → sha256 of its bytes.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    use sha2::Digest;
    walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let bytes = fs_err::read(e.path()).unwrap();
            (
                e.path().to_path_buf(),
                hex::encode(sha2::Sha256::digest(bytes)),
            )
        })
        .collect()
}

/// The image in place when a build failed is as it was: every file it had is there with
/// the same bytes (`index.json` among them). What else the failed build left can only be
/// blobs no entry names (the next build collects them), never a temporary file.
#[track_caller]
fn assert_intact(dir: &Path, before: &std::collections::BTreeMap<PathBuf, String>) {
    let after = snapshot(dir);
    for (path, digest) in before {
        assert_eq!(after.get(path), Some(digest), "{} changed", path.display());
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(
            path.parent().unwrap().ends_with("blobs/sha256") && !name.starts_with('.'),
            "left behind: {}",
            path.display()
        );
    }
}

/// A run that ran out of disk: exit 2, no panic, the full path under `dir` and the OS's
/// reason named, never taken for a refused package.
#[track_caller]
fn assert_disk_full(run: &Run, dir: &str) {
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(!run.stderr.contains("is refused"), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("{dir}/")),
        "names the path:\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("No space left on device"),
        "{}",
        run.stderr
    );
}

/// Fills the file system holding `dir` with one file, `dir/filler`, leaving about `free`
/// bytes, so what a build writes next runs out of space whatever it is.
fn fill_leaving(dir: &Path, free: u64) {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = fs_err::File::create(&path).unwrap();
    let block = vec![0u8; 64 << 10];
    while file.write_all(&block).is_ok() {}
    let written = fs_err::metadata(&path).unwrap().len();
    file.set_len(written.saturating_sub(free)).unwrap();
}

/// An image whose blobs take a few KiB, and one that adds NVIDIA's CUDA runtime (a 280 KiB
/// layer; `hello` needs it).
const SMALL: &[&str] = &["pyhello"];
const LARGE: &[&str] = &["pyhello", "hello 1.0"];

/// A full output disk: exit 2, the path named, and the image already there untouched.
#[test]
fn a_full_output_disk_exits_2_naming_the_path_and_keeps_the_image() {
    let project = Project::new();
    let Some(disk) = Tmpfs::mount(project.path(), "disk", "1m") else {
        return;
    };
    let output = disk.dir.join("app");
    let output_arg = output.to_str().unwrap();
    project.write_recipe(&recipe("app", &["latest"], SMALL));
    let first = run(
        &project,
        &["build", "recipes/image.toml", "-o", output_arg],
        &[],
    )
    .success();
    let before = snapshot(&output);
    fill_leaving(&disk.dir, 64 << 10);

    project.write_recipe(&recipe("app", &["latest"], LARGE));
    for json in [false, true] {
        let mut args = vec!["build", "recipes/image.toml", "-o", output_arg];
        if json {
            args.push("--json");
        }
        let full = run(&project, &args, &[]);
        assert_disk_full(&full, output_arg);
        if json {
            assert!(full.stdout.contains("\"exit_code\":2"), "{}", full.stdout);
        }
        assert_intact(&output, &before);
        run(&project, &["verify", output_arg], &[]).success();
        assert_eq!(LayoutView::new(&output).manifest_digest(), first.digest());
    }
}

/// A full cache disk while a base is pulled into it: exit 2, the path named, and the image
/// already in place untouched.
#[test]
fn a_full_cache_disk_exits_2_naming_the_path_and_keeps_the_image() {
    let project = Project::new();
    let Some(disk) = Tmpfs::mount(project.path(), "cache-disk", "1m") else {
        return;
    };
    let registry = Registry::start(Auth::None);
    let base = project.path().join("busybox");
    busybox_base_layout(&base).unwrap();
    let base_ref = format!("{}/base/busybox:1", registry.host);
    run(
        &project,
        &["push", base.to_str().unwrap(), &base_ref, "--insecure"],
        &[],
    )
    .success();
    project.write_recipe(&recipe("app", &["latest"], SMALL));
    let first = run(&project, &["build", "recipes/image.toml"], &[]).success();
    let layout = project.path().join("images/app");
    let before = snapshot(&layout);

    // The base's busybox layer (1 MiB) is more than the disk has left.
    fill_leaving(&disk.dir, 256 << 10);
    project.write_recipe(
        &recipe("app", &["latest"], SMALL)
            .replace("base = \"scratch\"", &format!("base = \"{base_ref}\"")),
    );
    let cache = disk.dir.to_str().unwrap();
    let full = run(
        &project,
        &["build", "recipes/image.toml", "--insecure"],
        &[("IMGBUILD_CACHE_DIR", cache)],
    );
    assert_disk_full(&full, cache);
    assert_intact(&layout, &before);
    run(&project, &["verify", "images/app"], &[]).success();
    assert_eq!(LayoutView::new(&layout).manifest_digest(), first.digest());
}

/// A full cache disk while a package is unpacked into the package cache: exit 2 (the
/// machine's fault, not the package's), naming the cache path; it was reported as a refused
/// package, exit 1.
#[test]
fn a_full_cache_disk_while_unpacking_a_package_exits_2() {
    let project = Project::new();
    let Some(disk) = Tmpfs::mount(project.path(), "pkgs-disk", "1m") else {
        return;
    };
    fill_leaving(&disk.dir, 64 << 10);
    project.write_recipe(&recipe("app", &["latest"], LARGE));
    let cache = disk.dir.to_str().unwrap();
    let full = run(
        &project,
        &["build", "recipes/image.toml"],
        &[("IMGBUILD_CACHE_DIR", cache)],
    );
    assert_disk_full(&full, cache);
}
