//! The lock: written next to the recipe, reused while it satisfies the recipe, re-solved
//! when it does not, enforced by `--locked`; `--offline` builds from the cache alone.

use crate::{
    common::{FileServer, Project},
    support::{channel::tiny_recipe, shared_channel},
};

#[test]
fn lock_is_written_reused_and_refreshed() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "locky", &["hello 1.0"]));

    let run = project.run(&["lock", "recipes/image.toml"]).success();
    assert_eq!(run.stdout.trim(), "recipes/image.lock");
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("# imgbuild-base: scratch"), "{lock}");
    assert!(lock.contains("version: 7"), "a rattler lock file:\n{lock}");
    for line in [
        "__glibc=2.17=0",
        "__linux=4.18=0",
        "__unix=0=0",
        "__archspec=1=x86_64",
    ] {
        assert!(lock.contains(line), "{line} in\n{lock}");
    }
    assert!(
        !lock.contains("__cuda"),
        "no [cuda] section, no __cuda:\n{lock}"
    );
    // Every package pinned by location and sha256.
    for name in ["cuda-cudart-11.8.89-h0_0.conda", "hello-1.0-h0_0.tar.bz2"] {
        assert!(lock.contains(name), "{name} in\n{lock}");
    }
    assert_eq!(lock.matches("sha256: ").count(), 2, "{lock}");

    // A build reuses it, byte for byte.
    let run = project.build(&[]).success();
    assert!(
        run.stderr.contains("Reusing recipes/image.lock"),
        "{}",
        run.stderr
    );
    assert_eq!(fs_err::read_to_string(project.lock_path()).unwrap(), lock);

    // The recipe changes: the lock no longer satisfies it and is re-solved.
    project.write_recipe(&tiny_recipe(shared_channel(), "locky", &["hello 2.0"]));
    let run = project.build(&[]).success();
    assert!(
        run.stderr
            .contains("re-solved because no locked package satisfies the dependency `hello ==2.0`"),
        "{}",
        run.stderr
    );
    let relocked = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(relocked.contains("hello-2.0-h0_0.tar.bz2"), "{relocked}");

    // A dependency removed: the lock holds a package nothing needs any more.
    project.write_recipe(&tiny_recipe(shared_channel(), "locky", &["cuda-cudart"]));
    let run = project.build(&["--locked"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr
            .contains("locked package `hello` is no longer needed"),
        "{}",
        run.stderr
    );
    assert_eq!(
        fs_err::read_to_string(project.lock_path()).unwrap(),
        relocked
    );
}

