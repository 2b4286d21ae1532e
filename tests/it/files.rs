//! `[[files]]` (issue 17, section 1): the recipe's own files in layers above the
//! environment's, with their owners, modes and links, excludes and ignore files honoured,
//! reproducible, rebuilt alone when they change, and every hostile source refused at its
//! line without writing anything.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt, symlink},
    path::Path,
};

use crate::{
    common::{LayoutView, Project, is_root, unpack},
    support::{channel::tiny_recipe, shared_channel},
};

const ACCOUNTS: &str = "\n[[accounts.groups]]\nname = \"jovyan\"\ngid = 1000\n\n\
    [[accounts.users]]\nname = \"jovyan\"\nuid = 1000\ngid = 1000\n";

const FILES: &str = "\n[[files]]\nsrc = \"app\"\ndest = \"/home/jovyan/app\"\nowner = \"jovyan\"\n\
    exclude = [\"*.tmp\", \".ipynb_checkpoints/\"]\n\n\
    [[files]]\nsrc = \"config.yaml\"\ndest = \"/etc/app/\"\nowner = \"1000:1000\"\nmode = \"0600\"\n";

/// A project whose recipe copies `recipes/app/` and `recipes/config.yaml`.
fn project_with_files() -> Project {
    let project = Project::new();
    project
        .write_recipe(&(tiny_recipe(shared_channel(), "files", &["hello 1.0"]) + ACCOUNTS + FILES));
    let app = project.path().join("recipes/app");
    for dir in ["bin", "nb/.ipynb_checkpoints"] {
        fs_err::create_dir_all(app.join(dir)).unwrap();
    }
    fs_err::write(app.join("main.py"), "print('hi')\n").unwrap();
    fs_err::write(app.join("bin/run.sh"), "#!/bin/sh\n").unwrap();
    fs_err::set_permissions(
        app.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    fs_err::write(app.join("scratch.tmp"), "x").unwrap();
    fs_err::write(app.join("nb/.ipynb_checkpoints/a.ipynb"), "{}").unwrap();
    fs_err::write(app.join("nb/a.ipynb"), "{}").unwrap();
    fs_err::write(app.join("secret.txt"), "s").unwrap();
    fs_err::write(
        app.join(".imgbuildignore"),
        "# not for the image\nsecret.txt\n",
    )
    .unwrap();
    symlink("bin/run.sh", app.join("run")).unwrap();
    symlink("../main.py", app.join("bin/main.py")).unwrap();
    fs_err::write(project.path().join("recipes/config.yaml"), "a: 1\n").unwrap();
    project
}

/// A `--json` build's `unchanged`.
fn unchanged(project: &Project) -> Option<bool> {
    let run = project.build(&["--json"]).success();
    run.stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["event"] == "result")
        .and_then(|result| result["unchanged"].as_bool())
}

fn layer_digests(project: &Project) -> Vec<String> {
    LayoutView::new(project.path().join("images/files"))
        .layers()
        .into_iter()
        .map(|(_, digest)| digest)
        .collect()
}

#[test]
fn files_keep_their_owner_mode_and_links_and_leave_out_what_is_excluded() {
    let project = project_with_files();
    project.build(&[]).success();
    let layout_dir = project.path().join("images/files");
    let layout = LayoutView::new(&layout_dir);
    let history: Vec<String> = layout.config()["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["created_by"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        history[history.len() - 3..],
        [
            "imgbuild: accounts",
            "imgbuild: files /home/jovyan/app",
            "imgbuild: files /etc/app"
        ]
    );
    let inspect = project.run(&["inspect", "images/files"]).success().stdout;
    assert!(inspect.contains("  files\n"), "{inspect}");

    let rootfs = unpack(&layout_dir, "latest", &project.path().join("bundle"));
    let app = rootfs.join("home/jovyan/app");
    assert_eq!(
        fs_err::read_to_string(app.join("main.py")).unwrap(),
        "print('hi')\n"
    );
    assert_eq!(
        fs_err::read_link(app.join("run")).unwrap(),
        Path::new("bin/run.sh")
    );
    assert_eq!(
        fs_err::read_link(app.join("bin/main.py")).unwrap(),
        Path::new("../main.py")
    );
    assert!(app.join("nb/a.ipynb").is_file());
    for gone in [
        "scratch.tmp",
        "nb/.ipynb_checkpoints",
        "secret.txt",
        ".imgbuildignore",
    ] {
        assert!(!app.join(gone).exists(), "{gone} is excluded");
    }
    let mode = |path: &Path| fs_err::symlink_metadata(path).unwrap().mode() & 0o7777;
    // No mode: executables 0755, files 0644, directories 0755, as package layers.
    assert_eq!(mode(&app.join("bin/run.sh")), 0o755);
    assert_eq!(mode(&app.join("main.py")), 0o644);
    assert_eq!(mode(&app.join("bin")), 0o755);
    let config = rootfs.join("etc/app/config.yaml");
    assert_eq!(fs_err::read_to_string(&config).unwrap(), "a: 1\n");
    assert_eq!(mode(&config), 0o600);
    if is_root() {
        // umoci applies the layer's owners when it runs as root.
        let owner = |path: &Path| {
            let meta = fs_err::symlink_metadata(path).unwrap();
            (meta.uid(), meta.gid())
        };
        for path in [&app, &app.join("main.py"), &app.join("run"), &config] {
            assert_eq!(owner(path), (1000, 1000), "{}", path.display());
        }
        // The files layer names no parent of `dest`: the home keeps the accounts layer's owner.
        assert_eq!(owner(&rootfs.join("home/jovyan")), (1000, 1000));
    }
    // Every entry carries the image's `created` as its mtime.
    let created = layout.config()["created"].as_str().unwrap().to_string();
    let mtime = fs_err::metadata(app.join("main.py")).unwrap().mtime();
    let expected = jiff::Timestamp::from_second(mtime).unwrap().to_string();
    assert_eq!(
        expected.trim_end_matches('Z'),
        created.trim_end_matches('Z')
    );
}

