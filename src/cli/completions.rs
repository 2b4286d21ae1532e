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

pub(super) const MAN_EXAMPLES: &str = "\
Examples:
  imgbuild man > ~/.local/share/man/man1/imgbuild.1 && man imgbuild";

pub(super) fn run_completions(args: &CompletionsArgs) -> Result<ExitCode, CommandFailure> {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "imgbuild", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

/// The man page (roff): synopsis, global options, each subcommand with its summary, the
/// examples and the version. clap_mangen's own subcommand list names a page per subcommand
/// (`imgbuild-build(1)`) that is not generated; this one names the subcommands and points
/// to their `--help`, which has their flags and examples.
pub(super) fn run_man(printer: &Printer) -> Result<ExitCode, CommandFailure> {
    let page = man_page().map_err(|err| CommandFailure::new(err, 2))?;
    printer
        .bytes(&page)
        .map_err(|err| CommandFailure::new(err, 2))?;
    Ok(ExitCode::SUCCESS)
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
