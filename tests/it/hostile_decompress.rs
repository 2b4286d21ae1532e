//! Decompression bombs (issue 26): every decompression is bounded. A channel whose
//! repodata decompresses past `IMGBUILD_MAX_REPODATA_BYTES`, a base layer past its ratio
//! bound, a library `imgbuild smoke` would extract past its cap, an `/etc/passwd` or
//! `libc.so.6` past theirs, a wheel member past the wheel's bound, a layer `verify` reads:
//! each is refused with exit 1 naming its subject and the limit, with the cache and
//! `TMPDIR` no bigger than the bound and the previous image intact. The bombs are small on
//! disk; the limits are lowered where a real-size one would cost the test minutes.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    path::Path,
};

use sha2::{Digest, Sha256};

use crate::{
    common::{Project, Run, run_with_deadline},
    servers::scripted::{Reply, Scripted},
    support::{channel::tiny_recipe, pypi::pypi_channel, shared_channel},
    trust::{Tree, bytes_under},
};

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Bombs

/// `len` bytes of `byte`, zstd-compressed as it streams (never held whole).
fn zstd_of(prefix: &[u8], byte: u8, len: u64, suffix: &[u8]) -> Vec<u8> {
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 19).unwrap();
    encoder.write_all(prefix).unwrap();
    std::io::copy(&mut std::io::repeat(byte).take(len), &mut encoder).unwrap();
    encoder.write_all(suffix).unwrap();
    encoder.finish().unwrap()
}

/// A repodata.json of `len` spaces between `{` and its packages: valid JSON, a bomb.
fn repodata_bomb_json(subdir: &str) -> (Vec<u8>, Vec<u8>) {
    (
        b"{".to_vec(),
        format!("\"info\":{{\"subdir\":\"{subdir}\"}},\"packages\":{{}},\"packages.conda\":{{}}}}")
            .into_bytes(),
    )
}

fn empty_repodata(subdir: &str) -> Vec<u8> {
    let (mut head, tail) = repodata_bomb_json(subdir);
    head.extend_from_slice(&tail);
    head
}

/// Bytes that do not compress, from a fixed seed.
fn noise(len: usize) -> Vec<u8> {
    crate::common::noise(0x2545_f491_4f6c_dd1d, len)
}

/// A file of a layer: given bytes, or `len` zeros streamed into the tar.
enum Content {
    Bytes(Vec<u8>),
    Zeros(u64),
}

#[derive(Clone, Copy)]
enum Codec {
    Gzip,
    Zstd,
}

struct Layer {
    media_type: &'static str,
    blob: Vec<u8>,
    diff_id: String,
}

/// Hashes what passes to the compressor: the diff_id of the tar.
struct Tee<W: Write> {
    hasher: Sha256,
    out: W,
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(buf);
        self.out.write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn layer(codec: Codec, files: &[(&str, Content)]) -> Layer {
    fn tar_into(out: impl Write, files: &[(&str, Content)]) -> Sha256 {
        let mut tee = Tee {
            hasher: Sha256::new(),
            out,
        };
        {
            let mut builder = tar::Builder::new(&mut tee);
            for (path, content) in files {
                let mut header = tar::Header::new_gnu();
                header.set_mode(0o644);
                header.set_mtime(0);
                header.set_entry_type(tar::EntryType::Regular);
                match content {
                    Content::Bytes(bytes) => {
                        header.set_size(bytes.len() as u64);
                        builder.append_data(&mut header, path, &bytes[..]).unwrap();
                    }
                    Content::Zeros(len) => {
                        header.set_size(*len);
                        let zeros = std::io::repeat(0).take(*len);
                        builder.append_data(&mut header, path, zeros).unwrap();
                    }
                }
            }
            builder.finish().unwrap();
        }
        tee.hasher
    }
    let (media_type, blob, hasher) = match codec {
        Codec::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            let hasher = tar_into(&mut gz, files);
            (
                "application/vnd.oci.image.layer.v1.tar+gzip",
                gz.finish().unwrap(),
                hasher,
            )
        }
        Codec::Zstd => {
            let mut zst = zstd::stream::Encoder::new(Vec::new(), 19).unwrap();
            let hasher = tar_into(&mut zst, files);
            (
                "application/vnd.oci.image.layer.v1.tar+zstd",
                zst.finish().unwrap(),
                hasher,
            )
        }
    };
    Layer {
        media_type,
        blob,
        diff_id: format!("sha256:{}", hex::encode(hasher.finalize())),
    }
}

