//! Building the tests' Go tools (`tests/tools/*/main.go`) with Debian's Go, offline: GOPATH
//! mode over the -dev packages in `/usr/share/gocode`, no module downloads. Shared by the
//! integration tests and `examples/bench.rs` (through `#[path]`), so it uses the standard
//! library only and reports failures as text.

use std::{path::Path, process::Command};

/// Builds `tests/tools/TOOL/main.go` into `out`, with Go's build cache in `cache` (kept
/// there, a second build takes seconds).
pub(crate) fn build_tool(tool: &str, out: &Path, cache: &Path) -> Result<(), String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools")
        .join(tool)
        .join("main.go");
    let output = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(out)
        .arg(&source)
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", cache)
        .env("GOFLAGS", "")
        .output()
        .map_err(|e| format!("running go: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "go build of {tool} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
