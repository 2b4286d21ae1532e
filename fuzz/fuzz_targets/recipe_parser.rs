//! The recipe parser on arbitrary text: it must return a recipe or an error, and rendering
//! that error (the CLI's `file:line:column` and caret) must not panic either.
#![no_main]

use std::path::Path;

use imgbuild::recipe::{Recipe, RecipeOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The CLI reads recipes as UTF-8 and refuses anything else before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/fuzz/recipes/image.toml");
    match Recipe::from_str_at(text, path, &RecipeOptions::default()) {
        Ok(recipe) => {
            let _ = recipe.lock_path();
        }
        Err(err) => {
            let _ = err.to_string();
            let _ = err.message();
        }
    }
});
