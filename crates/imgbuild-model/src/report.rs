//! Progress reports: what every stage tells the caller while it works. Plain data and a
//! trait, below every stage (install, layers, build), so a stage reports without depending
//! on the stage that drives it. The library never prints; the CLI renders these.

/// Pipeline stages, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Solve,
    Install,
    Layers,
    Write,
}

impl Stage {
    /// The stage's one name, wherever it is shown: the `stage` of the `--json` events, the
    /// keys of the result's `timings` and the `Took` line.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Solve => "solve",
            Stage::Install => "install",
            Stage::Layers => "layers",
            Stage::Write => "write",
        }
    }
}

/// Receives progress; the library never prints.
pub trait Reporter: Send + Sync {
    /// A stage starts; the previous one, if any, has finished.
    fn on_stage(&self, _stage: Stage, _detail: &str) {}
    fn on_warning(&self, _message: &str) {}
    /// How many items the stage will report done: packages to install, layers to write.
    fn on_stage_total(&self, _stage: Stage, _total: usize) {}
    /// Package bytes downloaded since the last call (install stage).
    fn on_download_bytes(&self, _bytes: u64) {}
    /// One item done: a package linked (`bytes` 0) or a layer written (`bytes` compressed).
    fn on_item_done(&self, _stage: Stage, _name: &str, _bytes: u64) {}
    /// Progress within a step: archive bytes, base image blobs, PyPI pages and wheels.
    fn on_progress(&self, _progress: Progress<'_>) {}
}

/// What a step reports while a person waits on it, beside the stage events: the bytes of
/// package archives as they are checked and extracted (install), the blobs of a base image
/// as they are pulled (before the stages, while the recipe is prepared), and the PyPI
/// pages and wheels the resolution reads (solve). Counts are deltas: the receiver sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<'a> {
    /// Package archive bytes added to what the install stage will check and extract.
    PackageBytesTotal(u64),
    /// Package archive bytes checked and extracted, or found ready in the cache.
    PackageBytes(u64),
    /// A base image pull starts; its manifest names `blobs` blobs (config and layers) of
    /// `bytes` in all.
    PullStarted {
        reference: &'a str,
        platform: &'a str,
        blobs: usize,
        bytes: u64,
    },
    /// Blob bytes received.
    PullBytes(u64),
    /// One blob is in the cache: downloaded now, or found there (`downloaded` false).
    PullBlob { bytes: u64, downloaded: bool },
    /// The pull started last is done.
    PullFinished,
    /// A PyPI project's index pages are read.
    PypiProject(&'a str),
    /// The core metadata of one wheel is read without the wheel: from the index (PEP 658), or
    /// from the wheel's zip directory by range requests; `bytes` received for it.
    PypiMetadata { file: &'a str, bytes: u64 },
    /// Bytes of a wheel received while the resolution downloads it whole (for its metadata
    /// or its sha256).
    PypiBytes(u64),
    /// One wheel downloaded (or, `local`, read from a `file://` find-links directory or
    /// index) by the resolution, `bytes` long.
    PypiWheel {
        file: &'a str,
        bytes: u64,
        local: bool,
    },
}

/// A reporter that drops everything.
pub struct Silent;
impl Reporter for Silent {}

/// `items` joined by `, `, at most `max` of them, then `… and N more`: an error that lists
/// what a stranger's file holds (tags, platforms, digests) stays a line however much it
/// holds.
pub fn list_capped<S: AsRef<str>>(items: &[S], max: usize) -> String {
    let shown: Vec<&str> = items.iter().take(max).map(AsRef::as_ref).collect();
    let mut text = shown.join(", ");
    if items.len() > max {
        text.push_str(&format!(", … and {} more", thousands(items.len() - max)));
    }
    text
}

/// `199990` as `199,990`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lists_are_cut() {
        assert_eq!(list_capped(&["a", "b"], 10), "a, b");
        let many: Vec<String> = (0..200_000).map(|i| i.to_string()).collect();
        assert_eq!(list_capped(&many, 3), "0, 1, 2, … and 199,997 more");
        assert_eq!(list_capped::<&str>(&[], 3), "");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
    }
}
