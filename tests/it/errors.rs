//! Bad input gets a clear error, exit code 1, no panic, and loses nothing.

use crate::{
    common::{LayoutView, Project, validate_layout},
    support::{channel::tiny_recipe, shared_channel},
};

fn channel_url() -> String {
    url::Url::from_file_path(shared_channel())
        .unwrap()
        .to_string()
}

/// Runs a build of `recipe` in a fresh project and checks the failure left nothing behind.
#[track_caller]
fn fails_with(recipe: &str, needles: &[&str]) {
    let project = Project::new();
    project.write_recipe(recipe);
    let run = project.build(&[]);
    run.assert_failure_naming(1, needles);
    project.assert_no_image();
    assert!(!project.lock_path().exists(), "no lock on failure");
}

#[test]
fn unknown_key_points_at_it() {
    fails_with(
        "[image]\nname = \"x\"\nnmae = \"y\"\n",
        &[
            "unknown field `nmae`, expected one of",
            "--> recipes/image.toml:3:1",
            "3 | nmae = \"y\"",
            "  | ^^^^",
        ],
    );
}

#[test]
fn wrong_type_points_at_the_value() {
    fails_with(
        "[image]\nname = \"x\"\n[layers]\nmax = \"many\"\n",
        &[
            "invalid type: string \"many\", expected i64",
            "recipes/image.toml:4:7",
        ],
    );
}

#[test]
fn unsatisfiable_spec_shows_the_solver_explanation() {
    fails_with(
        &tiny_recipe(shared_channel(), "x", &["hello >=5"]),
        &["cannot be solved for linux-64", "hello >=5"],
    );
}

#[test]
fn missing_dependency_of_a_real_package_is_explained() {
    // xtensor-io (a real conda-forge build) needs packages the channel does not have.
    fails_with(
        &tiny_recipe(shared_channel(), "x", &["xtensor-io"]),
        &["xtensor-io 0.10.3 would require", "blosc"],
    );
}

#[test]
fn unknown_package_is_named() {
    fails_with(
        &tiny_recipe(shared_channel(), "x", &["nosuchpkg"]),
        &["No candidates were found for nosuchpkg"],
    );
}

#[test]
fn missing_channel_is_named() {
    let recipe = "[image]\nname = \"x\"\n[conda]\nchannels = [\"file:///nonexistent/imgbuild-channel\"]\ndependencies = [\"hello\"]\n";
    // With the offline fix: a new user behind a mirror or without the network is told the
    // three ways to a channel they can reach.
    fails_with(
        recipe,
        &[
            "file:///nonexistent/imgbuild-channel",
            "Offline or behind a mirror",
            "--channel-alias URL",
            "--offline",
        ],
    );
}

#[test]
fn invalid_match_spec_points_at_it() {
    let recipe = format!(
        "[image]\nname = \"x\"\n[conda]\nchannels = [\"{}\"]\ndependencies = [\"hello\", \"hello >=1,<\"]\n",
        channel_url()
    );
    fails_with(
        &recipe,
        &[
            "invalid dependency `hello >=1,<`: unable to parse version spec",
            "recipes/image.toml:5:",
        ],
    );
}

/// Names and extras ending in `-` (pep508_rs panics on them) and `${…}` (which it would fill
/// in from the builder's environment) are refused, pointing into the recipe.
#[test]
fn pypi_requirements_pep508_rs_mishandles_are_refused() {
    let conda = format!(
        "[image]\nname = \"x\"\n[conda]\nchannels = [\"{}\"]\ndependencies = [\"hello\"]\n",
        channel_url()
    );
    for (requirement, reason) in [
        (
            "torch-- >=1",
            "the name `torch--` must end with a letter or a digit",
        ),
        (
            "torch[cuda-]",
            "the extra `cuda-` must end with a letter or a digit",
        ),
        (
            "six @ https://example.org/${HOME}/six.whl",
            "`${…}` is not expanded",
        ),
    ] {
        fails_with(
            &format!("{conda}[pypi]\ndependencies = [{requirement:?}]\n"),
            &[
                &format!("invalid PyPI requirement `{requirement}`: {reason}"),
                "recipes/image.toml:7:",
            ],
        );
    }
}

#[test]
fn missing_base_layout_is_named() {
    fails_with(
        "[image]\nname = \"x\"\nbase = \"oci:../no-such-layout:v1\"\n",
        &["OCI layout file", "no-such-layout", "cannot be read"],
    );
}

