//! The local package index of `support::pypi` against real clients: pip downloads through
//! it as HTML and as JSON, with and without PEP 658 metadata, and its bodies carry the hashes
//! the files really have.

use std::io::Read;
use std::path::Path;
use std::process::Command;

use crate::{
    common::venv_tool,
    support::{
        channel::{fetch_wheel, sha256_file, sha256_hex},
        pypi::{
            DATEUTIL_2_9_0_POST0, SIMPLE_JSON, SIX_1_16_0, SimpleIndex, pinned_dists, write_sdist,
        },
        test_cache_dir,
    },
};

const SIX_WHEEL: &str = SIX_1_16_0.file_name;
const SIX_REQUIRES_PYTHON: &str = ">=2.7, !=3.0.*, !=3.1.*, !=3.2.*";

/// `pip download --no-deps REQUIREMENT` from `index` into `dest`, with none of this machine's
/// pip settings (its `PIP_FIND_LINKS` would offer wheels from elsewhere) and no cache.
/// Returns pip's output.
#[track_caller]
fn pip_download(index: &SimpleIndex, requirement: &str, dest: &Path) -> String {
    pip(index, "download", requirement, dest)
}

/// `pip SUBCOMMAND` (`download` or `wheel`) as [`pip_download`] runs it.
#[track_caller]
fn pip(index: &SimpleIndex, subcommand: &str, requirement: &str, dest: &Path) -> String {
    let mut command = Command::new(venv_tool("python"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PIP_") {
            command.env_remove(key);
        }
    }
    let output = command
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env("NO_PROXY", "127.0.0.1")
        .env("no_proxy", "127.0.0.1")
        .args([
            "-m",
            "pip",
            subcommand,
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--index-url",
            &index.url(),
            requirement,
            if subcommand == "wheel" { "-w" } else { "-d" },
        ])
        .arg(dest)
        .output()
        .expect("running pip");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "pip {subcommand} {requirement} failed:\n{text}"
    );
    text
}

/// The content type the index answered `/simple/six/` with, the last time it was asked.
fn six_page_type(index: &SimpleIndex) -> String {
    index
        .log()
        .iter()
        .rev()
        .find(|r| r.path.starts_with("/simple/six"))
        .and_then(|r| r.content_type.clone())
        .expect("pip asked for six's page")
}

#[test]
fn pip_downloads_six_through_html_and_json_pages() {
    let dists = pinned_dists(&[SIX_1_16_0]).unwrap();
    for json in [false, true] {
        let index = SimpleIndex::builder()
            .dists(&dists)
            .json(json)
            .serve()
            .unwrap();
        let dest = tempfile::tempdir().unwrap();
        pip_download(&index, "six==1.16.0", dest.path());

        let got = dest.path().join(SIX_WHEEL);
        assert_eq!(sha256_file(&got).unwrap(), SIX_1_16_0.sha256);
        assert_eq!(index.downloads(SIX_WHEEL), 1, "{:#?}", index.log());
        // pip 22.3 and later take the metadata from the index (PEP 658) before the wheel.
        let metadata = format!("/files/{SIX_WHEEL}.metadata");
        assert_eq!(index.requests(&metadata), 1, "{:#?}", index.log());
        let page_type = six_page_type(&index);
        if json {
            assert_eq!(page_type, SIMPLE_JSON);
        } else {
            assert!(page_type.starts_with("text/html"), "{page_type}");
        }
    }
}

/// An index of six 1.16.0 that serves no PEP 658 metadata files.
fn six_index_without_metadata() -> SimpleIndex {
    let dists = pinned_dists(&[SIX_1_16_0]).unwrap();
    SimpleIndex::builder()
        .dists(&dists)
        .metadata(false)
        .serve()
        .unwrap()
}

#[test]
fn pip_reads_metadata_from_the_wheel_when_the_index_serves_none() {
    let index = six_index_without_metadata();
    let dest = tempfile::tempdir().unwrap();
    pip_download(&index, "six==1.16.0", dest.path());
    assert_eq!(
        sha256_file(&dest.path().join(SIX_WHEEL)).unwrap(),
        SIX_1_16_0.sha256
    );
    assert_eq!(index.downloads(SIX_WHEEL), 1);
    assert_eq!(index.requests(&format!("/files/{SIX_WHEEL}.metadata")), 0);
}

