//! A channel-qualified spec (`pytorch::pkg`) names its channel as the recipe's channels do
//! (issue 31, item 4): through `--channel-alias` behind a mirror, and relative to the
//! recipe for a path. Before, rattler resolved it against conda.anaconda.org, so behind a
//! mirror it matched no channel of the recipe and the lock failed.

use crate::{channel_priority::channel_with_pkg, common::Project};

#[test]
fn a_qualified_spec_locks_from_its_channel_behind_a_mirror() {
    let project = Project::new();
    let mirror = project.path().join("mirror");
    // `pkg` 1.0 in the channel listed first, 2.0 in `pytorch`: strict priority alone would
    // take 1.0, so 2.0 in the lock is the qualifier at work.
    channel_with_pkg(&mirror.join("conda-forge"), "1.0");
    channel_with_pkg(&mirror.join("pytorch"), "2.0");
    project.write_recipe(
        "[image]\nname = \"q\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"conda-forge\", \"pytorch\"]\ndependencies = [\"pytorch::pkg\"]\n",
    );
    let alias = url::Url::from_directory_path(&mirror).unwrap().to_string();
    project
        .run(&["lock", "recipes/image.toml", "--channel-alias", &alias])
        .success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("pkg-2.0-h0_0.tar.bz2"), "{lock}");
    assert!(lock.contains("mirror/pytorch/"), "{lock}");
    assert!(!lock.contains("pkg-1.0"), "{lock}");
}

#[test]
fn a_qualified_spec_by_path_is_relative_to_the_recipe() {
    let project = Project::new();
    channel_with_pkg(&project.path().join("first"), "1.0");
    channel_with_pkg(&project.path().join("local"), "2.0");
    // Paths relative to the recipe (in `recipes/`), run from elsewhere.
    project.write_recipe(
        "[image]\nname = \"q\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"../first\", \"../local\"]\ndependencies = [\"../local::pkg\"]\n",
    );
    project.run(&["lock", "recipes/image.toml"]).success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("pkg-2.0-h0_0.tar.bz2"), "{lock}");
}

#[test]
fn a_qualified_spec_naming_a_channel_not_listed_is_refused_before_solving() {
    let project = Project::new();
    let mirror = project.path().join("mirror");
    channel_with_pkg(&mirror.join("conda-forge"), "1.0");
    project.write_recipe(
        "[image]\nname = \"q\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"conda-forge\"]\ndependencies = [\"xformers::pkg\"]\n",
    );
    let alias = url::Url::from_directory_path(&mirror).unwrap().to_string();
    let run = project.run(&["lock", "recipes/image.toml", "--channel-alias", &alias]);
    run.assert_failure_naming(
        1,
        &[
            "`xformers::pkg` names the channel `xformers`",
            "mirror/xformers/",
            "not in `[conda] channels`",
        ],
    );
    assert!(!project.lock_path().exists());
}
