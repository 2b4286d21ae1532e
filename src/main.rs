//! The `imgbuild` executable: the command line (`imgbuild::cli`), or the child process of
//! `imgbuild smoke` that loads an image's CUDA libraries, or the sandbox in which it runs an
//! image's Python (`imgbuild::smoke`).

use std::process::ExitCode;

fn main() -> ExitCode {
    end_quietly_on_closed_output();
    let mut args = std::env::args_os().skip(1).peekable();
    if args.peek().is_some_and(|a| a == imgbuild::smoke::CHILD_ARG) {
        return imgbuild::smoke::child_main(args.skip(1));
    }
    if args
        .peek()
        .is_some_and(|a| a == imgbuild::smoke::sandbox::SANDBOX_ARG)
    {
        return imgbuild::smoke::sandbox::sandbox_main(args.skip(1));
    }
    imgbuild::cli::main()
}

/// Output to a closed pipe (`imgbuild completions bash | head -1`) ends the process the way
/// it ends `cat`: killed by SIGPIPE, silently (status 141 in a shell), never a panic.
///
/// Rust ignores SIGPIPE, so a write to a closed pipe fails with `BrokenPipe`, and `println!`,
/// `eprintln!` and libraries that `expect` their writes (clap_complete) panic: exit 101 and a
/// panic message. Restoring SIGPIPE's default for the whole process would fix that, but also
/// kill imgbuild, without a word, when a child it writes to exits early (a
/// `docker-credential-*` helper that never reads its stdin), where a typed error is wanted.
/// So SIGPIPE stays ignored, and a panic hook ends the process instead when the panic is a
/// failed write and stdout or stderr is a pipe (or socket) whose reader is gone; every other
/// panic is reported as before.
fn end_quietly_on_closed_output() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload_as_str()
            .map(str::to_string)
            .unwrap_or_default();
        if is_broken_pipe(&message) && (reader_gone(1) || reader_gone(2)) {
            die_of_sigpipe();
        }
        previous(info);
    }));
}

/// Whether a panic message is about a write that failed with EPIPE: std's `failed printing
/// to stdout: Broken pipe (os error 32)`, or an `io::Error` `expect`ed by a library (its
/// `Display` or its `Debug`, `Os { code: 32, kind: BrokenPipe, … }`).
fn is_broken_pipe(message: &str) -> bool {
    message.contains(&format!("(os error {})", libc::EPIPE)) || message.contains("kind: BrokenPipe")
}

/// Whether `fd` is a pipe or socket with no reader left: `poll` says POLLERR (a pipe whose
/// read end is closed) or POLLHUP (a socket whose peer shut down).
fn reader_gone(fd: libc::c_int) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Dies of SIGPIPE, as a process that never ignored it would have at the failed write.
fn die_of_sigpipe() -> ! {
    // SAFETY: restores the default action of one signal and raises it in this thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // The signal is delivered before `raise` returns; this is only in case it was blocked.
    std::process::exit(128 + libc::SIGPIPE)
}
