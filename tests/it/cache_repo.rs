//! `--cache-repo` (issue 28): a registry repository as the layer cache that fresh builders
//! share, against Debian's real `docker-registry` on 127.0.0.1. A layer taken from it is the
//! layer a cold build writes, for every layer kind and compression; a cache that lies, breaks
//! or refuses is a warning and a cold build, never a wrong image or a failed build.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{
    common::{LayoutView, Project, Run, run_tool},
    registry::{Auth, Registry, free_port},
    support::{
        channel::tiny_recipe,
        pypi::{DATEUTIL_2_9_0_POST0, SIX_1_16_0, pinned_dists, pypi_channel},
        shared_channel,
    },
};

const COMPRESSIONS: [&str; 4] = ["gzip", "zstd", "estargz", "zstd:chunked"];

/// A project with `recipe`, and an empty Docker config so the host's credentials never
/// reach the test registry.
pub(crate) fn project(recipe: &str) -> Project {
    let project = Project::new();
    project.write_recipe(recipe);
    fs_err::create_dir_all(project.path().join("docker")).unwrap();
    project
}

/// `build --json` of the project's recipe with `extra` flags; the run and its `result`.
fn build(project: &Project, extra: &[&str]) -> (Run, Value) {
    let docker = project.path().join("docker");
    let auth = docker.join("auth.json");
    let envs = [
        ("DOCKER_CONFIG", docker.to_str().unwrap()),
        ("REGISTRY_AUTH_FILE", auth.to_str().unwrap()),
    ];
    let mut args = vec!["--insecure", "build", "recipes/image.toml", "--json"];
    args.extend_from_slice(extra);
    let run = project.run_with(&args, &envs, None);
    assert_eq!(run.code, 0, "the build failed:\n{}", run.stderr);
    let result = run
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "result")
        .unwrap_or_else(|| panic!("no result event in:\n{}", run.stdout));
    (run, result)
}

/// A fresh builder of `from`'s lock: another project, an empty local cache.
fn fresh_from(from: &Project, recipe: &str) -> Project {
    let fresh = project(recipe);
    if from.path().join("recipes/wheels").exists() {
        copy_dir(
            &from.path().join("recipes/wheels"),
            &fresh.path().join("recipes/wheels"),
        );
    }
    fs_err::copy(from.lock_path(), fresh.lock_path()).unwrap();
    fresh
}

