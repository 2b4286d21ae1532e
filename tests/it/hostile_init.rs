//! Hostile `environment.yml` files through `imgbuild init --from` (issue 26): a stranger's
//! newline, TOML or bidi control in the environment's name, a dependency, a channel, a `pip:`
//! line, a CUDA spec, a section's key or the file's own name stays inside a quoted string or
//! a comment's line. Each conversion is refused cleanly, or writes a recipe that parses as
//! TOML with only the tables and keys `init` writes; where that recipe builds, the build
//! reads none of the canary the injected `[[files]]` aims at.

use std::path::Path;

use imgbuild::init::WRITTEN_KEYS;

use crate::{common::Project, support::shared_channel, trust::Canary};

/// A TOML injection: a `[[files]]` table that copies the canary into the image (`src`
/// relative, climbing out of the recipe's directory by name, as the old `init` let through),
/// ending in `#` so that the rest of the line it lands on is a comment.
fn injection(canary: &Canary) -> String {
    format!(
        "x\n[[files]]\nsrc = \"{}{}\"\ndest = \"/leak\"\n#",
        "../".repeat(16),
        canary.dir().display().to_string().trim_start_matches('/')
    )
}

/// `text` as a YAML double-quoted scalar (JSON's string syntax is YAML's).
fn yaml_str(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// An environment file for the test channel: `name`, then `rest` (more keys).
fn environment(name: &str, rest: &str) -> String {
    let channel = url::Url::from_file_path(shared_channel()).unwrap();
    format!(
        "name: {}\nchannels:\n  - {channel}\n  - nodefaults\n{rest}",
        yaml_str(name)
    )
}

/// The tables and keys of `text` that `init` never writes.
fn unwritten(text: &str) -> Vec<String> {
    let top: toml::Table = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut found = Vec::new();
    for (section, value) in &top {
        let Some((_, keys)) = WRITTEN_KEYS.iter().find(|(name, _)| name == section) else {
            found.push(section.clone());
            continue;
        };
        for key in value.as_table().map(|t| t.keys()).into_iter().flatten() {
            if !keys.contains(&key.as_str()) {
                found.push(format!("{section}.{key}"));
            }
        }
    }
    found
}

/// Converts `yaml` (written as `file_name`) with `init --from`, then builds the recipe when
/// `build`: a clean refusal (exit 1) or a recipe with only `init`'s tables; no canary in
/// anything written, the canary untouched. Returns the recipe's text, if one was written.
#[track_caller]
fn convert(yaml: &str, file_name: &str, build: bool) -> Option<String> {
    let canary = Canary::new();
    // Every `CANARY` stands inside a double-quoted YAML scalar: the injection goes in escaped.
    let escaped = yaml_str(&injection(&canary));
    let yaml = yaml.replace("CANARY", &escaped[1..escaped.len() - 1]);
    let project = Project::new();
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    fs_err::write(project.path().join(file_name), yaml.as_bytes()).unwrap();
    let run = project.run(&["init", "--from", file_name, "-o", "recipes/image.toml"]);
    if run.code != 0 {
        run.assert_clean_failure(1);
        assert!(
            !project.recipe_path().exists(),
            "a refused init wrote nothing"
        );
        canary.assert_untouched();
        return None;
    }
    let text = fs_err::read_to_string(project.recipe_path()).unwrap();
    assert_eq!(unwritten(&text), Vec::<String>::new(), "{text}");
    assert!(
        !text.contains("\n[[files]]") && !text.contains("\n[accounts]"),
        "{text}"
    );
    for line in text.lines() {
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }
    if build {
        let run = project.build(&[]);
        if run.code != 0 {
            run.assert_clean_failure(1);
        }
        canary.assert_not_in(&project.path().join("images"));
    }
    canary.assert_not_in(project.path());
    canary.assert_untouched();
    Some(text)
}

#[test]
fn a_newline_in_the_name_stays_in_the_header_comment() {
    let text = convert(
        &environment("CANARY", "dependencies: [hello=1.0]\n"),
        "environment.yml",
        true,
    )
    .expect("converted");
    assert!(
        text.starts_with(
            "# Made by `imgbuild init --from environment.yml` (conda environment `\"x\\n[[files]]"
        ),
        "{text}"
    );
}

#[test]
fn a_newline_in_the_file_name_stays_in_the_comments() {
    let text = convert(
        &environment(
            "app",
            "dependencies:\n  - hello=1.0\n  - pip:\n    - -e ./src\n",
        ),
        "env\n[[files]]\nsrc = \"..\"\ndest = \"leak\"\n.yml",
        false,
    );
    let text = text.expect("converted");
    assert!(text.contains("--from \"env\\n[[files]]\\nsrc"), "{text}");
}

#[test]
fn a_newline_in_a_dependency_is_refused_or_quoted() {
    convert(
        &environment("app", "dependencies:\n  - hello=1.0\n  - \"CANARY\"\n"),
        "environment.yml",
        true,
    );
    convert(
        &environment("app", "dependencies:\n  - \"hello=1.0=CANARY\"\n"),
        "environment.yml",
        true,
    );
}

#[test]
fn a_newline_in_a_channel_is_refused_or_quoted() {
    let yaml =
        "name: app\nchannels: [\"conda-forge\\nCANARY\", nodefaults]\ndependencies: [hello=1.0]\n";
    convert(yaml, "environment.yml", true);
}

#[test]
fn a_newline_in_a_pip_line_stays_in_the_comment_block() {
    // A line [pypi] cannot express is kept as a commented-out string: on one line.
    let text = convert(
        &environment("app", "dependencies:\n  - hello=1.0\n  - pip:\n    - \"-r CANARY\"\n    - \"six\\n[pypi]\\nindex-url = 'https://evil.example/simple'\"\n"),
        "environment.yml",
        false,
    )
    .expect("converted");
    assert!(!text.contains("evil.example/simple'\n"), "{text}");
}

/// pip lines pep508_rs 0.9.2 panics on (found by the `init_from` fuzz target) or would fill
/// in from the environment: converted, each kept only as a comment, not as a dependency.
#[test]
fn pip_lines_pep508_rs_mishandles_stay_comments() {
    let lines = [
        "torch-- >=1",
        "six[x-]",
        "six @ https://example.org/${HOME}/six.whl",
    ];
    let pip: String = lines
        .iter()
        .map(|l| format!("    - {}\n", yaml_str(l)))
        .collect();
    let text = convert(
        &environment(
            "app",
            &format!("dependencies:\n  - hello=1.0\n  - pip:\n{pip}"),
        ),
        "environment.yml",
        false,
    )
    .expect("converted");
    for line in lines {
        let written: Vec<&str> = text.lines().filter(|l| l.contains(line)).collect();
        assert!(!written.is_empty(), "`{line}` is not kept:\n{text}");
        assert!(
            written.iter().all(|l| l.trim_start().starts_with('#')),
            "{text}"
        );
    }
}

#[test]
fn a_newline_in_a_cuda_spec_stays_in_the_cuda_comment() {
    for spec in [
        "pytorch[build='*cuda11.8*CANARY']",
        "pytorch=2.1=*cuda10.2*CANARY",
        "cuda-version=12.4CANARY",
    ] {
        convert(
            &environment(
                "app",
                &format!("dependencies:\n  - hello=1.0\n  - {}\n", yaml_str(spec)),
            ),
            "environment.yml",
            false,
        );
    }
}

#[test]
fn toml_in_a_section_key_stays_in_the_comment_block() {
    // An unknown `dependencies:` section is kept as a comment; its key is the stranger's.
    let text = convert(
        &environment(
            "app",
            "dependencies:\n  - hello=1.0\n  - \"]\\nCANARY\":\n    - a\n",
        ),
        "environment.yml",
        true,
    )
    .expect("converted");
    assert!(
        text.contains("# Not yet supported: these `\"]\\n"),
        "{text}"
    );
}

#[test]
fn toml_in_variables_is_refused_or_quoted() {
    convert(
        &environment(
            "app",
            "dependencies: [hello=1.0]\nvariables:\n  GOOD: \"]\\nCANARY\"\n  \"BAD\\nCANARY\": x\n",
        ),
        "environment.yml",
        true,
    );
    // Converted (a value may hold a newline), then the value is a quoted string.
    let text = convert(
        &environment(
            "app",
            "dependencies: [hello=1.0]\nvariables:\n  GOOD: \"]\\nCANARY\"\n",
        ),
        "environment.yml",
        true,
    );
    if let Some(text) = text {
        assert!(text.contains("\"GOOD\" = \"]\\nx\\n[[files]]"), "{text}");
    }
}

#[test]
fn very_long_strings_are_refused_or_converted() {
    let long = "n".repeat(60_000);
    convert(
        &environment(&long, "dependencies: [hello=1.0]\n"),
        "environment.yml",
        false,
    );
    convert(
        &environment(
            "app",
            &format!(
                "dependencies: [hello=1.0]\nvariables:\n  A: {}\n",
                "v".repeat(60_000)
            ),
        ),
        "environment.yml",
        false,
    );
}

#[test]
fn bidi_and_line_separators_are_escaped_in_comments() {
    let text = convert(
        &environment(
            "\u{202e}evil\u{2066}\u{2028}[pypi]\u{200b}x",
            "dependencies: [hello=1.0]\n",
        ),
        "environment.yml",
        true,
    )
    .expect("converted");
    let header = text.lines().next().unwrap();
    assert!(
        header.contains(r"\u202Eevil\u2066\u2028[pypi]\u200Bx"),
        "{header}"
    );
}

#[test]
fn a_name_that_is_a_path_names_an_image_under_images() {
    let canary = Canary::new();
    let project = Project::new();
    fs_err::create_dir_all(project.path().join("recipes")).unwrap();
    // The canary's secret file, climbed to by name.
    let escape = format!("../../..{}", canary.file().display());
    fs_err::write(
        project.path().join("environment.yml"),
        environment(&escape, "dependencies: [hello=1.0]\n"),
    )
    .unwrap();
    project
        .run(&[
            "init",
            "--from",
            "environment.yml",
            "-o",
            "recipes/image.toml",
        ])
        .success();
    // No registry here: the empty base in place of init's Debian, and its python (not in
    // this environment) left unchecked.
    let recipe = fs_err::read_to_string(project.recipe_path()).unwrap();
    project.write_recipe(&recipe.replace(
        "base = \"docker.io/library/debian:12-slim\"",
        "base = \"scratch\"\ncheck-entrypoint = false",
    ));
    project.build(&[]).success();
    let images: Vec<String> = fs_err::read_dir(project.path().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // The layout, its lock, SBOMs and provenance: each a name in images/, none a path.
    assert!(
        images
            .iter()
            .all(|n| Path::new(n).components().count() == 1 && n.contains("-secret.txt")),
        "{images:?}"
    );
    canary.assert_untouched();
}

#[test]
fn escape_sequences_in_the_file_reach_the_terminal_only_as_text() {
    // An unknown top-level key holding ESC sequences (clear the screen, retitle the
    // terminal) and a right-to-left override: init warns about the key, quoting it.
    let project = Project::new();
    let yaml = "name: demo\n\"\\e[2J\\e]0;owned\\a\\u202Ekey\": 1\ndependencies:\n  - python\n";
    fs_err::write(project.path().join("environment.yml"), yaml).unwrap();
    let run = project.run(&["init", "--from", "environment.yml"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let warning = run
        .stderr
        .lines()
        .find(|l| l.starts_with("warning: top-level key"))
        .unwrap_or_else(|| panic!("a warning about the key:\n{}", run.stderr));
    assert!(
        warning.contains("<U+001B>[2J<U+001B>]0;owned<U+0007><U+202E>key"),
        "{warning:?}"
    );
    assert!(
        !run.stderr.chars().any(|c| c.is_control() && c != '\n'),
        "{:?}",
        run.stderr
    );
}
