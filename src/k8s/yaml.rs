//! YAML that every reader of a manifest reads alike. serde_yaml 0.9 quotes a string only
//! where YAML 1.2 would read another type, so `no`, `on`, `1_000`, `1:20` and `2001-12-14`
//! come out plain, and YAML 1.1 readers (PyYAML under kubernetes-validate, kubectl's
//! sigs.k8s.io/yaml, Helm) read a boolean, a number or a date instead of the string. This
//! writer takes serde_yaml's value tree (which keeps the objects' field order) and writes
//! block YAML itself, deciding each string's style by one rule: plain only for words that
//! are strings in YAML 1.1 and 1.2 alike ([`is_plain_safe`]), a literal block for text of
//! several lines that a block holds unchanged ([`is_block_safe`]), double-quoted with
//! escapes for everything else.

use serde_yaml::Value;

/// `value` as one YAML document.
pub(crate) fn to_string<T: serde::Serialize>(value: &T) -> Result<String, serde_yaml::Error> {
    let tree = serde_yaml::to_value(value)?;
    let mut out = String::new();
    match &tree {
        Value::Mapping(map) if !map.is_empty() => write_mapping(&mut out, map, 0, false),
        Value::Sequence(items) if !items.is_empty() => write_sequence(&mut out, items, 0, false),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
    Ok(out)
}

/// The entries of `map` at `indent`; `continued` when the first goes on the current line
/// (after a sequence's `- `).
fn write_mapping(out: &mut String, map: &serde_yaml::Mapping, indent: usize, continued: bool) {
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 || !continued {
            out.push_str(&" ".repeat(indent));
        }
        // A key is never a block: one line, quoted as a string value would be.
        out.push_str(&match key {
            Value::String(text) => quoted(text),
            other => inline(other),
        });
        out.push(':');
        write_value(out, value, indent, indent + 2);
    }
}

/// The items of `items` at `indent`, each after `- `.
fn write_sequence(out: &mut String, items: &[Value], indent: usize, continued: bool) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !continued {
            out.push_str(&" ".repeat(indent));
        }
        out.push('-');
        match item {
            Value::Mapping(map) if !map.is_empty() => {
                out.push(' ');
                write_mapping(out, map, indent + 2, true);
            }
            Value::Sequence(inner) if !inner.is_empty() => {
                out.push(' ');
                write_sequence(out, inner, indent + 2, true);
            }
            other => write_value(out, other, indent, indent + 2),
        }
    }
}

/// What follows a key's `:` or an item's `-`: a nested collection on the next lines (a
/// mapping at `nested`, a key's sequence at `indent`, as kubectl writes it), a block, or a
/// scalar on this line.
fn write_value(out: &mut String, value: &Value, indent: usize, nested: usize) {
    match value {
        Value::Mapping(map) if !map.is_empty() => {
            out.push('\n');
            write_mapping(out, map, nested, false);
        }
        Value::Sequence(items) if !items.is_empty() => {
            out.push('\n');
            write_sequence(out, items, indent, false);
        }
        Value::String(text) if is_block_safe(text) => {
            out.push_str(" |\n");
            for line in text.lines() {
                if !line.is_empty() {
                    out.push_str(&" ".repeat(nested));
                    out.push_str(line);
                }
                out.push('\n');
            }
        }
        Value::Tagged(tagged) => write_value(out, &tagged.value, indent, nested),
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

/// A scalar or an empty collection on one line.
fn inline(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(text) => quoted(text),
        Value::Sequence(_) => "[]".to_string(),
        Value::Mapping(_) => "{}".to_string(),
        Value::Tagged(tagged) => inline(&tagged.value),
    }
}

/// The words YAML 1.1 reads as booleans or null (compared lower-cased, so `yEs` is quoted
/// too, which costs nothing).
const YAML11_WORDS: &[&str] = &[
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~",
];

/// Whether `text` is a string written plain in YAML 1.1 and 1.2 alike: it starts with a
/// letter (no number, date, sexagesimal `1:20`, `.inf` or indicator starts that way), has only
/// letters, digits, `.`, `_`, `/` and `-` (no `:`, `#` or space that would end or split
/// it), and is none of YAML 1.1's boolean and null words.
pub(crate) fn is_plain_safe(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c))
        && !YAML11_WORDS.contains(&text.to_ascii_lowercase().as_str())
}