#[test]
fn locked_refuses_a_stale_or_missing_lock() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "strict", &["hello 1.0"]));
    let run = project.build(&["--locked"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr.contains("does not exist and `--locked` forbids"),
        "{}",
        run.stderr
    );

    project.run(&["lock", "recipes/image.toml"]).success();
    project.build(&["--locked"]).success();

    // A CUDA target changes the virtual packages the lock was solved for.
    let with_cuda = format!(
        "{}\n[cuda]\nversion = \"11.8\"\n",
        tiny_recipe(shared_channel(), "strict", &["hello 1.0"])
    );
    project.write_recipe(&with_cuda);
    let run = project.build(&["--locked"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr
            .contains("no longer satisfies the recipe: the target changed"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("__cuda=11.8=0"), "{}", run.stderr);

    // Without --locked it re-solves, and the lock records the CUDA target.
    project.build(&[]).success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("__cuda=11.8=0"), "{lock}");
}

#[test]
fn http_channel_by_alias_then_offline_from_the_cache() {
    // The channel served over HTTP on 127.0.0.1 and named through the channel alias, as
    // users behind a mirror do.
    let served = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(shared_channel(), served.path().join("testchan")).unwrap();
    let server = FileServer::serve(served.path().to_path_buf());
    let project = Project::new();
    let recipe = "[image]\nname = \"remote\"\n[conda]\nchannels = [\"testchan\"]\ndependencies = [\"hello 1.0\", \"pyhello\"]\n";
    project.write_recipe(recipe);
    let online = project
        .run_with(
            &["build", "recipes/image.toml"],
            &[("IMGBUILD_CHANNEL_ALIAS", server.url.as_str())],
            None,
        )
        .success();
    assert!(server.requests.load(std::sync::atomic::Ordering::Relaxed) > 0);
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    let alias = server.url.clone();
    assert!(
        lock.contains(&format!("url: {alias}testchan/")),
        "the lock names the channel by its URL:\n{lock}"
    );
    assert!(
        lock.contains(&format!("{alias}testchan/linux-64/hello-1.0-h0_0.tar.bz2")),
        "{lock}"
    );
    // The server stops: nothing can be fetched any more.
    drop(server);
    let offline =
        |args: &[&str]| project.run_with(args, &[("IMGBUILD_CHANNEL_ALIAS", alias.as_str())], None);

    // --offline rebuilds from the lock and the package cache alone, to the same image.
    let rebuilt = offline(&[
        "build",
        "recipes/image.toml",
        "--offline",
        "--locked",
        "-o",
        "out/a",
    ])
    .success();
    assert_eq!(rebuilt.digest(), online.digest());

    // Without the lock, --offline solves from the cached repodata: the same lock again.
    fs_err::remove_file(project.lock_path()).unwrap();
    let resolved = offline(&["build", "recipes/image.toml", "--offline", "-o", "out/b"]).success();
    assert_eq!(resolved.digest(), online.digest());
    assert_eq!(fs_err::read_to_string(project.lock_path()).unwrap(), lock);

    // Online without a server, the failure names the channel URL.
    fs_err::remove_file(project.lock_path()).unwrap();
    let run = offline(&["build", "recipes/image.toml", "-o", "out/c"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr.contains(&format!("{alias}testchan")),
        "{}",
        run.stderr
    );
}

#[test]
fn the_target_glibc_comes_from_the_base_image() {
    // A base holding the build host's real libc.so.6; the expected version comes from
    // glibc itself.
    let host = crate::common::run_tool("getconf", &["GNU_LIBC_VERSION"]);
    let host_version = host
        .trim()
        .strip_prefix("glibc ")
        .expect("a glibc host")
        .to_string();
    let project = Project::new();
    let base = project.path().join("base");
    let bundle = project.path().join("base-bundle");
    let image = format!("{}:latest", base.display());
    let umoci = |args: &[&str]| crate::support::base::umoci(args).unwrap();
    umoci(&["init", "--layout", base.to_str().unwrap()]);
    umoci(&["new", "--image", &image]);
    umoci(&["unpack", "--image", &image, bundle.to_str().unwrap()]);
    let lib = bundle.join("rootfs/usr/lib/x86_64-linux-gnu");
    fs_err::create_dir_all(&lib).unwrap();
    fs_err::copy("/lib/x86_64-linux-gnu/libc.so.6", lib.join("libc.so.6")).unwrap();
    umoci(&["repack", "--image", &image, bundle.to_str().unwrap()]);

    let recipe = tiny_recipe(shared_channel(), "glibc", &["hello 1.0"])
        .replace("base = \"scratch\"", "base = \"oci:../base\"");
    project.write_recipe(&recipe);
    project.run(&["lock", "recipes/image.toml"]).success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(
        lock.contains(&format!("__glibc={host_version}=0")),
        "{lock}"
    );
    assert!(lock.starts_with("# Generated by imgbuild"), "{lock}");
    assert!(
        lock.contains("# imgbuild-base: sha256:"),
        "the base is pinned:\n{lock}"
    );

    // The recipe's own `glibc` wins over the base's.
    project.write_recipe(&recipe.replace("platforms", "glibc = \"2.28\"\nplatforms"));
    project.run(&["lock", "recipes/image.toml"]).success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("__glibc=2.28=0"), "{lock}");
}

#[test]
fn a_record_without_sha256_is_locked_and_built_from_the_lock() {
    use crate::support::channel::{file, index_channel, linux64_index, write_package};
    // A channel whose repodata gives only an md5, as some old channels do.
    let channel = tempfile::tempdir().unwrap();
    let linux64 = channel.path().join("linux-64");
    fs_err::create_dir_all(&linux64).unwrap();
    fs_err::create_dir_all(channel.path().join("noarch")).unwrap();
    write_package(
        &linux64.join("oldpkg-1.0-h0_0.tar.bz2"),
        linux64_index("oldpkg", "1.0", &[]),
        &[file("share/oldpkg/data.txt", "old\n")],
        None,
    )
    .unwrap();
    index_channel(channel.path()).unwrap();
    let repodata_path = linux64.join("repodata.json");
    let mut repodata: serde_json::Value =
        serde_json::from_str(&fs_err::read_to_string(&repodata_path).unwrap()).unwrap();
    let record = &mut repodata["packages"]["oldpkg-1.0-h0_0.tar.bz2"];
    assert!(record["md5"].is_string(), "{record}");
    record.as_object_mut().unwrap().remove("sha256");
    fs_err::write(&repodata_path, repodata.to_string()).unwrap();

    let project = Project::new();
    project.write_recipe(&tiny_recipe(channel.path(), "oldrec", &["oldpkg"]));
    project.build(&[]).success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("oldpkg-1.0-h0_0.tar.bz2"), "{lock}");
    assert!(!lock.contains("sha256: "), "no sha256 to pin:\n{lock}");
    assert!(lock.contains("md5: "), "pinned by md5:\n{lock}");

    // The lock it wrote is read back: a second build of the image reuses it.
    fs_err::remove_dir_all(project.path().join("images/oldrec")).unwrap();
    let run = project.build(&["--locked"]).success();
    assert!(
        run.stderr.contains("Reusing recipes/image.lock"),
        "{}",
        run.stderr
    );

    // The md5 is then what the download is checked against: a forged one is refused, and a
    // record with neither digest is refused before anything is fetched (issue 15: a lock is
    // a claim, not a credential). A fresh cache, so the package is fetched again.
    let md5 = lock
        .lines()
        .find_map(|l| l.trim().strip_prefix("md5: "))
        .expect("an md5 line")
        .to_string();
    for (forged, needle) in [
        (lock.replace(&md5, &"0".repeat(32)), "has md5"),
        (lock.replace(&format!("md5: {md5}"), ""), "so is the md5"),
    ] {
        fs_err::write(project.lock_path(), &forged).unwrap();
        let run = project.run_with(
            &[
                "build",
                "recipes/image.toml",
                "--locked",
                "-o",
                "images/forged",
            ],
            &[(
                "IMGBUILD_CACHE_DIR",
                project.path().join("fresh-cache").to_str().unwrap(),
            )],
            None,
        );
        run.assert_failure_naming(1, &["oldpkg-1.0-h0_0", needle]);
    }
}

