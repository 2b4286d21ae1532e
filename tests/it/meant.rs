//! The command line knows what a new user meant (issue 31, item 3): a slip gets "did you
//! mean", another tool's habit gets what to use instead, a conda environment file gets the
//! `init --from` hint, `version` works, and a recipe path is still a build; another tool's
//! flag is told what to use. Each through the real binary; before, every one of these words
//! was read as a recipe file, and `build --no-cache` was offered `--ca-cert`.

use crate::common::Project;

#[test]
fn a_slip_in_a_command_gets_did_you_mean() {
    let project = Project::new();
    let run = project.run(&["buidl", "recipes/app.toml"]);
    run.assert_failure_naming(2, &["no command `buidl`", "did you mean `build`?"]);
    let run = project.run(&["inpsect", "images/app"]);
    run.assert_failure_naming(2, &["did you mean `inspect`?"]);
    let run = project.run(&["zzqx"]);
    run.assert_failure_naming(2, &["no command `zzqx`", "imgbuild --help"]);
    assert!(!run.stderr.contains("did you mean"), "{}", run.stderr);
}

#[test]
fn habits_of_other_tools_are_told_what_to_use() {
    let project = Project::new();
    for (habit, instead) in [
        ("run", "podman run --rm oci:images/NAME"),
        ("pull", "skopeo copy docker://REF oci:DIR:TAG"),
        ("tag", "push --tag TAG"),
        ("exec", "podman run --rm -it"),
    ] {
        let run = project.run(&[habit, "something"]);
        run.assert_failure_naming(
            2,
            &[&format!("`{habit}` is not an imgbuild command"), instead],
        );
    }
}

#[test]
fn an_environment_file_given_as_a_recipe_gets_the_init_hint() {
    let project = Project::new();
    fs_err::write(
        project.path().join("environment.yml"),
        "name: ds\ndependencies:\n  - python=3.11\n",
    )
    .unwrap();
    let run = project.run(&["environment.yml"]);
    run.assert_failure_naming(
        2,
        &[
            "`environment.yml` looks like a conda environment file",
            "imgbuild init --from environment.yml -o recipe.toml",
        ],
    );
    // Before, this was a TOML error at `name: ds`.
    assert!(!run.stderr.contains("TOML parse error"), "{}", run.stderr);
}

#[test]
fn version_is_a_command() {
    let project = Project::new();
    let run = project.run(&["version"]).success();
    assert_eq!(
        run.stdout,
        format!("imgbuild {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_recipe_path_is_still_a_build() {
    let project = Project::new();
    let run = project.run(&["recipes/missing.toml"]);
    run.assert_failure_naming(1, &["recipes/missing.toml"]);
    assert!(!run.stderr.contains("no command"), "{}", run.stderr);
    // A file that is there is a recipe, whatever its name.
    fs_err::write(project.path().join("myrecipe"), "= not toml\n").unwrap();
    let run = project.run(&["myrecipe"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("myrecipe"), "{}", run.stderr);
    assert!(!run.stderr.contains("no command"), "{}", run.stderr);
}

#[test]
fn global_options_have_their_own_heading() {
    let project = Project::new();
    let help = project.run(&["build", "--help"]).success().stdout;
    let (own, global) = help
        .split_once("Global options:")
        .unwrap_or_else(|| panic!("no `Global options:` heading in:\n{help}"));
    assert!(global.contains("--cache-dir <DIR>"), "{help}");
    assert!(!own.contains("--cache-dir"), "{help}");
    assert!(own.contains("--locked"), "{help}");
    let usage = help.lines().find(|l| l.starts_with("Usage:")).unwrap();
    assert!(!usage.contains("--cache-dir"), "{usage}");
}

#[test]
fn flags_of_other_tools_are_told_what_to_use() {
    let project = Project::new();
    for (args, told) in [
        (
            &["build", "--no-cache", "r.toml"][..],
            "imgbuild has no `--no-cache`",
        ),
        // Flags that belong to another command say which.
        (&["lock", "-f", "r.toml"], "`-f RECIPE` belongs to `build`"),
        (
            &["push", "images/app", "-t", "v1"],
            "`-t TAG` belongs to `build`",
        ),
        (
            &["smoke", "images/app", "--platform", "linux/arm64"],
            "`--platform` picks platforms for `build`",
        ),
        (
            &["push", "images/app", "r.example/app", "--creds", "u:p"],
            "imgbuild login",
        ),
        (
            &["login", "r.example", "-u", "me", "-p", "secret"],
            "--password-stdin",
        ),
        (
            &["build", "r.toml", "--update", "numpy"],
            "`imgbuild lock RECIPE --update NAME`",
        ),
    ] {
        let run = project.run(args);
        run.assert_failure_naming(2, &[told]);
        // clap's own guess (`--no-cache` → `--ca-cert`) is not offered in its place.
        assert!(!run.stderr.contains("similar argument"), "{}", run.stderr);
    }
}
