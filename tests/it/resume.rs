//! Resumable package downloads, against a real HTTP server on 127.0.0.1
//! ([`RangeServer`]): a transfer dropped half way is continued with `Range`, a partial file
//! left by a killed run is continued by the next build, a partial file with wrong bytes is
//! deleted and downloaded again, a server without range support still works, and an archive
//! that does not match its record fails naming it.

use std::path::{Path, PathBuf};

use crate::{
    common::{Project, Run},
    servers::range::{Drops, Logged, RangeServer, Ranges},
    support::{
        hostile::{Channel, Package, Raw, sha256_hex},
        shared_channel,
    },
};

const RECIPE: &str = "[image]\nname = \"remote\"\n[conda]\nchannels = [\"testchan\"]\ndependencies = [\"hello 1.0\"]\n";
const HELLO: &str = "hello-1.0-h0_0.tar.bz2";

/// A directory to serve with the shared test channel as `testchan/`.
fn served_shared_channel() -> tempfile::TempDir {
    let served = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(shared_channel(), served.path().join("testchan")).unwrap();
    served
}

fn hello_archive() -> Vec<u8> {
    fs_err::read(shared_channel().join("linux-64").join(HELLO)).unwrap()
}

fn build(project: &Project, server: &RangeServer) -> Run {
    project.write_recipe(RECIPE);
    project.run_with(
        &["build", "recipes/image.toml"],
        &[("IMGBUILD_CHANNEL_ALIAS", server.url.as_str())],
        None,
    )
}

/// The digest of the same recipe built from the same server by a project of its own,
/// downloading every archive whole in one go (the server drops only first requests).
fn clean_digest(server: &RangeServer) -> String {
    build(&Project::new(), server).success().digest()
}

fn downloads(project: &Project) -> PathBuf {
    project.cache.join("downloads")
}

/// Nothing is left in `<cache>/downloads` after a build (no partial file, no archive), and
/// the image is the one a clean download makes.
#[track_caller]
fn assert_finished_cleanly(project: &Project, run: &crate::common::Run, server: &RangeServer) {
    let left: Vec<_> = fs_err::read_dir(downloads(project))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in downloads: {left:?}");
    assert_eq!(run.digest(), clean_digest(server), "the same image");
}

fn write_partial(project: &Project, sha256: &str, bytes: &[u8]) -> PathBuf {
    fs_err::create_dir_all(downloads(project)).unwrap();
    let path = downloads(project).join(format!("{sha256}.partial"));
    fs_err::write(&path, bytes).unwrap();
    path
}

fn etag(bytes: &[u8]) -> String {
    format!("\"{}\"", &sha256_hex(bytes)[..16])
}

fn total_sent(requests: &[Logged]) -> usize {
    requests.iter().map(|r| r.sent).sum()
}

#[test]
fn a_download_dropped_mid_body_resumes_with_range() {
    let served = served_shared_channel();
    let server = RangeServer::serve(served.path().to_path_buf(), Ranges::Honour, Drops::First);
    let project = Project::new();
    let run = build(&project, &server).success();

    let archive = hello_archive();
    let (len, half) = (archive.len(), archive.len() / 2);
    let requests = server.requests_for(HELLO);
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(requests[0].range, None);
    assert!(requests[0].dropped, "{requests:#?}");
    assert_eq!(requests[0].sent, half);
    assert_eq!(
        requests[1].range.as_deref(),
        Some(&*format!("bytes={half}-"))
    );
    assert_eq!(
        requests[1].if_range.as_deref(),
        Some(&*etag(&archive)),
        "If-Range carries the ETag of the first response"
    );
    assert_eq!(requests[1].status, 206);
    assert_eq!(total_sent(&requests), len, "each byte was sent once");
    assert!(total_sent(&requests) < 2 * len);

    // Every archive (hello's dependencies too) was dropped once and then resumed.
    let mut archives = server.requests_for(".tar.bz2");
    archives.extend(server.requests_for(".conda"));
    let paths: std::collections::BTreeSet<_> = archives.iter().map(|r| r.path.clone()).collect();
    assert!(paths.len() > 1, "{archives:#?}");
    for path in paths {
        let of: Vec<_> = archives.iter().filter(|r| r.path == path).collect();
        assert_eq!(of.len(), 2, "{of:#?}");
        assert!(of[0].dropped && of[1].status == 206, "{of:#?}");
    }
    assert_finished_cleanly(&project, &run, &server);
}

#[test]
fn a_partial_file_left_by_a_killed_run_is_continued() {
    let served = served_shared_channel();
    let server = RangeServer::serve(served.path().to_path_buf(), Ranges::Honour, Drops::Never);
    let archive = hello_archive();
    let half = archive.len() / 2;
    let project = Project::new();
    // What a build killed half way through the download leaves behind.
    write_partial(&project, &sha256_hex(&archive), &archive[..half]);

    let run = build(&project, &server).success();

    let requests = server.requests_for(HELLO);
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(
        requests[0].range.as_deref(),
        Some(&*format!("bytes={half}-"))
    );
    // A new process has no validator from the first response, and the sha256 guards it.
    assert_eq!(requests[0].if_range, None);
    assert_eq!(requests[0].status, 206);
    assert_eq!(requests[0].sent, archive.len() - half);
    assert_finished_cleanly(&project, &run, &server);
}

