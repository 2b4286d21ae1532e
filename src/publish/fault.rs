//! Whose fault an I/O error is, for the exit codes of [`super::PublishError`] and the
//! signing errors alike.

/// 1 for a file that is missing or that the bounded readers refused (a fifo, a link, too
/// large, not what it says: the input's fault), 2 for what else the system refused
/// (permissions, I/O, a file where a directory should be). By kind: `fs_err` keeps the kind
/// but not the OS error.
pub(super) fn io_exit_code(err: &std::io::Error) -> i32 {
    use std::io::ErrorKind as Kind;
    match err.kind() {
        Kind::NotFound | Kind::Other | Kind::InvalidData | Kind::InvalidInput => 1,
        Kind::UnexpectedEof => 1,
        _ => 2,
    }
}