/// Writes the blob, returning its descriptor.
fn put_blob(dir: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let hex = hex::encode(Sha256::digest(bytes));
    fs_err::create_dir_all(dir.join("blobs/sha256")).unwrap();
    fs_err::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
    serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

/// An OCI layout at `dir` with one linux/amd64 image tagged `latest` of `layers`.
fn write_layout(dir: &Path, layers: &[Layer], env: &[&str]) {
    let _ = fs_err::remove_dir_all(dir);
    fs_err::create_dir_all(dir).unwrap();
    fs_err::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    });
    let config = put_blob(
        dir,
        "application/vnd.oci.image.config.v1+json",
        &serde_json::to_vec(&config).unwrap(),
    );
    let layers: Vec<_> = layers
        .iter()
        .map(|l| put_blob(dir, l.media_type, &l.blob))
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layers,
    });
    let mut manifest = put_blob(
        dir,
        "application/vnd.oci.image.manifest.v1+json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    manifest["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": "latest"});
    manifest["platform"] = serde_json::json!({"architecture": "amd64", "os": "linux"});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    fs_err::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// The digest of the only layer of the layout at `dir`.
fn layer_digest(dir: &Path) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&fs_err::read(dir.join("index.json")).unwrap()).unwrap();
    let manifest = index["manifests"][0]["digest"].as_str().unwrap();
    let path = dir
        .join("blobs/sha256")
        .join(manifest.trim_start_matches("sha256:"));
    let manifest: serde_json::Value = serde_json::from_slice(&fs_err::read(path).unwrap()).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    layers.last().unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Running

/// imgbuild `args` in `project` with `envs`, `TMPDIR` in the project, under a deadline.
fn run(project: &Project, args: &[&str], envs: &[(&str, &str)]) -> Run {
    let tmp = project.path().join("tmp");
    fs_err::create_dir_all(&tmp).unwrap();
    let mut command = project.command(args);
    command.env("TMPDIR", &tmp);
    for (key, value) in envs {
        command.env(key, value);
    }
    run_with_deadline(command, project, args)
}

/// A refusal with exit 1 naming `needles`, leaving the images and `TMPDIR` as they were
/// and the cache no bigger than `cache_max`.
#[track_caller]
fn assert_refused(project: &Project, run: &Run, images: &Tree, cache_max: u64, needles: &[&str]) {
    run.assert_failure_naming(1, needles);
    assert_eq!(
        &Tree::of(&project.path().join("images")),
        images,
        "the previous image is intact"
    );
    let tmp = bytes_under(&project.path().join("tmp"));
    assert_eq!(tmp, 0, "nothing is left in TMPDIR");
    let cache = bytes_under(&project.cache);
    assert!(
        cache <= cache_max,
        "the cache holds {cache} bytes, over {cache_max}"
    );
}

/// A first image, `images/<name>`, from the shared file channel on scratch: what a refused
/// run must leave intact.
fn previous_image(project: &Project, name: &str) -> Tree {
    project.write_recipe(&tiny_recipe(shared_channel(), name, &["hello 1.0"]));
    run(project, &["build", "recipes/image.toml"], &[]).success();
    Tree::of(&project.path().join("images"))
}

// ---------------------------------------------------------------------------------------------
// A channel server that answers with given bytes and headers

/// GET and HEAD of the paths in `files` (with extra headers), 404 otherwise, on the
/// scripted server.
struct Server {
    url: String,
    server: Scripted,
}

/// Extra headers of an answer.
type Headers = Vec<(String, String)>;
type Files = BTreeMap<String, (Headers, Vec<u8>)>;

impl Server {
    fn serve(files: Files) -> Self {
        let server = Scripted::start("127.0.0.1", move |request| {
            match files.get(request.path()) {
                Some((headers, body)) => headers
                    .iter()
                    .fold(Reply::bytes(200, body.clone()), |reply, (name, value)| {
                        reply.header(name, value)
                    }),
                None => Reply::bytes(404, ""),
            }
        });
        Server {
            url: format!("{}/", server.url()),
            server,
        }
    }

