//! What a first word that is no subcommand, or a flag imgbuild does not have, meant.
//! `imgbuild recipe.toml` is a build of that recipe; anything else is told what to use
//! instead, rather than taken for a recipe that cannot be read: a conda environment file
//! gets the `init --from` hint, the habits of docker, podman and skopeo (`run`, `pull`,
//! `tag`, …) get the command that does it, and a typing slip gets "did you mean". Their
//! flags (`--no-cache`, `-t`, `--creds`, `-p`, …) get the same.

use std::path::Path;

/// What to do with the first word.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Meant {
    /// A recipe: run `build` on it.
    Recipe,
    /// Not a recipe: refuse it with this message, which says what to use.
    Refused(String),
}

/// The habits of other tools, each with what does it here.
const HABITS: &[(&str, &str)] = &[
    (
        "run",
        "imgbuild builds images and does not run them: `podman run --rm oci:images/NAME` runs \
         a layout, and `imgbuild k8s` or `imgbuild slurm` write a job for a pushed image; \
         `imgbuild notebook images/NAME NOTEBOOK.ipynb` runs a notebook in one and records \
         its outputs",
    ),
    (
        "pull",
        "imgbuild pulls the base a recipe names by itself; to copy an image into a layout, use \
         `skopeo copy docker://REF oci:DIR:TAG`",
    ),
    (
        "tag",
        "a build is tagged by the recipe's [image] `tags`, and a push by `push --tag TAG` \
         (repeatable)",
    ),
    (
        "images",
        "a build writes an OCI layout under `images/NAME`; `imgbuild inspect images/NAME` \
         shows one",
    ),
    (
        "rmi",
        "an image is a directory: remove `images/NAME`; `build` reuses the layer cache either way",
    ),
    (
        "exec",
        "imgbuild builds images and does not run them: `podman run --rm -it oci:images/NAME \
         sh` opens a shell in one",
    ),
    (
        "install",
        "packages are the recipe's: add them to its [conda] or [pypi] specs and build again",
    ),
];

/// Flags of other tools that imgbuild has no use for, or that belong to another of its
/// commands, each with what does it here.
const HABIT_FLAGS: &[(&[&str], &str)] = &[
    (
        &["--no-cache"],
        "imgbuild has no step cache to skip: the lock pins what is built, and cached layers \
         are checked before they are used; `--cache-dir DIR` with an empty DIR builds from \
         nothing",
    ),
    (
        &["-f", "--file"],
        "`-f RECIPE` belongs to `build`: `imgbuild build -f FILE.toml` (or `imgbuild FILE.toml`)",
    ),
    (
        &["-t", "--tag"],
        "`-t TAG` belongs to `build` (it replaces the recipe's [image] `tags`); `push --tag \
         TAG` tags a push",
    ),
    (
        &["--platform"],
        "`--platform` picks platforms for `build`, `inspect` and `diff`; the recipe's \
         [image] `platforms` are what can be built",
    ),
    (
        &["--creds"],
        "credentials come from `imgbuild login REGISTRY -u USER --password-stdin`, for push, \
         which also reads REGISTRY_AUTH_FILE and DOCKER_CONFIG as podman and docker write them",
    ),
    (
        &["-p", "--password"],
        "a password goes on stdin, never on the command line: `--password-stdin`",
    ),
    (
        &["--update"],
        "`imgbuild lock RECIPE --update NAME` solves again with every other pin kept; \
         `build` re-solves by itself when the recipe changed",
    ),
];

/// What to use instead of `flag`, an option imgbuild does not have, when it is another
/// tool's habit.
pub(super) fn unknown_flag(flag: &str) -> Option<String> {
    let name = flag.split_once('=').map_or(flag, |(name, _)| name);
    HABIT_FLAGS
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, instead)| match instead.starts_with('`') {
            // The entry names the command the flag belongs to.
            true => format!("no `{name}` here: {instead}"),
            false => format!("imgbuild has no `{name}`: {instead}"),
        })
}

/// How alike a slip and a subcommand must be (Jaro-Winkler) to be suggested: clap's own
/// threshold, which takes `buidl` to `build` and leaves `foo` without a guess.
const SIMILAR: f64 = 0.7;

