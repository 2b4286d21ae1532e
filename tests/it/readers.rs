//! Every input surface reads through the project's confined and bounded readers (README,
//! "Input surfaces"). This test reads `src/` and fails on a raw read anywhere else: a file
//! opened or read whole, a directory listed, a link read, an HTTP body taken, an archive
//! decompressed. The readers are the files of [`READERS`]; every other raw read is a row of
//! [`EXCEPTIONS`], with its count and why it needs no reader. So a new reader that skips the
//! helpers fails here until it uses them or is listed with its reason, and a listed read
//! that is gone fails too, so the list stays exact.

use std::{collections::BTreeMap, path::Path};

/// What counts as a raw read, as it stands in code with its white space taken out.
const RAW_READS: &[&str] = &[
    "fs_err::read(",
    "fs::read(",
    "read_to_string(",
    "read_to_end(",
    "File::open(",
    "OpenOptions::new(",
    "read_dir(",
    "read_link(",
    ".chunk()",
    "bytes_stream(",
    ".bytes().await",
    ".text().await",
    ".json().await",
    "Decoder::new(",
    "ZipArchive::new(",
    "decode_all(",
];

/// The readers: the files whose raw reads are the confined and bounded helpers themselves.
const READERS: &[(&str, &str)] = &[
    (
        "crates/imgbuild-model/src/fs.rs",
        "read_input, open_input, read_stream, open_input_beneath: regular files opened without blocking, bounded, beneath a root without links",
    ),
    (
        "crates/imgbuild-model/src/fs/context.rs",
        "BuildContext: every read beneath the build context's directory handle (cap-std, openat2 RESOLVE_BENEATH)",
    ),
    (
        "crates/imgbuild-model/src/http/body.rs",
        "read_bounded: an HTTP body up to a limit, Content-Length checked first",
    ),
    (
        "crates/imgbuild-model/src/http/repodata.rs",
        "RepodataBound: a channel answer counted as it decompresses, before rattler sees it",
    ),
    (
        "crates/imgbuild-model/src/compression/bounded.rs",
        "Bounded, read_to_end_bounded: what a decoder yields, up to a bound",
    ),
    (
        "crates/imgbuild-model/src/download.rs",
        "download_resumable: exactly the expected size (or the unsized bound), sha256 while it streams",
    ),
    (
        "crates/imgbuild-oci/src/registry/client.rs",
        "read_body, download: registry answers to their limits, blobs to their descriptors",
    ),
    (
        "crates/imgbuild-oci/src/oci/blobs.rs",
        "BlobStore: layout files beneath the layout, sizes and digests of descriptors",
    ),
    (
        "crates/imgbuild-oci/src/oci/mod.rs",
        "layer_reader: a layer blob decompressed under the ratio bound",
    ),
    (
        "crates/imgbuild-oci/src/layers/cache.rs",
        "LayerCache: cache files opened without links as regular files, key files bounded",
    ),
    (
        "crates/imgbuild-oci/src/layers/cache/seal.rs",
        "SealKey: the machine key, a regular 32-byte file of this user",
    ),
    (
        "crates/imgbuild-oci/src/layers/cache/verify.rs",
        "verify::plain: a cached blob decompressed to at most the expected tar",
    ),
    (
        "crates/imgbuild-install/src/install/scan.rs",
        "the archive scan: every member read to its end under the ratio bound",
    ),
];