    /// How many times `path` was fetched (GET).
    fn gets(&self, path: &str) -> usize {
        let requests = self.server.requests();
        requests
            .iter()
            .filter(|r| r.method == "GET" && r.path() == path)
            .count()
    }
}

/// A channel `chan` whose linux-64 subdir serves `files` (name, headers, bytes) and whose
/// noarch subdir is empty.
fn channel(files: Vec<(&str, Headers, Vec<u8>)>) -> Server {
    let mut map = Files::new();
    map.insert(
        "/chan/noarch/repodata.json".into(),
        (vec![], empty_repodata("noarch")),
    );
    for (name, headers, bytes) in files {
        map.insert(format!("/chan/linux-64/{name}"), (headers, bytes));
    }
    Server::serve(map)
}

/// A rebuild from `server`'s channel under an 8 MiB bound is refused naming `file`, with the
/// cache grown by at most the bound.
#[track_caller]
fn assert_repodata_refused(server: &Server, file: &str) {
    let project = Project::new();
    let (run, images, cache_before) = build_from(&project, server, 8 * MIB);
    let needles = channel_needles(server, file);
    assert_refused(
        &project,
        &run,
        &images,
        cache_before + 8 * MIB,
        &as_strs(&needles),
    );
}

/// After a first image, a rebuild of it from `server`'s channel with
/// `IMGBUILD_MAX_REPODATA_BYTES` at `max`: the run, the tree of the first image and the
/// size of the cache before the rebuild.
fn build_from(project: &Project, server: &Server, max: u64) -> (Run, Tree, u64) {
    let images = previous_image(project, "repo");
    let recipe = tiny_recipe(shared_channel(), "repo", &["hello 1.0"]).replace(
        &format!("{}", url::Url::from_file_path(shared_channel()).unwrap()),
        &format!("{}chan", server.url),
    );
    project.write_recipe(&recipe);
    let cache = bytes_under(&project.cache);
    let max = max.to_string();
    let run = run(
        project,
        &["build", "recipes/image.toml"],
        &[("IMGBUILD_MAX_REPODATA_BYTES", max.as_str())],
    );
    (run, images, cache)
}

fn channel_needles(server: &Server, file: &str) -> Vec<String> {
    vec![
        format!(
            "`{file}` of channel `{}chan/` subdir `linux-64`",
            server.url
        ),
        format!("more than {} bytes", 8 * MIB),
        "IMGBUILD_MAX_REPODATA_BYTES".to_string(),
    ]
}

fn as_strs(needles: &[String]) -> Vec<&str> {
    needles.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------------------------------
// Channel answers

#[test]
fn a_zstd_repodata_bomb_is_cut_off_at_the_bound() {
    let (head, tail) = repodata_bomb_json("linux-64");
    let bomb = zstd_of(&head, b' ', 256 * MIB, &tail);
    assert!(bomb.len() < 64 << 10, "a small bomb: {}", bomb.len());
    let server = channel(vec![("repodata.json.zst", vec![], bomb)]);
    assert_repodata_refused(&server, "repodata.json.zst");
    // rattler retries a body that fails to decode; the bomb is read once all the same.
    assert_eq!(server.gets("/chan/linux-64/repodata.json.zst"), 1);
}

#[test]
fn a_bzip2_repodata_bomb_is_cut_off_at_the_bound() {
    let (head, tail) = repodata_bomb_json("linux-64");
    let mut encoder = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    encoder.write_all(&head).unwrap();
    std::io::copy(&mut std::io::repeat(b' ').take(64 * MIB), &mut encoder).unwrap();
    encoder.write_all(&tail).unwrap();
    let bomb = encoder.finish().unwrap();
    let server = channel(vec![("repodata.json.bz2", vec![], bomb)]);
    assert_repodata_refused(&server, "repodata.json.bz2");
}

#[test]
fn a_gzip_transfer_encoded_repodata_bomb_is_cut_off_at_the_bound() {
    // `Content-Encoding: gzip` on the plain repodata.json, which the gateway decodes itself.
    let (head, tail) = repodata_bomb_json("linux-64");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&head).unwrap();
    std::io::copy(&mut std::io::repeat(b' ').take(64 * MIB), &mut encoder).unwrap();
    encoder.write_all(&tail).unwrap();
    let gzip = vec![("Content-Encoding".to_string(), "gzip".to_string())];
    let server = channel(vec![("repodata.json", gzip, encoder.finish().unwrap())]);
    assert_repodata_refused(&server, "repodata.json");
}

