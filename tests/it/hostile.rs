//! A corpus of hostile and broken packages and recipes (issue 6, part 1). Every case runs the
//! real CLI and must fail with exit 1 and a message naming the package (and the entry where
//! there is one), never panic or hang, write no image and no lock, leave no staging tree, and
//! write nothing outside the staging root: the escaping cases aim at `evil-*` files in the
//! corpus's own temp directory, which must never appear.
//!
//! The packages are written byte by byte by `tests/support/hostile.rs` into one channel per
//! test process, with a `repodata.json` written by hand so that records stay sane while the
//! archives are not (or, for the checksum cases, the other way round).

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde_json::json;

use crate::{
    common::{Project, Run},
    support::hostile::{Channel, Package, Raw, json_bytes, paths_json, sha256_hex},
};

/// The corpus's temp directory: the channel in `channel/`, and the place every escape aims.
struct Corpus {
    root: PathBuf,
}

impl Corpus {
    fn channel(&self) -> PathBuf {
        self.root.join("channel")
    }

    /// Absolute path of an escape's target.
    fn target(&self, name: &str) -> String {
        format!("{}/{name}", self.root.display())
    }

    /// The same target reached from any extraction or staging directory by climbing to `/`.
    fn climb(&self, name: &str) -> String {
        format!(
            "{}{}",
            "../".repeat(16),
            self.target(name).trim_start_matches('/')
        )
    }

    /// Panics if any escape landed: an `evil-*` file in the corpus root or at `/`.
    #[track_caller]
    fn assert_no_escape(&self) {
        for dir in [self.root.as_path(), Path::new("/")] {
            for entry in fs_err::read_dir(dir).unwrap() {
                let name = entry.unwrap().file_name().to_string_lossy().into_owned();
                assert!(!name.starts_with("evil-"), "{name} escaped into {dir:?}");
            }
        }
    }
}

fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(|| {
        // Kept while this process runs: other tests of it may still be reading it (see
        // `shared_channel`).
        let mut corpus = None;
        crate::support::kept_channel_dir("h", |root| {
            let written = Corpus {
                root: root.to_path_buf(),
            };
            write_channel(&written);
            corpus = Some(written);
            Ok(())
        });
        corpus.expect("written")
    })
}

fn ok_file() -> Raw {
    Raw::file("share/ok.txt", "fine\n")
}

fn pkg(name: &str, payload: Vec<Raw>) -> Package {
    Package::new(name, &[], false, payload)
}

/// Adds `package` as a `.tar.bz2` with a sane record (noarch python for a `pyh0_0` build),
/// which `edit` may then make less sane.
fn add_tar_bz2(channel: &mut Channel<'_>, package: Package, edit: &dyn Fn(&mut serde_json::Value)) {
    let name = package.stem.split("-1.0-").next().unwrap().to_string();
    let noarch = package.stem.contains("pyh0_0");
    let depends: &[&str] = if noarch { &["python"] } else { &[] };
    let index = crate::support::hostile::index_json(&name, depends, noarch);
    channel.add(
        &format!("{}.tar.bz2", package.stem),
        &index,
        &package.tar_bz2(),
        edit,
    );
}