/// A local channel of `(name, version, depends)` packages, indexed; written again with
/// more versions as the channel gets new releases.
fn release(channel: &std::path::Path, packages: &[(&str, &str, &[&str])]) {
    use crate::support::channel::{file, index_channel, linux64_index, write_package};
    let linux64 = channel.join("linux-64");
    fs_err::create_dir_all(&linux64).unwrap();
    for (name, version, depends) in packages {
        write_package(
            &linux64.join(format!("{name}-{version}-h0_0.tar.bz2")),
            linux64_index(name, version, depends),
            &[file(format!("share/{name}"), version.as_bytes())],
            None,
        )
        .unwrap();
    }
    index_channel(channel).unwrap();
}

#[test]
fn lock_update_moves_the_named_package_and_keeps_every_other_pin() {
    let project = Project::new();
    let channel = project.path().join("channel");
    release(&channel, &[("alpha", "1.0", &[]), ("beta", "1.0", &[])]);
    project.write_recipe(&tiny_recipe(&channel, "upd", &["alpha", "beta"]));
    project.run(&["lock", "recipes/image.toml"]).success();
    let read = || fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(read().contains("alpha-1.0-h0_0") && read().contains("beta-1.0-h0_0"));

    // Both get a release; only alpha is asked for.
    release(&channel, &[("alpha", "2.0", &[]), ("beta", "2.0", &[])]);
    let run = project
        .run(&["lock", "recipes/image.toml", "--update", "alpha"])
        .success();
    let lock = read();
    assert!(lock.contains("alpha-2.0-h0_0"), "{lock}");
    assert!(lock.contains("beta-1.0-h0_0"), "beta kept:\n{lock}");
    assert!(
        run.stderr.contains("updated alpha: 1 pin moved")
            && run.stderr.contains("linux-64: alpha 1.0-h0_0 -> 2.0-h0_0"),
        "{}",
        run.stderr
    );

    // A kept pin gives way when the update needs it to: alpha 3.0 needs beta 2.0.
    release(&channel, &[("alpha", "3.0", &["beta >=2.0"])]);
    let run = project
        .run(&["lock", "recipes/image.toml", "--update", "alpha", "--json"])
        .success();
    let event: serde_json::Value = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "lock")
        .expect("a lock event");
    assert_eq!(event["reason"], "--update alpha", "{event}");
    assert_eq!(
        event["changes"],
        serde_json::json!([
            "linux-64: alpha 2.0-h0_0 -> 3.0-h0_0",
            "linux-64: beta 1.0-h0_0 -> 2.0-h0_0"
        ])
    );
    // A plain `lock` solves from scratch, as before.
    release(&channel, &[("beta", "2.5", &[])]);
    project.run(&["lock", "recipes/image.toml"]).success();
    assert!(read().contains("beta-2.5-h0_0"), "{}", read());

    // A name the lock does not pin, and no lock at all, are refused naming them.
    let before = read();
    project
        .run(&["lock", "recipes/image.toml", "--update", "gamma"])
        .assert_failure_naming(1, &["`--update gamma`", "pins no package or wheel `gamma`"]);
    assert_eq!(read(), before, "a refused update leaves the lock as it was");
    fs_err::remove_file(project.lock_path()).unwrap();
    project
        .run(&["lock", "recipes/image.toml", "--update", "alpha"])
        .assert_failure_naming(1, &["does not exist: run `imgbuild lock` first"]);
}