#[test]
fn a_plain_repodata_over_the_bound_is_refused() {
    let (mut json, tail) = repodata_bomb_json("linux-64");
    json.resize(9 * MIB as usize, b' ');
    json.extend_from_slice(&tail);
    let server = channel(vec![("repodata.json", vec![], json)]);
    assert_repodata_refused(&server, "repodata.json");
}

#[test]
fn a_sharded_repodata_index_bomb_is_cut_off_at_the_bound() {
    // Sharded repodata is read into memory whole: the bound keeps that to the limit.
    let bomb = zstd_of(b"", 0, 256 * MIB, b"");
    let server = channel(vec![("repodata_shards.msgpack.zst", vec![], bomb)]);
    assert_repodata_refused(&server, "repodata_shards.msgpack.zst");
}

#[test]
fn a_large_honest_repodata_under_the_default_bound_is_read() {
    // 48 MiB of repodata (zstd, a few KiB on the wire) with the one package the shared
    // channel has: well under the 2 GiB default, so the build goes through.
    let linux64 = shared_channel().join("linux-64");
    let text = fs_err::read_to_string(linux64.join("repodata.json")).unwrap();
    let (head, rest) = text.split_at(1);
    let bomb = zstd_of(head.as_bytes(), b' ', 48 * MIB, rest.as_bytes());
    let mut files = vec![("repodata.json.zst", vec![], bomb)];
    let mut packages = Vec::new();
    for entry in fs_err::read_dir(&linux64).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".tar.bz2") || name.ends_with(".conda") {
            packages.push(name);
        }
    }
    let bytes: Vec<(String, Vec<u8>)> = packages
        .iter()
        .map(|n| (n.clone(), fs_err::read(linux64.join(n)).unwrap()))
        .collect();
    for (name, body) in &bytes {
        files.push((name.as_str(), vec![], body.clone()));
    }
    let server = channel(files);
    let project = Project::new();
    let recipe = tiny_recipe(shared_channel(), "honest", &["hello 1.0"]).replace(
        &format!("{}", url::Url::from_file_path(shared_channel()).unwrap()),
        &format!("{}chan", server.url),
    );
    project.write_recipe(&recipe);
    run(&project, &["build", "recipes/image.toml"], &[]).success();
}

// ---------------------------------------------------------------------------------------------
// Layers: smoke, base images, accounts, verify

const CUDART: &str = "usr/local/cuda/lib64/libcudart.so.11.0";

#[test]
fn smoke_refuses_a_library_past_its_cap_and_leaves_tmpdir_empty() {
    // A megabyte of noise lifts the layer's ratio bound past the library: the cap on what
    // smoke extracts is what stops it.
    let project = Project::new();
    let image = project.path().join("bomb");
    let files = [
        ("opt/noise", Content::Bytes(noise(MIB as usize))),
        (CUDART, Content::Zeros(40 * MIB)),
    ];
    write_layout(
        &image,
        &[layer(Codec::Gzip, &files)],
        &["CUDA_VERSION=11.8.89"],
    );
    let digest = layer_digest(&image);
    let run = run(
        &project,
        &["smoke", image.to_str().unwrap()],
        &[("IMGBUILD_SMOKE_MAX_LIBRARY_BYTES", "8388608")],
    );
    assert_refused(
        &project,
        &run,
        &Tree::of(&project.path().join("images")),
        0,
        &[
            &format!("`{CUDART}` in layer `{digest}` unpacks to more than 8388608 bytes"),
            "IMGBUILD_SMOKE_MAX_LIBRARY_BYTES",
        ],
    );
}