/// Writes every hostile package; each test below installs one by name.
fn write_channel(corpus: &Corpus) {
    // What the reading escapes aim at: a host file whose bytes must never reach an image.
    fs_err::write(corpus.root.join("secret.txt"), "host secret\n").unwrap();
    fs_err::write(
        corpus.root.join("secret.json"),
        "{\"HOST_TOKEN\": \"hunter2\"}\n",
    )
    .unwrap();
    let dir = corpus.channel();
    let mut channel = Channel::new(&dir);
    let index = |name: &str| crate::support::hostile::index_json(name, &[], false);
    let add_bz2 = add_tar_bz2;
    let none = |_: &mut serde_json::Value| {};

    // A good package, for the lock and checksum cases.
    add_bz2(&mut channel, pkg("good", vec![ok_file()]), &none);

    // Payload entries that climb out or are absolute (paths.json lists only the good file).
    let dotdot = Package::new("payload-dotdot", &[], false, vec![ok_file()]);
    let mut dotdot_payload = dotdot.payload;
    dotdot_payload.push(Raw::file(corpus.climb("evil-payload-dotdot"), "pwned\n"));
    add_bz2(
        &mut channel,
        Package {
            payload: dotdot_payload,
            ..dotdot
        },
        &none,
    );
    let abs = pkg("payload-absolute", vec![ok_file()]);
    let mut abs_payload = abs.payload;
    abs_payload.push(Raw::file(corpus.target("evil-payload-absolute"), "pwned\n"));
    add_bz2(
        &mut channel,
        Package {
            payload: abs_payload,
            ..abs
        },
        &none,
    );

    // Symlinks out of the prefix, listed in paths.json, and a file written through one.
    add_bz2(
        &mut channel,
        pkg(
            "symlink-absolute",
            vec![
                ok_file(),
                Raw::Symlink("lib/escape".into(), corpus.target("evil-symlink-absolute")),
            ],
        ),
        &none,
    );
    add_bz2(
        &mut channel,
        pkg(
            "symlink-dotdot",
            vec![
                ok_file(),
                Raw::Symlink("lib/escape".into(), "../../../../../../../../../..".into()),
            ],
        ),
        &none,
    );
    add_bz2(
        &mut channel,
        pkg(
            "symlink-write-through",
            vec![
                Raw::Symlink("lib/out".into(), corpus.root.display().to_string()),
                Raw::file("lib/out/evil-write-through", "pwned\n"),
            ],
        ),
        &none,
    );

    // Hard links to outside the prefix.
    for (name, target) in [
        ("hardlink-absolute", "/etc/passwd".to_string()),
        (
            "hardlink-dotdot",
            "../../../../../../../../etc/passwd".to_string(),
        ),
    ] {
        add_bz2(
            &mut channel,
            pkg(
                name,
                vec![ok_file(), Raw::Hardlink("lib/link".into(), target)],
            ),
            &none,
        );
    }

    // Special files.
    add_bz2(
        &mut channel,
        pkg(
            "payload-fifo",
            vec![ok_file(), Raw::Fifo("lib/fifo".into())],
        ),
        &none,
    );
    add_bz2(
        &mut channel,
        pkg(
            "payload-chardev",
            vec![ok_file(), Raw::CharDevice("lib/null".into())],
        ),
        &none,
    );
    add_bz2(
        &mut channel,
        pkg(
            "payload-blockdev",
            vec![ok_file(), Raw::BlockDevice("lib/disk".into())],
        ),
        &none,
    );

    // paths.json that lies.
    let lying = |name: &str, path: String| {
        let mut paths = paths_json(&[ok_file()]);
        paths["paths"].as_array_mut().unwrap().push(json!({
            "_path": path, "path_type": "hardlink",
            "sha256": sha256_hex(b"fine\n"), "size_in_bytes": 5,
        }));
        pkg(name, vec![ok_file()]).with_info("paths.json", json_bytes(&paths))
    };
    add_bz2(
        &mut channel,
        lying("paths-dotdot", corpus.climb("evil-paths-dotdot")),
        &none,
    );
    add_bz2(
        &mut channel,
        lying("paths-absolute", corpus.target("evil-paths-absolute")),
        &none,
    );
    add_bz2(
        &mut channel,
        lying("paths-missing-file", "share/missing.txt".into()),
        &none,
    );
    add_bz2(
        &mut channel,
        pkg(
            "paths-unlisted-file",
            vec![ok_file(), Raw::file("share/extra.txt", "x\n")],
        )
        .with_info("paths.json", json_bytes(&paths_json(&[ok_file()]))),
        &none,
    );
    let mut wrong_sha = paths_json(&[ok_file()]);
    wrong_sha["paths"][0]["sha256"] = sha256_hex(b"other").into();
    add_bz2(
        &mut channel,
        pkg("paths-wrong-sha256", vec![ok_file()]).with_info("paths.json", json_bytes(&wrong_sha)),
        &none,
    );

    // Records that do not match the archive.
    add_bz2(
        &mut channel,
        pkg("repodata-sha256", vec![ok_file()]),
        &|r| {
            r["sha256"] = sha256_hex(b"not the archive").into();
        },
    );
    add_bz2(&mut channel, pkg("repodata-size", vec![ok_file()]), &|r| {
        r["size"] = (r["size"].as_u64().unwrap() + 1000).into();
    });

    // Archives cut short, corrupted or missing members: the record matches the bytes, so
    // only the archive reader can notice.
    let cut = |bytes: Vec<u8>| bytes[..bytes.len() / 2].to_vec();
    let flip = |mut bytes: Vec<u8>, at: usize| {
        for b in &mut bytes[at..at + 64] {
            *b ^= 0x5a;
        }
        bytes
    };
    let big = || {
        vec![Raw::file(
            "share/big.bin",
            (0..200_000u32)
                .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
                .collect::<Vec<u8>>(),
        )]
    };
    let mut raw = |name: &str, ext: &str, bytes: Vec<u8>| {
        channel.add(
            &format!("{name}-1.0-h0_0.{ext}"),
            &index(name),
            &bytes,
            none,
        );
    };
    raw(
        "truncated-bz2",
        "tar.bz2",
        cut(pkg("truncated-bz2", big()).tar_bz2()),
    );
    raw(
        "truncated-conda",
        "conda",
        cut(pkg("truncated-conda", big()).conda(true)),
    );
    let bz2 = pkg("corrupt-bz2", big()).tar_bz2();
    let at = bz2.len() / 2;
    raw("corrupt-bz2", "tar.bz2", flip(bz2, at));
    let conda = pkg("corrupt-zstd", big()).conda(true);
    // Inside the pkg member's zstd frame (stored, so its bytes sit in the middle of the zip).
    let at = conda.len() / 3;
    raw("corrupt-zstd", "conda", flip(conda, at));
    raw(
        "conda-no-pkg",
        "conda",
        pkg("conda-no-pkg", vec![ok_file()]).conda(false),
    );
    raw("empty-archive", "tar.bz2", Vec::new());
    raw(
        "not-an-archive",
        "tar.bz2",
        b"<html>404 Not Found</html>\n".to_vec(),
    );
    // The same escapes in a `.conda`, whose payload is a separate zstd tar inside the zip.
    let mut conda_dotdot = pkg("conda-payload-dotdot", vec![ok_file()]);
    conda_dotdot
        .payload
        .push(Raw::file(corpus.climb("evil-conda-dotdot"), "pwned\n"));
    raw("conda-payload-dotdot", "conda", conda_dotdot.conda(true));
    raw(
        "conda-payload-fifo",
        "conda",
        pkg(
            "conda-payload-fifo",
            vec![ok_file(), Raw::Fifo("lib/fifo".into())],
        )
        .conda(true),
    );

    // Broken metadata.
    add_bz2(
        &mut channel,
        pkg("index-not-json", vec![ok_file()]).with_info("index.json", "{ nope"),
        &none,
    );
    let mut nameless = crate::support::hostile::index_json("index-no-name", &[], false);
    nameless.as_object_mut().unwrap().remove("name");
    add_bz2(
        &mut channel,
        pkg("index-no-name", vec![ok_file()]).with_info("index.json", json_bytes(&nameless)),
        &none,
    );
    add_bz2(
        &mut channel,
        pkg("paths-not-json", vec![ok_file()]).with_info("paths.json", "[1, 2"),
        &none,
    );

    // A binary file marked for prefix replacement whose placeholder is shorter than the
    // prefix (a binary replacement may only shorten) and one longer than the file itself.
    let binary = |name: &str, bytes: &[u8], placeholder: &str| {
        let payload = vec![Raw::file("lib/data.bin", bytes.to_vec())];
        let mut paths = paths_json(&payload);
        paths["paths"][0]["file_mode"] = "binary".into();
        paths["paths"][0]["prefix_placeholder"] = placeholder.into();
        pkg(name, payload).with_info("paths.json", json_bytes(&paths))
    };
    add_bz2(
        &mut channel,
        binary("placeholder-short", b"\0/p/lib\0tail\0", "/p"),
        &none,
    );
    add_bz2(
        &mut channel,
        binary(
            "placeholder-longer-than-file",
            b"\0/p\0",
            &"/placeholder".repeat(30),
        ),
        &none,
    );
    add_bz2(
        &mut channel,
        binary(
            "placeholder-not-found",
            b"\0/usr/local/elsewhere/lib\0 and some more bytes than the placeholder\0",
            "/opt/build-placeholder-prefix",
        ),
        &none,
    );

    // noarch python: a stand-in python, a package whose link.json is not JSON, and one whose
    // entry point names a module that does not exist.
    add_bz2(
        &mut channel,
        pkg(
            "python",
            vec![
                Raw::file("bin/python3.9", "#!/bin/sh\n"),
                Raw::file("lib/python3.9/site-packages/README.txt", "x\n"),
            ],
        ),
        &none,
    );
    let noarch = |name: &str, link: &[u8]| {
        Package::new(
            name,
            &["python"],
            true,
            vec![Raw::file(
                format!("site-packages/{}/__init__.py", name.replace('-', "_")),
                "",
            )],
        )
        .with_info("link.json", link.to_vec())
    };
    add_bz2(
        &mut channel,
        noarch("py-bad-link", b"{\"noarch\": {\"type\": "),
        &none,
    );
    add_bz2(
        &mut channel,
        noarch(
            "py-missing-module",
            &json_bytes(&json!({
                "noarch": { "type": "python", "entry_points": ["ghost = no_such_module:main"] },
                "package_metadata_version": 1,
            })),
        ),
        &none,
    );

    write_confinement_cases(corpus, &mut channel);
    write_bomb_and_clobber_cases(&mut channel);
    channel.finish();
    // A plain file where a channel directory is expected, for a recipe case.
    fs_err::write(corpus.root.join("not-a-channel"), "just a file\n").unwrap();
}