#[test]
fn a_partial_file_with_wrong_bytes_is_deleted_and_downloaded_again() {
    let served = served_shared_channel();
    let server = RangeServer::serve(served.path().to_path_buf(), Ranges::Honour, Drops::Never);
    let archive = hello_archive();
    let half = archive.len() / 2;
    let project = Project::new();
    write_partial(&project, &sha256_hex(&archive), &vec![b'x'; half]);

    let run = build(&project, &server).success();

    // Resumed first (nothing shows the bytes are wrong until the end), then, the sha256 not
    // matching, the partial file deleted and the archive fetched whole.
    let requests = server.requests_for(HELLO);
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(
        requests[0].range.as_deref(),
        Some(&*format!("bytes={half}-"))
    );
    assert_eq!(requests[0].status, 206);
    assert_eq!(requests[1].range, None);
    assert_eq!(requests[1].status, 200);
    assert_eq!(requests[1].sent, archive.len());
    assert_finished_cleanly(&project, &run, &server);
}

#[test]
fn a_server_ignoring_range_still_works() {
    let served = served_shared_channel();
    let server = RangeServer::serve(served.path().to_path_buf(), Ranges::Ignore, Drops::First);
    let project = Project::new();
    let run = build(&project, &server).success();

    let archive = hello_archive();
    let requests = server.requests_for(HELLO);
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert!(requests[0].dropped);
    let half = archive.len() / 2;
    assert_eq!(
        requests[1].range.as_deref(),
        Some(&*format!("bytes={half}-"))
    );
    // The whole file again, written from the first byte.
    assert_eq!(requests[1].status, 200);
    assert_eq!(requests[1].sent, archive.len());
    assert_finished_cleanly(&project, &run, &server);
}

/// A fresh download that does not match the record is the server's file: no retry, the
/// partial file deleted, and an error naming the package, the URL and both sha256s.
#[test]
fn an_archive_not_matching_its_record_fails_naming_package_and_url() {
    let served = tempfile::tempdir().unwrap();
    let channel_dir = served.path().join("testchan");
    let mut channel = Channel::new(&channel_dir);
    let package = Package::new("bad", &[], false, vec![Raw::file("share/bad.txt", "bad\n")]);
    let bytes = package.tar_bz2();
    let index = crate::support::hostile::index_json("bad", &[], false);
    let recorded = sha256_hex(b"not the archive");
    channel.add("bad-1.0-h0_0.tar.bz2", &index, &bytes, |r| {
        r["sha256"] = recorded.clone().into();
    });
    channel.finish();
    let server = RangeServer::serve(served.path().to_path_buf(), Ranges::Honour, Drops::Never);
    let project = Project::new();
    project.write_recipe(&RECIPE.replace("hello 1.0", "bad"));
    let run = project.run_with(
        &["build", "recipes/image.toml"],
        &[("IMGBUILD_CHANNEL_ALIAS", server.url.as_str())],
        None,
    );

    let url = format!("{}testchan/linux-64/bad-1.0-h0_0.tar.bz2", server.url);
    run.assert_failure_naming(
        1,
        &[
            "bad-1.0-h0_0",
            &url,
            &sha256_hex(&bytes),
            &recorded,
            "partial download was deleted",
        ],
    );
    project.assert_no_image();
    assert_eq!(server.requests_for("bad-1.0-h0_0.tar.bz2").len(), 1);
    assert!(!partial_exists(&downloads(&project), &recorded));
}

fn partial_exists(dir: &Path, sha256: &str) -> bool {
    dir.join(format!("{sha256}.partial")).exists()
}

/// A real kill: the build is killed while its download hangs half way (the server sends half
/// the body, then nothing), and the next build, from a server that does not stall, asks only
/// for the rest. The kernel released the killed build's lock on the partial file.
#[test]
fn a_build_killed_mid_download_is_continued_by_the_next_build() {
    let served = served_shared_channel();
    let stalling = RangeServer::serve(
        served.path().to_path_buf(),
        Ranges::Honour,
        Drops::StallFirst,
    );
    let project = Project::new();
    project.write_recipe(RECIPE);
    let archive = hello_archive();
    let half = archive.len() / 2;
    let partial = downloads(&project).join(format!("{}.partial", sha256_hex(&archive)));
    let mut child = std::process::Command::new(crate::support::imgbuild_bin())
        .args(["build", "recipes/image.toml", "--quiet"])
        .current_dir(project.path())
        .env("IMGBUILD_CACHE_DIR", &project.cache)
        .env("IMGBUILD_CHANNEL_ALIAS", &stalling.url)
        .env_remove("SOURCE_DATE_EPOCH")
        .env_remove("IMGBUILD_JOBS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The half the server sent reaches the disk, then the download hangs for good.
    while fs_err::metadata(&partial).map_or(0, |m| m.len()) < half as u64 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build ended before it could be killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(fs_err::read(&partial).unwrap(), archive[..half]);
    drop(stalling);

    let server = RangeServer::serve(served.path().to_path_buf(), Ranges::Honour, Drops::Never);
    let run = build(&project, &server).success();
    let requests = server.requests_for(HELLO);
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(
        requests[0].range.as_deref(),
        Some(&*format!("bytes={half}-"))
    );
    assert_eq!(requests[0].status, 206);
    assert_eq!(requests[0].sent, archive.len() - half);
    assert_finished_cleanly(&project, &run, &server);
}
