//! `imgbuild cache du` and `imgbuild cache prune` through the real CLI: sizes by kind match
//! the files written; prune evicts the least recently used layer-cache entries first (by
//! the key files' mtime, which every hit moves), the entries unused for longer than
//! `--older-than`, never a blob a `--keep-layout` image uses, orphan blobs and stale lock
//! files; links are unlinked, never followed; `--dry-run` removes nothing.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde_json::Value;

use crate::{
    common::{Project, Run},
    support::{channel::tiny_recipe, shared_channel},
};

const DAY: Duration = Duration::from_secs(86_400);

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{}", run.stdout))
}

/// A project with a three-package image built into `images/NAME`.
fn built(name: &str) -> Project {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        name,
        &["hello 1.0", "pyhello", "other"],
    ));
    project.build(&[]).success();
    project
}

fn build_json(project: &Project, extra: &[&str]) -> Value {
    let mut args = vec!["build", "recipes/image.toml", "--json"];
    args.extend_from_slice(extra);
    let run = project.run(&args).success();
    run.stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "result")
        .unwrap_or_else(|| panic!("no result event in:\n{}", run.stdout))
}

/// A layer-cache entry as the test sees it.
#[derive(Debug, Clone)]
struct Entry {
    key_file: PathBuf,
    blob: PathBuf,
    /// Key file and blob.
    bytes: u64,
}

fn layers(project: &Project) -> PathBuf {
    project.cache.join("layers")
}

/// The entries of the project's layer cache, by key.
/// Every entry's key file and blob are still there.
#[track_caller]
fn assert_all_present(entries: &[Entry]) {
    for entry in entries {
        assert!(entry.key_file.exists(), "{}", entry.key_file.display());
        assert!(entry.blob.exists(), "{}", entry.blob.display());
    }
}

fn entries(project: &Project) -> Vec<Entry> {
    let keys = layers(project).join("keys");
    let mut found: Vec<Entry> = fs_err::read_dir(&keys)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|key_file| {
            let record: Value = serde_json::from_slice(&fs_err::read(&key_file).unwrap()).unwrap();
            let hex = record["digest"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:");
            let blob = layers(project).join("blobs").join(hex);
            let bytes =
                fs_err::metadata(&key_file).unwrap().len() + fs_err::metadata(&blob).unwrap().len();
            Entry {
                key_file,
                blob,
                bytes,
            }
        })
        .collect();
    found.sort_by(|a, b| a.key_file.cmp(&b.key_file));
    found
}

/// The bytes of the regular files under `dir`, each counted once, and how many there are.
fn tree_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let (mut bytes, mut files) = (0, 0);
    for entry in walkdir::WalkDir::new(dir) {
        let meta = entry.unwrap().metadata().unwrap();
        if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
            bytes += meta.len();
            files += 1;
        }
    }
    (bytes, files)
}

fn set_mtime(path: &Path, time: SystemTime) {
    fs_err::File::open(path)
        .unwrap()
        .set_modified(time)
        .unwrap();
}

fn mtime(path: &Path) -> SystemTime {
    fs_err::symlink_metadata(path).unwrap().modified().unwrap()
}

fn kind<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == name)
        .unwrap_or_else(|| panic!("no kind `{name}` in {report:#}"))
}

