//! Issue 26, the `oci:` base layout: a stranger's directory. Every file of it is opened as a
//! regular file beneath the layout (no fifo, no device, no symbolic link on the way),
//! bounded (`index.json`, manifests and configs at 4 MiB, blobs exactly their descriptor's
//! size) and held to its digest before anything read from it is used; errors that list what
//! the layout holds stay short.
//!
//! Each case builds an image on a good base first, then spoils the base and builds again:
//! the build must exit 1 naming the culprit, not hang, not panic, leave the previous image
//! as it was, and put none of the canary's secret in any output.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{
    common::{Project, Run, run_with_deadline},
    support::{channel::tiny_recipe, shared_channel},
    trust::{Canary, Tree},
};

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n";

const ACCOUNTS: &str = "\n[[accounts.groups]]\nname = \"jovyan\"\ngid = 1000\n\n\
    [[accounts.users]]\nname = \"jovyan\"\nuid = 1000\ngid = 1000\nhome = \"/home/jovyan\"\n";

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A plain-tar layer holding `etc/passwd` and `etc/group`.
pub(crate) fn layer_tar(passwd: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, text) in [("etc/passwd", passwd), ("etc/group", "root:x:0:\n")] {
        let mut header = tar::Header::new_ustar();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, text.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap()
}

/// A one-layer linux/amd64 base layout written by hand, tag `latest`.
pub(crate) struct Base {
    dir: PathBuf,
    /// Hex digests.
    layer: String,
    manifest: String,
}

impl Base {
    fn write(dir: &Path) -> Base {
        Self::write_layer(dir, &layer_tar(PASSWD))
    }

    /// The base whose one layer is the plain tar `tar`.
    pub(crate) fn write_layer(dir: &Path, tar: &[u8]) -> Base {
        fs_err::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs_err::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let blob = |bytes: &[u8]| {
            let hex = sha256_hex(bytes);
            fs_err::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
            hex
        };
        let layer = blob(tar);
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer}")]},
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", tar)],
        }))
        .unwrap();
        blob(&config);
        let hex = blob(&manifest);
        let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
        entry["annotations"] = json!({"org.opencontainers.image.ref.name": "latest"});
        let base = Base {
            dir: dir.to_path_buf(),
            layer,
            manifest: hex,
        };
        base.write_index(&[entry]);
        base
    }

    fn write_index(&self, manifests: &[Value]) {
        let index = json!({"schemaVersion": 2, "manifests": manifests});
        fs_err::write(self.index(), serde_json::to_vec(&index).unwrap()).unwrap();
    }

    fn index(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn blob(&self, hex: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(hex)
    }
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", sha256_hex(bytes)),
        "size": bytes.len(),
    })
}