#[test]
fn pip_builds_a_wheel_of_the_sdist_only_project() {
    let dir = tempfile::tempdir().unwrap();
    let sdist = write_sdist(dir.path(), "sdist-only", "1.0").unwrap();
    assert_eq!(sdist.file_name().unwrap(), "sdist_only-1.0.tar.gz");
    let again = tempfile::tempdir().unwrap();
    assert_eq!(
        sha256_file(&write_sdist(again.path(), "sdist-only", "1.0").unwrap()).unwrap(),
        sha256_file(&sdist).unwrap(),
        "an sdist is the same bytes every time"
    );
    let index = SimpleIndex::builder()
        .dist(&sdist, "sdist-only")
        .serve()
        .unwrap();
    let dest = tempfile::tempdir().unwrap();
    // Build isolation stays on: the sdist's in-tree backend requires nothing from the index.
    pip(&index, "wheel", "sdist_only==1.0", dest.path());
    let wheel = dest.path().join("sdist_only-1.0-py3-none-any.whl");
    assert!(wheel.is_file());
    let metadata = String::from_utf8(wheel_metadata(&wheel, "sdist_only-1.0.dist-info")).unwrap();
    assert!(
        metadata.contains("Name: sdist-only\nVersion: 1.0\n"),
        "{metadata}"
    );
    assert_eq!(index.downloads("sdist_only-1.0.tar.gz"), 1);
}

/// `METADATA` of the wheel at `path`.
fn wheel_metadata(path: &Path, dist_info: &str) -> Vec<u8> {
    let mut zip = zip::ZipArchive::new(fs_err::File::open(path).unwrap()).unwrap();
    let mut bytes = Vec::new();
    zip.by_name(&format!("{dist_info}/METADATA"))
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    bytes
}