#[test]
fn smoke_refuses_libraries_past_their_total() {
    // Each library under the cap, together over twice it.
    let project = Project::new();
    let image = project.path().join("bomb");
    let files = [
        ("opt/noise", Content::Bytes(noise(MIB as usize))),
        (CUDART, Content::Zeros(7 * MIB)),
        (
            "usr/local/cuda/lib64/libnvrtc.so.11.2",
            Content::Zeros(7 * MIB),
        ),
        (
            "usr/local/cuda/lib64/libnvrtc-builtins.so.11.8",
            Content::Zeros(7 * MIB),
        ),
    ];
    write_layout(
        &image,
        &[layer(Codec::Gzip, &files)],
        &["CUDA_VERSION=11.8.89"],
    );
    let run = run(
        &project,
        &["smoke", image.to_str().unwrap()],
        &[("IMGBUILD_SMOKE_MAX_LIBRARY_BYTES", "8388608")],
    );
    assert_refused(
        &project,
        &run,
        &Tree::of(&project.path().join("images")),
        0,
        &["what is left of the most all CUDA libraries together may hold"],
    );
}

#[test]
fn smoke_refuses_a_layer_past_its_ratio_bound() {
    // 200 MiB of zeros in a few KiB of zstd, with the default bounds.
    let project = Project::new();
    let image = project.path().join("bomb");
    write_layout(
        &image,
        &[layer(Codec::Zstd, &[(CUDART, Content::Zeros(200 * MIB))])],
        &[],
    );
    let digest = layer_digest(&image);
    let run = run(&project, &["smoke", image.to_str().unwrap()], &[]);
    assert_refused(
        &project,
        &run,
        &Tree::of(&project.path().join("images")),
        0,
        &[
            &format!("layer `{digest}` unpacks to more than 33554432 bytes"),
            "IMGBUILD_MAX_UNPACK_RATIO",
        ],
    );
}

/// A rebuild of a first image on the base `layers`: the run and the first image's tree.
fn build_on_base(project: &Project, layers: &[Layer], accounts: bool) -> (Run, Tree) {
    let base = project.path().join("base");
    write_layout(
        &base,
        &[layer(
            Codec::Gzip,
            &[("etc/hostname", Content::Bytes(b"b\n".to_vec()))],
        )],
        &[],
    );
    let mut recipe = tiny_recipe(shared_channel(), "onbase", &["hello 1.0"])
        .replace("base = \"scratch\"", "base = \"oci:../base:latest\"");
    if accounts {
        recipe += "\n[[accounts.groups]]\nname = \"jovyan\"\ngid = 1000\n\n\
            [[accounts.users]]\nname = \"jovyan\"\nuid = 1000\ngid = 1000\nhome = \"/home/jovyan\"\n";
    }
    project.write_recipe(&recipe);
    run(project, &["build", "recipes/image.toml"], &[]).success();
    let images = Tree::of(&project.path().join("images"));
    write_layout(&base, layers, &[]);
    (run(project, &["build", "recipes/image.toml"], &[]), images)
}

#[test]
fn a_base_layer_bomb_is_refused_naming_the_layer() {
    let project = Project::new();
    let bomb = layer(Codec::Zstd, &[("opt/zeros", Content::Zeros(200 * MIB))]);
    let (run, images) = build_on_base(&project, &[bomb], false);
    let digest = layer_digest(&project.path().join("base"));
    let cache = bytes_under(&project.cache);
    assert_refused(
        &project,
        &run,
        &images,
        cache,
        &[&format!(
            "layer `{digest}` unpacks to more than 33554432 bytes"
        )],
    );
}

#[test]
fn a_base_libc_past_its_cap_is_refused() {
    // 80 MiB of "libc.so.6", behind a megabyte of noise so the layer's own bound allows it.
    let project = Project::new();
    let files = [
        ("opt/noise", Content::Bytes(noise(MIB as usize))),
        ("lib/x86_64-linux-gnu/libc.so.6", Content::Zeros(80 * MIB)),
    ];
    let (run, images) = build_on_base(&project, &[layer(Codec::Gzip, &files)], false);
    let digest = layer_digest(&project.path().join("base"));
    let cache = bytes_under(&project.cache);
    assert_refused(
        &project,
        &run,
        &images,
        cache,
        &[&format!(
            "`lib/x86_64-linux-gnu/libc.so.6` in layer `{digest}` unpacks to more than 67108864 bytes"
        )],
    );
}