/// A symlink target that every per-link check passes (it never climbs above its own
/// directory counted lexically) but that, through `lib/x -> ..`, resolves to `to` on the host:
/// each `lib/x/` adds two levels on paper and none in fact, and the `..`s then climb to `/`.
fn chain_to(corpus: &Corpus, from_depth: usize, to: &str) -> String {
    format!(
        "{}{}{}{}",
        "../".repeat(from_depth),
        "lib/x/".repeat(16),
        "../".repeat(32),
        corpus.target(to).trim_start_matches('/')
    )
}

/// Issue 15, class 1: link chains, writes and reads through links of an earlier package,
/// metadata-derived paths, and a `.conda` whose zip directory hides a member.
fn write_confinement_cases(corpus: &Corpus, channel: &mut Channel<'_>) {
    let add = add_tar_bz2;
    let none = |_: &mut serde_json::Value| {};
    let x = || Raw::Symlink("lib/x".into(), "..".into());
    add(channel, pkg("chain-link", vec![ok_file(), x()]), &none);
    // Links into the host through `chain-link`'s `lib/x`, and a file written through one.
    add(
        channel,
        pkg(
            "chain-out",
            vec![Raw::Symlink("share/y".into(), chain_to(corpus, 1, ""))],
        ),
        &none,
    );
    add(
        channel,
        pkg(
            "chain-write",
            vec![Raw::file("share/y/evil-chain-write", "pwned\n")],
        ),
        &none,
    );
    add(
        channel,
        pkg(
            "bin-link",
            vec![Raw::Symlink("bin".into(), chain_to(corpus, 0, ""))],
        ),
        &none,
    );
    add(
        channel,
        Package::new("py-chain", &["python"], true, vec![Raw::file("site-packages/py_chain/__init__.py", "")])
            .with_info(
                "link.json",
                json_bytes(&json!({
                    "noarch": { "type": "python", "entry_points": ["evil-entry-point = py_chain:main"] },
                    "package_metadata_version": 1,
                })),
            ),
        &none,
    );
    // A file to have its placeholder replaced, no sha256, which is a link into the host: the
    // copy rattler would read is the host's secret.
    let read_link = Raw::Symlink("share/conf.txt".into(), chain_to(corpus, 1, "secret.txt"));
    let mut paths = paths_json(&[ok_file(), x()]);
    paths["paths"].as_array_mut().unwrap().push(json!({
        "_path": "share/conf.txt", "path_type": "hardlink",
        "prefix_placeholder": "/opt/placeholder", "file_mode": "text",
    }));
    add(
        channel,
        pkg("chain-read", vec![ok_file(), x(), read_link])
            .with_info("paths.json", json_bytes(&paths)),
        &none,
    );
    // Activation variables read from the host.
    add(
        channel,
        pkg(
            "chain-env",
            vec![
                x(),
                Raw::Symlink(
                    "etc/conda/env_vars.d/evil.json".into(),
                    chain_to(corpus, 3, "secret.json"),
                ),
            ],
        ),
        &none,
    );
    // Record fields that become paths.
    add(channel, pkg("site-dotdot", vec![ok_file()]), &|r| {
        r["python_site_packages_path"] = "../../../../../../evil-site".into();
    });
    add(channel, pkg("site-absolute", vec![ok_file()]), &|r| {
        r["python_site_packages_path"] = corpus.target("evil-site-absolute").into();
    });
    add(channel, pkg("build-slash", vec![ok_file()]), &|r| {
        r["build"] = "x/../../../../../../../evil-build".into();
    });
    // The archive names another package than its record.
    add(
        channel,
        pkg("name-mismatch", vec![ok_file()]).with_info(
            "index.json",
            json_bytes(&crate::support::hostile::index_json(
                "someone-else",
                &[],
                false,
            )),
        ),
        &none,
    );
    // `.conda`s with a member in the stream that the zip's central directory does not list.
    for (name, hidden, member) in [
        (
            "conda-hidden-archive",
            Raw::Symlink("lib/escape".into(), corpus.target("secret.txt")),
            "evil-0.tar.zst",
        ),
        (
            "conda-hidden-member",
            Raw::file("notes.txt", "hidden\n"),
            "notes.txt",
        ),
    ] {
        let good = pkg(name, vec![ok_file()]).conda(true);
        let bytes = with_hidden_member(&good, member, &hidden);
        channel.add(
            &format!("{name}-1.0-h0_0.conda"),
            &crate::support::hostile::index_json(name, &[], false),
            &bytes,
            none,
        );
    }
}

