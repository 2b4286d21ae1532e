//! Modules depend in one direction. Every top-level module of `src/` has a level in
//! [`LEVELS`], bottom first, and may name only modules of its own level or below, never one
//! above; and no modules name each other in a loop, within a level either. A `crate::X` in
//! code, or an `X` at the top of a `use crate::{…}` group, is an edge (comments, strings and
//! a trailing `#[cfg(test)] mod tests` are left out: tests may reach anywhere). Some pairs
//! stay apart whatever their levels ([`KEPT_APART`]), and inside each folder of `src/` the
//! submodules name each other without a loop too ([`folder_graphs`]).
//!
//! The book's architecture page (docs/src/contributing/architecture.md) draws the same order; change both together.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Which modules each module names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Arrows between top-level modules that must not come back, and why.
const KEPT_APART: &[(&str, &str, &str)] = &[
    (
        "oci",
        "recipe",
        "images are written from checked, plain config (`image_config`, `reference`), so the \
         image crate of item 9 of issue 27 can sit below the recipe's",
    ),
    (
        "layers",
        "recipe",
        "layers are made from a plan of plain data, never from the recipe",
    ),
    (
        "layers",
        "install",
        "the layer planner takes a neutral staged tree (`layers::StagedTree`), which the build \
         makes from what it installed, so layers can sit beside install, not above it",
    ),
    (
        "layers",
        "pypi",
        "wheels reach the planner as the same neutral staged tree as conda packages",
    ),
];

/// Folders whose own file (`mod.rs`) is only the driver: their submodules take nothing from
/// it, so it is a node `mod` of the loop check there. Elsewhere a folder's own file drives
/// its submodules and holds what they share (`cli`, `cuda`, `install`, `k8s`, `sbom`, …),
/// so it names them and they name it, and it is left out.
const DRIVERS: &[&str] = &["build"];

/// The workspace's library crates, bottom first, each with its folder and its top-level
/// modules; the last, the `imgbuild` crate itself, has every module not named before it.
/// A crate may depend only on crates before it (imgbuild-smoke, the in-image executable,
/// is first and names none), and a module may name only modules of its own crate or of a
/// crate its crate depends on.
pub(crate) const CRATES: &[(&str, &str, &[&str])] = &[
    ("imgbuild-smoke", "crates/imgbuild-smoke", &[]),
    (
        "imgbuild-model",
        "crates/imgbuild-model",
        &[
            "annotations",
            "attest",
            "compression",
            "cuda",
            "download",
            "fs",
            "http",
            "image_config",
            "names",
            "python",
            "reference",
            "report",
            "staging",
        ],
    ),
    ("imgbuild-recipe", "crates/imgbuild-recipe", &["recipe"]),
    (
        "imgbuild-solve",
        "crates/imgbuild-solve",
        &["resolve", "lock"],
    ),
    (
        "imgbuild-install",
        "crates/imgbuild-install",
        &["install", "pypi"],
    ),
    (
        "imgbuild-oci",
        "crates/imgbuild-oci",
        &["layers", "oci", "registry", "sign"],
    ),
    ("imgbuild", ".", &[]),
];

/// The source folders of the library, bottom crate first (imgbuild-smoke is left out: its
/// modules are not the library's, and it names none of them).
pub(crate) fn library_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    CRATES[1..]
        .iter()
        .map(|(_, dir, _)| root.join(dir).join("src"))
        .collect()
}

/// The crate each top-level module is in.
fn crate_of(module: &str) -> &'static str {
    CRATES
        .iter()
        .find(|(_, _, modules)| modules.contains(&module))
        .map_or("imgbuild", |(name, _, _)| name)
}

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
            "image_config",
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
            "cache_admin",
            "smoke",
            "inspect",
            "sizes",
            "sbom",
            "provenance",
            "init",
            "locked_variants",
            "models",
            "k8s",
            "slurm",
            "notebook",
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

/// A module's path from the crate root: `["layers", "cache", "seal"]`.
type ModulePath = Vec<String>;

/// The module each file of `src` is (`a/mod.rs` and `a.rs` are both `a`), with its code
/// ([`code_of`]); `lib.rs` and `main.rs` are left out.
fn sources(src: &Path) -> BTreeMap<ModulePath, String> {
    walkdir::WalkDir::new(src)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|entry| entry.path().extension().is_some_and(|x| x == "rs"))
        .filter_map(|entry| {
            let path = entry.path();
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: ModulePath = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            let in_lib = module != ["lib"] && module != ["main"];
            in_lib.then(|| (module, code_of(&fs_err::read_to_string(path).unwrap())))
        })
        .collect()
}

