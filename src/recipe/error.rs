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
    pub fn line_column(&self) -> (usize, usize) {
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
            RecipeError::Read { .. } => self.to_string(),
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
        span.text[start..end]
            .lines()
            .next()
            .map_or(1, |s| s.chars().count().max(1))
    };
    let gutter = line.to_string().len();
    let pad = " ".repeat(gutter);
    let lead: String = source_line
        .chars()
        .take(column - 1)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
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
}