/// `conda` with a stored member `member` (a zstd tar of `hidden`, or its bytes) put in front:
/// readers of the local headers in stream order see it, the central directory does not.
fn with_hidden_member(conda: &[u8], member: &str, hidden: &Raw) -> Vec<u8> {
    use std::io::Write;
    let bytes = match hidden {
        Raw::File(_, bytes) if !member.ends_with(".tar.zst") => bytes.clone(),
        other => crate::support::hostile::zstd_bytes(&crate::support::hostile::tar(
            std::slice::from_ref(other),
        )),
    };
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file(member, options).unwrap();
    zip.write_all(&bytes).unwrap();
    let front = zip.finish().unwrap().into_inner();
    // Up to its central directory, whose offset the end record holds (last 22 bytes).
    let end = &front[front.len() - 22..];
    let directory = u32::from_le_bytes(end[16..20].try_into().unwrap()) as usize;
    let mut out = front[..directory].to_vec();
    out.extend_from_slice(conda);
    out
}

/// Issue 15, class 2: decompression bombs (tests/data/bombs), a size paths.json understates,
/// and packages that clobber one another.
fn write_bomb_and_clobber_cases(channel: &mut Channel<'_>) {
    let none = |_: &mut serde_json::Value| {};
    let bombs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bombs");
    for (file, build) in [
        ("bomb-1.0-h0_0.tar.bz2", "h0_0"),
        ("bomb-1.0-h1_0.conda", "h1_0"),
    ] {
        let mut index = crate::support::hostile::index_json("bomb", &[], false);
        index["build"] = build.into();
        channel.add(file, &index, &fs_err::read(bombs.join(file)).unwrap(), none);
    }
    let add = |channel: &mut Channel<'_>, package: Package| {
        let name = package.stem.split("-1.0-").next().unwrap().to_string();
        let idx = crate::support::hostile::index_json(&name, &[], false);
        channel.add(
            &format!("{}.tar.bz2", package.stem),
            &idx,
            &package.tar_bz2(),
            none,
        );
    };
    let big = Raw::file("share/big.bin", vec![7u8; 4 << 20]);
    let mut understated = paths_json(std::slice::from_ref(&big));
    understated["paths"][0]["size_in_bytes"] = 5.into();
    add(
        channel,
        pkg("paths-size-understated", vec![big]).with_info("paths.json", json_bytes(&understated)),
    );
    add(
        channel,
        pkg(
            "clobber-a",
            vec![Raw::file("share/clobbered.txt", "from a\n")],
        ),
    );
    add(
        channel,
        pkg(
            "clobber-b",
            vec![Raw::file("share/clobbered.txt", "from b\n")],
        ),
    );
    add(
        channel,
        pkg("same-a", vec![Raw::file("share/same.txt", "same\n")]),
    );
    add(
        channel,
        pkg("same-b", vec![Raw::file("share/same.txt", "same\n")]),
    );
    add(
        channel,
        pkg("file-a", vec![Raw::file("share/thing", "a file\n")]),
    );
    add(
        channel,
        pkg(
            "dir-b",
            vec![Raw::file("share/thing/inner.txt", "in a directory\n")],
        ),
    );
}

/// Runs imgbuild with a deadline: a package that makes it hang (a fifo opened for copying)
/// fails the test instead of the whole run.
fn run(project: &Project, args: &[&str]) -> Run {
    crate::common::run_with_deadline(project.command(args), project, args)
}