fn copy_dir(from: &Path, to: &Path) {
    fs_err::create_dir_all(to).unwrap();
    for entry in fs_err::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        fs_err::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A conda recipe (a package, a `noarch: python` one and its python) compressed as
/// `compression`.
fn conda_recipe(name: &str, compression: &str) -> String {
    tiny_recipe(shared_channel(), name, &["hello 1.0", "pyhello", "other"])
        + &format!("\n[layers]\ncompression = \"{compression}\"\n")
}

/// A recipe with two wheels from a directory beside it, compressed as `compression`.
fn wheel_project(name: &str, compression: &str) -> (Project, String) {
    let recipe = tiny_recipe(pypi_channel(), name, &["python"])
        + "\n[pypi]\nno-index = true\nfind-links = [\"wheels\"]\ndependencies = [\"python-dateutil\"]\n"
        + &format!("\n[layers]\ncompression = \"{compression}\"\n");
    let project = project(&recipe);
    let wheels = project.path().join("recipes/wheels");
    fs_err::create_dir_all(&wheels).unwrap();
    for (path, _) in pinned_dists(&[SIX_1_16_0, DATEUTIL_2_9_0_POST0]).unwrap() {
        fs_err::copy(&path, wheels.join(path.file_name().unwrap())).unwrap();
    }
    (project, recipe)
}

/// The layers of the image that packages make: all but its own files' layer.
fn package_layers(result: &Value) -> u64 {
    result["new_layers"].as_u64().unwrap() - 1
}

/// The image's manifest, config and every layer descriptor (TOC annotations included): the
/// whole image as the manifest digest pins it, compared blob by blob.
fn assert_same_image(a: &Project, b: &Project, name: &str) {
    let a_layout = LayoutView::new(a.path().join("images").join(name));
    let b_layout = LayoutView::new(b.path().join("images").join(name));
    assert_eq!(a_layout.manifest(), b_layout.manifest());
    assert_eq!(a_layout.config(), b_layout.config());
    assert_eq!(a_layout.blob_names(), b_layout.blob_names());
}

#[test]
fn every_layer_kind_from_the_registry_is_the_layer_a_cold_build_writes() {
    let registry = Registry::start(Auth::None);
    let repo = format!("{}/ci/layers", registry.host);
    for compression in COMPRESSIONS {
        let conda = conda_recipe("conda", compression);
        let (wheels, wheel_recipe) = wheel_project("wheels", compression);
        for (cold, recipe, name) in [
            (project(&conda), conda.clone(), "conda"),
            (wheels, wheel_recipe, "wheels"),
        ] {
            let (_, cold_result) = build(&cold, &["--cache-repo", &repo]);
            let shared = &cold_result["cache_repo"];
            let seekable =
                compression.contains("gz") && compression != "gzip" || compression.contains(':');
            assert_eq!(shared["hits"], 0, "{cold_result}");
            assert_eq!(
                shared["stored"].as_u64().unwrap() + shared["present"].as_u64().unwrap(),
                package_layers(&cold_result),
                "every package layer is offered: {cold_result}"
            );

            let fresh = fresh_from(&cold, &recipe);
            let (_, warm) = build(&fresh, &["--locked", "--cache-repo", &repo]);
            assert_eq!(
                warm["digest"], cold_result["digest"],
                "{compression} {name}"
            );
            assert_same_image(&cold, &fresh, name);
            let shared = &warm["cache_repo"];
            if seekable {
                // Their TOC can only be checked by building them: not looked up.
                assert_eq!(shared["looked_up"], 0, "{warm}");
                assert_eq!(warm["reused_layers"], 0, "{warm}");
                assert_eq!(warm["written_size"], cold_result["written_size"]);
            } else {
                assert_eq!(shared["hits"], package_layers(&warm), "{warm}");
                assert_eq!(shared["rejected"], 0, "{warm}");
                assert_eq!(warm["reused_layers"], package_layers(&warm), "{warm}");
                assert_eq!(shared["stored"], 0, "nothing new to store: {warm}");
                // Only the image's own layer was compressed.
                let written = warm["written_size"].as_u64().unwrap();
                assert!(
                    written < cold_result["written_size"].as_u64().unwrap(),
                    "{warm}"
                );
            }
            fresh.run(&["verify", &format!("images/{name}")]).success();
        }
    }
    // The entries are tagged by key in the repository, one per package layer and
    // compression, readable by skopeo.
    let tags = run_tool(
        "skopeo",
        &[
            "list-tags",
            "--tls-verify=false",
            &format!("docker://{repo}"),
        ],
    );
    let tags: Value = serde_json::from_str(&tags).unwrap();
    let tags = tags["Tags"].as_array().unwrap();
    assert!(tags.len() >= 4 * 5, "{tags:?}");
    assert!(
        tags.iter()
            .all(|t| t.as_str().unwrap().starts_with("layer-"))
    );
}

/// The registry-side files of the entry tagged `tag` in `repo`: its manifest's layer blob.
fn entry_layer(registry: &Registry, repo: &str, tag: &str) -> (Value, PathBuf) {
    let manifest = curl(&[
        "-H",
        "Accept: application/vnd.oci.image.manifest.v1+json",
        &format!("http://{}/v2/{repo}/manifests/{tag}", registry.host),
    ]);
    let manifest: Value = serde_json::from_str(&manifest).unwrap();
    let digest = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let hex = digest.trim_start_matches("sha256:");
    let data = registry
        .storage()
        .join(format!("blobs/sha256/{}/{hex}/data", &hex[..2]));
    assert!(data.is_file(), "{}", data.display());
    (manifest, data)
}

fn curl(args: &[&str]) -> String {
    let mut all = vec!["-sSf"];
    all.extend_from_slice(args);
    run_tool("curl", &all)
}

/// Uploads `bytes` as a blob of `repo` (a session, then one PUT); returns its digest.
fn upload(registry: &Registry, repo: &str, bytes: &[u8], dir: &Path) -> String {
    let digest = format!("sha256:{}", sha256_hex(bytes));
    let file = dir.join(digest.trim_start_matches("sha256:"));
    fs_err::write(&file, bytes).unwrap();
    let headers = curl(&[
        "-X",
        "POST",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &format!("http://{}/v2/{repo}/blobs/uploads/", registry.host),
    ]);
    let location = headers
        .lines()
        .find_map(|l| l.strip_prefix("Location: "))
        .unwrap_or_else(|| panic!("no Location in:\n{headers}"))
        .trim();
    let location = match location.starts_with("http") {
        true => location.to_string(),
        false => format!("http://{}{location}", registry.host),
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    curl(&[
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("{location}{separator}digest={digest}"),
    ]);
    digest
}

fn put_manifest(registry: &Registry, repo: &str, tag: &str, manifest: &Value, dir: &Path) {
    let file = dir.join("manifest.json");
    fs_err::write(&file, serde_json::to_vec(manifest).unwrap()).unwrap();
    curl(&[
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/vnd.oci.image.manifest.v1+json",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("http://{}/v2/{repo}/manifests/{tag}", registry.host),
    ]);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The tags of `repo`'s entries.
fn entry_tags(registry: &Registry, repo: &str) -> Vec<String> {
    // A repository nothing was written to is unknown (404): no tags.
    let list = run_tool(
        "curl",
        &[
            "-sS",
            &format!("http://{}/v2/{repo}/tags/list", registry.host),
        ],
    );
    let list: Value = serde_json::from_str(&list).unwrap();
    let mut tags: Vec<String> = list["tags"]
        .as_array()
        .map(|tags| {
            tags.iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    tags.sort();
    tags
}

/// A fresh build of `cold`'s lock from `repo`: it succeeds, gives the cold image, warns
/// naming each of `warnings`, and takes `hits` layers from the repository.
fn fresh_build_warns(cold: &Project, recipe: &str, repo: &str, warnings: &[&str], hits: u64) {
    let fresh = fresh_from(cold, recipe);
    let (run, result) = build(&fresh, &["--locked", "--cache-repo", repo]);
    for warning in warnings {
        assert!(
            run.stderr.contains(warning) || run.stdout.contains(warning),
            "no warning naming `{warning}`:\n{}\n{}",
            run.stderr,
            run.stdout
        );
    }
    assert_eq!(result["cache_repo"]["hits"], hits, "{result}");
    assert_same_image(cold, &fresh, "lying");
    fresh.run(&["verify", "images/lying"]).success();
}

#[test]
fn a_cache_that_lies_or_breaks_is_a_warning_and_a_cold_build() {
    let registry = Registry::start(Auth::None);
    let repo = "ci/lying";
    let full_repo = format!("{}/{repo}", registry.host);
    let recipe = conda_recipe("lying", "zstd");
    let cold = project(&recipe);
    let (_, cold_result) = build(&cold, &["--cache-repo", &full_repo]);
    let layers = package_layers(&cold_result);
    let tags = entry_tags(&registry, repo);
    assert_eq!(tags.len() as u64, layers, "{tags:?}");
    let work = tempfile::tempdir().unwrap();

    // A flipped byte in one entry's blob: its digest fails as it streams in.
    let (_, data) = entry_layer(&registry, repo, &tags[0]);
    let good = fs_err::read(&data).unwrap();
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0xff;
    fs_err::write(&data, &flipped).unwrap();
    fresh_build_warns(
        &cold,
        &recipe,
        &full_repo,
        &[&full_repo, "digest"],
        layers - 1,
    );
    fs_err::write(&data, &good).unwrap();

    // A missing blob.
    fs_err::rename(&data, data.with_extension("gone")).unwrap();
    fresh_build_warns(&cold, &recipe, &full_repo, &[&full_repo], layers - 1);
    fs_err::rename(data.with_extension("gone"), &data).unwrap();

    // A swapped blob with a consistent entry: the entry of tag 0 made to name tag 1's
    // blob, its config claiming that blob's diff_id under tag 0's key. Every digest holds;
    // the layer's own tar is what refuses it.
    let (first, _) = entry_layer(&registry, repo, &tags[0]);
    let (second, _) = entry_layer(&registry, repo, &tags[1]);
    let config_of = |manifest: &Value| -> Value {
        let digest = manifest["config"]["digest"].as_str().unwrap();
        serde_json::from_str(&curl(&[&format!(
            "http://{}/v2/{repo}/blobs/{digest}",
            registry.host
        )]))
        .unwrap()
    };
    let mut lying_config = config_of(&first);
    lying_config["diffId"] = config_of(&second)["diffId"].clone();
    lying_config["tarSize"] = config_of(&second)["tarSize"].clone();
    lying_config["layer"] = second["layers"][0].clone();
    let config_bytes = serde_json::to_vec(&lying_config).unwrap();
    let mut lying = first.clone();
    lying["config"]["digest"] = upload(&registry, repo, &config_bytes, work.path()).into();
    lying["config"]["size"] = config_bytes.len().into();
    lying["layers"] = second["layers"].clone();
    put_manifest(&registry, repo, &tags[0], &lying, work.path());
    fresh_build_warns(&cold, &recipe, &full_repo, &["fails its check"], layers - 1);

    // A malformed entry: a manifest whose config is not an entry.
    let mut malformed = first.clone();
    malformed["config"]["mediaType"] = "application/vnd.example.not-an-entry+json".into();
    put_manifest(&registry, repo, &tags[0], &malformed, work.path());
    fresh_build_warns(
        &cold,
        &recipe,
        &full_repo,
        &["config of media type"],
        layers - 1,
    );
    put_manifest(&registry, repo, &tags[0], &first, work.path());

    // An unreachable cache.
    let nowhere = format!("127.0.0.1:{}/ci/lying", free_port());
    fresh_build_warns(&cold, &recipe, &nowhere, &[&nowhere, "cannot be used"], 0);

    // A registry that wants credentials this builder does not have.
    let guarded = Registry::start(Auth::Basic {
        user: "ci".into(),
        password: "secret".into(),
    });
    let guarded_repo = format!("{}/ci/lying", guarded.host);
    fresh_build_warns(&cold, &recipe, &guarded_repo, &[&guarded_repo], 0);
}

#[test]
fn concurrent_writers_and_a_read_only_builder_leave_a_cache_that_serves() {
    let registry = Registry::start(Auth::None);
    let repo = "ci/shared";
    let full_repo = format!("{}/{repo}", registry.host);
    let recipe = conda_recipe("shared", "gzip");
    let first = project(&recipe);
    first.build(&[]).success();

    // Read-only: looked up, never written.
    let reader = fresh_from(&first, &recipe);
    let (_, read_only) = build(
        &reader,
        &[
            "--locked",
            "--cache-repo",
            &full_repo,
            "--cache-repo-readonly",
        ],
    );
    assert_eq!(read_only["cache_repo"]["readonly"], true);
    assert_eq!(read_only["cache_repo"]["hits"], 0);
    assert!(entry_tags(&registry, repo).is_empty());

    // Two builders of the same lock write the same keys at once.
    let writers: Vec<Project> = (0..2).map(|_| fresh_from(&first, &recipe)).collect();
    let results: Vec<Value> = std::thread::scope(|scope| {
        let running: Vec<_> = writers
            .iter()
            .map(|writer| {
                let full_repo = &full_repo;
                scope.spawn(move || build(writer, &["--locked", "--cache-repo", full_repo]).1)
            })
            .collect();
        running.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(results[0]["digest"], results[1]["digest"]);
    let layers = package_layers(&results[0]);
    assert_eq!(entry_tags(&registry, repo).len() as u64, layers);

    // What they left serves a third builder every layer.
    let third = fresh_from(&first, &recipe);
    let (_, served) = build(&third, &["--locked", "--cache-repo", &full_repo]);
    assert_eq!(served["cache_repo"]["hits"], layers, "{served}");
    assert_eq!(served["digest"], results[0]["digest"]);

    // `cache ls` lists each entry as a build reads it, and a tag that is no entry apart.
    let tags = entry_tags(&registry, repo);
    let (mut manifest, _) = entry_layer(&registry, repo, &tags[0]);
    manifest["config"]["mediaType"] = "application/vnd.example.not-an-entry+json".into();
    let work = tempfile::tempdir().unwrap();
    put_manifest(
        &registry,
        repo,
        "layer-not-an-entry",
        &manifest,
        work.path(),
    );
    let listed = third
        .run(&["--insecure", "cache", "ls", &full_repo, "--json"])
        .success();
    let listed: Value = serde_json::from_str(&listed.stdout).unwrap();
    let entries = listed["entries"].as_array().unwrap();
    assert_eq!(entries.len() as u64, layers, "{listed}");
    let blobs = LayoutView::new(third.path().join("images/shared")).blob_names();
    for entry in entries {
        assert_eq!(entry["compression"], "gzip", "{entry}");
        assert_eq!(entry["key"].as_str().unwrap().len(), 64, "{entry}");
        let digest = entry["digest"].as_str().unwrap();
        assert!(
            blobs.iter().any(|b| digest.ends_with(b.as_str())),
            "{entry}"
        );
    }
    assert_eq!(listed["unread"][0]["tag"], "layer-not-an-entry", "{listed}");
    let text = third
        .run(&["--insecure", "cache", "ls", &full_repo])
        .success();
    let count = format!("{layers} entries");
    assert!(text.stdout.contains(&count), "{}", text.stdout);
    assert!(
        text.stdout.contains("layer-not-an-entry: unreadable"),
        "{}",
        text.stdout
    );
}

#[test]
fn a_cache_repo_that_names_an_image_is_refused() {
    let project = project(&conda_recipe("refused", "gzip"));
    for bad in [
        "127.0.0.1:5000/ci/layers:v1",
        "127.0.0.1:5000/ci/layers@sha256:00",
    ] {
        let run = project.build(&["--cache-repo", bad]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(run.stderr.contains("--cache-repo"), "{}", run.stderr);
    }
    let run = project.build(&["--cache-repo-readonly"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    project.assert_no_image();
}

#[test]
fn a_fresh_builder_pushing_beside_the_cache_mounts_the_shared_layers() {
    let registry = Registry::start(Auth::None);
    let cache = format!("{}/ci/cache", registry.host);
    let recipe = conda_recipe("mounted", "zstd");
    let cold = project(&recipe);
    build(&cold, &["--cache-repo", &cache]);

    let fresh = fresh_from(&cold, &recipe);
    let target = format!("{}/ml/mounted:v1", registry.host);
    let (run, result) = build(
        &fresh,
        &["--locked", "--cache-repo", &cache, "--push", &target],
    );
    let layers = package_layers(&result);
    assert_eq!(result["cache_repo"]["hits"], layers, "{result}");
    let push = run
        .stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|event| event["event"] == "push")
        .unwrap_or_else(|| panic!("no push event in:\n{}", run.stdout));
    // Every package layer is mounted from the cache; only what the build made itself (its
    // own layer, config, manifest) is sent.
    assert_eq!(push["blobs_mounted"], layers, "{push}");
    assert_eq!(
        push["blobs_uploaded"].as_u64().unwrap(),
        push["blobs_total"].as_u64().unwrap() - layers,
        "{push}"
    );
    let pushed = run_tool(
        "skopeo",
        &[
            "inspect",
            "--tls-verify=false",
            &format!("docker://{target}"),
        ],
    );
    let pushed: Value = serde_json::from_str(&pushed).unwrap();
    assert_eq!(pushed["Digest"], result["digest"]);
}

#[test]
fn a_layer_of_another_prefix_or_python_site_is_never_a_hit() {
    let registry = Registry::start(Auth::None);
    let repo = format!("{}/ci/prefixes", registry.host);
    let recipe = conda_recipe("prefixes", "zstd");
    let first = project(&recipe);
    let (_, stored) = build(&first, &["--cache-repo", &repo]);
    assert!(
        stored["cache_repo"]["stored"].as_u64().unwrap() > 0,
        "{stored}"
    );

    // The same packages at another prefix: every path, the noarch package's site-packages
    // and its entry point's shebang differ, so no key may match.
    let moved = recipe.replace("[image]\n", "[image]\nprefix = \"/opt/other\"\n");
    assert_ne!(moved, recipe);
    let other = project(&moved);
    let (_, elsewhere) = build(&other, &["--cache-repo", &repo]);
    assert_eq!(
        elsewhere["cache_repo"]["looked_up"],
        package_layers(&elsewhere)
    );
    assert_eq!(elsewhere["cache_repo"]["hits"], 0, "{elsewhere}");

    // And that image is what a cold build at that prefix writes.
    let cold = fresh_from(&other, &moved);
    let (_, cold_result) = build(&cold, &["--locked"]);
    assert_eq!(cold_result["digest"], elsewhere["digest"]);
}

#[test]
fn signed_entries_serve_seekable_layers_and_others_are_refused() {
    let registry = Registry::start(Auth::None);
    let repo = format!("{}/ci/signed", registry.host);
    let keys = tempfile::tempdir().unwrap();
    let ours = crate::signing::Gpg::new(keys.path(), "ours");
    let theirs = crate::signing::Gpg::new(keys.path(), "theirs");
    let secret = ours.secret_key(&keys.path().join("ours.asc"));
    let public = ours.public_key(&keys.path().join("ours.pub"));
    let foreign = theirs.public_key(&keys.path().join("theirs.pub"));
    let (secret, public, foreign) = (
        secret.to_str().unwrap(),
        public.to_str().unwrap(),
        foreign.to_str().unwrap(),
    );

    let recipe = conda_recipe("signed", "estargz");
    let cold = project(&recipe);
    let (_, stored) = build(&cold, &["--cache-repo", &repo, "--cache-sign-by", secret]);
    let layers = package_layers(&stored);
    assert_eq!(stored["cache_repo"]["stored"], layers, "{stored}");

    // Signed by the key asked for: an eStargz layer rests on its signature, not a rebuild.
    let trusting = fresh_from(&cold, &recipe);
    let (_, served) = build(
        &trusting,
        &[
            "--locked",
            "--cache-repo",
            &repo,
            "--cache-verify-key",
            public,
        ],
    );
    assert_eq!(served["cache_repo"]["hits"], layers, "{served}");
    assert_eq!(served["reused_layers"], layers, "{served}");
    assert_same_image(&cold, &trusting, "signed");
    trusting.run(&["verify", "images/signed"]).success();

    // A signature moved from one entry to another is refused: it signs the other config.
    let tags = entry_tags(&registry, "ci/signed");
    let (first, _) = entry_layer(&registry, "ci/signed", &tags[0]);
    let (mut second, _) = entry_layer(&registry, "ci/signed", &tags[1]);
    second["annotations"] = first["annotations"].clone();
    let work = tempfile::tempdir().unwrap();
    put_manifest(&registry, "ci/signed", &tags[1], &second, work.path());
    let replayed = fresh_from(&cold, &recipe);
    let (run, result) = build(
        &replayed,
        &[
            "--locked",
            "--cache-repo",
            &repo,
            "--cache-verify-key",
            public,
        ],
    );
    assert_eq!(result["cache_repo"]["hits"], layers - 1, "{result}");
    assert!(run.stdout.contains("of another config"), "{}", run.stdout);
    assert_same_image(&cold, &replayed, "signed");

    // Another key's builder refuses every entry and builds cold.
    let wary = fresh_from(&cold, &recipe);
    let (run, refused) = build(
        &wary,
        &[
            "--locked",
            "--cache-repo",
            &repo,
            "--cache-verify-key",
            foreign,
        ],
    );
    assert_eq!(refused["cache_repo"]["hits"], 0, "{refused}");
    assert!(run.stdout.contains("not signed by"), "{}", run.stdout);
    assert_same_image(&cold, &wary, "signed");

    // Unsigned entries are refused under a verify key, gzip ones included.
    let plain_repo = format!("{}/ci/unsigned", registry.host);
    let gzip = conda_recipe("signed", "gzip");
    let unsigned = project(&gzip);
    build(&unsigned, &["--cache-repo", &plain_repo]);
    let checking = fresh_from(&unsigned, &gzip);
    let (run, unsigned_result) = build(
        &checking,
        &[
            "--locked",
            "--cache-repo",
            &plain_repo,
            "--cache-verify-key",
            public,
        ],
    );
    assert_eq!(unsigned_result["cache_repo"]["hits"], 0);
    assert!(run.stdout.contains("it is not signed"), "{}", run.stdout);

    // A key that cannot be used stops the build before it starts.
    let missing = keys.path().join("missing.asc");
    for flag in ["--cache-sign-by", "--cache-verify-key"] {
        let run = checking.build(&["--cache-repo", &plain_repo, flag, missing.to_str().unwrap()]);
        assert_eq!(run.code, 2, "{flag}: {}", run.stderr);
        assert!(run.stderr.contains("missing.asc"), "{}", run.stderr);
    }
}

/// A channel with a stand-in python 3.10, laid out as the shared channel's 3.9 is, so a
/// `noarch: python` package links into `lib/python3.10/site-packages`.
pub(crate) fn python310_channel(dir: &Path) {
    use crate::support::channel::{
        executable, file, index_channel, link, linux64_index, write_package,
    };
    let linux64 = dir.join("linux-64");
    fs_err::create_dir_all(&linux64).unwrap();
    fs_err::create_dir_all(dir.join("noarch")).unwrap();
    write_package(
        &linux64.join("python-3.10.14-h0_0.tar.bz2"),
        linux64_index("python", "3.10.14", &[]),
        &[
            executable(
                "bin/python3.10",
                "#!/bin/sh\necho \"stand-in python 3.10 $@\"\n",
            ),
            link("bin/python", "python3.10"),
            file(
                "lib/python3.10/site-packages/README.txt",
                "site-packages of a stand-in python 3.10\n",
            ),
        ],
        None,
    )
    .unwrap();
    index_channel(dir).unwrap();
}

/// A recipe of `packages` with a `[matrix]` of two pythons: the shared channel's 3.9 and a
/// stand-in 3.10 from a channel made in `extra`.
pub(crate) fn pythons_recipe(extra: &Path, packages: &[&str]) -> String {
    python310_channel(extra);
    let extra_url = url::Url::from_directory_path(extra).unwrap();
    let shared_url = url::Url::from_directory_path(shared_channel()).unwrap();
    tiny_recipe(shared_channel(), "pythons", packages)
        .lines()
        .map(|line| match line.starts_with("channels = ") {
            true => format!(
                "channels = [\"{extra_url}\", \"{shared_url}\"]\nchannel-priority = \"disabled\""
            ),
            false => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n\n[matrix]\npython = [\"3.9.18\", \"3.10.14\"]\n"
}

/// Every variant's lock of `from`, copied into `to`.
pub(crate) fn copy_locks(from: &Project, to: &Project) {
    for entry in fs_err::read_dir(from.path().join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lock") {
            let name = path.file_name().unwrap();
            fs_err::copy(&path, to.path().join("recipes").join(name)).unwrap();
        }
    }
}

/// Every `result` event of a matrix build's `--json` run.
pub(crate) fn matrix_build(project: &Project, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["--insecure", "build", "recipes/image.toml", "--json"];
    args.extend_from_slice(extra);
    let run = project.run(&args);
    assert_eq!(run.code, 0, "the build failed:\n{}", run.stderr);
    run.stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["event"] == "result")
        .collect()
}

#[test]
fn a_matrix_of_two_pythons_shares_no_layer_across_them_and_each_is_served() {
    let registry = Registry::start(Auth::None);
    let repo = format!("{}/ci/pythons", registry.host);
    let extra = tempfile::tempdir().unwrap();
    let recipe = pythons_recipe(extra.path(), &["python {{python}}", "pyhello"]);
    let cold = project(&recipe);
    let built = matrix_build(&cold, &["--cache-repo", &repo]);
    assert_eq!(built.len(), 2, "{built:?}");
    // The second python's layers (python, and pyhello linked into its site-packages) are
    // no hit of the first's: their keys differ.
    assert_eq!(built[1]["reused_layers"], 0, "{}", built[1]);
    assert_eq!(built[1]["cache_repo"]["hits"], 0, "{}", built[1]);

    let fresh = project(&recipe);
    copy_locks(&cold, &fresh);
    let served = matrix_build(&fresh, &["--locked", "--cache-repo", &repo]);
    for (cold_variant, warm) in built.iter().zip(&served) {
        assert_eq!(warm["digest"], cold_variant["digest"], "{warm}");
        assert_eq!(warm["cache_repo"]["hits"], package_layers(warm), "{warm}");
    }
    assert_ne!(served[0]["digest"], served[1]["digest"]);
}
