//! The layer cache as a stranger hands it over (a CI cache restored from another branch, a
//! cache copied from another machine, a disk that flips a bit): an entry enters an image only
//! once it shows it holds what its key says. Every case builds a project cold, tampers with
//! its cache, then builds the same lock in a second project on that cache and checks: a
//! warning naming the layer, exit 0 with the cold build's digest, an image that verifies, no
//! canary in the outputs and the first project's image untouched.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    common::{LayoutView, Project, Run, run_with_deadline},
    support::{channel::tiny_recipe, shared_channel},
    trust::{Canary, Tree},
};

/// The layer whose entry each case tampers with: the `hello` package's.
const LAYER: &str = "hello-1.0";

/// A project built cold, and what its build left in the cache.
struct Cold {
    project: Project,
    name: String,
    recipe: String,
    /// The cold build's manifest digest: every later build must give it again.
    digest: String,
    /// The first project's image as the cold build left it.
    image: Tree,
}

impl Cold {
    fn build(name: &str, layers: &str) -> Self {
        let recipe = tiny_recipe(shared_channel(), name, &["hello 1.0", "pyhello"]);
        let recipe = format!("{recipe}{layers}");
        let project = Project::new();
        project.write_recipe(&recipe);
        let run = project.build(&[]).success();
        let digest = run.digest();
        let image = Tree::of(&project.path().join("images"));
        Cold {
            project,
            name: name.to_string(),
            recipe,
            digest,
            image,
        }
    }

    /// The per-machine key of the first project (its "machine").
    fn machine_key(&self) -> PathBuf {
        self.project.path().join("state/cache-key")
    }

    /// A second project on the same cache and lock, with the key file `key`.
    fn second(&self) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let second = Project {
            dir,
            cache: self.project.cache.clone(),
        };
        second.write_recipe(&self.recipe);
        fs_err::copy(self.project.lock_path(), second.lock_path()).unwrap();
        second
    }

    /// The second project's build with the per-machine key file `key`.
    fn rebuild(&self, second: &Project, key: &Path) -> Run {
        let key = key.to_str().unwrap();
        second.run_with(
            &["build", "recipes/image.toml", "--locked"],
            &[("IMGBUILD_CACHE_KEY_FILE", key)],
            None,
        )
    }

    /// The entry of the `hello` layer in the cache.
    fn entry(&self) -> Entry {
        let layout = LayoutView::new(self.project.path().join("images").join(&self.name));
        let manifest = layout.manifest();
        let layer = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| {
                l["annotations"]["dev.imgbuild.layer.packages"]
                    .as_str()
                    .is_some_and(|p| p.starts_with(LAYER))
            })
            .unwrap_or_else(|| panic!("no {LAYER} layer in {manifest}"));
        let digest = layer["digest"].as_str().unwrap();
        let keys = self.project.cache.join("layers/keys");
        for file in fs_err::read_dir(&keys).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let json: Value = serde_json::from_slice(&fs_err::read(&path).unwrap()).unwrap();
                if json["digest"] == digest {
                    let blob = self.blob_path(digest);
                    return Entry {
                        key_file: path,
                        json,
                        blob,
                    };
                }
            }
        }
        panic!("no key file names {digest}");
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.project
            .cache
            .join("layers/blobs")
            .join(digest.trim_start_matches("sha256:"))
    }

    /// The second build succeeded with the cold build's image, warned about the layer, and
    /// left the first image as it was; the image verifies against its recipe and provenance.
    #[track_caller]
    fn assert_caught(&self, second: &Project, run: &Run) {
        self.assert_correct(second, run);
        assert!(
            run.stderr.contains(LAYER) && run.stderr.contains("fails its check"),
            "a warning naming the layer:\n{}",
            run.stderr
        );
    }

    #[track_caller]
    fn assert_correct(&self, second: &Project, run: &Run) {
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
        assert_eq!(run.digest(), self.digest, "the cold build's image");
        let image = format!("images/{}", self.name);
        second
            .run(&[
                "verify",
                &image,
                "--recipe",
                "recipes/image.toml",
                "--provenance",
            ])
            .success();
        assert_eq!(
            Tree::of(&self.project.path().join("images")),
            self.image,
            "the first project's image changed"
        );
        assert_no_links(&second.path().join("images"));
    }
}