/// Builds `recipe` (bytes, so it can be invalid UTF-8) in a fresh project and checks the
/// failure: `code`, each needle in stderr, no panic, no image, no lock, no staging tree left,
/// no escape.
#[track_caller]
fn refused_recipe(recipe: &[u8], code: i32, needles: &[&str]) -> Run {
    let corpus = corpus();
    let project = Project::new();
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    fs_err::write(project.recipe_path(), recipe).unwrap();
    let run = run(&project, &["build", "recipes/image.toml"]);
    check_failure(&project, &run, code, needles);
    corpus.assert_no_escape();
    run
}

#[track_caller]
fn check_failure(project: &Project, run: &Run, code: i32, needles: &[&str]) {
    run.assert_failure_naming(code, needles);
    project.assert_no_image();
    let staging = project.cache.join("staging");
    if staging.exists() {
        assert_eq!(
            fs_err::read_dir(&staging).unwrap().count(),
            0,
            "staging left behind"
        );
    }
}

fn recipe_for(deps: &[&str]) -> String {
    crate::support::channel::tiny_recipe(&corpus().channel(), "hostile", deps)
}

/// Installs the corpus package `name` and checks it is refused with exit 1 and `needles`
/// (the package's file name is always expected).
#[track_caller]
fn refused(name: &str, needles: &[&str]) {
    let run = refused_recipe(recipe_for(&[name]).as_bytes(), 1, needles);
    assert!(
        run.stderr.contains(name),
        "the package is named:\n{}",
        run.stderr
    );
}

macro_rules! refused {
    ($($test:ident: $name:literal => [$($needle:expr),* $(,)?];)*) => {$(
        #[test]
        fn $test() {
            refused($name, &[$($needle),*]);
        }
    )*};
}

refused! {
    symlink_to_absolute_path: "symlink-absolute" => ["lib/escape"];
    symlink_climbing_with_dotdot: "symlink-dotdot" => ["lib/escape"];
    file_written_through_a_symlink: "symlink-write-through" => ["lib/out"];
    hardlink_to_absolute_path: "hardlink-absolute" => ["lib/link"];
    hardlink_climbing_with_dotdot: "hardlink-dotdot" => ["lib/link"];
    paths_json_path_with_dotdot: "paths-dotdot" => ["evil-paths-dotdot"];
    paths_json_lists_a_missing_file: "paths-missing-file" => ["share/missing.txt"];
    repodata_sha256_mismatch: "repodata-sha256" => ["sha256"];
    truncated_tar_bz2: "truncated-bz2" => [];
    truncated_conda: "truncated-conda" => [];
    corrupt_bz2_stream: "corrupt-bz2" => [];
    corrupt_zstd_stream: "corrupt-zstd" => [];
    conda_without_pkg_member: "conda-no-pkg" => [];
    empty_archive: "empty-archive" => [];
    html_instead_of_an_archive: "not-an-archive" => [];
    index_json_not_json: "index-not-json" => ["index.json"];
    index_json_without_name: "index-no-name" => ["index.json"];
    paths_json_not_json: "paths-not-json" => ["paths.json"];
    binary_placeholder_shorter_than_prefix: "placeholder-short" => ["lib/data.bin"];
    noarch_python_link_json_not_json: "py-bad-link" => ["link.json"];
    // Checked by imgbuild before rattler links (crates/imgbuild-install/src/install/fetch.rs, `check_package`).
    paths_json_absolute_path: "paths-absolute" => ["evil-paths-absolute"];
    paths_json_sha256_wrong: "paths-wrong-sha256" => ["share/ok.txt"];
    payload_entry_absolute: "payload-absolute" => ["evil-payload-absolute"];
    payload_file_missing_from_paths_json: "paths-unlisted-file" => ["share/extra.txt"];
}

// Refused by imgbuild's own reading of the archive and of the extracted copy
// (`crates/imgbuild-install/src/install/scan.rs`, `crates/imgbuild-install/src/install/fetch.rs`): rattler's extractor drops `..` entries and
// special files without a word, checks the sha256 but not the size, and leaves a binary
// placeholder it cannot find in place.
refused! {
    payload_entry_with_dotdot: "payload-dotdot" => ["evil-payload-dotdot", "`..`"];
    fifo_in_payload: "payload-fifo" => ["lib/fifo", "fifo"];
    char_device_in_payload: "payload-chardev" => ["lib/null", "character device"];
    block_device_in_payload: "payload-blockdev" => ["lib/disk", "block device"];
    repodata_size_mismatch: "repodata-size" => ["repodata-size-1.0-h0_0.tar.bz2", "size"];
    binary_placeholder_longer_than_file: "placeholder-longer-than-file" => ["lib/data.bin", "longer than the file"];
    conda_payload_entry_with_dotdot: "conda-payload-dotdot" => ["evil-conda-dotdot", "`..`"];
    conda_fifo_in_payload: "conda-payload-fifo" => ["lib/fifo", "fifo"];
    binary_placeholder_not_in_file: "placeholder-not-found" => ["lib/data.bin", "not in the file"];
}

/// Installs the corpus packages `names` together and checks they are refused with exit 1,
/// naming `package` and each needle.
#[track_caller]
fn refused_together(names: &[&str], package: &str, needles: &[&str]) -> Run {
    let run = refused_recipe(recipe_for(names).as_bytes(), 1, needles);
    assert!(
        run.stderr.contains(package),
        "names {package}:\n{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("hunter2") && !run.stderr.contains("host secret"),
        "{}",
        run.stderr
    );
    run
}

// Issue 15, class 1: every path of the install is planned through the links of every
// package before rattler writes (`crates/imgbuild-install/src/install/confine.rs`).

#[test]
fn link_chain_through_an_earlier_package_leads_out() {
    refused_together(
        &["chain-link", "chain-out"],
        "chain-out",
        &["share/y", "leads out of the prefix"],
    );
}