/// Raw reads outside the readers: (file, pattern, count, why no reader is needed).
const EXCEPTIONS: &[(&str, &str, usize, &str)] = &[
    (
        "src/smoke/sandbox.rs",
        "OpenOptions::new(",
        1,
        "cap-std OpenOptions: an empty mount point created beneath the private root, never read",
    ),
    (
        "src/smoke/sandbox.rs",
        "read_dir(",
        2,
        "this host's /dev and driver directory listed by name, no content read",
    ),
    (
        "src/smoke/unpack.rs",
        "OpenOptions::new(",
        1,
        "cap-std OpenOptions: a file written beneath the private root, write-only",
    ),
    (
        "src/smoke/unpack.rs",
        "read_dir(",
        1,
        "cap-std read_dir of the private root, for an opaque whiteout",
    ),
    (
        "src/build/files_layer.rs",
        "read_dir(",
        1,
        "BuildContext::read_dir, beneath the context handle",
    ),
    (
        "src/models/source.rs",
        "read_dir(",
        1,
        "BuildContext::read_dir, beneath the recipe directory's handle",
    ),
    (
        "src/models/beside.rs",
        "read_dir(",
        1,
        "BuildContext::read_dir of the models beside a layout, links not followed",
    ),
    (
        "src/build/files_layer.rs",
        "read_link(",
        1,
        "BuildContext::read_link, beneath the context handle",
    ),
    (
        "src/build/runnable.rs",
        "read_link(",
        1,
        "the entrypoint check reads link targets of this build's own staging tree to follow them within the image; files are opened with open_input_beneath",
    ),
    (
        "crates/imgbuild-model/src/cuda/fatbin.rs",
        "File::open(",
        1,
        "ELF headers of a library in the staged prefix, which the install plan has checked; only header ranges are read, and the payload of a PTX entry whose header holds no ISA, bounded (cuda::ptx::MAX_PTX)",
    ),
    (
        "crates/imgbuild-install/src/install/confine.rs",
        "read_link(",
        2,
        "the confinement check reads the link targets of extracted copies to judge them; it never follows one",
    ),
    (
        "crates/imgbuild-install/src/install/fetch.rs",
        "File::open(",
        3,
        "package archives in the cache, opened after their size is checked against the record and read under install::scan's bound",
    ),
    (
        "crates/imgbuild-install/src/install/mod.rs",
        "read_to_string(",
        1,
        "conda-meta records rattler has just written into the staging prefix, not a stranger's file",
    ),
    (
        "crates/imgbuild-oci/src/layers/blob_file.rs",
        "OpenOptions::new(",
        2,
        "creates the layer blob files a build writes; reads nothing",
    ),
    (
        "crates/imgbuild-oci/src/layers/plan.rs",
        "read_dir(",
        1,
        "lists the staged prefix (names only) to plan its layers",
    ),
    (
        "crates/imgbuild-oci/src/layers/tar.rs",
        "File::open(",
        1,
        "the tar writer reads the staged prefix, confined by the install plan; sizes are the stat's",
    ),
    (
        "crates/imgbuild-oci/src/layers/tar.rs",
        "read_link(",
        1,
        "link targets of the staged prefix, written into the tar as they are, never followed",
    ),
    (
        "crates/imgbuild-oci/src/oci/layout.rs",
        "OpenOptions::new(",
        1,
        "creates the output layout's lock file",
    ),
    (
        "crates/imgbuild-oci/src/oci/layout.rs",
        "read_dir(",
        2,
        "lists the output layout's blobs (names only) to find the unreferenced ones",
    ),
    (
        "crates/imgbuild-install/src/pypi/index.rs",
        "read_dir(",
        1,
        "lists a find-links directory (names only); only regular files become candidates, opened by fs::open_input",
    ),
    (
        "crates/imgbuild-install/src/pypi/install.rs",
        "File::open(",
        1,
        "a wheel in the cache whose sha256 was checked; its members are read under the ratio bound",
    ),
    (
        "crates/imgbuild-install/src/pypi/install.rs",
        "ZipArchive::new(",
        1,
        "the same wheel's central directory, read by the zip crate",
    ),
    (
        "crates/imgbuild-install/src/pypi/range_metadata.rs",
        ".chunk()",
        1,
        "range answers read only as far as needed, each at most LIMIT (64 MiB)",
    ),
    (
        "crates/imgbuild-install/src/pypi/range_metadata.rs",
        "Decoder::new(",
        1,
        "a METADATA member inflated under the same LIMIT",
    ),
    (
        "crates/imgbuild-install/src/pypi/resolve.rs",
        "File::open(",
        1,
        "a wheel in the cache, for its METADATA, read under a bound",
    ),
    (
        "crates/imgbuild-install/src/pypi/resolve.rs",
        "ZipArchive::new(",
        1,
        "the same wheel's central directory, read by the zip crate",
    ),
    (
        "crates/imgbuild-oci/src/registry/pull.rs",
        "fs_err::read(",
        1,
        "a blob of the pull cache, which only RepositoryClient::download writes after its size and digest checks",
    ),
    (
        "crates/imgbuild-oci/src/registry/push.rs",
        "read_to_end(",
        1,
        "a blob of the layout being pushed, opened by fs::open_input at most its descriptor's size and read to that size, its digest checked",
    ),
    (
        "crates/imgbuild-oci/src/sign/lookaside.rs",
        "read_dir(",
        1,
        "lists the lookaside directory (names only) for the next signature-N",
    ),
    (
        "src/smoke/embed.rs",
        "read_dir(",
        1,
        "lists the directory of the imgbuild binary (names only) for imgbuild-smoke-*",
    ),
    (
        "crates/imgbuild-model/src/staging.rs",
        "read_dir(",
        1,
        "lists imgbuild's own staging root (names only) to remove stale trees",
    ),
    (
        "crates/imgbuild-oci/src/layers/cache/listing.rs",
        "read_dir(",
        1,
        "lists the layer cache's own directories (names and lstat only) for `cache prune`; key files are read by the layer cache's open_regular, without links and bounded",
    ),
    (
        "src/cache_admin/du.rs",
        "read_dir(",
        1,
        "walks the cache directory for `cache du`: names and lstat only, no link followed, no file opened",
    ),
];

