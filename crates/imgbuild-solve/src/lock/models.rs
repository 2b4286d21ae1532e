//! The `[[models]]` files a lock pins: every file of every model by path, size and sha256, in
//! a leading `# imgbuild-models:` comment after the `[[files]]` one (a JSON array). A lock
//! without it pins no model, which is every lock of a recipe without `[[models]]`.
//!
//! The build reads the files and computes the pins; this module writes, reads and compares
//! them, so `--locked` can name the file that changed.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{LockError, Staleness};

const MODELS_MARKER: &str = "# imgbuild-models: ";

/// One file of a model as a lock pins it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelPin {
    /// The model's name.
    pub model: String,
    /// The file's path in the model, `/`-separated, relative.
    pub path: String,
    pub size: u64,
    /// `sha256:<hex>` of the file's bytes.
    pub sha256: String,
}

/// `text` (a rendered lock) with the pins' header after the other leading comments.
pub(crate) fn with_models_header(text: &str, pins: &[ModelPin]) -> String {
    if pins.is_empty() {
        return text.to_string();
    }
    let header = format!(
        "{MODELS_MARKER}{}\n",
        serde_json::to_string(pins).expect("strings serialize")
    );
    let comments: usize = text
        .split_inclusive('\n')
        .take_while(|line| line.starts_with('#'))
        .map(str::len)
        .sum();
    format!("{}{header}{}", &text[..comments], &text[comments..])
}

/// The pins the lock text holds; none without the header.
pub fn models_in(text: &str, path: &Path) -> Result<Vec<ModelPin>, LockError> {
    super::header::list_in(text, path, MODELS_MARKER, "model files")
}

/// The pins of the lock at `path`; none when there is no lock.
pub fn read_models(path: &Path) -> Result<Vec<ModelPin>, LockError> {
    super::header::read_list(path, MODELS_MARKER, "model files")
}

/// Whether the `locked` pins are the `wanted` ones (the models' files as they are now, in
/// order); the first file that differs is the reason.
pub fn check_models(locked: &[ModelPin], wanted: &[ModelPin]) -> Result<(), Staleness> {
    let key = |pin: &ModelPin| (pin.model.clone(), pin.path.clone());
    for i in 0..locked.len().max(wanted.len()) {
        let (was, now) = (locked.get(i), wanted.get(i));
        if was == now {
            continue;
        }
        // The same file changed, or a file came or went: name the one the other side lacks.
        let (model, path) = match (was, now) {
            (Some(was), Some(now)) if key(was) == key(now) => key(now),
            (Some(was), Some(now)) if wanted.iter().any(|p| key(p) == key(was)) => key(now),
            (Some(was), _) => key(was),
            (None, Some(now)) => key(now),
            (None, None) => unreachable!("i is below one of the lengths"),
        };
        let find = |pins: &[ModelPin]| {
            pins.iter()
                .find(|p| p.model == model && p.path == path)
                .map(|p| format!("{} bytes, {}", p.size, p.sha256))
        };
        return Err(Staleness::Model {
            model: model.clone(),
            path: path.clone(),
            locked: find(locked),
            wanted: find(wanted),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(path: &str, size: u64, digest: char) -> ModelPin {
        ModelPin {
            model: "tiny".into(),
            path: path.into(),
            size,
            sha256: format!("sha256:{}", digest.to_string().repeat(64)),
        }
    }

    #[test]
    fn pins_go_after_the_leading_comments_and_read_back() {
        let text = "# a\n# imgbuild-base: x\nversion: 6\n";
        let pins = [pin("config.json", 3, 'a'), pin("model.safetensors", 9, 'b')];
        let written = with_models_header(text, &pins);
        let lines: Vec<&str> = written.lines().collect();
        assert!(lines[2].starts_with(MODELS_MARKER), "{written}");
        assert_eq!(lines[3], "version: 6");
        let path = Path::new("x.lock");
        assert_eq!(models_in(&written, path).unwrap(), pins);
        assert!(models_in(text, path).unwrap().is_empty());
        assert_eq!(with_models_header(text, &[]), text);
        let broken = written.replace("# imgbuild-models: [", "# imgbuild-models: {");
        assert!(models_in(&broken, path).is_err());
    }

    #[test]
    fn the_file_that_changed_came_or_went_is_named() {
        let locked = [pin("a.json", 3, 'a'), pin("w.safetensors", 9, 'b')];
        assert!(check_models(&locked, &locked).is_ok());
        let changed = [pin("a.json", 3, 'a'), pin("w.safetensors", 9, 'c')];
        let reason = check_models(&locked, &changed).unwrap_err().to_string();
        assert!(
            reason.contains("`w.safetensors` of model `tiny` changed"),
            "{reason}"
        );
        let gone = check_models(&locked, &locked[1..]).unwrap_err().to_string();
        assert!(
            gone.contains("`a.json`") && gone.contains("no longer"),
            "{gone}"
        );
        let added = check_models(&locked[..1], &locked).unwrap_err().to_string();
        assert!(
            added.contains("`w.safetensors`") && added.contains("not in the lock"),
            "{added}"
        );
    }
}