/// `text` plain where [`is_plain_safe`], else double-quoted with [`escape`].
fn quoted(text: &str) -> String {
    if is_plain_safe(text) {
        text.to_string()
    } else {
        format!("\"{}\"", escape(text))
    }
}

/// Whether a literal block (`|`, which keeps one final newline) holds `text` unchanged: lines
/// that end in one newline, the first neither empty nor indented (it sets the block's
/// indentation), and no character a block cannot carry ([`needs_escape`] other than the tab).
fn is_block_safe(text: &str) -> bool {
    text.contains('\n')
        && text.ends_with('\n')
        && !text.ends_with("\n\n")
        && !text.starts_with([' ', '\t', '\n'])
        && !text
            .chars()
            .any(|c| c != '\n' && c != '\t' && needs_escape(c))
}

/// Characters a double-quoted scalar writes escaped: controls (C0, DEL, C1; NEL, which YAML
/// 1.1 reads as a line break), the line and paragraph separators (also breaks in YAML 1.1),
/// the bidi and zero-width controls that hide or reorder text, and the BOM.
fn needs_escape(c: char) -> bool {
    matches!(
        c,
        '\0'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{ad}'
            | '\u{61c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fffe}'..='\u{ffff}'
    )
}

/// The inside of a double-quoted scalar: `"` and `\` escaped, the characters of
/// [`needs_escape`] as `\n`, `\t` or `\uXXXX`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_yaml_11_reads_as_other_types_are_quoted() {
        for text in [
            "no",
            "On",
            "Y",
            "off",
            "NULL",
            "~",
            "1_000",
            "1:20",
            "2001-12-14",
            "0x1F",
            "1e3",
            ".inf",
            "",
            " a",
            "a: b",
            "#x",
            "-",
            "- x",
            "@x",
            "a b",
            "'",
            "*x",
            "&x",
            "!x",
            "%x",
            "{x}",
            "[x]",
            "|",
            ">",
            "?",
            "=",
            "<<",
        ] {
            assert!(!is_plain_safe(text), "{text:?}");
            assert!(quoted(text).starts_with('"'), "{text:?}");
        }
        for text in ["Job", "batch/v1", "nvidia.com/gpu", "a-b_c.d", "Never"] {
            assert_eq!(quoted(text), text);
        }
        assert_eq!(quoted("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(
            quoted("x\u{85}\u{2028}\u{202e}"),
            r#""x\u0085\u2028\u202E""#
        );
    }

    #[test]
    fn documents_are_block_yaml_with_a_style_per_string() {
        let value = serde_json::json!({
            "kind": "Job",
            "metadata": {"name": "on", "labels": {}},
            "data": {"recipe.toml": "[image]\nname = \"x\"\n\n  indented\n"},
            "list": [{"a": "1:20", "b": ["no"]}, "x", [], 4],
            "flag": true,
        });
        assert_eq!(
            to_string(&value).unwrap(),
            "kind: Job\nmetadata:\n  name: \"on\"\n  labels: {}\ndata:\n  recipe.toml: |\n    [image]\n    name = \"x\"\n\n      indented\nlist:\n- a: \"1:20\"\n  b:\n  - \"no\"\n- x\n- []\n- 4\nflag: true\n"
        );
        // What a block cannot hold unchanged is double-quoted.
        for text in [
            "a\n\n",
            "a",
            " a\nb\n",
            "a\r\nb\n",
            "\na\n",
            "a\u{2028}\nb\n",
        ] {
            assert!(!is_block_safe(text), "{text:?}");
        }
    }
}