/// What `word`, given where a subcommand goes, meant; `subcommands` are the real ones.
pub(super) fn first_word(word: &str, subcommands: &[&str]) -> Meant {
    if let Some(hint) = environment_file(word) {
        return Meant::Refused(hint);
    }
    if looks_like_a_path(word) {
        return Meant::Recipe;
    }
    if let Some((_, instead)) = HABITS.iter().find(|(habit, _)| *habit == word) {
        return Meant::Refused(format!("`{word}` is not an imgbuild command: {instead}"));
    }
    let closest = subcommands
        .iter()
        .map(|name| (strsim::jaro_winkler(word, name), *name))
        .filter(|(score, _)| *score >= SIMILAR)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    Meant::Refused(match closest {
        Some((_, name)) => format!(
            "no command `{word}`; did you mean `{name}`? (a recipe is a file: `imgbuild \
             build FILE.toml`)"
        ),
        None => format!(
            "no command `{word}`, and no recipe file of that name; `imgbuild --help` lists \
             the commands, and a recipe is built with `imgbuild build FILE.toml`"
        ),
    })
}

/// A recipe is a file: a word that names one, ends in `.toml` or has a directory in it is
/// taken as a recipe (a missing one is then told as such by `build`).
fn looks_like_a_path(word: &str) -> bool {
    word.ends_with(".toml") || word.contains('/') || Path::new(word).is_file()
}

/// The hint for a conda environment file (`environment.yml`, any `.yml` or `.yaml`), which
/// `init --from` converts into a recipe.
fn environment_file(word: &str) -> Option<String> {
    let yaml = [".yml", ".yaml"]
        .iter()
        .any(|suffix| word.to_ascii_lowercase().ends_with(suffix));
    yaml.then(|| {
        format!(
            "`{word}` looks like a conda environment file, not a recipe (TOML); convert it \
             with `imgbuild init --from {word} -o recipe.toml`, then `imgbuild recipe.toml`"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBCOMMANDS: &[&str] = &["build", "lock", "smoke", "inspect", "push", "version"];

    #[test]
    fn a_slip_is_given_the_closest_command() {
        let Meant::Refused(message) = first_word("buidl", SUBCOMMANDS) else {
            panic!("a slip taken for a recipe");
        };
        assert!(message.contains("did you mean `build`?"), "{message}");
        let Meant::Refused(message) = first_word("pshu", SUBCOMMANDS) else {
            panic!("a slip taken for a recipe");
        };
        assert!(message.contains("did you mean `push`?"), "{message}");
    }

    #[test]
    fn a_word_like_no_command_gets_no_guess() {
        let Meant::Refused(message) = first_word("zzqx", SUBCOMMANDS) else {
            panic!("a word taken for a recipe");
        };
        assert!(!message.contains("did you mean"), "{message}");
        assert!(message.contains("imgbuild --help"), "{message}");
    }

    #[test]
    fn paths_and_toml_files_are_recipes() {
        assert_eq!(first_word("recipes/app.toml", SUBCOMMANDS), Meant::Recipe);
        assert_eq!(first_word("missing.toml", SUBCOMMANDS), Meant::Recipe);
        assert_eq!(first_word("./app", SUBCOMMANDS), Meant::Recipe);
    }

    #[test]
    fn environment_files_are_sent_to_init() {
        for word in ["environment.yml", "envs/ds.YAML"] {
            let Meant::Refused(message) = first_word(word, SUBCOMMANDS) else {
                panic!("{word} taken for a recipe");
            };
            assert!(message.contains("imgbuild init --from"), "{message}");
        }
    }

    #[test]
    fn flags_of_other_tools_are_told_what_to_use() {
        let told = unknown_flag("--no-cache").unwrap();
        assert!(told.contains("imgbuild has no `--no-cache`"), "{told}");
        assert!(unknown_flag("--creds=u:p").unwrap().contains("login"));
        assert!(unknown_flag("-p").unwrap().contains("--password-stdin"));
        assert_eq!(unknown_flag("--frobnicate"), None);
        let told = unknown_flag("-f").unwrap();
        assert!(
            told.starts_with("no `-f` here: `-f RECIPE` belongs to `build`"),
            "{told}"
        );
    }

    #[test]
    fn habits_are_told_what_to_use() {
        for (habit, tool) in [
            ("run", "podman run"),
            ("pull", "skopeo copy"),
            ("tag", "push --tag"),
        ] {
            let Meant::Refused(message) = first_word(habit, SUBCOMMANDS) else {
                panic!("{habit} taken for a recipe");
            };
            assert!(message.contains(tool), "{habit}: {message}");
        }
    }
}
