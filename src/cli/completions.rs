//! `imgbuild completions SHELL` and `imgbuild man`: generated from the clap definition, so
//! they always match the commands and flags of this binary.

use std::process::ExitCode;

use clap::{Args, CommandFactory};

use super::{Cli, fail};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
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

pub(super) fn run_completions(args: &CompletionsArgs) -> ExitCode {
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "imgbuild", &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// The man page (roff): synopsis, global options, each subcommand with its summary, the
/// examples and the version.
pub(super) fn run_man() -> ExitCode {
    let mut page = Vec::new();
    if let Err(err) = clap_mangen::Man::new(Cli::command()).render(&mut page) {
        return fail(&err, 2);
    }
    use std::io::Write;
    if let Err(err) = std::io::stdout().write_all(&page) {
        return fail(&err, 2);
    }
    ExitCode::SUCCESS
}
