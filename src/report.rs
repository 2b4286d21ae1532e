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
}

/// A reporter that drops everything.
pub struct Silent;
impl Reporter for Silent {}