/// [`sources`] of every crate of the library: module paths are the same as before the
/// split into crates, as each crate brings the lower crates' modules in by their names.
fn library() -> BTreeMap<ModulePath, String> {
    library_sources()
        .iter()
        .flat_map(|src| sources(src))
        .collect()
}

/// Which top-level modules each names.
fn graph(sources: BTreeMap<ModulePath, String>) -> Graph {
    let mut graph = Graph::new();
    for (module, code) in sources {
        graph
            .entry(module[0].clone())
            .or_default()
            .extend(named_in(&code));
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, named) in &mut graph {
        named.retain(|n| n != module && modules.contains(n));
    }
    graph
}

/// The paths a use tree (or a plain path) at the start of `text` names, each with the name
/// it brings in (its last segment, or its `as`), and where it ends: `a::{b, c::d as e}`
/// gives `a::b` (b) and `a::c::d` (e). A path stops where something else starts
/// (`a::f(`, `a::T::<`).
fn use_tree(text: &str) -> (Vec<(ModulePath, String)>, usize) {
    let skip_space = |at: usize| at + (text.len() - at - text[at..].trim_start().len());
    let at = skip_space(0);
    if let Some(group) = text[at..].strip_prefix('{') {
        let mut at = text.len() - group.len();
        let mut paths = Vec::new();
        loop {
            at = skip_space(at);
            match text[at..].chars().next() {
                None => return (paths, at),
                Some('}') => return (paths, at + 1),
                Some(',') => at += 1,
                Some(_) => {
                    let (inner, used) = use_tree(&text[at..]);
                    if used == 0 {
                        return (paths, at);
                    }
                    paths.extend(inner);
                    at += used;
                }
            }
        }
    }
    let head = identifier(&text[at..]);
    if head.is_empty() {
        return (Vec::new(), 0);
    }
    let end = at + head.len();
    if let Some(rest) = text[end..].strip_prefix("::") {
        let (inner, used) = use_tree(rest);
        if used > 0 {
            let paths = inner
                .into_iter()
                .map(|(mut path, name)| {
                    path.insert(0, head.clone());
                    (path, name)
                })
                .collect();
            return (paths, end + 2 + used);
        }
    }
    let after = skip_space(end);
    let name = match text[after..].strip_prefix("as ") {
        Some(alias) => identifier(alias.trim_start()),
        None => head.clone(),
    };
    (vec![(vec![head], name)], end)
}

/// `path`, written in `module`, from the crate root: `crate::`, `super::` and `self::`
/// resolved, and a bare first segment taken as `module`'s own submodule.
fn absolute(module: &[String], path: &[String]) -> ModulePath {
    let mut out: ModulePath = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        _ => module.to_vec(),
    };
    for segment in path {
        match segment.as_str() {
            "crate" | "self" => {}
            "super" => {
                out.pop();
            }
            _ => out.push(segment.clone()),
        }
    }
    out
}

/// The `pub use` statements of `code`, each path with the name it exports, and `code`
/// without them: a re-export is not a use, what names it names what it re-exports.
fn split_reexports(code: &str) -> (String, Vec<(ModulePath, String)>) {
    let mut rest = String::with_capacity(code.len());
    let mut exports = Vec::new();
    let mut statement: Option<String> = None;
    for line in code.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if statement.is_none()
            && ["pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .any(|start| trimmed.starts_with(start))
        {
            statement = Some(String::new());
        }
        match &mut statement {
            Some(text) => {
                text.push_str(line);
                if let Some(end) = text.find(';') {
                    let tree = &text[text.find(" use ").unwrap() + " use ".len()..end];
                    exports.extend(use_tree(tree).0);
                    statement = None;
                }
                rest.push('\n');
            }
            None => rest.push_str(line),
        }
    }
    (rest, exports)
}

/// The paths `code`, written in `module`, names: `crate::a::b`, `super::b`, `self::b`,
/// `b::` for a submodule `b` of `module`, and each item of a `use …::{…}` group.
fn paths_in(code: &str, module: &[String], submodules: &BTreeSet<String>) -> Vec<ModulePath> {
    let mut paths = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let starts_word = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
        let word = identifier(rest);
        if word.is_empty() {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let is_root =
            matches!(word.as_str(), "crate" | "super" | "self") || submodules.contains(&word);
        if starts_word && is_root && rest[word.len()..].starts_with("::") {
            let (named, used) = use_tree(rest);
            paths.extend(named.iter().map(|(path, _)| absolute(module, path)));
            at += used.max(word.len());
        } else {
            at += word.len();
        }
    }
    paths
}

