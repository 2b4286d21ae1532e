//! `imgbuild completions SHELL` and `imgbuild man`: generated from the clap definition, so
//! they always match the commands and flags of this binary.

use std::process::ExitCode;

use clap::{Args, CommandFactory};

use super::{
    Cli,
    printer::{CommandFailure, Printer},
};

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for
    pub shell: clap_complete::Shell,
}

pub(super) const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  imgbuild completions bash > ~/.local/share/bash-completion/completions/imgbuild
  imgbuild completions zsh > ~/.zfunc/_imgbuild     # with fpath+=(~/.zfunc)
  imgbuild completions fish > ~/.config/fish/completions/imgbuild.fish";

#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Print every command and option as Markdown: the book's command-line reference
    /// (docs/src/reference/cli.md), generated so it cannot drift
    #[arg(long)]
    pub markdown: bool,
}

pub(super) const MAN_EXAMPLES: &str = "\
Examples:
  imgbuild man > ~/.local/share/man/man1/imgbuild.1 && man imgbuild
  imgbuild man --markdown > /tmp/cli.md";

pub(super) fn run_completions(args: &CompletionsArgs) -> Result<ExitCode, CommandFailure> {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "imgbuild", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

/// The man page (roff): synopsis, global options, each subcommand with its summary, the
/// examples and the version. clap_mangen's own subcommand list names a page per subcommand
/// (`imgbuild-build(1)`) that is not generated; this one names the subcommands and points
/// to their `--help`, which has their flags and examples.
pub(super) fn run_man(args: &ManArgs, printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let page = if args.markdown {
        markdown_reference().into_bytes()
    } else {
        man_page().map_err(|err| CommandFailure::new(err, 2))?
    };
    printer
        .bytes(&page)
        .map_err(|err| CommandFailure::new(err, 2))?;
    Ok(ExitCode::SUCCESS)
}

/// Every command and option as Markdown (clap-markdown), for the book: no table of contents
/// (the book has its own) and no footer, under the book's own title.
fn markdown_reference() -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("Command-line options".to_string())
        .show_footer(false)
        .show_table_of_contents(false);
    fence_examples(&clap_markdown::help_markdown_custom::<Cli>(&options))
}

/// The `Examples:` blocks of the help texts (indented command lines) as fenced code, which
/// Markdown would otherwise join into one paragraph; elsewhere a help text's `<name>` is
/// text, not an HTML tag.
fn fence_examples(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut in_examples = false;
    for line in markdown.lines() {
        let example = line.starts_with("  ") && !line.trim().is_empty();
        if in_examples && !example {
            out.push_str("```\n");
            in_examples = false;
        }
        if in_examples {
            out.push_str(line);
        } else {
            out.push_str(&escape_outside_code(line));
        }
        out.push('\n');
        if line == "Examples:" {
            out.push_str("\n```text\n");
            in_examples = true;
        }
    }
    if in_examples {
        out.push_str("```\n");
    }
    out
}

/// `<` and `>` as entities outside a line's `code spans`.
fn escape_outside_code(line: &str) -> String {
    line.split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 0 {
                part.replace('<', "&lt;").replace('>', "&gt;")
            } else {
                part.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

fn man_page() -> std::io::Result<Vec<u8>> {
    let command = Cli::command();
    let man = clap_mangen::Man::new(command.clone());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    page.extend_from_slice(b".SH SUBCOMMANDS\n");
    for subcommand in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let about = subcommand
            .get_about()
            .map(|a| a.to_string())
            .unwrap_or_default();
        page.extend_from_slice(
            format!(
                ".TP\n\\fBimgbuild {}\\fR\n{}\n",
                roff_text(subcommand.get_name()),
                roff_text(&about)
            )
            .as_bytes(),
        );
    }
    page.extend_from_slice(
        b".PP\n\\fBimgbuild\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR shows a command's flags and examples.\n",
    );
    man.render_extra_section(&mut page)?;
    man.render_version_section(&mut page)?;
    Ok(page)
}

/// `text` as roff body text: backslashes and hyphens escaped, a leading `.` or `'` (a
/// request) made literal, one line.
fn roff_text(text: &str) -> String {
    let escaped = text
        .replace('\\', "\\\\")
        .replace('-', "\\-")
        .replace('\n', " ");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}
