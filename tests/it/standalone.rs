//! The repository stands alone (issue 18): a user's clone has nothing beside it, so no
//! source, test, example, recipe or CI script may read a directory outside the checkout.
//! `.ci/run` also runs the tests in a fresh clone in a directory of its own.

use std::path::Path;

/// What a read of the design folder beside the checkout would be spelled with.
fn forbidden() -> [String; 2] {
    [
        format!("..{}shared", '/'),
        format!("IMGBUILD_{}_DIR", "SHARED"),
    ]
}

#[test]
fn nothing_reads_outside_the_checkout() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut offenders = Vec::new();
    for top in [
        "src",
        "tests",
        "examples",
        "crates",
        "fuzz",
        "recipes",
        ".ci",
        "Justfile",
        "Cargo.toml",
    ] {
        let walk = walkdir::WalkDir::new(root.join(top))
            .into_iter()
            .filter_entry(|e| {
                // Caches and build output the tests make, and third-party data kept verbatim.
                let name = e.file_name().to_string_lossy();
                !matches!(
                    name.as_ref(),
                    ".cache" | "target" | "conda-real" | "artifacts" | "corpus"
                )
            });
        for entry in walk {
            let entry = entry.unwrap();
            if !entry.file_type().is_file() {
                continue;
            }
            let Ok(text) = fs_err::read_to_string(entry.path()) else {
                continue;
            };
            for (number, line) in text.lines().enumerate() {
                for needle in forbidden().iter().filter(|n| line.contains(n.as_str())) {
                    offenders.push(format!(
                        "{}:{}: {needle}",
                        entry.path().display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "reads outside the checkout:\n{}",
        offenders.join("\n")
    );
}