/// Raw reads by (file, pattern), counted in code without comments, strings and tests;
/// each file named from `root`, the checkout.
fn raw_reads(root: &Path, src: &Path) -> BTreeMap<(String, String), usize> {
    let mut found = BTreeMap::new();
    for entry in walkdir::WalkDir::new(src).sort_by_file_name() {
        let entry = entry.unwrap();
        if entry.path().extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = fs_err::read_to_string(entry.path()).unwrap();
        let code: String = crate::layering::code_of(&text)
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let file = entry
            .path()
            .strip_prefix(root)
            .unwrap()
            .display()
            .to_string();
        for pattern in RAW_READS {
            let count = code.matches(pattern).count();
            if count > 0 {
                found.insert((file.clone(), pattern.to_string()), count);
            }
        }
    }
    found
}

#[test]
fn every_raw_read_is_a_reader_or_a_listed_exception() {
    let found: BTreeMap<(String, String), usize> = crate::layering::library_sources()
        .iter()
        .flat_map(|src| raw_reads(Path::new(env!("CARGO_MANIFEST_DIR")), src))
        .collect();
    let listed: BTreeMap<(String, String), usize> = EXCEPTIONS
        .iter()
        .map(|(file, pattern, count, _)| ((file.to_string(), pattern.to_string()), *count))
        .collect();
    let mut problems = Vec::new();
    for ((file, pattern), count) in &found {
        if READERS.iter().any(|(reader, _)| reader == file) {
            continue;
        }
        match listed.get(&(file.clone(), pattern.clone())) {
            Some(allowed) if allowed == count => {}
            Some(allowed) => problems.push(format!(
                "{file}: `{pattern}` {count} times, listed {allowed}: go through a reader, or update EXCEPTIONS with the reason"
            )),
            None => problems.push(format!(
                "{file}: `{pattern}` {count} times outside the readers: use one (README, \"Input surfaces\"), or list it in EXCEPTIONS with the reason"
            )),
        }
    }
    for (file, pattern) in listed.keys() {
        if !found.contains_key(&(file.clone(), pattern.clone())) {
            problems.push(format!(
                "{file}: `{pattern}` is listed but gone: drop its row"
            ));
        }
    }
    assert!(problems.is_empty(), "raw reads:\n{}", problems.join("\n"));
}

/// The scan sees a raw read through white space and line breaks, and not in a comment,
/// a string or a test module.
#[test]
fn the_scan_sees_reads_across_lines_and_not_in_comments_or_tests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs_err::create_dir_all(&src).unwrap();
    fs_err::write(
        src.join("a.rs"),
        "fn f(r: R) { r\n    .bytes()\n    .await; }\n// fs_err::read(\"x\")\nfn g() { let _ = \"File::open(\"; }\n#[cfg(test)]\nmod tests { fn t() { fs_err::read(\"y\"); } }\n",
    )
    .unwrap();
    let found = raw_reads(dir.path(), &src);
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec![(("src/a.rs".to_string(), ".bytes().await".to_string()), 1)]
    );
}