#[test]
fn du_counts_the_files_written_by_kind_and_a_hard_link_once() {
    let project = Project::new();
    let cache = &project.cache;
    let write = |path: &str, len: usize| {
        let path = cache.join(path);
        fs_err::create_dir_all(path.parent().unwrap()).unwrap();
        fs_err::write(&path, vec![b'x'; len]).unwrap();
    };
    write("layers/keys/k.json", 10);
    write(&format!("layers/blobs/{}", "a".repeat(64)), 1000);
    write("pkgs/foo-1.0/lib/libfoo.so", 300);
    write("pkgs-linux-aarch64/bar-1.0/info/index.json", 7);
    write("repodata/x.json", 20);
    write("weird/thing", 5);
    // A second name of the blob, and a link to a large file outside: neither counts.
    fs_err::create_dir_all(cache.join("builds")).unwrap();
    fs_err::hard_link(
        cache.join(format!("layers/blobs/{}", "a".repeat(64))),
        cache.join("builds/copy"),
    )
    .unwrap();
    fs_err::write(project.path().join("outside"), vec![0u8; 5000]).unwrap();
    fs_err::create_dir_all(cache.join("wheels")).unwrap();
    std::os::unix::fs::symlink(project.path().join("outside"), cache.join("wheels/w.whl")).unwrap();

    let report = json(&project.run(&["cache", "du", "--json"]).success());
    assert_eq!(report["bytes"], 10 + 1000 + 300 + 7 + 20 + 5, "{report:#}");
    assert_eq!(report["files"], 6, "{report:#}");
    assert_eq!(report["bytes"], tree_bytes(cache).0);
    let pkgs = kind(&report, "pkgs");
    assert_eq!(pkgs["bytes"], 307);
    assert_eq!(pkgs["files"], 2);
    assert_eq!(
        pkgs["dirs"],
        serde_json::json!(["pkgs", "pkgs-linux-aarch64"])
    );
    assert_eq!(kind(&report, "other")["bytes"], 5);
    assert_eq!(kind(&report, "other")["dirs"], serde_json::json!(["weird"]));
    assert_eq!(kind(&report, "repodata")["bytes"], 20);
    assert_eq!(kind(&report, "wheels")["bytes"], 0, "a link counts nothing");
    // The blob's two names: counted once, under the first kind that meets it.
    assert_eq!(
        kind(&report, "builds")["bytes"].as_u64().unwrap()
            + kind(&report, "layers")["bytes"].as_u64().unwrap(),
        1010
    );
    assert!(
        kind(&report, "layers")["description"]
            .as_str()
            .unwrap()
            .contains("layer")
    );

    let text = project.run(&["cache", "du"]).success().stdout;
    assert!(text.contains("pkgs") && text.contains("other"), "{text}");
    let total = text.lines().find(|l| l.starts_with("total")).unwrap();
    assert!(
        total.contains("1.3 KiB") && total.ends_with(" 6"),
        "{total}"
    );

    // No cache at all is an empty report, not an error.
    let empty = Project::new();
    let report = json(&empty.run(&["cache", "du", "--json"]).success());
    assert_eq!(report["bytes"], 0);
    assert_eq!(report["kinds"], serde_json::json!([]));
}

