//! Snapshots of what a user sees for bad recipes: the real CLI's exit code and stderr, with
//! temp paths filtered. Review changes with `cargo insta review` (or `INSTA_UPDATE=always`).

use crate::{
    common::Project,
    support::{channel::tiny_recipe, shared_channel},
};

/// `[image] name = "x"` plus `rest`, on scratch, no channel needed.
fn image(rest: &str) -> String {
    format!("[image]\nname = \"x\"\n{rest}")
}

/// Builds `recipe` in a fresh project and snapshots the exit code and stderr. Every bad
/// recipe is the user's fault: exit 1, no panic, nothing on stdout, no output left behind.
#[track_caller]
fn snapshot(name: &str, recipe: &str) {
    let project = Project::new();
    project.write_recipe(recipe);
    let run = project.build(&[]);
    run.assert_clean_failure(1);
    project.assert_no_image();
    assert!(!project.lock_path().exists(), "no lock on failure");
    let channel = url::Url::from_file_path(shared_channel()).unwrap();
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(
        &regex_escape(channel.as_str().trim_end_matches('/')),
        "[CHANNEL]",
    );
    settings.add_filter(
        &regex_escape(&project.path().display().to_string()),
        "[PROJECT]",
    );
    settings.set_prepend_module_to_snapshot(false);
    settings.set_snapshot_path("snapshots");
    settings.bind(|| {
        insta::assert_snapshot!(
            name,
            format!(
                "exit code: {}\n----- stderr -----\n{}",
                run.code, run.stderr
            )
        );
    });
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '/' || c == '_' || c == '-' || c == ':' {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}

#[test]
fn unknown_top_level_key() {
    snapshot("unknown_top_level_key", &image("[layer]\nmax = 10\n"));
}

#[test]
fn unknown_image_key() {
    snapshot("unknown_image_key", "[image]\nname = \"x\"\nnmae = \"y\"\n");
}

#[test]
fn unknown_conda_key() {
    snapshot(
        "unknown_conda_key",
        &image("[conda]\nchannels = [\"conda-forge\"]\ndependecies = [\"python\"]\n"),
    );
}

#[test]
fn unknown_cuda_key() {
    snapshot(
        "unknown_cuda_key",
        &image("[cuda]\nversion = \"12.4\"\nmin_driver = \"550.54.14\"\n"),
    );
}

#[test]
fn unknown_layers_key() {
    snapshot("unknown_layers_key", &image("[layers]\nmaximum = 40\n"));
}

#[test]
fn wrong_type_for_layers_max() {
    snapshot(
        "wrong_type_for_layers_max",
        &image("[layers]\nmax = \"many\"\n"),
    );
}

#[test]
fn wrong_type_for_tags() {
    snapshot("wrong_type_for_tags", &image("tags = \"latest\"\n"));
}

#[test]
fn invalid_image_name() {
    snapshot("invalid_image_name", "[image]\nname = \"My Image\"\n");
}

#[test]
fn invalid_tag() {
    snapshot("invalid_tag", &image("tags = [\"latest\", \"-nightly\"]\n"));
}

#[test]
fn relative_prefix() {
    snapshot("relative_prefix", &image("prefix = \"opt/conda\"\n"));
}

#[test]
fn unknown_platform() {
    snapshot("unknown_platform", &image("platforms = [\"linux-65\"]\n"));
}

#[test]
fn relative_workdir() {
    snapshot("relative_workdir", &image("workdir = \"workspace\"\n"));
}

#[test]
fn invalid_user() {
    snapshot("invalid_user", &image("user = \"jupyter user\"\n"));
}

#[test]
fn user_id_out_of_range() {
    snapshot(
        "user_id_out_of_range",
        &image("user = \"1000:4294967295\"\n"),
    );
}

#[test]
fn env_key_with_equals() {
    snapshot(
        "env_key_with_equals",
        &image("[image.env]\n\"PATH=/evil:$PATH\" = \"x\"\n"),
    );
}

#[test]
fn empty_env_key() {
    snapshot("empty_env_key", &image("[image.env]\n\"\" = \"x\"\n"));
}

/// The bidirectional control is in the file as it is; the snippet shows it escaped, so the
/// terminal does not reorder the line.
#[test]
fn env_value_with_a_bidi_control() {
    snapshot(
        "env_value_with_a_bidi_control",
        &image("[image.env]\nMODE = \"safe\u{202e}\u{2066}evil\u{2069}\"\n"),
    );
}

#[test]
fn label_with_a_newline() {
    snapshot(
        "label_with_a_newline",
        &image("[image.labels]\n\"org.example.note\" = \"one\\ntwo\"\n"),
    );
}

#[test]
fn prefix_with_a_tab() {
    snapshot("prefix_with_a_tab", &image("prefix = \"/opt/\\tconda\"\n"));
}

#[test]
fn empty_entrypoint_element() {
    snapshot(
        "empty_entrypoint_element",
        &image("entrypoint = [\"/bin/sh\", \"\"]\n"),
    );
}

#[test]
fn empty_cmd_element() {
    snapshot("empty_cmd_element", &image("cmd = [\"-c\", \"\"]\n"));
}

#[test]
fn workdir_with_dotdot() {
    snapshot("workdir_with_dotdot", &image("workdir = \"/srv/../etc\"\n"));
}

#[test]
fn duplicate_tag() {
    snapshot(
        "duplicate_tag",
        &image("tags = [\"latest\", \"v1\", \"latest\"]\n"),
    );
}

#[test]
fn invalid_match_spec() {
    snapshot(
        "invalid_match_spec",
        &image(
            "[conda]\nchannels = [\"conda-forge\"]\ndependencies = [\"python\", \"numpy >=1,<\"]\n",
        ),
    );
}

#[test]
fn invalid_channel() {
    snapshot(
        "invalid_channel",
        &image("[conda]\nchannels = [\"https://\"]\ndependencies = [\"python\"]\n"),
    );
}

#[test]
fn cuda_too_new_for_min_driver() {
    snapshot(
        "cuda_too_new_for_min_driver",
        &image("[cuda]\nversion = \"12.4\"\nmin-driver = \"450.80.02\"\n"),
    );
}

#[test]
fn layers_max_out_of_range() {
    snapshot("layers_max_out_of_range", &image("[layers]\nmax = 500\n"));
}

#[test]
fn unknown_compression() {
    snapshot(
        "unknown_compression",
        &image("[layers]\ncompression = \"lz4\"\n"),
    );
}

#[test]
fn unknown_channel_priority() {
    snapshot(
        "unknown_channel_priority",
        &image("[conda]\nchannel-priority = \"strcit\"\n"),
    );
}

/// conda's spelling of the key, from a `.condarc` or `environment.yml`.
#[test]
fn channel_priority_with_an_underscore() {
    snapshot(
        "channel_priority_with_an_underscore",
        &image("[conda]\nchannel_priority = \"strict\"\n"),
    );
}

#[test]
fn missing_image_section() {
    snapshot(
        "missing_image_section",
        "[conda]\nchannels = [\"conda-forge\"]\ndependencies = [\"python\"]\n",
    );
}

#[test]
fn toml_syntax_error() {
    snapshot(
        "toml_syntax_error",
        "[image]\nname = \"x\ntags = [\"latest\"]\n",
    );
}

#[test]
fn unknown_package_suggests_close_names() {
    snapshot(
        "unknown_package_suggests_close_names",
        &tiny_recipe(shared_channel(), "x", &["helo"]),
    );
}

#[test]
fn unsatisfiable_spec() {
    snapshot(
        "unsatisfiable_spec",
        &tiny_recipe(shared_channel(), "x", &["hello >=5"]),
    );
}

#[test]
fn unknown_pypi_key() {
    snapshot(
        "unknown_pypi_key",
        &image(
            "\n[pypi]\ndependencies = [\"six\"]\nextra-index-url = \"https://example.org/simple\"\n",
        ),
    );
}

#[test]
fn invalid_pypi_requirement() {
    snapshot(
        "invalid_pypi_requirement",
        &image("\n[pypi]\ndependencies = [\"six\", \"requests >>= 2\"]\n"),
    );
}

#[test]
fn pypi_direct_url_requirement() {
    snapshot(
        "pypi_direct_url_requirement",
        &image(
            "\n[pypi]\ndependencies = [\"torch @ https://download.pytorch.org/whl/torch-2.1.0.whl\"]\n",
        ),
    );
}

#[test]
fn pypi_index_url_that_is_a_path() {
    snapshot(
        "pypi_index_url_that_is_a_path",
        &image("\n[pypi]\nindex-url = \"file:///srv/wheels\"\ndependencies = [\"six\"]\n"),
    );
}