/// No symbolic link in a layout: every blob is a file of its own.
fn assert_no_links(dir: &Path) {
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry.unwrap();
        assert!(
            !entry.path_is_symlink(),
            "a link in the output: {}",
            entry.path().display()
        );
    }
}

/// A cache entry: its key file (parsed) and its blob's path.
struct Entry {
    key_file: PathBuf,
    json: Value,
    blob: PathBuf,
}

impl Entry {
    /// Rewrites the key file with `json` (a new file, as a restored cache has).
    fn write_key(&self, json: &Value) {
        replace(&self.key_file, &serde_json::to_vec(json).unwrap());
    }

    /// Puts `blob` (compressed bytes of `tar`) in the cache and rewrites the key file to
    /// name it, digest, diff_id and sizes all consistent, as an attacker would.
    fn rewrite_consistently(&self, cold: &Cold, blob: &[u8], tar: &[u8]) {
        let digest = sha256(blob);
        replace(&cold.blob_path(&digest), blob);
        let mut json = self.json.clone();
        json["digest"] = digest.into();
        json["diff_id"] = sha256(tar).into();
        json["size"] = blob.len().into();
        json["tar_size"] = tar.len().into();
        json.as_object_mut().unwrap().remove("seal");
        self.write_key(&json);
    }

    /// The blob's tar.
    fn tar(&self, zstd: bool) -> Vec<u8> {
        let blob = fs_err::read(&self.blob).unwrap();
        let mut tar = Vec::new();
        if zstd {
            zstd::stream::read::Decoder::new(&blob[..])
                .unwrap()
                .read_to_end(&mut tar)
                .unwrap();
        } else {
            flate2::read::MultiGzDecoder::new(&blob[..])
                .read_to_end(&mut tar)
                .unwrap();
        }
        tar
    }
}