#[test]
fn prune_max_size_evicts_the_least_recently_used_and_the_rest_still_hits() {
    let project = built("lru");
    let before = entries(&project);
    assert!(before.len() >= 2, "{before:?}");
    // Oldest first in key order: the first entry was used 10 days ago, the next 9, …
    let now = SystemTime::now();
    for (i, entry) in before.iter().enumerate() {
        set_mtime(&entry.key_file, now - DAY * (10 - i as u32));
    }
    let layer_du = json(&project.run(&["cache", "du", "--json"]).success());
    let total = kind(&layer_du, "layers")["bytes"].as_u64().unwrap();
    assert_eq!(total, tree_bytes(&layers(&project)).0);
    let max = total - before[0].bytes;

    // A dry run names the oldest entry and removes nothing.
    let dry = project
        .run(&[
            "cache",
            "prune",
            "--max-size",
            &max.to_string(),
            "--dry-run",
            "--json",
        ])
        .success();
    let dry = json(&dry);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["entries_removed"], 1, "{dry:#}");
    assert_eq!(dry["bytes_removed"], before[0].bytes);
    let named: Vec<&str> = dry["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert!(
        named.contains(&before[0].key_file.to_str().unwrap()),
        "{named:?}"
    );
    assert!(
        named.contains(&before[0].blob.to_str().unwrap()),
        "{named:?}"
    );
    assert_eq!(
        tree_bytes(&layers(&project)).0,
        total,
        "a dry run removes nothing"
    );
    let text = project
        .run(&[
            "cache",
            "prune",
            "--max-size",
            &max.to_string(),
            "--dry-run",
        ])
        .success()
        .stdout;
    assert!(
        text.contains("would remove 1 layer-cache entries"),
        "{text}"
    );
    assert_all_present(&before);

    let pruned = json(
        &project
            .run(&["cache", "prune", "--max-size", &max.to_string(), "--json"])
            .success(),
    );
    assert_eq!(pruned["entries_removed"], 1, "{pruned:#}");
    assert_eq!(pruned["bytes_left"], max);
    assert!(!before[0].key_file.exists() && !before[0].blob.exists());
    assert_all_present(&before[1..]);
    assert_eq!(tree_bytes(&layers(&project)).0, max);

    // Into a new layout: every entry left is a hit, and the evicted layer is built again.
    let other = build_json(&project, &["-o", "images/other"]);
    assert_eq!(
        other["reused_layers"],
        before.len() - 1,
        "the entries left give cache hits: {other}"
    );
    assert_eq!(entries(&project).len(), before.len(), "stored again");

    // A hit that rewrites nothing (the blob already in the layout) still marks the entry
    // used: with the build records gone, the same build fetches every layer again.
    use std::os::unix::fs::MetadataExt;
    let old = now - DAY * 20;
    let inodes: Vec<u64> = entries(&project)
        .iter()
        .map(|entry| {
            set_mtime(&entry.key_file, old);
            fs_err::metadata(&entry.key_file).unwrap().ino()
        })
        .collect();
    fs_err::remove_dir_all(project.cache.join("builds")).unwrap();
    let again = build_json(&project, &["-o", "images/other"]);
    assert_eq!(again["unchanged"], false, "{again}");
    assert_eq!(again["reused_layers"], before.len(), "{again}");
    for (entry, inode) in entries(&project).iter().zip(inodes) {
        assert!(
            mtime(&entry.key_file) > now,
            "{} was hit and not marked used",
            entry.key_file.display()
        );
        assert_eq!(
            fs_err::metadata(&entry.key_file).unwrap().ino(),
            inode,
            "touched in place, not rewritten"
        );
    }
}

#[test]
fn keep_layout_protects_the_blobs_its_images_use() {
    let project = built("kept");
    let before = entries(&project);
    let old = SystemTime::now() - DAY * 10;
    for entry in &before {
        set_mtime(&entry.key_file, old);
    }
    let kept = json(
        &project
            .run(&[
                "cache",
                "prune",
                "--older-than",
                "1",
                "--keep-layout",
                "images/kept",
                "--json",
            ])
            .success(),
    );
    assert_eq!(kept["entries_removed"], 0, "{kept:#}");
    assert_eq!(kept["kept_for_layouts"], before.len());
    assert_all_present(&before);

    // A layout that cannot be read is an error naming it, and nothing goes.
    fs_err::create_dir_all(project.path().join("not-a-layout")).unwrap();
    project
        .run(&[
            "cache",
            "prune",
            "--older-than",
            "1",
            "--keep-layout",
            "not-a-layout",
        ])
        .assert_failure_naming(1, &["not-a-layout", "--keep-layout"]);
    assert_all_present(&before);

    // Unprotected, the old entries go; the image keeps its own copies of the blobs.
    let pruned = json(
        &project
            .run(&["cache", "prune", "--older-than", "1", "--json"])
            .success(),
    );
    assert_eq!(pruned["entries_removed"], before.len(), "{pruned:#}");
    assert!(
        before
            .iter()
            .all(|e| !e.key_file.exists() && !e.blob.exists())
    );
    project.run(&["verify", "images/kept"]).success();
}