#[test]
fn a_changed_file_rebuilds_only_its_layer_and_builds_elsewhere_match() {
    let project = project_with_files();
    let first = project.build(&[]).success().digest();
    let before = layer_digests(&project);
    // Another directory, the same bytes: the same image.
    let elsewhere = project_with_files();
    assert_eq!(elsewhere.build(&[]).success().digest(), first);

    // Nothing changed: the build record of these inputs (the sources' digests among them)
    // names the image in place.
    assert_eq!(unchanged(&project), Some(true));

    fs_err::write(
        project.path().join("recipes/app/main.py"),
        "print('changed')\n",
    )
    .unwrap();
    assert_eq!(unchanged(&project), Some(false));
    let second = project.build(&[]).success();
    assert_ne!(second.digest(), first);
    let after = layer_digests(&project);
    assert_eq!(before.len(), after.len());
    // For the closing note of issue 17: the digests of both builds.
    eprintln!(
        "files: image {first} in two directories; after one file changed {}\nlayers before {before:?}\nlayers after  {after:?}",
        second.digest()
    );
    let changed: Vec<usize> = (0..before.len())
        .filter(|i| before[*i] != after[*i])
        .collect();
    // The app's layer, second from the top, and nothing else.
    assert_eq!(changed, [before.len() - 2], "{before:?}\n{after:?}");
}

/// The lock's `# imgbuild-files:` line, and the lock without it.
fn lock_parts(project: &Project) -> (String, String) {
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    let (pins, rest): (Vec<&str>, Vec<&str>) = lock
        .lines()
        .partition(|l| l.starts_with("# imgbuild-files: "));
    assert_eq!(pins.len(), 1, "one pin line:\n{lock}");
    (pins[0].to_string(), rest.join("\n"))
}

#[test]
fn the_lock_pins_each_source_so_locked_builds_and_verify_notice_a_change() {
    let project = project_with_files();
    project.build(&[]).success();
    let (pins, packages) = lock_parts(&project);
    assert!(
        pins.contains("\"src\":\"app\"") && pins.contains("\"src\":\"config.yaml\""),
        "{pins}"
    );
    project.build(&["--locked"]).success();
    let verify = ["verify", "images/files", "--recipe", "recipes/image.toml"];
    project.run(&verify).success();

    fs_err::write(
        project.path().join("recipes/app/main.py"),
        "print('changed')\n",
    )
    .unwrap();
    let changed = "`[[files]]` source `app` changed";
    project
        .build(&["--locked"])
        .assert_failure_naming(1, &["no longer satisfies the recipe", changed]);
    let stale = project.run(&verify);
    stale.assert_clean_failure(1);
    assert!(stale.stderr.contains(changed), "{}", stale.stderr);

    // A plain build pins the sources again and keeps every package: no solve.
    let repinned = project.build(&[]).success();
    assert!(
        repinned.stderr.contains("files pinned again because") && repinned.stderr.contains(changed),
        "{}",
        repinned.stderr
    );
    assert!(!repinned.stderr.contains("Solving"), "{}", repinned.stderr);
    let (new_pins, new_packages) = lock_parts(&project);
    assert_ne!(new_pins, pins);
    assert_eq!(new_packages, packages);
    project.build(&["--locked"]).success();
    project.run(&verify).success();
}