#[test]
fn the_pages_carry_the_files_hashes_and_their_metadata() {
    let cache = test_cache_dir();
    let six = fetch_wheel(&cache, &SIX_1_16_0).unwrap();
    let dateutil = fetch_wheel(&cache, &DATEUTIL_2_9_0_POST0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sdist = write_sdist(dir.path(), "sdist-only", "1.0").unwrap();
    let index = SimpleIndex::builder()
        .dist(&six, "six")
        .dist(&dateutil, "python-dateutil")
        .dist(&sdist, "sdist-only")
        .serve()
        .unwrap();

    // The project list, both ways, with and without the trailing slash.
    for path in ["/simple/", "/simple"] {
        let html = index.get(path, None).unwrap();
        assert_eq!(html.status, 200);
        for project in ["six", "python-dateutil", "sdist-only"] {
            assert!(
                html.text()
                    .contains(&format!("href=\"/simple/{project}/\"")),
                "{}",
                html.text()
            );
        }
        let json = index.get(path, Some(SIMPLE_JSON)).unwrap();
        assert_eq!(json.header("content-type"), Some(SIMPLE_JSON));
        let names: Vec<_> = json.json().unwrap()["projects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["python-dateutil", "sdist-only", "six"]);
    }

    // The metadata file is the wheel's METADATA, and both formats name its hash.
    let metadata_path = format!("/files/{SIX_WHEEL}.metadata");
    let metadata = index.get(&metadata_path, None).unwrap();
    assert_eq!(metadata.status, 200);
    assert_eq!(
        metadata.body,
        wheel_metadata(&six, "six-1.16.0.dist-info"),
        "the .metadata file is the wheel's METADATA"
    );
    let metadata_sha = sha256_hex(&metadata.body);

    let html = index.get("/simple/six/", Some("text/html")).unwrap();
    assert_eq!(html.status, 200);
    assert!(
        html.header("content-type")
            .unwrap()
            .starts_with("text/html")
    );
    let text = html.text();
    for needle in [
        format!(
            "href=\"../../files/{SIX_WHEEL}#sha256={}\"",
            SIX_1_16_0.sha256
        ),
        "data-requires-python=\"&gt;=2.7, !=3.0.*, !=3.1.*, !=3.2.*\"".to_string(),
        format!("data-core-metadata=\"sha256={metadata_sha}\""),
        format!("data-dist-info-metadata=\"sha256={metadata_sha}\""),
    ] {
        assert!(text.contains(&needle), "{needle} missing from:\n{text}");
    }

    let json = index.get("/simple/six/", Some(SIMPLE_JSON)).unwrap();
    assert_eq!(json.header("content-type"), Some(SIMPLE_JSON));
    let page = json.json().unwrap();
    assert_eq!(page["meta"]["api-version"], "1.1");
    assert_eq!(page["name"], "six");
    let file = &page["files"][0];
    assert_eq!(file["filename"], SIX_WHEEL);
    assert_eq!(file["url"], index.file_url(SIX_WHEEL));
    assert_eq!(file["hashes"]["sha256"], SIX_1_16_0.sha256);
    assert_eq!(file["requires-python"], SIX_REQUIRES_PYTHON);
    assert_eq!(file["core-metadata"]["sha256"], metadata_sha.as_str());

    // The file itself, whole.
    let wheel = index.get(&format!("/files/{SIX_WHEEL}"), None).unwrap();
    assert_eq!(wheel.status, 200);
    assert_eq!(
        wheel.header("content-length"),
        Some(wheel.body.len().to_string().as_str())
    );
    assert_eq!(sha256_hex(&wheel.body), SIX_1_16_0.sha256);
    assert_eq!(index.downloads(SIX_WHEEL), 1);
    // Clients escape characters such as the `+` of a local version; the index decodes them.
    let escaped = SIX_WHEEL.replace(".whl", "%2Ewhl");
    let wheel = index.get(&format!("/files/{escaped}"), None).unwrap();
    assert_eq!(sha256_hex(&wheel.body), SIX_1_16_0.sha256);
    assert_eq!(index.downloads(SIX_WHEEL), 2);

    // dateutil's page: a name of two words, a post release.
    let json = index
        .get("/simple/python-dateutil/", Some(SIMPLE_JSON))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(json["versions"], serde_json::json!(["2.9.0.post0"]));
    assert_eq!(
        json["files"][0]["hashes"]["sha256"],
        DATEUTIL_2_9_0_POST0.sha256
    );

    // The sdist: Requires-Python from its PKG-INFO, no metadata file.
    let json = index
        .get("/simple/sdist-only/", Some(SIMPLE_JSON))
        .unwrap()
        .json()
        .unwrap();
    let file = &json["files"][0];
    assert_eq!(file["filename"], "sdist_only-1.0.tar.gz");
    assert_eq!(file["hashes"]["sha256"], sha256_file(&sdist).unwrap());
    assert_eq!(file["requires-python"], ">=3.7");
    assert_eq!(file["core-metadata"], false);
    assert_eq!(
        index
            .get("/files/sdist_only-1.0.tar.gz.metadata", None)
            .unwrap()
            .status,
        404
    );

    // Names that are not normalized are sent to the normalized page; unknown ones are not found.
    let moved = index.get("/simple/Python_Dateutil/", None).unwrap();
    assert_eq!(moved.status, 301);
    assert_eq!(moved.header("location"), Some("/simple/python-dateutil/"));
    assert_eq!(index.get("/simple/nothing/", None).unwrap().status, 404);
    assert_eq!(index.get("/files/nothing.whl", None).unwrap().status, 404);
    assert_eq!(index.requests("/simple/six/"), 2);
}

#[test]
fn without_metadata_the_pages_offer_none() {
    let index = six_index_without_metadata();
    let html = index.get("/simple/six/", None).unwrap().text();
    assert!(html.contains(&format!("#sha256={}", SIX_1_16_0.sha256)));
    assert!(!html.contains("metadata"), "{html}");
    let json = index
        .get("/simple/six/", Some(SIMPLE_JSON))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(json["files"][0]["core-metadata"], false);
    let path = format!("/files/{SIX_WHEEL}.metadata");
    assert_eq!(index.get(&path, None).unwrap().status, 404);
}
