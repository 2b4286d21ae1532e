//! Hostile `[[files]]` sources (issue 26): every read of the recipe's own files resolves
//! beneath the build context, the recipe's directory or the one `context` names. A `src`
//! that climbs out, a link in any component that leads out (to `/`, `/proc/self`, a
//! secret), a fifo, an ignore file that is a link out, and names with control or
//! bidirectional characters are refused at the recipe's line, exit 1, naming the path;
//! the canary's secret reaches no output, the canary is untouched and the image built
//! before is intact.

use std::{
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use crate::{
    common::{LayoutView, Project, Run, run_with_deadline, unpack},
    support::{channel::tiny_recipe, shared_channel},
    trust::{Canary, Tree},
};

/// A project with an image built from a recipe with one good `[[files]]` entry, and a
/// canary outside it.
struct Victim {
    project: Project,
    canary: Canary,
    /// The recipe that built the image, without the hostile entry.
    recipe: String,
    images: Tree,
}

impl Victim {
    fn new() -> Self {
        let project = Project::new();
        let recipe = tiny_recipe(shared_channel(), "victim", &["hello 1.0"])
            + "\n[[files]]\nsrc = \"app\"\ndest = \"/app\"\n";
        project.write_recipe(&recipe);
        fs_err::create_dir_all(project.path().join("recipes/app")).unwrap();
        fs_err::write(project.path().join("recipes/app/main.py"), "print(1)\n").unwrap();
        project.build(&[]).success();
        let images = Tree::of(&project.path().join("images"));
        Victim {
            project,
            canary: Canary::new(),
            recipe,
            images,
        }
    }

    /// The recipe's directory, the default build context.
    fn recipes(&self) -> PathBuf {
        self.project.path().join("recipes")
    }

    /// The canary's secret file as a path relative to the recipe's directory.
    fn canary_from_recipes(&self) -> String {
        let up = "../".repeat(self.recipes().components().count() - 1);
        format!(
            "{up}{}",
            self.canary.file().to_str().unwrap().trim_start_matches('/')
        )
    }

    /// Builds the recipe with `entry` added as a second `[[files]]`, the canary's secret
    /// in imgbuild's environment (so `/proc/self/environ` holds it too).
    fn build_with(&self, entry: &str) -> Run {
        self.project
            .write_recipe(&format!("{}\n[[files]]\n{entry}\n", self.recipe));
        let args = ["build", "recipes/image.toml"];
        let mut command = self.project.command(&args);
        command.env("IMGBUILD_TEST_CANARY", &self.canary.secret);
        run_with_deadline(command, &self.project, &args)
    }

    /// `entry` is refused, exit 1, naming every one of `needles`; nothing leaked, nothing
    /// written outside the outputs, the previous image intact.
    #[track_caller]
    fn refuses(&self, entry: &str, needles: &[&str]) {
        let run = self.build_with(entry);
        run.assert_failure_naming(1, needles);
        assert!(
            run.stderr.contains("recipes/image.toml:"),
            "at the recipe's line: {}",
            run.stderr
        );
        self.assert_safe(&run);
    }

    #[track_caller]
    fn assert_safe(&self, run: &Run) {
        assert!(!run.stderr.contains(&self.canary.secret), "{}", run.stderr);
        assert!(!run.stdout.contains(&self.canary.secret), "{}", run.stdout);
        self.canary.assert_not_in(self.project.path());
        self.canary.assert_untouched();
        assert_eq!(
            Tree::of(&self.project.path().join("images")),
            self.images,
            "the image built before changed"
        );
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "{}",
        path.display()
    );
}

const OUTSIDE: &str = "leads outside the build context";

#[test]
fn a_src_that_climbs_out_or_is_absolute_is_refused() {
    let victim = Victim::new();
    let climb = victim.canary_from_recipes();
    victim.refuses(
        &format!("src = \"{climb}\"\ndest = \"/x\""),
        &[
            &format!("`src` `{climb}`"),
            "climbs out of the build context",
        ],
    );
    fs_err::create_dir_all(victim.recipes().join("a")).unwrap();
    victim.refuses(
        &format!("src = \"a/../{climb}\"\ndest = \"/x\""),
        &["climbs out of the build context"],
    );
    let absolute = victim.canary.file();
    victim.refuses(
        &format!("src = \"{}\"\ndest = \"/x\"", absolute.display()),
        &["`src` must be a path relative to the recipe"],
    );
}

#[test]
fn a_link_in_any_component_of_src_that_leads_out_is_refused() {
    let victim = Victim::new();
    let dir = victim.recipes();
    let canary = victim.canary.dir();
    // A directory link in the middle, to the canary, to `/`, and through a chain.
    symlink(canary, dir.join("sub")).unwrap();
    symlink("/", dir.join("root")).unwrap();
    symlink("hop", dir.join("chain")).unwrap();
    symlink(canary, dir.join("hop")).unwrap();
    let in_root = canary.join("secret.txt");
    let in_root = in_root.to_str().unwrap().trim_start_matches('/');
    for src in [
        "sub/secret.txt".to_string(),
        "sub/secrets".to_string(),
        format!("root/{in_root}"),
        "chain/secrets/inner.txt".to_string(),
    ] {
        victim.refuses(
            &format!("src = \"{src}\"\ndest = \"/x\""),
            &[&format!("recipes/{src}`"), OUTSIDE],
        );
    }
    // An absolute link inside a directory `src` is refused as before.
    fs_err::create_dir_all(dir.join("tree")).unwrap();
    symlink(victim.canary.file(), dir.join("tree/evil")).unwrap();
    victim.refuses(
        "src = \"tree\"\ndest = \"/x\"",
        &["recipes/tree/evil` is a link to", "outside `src` `tree`"],
    );
}

#[test]
fn proc_self_is_refused_by_name_and_through_a_link() {
    let victim = Victim::new();
    let dir = victim.recipes();
    let up = "../".repeat(dir.components().count() - 1);
    victim.refuses(
        &format!("src = \"{up}proc/self/environ\"\ndest = \"/x\""),
        &["climbs out of the build context"],
    );
    symlink("/proc/self", dir.join("me")).unwrap();
    victim.refuses(
        "src = \"me/environ\"\ndest = \"/x\"",
        &["recipes/me/environ`", OUTSIDE],
    );
    // `/proc/self/root` is a magic link to the host's `/`.
    symlink("/proc/self/root", dir.join("host")).unwrap();
    let secret = victim.canary.file();
    let secret = secret.to_str().unwrap();
    victim.refuses(
        &format!("src = \"host{secret}\"\ndest = \"/x\""),
        &[&format!("recipes/host{secret}`"), OUTSIDE],
    );
}

#[test]
fn fifos_are_refused_without_waiting() {
    let victim = Victim::new();
    let dir = victim.recipes();
    mkfifo(&dir.join("pipe"));
    victim.refuses(
        "src = \"pipe\"\ndest = \"/x\"",
        &["`src` `pipe` is a named pipe"],
    );
    fs_err::create_dir_all(dir.join("tree")).unwrap();
    mkfifo(&dir.join("tree/pipe"));
    victim.refuses(
        "src = \"tree\"\ndest = \"/x\"",
        &["recipes/tree/pipe` is a named pipe"],
    );
    fs_err::create_dir_all(dir.join("ignored")).unwrap();
    mkfifo(&dir.join("ignored/.dockerignore"));
    victim.refuses(
        "src = \"ignored\"\ndest = \"/x\"",
        &[
            "recipes/ignored/.dockerignore`",
            "is a fifo, not a regular file",
        ],
    );
}

#[test]
fn an_ignore_file_that_is_a_link_or_huge_is_refused() {
    let victim = Victim::new();
    let dir = victim.recipes();
    fs_err::create_dir_all(dir.join("linked")).unwrap();
    symlink(victim.canary.file(), dir.join("linked/.dockerignore")).unwrap();
    victim.refuses(
        "src = \"linked\"\ndest = \"/x\"",
        &["recipes/linked/.dockerignore`", "is a symbolic link"],
    );
    fs_err::create_dir_all(dir.join("inner")).unwrap();
    fs_err::write(dir.join("inner/ignore"), "*.tmp\n").unwrap();
    symlink("ignore", dir.join("inner/.imgbuildignore")).unwrap();
    victim.refuses(
        "src = \"inner\"\ndest = \"/x\"",
        &["recipes/inner/.imgbuildignore`", "is a symbolic link"],
    );
    fs_err::create_dir_all(dir.join("huge")).unwrap();
    fs_err::write(dir.join("huge/.dockerignore"), "#".repeat(2 << 20)).unwrap();
    victim.refuses(
        "src = \"huge\"\ndest = \"/x\"",
        &["recipes/huge/.dockerignore`", "at most 1048576 are read"],
    );
}

#[test]
fn names_with_control_or_bidirectional_characters_are_refused() {
    let victim = Victim::new();
    let dir = victim.recipes();
    for (i, (name, shown, what)) in [
        ("a\nb", "a<U+000A>b", "a newline (U+000A)"),
        (
            "red\u{1b}[31m",
            "red<U+001B>[31m",
            "the control character U+001B",
        ),
        (
            "txt.\u{202e}exe",
            "txt.<U+202E>exe",
            "the bidirectional control U+202E",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let tree = dir.join(format!("names{i}"));
        fs_err::create_dir_all(&tree).unwrap();
        fs_err::write(tree.join(name), "x").unwrap();
        victim.refuses(
            &format!("src = \"names{i}\"\ndest = \"/x\""),
            &[&format!(
                "recipes/names{i}/{shown}` has a name that contains {what}"
            )],
        );
        // The name is shown escaped, never raw.
        let run = victim.build_with(&format!("src = \"names{i}\"\ndest = \"/x\""));
        assert!(!run.stderr.contains(name), "{}", run.stderr);
    }
    fs_err::create_dir_all(dir.join("target")).unwrap();
    fs_err::write(dir.join("target/a\u{202e}b"), "x").unwrap();
    symlink("a\u{202e}b", dir.join("target/link")).unwrap();
    victim.refuses(
        "src = \"target\"\ndest = \"/x\"\nexclude = [\"a*\"]",
        &["recipes/target/link` is a link whose target contains the bidirectional control U+202E"],
    );
    fs_err::create_dir_all(dir.join("plain")).unwrap();
    victim.refuses(
        "src = \"plain\"\ndest = \"/x\\ny\"",
        &["`dest` `/x<U+000A>y` contains a newline (U+000A)"],
    );
}

#[test]
fn a_widened_context_reads_beneath_it_and_no_further() {
    let mut victim = Victim::new();
    let root = victim.project.path().to_path_buf();
    fs_err::create_dir_all(root.join("shared")).unwrap();
    fs_err::write(root.join("shared/data.txt"), "shared\n").unwrap();
    let entry = "context = \"..\"\nsrc = \"shared\"\ndest = \"/shared\"";
    let run = victim.build_with(entry);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let rootfs = unpack(&root.join("images/victim"), "latest", &root.join("bundle"));
    assert_eq!(
        fs_err::read_to_string(rootfs.join("shared/data.txt")).unwrap(),
        "shared\n"
    );
    let history = LayoutView::new(root.join("images/victim")).config()["history"].to_string();
    assert!(history.contains("imgbuild: files /shared"), "{history}");
    fs_err::remove_dir_all(root.join("bundle")).unwrap();
    // The image is rebuilt: what was built with the wider context is the one to keep.
    victim.images = Tree::of(&root.join("images"));
    // Beyond the widened context: by `..`, by a link, and a context beyond the directory
    // imgbuild runs in.
    let climb = victim.canary_from_recipes().replacen("../", "", 1);
    victim.refuses(
        &format!("context = \"..\"\nsrc = \"{climb}\"\ndest = \"/x\""),
        &[
            "climbs out of the build context",
            &format!("`{}`", root.display()),
        ],
    );
    symlink(victim.canary.dir(), root.join("shared/out")).unwrap();
    victim.refuses(
        "context = \"..\"\nsrc = \"shared/out/secret.txt\"\ndest = \"/x\"",
        &["shared/out/secret.txt`", OUTSIDE],
    );
    victim.refuses(
        "context = \"../..\"\nsrc = \"x\"\ndest = \"/x\"",
        &[
            "`context` `",
            "is not beneath the directory imgbuild runs in",
        ],
    );
    let canary = victim.canary.dir().display().to_string();
    victim.refuses(
        &format!("context = \"{canary}\"\nsrc = \"secret.txt\"\ndest = \"/x\""),
        &[
            &format!("`context` `{canary}`"),
            "is not beneath the directory imgbuild runs in",
        ],
    );
}
