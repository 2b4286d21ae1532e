//! PEP 508 requirements read from text a stranger wrote: a recipe's `[pypi]` dependencies,
//! a wheel's `Requires-Dist`, a lock's `requires_dist` and the pip section `init --from`
//! imports. pep508_rs parses them, with two habits that do not suit hostile text, so every
//! such text passes [`check`] before it reaches the parser:
//!
//! - a name or an extra that ends in `-`, `_` or `.` and is followed by more text makes
//!   pep508_rs 0.9.2 panic ("`PackageName` validation should match PEP 508 parsing")
//!   where it should give an error (found by the `init_from` fuzz target: `torch-- >=1`);
//! - `${NAME}` in a URL is filled in from the builder's environment, so a recipe or a lock
//!   from a stranger could copy a CI secret into a request or into the lock it writes.

use std::str::FromStr;

use pep508_rs::Requirement;

/// A name character of PEP 508 (`[A-Za-z0-9._-]`), as pep508_rs reads a name.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

/// The identifier at the start of `text` (a letter or digit, then name characters), or
/// `None` where `text` does not start with one (pep508_rs then errors on its own).
fn identifier(text: &str) -> Option<&str> {
    if !text.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return None;
    }
    let end = text.find(|c| !is_name_char(c)).unwrap_or(text.len());
    Some(&text[..end])
}

fn ends_badly(identifier: &str) -> bool {
    identifier.ends_with(['.', '-', '_'])
}

/// Refuses what pep508_rs would panic on or fill in from the environment; what passes is
/// safe to give to pep508_rs, which then accepts or refuses it with an error.
pub fn check(text: &str) -> Result<(), String> {
    if text.contains("${") {
        return Err(
            "`${…}` is not expanded: a requirement must not read the builder's \
                    environment (give index credentials as for the index, not in the text)"
                .to_string(),
        );
    }
    // The grammar's start: `wsp* name wsp* ('[' wsp* extra (wsp* ',' wsp* extra)* wsp* ']')?`.
    let rest = text.trim_start();
    if let Some(name) = identifier(rest) {
        if ends_badly(name) {
            return Err(format!(
                "the name `{name}` must end with a letter or a digit"
            ));
        }
        let after = rest[name.len()..].trim_start();
        if let Some(extras) = after.strip_prefix('[') {
            let inside = extras.split(']').next().unwrap_or_default();
            for extra in inside.split(',').filter_map(|e| identifier(e.trim_start())) {
                if ends_badly(extra) {
                    return Err(format!(
                        "the extra `{extra}` must end with a letter or a digit"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Parses `text` as a PEP 508 requirement; the error is one line, without pep508_rs's
/// caret drawing.
pub fn parse(text: &str) -> Result<Requirement, String> {
    check(text)?;
    Requirement::from_str(text).map_err(|err| {
        err.to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    })
}

/// Checks every PEP 508 text of a lock file before rattler_lock parses it (it hands them
/// to pep508_rs as they are): the `requires_dist` of pixi's formats and the pip
/// `dependencies` of conda-lock's, wherever they sit. YAML that does not parse is left to
/// rattler_lock, which says why.
pub fn check_lock(text: &str) -> Result<(), String> {
    match serde_yaml::from_str::<serde_yaml::Value>(text) {
        Ok(value) => check_lock_value(&value),
        Err(_) => Ok(()),
    }
}

fn check_lock_value(value: &serde_yaml::Value) -> Result<(), String> {
    use serde_yaml::Value;
    match value {
        Value::Mapping(mapping) => mapping.iter().try_for_each(|(key, value)| {
            let carries = matches!(key.as_str(), Some("requires_dist" | "dependencies"));
            match value {
                Value::Sequence(items) if carries => items
                    .iter()
                    .filter_map(Value::as_str)
                    .try_for_each(|text| check(text).map_err(|e| format!("`{text}`: {e}"))),
                other => check_lock_value(other),
            }
        }),
        Value::Sequence(items) => items.iter().try_for_each(check_lock_value),
        Value::Tagged(tagged) => check_lock_value(&tagged.value),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_pep508_rs_panics_on_is_an_error() {
        for text in [
            "torch-- >=1",
            "torch- ",
            "  a_ [x]",
            "torch[cuda-]",
            "torch[ok, cuda. ]",
            "torch [a,b_,c]>=1",
            "torch[x-",
        ] {
            let err = parse(text).unwrap_err();
            assert!(
                err.contains("must end with a letter or a digit"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn environment_references_are_refused_not_filled_in() {
        let err = parse("six @ https://example.org/${HOME}/six-1.0-py3-none-any.whl").unwrap_err();
        assert!(err.contains("not expanded"), "{err}");
    }

    #[test]
    fn a_lock_is_checked_wherever_its_requirements_sit() {
        let lock = "version: 6\npackages:\n- pypi: https://x/a.whl\n  requires_dist:\n  - six\n  - torch-- >=1\n";
        let err = check_lock(lock).unwrap_err();
        assert!(err.contains("`torch-- >=1`"), "{err}");
        assert!(check_lock("version: 6\npackages:\n- requires_dist: [six, 'a[b] >=1']\n").is_ok());
        assert!(check_lock("dependencies: {python: '>=3.9', 'x-': '1'}\n").is_ok());
        assert!(check_lock(": not yaml [").is_ok());
    }

    #[test]
    fn ordinary_requirements_parse() {
        for text in [
            "torch>=2.1",
            "a",
            "a.b-c_d[x-y,z] ; python_version >= '3.9'",
            "numpy==1.26.*",
            "six @ https://example.org/six-1.0-py3-none-any.whl",
        ] {
            let requirement = parse(text).unwrap_or_else(|err| panic!("{text}: {err}"));
            assert!(!requirement.name.as_ref().is_empty());
        }
        assert!(parse("-torch").is_err());
        assert!(parse("torch >= ").is_err());
    }
}