#[test]
fn the_provenance_lists_each_source_as_the_lock_pins_it_and_verify_holds_it_to_them() {
    let project = project_with_files();
    project.build(&[]).success();
    let (pins, _) = lock_parts(&project);
    let pinned: serde_json::Value =
        serde_json::from_str(pins.trim_start_matches("# imgbuild-files: ")).unwrap();
    let path = project.path().join("images/files.provenance.json");
    let mut statement: serde_json::Value =
        serde_json::from_slice(&fs_err::read(&path).unwrap()).unwrap();
    let files = &statement["predicate"]["buildDefinition"]["externalParameters"]["files"];
    assert_eq!(files, &pinned, "{statement}");
    assert_eq!(files[0]["src"], "app");
    assert_eq!(files[1]["src"], "config.yaml");
    project
        .run(&[
            "verify",
            "images/files",
            "--provenance",
            "--lock",
            "recipes/image.lock",
        ])
        .success();

    // A provenance that claims another source digest is refused, naming both.
    let claimed = format!("sha256:{}", "0".repeat(64));
    statement["predicate"]["buildDefinition"]["externalParameters"]["files"][1]["digest"] =
        claimed.clone().into();
    fs_err::write(
        project.path().join("edited.json"),
        serde_json::to_string_pretty(&statement).unwrap(),
    )
    .unwrap();
    let locked = pinned[1]["digest"].as_str().unwrap();
    project
        .run(&[
            "verify",
            "images/files",
            "--provenance",
            "edited.json",
            "--lock",
            "recipes/image.lock",
        ])
        .assert_failure_naming(
            1,
            &[
                &format!("`config.yaml` {claimed}"),
                "the lock pins `app`",
                locked,
            ],
        );
}

/// Makes a case's sources in the recipe's directory.
type Setup = dyn Fn(&Path);

#[test]
fn hostile_sources_are_refused_at_their_line_and_nothing_is_written() {
    let cases: &[(&str, &Setup, &[&str])] = &[
        (
            "src = \"missing\"\ndest = \"/x\"",
            &|_| {},
            &["SRC:", "`src` `missing` does not exist"],
        ),
        (
            "src = \"shadow\"\ndest = \"/x\"",
            &|dir| symlink("/etc/shadow", dir.join("shadow")).unwrap(),
            &["SRC:", "`src` `shadow` is a symbolic link"],
        ),
        (
            "src = \"tree\"\ndest = \"/x\"",
            &|dir| {
                fs_err::create_dir_all(dir.join("tree")).unwrap();
                symlink("/etc/shadow", dir.join("tree/evil")).unwrap();
            },
            &["SRC:", "is a link to `/etc/shadow`, outside `src` `tree`"],
        ),
        (
            "src = \"tree\"\ndest = \"/x\"",
            &|dir| {
                fs_err::create_dir_all(dir.join("tree/sub")).unwrap();
                symlink("../../image.toml", dir.join("tree/sub/evil")).unwrap();
            },
            &["SRC:", "is a link to `../../image.toml`, outside"],
        ),
        (
            "src = \"tree\"\ndest = \"/srv/../etc\"",
            &|dir| fs_err::create_dir_all(dir.join("tree")).unwrap(),
            &["DEST:", "without `.`, `..`"],
        ),
        (
            "src = \"tree\"\ndest = \"srv\"",
            &|dir| fs_err::create_dir_all(dir.join("tree")).unwrap(),
            &["DEST:", "must be an absolute path"],
        ),
        (
            "src = \"many\"\ndest = \"/many\"",
            &|dir| {
                let many = dir.join("many");
                fs_err::create_dir_all(&many).unwrap();
                for i in 0..100_001 {
                    fs_err::File::create(many.join(i.to_string())).unwrap();
                }
            },
            &["SRC:", "holds more than 100000 files"],
        ),
    ];
    for (entry, make, needles) in cases {
        let project = Project::new();
        let recipe = tiny_recipe(shared_channel(), "evil", &["hello 1.0"]);
        // The entry's `src` and `dest` lines, after a blank line and `[[files]]`.
        let src_line = recipe.lines().count() + 3;
        project.write_recipe(&format!("{recipe}\n[[files]]\n{entry}\n"));
        make(&project.path().join("recipes"));
        let run = project.build(&[]);
        let needles: Vec<String> = needles
            .iter()
            .map(|n| {
                n.replace("SRC:", &format!("recipes/image.toml:{src_line}:"))
                    .replace("DEST:", &format!("recipes/image.toml:{}:", src_line + 1))
            })
            .collect();
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        run.assert_failure_naming(1, &needles);
        project.assert_no_image();
        assert!(!Path::new("/x").exists() && !Path::new("/many").exists());
    }
}
