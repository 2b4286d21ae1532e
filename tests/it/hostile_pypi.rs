//! The wheel and PyPI index surface (README, "Input surfaces"): an index, its pages, the
//! metadata it serves and the wheels are a stranger's. Each case first builds a good image
//! from a scripted index on 127.0.0.1, then turns the index hostile and builds again
//! without the lock (so the pages are read anew), into another output. The refusal must name
//! what was refused and exit 1 without waiting past a bound, no host file may enter the
//! image, and the good image stays as it was.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use crate::{
    common::{Project, Run, run_with_deadline},
    hostile_inputs::{recipe, sources, write_wheel},
    servers::scripted::{Reply, Request, Scripted},
    trust::{Canary, Tree, bytes_under},
};

const WHEEL: &str = "demo-1.0-py3-none-any.whl";

/// A scripted index serving the good `demo` wheel until [`Index::turn`], then asking `evil`
/// first for every request.
struct Index {
    server: Scripted,
    hostile: Arc<AtomicBool>,
}

type Evil = dyn Fn(&Request, &str) -> Option<Reply> + Send + Sync;

impl Index {
    fn start(evil: impl Fn(&Request, &str) -> Option<Reply> + Send + Sync + 'static) -> Index {
        let wheel = fs_err::read(sources().root.join("wheels").join(WHEEL)).unwrap();
        let hostile = Arc::new(AtomicBool::new(false));
        let evil: Box<Evil> = Box::new(evil);
        let server = {
            let hostile = hostile.clone();
            Scripted::start("127.0.0.1", move |request| {
                let page = good_page(&wheel);
                if hostile.load(Ordering::SeqCst)
                    && let Some(answer) = evil(request, &page)
                {
                    return answer;
                }
                match request.path() {
                    "/simple/demo/" | "/simple/demo" => ok("text/html", page),
                    path if path == format!("/files/{WHEEL}") => {
                        ok("application/octet-stream", wheel.clone())
                    }
                    _ => Reply::bytes(404, "not found"),
                }
            })
        };
        Index { server, hostile }
    }

    fn turn(&self) {
        self.hostile.store(true, Ordering::SeqCst);
    }
}

fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
    Reply::bytes(200, body).header("Content-Type", content_type)
}

/// The project page linking the wheel by its sha256.
fn good_page(wheel: &[u8]) -> String {
    link_page(&format!("/files/{WHEEL}"), wheel)
}

fn link_page(href: &str, wheel: &[u8]) -> String {
    format!(
        "<html><body><a href=\"{href}#sha256={}\">{WHEEL}</a></body></html>\n",
        crate::support::hostile::sha256_hex(wheel)
    )
}

/// Where the recipe finds `demo`: the index's project pages, or one find-links page.
enum Source {
    Index,
    FindLinks,
}

/// A project whose recipe asks `demo` from `index`, built once (good) before the index turns.
fn built(index: &Index, source: Source) -> (Project, Tree) {
    let project = Project::new();
    let pypi = match source {
        Source::Index => format!("index-url = \"{}/simple\"", index.server.url()),
        Source::FindLinks => format!(
            "no-index = true\nfind-links = [\"{}/simple/demo/\"]",
            index.server.url()
        ),
    };
    let conda = recipe(&sources().url("chan")).replace("[\"good\"]", "[\"good\", \"python\"]");
    project.write_recipe(&format!(
        "{conda}\n[pypi]\n{pypi}\ndependencies = [\"demo\"]\n",
    ));
    project.build(&[]).success();
    let images = Tree::of(&project.path().join("images"));
    index.turn();
    fs_err::remove_file(project.lock_path()).unwrap();
    (project, images)
}

fn hostile_build(project: &Project, envs: &[(&str, &str)]) -> Run {
    let args = ["build", "recipes/image.toml", "-o", "images/hostile"];
    let mut command = project.command(&args);
    command.envs(envs.iter().copied());
    run_with_deadline(command, project, &args)
}

/// The hostile build fails naming `needles`, and nothing but the lock changed.
#[track_caller]
fn refused(project: &Project, images: &Tree, envs: &[(&str, &str)], needles: &[&str]) -> Run {
    let run = hostile_build(project, envs);
    run.assert_failure_naming(1, needles);
    assert!(!project.path().join("images/hostile").exists());
    assert_eq!(&Tree::of(&project.path().join("images")), images);
    run
}

fn page_path(request: &Request) -> bool {
    request.path().starts_with("/simple/demo")
}

fn wheel_path(request: &Request) -> bool {
    request.path() == format!("/files/{WHEEL}")
}

#[test]
fn an_endless_project_page_is_cut_off() {
    let index = Index::start(|r, _| page_path(r).then(|| Reply::endless(200, "")));
    let (project, images) = built(&index, Source::Index);
    refused(
        &project,
        &images,
        &[],
        &["/simple/demo", "goes on past 134217728 bytes"],
    );
}

#[test]
fn a_page_declaring_a_terabyte_is_refused_before_reading() {
    let index =
        Index::start(|r, _| page_path(r).then(|| Reply::bytes(200, "<html>").declaring(1 << 40)));
    let (project, images) = built(&index, Source::Index);
    refused(
        &project,
        &images,
        &[],
        &["/simple/demo", "is 1099511627776 bytes; at most"],
    );
}

#[test]
fn a_page_that_is_not_utf8_is_refused() {
    let index = Index::start(|r, page| {
        let mut body = page.as_bytes().to_vec();
        body.extend_from_slice(b"\xff\xfe");
        page_path(r).then(|| ok("text/html", body))
    });
    let (project, images) = built(&index, Source::Index);
    refused(&project, &images, &[], &["/simple/demo", "not UTF-8"]);
}

