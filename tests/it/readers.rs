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
const READERS: &[(&str, &str)] = &[];

/// Raw reads outside the readers: (file, pattern, count, why no reader is needed).
const EXCEPTIONS: &[(&str, &str, usize, &str)] = &[];

/// Raw reads by (file, pattern), counted in code without comments, strings and tests.
fn raw_reads(src: &Path) -> BTreeMap<(String, String), usize> {
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
            .strip_prefix(src.parent().unwrap())
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = raw_reads(&src);
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
            problems.push(format!("{file}: `{pattern}` is listed but gone: drop its row"));
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
    let found = raw_reads(&src);
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec![(("src/a.rs".to_string(), ".bytes().await".to_string()), 1)]
    );
}
