//! Where the command line's output goes. One [`Printer`] is made from the flags and passed
//! to every command, so the choice between status lines, JSON events and silence is made
//! here once instead of in each command. This module and the progress bars are the only
//! writers of stdout and stderr; a command that fails returns a [`CommandFailure`], which `main`
//! renders once.

use std::{fmt::Display, io::IsTerminal, process::ExitCode};

use serde_json::{Value, json};

/// How build progress is shown, as [`Printer::progress_mode`] picks it from the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProgressMode {
    /// Nothing but errors and warnings.
    Quiet,
    /// One line per stage on stderr (stderr is not a terminal).
    Plain,
    /// indicatif spinners and bars on stderr.
    Bars,
    /// JSON events on stdout.
    Json,
}

/// The output mode of one run: `--quiet`, the `--json` event stream of `build` and `lock`,
/// and whether stderr is a terminal (for progress bars).
///
/// The `--json` of `inspect`, `diff`, `verify`, `push`, `smoke` and `cache` is not this
/// mode: they print one JSON report as their result, and their status and errors stay text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    quiet: bool,
    json: bool,
    tty: bool,
}

impl Printer {
    pub(crate) fn new(quiet: bool, json: bool) -> Self {
        Printer {
            quiet,
            json,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Whether this run prints JSON events on stdout instead of status and result lines.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// How build progress is shown.
    pub(crate) fn progress_mode(&self) -> ProgressMode {
        if self.json {
            ProgressMode::Json
        } else if self.quiet {
            ProgressMode::Quiet
        } else if self.tty {
            ProgressMode::Bars
        } else {
            ProgressMode::Plain
        }
    }

    /// Whether progress bars are drawn: on a terminal, neither quiet nor JSON.
    pub(crate) fn bars(&self) -> bool {
        self.progress_mode() == ProgressMode::Bars
    }

    /// Whether status lines are printed: neither quiet nor JSON.
    pub(crate) fn shows_status(&self) -> bool {
        !self.quiet && !self.json
    }

    /// A status line on stderr, `{verb:>12} {text}` as cargo and uv align them; nothing
    /// with `--quiet` or `--json`. Its text may name strangers' files and packages, so it
    /// is shown as [`printable`].
    #[allow(clippy::print_stderr)]
    pub(crate) fn status(&self, verb: &str, text: impl Display) {
        if self.shows_status() {
            eprintln!("{verb:>12} {}", printable(&text.to_string()));
        }
    }

    /// A line on stderr that `--quiet` keeps: the outcome of a command whose result goes
    /// nowhere else (`login`).
    #[allow(clippy::print_stderr)]
    pub(crate) fn notice(&self, text: impl Display) {
        eprintln!("{text}");
    }

    /// A warning: shown even with `--quiet` (as [`printable`]: warnings quote strangers'
    /// text as errors do); a `warning` event with `--json`.
    #[allow(clippy::print_stderr)]
    pub(crate) fn warning(&self, message: &str) {
        if self.json {
            self.event(&json!({"event": "warning", "message": message}));
        } else {
            eprintln!("warning: {}", printable(message));
        }
    }

    /// One line of the result on stdout (a path, `LAYOUT:TAG@DIGEST`).
    #[allow(clippy::print_stdout)]
    pub(crate) fn result(&self, line: impl Display) {
        println!("{line}");
    }

    /// A document on stdout as it is (a recipe, an SBOM, YAML, a rendered report).
    #[allow(clippy::print_stdout)]
    pub(crate) fn document(&self, text: &str) {
        print!("{text}");
    }

    /// Bytes on stdout as they are (the man page); a failed write is returned, not a panic.
    pub(crate) fn bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        std::io::stdout().write_all(bytes)
    }

    /// One JSON event (or report) as a line on stdout.
    #[allow(clippy::print_stdout)]
    pub(crate) fn event(&self, event: &Value) {
        println!("{event}");
    }

    /// Renders a failed command, once: the `error` event with `--json`, then the error and
    /// its causes on stderr. Returns the exit code.
    #[allow(clippy::print_stderr)]
    pub(crate) fn fail(&self, failure: &CommandFailure) -> ExitCode {
        let rendered = render_error(failure.error.as_ref());
        for line in &failure.context {
            eprintln!("error: {line}");
        }
        // Every failure of a `--json` run, before the build or after it, ends the event
        // stream with its `error` event, as the --json contract (docs/src/commands/build.md) says.
        if self.json {
            self.event(&json!({
                "event": "error",
                "message": rendered.trim_start_matches("error: "),
                "exit_code": failure.code,
            }));
        }
        eprintln!("{rendered}");
        ExitCode::from(failure.code)
    }
}

/// A command that failed: the error, the exit code, and what to say before it.
#[derive(Debug)]
pub(crate) struct CommandFailure {
    error: Box<dyn std::error::Error>,
    code: u8,
    /// `error: …` lines printed before the error (which variant of a matrix failed).
    context: Vec<String>,
}

impl CommandFailure {
    pub(crate) fn new(error: impl Into<Box<dyn std::error::Error>>, code: u8) -> Self {
        CommandFailure {
            error: error.into(),
            code,
            context: Vec::new(),
        }
    }

    /// The error's own message, without its causes.
    pub(crate) fn message(&self) -> String {
        self.error.to_string()
    }

    /// The same failure, preceded by `error: {lines}`.
    pub(crate) fn after(mut self, lines: Vec<String>) -> Self {
        self.context = lines;
        self
    }
}

impl From<crate::build::BuildError> for CommandFailure {
    fn from(err: crate::build::BuildError) -> Self {
        let code = err.exit_code() as u8;
        CommandFailure::new(err, code)
    }
}

/// Renders an error and its causes the way uv does: `error: …` then `Caused by: …` lines.
pub(crate) fn render_error(err: &(dyn std::error::Error + 'static)) -> String {
    printable(&error_lines(err))
}

fn error_lines(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("error: {err}");
    let mut source = err.source();
    let mut last = err.to_string();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Some errors repeat their source in their own message; print each text once.
        if !last.contains(&text) {
            out.push_str(&format!("\n  Caused by: {text}"));
        }
        last = text;
        source = cause.source();
    }
    out
}

/// `text` with its control characters (but newline and TAB) and bidirectional controls
/// written as `<U+XXXX>`. Errors quote strangers' text (lock entries, server answers, file
/// names), which must not drive the terminal with escape sequences or reorder what it shows.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c => crate::recipe::shown(c).into_owned(),
        })
        .collect()
}

/// A digest for people: the first 12 hex digits, without `sha256:`.
pub(crate) fn short_digest(digest: &str) -> &str {
    let hex = digest.trim_start_matches("sha256:");
    // By characters: a digest read from a stranger's layout need not be ASCII.
    let end = hex.char_indices().nth(12).map_or(hex.len(), |(i, _)| i);
    &hex[..end]
}

/// A byte count for people: `512 B`, `1.5 KiB`, `2.7 GiB`.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: &[&str] = &["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_show_control_and_bidirectional_characters_as_codes() {
        let err = std::io::Error::other("a\u{1b}[2Jb\u{202e}c\rd\n  e\tf");
        assert_eq!(
            render_error(&err),
            "error: a<U+001B>[2Jb<U+202E>c<U+000D>d\n  e\tf"
        );
    }
}