#[test]
fn deeply_nested_json_on_a_page_is_refused() {
    let index = Index::start(|r, _| {
        let depth = 100_000;
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        page_path(r).then(|| ok("application/vnd.pypi.simple.v1+json", body))
    });
    let (project, images) = built(&index, Source::Index);
    refused(&project, &images, &[], &["/simple/demo"]);
}

#[test]
fn an_endless_metadata_file_is_cut_off() {
    let index = Index::start(|r, page| {
        if page_path(r) {
            let page = page.replace("<a ", "<a data-dist-info-metadata=\"true\" ");
            return Some(ok("text/html", page));
        }
        r.path()
            .ends_with(".metadata")
            .then(|| Reply::endless(200, ""))
    });
    let (project, images) = built(&index, Source::Index);
    refused(
        &project,
        &images,
        &[],
        &[WHEEL, "goes on past 67108864 bytes"],
    );
}

/// A `Requires-Dist` pep508_rs 0.9.2 panics on (a name ending in `-` before more text) and
/// one with `${…}` it would fill in from the builder's environment: refused, naming the
/// wheel and the requirement.
#[test]
fn requires_dist_that_pep508_rs_mishandles_is_refused() {
    for (requires, reason) in [
        ("torch-- >=1", "must end with a letter or a digit"),
        ("evil @ https://127.0.0.1/${HOME}/e.whl", "is not expanded"),
    ] {
        let metadata =
            format!("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: {requires}\n");
        let index = Index::start(move |r, page| {
            if page_path(r) {
                let page = page.replace("<a ", "<a data-dist-info-metadata=\"true\" ");
                return Some(ok("text/html", page));
            }
            r.path()
                .ends_with(".metadata")
                .then(|| ok("text/plain", metadata.clone()))
        });
        let (project, images) = built(&index, Source::Index);
        let run = refused(&project, &images, &[], &[WHEEL, requires, reason]);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

/// A wheel pinned by its sha256 alone has no size to hold the download to: the bound on
/// downloads of unknown size stops it (lowered here from 16 GiB).
#[test]
fn an_endless_wheel_stops_at_the_bound_on_unsized_downloads() {
    let index = Index::start(|r, _| wheel_path(r).then(|| Reply::endless(200, "")));
    let (project, images) = built(&index, Source::Index);
    // The cached wheel from the good build would be taken instead of the endless one.
    fs_err::remove_dir_all(&project.cache).unwrap();
    let env = [("IMGBUILD_MAX_UNSIZED_DOWNLOAD", "1048576")];
    refused(
        &project,
        &images,
        &env,
        &[WHEEL, "sent more than 1048576 bytes"],
    );
    assert!(
        bytes_under(&project.cache) < 4 << 20,
        "the cache grew to {} bytes",
        bytes_under(&project.cache)
    );
}

#[test]
fn a_wheel_shorter_than_its_content_length_is_refused() {
    let index =
        Index::start(|r, _| wheel_path(r).then(|| Reply::bytes(200, "PK").declaring(10 << 20)));
    let (project, images) = built(&index, Source::Index);
    fs_err::remove_dir_all(&project.cache).unwrap();
    refused(&project, &images, &[], &[WHEEL]);
}

#[test]
fn a_wheel_not_matching_the_pages_sha256_is_refused() {
    let evil = fs_err::read(sources().root.join("wheels-evil").join(WHEEL)).unwrap();
    let index = Index::start(move |r, _| {
        wheel_path(r).then(|| ok("application/octet-stream", evil.clone()))
    });
    let (project, images) = built(&index, Source::Index);
    fs_err::remove_dir_all(&project.cache).unwrap();
    refused(&project, &images, &[], &[WHEEL, "sha256"]);
}

/// A page on an HTTP index that links a wheel on the build host: a private wheel in another
/// build's cache, say. Nothing on the host may be read on a remote page's say-so.
#[test]
fn a_remote_page_linking_a_host_file_is_refused() {
    let canary = Canary::new();
    write_wheel(canary.dir(), &canary.secret);
    let host_wheel = canary.dir().join(WHEEL);
    let href = url::Url::from_file_path(&host_wheel).unwrap().to_string();
    let bytes = fs_err::read(&host_wheel).unwrap();
    let index =
        Index::start(move |r, _| page_path(r).then(|| ok("text/html", link_page(&href, &bytes))));
    let (project, images) = built(&index, Source::Index);
    let run = hostile_build(&project, &[]);
    canary.assert_not_in(project.path());
    run.assert_failure_naming(1, &[WHEEL, "file://"]);
    assert_eq!(Tree::of(&project.path().join("images")), images);
}

#[test]
fn an_endless_find_links_page_is_cut_off() {
    let index = Index::start(|r, _| page_path(r).then(|| Reply::endless(200, "")));
    let (project, images) = built(&index, Source::FindLinks);
    refused(&project, &images, &[], &["/simple/demo/", "goes on past"]);
}

#[test]
fn a_redirect_loop_ends_in_an_error() {
    let index =
        Index::start(|r, _| page_path(r).then(|| Reply::status(302).header("Location", r.path())));
    let (project, images) = built(&index, Source::Index);
    refused(&project, &images, &[], &["/simple/demo"]);
    // Redirects are followed a bounded number of times (and the failure retried a few).
    let asked = index
        .server
        .requests()
        .iter()
        .filter(|r| page_path(r))
        .count();
    assert!(asked < 100, "the loop was followed {asked} times");
}
