//! Modules depend in one direction. Every top-level module of `src/` has a level in
//! [`LEVELS`], bottom first, and may name only modules of its own level or below, never one
//! above; and no modules name each other in a loop, within a level either. A `crate::X` in
//! code, or an `X` at the top of a `use crate::{…}` group, is an edge (comments, strings and
//! a trailing `#[cfg(test)] mod tests` are left out: tests may reach anywhere).
//!
//! The README's architecture section draws the same order; change both together.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// The levels, bottom first.
const LEVELS: &[(&str, &[&str])] = &[
    (
        "leaf values and utilities",
        &[
            "fs",
            "http",
            "download",
            "report",
            "staging",
            "compression",
            "annotations",
            "attest",
            "sign",
            "names",
            "reference",
            "python",
            "cuda",
        ],
    ),
    ("the recipe", &["recipe"]),
    ("solving and locking", &["resolve", "lock"]),
    ("installing", &["install", "pypi"]),
    ("layers and images", &["layers", "oci", "registry"]),
    (
        "what builds use and read back",
        &[
            "rebuild",
            "smoke",
            "inspect",
            "sbom",
            "provenance",
            "init",
            "k8s",
            "slurm",
        ],
    ),
    ("publishing", &["publish"]),
    ("the build", &["build"]),
    ("checks of built images", &["verify"]),
    ("the command line", &["cli"]),
];

/// `text` without comments, string literals and a trailing `#[cfg(test)] mod tests`.
pub(crate) fn code_of(text: &str) -> String {
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

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The first path segment of each item of a `{…}` group that `text` starts inside of
/// (`a::b, c, d::{e, f}}` gives a, c, d).
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expect_head = true,
            c if expect_head && depth == 0 && (c.is_alphanumeric() || c == '_') => {
                heads.push(identifier(&text[at..]));
                expect_head = false;
            }
            _ => {}
        }
    }
    heads
}

/// The top-level modules `code` names.
fn named_in(code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => named.extend(group_heads(group)),
            None => {
                named.insert(identifier(rest));
            }
        }
    }
    named
}

/// The top-level modules of `src` and the files of each.
fn modules(src: &Path) -> BTreeMap<String, Vec<std::path::PathBuf>> {
    let mut modules: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for entry in walkdir::WalkDir::new(src)
        .into_iter()
        .filter_map(Result::ok)
    {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module != "lib" && module != "main" {
            modules.entry(module).or_default().push(path.to_path_buf());
        }
    }
    modules
}

/// Which modules each module names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    modules
        .iter()
        .map(|(module, files)| {
            let mut named = BTreeSet::new();
            for file in files {
                named.extend(named_in(&code_of(&fs_err::read_to_string(file).unwrap())));
            }
            named.retain(|n| n != module && modules.contains_key(n));
            (module.clone(), named)
        })
        .collect()
}

/// A loop of modules naming each other, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<&'a str>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = path[at..].iter().map(|n| n.to_string()).collect();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in &graph[node] {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn level_of(module: &str) -> Option<usize> {
    LEVELS.iter().position(|(_, names)| names.contains(&module))
}

#[test]
fn every_module_has_a_level_and_names_nothing_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    let unplaced: Vec<&String> = graph.keys().filter(|m| level_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules without a level in LEVELS (and the README's architecture section): {unplaced:?}"
    );
    let placed_but_gone: Vec<&&str> = LEVELS
        .iter()
        .flat_map(|(_, names)| names.iter())
        .filter(|m| !graph.contains_key(**m))
        .collect();
    assert!(
        placed_but_gone.is_empty(),
        "no such modules: {placed_but_gone:?}"
    );
    let mut upward = Vec::new();
    for (module, named) in &graph {
        for other in named {
            if level_of(other) > level_of(module) {
                upward.push(format!("{module} -> {other}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "modules naming a module above them: {upward:?}"
    );
}

#[test]
fn no_modules_name_each_other_in_a_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycle = find_cycle(&graph(&src));
    assert!(
        cycle.is_none(),
        "an import cycle: {}",
        cycle.unwrap().join(" -> ")
    );
}

#[test]
fn the_graph_reader_sees_grouped_imports_and_loops() {
    // The checks above can fail: a grouped import is an edge, and a loop is found.
    let code = code_of(
        "use crate::{\n    lock::{Lock, PlatformLock},\n    recipe::Recipe, fs,\n};\n// crate::cli\nlet _ = crate::oci::sha256_digest;",
    );
    assert_eq!(
        named_in(&code),
        BTreeSet::from(["fs", "lock", "oci", "recipe"].map(String::from))
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
}