#[test]
fn older_than_orphans_stale_locks_and_links_that_are_never_followed() {
    let project = built("aged");
    let before = entries(&project);
    assert!(before.len() >= 2, "{before:?}");
    let now = SystemTime::now();
    let keys = layers(&project).join("keys");
    let blobs = layers(&project).join("blobs");
    // The first entry is old, the others were used today.
    set_mtime(&before[0].key_file, now - DAY * 40);
    // A second, old key file naming the second entry's blob: it goes, the blob stays.
    let twin = keys.join(format!("{}.json", "d".repeat(64)));
    fs_err::copy(&before[1].key_file, &twin).unwrap();
    set_mtime(&twin, now - DAY * 40);
    // An old orphan blob goes; a young one may be a build's about to be named, and stays.
    let orphan = blobs.join("e".repeat(64));
    fs_err::write(&orphan, b"orphan").unwrap();
    set_mtime(&orphan, now - DAY * 2);
    let young = blobs.join("f".repeat(64));
    fs_err::write(&young, b"young").unwrap();
    // A lock file of no key.
    let stale = keys.join(format!("{}.lock", "c".repeat(64)));
    fs_err::write(&stale, b"").unwrap();
    // A key file and a blob that are links to files outside the cache.
    let outside_key = project.path().join("outside-key.json");
    fs_err::copy(&before[1].key_file, &outside_key).unwrap();
    let linked_key = keys.join(format!("{}.json", "b".repeat(64)));
    std::os::unix::fs::symlink(&outside_key, &linked_key).unwrap();
    let secret = project.path().join("secret");
    fs_err::write(&secret, b"not the cache's").unwrap();
    let linked_blob = blobs.join("9".repeat(64));
    std::os::unix::fs::symlink(&secret, &linked_blob).unwrap();

    let pruned = json(
        &project
            .run(&["cache", "prune", "--older-than", "30", "--json"])
            .success(),
    );
    let removed: Vec<(String, String)> = pruned["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_string(),
                r["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let reason = |path: &Path| {
        removed
            .iter()
            .find(|(p, _)| Path::new(p) == path)
            .map(|(_, r)| r.as_str())
    };
    assert_eq!(
        reason(&before[0].key_file),
        Some("older-than"),
        "{removed:?}"
    );
    assert_eq!(reason(&before[0].blob), Some("older-than"));
    assert_eq!(reason(&twin), Some("older-than"));
    assert_eq!(reason(&orphan), Some("orphan"));
    assert_eq!(reason(&stale), Some("stale-lock"));
    assert_eq!(reason(&linked_key), Some("refused"));
    assert_eq!(reason(&linked_blob), Some("orphan"));
    assert_eq!(
        reason(&before[1].blob),
        None,
        "still named by its own key file"
    );
    assert_eq!(
        pruned["entries_removed"], 3,
        "the old one, its twin, the link"
    );

    for gone in [&before[0].key_file, &before[0].blob, &twin, &orphan, &stale] {
        assert!(!gone.exists(), "{}", gone.display());
    }
    for link in [&linked_key, &linked_blob] {
        assert!(
            fs_err::symlink_metadata(link).is_err(),
            "{} unlinked",
            link.display()
        );
    }
    assert!(young.exists(), "a young orphan stays");
    assert_all_present(&before[1..]);
    // The links' targets are untouched.
    assert_eq!(fs_err::read(&secret).unwrap(), b"not the cache's");
    assert_eq!(
        fs_err::read(&outside_key).unwrap(),
        fs_err::read(&before[1].key_file).unwrap()
    );
}

#[test]
fn a_layer_cache_directory_that_is_a_link_is_refused() {
    let project = Project::new();
    let elsewhere = project.path().join("elsewhere");
    fs_err::create_dir_all(&elsewhere).unwrap();
    let victim = elsewhere.join(format!("{}.json", "a".repeat(64)));
    fs_err::write(&victim, b"{}").unwrap();
    set_mtime(&victim, SystemTime::now() - DAY * 100);
    fs_err::create_dir_all(project.cache.join("layers/blobs")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, project.cache.join("layers/keys")).unwrap();
    project
        .run(&["cache", "prune", "--older-than", "1"])
        .assert_failure_naming(1, &["layers/keys", "symbolic link"]);
    assert!(victim.exists(), "nothing behind the link is touched");
}

#[test]
fn prune_without_a_limit_or_with_a_bad_one_exits_2() {
    let project = Project::new();
    let run = project.run(&["cache", "prune"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("--max-size") && run.stderr.contains("--older-than"),
        "{}",
        run.stderr
    );
    let run = project.run(&["cache", "prune", "--dry-run", "--keep-layout", "images/x"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = project.run(&["cache", "prune", "--max-size", "lots"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("`lots` is not a size"),
        "{}",
        run.stderr
    );
    let run = project.run(&["cache", "prune", "--older-than", "-3"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stdout.is_empty());
}
