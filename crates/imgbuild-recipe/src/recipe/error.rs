//! Recipe errors that point at the offending value: `file:line:column` and a caret.

use std::{fmt, ops::Range, path::PathBuf};

/// A byte range in the recipe text together with that text, so an error can be rendered
/// without reading the file again.
#[derive(Debug, Clone)]
pub struct SourceSpan {
    pub text: std::sync::Arc<str>,
    pub range: Range<usize>,
}

impl SourceSpan {
    /// 1-based line and column (in characters) of the start of the span.
    pub(crate) fn line_column(&self) -> (usize, usize) {
        let start = self.range.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = self.text[line_start..start].chars().count() + 1;
        (line, column)
    }
}

/// Why a recipe could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("Failed to read recipe `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Recipe `{}` is {kind}, not a regular file: give the path of a TOML recipe", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error(
        "Recipe `{}` has {size} bytes; a recipe may have at most {} (1 MiB)",
        path.display(),
        super::MAX_RECIPE_BYTES
    )]
    TooLarge { path: PathBuf, size: u64 },
    /// The file is not valid TOML, has an unknown key, a wrong type or an invalid value.
    #[error("{}", render(path, message, span.as_ref()))]
    Invalid {
        path: PathBuf,
        message: String,
        span: Option<SourceSpan>,
    },
}

impl RecipeError {
    /// The short message without the location and snippet, for tests and `--json`.
    pub fn message(&self) -> String {
        match self {
            RecipeError::Read { .. }
            | RecipeError::NotAFile { .. }
            | RecipeError::TooLarge { .. } => self.to_string(),
            RecipeError::Invalid { message, .. } => message.clone(),
        }
    }
}

/// Renders `error: message` with `--> file:line:col`, the source line and a caret under the
/// span, in the shape rustc and uv use.
fn render(path: &std::path::Path, message: &str, span: Option<&SourceSpan>) -> String {
    let help = super::suggest::for_unknown_key(message)
        .map(|key| format!("\nhelp: did you mean `{key}`?"))
        .unwrap_or_default();
    let Some(span) = span else {
        return format!("Invalid recipe `{}`: {message}{help}", path.display());
    };
    let (line, column) = span.line_column();
    let source_line = span.text.lines().nth(line - 1).unwrap_or("");
    let width = {
        let end = span.range.end.min(span.text.len());
        let start = span.range.start.min(end);
        // Underline at most the rest of the first line.
        span.text[start..end].lines().next().map_or(1, |s| {
            s.chars()
                .map(|c| shown(c).chars().count())
                .sum::<usize>()
                .max(1)
        })
    };
    let gutter = line.to_string().len();
    let pad = " ".repeat(gutter);
    let lead: String = source_line
        .chars()
        .take(column - 1)
        .map(|c| match c {
            '\t' => "\t".to_string(),
            c => " ".repeat(shown(c).chars().count()),
        })
        .collect();
    let source_line: String = source_line.chars().map(shown).collect();
    let mut out = String::new();
    use fmt::Write;
    let _ = writeln!(out, "Invalid recipe: {message}");
    let _ = writeln!(out, "{pad}--> {}:{line}:{column}", path.display());
    let _ = writeln!(out, "{pad} |");
    let _ = writeln!(out, "{line} | {source_line}");
    let _ = write!(out, "{pad} | {lead}{}", "^".repeat(width));
    out.push_str(&help);
    out
}

/// A character that makes text read otherwise than it is: a control character other than
/// TAB (newline, NUL, ESC, C1) or a bidirectional control (the "Trojan Source" characters,
/// CVE-2021-42574), which reorder how a terminal shows the text around them.
pub(crate) fn is_hidden(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// How a source character is shown in a snippet: a hidden one as `<U+202E>`, so the
/// snippet reads as the file is and the terminal does not reorder it.
pub fn shown(c: char) -> std::borrow::Cow<'static, str> {
    if is_hidden(c) {
        format!("<U+{:04X}>", u32::from(c)).into()
    } else {
        String::from(c).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_points_at_the_span() {
        let text: std::sync::Arc<str> = "[image]\nnmae = \"x\"\n".into();
        let err = RecipeError::Invalid {
            path: "r.toml".into(),
            message: "unknown field `nmae`".into(),
            span: Some(SourceSpan { text, range: 8..12 }),
        };
        let shown = err.to_string();
        assert!(shown.contains("--> r.toml:2:1"), "{shown}");
        assert!(shown.contains("2 | nmae = \"x\""), "{shown}");
        assert!(shown.ends_with("  | ^^^^"), "{shown}");
    }

    #[test]
    fn misspelt_key_gets_a_help_line_under_the_caret() {
        let text: std::sync::Arc<str> = "[image]\nnmae = \"x\"\n".into();
        let err = RecipeError::Invalid {
            path: "r.toml".into(),
            message: "unknown field `nmae`, expected one of `name`, `tags`".into(),
            span: Some(SourceSpan { text, range: 8..12 }),
        };
        let shown = err.to_string();
        assert!(
            shown.ends_with("  | ^^^^\nhelp: did you mean `name`?"),
            "{shown}"
        );
    }

    #[test]
    fn hidden_characters_are_shown_escaped_with_the_caret_under_them() {
        // `a = "x<RLO>y"` with the caret under the string.
        let text: std::sync::Arc<str> = "[image.env]\na = \"x\u{202e}y\"\n".into();
        let err = RecipeError::Invalid {
            path: "r.toml".into(),
            message: "bad".into(),
            span: Some(SourceSpan {
                text,
                range: 16..23,
            }),
        };
        let shown = err.to_string();
        assert!(!shown.contains('\u{202e}'), "{shown}");
        assert!(shown.contains("2 | a = \"x<U+202E>y\"\n"), "{shown}");
        assert!(shown.ends_with("  |     ^^^^^^^^^^^^"), "{shown}");
    }
}
