//! Hostile `[accounts]` (issue 26): a home or the workdir of `[image] user` is a directory
//! the build makes and gives to the user, so it never takes over `/`, a system tree (`/etc`,
//! and so `/etc/passwd`), a shared parent (`/home`, `/opt`), root's home or the conda
//! prefix; and uid 0 is root's alone. Each is refused at the recipe's key (`file:line:col`),
//! exit 1, and the previous image stays as it was.

use crate::{
    common::Project,
    support::{channel::tiny_recipe, shared_channel},
    trust::Tree,
};

/// The test recipe with `image` added to `[image]`, the group `app` (1000) and `users`.
fn recipe(image: &str, users: &str) -> String {
    tiny_recipe(shared_channel(), "acct", &["hello 1.0"]).replace(
        "base = \"scratch\"",
        &format!("base = \"scratch\"\n{image}"),
    ) + "\n[[accounts.groups]]\nname = \"app\"\ngid = 1000\n\n"
        + users
}

/// One user entry, of the group `app`.
fn user(name: &str, uid: u32, extra: &str) -> String {
    format!("[[accounts.users]]\nname = \"{name}\"\nuid = {uid}\ngid = 1000\n{extra}\n")
}

/// The 1-based line of `text` that holds `needle` (the first).
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle} in {text}"))
        + 1
}

/// A project with a built image of good accounts (a home under /srv, a workdir under
/// /workspace): the previous image each refused build must leave.
fn built() -> (Project, Tree) {
    let project = Project::new();
    project.write_recipe(&recipe(
        "user = \"app\"\nworkdir = \"/workspace/app\"",
        &user("app", 1000, "home = \"/srv/app/home\""),
    ));
    project.build(&[]).success();
    let tree = Tree::of(&project.path().join("images"));
    (project, tree)
}

/// Builds `text`, which must be refused naming `needle` at `line`.
#[track_caller]
fn refused(project: &Project, before: &Tree, text: &str, line: usize, needle: &str) {
    project.write_recipe(text);
    project
        .build(&[])
        .assert_failure_naming(1, &[needle, &format!("recipes/image.toml:{line}:")]);
    assert_eq!(
        &Tree::of(&project.path().join("images")),
        before,
        "the previous image changed"
    );
}

#[test]
fn homes_never_take_over_system_paths() {
    let (project, before) = built();
    for (home, needle) in [
        ("/etc/passwd", "in the system tree `/etc`"),
        ("/etc", "in the system tree `/etc`"),
        ("//etc/./passwd", "in the system tree `/etc`"),
        ("/", "the root directory"),
        ("/proc/x", "in the system tree `/proc`"),
        ("/usr/local/app", "in the system tree `/usr`"),
        ("/var/lib/dpkg", "in the system tree `/var`"),
        ("/home", "holds other users'"),
        ("/tmp", "holds other users'"),
        ("/opt/conda", "the conda prefix `/opt/conda`"),
        ("/opt/conda/envs/x", "the conda prefix"),
        ("/root", "root's home"),
        ("/home/../etc", "without `..`"),
    ] {
        let text = recipe("", &user("app", 1000, &format!("home = \"{home}\"")));
        refused(&project, &before, &text, line_of(&text, "home = "), needle);
    }
    // A prefix elsewhere: the directory that holds it is refused too.
    let text = recipe(
        "prefix = \"/work/env\"",
        &user("app", 1000, "home = \"/work\""),
    );
    let line = line_of(&text, "home = ");
    refused(
        &project,
        &before,
        &text,
        line,
        "the conda prefix `/work/env`",
    );
}

#[test]
fn the_workdir_given_to_the_user_never_takes_over_system_paths() {
    let (project, before) = built();
    for (workdir, needle) in [
        ("/etc", "in the system tree `/etc`"),
        ("/etc/ssh", "in the system tree `/etc`"),
        ("/opt", "holds other users'"),
        ("/opt/conda/lib", "the conda prefix"),
    ] {
        let text = recipe(
            &format!("user = \"app\"\nworkdir = \"{workdir}\""),
            &user("app", 1000, ""),
        );
        refused(
            &project,
            &before,
            &text,
            line_of(&text, "workdir = "),
            needle,
        );
    }
    // A numeric user without [accounts] gets the workdir too.
    let text = recipe("user = \"1000:1000\"\nworkdir = \"/etc\"", "");
    assert!(!text.contains("[[accounts.users]]"));
    let line = line_of(&text, "workdir = ");
    refused(&project, &before, &text, line, "`workdir` `/etc`");
}

#[test]
fn uid_0_is_roots_alone() {
    let (project, before) = built();
    let text = recipe(
        "",
        &(user("root", 0, "home = \"/root\"") + &user("toor", 0, "")),
    );
    // The second's uid: the line after its name.
    let line = line_of(&text, "name = \"toor\"") + 1;
    refused(&project, &before, &text, line, "uid 0 is root's");
    let text = recipe("", &user("toor", 0, ""));
    refused(
        &project,
        &before,
        &text,
        line_of(&text, "uid = 0"),
        "user `toor` has uid 0",
    );
    let text = recipe("", &user("root", 1000, ""));
    let line = line_of(&text, "name = \"root\"");
    refused(&project, &before, &text, line, "user `root` has uid 1000");
    // root itself, with its home, is fine: it builds.
    project.write_recipe(&recipe("", &user("root", 0, "home = \"/root\"")));
    project.build(&[]).success();
}
