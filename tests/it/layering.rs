//! Modules depend in one direction. The stages below the build (install, layers, cuda, oci
//! and the ones they use) must never name the modules above them (build, smoke, inspect,
//! sbom, rebuild, verify, k8s, init, cli): progress goes through `report`, not `build`.
//! A `crate::X` in code (comments, strings and `#[cfg(test)]` modules left out) is an edge.

use std::{collections::BTreeSet, path::Path};

/// The modules that drive a build or read its output.
const ABOVE: &[&str] = &[
    "build", "smoke", "inspect", "sbom", "rebuild", "verify", "k8s", "init", "cli",
];
/// The modules a build is made of, which none of [`ABOVE`] may be named from.
const BELOW: &[&str] = &[
    "report", "install", "layers", "cuda", "oci", "pypi", "lock", "resolve", "recipe", "registry",
    "download", "http", "fs", "staging",
];

/// `text` without comments, string literals and a trailing `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The top-level modules `module`'s files name.
fn named_by(src: &Path, module: &str) -> BTreeSet<String> {
    let mut files: Vec<_> = vec![src.join(format!("{module}.rs"))];
    files.extend(
        walkdir::WalkDir::new(src.join(module))
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
            .map(|e| e.path().to_path_buf()),
    );
    let mut named = BTreeSet::new();
    for file in files.iter().filter(|f| f.is_file()) {
        let code = code_of(&fs_err::read_to_string(file).unwrap());
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            named.insert(name);
        }
    }
    named
}

#[test]
fn the_stages_of_a_build_never_name_what_drives_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for module in BELOW {
        let named = named_by(&src, module);
        assert!(
            src.join(format!("{module}.rs")).is_file() || src.join(module).is_dir(),
            "no module {module}"
        );
        for above in ABOVE.iter().filter(|a| named.contains(**a)) {
            wrong.push(format!("{module} -> {above}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "modules naming what is above them: {wrong:?}"
    );
}