/// `path` with its re-exports followed to where the item is defined.
fn defined_at(
    mut path: ModulePath,
    modules: &BTreeSet<ModulePath>,
    reexports: &BTreeMap<ModulePath, BTreeMap<String, ModulePath>>,
) -> ModulePath {
    // A re-export may name another: follow a few, as far as any chain here goes.
    for _ in 0..4 {
        let Some(at) = (1..path.len())
            .rev()
            .find(|&n| modules.contains(&path[..n]))
        else {
            break;
        };
        if modules.contains(&path) {
            break;
        }
        match reexports
            .get(&path[..at])
            .and_then(|names| names.get(&path[at]))
        {
            Some(target) => path = target.iter().chain(&path[at + 1..]).cloned().collect(),
            None => break,
        }
    }
    path
}

/// Which submodules of each folder name which, for `sources` (each module's code): a
/// folder is a module with submodules (`layers`, `layers/cache`), a node each submodule
/// with what is beneath it, and the folder's own file (`mod.rs`, or `cache.rs` beside
/// `cache/`) the node `mod`. The top level is left out: the LEVELS check reads it.
fn folder_graphs(sources: &BTreeMap<ModulePath, String>) -> BTreeMap<String, Graph> {
    let modules: BTreeSet<ModulePath> = sources.keys().cloned().collect();
    let submodules = |module: &ModulePath| -> BTreeSet<String> {
        modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m[module.len()].clone())
            .collect()
    };
    let mut reexports: BTreeMap<ModulePath, BTreeMap<String, ModulePath>> = BTreeMap::new();
    let mut named = Vec::new();
    for (module, code) in sources {
        let (code, exports) = split_reexports(code);
        for (path, name) in exports {
            // `pub use a::{self}` exports `a` itself.
            let path = match path.split_last() {
                Some((last, head)) if last == "self" => head,
                _ => &path[..],
            };
            let name = if name == "self" {
                path.last().cloned().unwrap_or(name)
            } else {
                name
            };
            reexports
                .entry(module.clone())
                .or_default()
                .insert(name, absolute(module, path));
        }
        for path in paths_in(&code, module, &submodules(module)) {
            named.push((module, path));
        }
    }
    let mut graphs: BTreeMap<String, Graph> = BTreeMap::new();
    for (module, path) in named {
        let path = defined_at(path, &modules, &reexports);
        let common = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
        if common == 0 || common == path.len() {
            continue;
        }
        let node = |of: &ModulePath| match of.get(common) {
            Some(name) if modules.contains(&of[..=common]) => name.clone(),
            _ => "mod".to_string(),
        };
        let (from, to) = (node(module), node(&path));
        if from != to {
            let graph = graphs.entry(path[..common].join("/")).or_default();
            graph.entry(to.clone()).or_default();
            graph.entry(from).or_default().insert(to);
        }
    }
    graphs
}