/// Replaces `path` with a fifo nobody writes to.
fn fifo(path: &Path) {
    let _ = fs_err::remove_file(path);
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

fn symlink(target: &Path, path: &Path) {
    let _ = fs_err::remove_file(path);
    std::os::unix::fs::symlink(target, path).unwrap();
}

/// A project whose image was built on a good base, with the tree of that image.
struct Case {
    project: Project,
    base: Base,
    canary: Canary,
    images: Tree,
}

/// `extra` is added to the recipe; `glibc` pins the glibc, so the layers are read only where
/// the case means them to be (the accounts, the import into the image).
fn built(extra: &str, glibc: bool) -> Case {
    let project = Project::new();
    let base = Base::write(&project.path().join("base"));
    let mut recipe = tiny_recipe(shared_channel(), "img", &["hello 1.0"])
        .replace("base = \"scratch\"", "base = \"oci:../base:latest\"");
    if glibc {
        recipe = recipe.replace("platforms", "glibc = \"2.28\"\nplatforms");
    }
    project.write_recipe(&(recipe + extra));
    project.build(&[]).success();
    let images = Tree::of(&project.path().join("images"));
    Case {
        project,
        base,
        canary: Canary::new(),
        images,
    }
}

impl Case {
    /// Builds again (with a deadline: a hang fails the test) and checks the refusal: exit
    /// 1 naming every needle, the previous image as it was, the canary in no output. The
    /// recipe gets a comment first: a build of the very inputs of the image in place reuses
    /// it and reads no base layer.
    #[track_caller]
    fn refused(&self, needles: &[&str]) -> Run {
        self.refused_with(&[], needles)
    }

    /// [`Self::refused`] with `extra` build arguments.
    #[track_caller]
    fn refused_with(&self, extra: &[&str], needles: &[&str]) -> Run {
        let recipe = fs_err::read_to_string(self.project.recipe_path()).unwrap();
        self.project.write_recipe(&format!("# again\n{recipe}"));
        let mut args = vec!["build", "recipes/image.toml"];
        args.extend_from_slice(extra);
        let run = run_with_deadline(self.project.command(&args), &self.project, &args);
        run.assert_failure_naming(1, needles);
        assert_eq!(
            Tree::of(&self.project.path().join("images")),
            self.images,
            "the previous image changed"
        );
        self.canary
            .assert_not_in(&self.project.path().join("images"));
        self.canary.assert_not_in(&self.project.cache);
        assert!(!run.stderr.contains(&self.canary.secret), "{}", run.stderr);
        self.canary.assert_untouched();
        run
    }
}

#[test]
fn an_index_json_that_is_a_fifo() {
    let case = built("", false);
    fifo(&case.base.index());
    case.refused(&["index.json", "is a fifo, not a regular file"]);
}

#[test]
fn a_layer_blob_that_is_a_fifo() {
    let case = built("", false);
    fifo(&case.base.blob(&case.base.layer));
    case.refused(&[&case.base.layer, "is a fifo, not a regular file"]);
}

#[test]
fn an_index_json_that_links_to_the_canary() {
    let case = built("", false);
    symlink(&case.canary.file(), &case.base.index());
    case.refused(&[
        "index.json",
        "symbolic link `index.json`, which is not followed",
    ]);
}

#[test]
fn a_layer_blob_that_links_out_of_the_layout() {
    let case = built("", true);
    // The same bytes, outside the layout: refused for where they are, not what they are.
    let bytes = fs_err::read(case.base.blob(&case.base.layer)).unwrap();
    let outside = case.project.path().join("outside-layer");
    fs_err::write(&outside, &bytes).unwrap();
    symlink(&outside, &case.base.blob(&case.base.layer));
    let link = format!("blobs/sha256/{}`, which is not followed", case.base.layer);
    case.refused(&[&link]);
}

#[test]
fn a_blobs_directory_that_links_out_of_the_layout() {
    let case = built("", false);
    // The whole blob store moved out and linked back: every digest still matches.
    let outside = case.project.path().join("outside-blobs");
    fs_err::rename(case.base.dir.join("blobs"), &outside).unwrap();
    symlink(&outside, &case.base.dir.join("blobs"));
    case.refused(&["symbolic link `blobs`, which is not followed"]);
}

#[test]
fn a_layer_blob_that_links_to_dev_zero() {
    let case = built("", false);
    symlink(Path::new("/dev/zero"), &case.base.blob(&case.base.layer));
    case.refused(&[&case.base.layer, "which is not followed"]);
}

#[test]
fn a_blob_that_is_not_its_digest_is_bad_input() {
    let case = built("", true);
    // Same size, other bytes: only the digest tells. With the glibc pinned the layer is
    // first read when it is copied into the image: into a new layout, as the one in place
    // already holds the good copy (and keeps it).
    let tampered = layer_tar(&PASSWD.replace("root", "evil"));
    fs_err::write(case.base.blob(&case.base.layer), tampered).unwrap();
    let run = case.refused_with(
        &["-o", "second/img"],
        &[&format!(
            "Blob sha256:{} does not match its digest",
            case.base.layer
        )],
    );
    assert!(run.stderr.contains("base"), "{}", run.stderr);
}

#[test]
fn a_blob_that_is_not_its_digest_is_refused_before_its_glibc_is_read() {
    let case = built("", false);
    let tampered = layer_tar(&PASSWD.replace("root", "evil"));
    fs_err::write(case.base.blob(&case.base.layer), tampered).unwrap();
    case.refused(&[
        &format!("Failed to read layer `sha256:{}`", case.base.layer),
        "does not match its digest",
    ]);
}

#[test]
fn accounts_never_use_the_passwd_of_a_blob_that_is_not_its_digest() {
    let case = built(ACCOUNTS, true);
    // The canary's secret as the base's /etc/passwd, in a blob of the descriptor's size.
    let secret = format!("root:x:0:0:{}:/root:/bin/sh\n", case.canary.secret);
    let tampered = layer_tar(&secret);
    assert_eq!(tampered.len(), layer_tar(PASSWD).len());
    fs_err::write(case.base.blob(&case.base.layer), &tampered).unwrap();
    case.refused(&[&format!(
        "Blob sha256:{} does not match its digest",
        case.base.layer
    )]);
}

#[test]
fn a_blob_larger_than_its_descriptor() {
    let case = built("", true);
    let path = case.base.blob(&case.base.layer);
    let mut bytes = fs_err::read(&path).unwrap();
    let size = bytes.len();
    bytes.extend_from_slice(&[0u8; 4096]);
    fs_err::write(&path, &bytes).unwrap();
    case.refused(&[
        &format!("Blob sha256:{} has {} bytes", case.base.layer, size + 4096),
        &format!("its descriptor says {size}"),
    ]);
}

#[test]
fn a_truncated_blob() {
    let case = built("", false);
    let path = case.base.blob(&case.base.layer);
    let bytes = fs_err::read(&path).unwrap();
    fs_err::write(&path, &bytes[..700]).unwrap();
    case.refused(&[
        &format!("Blob sha256:{} has 700 bytes", case.base.layer),
        &format!("its descriptor says {}", bytes.len()),
    ]);
}

#[test]
fn a_manifest_that_is_a_directory() {
    let case = built("", false);
    let path = case.base.blob(&case.base.manifest);
    fs_err::remove_file(&path).unwrap();
    fs_err::create_dir(&path).unwrap();
    case.refused(&[&case.base.manifest, "is a directory, not a regular file"]);
}

#[test]
fn an_index_json_over_4_mib() {
    let case = built("", false);
    // Valid JSON, padded past the bound.
    let mut text = fs_err::read_to_string(case.base.index()).unwrap();
    text.push_str(&" ".repeat(5 << 20));
    fs_err::write(case.base.index(), text).unwrap();
    case.refused(&["index.json", "at most 4194304 are read"]);
}

/// `count` entries of `index.json`, each tagged and naming the base's manifest.
fn tagged_entries(case: &Case, count: usize) -> Vec<Value> {
    let manifest = fs_err::read(case.base.blob(&case.base.manifest)).unwrap();
    (0..count)
        .map(|i| {
            let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
            entry["annotations"] = json!({"org.opencontainers.image.ref.name": format!("t{i}")});
            entry
        })
        .collect()
}

#[test]
fn an_index_of_200000_manifests_gets_a_short_error() {
    let case = built("", false);
    case.base.write_index(&tagged_entries(&case, 200_000));
    let run = case.refused(&["index.json", "at most 4194304 are read"]);
    assert!(
        run.stderr.len() < 2048,
        "{} bytes of error",
        run.stderr.len()
    );
}

#[test]
fn a_missing_tag_among_15000_lists_ten() {
    let case = built("", false);
    // As many as fit in 4 MiB.
    case.base.write_index(&tagged_entries(&case, 15_000));
    let run = case.refused(&[
        "has no tag `latest`; it has: t0, t1, ",
        ", … and 14,990 more",
    ]);
    assert!(
        run.stderr.len() < 2048,
        "{} bytes of error",
        run.stderr.len()
    );
}

#[test]
fn a_missing_platform_among_20000_lists_ten() {
    let case = built("", false);
    let manifest = fs_err::read(case.base.blob(&case.base.manifest)).unwrap();
    let entries: Vec<Value> = (0..20_000)
        .map(|i| {
            let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
            entry["platform"] = json!({"os": "linux", "architecture": format!("arch{i}")});
            entry
        })
        .collect();
    let nested = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    }))
    .unwrap();
    let hex = sha256_hex(&nested);
    fs_err::write(case.base.blob(&hex), &nested).unwrap();
    let mut entry = descriptor("application/vnd.oci.image.index.v1+json", &nested);
    entry["annotations"] = json!({"org.opencontainers.image.ref.name": "latest"});
    case.base.write_index(&[entry]);
    let run = case.refused(&[
        "has no manifest for linux/amd64; it has linux/arch0, linux/arch1",
        ", … and 19,990 more",
    ]);
    assert!(
        run.stderr.len() < 2048,
        "{} bytes of error",
        run.stderr.len()
    );
}