/// `bytes` at `path` through a new file renamed into place (never writing the old inode,
/// which the first project's layout shares).
fn replace(path: &Path, bytes: &[u8]) {
    let temp = path.with_extension("tmp-test");
    fs_err::write(&temp, bytes).unwrap();
    fs_err::rename(&temp, path).unwrap();
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The tar with `bin/hello`'s greeting changed (same length: the tar stays valid).
fn poisoned(tar: &[u8]) -> Vec<u8> {
    let needle = b"hello from";
    let at = tar
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the hello script in the layer");
    let mut out = tar.to_vec();
    out[at..at + needle.len()].copy_from_slice(b"pwned from");
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn one_byte_flipped_in_a_cached_blob_is_caught() {
    let cold = Cold::build("flipped", "");
    let entry = cold.entry();
    let mut blob = fs_err::read(&entry.blob).unwrap();
    let middle = blob.len() / 2;
    blob[middle] ^= 0x01;
    replace(&entry.blob, &blob);
    // The same machine: the entry is sealed, and the seal's blob check sees the flip.
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
    // Evicted and stored again: the next build takes it from the cache, silently.
    let third = cold.second();
    let run = cold.rebuild(&third, &cold.machine_key());
    cold.assert_correct(&third, &run);
    assert!(!run.stderr.contains("fails its check"), "{}", run.stderr);
}

#[test]
fn a_truncated_blob_is_caught() {
    let cold = Cold::build("truncated", "");
    let entry = cold.entry();
    let blob = fs_err::read(&entry.blob).unwrap();
    replace(&entry.blob, &blob[..blob.len() / 2]);
    let mut json = entry.json.clone();
    json["size"] = (blob.len() / 2).into();
    entry.write_key(&json);
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
}

#[test]
fn another_valid_blob_of_the_same_packages_is_caught() {
    let cold = Cold::build("swapped", "");
    let entry = cold.entry();
    // pyhello's layer, from the same build and the same package set, under hello's key.
    let other = fs_err::read_dir(cold.project.cache.join("layers/keys"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json") && *p != entry.key_file)
        .map(|p| serde_json::from_slice::<Value>(&fs_err::read(p).unwrap()).unwrap())
        .find(|json| json["digest"] != entry.json["digest"])
        .expect("another cached layer");
    let mut json = entry.json.clone();
    for field in ["digest", "diff_id", "size", "tar_size", "seal"] {
        json[field] = other[field].clone();
    }
    entry.write_key(&json);
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
}

#[test]
fn a_blob_and_key_rewritten_consistently_with_a_poisoned_file_are_caught() {
    let cold = Cold::build("poisoned", "");
    let entry = cold.entry();
    let tar = poisoned(&entry.tar(false));
    entry.rewrite_consistently(&cold, &gzip(&tar), &tar);
    // A cache restored from elsewhere: another machine's key.
    let second = cold.second();
    let run = cold.rebuild(&second, &second.path().join("state/cache-key"));
    cold.assert_caught(&second, &run);
    let hello = LayoutView::new(second.path().join("images/poisoned"));
    for (_, digest) in hello.layers() {
        assert!(!String::from_utf8_lossy(&hello.blob(&digest)).contains("pwned"));
    }
}

#[test]
fn a_seal_forged_with_another_key_is_not_trusted() {
    use hmac::{KeyInit, Mac};
    let cold = Cold::build("forged", "");
    let entry = cold.entry();
    let tar = poisoned(&entry.tar(false));
    entry.rewrite_consistently(&cold, &gzip(&tar), &tar);
    // Sealed on the attacker's machine, with its own key, in the seal's own format.
    let mut json: Value = serde_json::from_slice(&fs_err::read(&entry.key_file).unwrap()).unwrap();
    let key = entry.key_file.file_stem().unwrap().to_str().unwrap();
    let fields = serde_json::json!([
        key,
        "gzip;level=6;backend=libdeflate-1.x;block=1MiB;members",
        json["digest"],
        json["diff_id"],
        json["size"],
        json["tar_size"],
        {}
    ]);
    let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&[9u8; 32]).unwrap();
    mac.update(format!("imgbuild-layer-seal/1\n{fields}").as_bytes());
    json["seal"] = hex::encode(mac.finalize().into_bytes()).into();
    entry.write_key(&json);
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
}

#[test]
fn a_cache_from_another_machine_is_verified_once_then_sealed() {
    let cold = Cold::build("restored", "");
    let sealed_before = cold.entry().json["seal"].clone();
    let second = cold.second();
    let key = second.path().join("state/cache-key");
    let run = cold.rebuild(&second, &key);
    cold.assert_correct(&second, &run);
    assert!(!run.stderr.contains("fails its check"), "{}", run.stderr);
    // Verified, then sealed with this machine's key: the seal changed.
    let entry = cold.entry();
    assert!(entry.json["seal"].is_string(), "{}", entry.json);
    assert_ne!(
        entry.json["seal"], sealed_before,
        "sealed again with this machine's key"
    );
    let third = cold.second();
    cold.assert_correct(&third, &cold.rebuild(&third, &key));
}

#[test]
fn a_key_file_that_links_out_of_the_cache_is_refused() {
    let canary = Canary::new();
    let cold = Cold::build("keylink", "");
    let entry = cold.entry();
    fs_err::remove_file(&entry.key_file).unwrap();
    std::os::unix::fs::symlink(canary.file(), &entry.key_file).unwrap();
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
    assert!(run.stderr.contains("symbolic link"), "{}", run.stderr);
    canary.assert_not_in(&second.path().join("images"));
    canary.assert_not_in(&cold.project.cache);
    canary.assert_untouched();
}

#[test]
fn a_key_file_that_is_a_fifo_or_huge_is_refused_without_waiting() {
    let cold = Cold::build("keyfifo", "");
    let entry = cold.entry();
    fs_err::remove_file(&entry.key_file).unwrap();
    let c = std::ffi::CString::new(entry.key_file.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let second = cold.second();
    let mut command = second.command(&["build", "recipes/image.toml", "--locked"]);
    command.env("IMGBUILD_CACHE_KEY_FILE", cold.machine_key());
    let run = run_with_deadline(command, &second, &["build"]);
    cold.assert_caught(&second, &run);

    // A key file of 1 MiB of spaces before the JSON.
    let cold = Cold::build("keyhuge", "");
    let entry = cold.entry();
    let mut huge = vec![b' '; 1 << 20];
    huge.extend_from_slice(&serde_json::to_vec(&entry.json).unwrap());
    replace(&entry.key_file, &huge);
    let third = cold.second();
    let run = cold.rebuild(&third, &cold.machine_key());
    cold.assert_caught(&third, &run);
}

#[test]
fn a_blob_that_links_to_a_host_file_is_refused() {
    let canary = Canary::new();
    let cold = Cold::build("bloblink", "");
    let entry = cold.entry();
    let secret = fs_err::read(canary.file()).unwrap();
    let digest = sha256(&secret);
    std::os::unix::fs::symlink(canary.file(), cold.blob_path(&digest)).unwrap();
    let mut json = entry.json.clone();
    json["digest"] = digest.into();
    json["size"] = secret.len().into();
    entry.write_key(&json);
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
    canary.assert_not_in(&second.path().join("images"));
    canary.assert_untouched();
}

#[test]
fn cache_entries_that_are_directories_are_not_used() {
    let cold = Cold::build("blobdir", "");
    let entry = cold.entry();
    fs_err::remove_file(&entry.blob).unwrap();
    fs_err::create_dir(&entry.blob).unwrap();
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_caught(&second, &run);
    assert!(run.stderr.contains("is a directory"), "{}", run.stderr);

    let cold = Cold::build("keydir", "");
    let entry = cold.entry();
    fs_err::remove_file(&entry.key_file).unwrap();
    fs_err::create_dir(&entry.key_file).unwrap();
    let third = cold.second();
    let run = cold.rebuild(&third, &cold.machine_key());
    cold.assert_caught(&third, &run);
    assert!(run.stderr.contains("is a directory"), "{}", run.stderr);
}

#[test]
fn a_cache_directory_that_links_elsewhere_is_not_written() {
    let canary = Canary::new();
    let cold = Cold::build("dirlink", "");
    let keys = cold.project.cache.join("layers/keys");
    fs_err::remove_dir_all(&keys).unwrap();
    std::os::unix::fs::symlink(canary.dir(), &keys).unwrap();
    let second = cold.second();
    let run = cold.rebuild(&second, &cold.machine_key());
    cold.assert_correct(&second, &run);
    assert!(run.stderr.contains("not a directory"), "{}", run.stderr);
    canary.assert_untouched();
}

#[test]
fn without_a_usable_machine_key_every_use_is_verified() {
    let cold = Cold::build("nokey", "");
    let entry = cold.entry();
    let tar = poisoned(&entry.tar(false));
    entry.rewrite_consistently(&cold, &gzip(&tar), &tar);
    // The key's directory cannot be made (its parent is a file).
    let blocker = cold.project.path().join("not-a-dir");
    fs_err::write(&blocker, "").unwrap();
    let second = cold.second();
    let run = cold.rebuild(&second, &blocker.join("cache-key"));
    cold.assert_caught(&second, &run);
    assert!(run.stderr.contains("verified in full"), "{}", run.stderr);
    // A key others can read, and a key inside the cache: never used, nothing sealed.
    let loose = cold.project.path().join("loose-key");
    fs_err::write(&loose, [1u8; 32]).unwrap();
    let third = cold.second();
    let run = cold.rebuild(&third, &loose);
    cold.assert_correct(&third, &run);
    assert!(run.stderr.contains("mode 0600"), "{}", run.stderr);
    let inside = cold.project.cache.join("cache-key");
    let fourth = cold.second();
    let run = cold.rebuild(&fourth, &inside);
    cold.assert_correct(&fourth, &run);
    assert!(run.stderr.contains("inside the cache"), "{}", run.stderr);
    assert!(!inside.exists());
    assert!(cold.entry().json.get("seal").is_none(), "nothing sealed");
}

#[test]
fn zstd_and_seekable_layers_are_verified_too() {
    for (name, compression, zstd) in [
        ("pzstd", "zstd", true),
        ("pestargz", "estargz", false),
        ("pchunked", "zstd:chunked", true),
    ] {
        let cold = Cold::build(
            name,
            &format!("\n[layers]\ncompression = \"{compression}\"\n"),
        );
        let entry = cold.entry();
        let tar = poisoned(&entry.tar(zstd));
        let blob = if zstd {
            zstd::encode_all(&tar[..], 3).unwrap()
        } else {
            gzip(&tar)
        };
        entry.rewrite_consistently(&cold, &blob, &tar);
        let second = cold.second();
        let run = cold.rebuild(&second, &second.path().join("state/cache-key"));
        cold.assert_caught(&second, &run);
        // Untampered and restored on another machine: verified, used, no warning.
        let third = cold.second();
        let run = cold.rebuild(&third, &third.path().join("state/cache-key"));
        cold.assert_correct(&third, &run);
        assert!(!run.stderr.contains("fails its check"), "{}", run.stderr);
    }
}

/// The second project's build on `key`, logging how each cached layer was checked.
fn rebuild_logged(second: &Project, key: &Path) -> Run {
    let key = key.to_str().unwrap();
    second.run_with(
        &["build", "recipes/image.toml", "--locked"],
        &[
            ("IMGBUILD_CACHE_KEY_FILE", key),
            ("IMGBUILD_LOG", "warn,imgbuild_oci::layers=debug"),
        ],
        None,
    )
}

/// How the run took the `hello` layer from the cache (`Unchanged`, `Digest`, `Full`).
fn hello_check(run: &Run) -> String {
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(LAYER) && l.contains("from the layer cache"))
        .unwrap_or_else(|| panic!("no cache hit of {LAYER}:\n{}", run.stderr));
    let check = line.rsplit_once('(').unwrap().1;
    check.trim_end_matches(')').to_string()
}

#[test]
fn a_sealed_blob_left_as_it_was_is_not_read_again() {
    let cold = Cold::build("unchanged", "");
    let key = cold.machine_key();
    // Stored by the cold build with its identity sealed; linking it into a layout moves
    // its ctime, and the hit seals it again: hit after hit reads nothing. (The projects
    // are kept: dropping one removes its layout's links.)
    let mut kept = Vec::new();
    for _ in 0..2 {
        let next = cold.second();
        let run = rebuild_logged(&next, &key);
        cold.assert_correct(&next, &run);
        assert_eq!(hello_check(&run), "Unchanged", "{}", run.stderr);
        kept.push(next);
    }
    // A layout removed takes a link away: the next hit reads the blob's digest once.
    drop(kept);
    let next = cold.second();
    let run = rebuild_logged(&next, &key);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.digest(), cold.digest);
    assert_eq!(hello_check(&run), "Digest", "{}", run.stderr);
    let next = cold.second();
    let run = rebuild_logged(&next, &key);
    assert_eq!(hello_check(&run), "Unchanged", "{}", run.stderr);
}

#[allow(clippy::disallowed_methods, reason = "set_times needs a std::fs::File")]
#[test]
fn a_blob_written_in_place_with_its_mtime_put_back_is_caught() {
    let cold = Cold::build("inplace", "");
    let entry = cold.entry();
    let blob = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&entry.blob)
        .unwrap();
    let before = blob.metadata().unwrap();
    let mut bytes = Vec::new();
    (&blob).read_to_end(&mut bytes).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::os::unix::fs::FileExt::write_all_at(&blob, &bytes[middle..=middle], middle as u64)
        .unwrap();
    // Same inode, same size, the old mtime: only ctime tells.
    let times = std::fs::FileTimes::new()
        .set_modified(before.modified().unwrap())
        .set_accessed(before.accessed().unwrap());
    blob.set_times(times).unwrap();
    drop(blob);
    let second = cold.second();
    let run = rebuild_logged(&second, &cold.machine_key());
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.digest(), cold.digest, "the cold build's image");
    assert!(
        run.stderr.contains(LAYER) && run.stderr.contains("fails its check"),
        "a warning naming the layer:\n{}",
        run.stderr
    );
    let image = "images/inplace";
    second
        .run(&["verify", image, "--recipe", "recipes/image.toml"])
        .success();
}