/// A loop of modules naming each other, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a Graph,
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
    let graph = graph(library());
    let unplaced: Vec<&String> = graph.keys().filter(|m| level_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules without a level in LEVELS (and docs/src/contributing/architecture.md): {unplaced:?}"
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
    let cycle = find_cycle(&graph(library()));
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
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn kept_apart_modules_do_not_name_each_other() {
    let graph = graph(library());
    let named: Vec<String> = KEPT_APART
        .iter()
        .filter(|(from, to, _)| graph[*from].contains(*to))
        .map(|(from, to, why)| format!("{from} -> {to} ({why})"))
        .collect();
    assert!(named.is_empty(), "arrows that must not be: {named:?}");
}

#[test]
fn no_submodules_of_a_folder_name_each_other_in_a_loop() {
    let graphs = folder_graphs(&library());
    let mut cycles = Vec::new();
    for (folder, graph) in &graphs {
        let mut graph = graph.clone();
        let with_mod = DRIVERS.contains(&folder.as_str());
        if !with_mod {
            graph.remove("mod");
        }
        for named in graph.values_mut() {
            named.retain(|to| with_mod || to != "mod");
        }
        if let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{folder}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles inside a folder: {cycles:?}"
    );
}

#[test]
fn the_folder_reader_follows_super_groups_and_reexports() {
    // `a/x.rs` names `y` through a group and through the re-export of `a/mod.rs`, `y` names
    // `x` by a bare path in `crate::a`; `a/mod.rs` names both, and `z` an item of it.
    let sources: BTreeMap<ModulePath, String> = [
        (
            &["a"][..],
            "mod x;\nmod y;\npub(crate) use y::{Shared as Renamed};\nfn f() { x::g(); y::h(); }",
        ),
        (&["a", "x"], "use super::{Renamed, z};\nfn g() {}"),
        (
            &["a", "y"],
            "pub struct Shared;\nfn h() { crate::a::x::g() }",
        ),
        (
            &["a", "z"],
            "use std::fs::read;\nfn i() { super::super::b::j(); super::f() }",
        ),
        (&["b"], "pub fn j() {}"),
    ]
    .into_iter()
    .map(|(module, code)| {
        (
            module.iter().map(|s| s.to_string()).collect(),
            code.to_string(),
        )
    })
    .collect();
    let graphs = folder_graphs(&sources);
    let arrows: Vec<String> = graphs["a"]
        .iter()
        .flat_map(|(from, named)| named.iter().map(move |to| format!("{from} -> {to}")))
        .collect();
    assert_eq!(
        arrows,
        [
            "mod -> x", "mod -> y", "x -> y", "x -> z", "y -> x", "z -> mod"
        ]
    );
    assert_eq!(graphs.len(), 1);
    assert!(find_cycle(&graphs["a"]).is_some());
}

/// The workspace crates `dir`'s manifest depends on. Dev dependencies are left out: they
/// serve tests, which may reach anywhere.
fn crate_dependencies(dir: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(dir)
        .join("Cargo.toml");
    let manifest: toml::Table = fs_err::read_to_string(path).unwrap().parse().unwrap();
    let Some(dependencies) = manifest.get("dependencies").and_then(|d| d.as_table()) else {
        return BTreeSet::new();
    };
    dependencies
        .keys()
        .filter(|name| CRATES.iter().any(|(crate_name, _, _)| crate_name == name))
        .cloned()
        .collect()
}

fn crate_position(name: &str) -> usize {
    CRATES.iter().position(|(n, _, _)| *n == name).unwrap()
}

#[test]
fn the_workspace_is_the_listed_crates() {
    let manifest: toml::Table =
        fs_err::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
    let members: BTreeSet<&str> = manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let listed: BTreeSet<&str> = CRATES.iter().map(|(_, dir, _)| *dir).collect();
    assert_eq!(members, listed, "workspace members against CRATES");
}

#[test]
fn each_crate_depends_only_on_crates_before_it() {
    let mut upward = Vec::new();
    for (at, (name, dir, _)) in CRATES.iter().enumerate() {
        for dependency in crate_dependencies(dir) {
            if crate_position(&dependency) >= at {
                upward.push(format!("{name} -> {dependency}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "crates depending on a crate not before them in CRATES: {upward:?}"
    );
}

#[test]
fn each_crate_holds_its_modules_and_names_only_what_it_depends_on() {
    for (name, dir, modules) in &CRATES[1..CRATES.len() - 1] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join("src");
        let found: BTreeSet<String> = sources(&src).into_keys().map(|m| m[0].clone()).collect();
        let listed: BTreeSet<String> = modules.iter().map(|m| m.to_string()).collect();
        assert_eq!(found, listed, "the top-level modules of {name}");
    }
    let mut unreachable = Vec::new();
    for (module, named) in graph(library()) {
        let from = crate_of(&module);
        let dependencies = crate_dependencies(CRATES[crate_position(from)].1);
        for other in named {
            let to = crate_of(&other);
            if to != from && !dependencies.contains(to) {
                unreachable.push(format!("{module} ({from}) -> {other} ({to})"));
            }
        }
    }
    assert!(
        unreachable.is_empty(),
        "modules naming a module of a crate theirs does not depend on: {unreachable:?}"
    );
}

#[test]
fn the_crate_checks_can_fail() {
    // The checks above read real manifests: the top crate depends on the bottom one, the
    // bottom one only on imgbuild-smoke, and a module of imgbuild-oci is placed there.
    assert!(crate_dependencies(".").contains("imgbuild-model"));
    assert_eq!(
        crate_dependencies("crates/imgbuild-model"),
        BTreeSet::from(["imgbuild-smoke".to_string()])
    );
    assert_eq!(crate_of("layers"), "imgbuild-oci");
    assert_eq!(crate_of("build"), "imgbuild");
    assert!(crate_position("imgbuild-oci") > crate_position("imgbuild-model"));
}
