//! `[accounts]` (issue 17, section 2): users and groups merged into the base's files, homes
//! and the workdir owned by their user, checked under runc: the process runs as the user
//! by name, `$HOME` exists and is the user's, and the workdir is writable.

use std::path::Path;

use crate::{
    common::{LayoutView, Project, is_root, require_root, run_bundle, run_tool, unpack},
    support::{
        base::{busybox_base_layout, have},
        channel::tiny_recipe,
        shared_channel,
    },
};

const ACCOUNTS: &str = "\n[[accounts.groups]]\nname = \"jovyan\"\ngid = 1000\n\n\
    [[accounts.users]]\nname = \"jovyan\"\nuid = 1000\ngid = 1000\nhome = \"/home/jovyan\"\nshell = \"/bin/sh\"\n";

/// A recipe on the busybox base that runs `script` as `jovyan` in `/home/jovyan/work`.
fn recipe(name: &str, script: &str) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap();
    tiny_recipe(shared_channel(), name, &["hello 1.0"]).replace(
        "base = \"scratch\"",
        &format!(
            "base = \"oci:../base:latest\"\nuser = \"jovyan\"\nworkdir = \"/home/jovyan/work\"\n\
             entrypoint = [\"/bin/busybox\", \"sh\", \"-c\"]\ncmd = [{}]",
            quote(script)
        ),
    ) + ACCOUNTS
}

#[test]
fn a_recipe_user_runs_with_its_name_home_and_a_writable_workdir() {
    if !(have("runc") && have("umoci") && Path::new("/bin/busybox").exists()) {
        panic!("runc, umoci and busybox-static are required: run tests/install-deps.sh");
    }
    let project = Project::new();
    busybox_base_layout(&project.path().join("base")).unwrap();
    project.write_recipe(&recipe(
        "accounts",
        "busybox id; busybox id -un; echo HOME=$HOME; busybox stat -c '%u:%g %a' $HOME .; \
         busybox pwd; echo ok > written && busybox cat written",
    ));
    let digest = project.build(&[]).success().digest();

    let layout_dir = project.path().join("images/accounts");
    let layout = LayoutView::new(&layout_dir);
    // The accounts layer is our top layer, annotated, with its history line.
    let manifest = layout.manifest();
    let top = manifest["layers"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        top["annotations"]["dev.imgbuild.layer.content"], "accounts",
        "{manifest}"
    );
    let history = layout.config()["history"].as_array().unwrap().clone();
    assert_eq!(history.last().unwrap()["created_by"], "imgbuild: accounts");
    let inspect = project
        .run(&["inspect", "images/accounts"])
        .success()
        .stdout;
    assert!(inspect.contains("  accounts\n"), "{inspect}");

    let bundle = project.path().join("bundle");
    let rootfs = unpack(&layout_dir, "latest", &bundle);
    let passwd = fs_err::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert_eq!(
        passwd,
        "root:x:0:0:root:/root:/bin/sh\njovyan:x:1000:1000::/home/jovyan:/bin/sh\n"
    );
    let group = fs_err::read_to_string(rootfs.join("etc/group")).unwrap();
    assert_eq!(group, "root:x:0:\njovyan:x:1000:\n");
    // The base's files are still there under ours.
    assert!(rootfs.join("bin/busybox").is_file());

    require_root!("runc needs root to run a container here");
    let out = run_bundle(&bundle, "accounts");
    assert_eq!(
        out,
        "uid=1000(jovyan) gid=1000(jovyan)\njovyan\nHOME=/home/jovyan\n\
         1000:1000 755\n1000:1000 755\n/home/jovyan/work\nok\n",
        "{out}"
    );

    // Two builds in two directories give the same image.
    let again = Project::new();
    busybox_base_layout(&again.path().join("base")).unwrap();
    again.write_recipe(&fs_err::read_to_string(project.recipe_path()).unwrap());
    assert_eq!(again.build(&[]).success().digest(), digest);
    eprintln!("accounts: image {digest} in two directories");
}

#[test]
fn accounts_on_scratch_are_written_fresh_and_read_by_umoci() {
    if !have("umoci") {
        panic!("umoci is required: run tests/install-deps.sh");
    }
    let project = Project::new();
    project.write_recipe(&(tiny_recipe(shared_channel(), "fresh", &["hello 1.0"]) + ACCOUNTS));
    project.build(&[]).success();
    let bundle = project.path().join("bundle");
    let rootfs = unpack(&project.path().join("images/fresh"), "latest", &bundle);
    let passwd = fs_err::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd.ends_with("jovyan:x:1000:1000::/home/jovyan:/bin/sh\n"),
        "{passwd}"
    );
    // umoci keeps the owners of the layer (as root it applies them).
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        let home = fs_err::metadata(rootfs.join("home/jovyan")).unwrap();
        assert_eq!((home.uid(), home.gid()), (1000, 1000));
    }
}

#[test]
fn a_clash_with_the_base_or_an_unknown_user_is_refused_naming_both() {
    let project = Project::new();
    let base = project.path().join("base");
    busybox_base_layout(&base).unwrap();
    // A base whose /etc/passwd already has uid 1000.
    let bundle = project.path().join("base-bundle");
    run_tool(
        "umoci",
        &[
            "unpack",
            "--rootless",
            "--image",
            &format!("{}:latest", base.display()),
            bundle.to_str().unwrap(),
        ],
    );
    fs_err::write(
        bundle.join("rootfs/etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh\n",
    )
    .unwrap();
    run_tool(
        "umoci",
        &[
            "repack",
            "--image",
            &format!("{}:latest", base.display()),
            bundle.to_str().unwrap(),
        ],
    );
    project.write_recipe(&recipe("clash", "true"));
    let run = project.build(&[]);
    run.assert_failure_naming(
        1,
        &[
            "recipes/image.toml:",
            "user `jovyan` (1000) has the ID of the base's /etc/passwd line `ubuntu:x:1000:1000::/home/ubuntu:/bin/sh`",
        ],
    );
    project.assert_no_image();

    let unknown = Project::new();
    let text = tiny_recipe(shared_channel(), "unknown", &["hello 1.0"])
        .replace("base = \"scratch\"", "user = \"nobody\"\nworkdir = \"/w\"");
    unknown.write_recipe(&(text + ACCOUNTS));
    unknown
        .build(&[])
        .assert_failure_naming(1, &["`[image] user` names the user `nobody`"]);
    unknown.assert_no_image();
}