#[test]
fn broken_real_package_fails_cleanly_and_keeps_the_previous_image() {
    // First a good image.
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "keep", &["hello 1.0"]));
    let good = project.build(&[]).success();
    let layout_dir = project.path().join("images/keep");
    let index_before = fs_err::read(layout_dir.join("index.json")).unwrap();

    // Then the same image with the real `zlib` from conda/conda's test data, whose
    // `info/paths.json` disagrees with its payload: the install must fail, naming it.
    project.write_recipe(&tiny_recipe(
        shared_channel(),
        "keep",
        &["hello 1.0", "zlib"],
    ));
    let run = project.build(&[]);
    run.assert_clean_failure(1);
    assert!(run.stderr.contains("zlib-1.2.11"), "{}", run.stderr);
    assert!(run.stderr.contains("lib/libz.so"), "{}", run.stderr);

    // The previous image is still there, whole.
    assert_eq!(
        fs_err::read(layout_dir.join("index.json")).unwrap(),
        index_before
    );
    assert_eq!(
        LayoutView::new(&layout_dir).manifest_digest(),
        good.digest()
    );
    validate_layout(layout_dir.to_str().unwrap());
    // No staging trees are left in the cache.
    let staging = project.cache.join("staging");
    assert_eq!(fs_err::read_dir(&staging).unwrap().count(), 0);
}

#[test]
fn a_directory_that_is_not_a_layout_is_never_overwritten() {
    let project = Project::new();
    project.write_recipe(&tiny_recipe(shared_channel(), "x", &["hello 1.0"]));
    let precious = project.path().join("precious");
    fs_err::create_dir_all(&precious).unwrap();
    fs_err::write(precious.join("notes.txt"), "mine").unwrap();
    let run = project.build(&["-o", "precious"]);
    run.assert_clean_failure(1);
    assert!(
        run.stderr.contains("is not an OCI image layout"),
        "{}",
        run.stderr
    );
    assert_eq!(fs_err::read_dir(&precious).unwrap().count(), 1);
}

/// A recipe whose only channel does not exist: a check that fails before the solve names
/// its own subject; one that ran after it would never be reached.
fn with_missing_channel(extra_image: &str, tail: &str) -> String {
    format!(
        "[image]\nname = \"early\"\nbase = \"scratch\"\n{extra_image}\n\
         [conda]\nchannels = [\"file:///nonexistent/imgbuild-channel\"]\ndependencies = [\"hello\"]\n{tail}"
    )
}

#[test]
fn an_unknown_user_and_a_missing_files_source_fail_before_solving() {
    // Before, both were found after the solve and the install; with a channel that is not
    // there, the solve failed first and neither was named.
    fails_with(
        &with_missing_channel("user = \"nobody\"\nworkdir = \"/w\"", ""),
        &["`[image] user` names the user `nobody`"],
    );
    fails_with(
        &with_missing_channel("", "\n[[files]]\nsrc = \"missing\"\ndest = \"/x\"\n"),
        &["`src` `missing` does not exist"],
    );
    // The same recipe with neither is refused for its channel: the checks above came first.
    fails_with(
        &with_missing_channel("", ""),
        &["nonexistent/imgbuild-channel"],
    );
}

#[test]
fn a_cuda_version_that_nvidia_never_released_is_refused() {
    // 11.9 and 12.7 never shipped (12.6 was followed by 12.8); both used to pass.
    for (version, releases) in [
        (
            "11.9",
            "11.0, 11.1, 11.2, 11.3, 11.4, 11.5, 11.6, 11.7, 11.8",
        ),
        (
            "12.7",
            "12.0, 12.1, 12.2, 12.3, 12.4, 12.5, 12.6, 12.8, 12.9",
        ),
    ] {
        let recipe = tiny_recipe(shared_channel(), "x", &["cuda-cudart"])
            + &format!("\n[cuda]\nversion = \"{version}\"\n");
        fails_with(
            &recipe,
            &[
                &format!("CUDA {version} is not a CUDA release"),
                releases,
                &format!("version = \"{version}\""),
            ],
        );
    }
}

#[test]
fn cuda_newer_than_min_driver_fails_before_solving() {
    let recipe = tiny_recipe(shared_channel(), "x", &["cuda-cudart"])
        + "\n[cuda]\nversion = \"12.1\"\nmin-driver = \"520.61.05\"\n";
    fails_with(
        &recipe,
        &[
            "CUDA 12.1 cannot run on driver 520.61.05: it needs driver 525.60.13 or newer",
            "min-driver = \"520.61.05\"",
        ],
    );
}