#[test]
fn file_written_through_a_link_chain() {
    refused_together(
        &["chain-link", "chain-out", "chain-write"],
        "chain-",
        &["share/y"],
    );
}

#[test]
fn noarch_entry_point_written_through_a_linked_bin() {
    refused_together(
        &["chain-link", "bin-link", "py-chain", "python"],
        "-1.0-",
        &["bin"],
    );
}

#[test]
fn placeholder_file_that_is_a_link_to_a_host_file() {
    refused_together(
        &["chain-read"],
        "chain-read",
        &["share/conf.txt", "declared as a file"],
    );
}

#[test]
fn activation_variables_read_through_a_link_chain() {
    refused_together(
        &["chain-env"],
        "chain-env",
        &["etc/conda/env_vars.d/evil.json", "leads out"],
    );
}

#[test]
fn python_site_packages_path_with_dotdot() {
    refused_together(
        &["site-dotdot"],
        "site-dotdot",
        &["python_site_packages_path", "without `..`"],
    );
}

#[test]
fn python_site_packages_path_absolute() {
    refused_together(
        &["site-absolute"],
        "site-absolute",
        &["python_site_packages_path"],
    );
}

#[test]
fn build_string_that_is_a_path() {
    refused_together(&["build-slash"], "build-slash", &["build", "plain name"]);
}

/// The same field in the lock alone (the channel's record is sane): `--locked` refuses it.
#[test]
fn python_site_packages_path_in_the_lock_alone() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    run(&project, &["lock", "recipes/image.toml"]).success();
    let text = fs_err::read_to_string(project.lock_path()).unwrap();
    let (head, tail) = text
        .split_once("  sha256: ")
        .expect("the lock pins a sha256");
    let forged = format!(
        "{head}  python_site_packages_path: ../../../../../../evil-lock-site\n  sha256: {tail}"
    );
    fs_err::write(project.lock_path(), &forged).unwrap();
    let run = run(&project, &["build", "recipes/image.toml", "--locked"]);
    check_failure(
        &project,
        &run,
        1,
        &["good-1.0-h0_0", "python_site_packages_path"],
    );
    corpus().assert_no_escape();
}

#[test]
fn archive_naming_another_package() {
    refused_together(
        &["name-mismatch"],
        "name-mismatch",
        &["info/index.json", "someone-else-1.0-h0_0"],
    );
}

#[test]
fn conda_with_a_third_archive_only_in_the_stream() {
    refused_together(
        &["conda-hidden-archive"],
        "conda-hidden-archive",
        &["lib/escape"],
    );
}

#[test]
fn conda_whose_zip_directory_and_local_headers_disagree() {
    refused_together(
        &["conda-hidden-member"],
        "conda-hidden-member",
        &["notes.txt", "disagree"],
    );
}

/// A refused install leaves the image built before it in place, and valid.
#[test]
fn a_refused_chain_keeps_the_previous_image() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    let first = project.build(&[]).success();
    project.write_recipe(&recipe_for(&["good", "chain-link", "chain-out"]));
    let run = run(&project, &["build", "recipes/image.toml"]);
    run.assert_failure_naming(1, &["chain-out", "share/y"]);
    corpus().assert_no_escape();
    let layout = project.path().join("images/hostile");
    assert_eq!(
        crate::common::LayoutView::new(&layout).manifest_digest(),
        first.digest()
    );
    let verify = project.run(&["verify", layout.to_str().unwrap()]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);
}

// Issue 15, class 2: bombs, understated sizes and clobbers.

/// Nothing of a refused package stays in the package cache.
#[track_caller]
fn assert_not_cached(project: &Project, name: &str) {
    let pkgs = project.cache.join("pkgs");
    if !pkgs.exists() {
        return;
    }
    for entry in fs_err::read_dir(&pkgs).unwrap() {
        let entry = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !entry.starts_with(&format!("{name}-1.0")),
            "{entry} stayed in {pkgs:?}"
        );
    }
}

/// A bomb build (`h0_0` the `.tar.bz2`, `h1_0` the `.conda`) is refused and leaves nothing in
/// the cache.
#[track_caller]
fn bomb_refused(build: &str) {
    let project = Project::new();
    project.write_recipe(&recipe_for(&[&format!("bomb=1.0={build}")]));
    let run = run(&project, &["build", "recipes/image.toml"]);
    check_failure(
        &project,
        &run,
        1,
        &[&format!("bomb-1.0-{build}"), "decompression bomb"],
    );
    assert_not_cached(&project, "bomb");
}

#[test]
fn tar_bz2_bomb_stops_early() {
    bomb_refused("h0_0");
}

#[test]
fn conda_bomb_stops_early() {
    bomb_refused("h1_0");
}

#[test]
fn payload_larger_than_paths_json_declares() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["paths-size-understated"]));
    let run = run(&project, &["build", "recipes/image.toml"]);
    check_failure(
        &project,
        &run,
        1,
        &["share/big.bin", "info/paths.json declares 5"],
    );
    assert_not_cached(&project, "paths-size-understated");
}

#[test]
fn two_packages_with_different_files_at_one_path() {
    refused_together(
        &["clobber-a", "clobber-b"],
        "clobber-",
        &[
            "share/clobbered.txt",
            "clobber-a-1.0-h0_0",
            "clobber-b-1.0-h0_0",
        ],
    );
}

#[test]
fn a_file_where_another_package_has_a_directory() {
    refused_together(
        &["file-a", "dir-b"],
        "file-a",
        &["share/thing", "dir-b-1.0-h0_0"],
    );
}

