//! `[conda] channel-priority`: `strict` takes a package only from the first channel that has
//! it, `disabled` the best version from any channel; the lock records the priority and is
//! re-solved when the recipe changes it.

use std::path::Path;

use crate::{
    common::Project,
    support::hostile::{Channel, Package, Raw},
};

/// A channel at `dir` with one package, `pkg` at `version`.
pub(crate) fn channel_with_pkg(dir: &Path, version: &str) {
    let package = Package::new("pkg", &[], false, vec![Raw::file("share/pkg.txt", version)]);
    let mut index: serde_json::Value = serde_json::from_slice(&package.info[0].1).unwrap();
    index["version"] = version.into();
    let package = package.with_info("index.json", serde_json::to_vec(&index).unwrap());
    let mut channel = Channel::new(dir);
    channel.add(
        &format!("pkg-{version}-h0_0.tar.bz2"),
        &index,
        &package.tar_bz2(),
        |_| {},
    );
    channel.finish();
}

/// The recipe asking for `pkg` from `first` then `second`, with `priority` when given.
fn recipe(first: &Path, second: &Path, priority: Option<&str>) -> String {
    let url = |dir: &Path| url::Url::from_file_path(dir).unwrap().to_string();
    let priority = priority
        .map(|p| format!("channel-priority = \"{p}\"\n"))
        .unwrap_or_default();
    format!(
        "[image]\nname = \"prio\"\nbase = \"scratch\"\nplatforms = [\"linux-64\"]\n\n\
         [conda]\nchannels = [\"{}\", \"{}\"]\ndependencies = [\"pkg\"]\n{priority}",
        url(first),
        url(second),
    )
}

#[test]
fn strict_takes_the_first_channels_version_disabled_the_newest() {
    let project = Project::new();
    // The channel listed first has the older version.
    let first = project.path().join("first");
    let second = project.path().join("second");
    channel_with_pkg(&first, "1.0");
    channel_with_pkg(&second, "2.0");

    // Strict is the default: `pkg` comes from the first channel, though the second is newer.
    project.write_recipe(&recipe(&first, &second, None));
    project.run(&["lock", "recipes/image.toml"]).success();
    let lock = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(lock.contains("pkg-1.0-h0_0.tar.bz2"), "{lock}");
    assert!(!lock.contains("pkg-2.0"), "{lock}");
    // A strict lock reads as every lock written before the key existed.
    assert!(!lock.contains("channel-priority"), "{lock}");

    // Saying so changes nothing: the lock is reused.
    project.write_recipe(&recipe(&first, &second, Some("strict")));
    let run = project.build(&[]).success();
    assert!(
        run.stderr.contains("Reusing recipes/image.lock"),
        "{}",
        run.stderr
    );
    assert_eq!(fs_err::read_to_string(project.lock_path()).unwrap(), lock);

    // Disabled: the same channels, but the lock no longer fits and the newest version wins.
    project.write_recipe(&recipe(&first, &second, Some("disabled")));
    let run = project.build(&[]).success();
    assert!(
        run.stderr.contains(
            "re-solved because the channel priority changed: locked `strict`, the recipe has `disabled`"
        ),
        "{}",
        run.stderr
    );
    let relocked = fs_err::read_to_string(project.lock_path()).unwrap();
    assert!(relocked.contains("pkg-2.0-h0_0.tar.bz2"), "{relocked}");
    assert!(
        relocked.contains("channel-priority: disabled"),
        "{relocked}"
    );

    // And back: the disabled lock does not satisfy a strict recipe either.
    project.write_recipe(&recipe(&first, &second, None));
    let run = project.build(&["--locked"]);
    run.assert_failure_naming(
        1,
        &["the channel priority changed: locked `disabled`, the recipe has `strict`"],
    );
}
