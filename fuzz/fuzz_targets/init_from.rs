//! `init --from` on arbitrary text: it must refuse the file or write a recipe that parses as
//! TOML, holds only the tables and keys `init` writes (`imgbuild::init::WRITTEN_KEYS`; a
//! stranger's newline in a name, a spec or a comment must not add `[[files]]` or another
//! `[pypi]`), and that the recipe parser accepts.
#![no_main]

use std::path::Path;

use imgbuild::{
    init::{WRITTEN_KEYS, from_environment_yaml},
    recipe::{Recipe, RecipeOptions},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The CLI reads environment files as UTF-8 and refuses anything else.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/fuzz/environment.yml");
    let made = match from_environment_yaml(text, path, None) {
        Ok(made) => made,
        Err(err) => {
            let _ = err.to_string();
            return;
        }
    };
    // Checked here with the toml crate itself, not with init's own check.
    let top: toml::Table = toml::from_str(&made.text)
        .unwrap_or_else(|e| panic!("init wrote text that is not TOML: {e}\n{}", made.text));
    for (section, value) in &top {
        let (_, keys) = WRITTEN_KEYS
            .iter()
            .find(|(name, _)| name == section)
            .unwrap_or_else(|| panic!("init wrote table `{section}`:\n{}", made.text));
        let table = value
            .as_table()
            .unwrap_or_else(|| panic!("`{section}` is not a table:\n{}", made.text));
        for key in table.keys() {
            assert!(
                keys.contains(&key.as_str()),
                "init wrote `{section}.{key}`:\n{}",
                made.text
            );
        }
    }
    // A comment is one line: no control character but the tab in any line of the text.
    for line in made.text.lines() {
        assert!(
            !line.chars().any(|c| c.is_control() && c != '\t'),
            "a control character in {line:?}"
        );
    }
    Recipe::from_str_at(
        &made.text,
        Path::new("/fuzz/recipe.toml"),
        &RecipeOptions::default(),
    )
    .unwrap_or_else(|e| panic!("init wrote a recipe imgbuild refuses: {e}\n{}", made.text));
});