/// Two packages shipping the same bytes at one path build, as in conda; rattler's
/// `__clobbers__` copy never reaches the image, and both records list the path itself.
#[test]
fn identical_files_at_one_path_leave_no_clobbers() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["same-a", "same-b"]));
    project.build(&[]).success();
    let rootfs = crate::common::unpack(
        &project.path().join("images/hostile"),
        "latest",
        &project.path().join("bundle"),
    );
    let prefix = rootfs.join("opt/conda");
    assert_eq!(
        fs_err::read_to_string(prefix.join("share/same.txt")).unwrap(),
        "same\n"
    );
    assert!(
        !prefix.join("__clobbers__").exists(),
        "__clobbers__ reached the image"
    );
    for name in ["same-a", "same-b"] {
        let record =
            fs_err::read_to_string(prefix.join(format!("conda-meta/{name}-1.0-h0_0.json")))
                .unwrap();
        assert!(record.contains("\"share/same.txt\""), "{record}");
        assert!(!record.contains("__clobbers__"), "{record}");
    }
}

/// A corrupt bzip2 stream is named without raw bytes: nothing but printable text and
/// newlines on stderr.
#[test]
fn corrupt_bz2_message_is_printable() {
    let run = refused_recipe(recipe_for(&["corrupt-bz2"]).as_bytes(), 1, &["corrupt-bz2"]);
    let odd: Vec<char> = run
        .stderr
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(odd.is_empty(), "{odd:?} in:\n{}", run.stderr);
}

/// The extracted copy of a package in the cache, found by its payload file.
fn cached_copy(project: &Project, name: &str) -> PathBuf {
    let pkgs = project.cache.join("pkgs");
    fs_err::read_dir(&pkgs)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| {
            path.is_dir()
                && path
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}-1.0-"))
        })
        .unwrap_or_else(|| panic!("no cached copy of {name} in {pkgs:?}"))
}

/// A package checked once is marked (keyed by its archive's sha256) and not read again by
/// the next build; the marker only counts while the cached copy is unchanged.
#[test]
fn a_checked_package_is_not_read_again() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    let debug = [("IMGBUILD_LOG", "imgbuild=debug")];
    let first = project.run_with(&["build", "recipes/image.toml"], &debug, None);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(first.stderr.contains("good-1.0-h0_0: "), "{}", first.stderr);
    assert!(!first.stderr.contains("checked before"), "{}", first.stderr);
    let sha256 = sha256_hex(
        &fs_err::read(corpus().channel().join("linux-64/good-1.0-h0_0.tar.bz2")).unwrap(),
    );
    assert!(project.cache.join("checked").join(&sha256).is_file());

    // Another output, so the build installs rather than finding its image unchanged.
    let second = project.run_with(
        &["build", "recipes/image.toml", "-o", "images/second"],
        &debug,
        None,
    );
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(
        second.stderr.contains("good-1.0-h0_0: checked before"),
        "{}",
        second.stderr
    );
    assert!(
        !second.stderr.contains("entries scanned"),
        "{}",
        second.stderr
    );
}

/// The cached copy changed after it was marked (same size, new content): the marker no
/// longer counts, the package is read again, and the change is refused naming the file.
#[test]
fn a_cached_copy_changed_after_its_check_is_refused() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    project.build(&[]).success();
    let file = cached_copy(&project, "good").join("share/ok.txt");
    assert_eq!(fs_err::read(&file).unwrap(), b"fine\n");
    fs_err::write(&file, "evil\n").unwrap();
    // (The first build's image stays, so `check_failure`'s "no image" does not apply;
    // another output, so the build installs rather than finding its image unchanged.)
    run(
        &project,
        &["build", "recipes/image.toml", "-o", "images/second"],
    )
    .assert_failure_naming(1, &["good-1.0-h0_0", "share/ok.txt", "sha256"]);
}

/// A marker that is not the file imgbuild wrote (a fifo, a link to a host file) counts for
/// nothing: the package is read again, never waited on, and the build is right.
#[test]
fn a_check_marker_that_is_a_fifo_or_a_link_is_not_trusted() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    let digest = project.build(&[]).success().digest();
    let sha256 = sha256_hex(
        &fs_err::read(corpus().channel().join("linux-64/good-1.0-h0_0.tar.bz2")).unwrap(),
    );
    let marker = project.cache.join("checked").join(&sha256);
    let canary = crate::trust::Canary::new();
    let debug = [("IMGBUILD_LOG", "imgbuild=debug")];
    for (at, plant) in ["fifo", "link"].into_iter().enumerate() {
        fs_err::remove_file(&marker).unwrap();
        match plant {
            "fifo" => {
                let status = std::process::Command::new("mkfifo").arg(&marker).status();
                assert!(status.unwrap().success());
            }
            _ => std::os::unix::fs::symlink(canary.file(), &marker).unwrap(),
        }
        let out = format!("images/again-{at}");
        let args = ["build", "recipes/image.toml", "-o", out.as_str()];
        let mut command = project.command(&args);
        command.envs(debug);
        let again = crate::common::run_with_deadline(command, &project, &args).success();
        assert_eq!(again.digest(), digest, "{plant}");
        assert!(
            !again.stderr.contains("checked before"),
            "{plant}: {}",
            again.stderr
        );
        canary.assert_not_in(&project.path().join(&out));
    }
    canary.assert_untouched();
}

