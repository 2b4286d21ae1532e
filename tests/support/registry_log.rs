//! Reading what Debian's `docker-registry` (distribution 2.8) says it sent: each response is
//! logged as `response completed` with its status and the bytes written. The partial-pull
//! test and `just bench` count a node's pull from it.

/// The bytes sent in the responses of `log` whose line holds `needle` (a blob digest, or
/// `/blobs/sha256:` for every blob), and how many of them were 206 (ranges).
pub(crate) fn bytes_sent(log: &str, needle: &str) -> (u64, usize) {
    let (mut bytes, mut ranges) = (0, 0);
    for line in log.lines() {
        if !(line.contains("response completed") && line.contains(needle)) {
            continue;
        }
        let field = |name: &str| {
            line.split(&format!("{name}="))
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.trim_matches('"').parse::<u64>().ok())
        };
        bytes += field("http.response.written").unwrap_or(0);
        if field("http.response.status") == Some(206) {
            ranges += 1;
        }
    }
    (bytes, ranges)
}
