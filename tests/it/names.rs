//! One word for one thing: no two modules of the library's crates define a type or trait of
//! the same name, whatever its visibility. Two `LayoutImage`s, one an image read back and one
//! an image built, had a reader guess which was meant; a second meaning gets a name of its
//! own, and so does a private one, since a reader of two files meets both. Associated types
//! (`type Item = …` in an impl, indented) are not definitions. A re-export (`pub use`) is
//! not one either, so the same type under two paths passes; a clash that is really one
//! concept would be a row of [`SAME_CONCEPT`], with why.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// Names defined twice on purpose: (name, why it is one concept). Every row must still be
/// a clash, so the list stays exact.
const SAME_CONCEPT: &[(&str, &str)] = &[];

/// The item kinds a name can stand for in a `use` or a signature.
const KINDS: &[&str] = &["struct", "enum", "trait", "union", "type"];

/// The name a line of code defines, with any visibility, if it does.
fn definition(line: &str) -> Option<&str> {
    let trimmed = line.trim_start();
    let rest = match trimmed.strip_prefix("pub") {
        Some(rest) => match rest.strip_prefix('(') {
            Some(scoped) => &scoped[scoped.find(')')? + 1..],
            None => rest,
        },
        None => trimmed,
    };
    let mut words = rest.split_whitespace();
    let kind = words.next()?;
    let associated = kind == "type" && line.starts_with(' ') && !trimmed.starts_with("pub");
    if !KINDS.contains(&kind) || associated {
        return None;
    }
    let name = words.next()?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    Some(&name[..end]).filter(|name| !name.is_empty())
}

/// Each visible type or trait name defined under `src`, with the files that define it.
fn definitions(src: &Path) -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in walkdir::WalkDir::new(src).sort_by_file_name() {
        let entry = entry.unwrap();
        if entry.path().extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = fs_err::read_to_string(entry.path()).unwrap();
        let file = entry
            .path()
            .strip_prefix(src)
            .unwrap()
            .display()
            .to_string();
        for line in crate::layering::code_of(&text).lines() {
            if let Some(name) = definition(line) {
                found
                    .entry(name.to_string())
                    .or_default()
                    .push(file.clone());
            }
        }
    }
    found
}

/// The names the source folders `sources` define more than once, with where (named from
/// the checkout's root where they are in it).
fn clashes(sources: &[PathBuf]) -> BTreeMap<String, Vec<String>> {
    let mut all: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for src in sources {
        let folder = src
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(Path::new(""));
        for (name, files) in definitions(src) {
            let files = files.iter().map(|f| folder.join(f).display().to_string());
            all.entry(name).or_default().extend(files);
        }
    }
    all.into_iter()
        .filter(|(_, files)| files.len() > 1)
        .collect()
}

#[test]
fn no_visible_type_name_is_defined_twice() {
    let mut clashes = clashes(&crate::layering::library_sources());
    for (name, why) in SAME_CONCEPT {
        assert!(
            clashes.remove(*name).is_some(),
            "`{name}` is listed as one concept ({why}) but is no longer defined twice"
        );
    }
    let report: Vec<String> = clashes
        .iter()
        .map(|(name, files)| format!("{name}: {}", files.join(", ")))
        .collect();
    assert!(
        report.is_empty(),
        "type names defined more than once in the library (give each meaning its own name):\n{}",
        report.join("\n")
    );
}

#[test]
fn a_definition_is_read_with_any_visibility_and_generics() {
    assert_eq!(definition("pub struct Layout {"), Some("Layout"));
    assert_eq!(
        definition("    pub(crate) struct Context<'a> {"),
        Some("Context")
    );
    assert_eq!(definition("pub(in crate::build) enum Step {"), Some("Step"));
    assert_eq!(definition("pub trait Reporter: Send {"), Some("Reporter"));
    assert_eq!(definition("pub type Result<T> = …;"), Some("Result"));
    assert_eq!(definition("struct Private;"), Some("Private"));
    assert_eq!(definition("    type Item = u8;"), None);
    assert_eq!(definition("pub fn layout() {"), None);
    assert_eq!(definition("pub use read::LayoutImage;"), None);
}

#[test]
fn a_clash_is_found_across_files() {
    let dir = tempfile::tempdir().unwrap();
    fs_err::create_dir_all(dir.path().join("oci")).unwrap();
    fs_err::write(
        dir.path().join("oci/read.rs"),
        "pub struct LayoutImage {}\n",
    )
    .unwrap();
    fs_err::write(
        dir.path().join("build.rs"),
        "// pub struct Commented;\npub(super) struct LayoutImage;\npub struct BuiltImage;\n",
    )
    .unwrap();
    let clashes = clashes(&[dir.path().to_path_buf()]);
    assert_eq!(
        clashes.into_iter().collect::<Vec<_>>(),
        [(
            "LayoutImage".to_string(),
            vec!["build.rs".to_string(), "oci/read.rs".to_string()]
        )]
    );
}