/// An entry point naming a module that does not exist is not an error: rattler writes the
/// `bin/ghost` script from `link.json` without importing anything (the build host never runs
/// target code), exactly as conda does; the script fails only when run in the image.
#[test]
fn noarch_entry_point_to_a_missing_module_builds() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["py-missing-module"]));
    let run = run(&project, &["build", "recipes/image.toml"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    corpus().assert_no_escape();
}

/// The sha256 pinned in the lock no longer matches the package: `--locked` must refuse it.
#[test]
fn lock_sha256_not_matching_the_archive() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    let lock = run(&project, &["lock", "recipes/image.toml"]);
    assert_eq!(lock.code, 0, "{}", lock.stderr);
    let text = fs_err::read_to_string(project.lock_path()).unwrap();
    let real = sha256_hex(
        &fs_err::read(corpus().channel().join("linux-64/good-1.0-h0_0.tar.bz2")).unwrap(),
    );
    assert!(
        text.contains(&real),
        "the lock pins the archive's sha256:\n{text}"
    );
    fs_err::write(
        project.lock_path(),
        text.replace(&real, &sha256_hex(b"forged")),
    )
    .unwrap();
    let run = run(&project, &["build", "recipes/image.toml", "--locked"]);
    check_failure(&project, &run, 1, &["good"]);
}

/// A lock that is not a regular file (here `/dev/zero`, which would be read until memory
/// runs out) is refused before it is read.
#[test]
fn lock_that_is_a_device() {
    let project = Project::new();
    project.write_recipe(&recipe_for(&["good"]));
    std::os::unix::fs::symlink("/dev/zero", project.lock_path()).unwrap();
    let run = run(&project, &["build", "recipes/image.toml", "--locked"]);
    check_failure(
        &project,
        &run,
        1,
        &["image.lock", "a character device, not a regular file"],
    );
}

/// The real broken `zlib` from conda's test data (also in `errors.rs`), in the corpus count.
#[test]
fn real_broken_zlib() {
    let recipe =
        crate::support::channel::tiny_recipe(crate::support::shared_channel(), "z", &["zlib"]);
    refused_recipe(recipe.as_bytes(), 1, &["zlib-1.2.11", "lib/libz.so"]);
}

// ---------------------------------------------------------------------------------------------
// Hostile recipes

fn with_prefix(prefix: &str) -> Vec<u8> {
    let quote = serde_json::to_string(prefix).unwrap();
    recipe_for(&["good"])
        .replacen("[image]\n", &format!("[image]\nprefix = {quote}\n"), 1)
        .into_bytes()
}

#[test]
fn prefix_that_climbs_out() {
    refused_recipe(&with_prefix("/opt/../etc"), 1, &["prefix"]);
}

#[test]
fn prefix_root() {
    refused_recipe(&with_prefix("/"), 1, &["prefix"]);
}

#[test]
fn prefix_with_nul() {
    refused_recipe(&with_prefix("/opt/con\0da"), 1, &["prefix"]);
}

#[test]
fn prefix_with_newline() {
    refused_recipe(&with_prefix("/opt/con\nda"), 1, &["prefix"]);
}

#[test]
fn channel_path_is_a_file() {
    let url = url::Url::from_file_path(corpus().root.join("not-a-channel")).unwrap();
    let recipe = format!(
        "[image]\nname = \"x\"\n[conda]\nchannels = [\"{url}\"]\ndependencies = [\"good\"]\n"
    );
    refused_recipe(recipe.as_bytes(), 1, &["not-a-channel"]);
}

#[test]
fn base_layout_is_a_file() {
    let project_independent =
        recipe_for(&["good"]).replacen("base = \"scratch\"", "base = \"oci:image.toml\"", 1);
    refused_recipe(project_independent.as_bytes(), 1, &["image.toml"]);
}

/// Refused for its size before it is parsed (a recipe may have at most 1 MiB).
#[test]
fn ten_megabyte_recipe() {
    let mut recipe = recipe_for(&["good"]).into_bytes();
    recipe.extend_from_slice(b"# ");
    recipe.extend(std::iter::repeat_n(b'x', 10 << 20));
    recipe.extend_from_slice(b"\n[bogus]\n");
    refused_recipe(
        &recipe,
        1,
        &["recipes/image.toml", "at most 1048576 (1 MiB)"],
    );
}

#[test]
fn deeply_nested_arrays() {
    let depth = 100_000;
    let recipe = format!(
        "[image]\nname = \"x\"\ntags = {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    refused_recipe(recipe.as_bytes(), 1, &["recipes/image.toml"]);
}

#[test]
fn deeply_nested_inline_tables() {
    let depth = 100_000;
    let recipe = format!(
        "[image]\nname = \"x\"\n[image.labels]\na = {}1{}\n",
        "{ b = ".repeat(depth),
        " }".repeat(depth)
    );
    refused_recipe(recipe.as_bytes(), 1, &["recipes/image.toml"]);
}

#[test]
fn huge_layers_max() {
    let recipe = recipe_for(&["good"]) + "\n[layers]\nmax = 99999999999999999999\n";
    refused_recipe(recipe.as_bytes(), 1, &["max"]);
}

#[test]
fn layers_max_beyond_u32() {
    let recipe = recipe_for(&["good"]) + "\n[layers]\nmax = 4294967298\n";
    refused_recipe(recipe.as_bytes(), 1, &["max"]);
}

#[test]
fn recipe_not_utf8() {
    let mut recipe = b"[image]\nname = \"x\xff\xfe\"\n".to_vec();
    recipe.extend_from_slice(b"\xc3\x28\n");
    refused_recipe(&recipe, 1, &["recipes/image.toml"]);
}