#[test]
fn a_base_passwd_past_its_cap_is_refused() {
    let project = Project::new();
    let files = [("etc/passwd", Content::Zeros(8 * MIB))];
    let (run, images) = build_on_base(&project, &[layer(Codec::Zstd, &files)], true);
    let digest = layer_digest(&project.path().join("base"));
    let cache = bytes_under(&project.cache);
    assert_refused(
        &project,
        &run,
        &images,
        cache,
        &[&format!(
            "`/etc/passwd` in layer `{digest}` unpacks to more than 4194304 bytes"
        )],
    );
}

#[test]
fn verify_refuses_a_layer_bomb() {
    let project = Project::new();
    let image = project.path().join("bomb");
    write_layout(
        &image,
        &[layer(
            Codec::Zstd,
            &[("opt/zeros", Content::Zeros(200 * MIB))],
        )],
        &[],
    );
    let digest = layer_digest(&image);
    let run = run(&project, &["verify", image.to_str().unwrap()], &[]);
    assert_refused(
        &project,
        &run,
        &Tree::of(&project.path().join("images")),
        0,
        &[&format!(
            "layer `{digest}` unpacks to more than 33554432 bytes"
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// Wheels

/// A wheel `bombpkg-1.0` whose `bombpkg/data.bin` is `len` zeros, deflated, with a RECORD
/// that states its true hash and size (so only a bound on unpacking stops it).
fn bomb_wheel(path: &Path, len: u64) {
    assert_eq!(len % MIB, 0);
    use base64::Engine;
    let b64 = |digest: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
    let mut zeros = Sha256::new();
    let mib = vec![0u8; MIB as usize];
    for _ in 0..len / MIB {
        zeros.update(&mib);
    }
    let members: Vec<(&str, Vec<u8>)> = vec![
        ("bombpkg/__init__.py", b"".to_vec()),
        (
            "bombpkg-1.0.dist-info/METADATA",
            b"Metadata-Version: 2.1\nName: bombpkg\nVersion: 1.0\n".to_vec(),
        ),
        (
            "bombpkg-1.0.dist-info/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
    ];
    let mut record = String::new();
    for (name, bytes) in &members {
        record += &format!(
            "{name},sha256={},{}\n",
            b64(&Sha256::digest(bytes)),
            bytes.len()
        );
    }
    record += &format!("bombpkg/data.bin,sha256={},{len}\n", b64(&zeros.finalize()));
    record += "bombpkg-1.0.dist-info/RECORD,,\n";
    let mut zip = zip::ZipWriter::new(fs_err::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(9));
    for (name, bytes) in &members {
        zip.start_file(*name, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.start_file("bombpkg/data.bin", options).unwrap();
    std::io::copy(&mut std::io::repeat(0).take(len), &mut zip).unwrap();
    zip.start_file("bombpkg-1.0.dist-info/RECORD", options)
        .unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    zip.finish().unwrap();
}

#[test]
fn a_wheel_member_bomb_is_refused_naming_the_member() {
    let project = Project::new();
    let wheels = project.path().join("recipes/wheels");
    fs_err::create_dir_all(&wheels).unwrap();
    let wheel = "bombpkg-1.0-py3-none-any.whl";
    bomb_wheel(&wheels.join(wheel), 64 * MIB);
    // The image without the wheel first: the cache then holds everything but the wheel.
    let conda_only = tiny_recipe(pypi_channel(), "wheelbomb", &["python"]);
    project.write_recipe(&conda_only);
    run(&project, &["build", "recipes/image.toml"], &[]).success();
    let images = Tree::of(&project.path().join("images"));
    let cache = bytes_under(&project.cache);
    project.write_recipe(
        &(conda_only
            + "\n[pypi]\nno-index = true\nfind-links = [\"wheels\"]\ndependencies = [\"bombpkg\"]\n"),
    );
    // A ratio of 100 (deflate cannot pass 1032, so the default bound needs a wheel of
    // zeros larger than the test should write).
    let run = run(
        &project,
        &["build", "recipes/image.toml"],
        &[("IMGBUILD_MAX_UNPACK_RATIO", "100")],
    );
    // The wheel's copy in the cache at most.
    assert_refused(
        &project,
        &run,
        &images,
        cache + MIB,
        &[
            &format!("`bombpkg/data.bin` in wheel `{wheel}` unpacks to more than"),
            "what is left of the 33554432 bytes all members together may hold",
            "IMGBUILD_MAX_UNPACK_RATIO",
        ],
    );
}
