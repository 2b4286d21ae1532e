//! The `imgbuild` executable: the command line (`imgbuild::cli`), or the child process of
//! `imgbuild smoke` that loads an image's CUDA libraries (`imgbuild::smoke`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1).peekable();
    if args.peek().is_some_and(|a| a == imgbuild::smoke::CHILD_ARG) {
        return imgbuild::smoke::child_main(args.skip(1));
    }
    imgbuild::cli::main()
}
