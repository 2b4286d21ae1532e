//! Support for tests of the `[pypi]` recipe section: real wheels pinned on PyPI, a local
//! package index speaking the simple repository API, a minimal sdist, and conda packages for
//! the conda side of a mixed environment (a `python` to install wheels into, and a package
//! that already provides a PyPI distribution).
//!
//! The index serves PEP 503 HTML and PEP 691 JSON, and PEP 658/714 metadata files, so a client
//! can be tested against each way an index may offer a wheel's metadata, including none (it
//! must then read `METADATA` from the wheel itself).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Cursor, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::base::{OLD_GLIBC_SUITE, debian_base_layout, debian_rootfs_tar};
pub(crate) use super::channel::PinnedWheel;
// NVIDIA's wheels, pinned in `channel.rs` for the CUDA packages, are PyPI wheels too: named
// here so PyPI tests find every pinned wheel in one place.
#[allow(unused_imports)]
pub(crate) use super::channel::{CUDA_RUNTIME_11_8, NVRTC_11_8};
use super::channel::{
    Entry, TIMESTAMP_MS, executable, fetch_wheel, file, index_channel, link, linux64_index,
    sha256_hex, write_package,
};
use super::{kept_channel_dir, test_cache_dir};

// ---------------------------------------------------------------------------------------------
// Pinned wheels

/// `six` 1.16.0, pure Python; `python-dateutil` needs it.
pub(crate) const SIX_1_16_0: PinnedWheel = PinnedWheel {
    file_name: "six-1.16.0-py2.py3-none-any.whl",
    url: "https://files.pythonhosted.org/packages/d9/5a/\
e7c31adbe875f2abbb91bd84cf2dc52d792b5a01506781dbcf25c91daf11/six-1.16.0-py2.py3-none-any.whl",
    sha256: "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254",
};

/// `python-dateutil` 2.9.0.post0, pure Python, `Requires-Dist: six >=1.5`: a dependency to
/// resolve, and a version with a post-release segment.
pub(crate) const DATEUTIL_2_9_0_POST0: PinnedWheel = PinnedWheel {
    file_name: "python_dateutil-2.9.0.post0-py2.py3-none-any.whl",
    url: "https://files.pythonhosted.org/packages/ec/57/\
56b9bcc3c9c6a792fcbaf139543cee77261f3651ca9da0c93f5c1221264b/\
python_dateutil-2.9.0.post0-py2.py3-none-any.whl",
    sha256: "a8b2bc7bffae282281c8140a97d3aa9c14da0b136dfe83f850eea9a5f7470427",
};

/// `pyflakes` 3.4.0, pure Python with a `console_scripts` entry point `pyflakes =
/// pyflakes.api:main`. The newest release whose `Requires-Python` (`>=3.9`) admits the 3.9 of
/// [`write_venv_python_package`]; 4.x needs 3.10 or later.
pub(crate) const PYFLAKES_3_4_0: PinnedWheel = PinnedWheel {
    file_name: "pyflakes-3.4.0-py2.py3-none-any.whl",
    url: "https://files.pythonhosted.org/packages/c2/2f/\
81d580a0fb83baeb066698975cb14a618bdbed7720678566f1b046a95fe8/pyflakes-3.4.0-py2.py3-none-any.whl",
    sha256: "f742a7dbd0d9cb9ea41e9a24a918996e8170c799fa528688d40dd582c8265f4f",
};

/// MarkupSafe 2.1.5 for CPython 3.9 on x86-64 glibc 2.17+: a platform wheel with a compiled
/// extension (`markupsafe/_speedups.cpython-39-x86_64-linux-gnu.so`). The cp311 builds in
/// `channel.rs` do not fit a 3.9 interpreter.
pub(crate) const MARKUPSAFE_CP39_X86_64: PinnedWheel = PinnedWheel {
    file_name: "MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/5f/5a/\
360da85076688755ea0cceb92472923086993e86b5613bbae9fbc14136b0/\
MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256: "17b950fccb810b3293638215058e432159d2b71005c74371d784862b7e4683f3",
};

/// The same release for CPython 3.9 on aarch64.
pub(crate) const MARKUPSAFE_CP39_AARCH64: PinnedWheel = PinnedWheel {
    file_name: "MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    url: "https://files.pythonhosted.org/packages/d9/a7/\
1e558b4f78454c8a3a0199292d96159eb4d091f983bc35ef258314fe7269/\
MarkupSafe-2.1.5-cp39-cp39-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    sha256: "3e53af139f8579a6d5f7b76549125f0d94d7e630761a2111bc431fd820e163b8",
};

/// PyTorch 1.12.1 for CPython 3.9, PyPI's default build: CUDA 10.2 (`torch.version.cuda`),
/// its cudart, cuBLAS and NVRTC bundled in `torch/lib`; 776 MB. `Requires-Dist:
/// typing-extensions`. Its `RECORD` gives `torch-1.12.1.dist-info/METADATA` 22814 bytes and
/// a sha256 that the 22808 bytes it holds do not have (every other row is right): pip
/// installs it without checking, imgbuild refuses it (see [`wheel_with_record_fixed`]).
pub(crate) const TORCH_1_12_1_CP39: PinnedWheel = PinnedWheel {
    file_name: "torch-1.12.1-cp39-cp39-manylinux1_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/1e/2f/\
06d30fbc76707f14641fe737f0715f601243e039d676be487d0340559c86/\
torch-1.12.1-cp39-cp39-manylinux1_x86_64.whl",
    sha256: "9b356aea223772cd754edb4d9ecf2a025909b8615a7668ac7d5130f86e7ec421",
};

/// `typing_extensions` 4.12.2, pure Python: what [`TORCH_1_12_1_CP39`] needs.
pub(crate) const TYPING_EXTENSIONS_4_12_2: PinnedWheel = PinnedWheel {
    file_name: "typing_extensions-4.12.2-py3-none-any.whl",
    url: "https://files.pythonhosted.org/packages/26/9f/\
ad63fc0248c5379346306f8668cda6e2e2e9c95e01216d2b8ffd9ff037d0/\
typing_extensions-4.12.2-py3-none-any.whl",
    sha256: "04e5ca0351e0f3f85c6853954072df659d0d13fac324d0072316b67d7794700d",
};

/// Each of `wheels` (fetched into the test cache, see [`fetch_wheel`]) with its project, the
/// pairs an index is built from: `SimpleIndex::serve(&pinned_dists(&[SIX_1_16_0])?)`.
pub(crate) fn pinned_dists(wheels: &[PinnedWheel]) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let cache = test_cache_dir();
    wheels
        .iter()
        .map(|wheel| {
            let path = fetch_wheel(&cache, wheel)?;
            let project = wheel_project(wheel.file_name)?;
            Ok((path, project))
        })
        .collect()
}

/// The project of a wheel file name: its first field, whose `_` stand for any of `-_.`
/// (normalized names compare equal either way).
fn wheel_project(file_name: &str) -> anyhow::Result<String> {
    let stem = file_name
        .strip_suffix(".whl")
        .with_context(|| format!("{file_name} is not a wheel"))?;
    let name = stem.split('-').next().unwrap_or_default();
    ensure!(!name.is_empty(), "{file_name} names no project");
    Ok(name.replace('_', "-"))
}

/// A copy of `wheel` (fetched, see [`fetch_wheel`]) whose `RECORD` row for `member` is
/// corrected to the member's real sha256 and size, every other member copied raw (not
/// recompressed); kept in the test cache under `record-fixed/`, with the wheel's file name.
/// For a real wheel whose `RECORD` is wrong about one file (see [`TORCH_1_12_1_CP39`]), which
/// imgbuild's installer refuses as it refuses any file its `RECORD` does not vouch for.
pub(crate) fn wheel_with_record_fixed(
    wheel: &PinnedWheel,
    member: &str,
) -> anyhow::Result<PathBuf> {
    let cache = test_cache_dir();
    let original = fetch_wheel(&cache, wheel)?;
    let dir = cache.join("record-fixed");
    let out = dir.join(wheel.file_name);
    if out.is_file() {
        return Ok(out);
    }
    fs_err::create_dir_all(&dir)?;
    let mut archive = zip::ZipArchive::new(BufReader::new(fs_err::File::open(&original)?))?;
    let record_name = archive
        .file_names()
        .filter_map(Result::ok)
        .find(|n| n.ends_with(".dist-info/RECORD"))
        .map(|n| n.into_owned())
        .with_context(|| format!("{} has no RECORD", wheel.file_name))?;
    let mut bytes = Vec::new();
    archive.by_name(member)?.read_to_end(&mut bytes)?;
    let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(&bytes));
    let mut record = String::new();
    archive.by_name(&record_name)?.read_to_string(&mut record)?;
    let row = format!("{member},");
    ensure!(
        record.lines().any(|line| line.starts_with(&row)),
        "the RECORD of {} has no row for {member}",
        wheel.file_name
    );
    let fixed: String = record
        .lines()
        .map(|line| match line.starts_with(&row) {
            true => format!("{member},sha256={hash},{}\n", bytes.len()),
            false => format!("{line}\n"),
        })
        .collect();
    let mut writer = zip::ZipWriter::new(
        tempfile::Builder::new()
            .prefix(".record-fixed-")
            .tempfile_in(&dir)?,
    );
    for i in 0..archive.len() {
        let file = archive.by_index_raw(i)?;
        if file.name()? == record_name {
            drop(file);
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            writer.start_file(record_name.as_str(), options)?;
            writer.write_all(fixed.as_bytes())?;
        } else {
            writer.raw_copy_file(file)?;
        }
    }
    writer.finish()?.persist(&out)?;
    Ok(out)
}

/// PEP 503 normalization: runs of `-`, `_` and `.` become one `-`, lowercase.
pub(crate) fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('-');
            }
            in_run = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_run = false;
        }
    }
    out
}

/// The name as wheels and sdists spell it in file and `.dist-info` names (PEP 427, PEP 625):
/// normalized, with `_` for `-`.
pub(crate) fn file_name_form(name: &str) -> String {
    normalize(name).replace('-', "_")
}

// ---------------------------------------------------------------------------------------------
// The index

/// One distribution file the index serves.
struct Dist {
    file_name: String,
    /// Normalized.
    project: String,
    /// As the caller spelled it, for the project list.
    display_name: String,
    version: String,
    sha256: String,
    bytes: Vec<u8>,
    requires_python: Option<String>,
    /// A wheel's `*.dist-info/METADATA`; sdists have none here.
    metadata: Option<Vec<u8>>,
}

impl Dist {
    fn read(path: &Path, project: &str) -> anyhow::Result<Dist> {
        let file_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{} has no UTF-8 file name", path.display()))?
            .to_string();
        let bytes = fs_err::read(path)?;
        let (version, core) = if let Some(stem) = file_name.strip_suffix(".whl") {
            let version = stem
                .split('-')
                .nth(1)
                .context("a wheel name has a version")?;
            (
                version.to_string(),
                Some(wheel_metadata(&bytes, &file_name)?),
            )
        } else if let Some(stem) = file_name.strip_suffix(".tar.gz") {
            let (_, version) = stem
                .rsplit_once('-')
                .with_context(|| format!("{file_name}: not name-version.tar.gz"))?;
            (version.to_string(), None)
        } else {
            bail!("{file_name}: only wheels and .tar.gz sdists are served");
        };
        let requires_python = match &core {
            Some(metadata) => header_field(metadata, "Requires-Python"),
            None => header_field(&sdist_pkg_info(&bytes, &file_name)?, "Requires-Python"),
        };
        Ok(Dist {
            sha256: sha256_hex(&bytes),
            file_name,
            project: normalize(project),
            display_name: project.to_string(),
            version,
            bytes,
            requires_python,
            metadata: core,
        })
    }
}

/// The `METADATA` of the wheel's own top-level `.dist-info` directory.
fn wheel_metadata(wheel: &[u8], file_name: &str) -> anyhow::Result<Vec<u8>> {
    let mut zip =
        zip::ZipArchive::new(Cursor::new(wheel)).with_context(|| format!("opening {file_name}"))?;
    let mut member = None;
    for name in zip.file_names() {
        let name = name?;
        let top_level_metadata = name
            .strip_suffix("/METADATA")
            .is_some_and(|dir| dir.ends_with(".dist-info") && !dir.contains('/'));
        if top_level_metadata {
            member = Some(name.into_owned());
            break;
        }
    }
    let member = member.with_context(|| format!("{file_name} has no .dist-info/METADATA"))?;
    let mut bytes = Vec::new();
    zip.by_name(&member)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The top-level `PKG-INFO` of a `.tar.gz` sdist.
fn sdist_pkg_info(sdist: &[u8], file_name: &str) -> anyhow::Result<Vec<u8>> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(sdist));
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path.components().count() == 2 && path.ends_with("PKG-INFO") {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            return Ok(bytes);
        }
    }
    bail!("{file_name} has no top-level PKG-INFO")
}

/// The value of `field` in the header of a core metadata file (RFC 822 style, up to the first
/// blank line), if present.
fn header_field(metadata: &[u8], field: &str) -> Option<String> {
    String::from_utf8_lossy(metadata)
        .lines()
        .take_while(|line| !line.is_empty())
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case(field)
                .then(|| value.trim().to_string())
        })
}

fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// The media type of PEP 691 JSON responses.
pub(crate) const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// One request as the index saw and answered it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    /// Percent-decoded, without the query string.
    pub path: String,
    pub accept: Option<String>,
    pub status: u16,
    pub content_type: Option<String>,
}

/// What [`SimpleIndex::get`] received.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub status: u16,
    /// Names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).context("the body is not JSON")
    }
}

struct State {
    /// By normalized project, files in the order given.
    projects: BTreeMap<String, Vec<Dist>>,
    metadata: bool,
    json: bool,
    base: String,
    log: Mutex<Vec<Request>>,
}

/// A package index on 127.0.0.1 that serves a fixed set of distribution files through the
/// simple repository API:
///
/// - `/simple/` lists the projects; `/simple/<normalized-name>/` lists a project's files,
///   as PEP 503 HTML, or as PEP 691 JSON when `Accept` names [`SIMPLE_JSON`] (q-values are
///   not weighed) and JSON is on. A name that is not normalized is redirected (301) to the
///   normalized one, as PyPI does; both forms are served with and without the trailing `/`.
/// - `/files/<file name>` is the file; `/files/<file name>.metadata` a wheel's `METADATA`
///   (PEP 658), advertised as `data-core-metadata` and `data-dist-info-metadata` (PEP 714) in
///   HTML and `core-metadata`, `dist-info-metadata` in JSON, when metadata is on.
///
/// HTML links are relative (`../../files/…`), JSON URLs absolute: clients meet both in the
/// wild. Every request is logged, answered or not, before it is answered, so counting
/// right after a client exits sees all of its requests. Stops when dropped.
pub(crate) struct SimpleIndex {
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Options for a [`SimpleIndex`]; from [`SimpleIndex::builder`].
pub(crate) struct SimpleIndexBuilder {
    dists: Vec<(PathBuf, String)>,
    metadata: bool,
    json: bool,
}

impl SimpleIndexBuilder {
    /// Serves the file at `path` (a wheel or a `.tar.gz` sdist) as a file of `project`.
    pub(crate) fn dist(mut self, path: impl Into<PathBuf>, project: &str) -> Self {
        self.dists.push((path.into(), project.to_string()));
        self
    }

    /// Serves every `(path, project)` of `dists`.
    pub(crate) fn dists(mut self, dists: &[(PathBuf, String)]) -> Self {
        self.dists.extend(dists.iter().cloned());
        self
    }

    /// Whether wheels' metadata is served and advertised (PEP 658/714); on by default. Off,
    /// a client must take `METADATA` from the wheel itself.
    pub(crate) fn metadata(mut self, on: bool) -> Self {
        self.metadata = on;
        self
    }

    /// Whether PEP 691 JSON is offered; on by default. Off, every answer is HTML whatever
    /// the client accepts, as from an index that predates PEP 691.
    pub(crate) fn json(mut self, on: bool) -> Self {
        self.json = on;
        self
    }

    pub(crate) fn serve(self) -> anyhow::Result<SimpleIndex> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let base = format!("http://{}", listener.local_addr()?);
        listener.set_nonblocking(true)?;
        let mut projects: BTreeMap<String, Vec<Dist>> = BTreeMap::new();
        for (path, project) in &self.dists {
            let dist =
                Dist::read(path, project).with_context(|| format!("serving {}", path.display()))?;
            let files = projects.entry(dist.project.clone()).or_default();
            ensure!(
                files.iter().all(|d| d.file_name != dist.file_name),
                "{} is given twice",
                dist.file_name
            );
            files.push(dist);
        }
        let file_names: Vec<&str> = projects
            .values()
            .flatten()
            .map(|d| d.file_name.as_str())
            .collect();
        for (i, name) in file_names.iter().enumerate() {
            ensure!(
                !file_names[..i].contains(name),
                "{name} is served for two projects: /files/ holds one file per name"
            );
        }
        let state = Arc::new(State {
            projects,
            metadata: self.metadata,
            json: self.json,
            base,
            log: Mutex::new(Vec::new()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                // Bounded: the server lives at most as long as the test that made it.
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let state = state.clone();
                            std::thread::spawn(move || {
                                let _ = handle(stream, &state);
                            });
                        }
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    }
                }
            })
        };
        Ok(SimpleIndex {
            state,
            stop,
            thread: Some(thread),
        })
    }
}

impl SimpleIndex {
    /// An index with metadata and JSON on, serving `(path, project)` pairs.
    pub(crate) fn serve(dists: &[(PathBuf, String)]) -> anyhow::Result<SimpleIndex> {
        SimpleIndex::builder().dists(dists).serve()
    }

    pub(crate) fn builder() -> SimpleIndexBuilder {
        SimpleIndexBuilder {
            dists: Vec::new(),
            metadata: true,
            json: true,
        }
    }

    /// The index URL, `http://127.0.0.1:PORT/simple`, for `--index-url` (with or without a
    /// trailing `/`, both work).
    pub(crate) fn url(&self) -> String {
        format!("{}/simple", self.state.base)
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn base_url(&self) -> &str {
        &self.state.base
    }

    /// Where `file_name` is served.
    pub(crate) fn file_url(&self, file_name: &str) -> String {
        format!("{}/files/{file_name}", self.state.base)
    }

    /// How many requests had a path starting with `path_prefix` (e.g. `/files/six-`, or
    /// `/simple/six/`).
    pub(crate) fn requests(&self, path_prefix: &str) -> usize {
        self.log()
            .iter()
            .filter(|r| r.path.starts_with(path_prefix))
            .count()
    }

    /// How many times `file_name` itself was fetched with GET (its `.metadata` not counted).
    pub(crate) fn downloads(&self, file_name: &str) -> usize {
        let path = format!("/files/{file_name}");
        self.log()
            .iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .count()
    }

    /// Every request so far, in the order they arrived.
    pub(crate) fn log(&self) -> Vec<Request> {
        self.state.log.lock().unwrap().clone()
    }

    /// GETs `path` (e.g. `/simple/six/`) from the index with `accept` as the `Accept` header:
    /// a minimal client for checking the bodies themselves. It is logged like any request.
    pub(crate) fn get(&self, path: &str, accept: Option<&str>) -> anyhow::Result<Response> {
        let host = self.state.base.trim_start_matches("http://");
        let mut stream = TcpStream::connect(host)?;
        stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
        let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\n{accept}Connection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("no end of headers")?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .context("no status line")?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Response {
            status,
            headers,
            body: raw[split + 4..].to_vec(),
        })
    }
}

impl Drop for SimpleIndex {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An answer before it is written: status, extra headers, content type and body.
struct Answer {
    status: u16,
    content_type: Option<&'static str>,
    location: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Answer {
        Answer {
            status: 200,
            content_type: Some(content_type),
            location: None,
            body: body.into(),
        }
    }

    fn status(status: u16) -> Answer {
        Answer {
            status,
            content_type: None,
            location: None,
            body: Vec::new(),
        }
    }
}

fn handle(stream: TcpStream, state: &State) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let mut accept = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.trim().eq_ignore_ascii_case("accept")
        {
            accept = Some(value.trim().to_string());
        }
    }
    let mut parts = request.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = percent_decode(
        parts
            .next()
            .unwrap_or("/")
            .split(['?', '#'])
            .next()
            .unwrap_or("/"),
    );
    let answer = if method == "GET" || method == "HEAD" {
        route(state, &path, accept.as_deref())
    } else {
        Answer::status(405)
    };
    state.log.lock().unwrap().push(Request {
        method: method.clone(),
        path,
        accept,
        status: answer.status,
        content_type: answer.content_type.map(str::to_string),
    });

    let reason = match answer.status {
        200 => "OK",
        301 => "Moved Permanently",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "",
    };
    let mut out = stream;
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Length: {}\r\nVary: Accept\r\nConnection: close\r\n",
        answer.status,
        answer.body.len()
    );
    if let Some(content_type) = answer.content_type {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if let Some(location) = &answer.location {
        head.push_str(&format!("Location: {location}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    if method != "HEAD" {
        out.write_all(&answer.body)?;
    }
    out.flush()
}

/// `%XX` escapes decoded: pip asks for `torch-2.0.0%2Bcpu-….whl` when the link says `+`.
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn route(state: &State, path: &str, accept: Option<&str>) -> Answer {
    let json = state.json
        && accept.is_some_and(|a| {
            a.contains(SIMPLE_JSON) || a.contains("application/vnd.pypi.simple.latest+json")
        });
    if path == "/simple" || path == "/simple/" {
        return if json {
            Answer::ok(SIMPLE_JSON, root_json(state))
        } else {
            Answer::ok("text/html; charset=utf-8", root_html(state))
        };
    }
    if let Some(rest) = path.strip_prefix("/simple/") {
        let name = rest.strip_suffix('/').unwrap_or(rest);
        if name.is_empty() || name.contains('/') {
            return Answer::status(404);
        }
        let normalized = normalize(name);
        let Some(files) = state.projects.get(&normalized) else {
            return Answer::status(404);
        };
        if normalized != name {
            return Answer {
                location: Some(format!("/simple/{normalized}/")),
                ..Answer::status(301)
            };
        }
        return if json {
            Answer::ok(SIMPLE_JSON, project_json(state, &normalized, files))
        } else {
            Answer::ok(
                "text/html; charset=utf-8",
                project_html(state, &normalized, files),
            )
        };
    }
    if let Some(name) = path.strip_prefix("/files/") {
        let all = || state.projects.values().flatten();
        if let Some(dist) = all().find(|d| d.file_name == name) {
            return Answer::ok("application/octet-stream", dist.bytes.clone());
        }
        if let Some(stem) = name.strip_suffix(".metadata")
            && state.metadata
            && let Some(metadata) = all()
                .find(|d| d.file_name == stem)
                .and_then(|d| d.metadata.as_ref())
        {
            return Answer::ok("application/octet-stream", metadata.clone());
        }
    }
    Answer::status(404)
}

fn root_html(state: &State) -> String {
    let mut html = String::from(
        "<!DOCTYPE html>\n<html>\n<head>\n<meta name=\"pypi:repository-version\" \
         content=\"1.1\">\n<title>Simple index</title>\n</head>\n<body>\n",
    );
    for (normalized, files) in &state.projects {
        html.push_str(&format!(
            "<a href=\"/simple/{normalized}/\">{}</a><br/>\n",
            escape_html(&files[0].display_name)
        ));
    }
    html.push_str("</body>\n</html>\n");
    html
}

fn root_json(state: &State) -> String {
    let projects: Vec<_> = state
        .projects
        .values()
        .map(|files| serde_json::json!({ "name": files[0].display_name }))
        .collect();
    serde_json::json!({ "meta": { "api-version": "1.1" }, "projects": projects }).to_string()
}

/// The core metadata's hash as PEP 658 writes it, when it is served.
fn metadata_sha256(state: &State, dist: &Dist) -> Option<String> {
    dist.metadata
        .as_ref()
        .filter(|_| state.metadata)
        .map(|m| sha256_hex(m))
}

fn project_html(state: &State, normalized: &str, files: &[Dist]) -> String {
    let mut html = format!(
        "<!DOCTYPE html>\n<html>\n<head>\n<meta name=\"pypi:repository-version\" \
         content=\"1.1\">\n<title>Links for {normalized}</title>\n</head>\n<body>\n\
         <h1>Links for {normalized}</h1>\n"
    );
    for dist in files {
        let mut attributes = String::new();
        if let Some(requires) = &dist.requires_python {
            attributes.push_str(&format!(
                " data-requires-python=\"{}\"",
                escape_html(requires)
            ));
        }
        if let Some(sha) = metadata_sha256(state, dist) {
            attributes.push_str(&format!(
                " data-dist-info-metadata=\"sha256={sha}\" data-core-metadata=\"sha256={sha}\""
            ));
        }
        html.push_str(&format!(
            "<a href=\"../../files/{name}#sha256={sha}\"{attributes}>{name}</a><br/>\n",
            name = escape_html(&dist.file_name),
            sha = dist.sha256,
        ));
    }
    html.push_str("</body>\n</html>\n");
    html
}

fn project_json(state: &State, normalized: &str, files: &[Dist]) -> String {
    let mut versions: Vec<&str> = Vec::new();
    let entries: Vec<_> = files
        .iter()
        .map(|dist| {
            if !versions.contains(&dist.version.as_str()) {
                versions.push(&dist.version);
            }
            let metadata = match metadata_sha256(state, dist) {
                Some(sha) => serde_json::json!({ "sha256": sha }),
                None => serde_json::Value::Bool(false),
            };
            serde_json::json!({
                "filename": dist.file_name,
                "url": format!("{}/files/{}", state.base, dist.file_name),
                "hashes": { "sha256": dist.sha256 },
                "requires-python": dist.requires_python,
                "core-metadata": metadata,
                "dist-info-metadata": metadata,
                "size": dist.bytes.len(),
                "yanked": false,
            })
        })
        .collect();
    serde_json::json!({
        "meta": { "api-version": "1.1" },
        "name": normalized,
        "versions": versions,
        "files": entries,
    })
    .to_string()
}

// ---------------------------------------------------------------------------------------------
// An sdist

/// The module of the build backend inside every sdist of [`write_sdist`].
pub(crate) const SDIST_BACKEND: &str = "imgbuild_test_backend";

/// A PEP 517 backend in the sdist itself: it builds a `py3-none-any` wheel of the module with
/// `PKG-INFO` as its `METADATA`, and the sdist again, with nothing but the standard library.
const SDIST_BACKEND_SOURCE: &str = r#"# A PEP 517 build backend that needs nothing outside the standard library.
import base64
import hashlib
import os
import tarfile
import zipfile

DIST = "@DIST@"
VERSION = "@VERSION@"
MODULE = "@MODULE@"
DIST_INFO = DIST + "-" + VERSION + ".dist-info"
WHEEL = "Wheel-Version: 1.0\nGenerator: imgbuild-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
SOURCES = ["PKG-INFO", "pyproject.toml", os.path.basename(__file__), MODULE]


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _dist_info():
    return [
        (DIST_INFO + "/METADATA", _read("PKG-INFO")),
        (DIST_INFO + "/WHEEL", WHEEL.encode()),
    ]


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    for path, data in _dist_info():
        target = os.path.join(metadata_directory, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
    return DIST_INFO


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = [(MODULE, _read(MODULE))] + _dist_info()
    record = ""
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record += "%s,sha256=%s,%d\n" % (path, digest.decode(), len(data))
    record += DIST_INFO + "/RECORD,,\n"
    name = DIST + "-" + VERSION + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, data in files:
            wheel.writestr(path, data)
        wheel.writestr(DIST_INFO + "/RECORD", record)
    return name


def build_sdist(sdist_directory, config_settings=None):
    name = DIST + "-" + VERSION
    with tarfile.open(os.path.join(sdist_directory, name + ".tar.gz"), "w:gz") as sdist:
        for path in SOURCES:
            sdist.add(path, arcname=name + "/" + path)
    return name + ".tar.gz"
"#;

/// Writes a minimal but real sdist of `name` `version` into `dir` and returns its path,
/// `<name>-<version>.tar.gz` with the name in its file-name form (PEP 625, e.g.
/// `sdist_only-1.0.tar.gz`): `PKG-INFO` (Metadata-Version 2.1, `Requires-Python: >=3.7`), a
/// `pyproject.toml`, one module named after the project, and the in-tree PEP 517 backend
/// that `pyproject.toml` names ([`SDIST_BACKEND`]). No wheel is made: an index serving only
/// this has an "sdist-only" project. Same bytes every time.
///
/// The backend needs no build requirements, so any frontend (pip, uv, build) can build a wheel
/// from it with no index at all: a setuptools build would need setuptools and wheel from
/// the index under test, or a machine that happens to have them.
pub(crate) fn write_sdist(dir: &Path, name: &str, version: &str) -> anyhow::Result<PathBuf> {
    let stem = format!("{}-{version}", file_name_form(name));
    let module = file_name_form(name);
    let pkg_info = format!(
        "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\
         Summary: An sdist-only project for imgbuild's tests\nRequires-Python: >=3.7\n\n"
    );
    let pyproject = format!(
        "[build-system]\nrequires = []\nbuild-backend = \"{SDIST_BACKEND}\"\n\
         backend-path = [\".\"]\n\n\
         [project]\nname = \"{name}\"\nversion = \"{version}\"\n\
         description = \"An sdist-only project for imgbuild's tests\"\nrequires-python = \">=3.7\"\n"
    );
    let source = format!("__version__ = \"{version}\"\n");
    let backend = SDIST_BACKEND_SOURCE
        .replace("@DIST@", &module)
        .replace("@VERSION@", version)
        .replace("@MODULE@", &format!("{module}.py"));
    let files = [
        ("PKG-INFO".to_string(), pkg_info),
        ("pyproject.toml".to_string(), pyproject),
        (format!("{SDIST_BACKEND}.py"), backend),
        (format!("{module}.py"), source),
    ];

    fs_err::create_dir_all(dir)?;
    let out = dir.join(format!("{stem}.tar.gz"));
    let mtime = TIMESTAMP_MS / 1000;
    // A fixed gzip header time and tar headers of our own: the same sdist, byte for byte,
    // on every run.
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(fs_err::File::create(&out)?, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_mtime(mtime);
    header.set_size(0);
    tar.append_data(&mut header, format!("{stem}/"), std::io::empty())?;
    for (path, text) in files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_size(text.len() as u64);
        tar.append_data(&mut header, format!("{stem}/{path}"), text.as_bytes())?;
    }
    tar.into_inner()?.finish()?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Conda packages for the conda side

/// The Debian packages of [`bullseye_python_base`]: `python3.9` pulls in
/// `python3.9-minimal`, `libpython3.9-stdlib` and the libraries they link.
pub(crate) const BULLSEYE_PYTHON_PACKAGES: &[&str] = &["python3.9"];

/// The version of bullseye's `python3.9` (Debian 3.9.2-1), and so of the venv package.
pub(crate) const VENV_PYTHON_VERSION: &str = "3.9.2";

/// An OCI image layout at `dir` (tag `latest`) of Debian bullseye with its `python3.9`, the
/// base for images whose `python` is [`write_venv_python_package`].
pub(crate) fn bullseye_python_base(dir: &Path, cache_dir: &Path) -> anyhow::Result<()> {
    debian_base_layout(dir, cache_dir, OLD_GLIBC_SUITE, BULLSEYE_PYTHON_PACKAGES)
}

/// Writes `python-3.9.2-h0_0.conda` (linux-64, depends `__glibc >=2.17`) into `linux64`: a
/// Python virtual environment over the base image's `/usr/bin/python3.9`, so the conda prefix
/// is where wheels go and no CPython need be packaged for conda. It holds `pyvenv.cfg`
/// (`home = /usr/bin`), `bin/python3.9` (a copy of bullseye's interpreter: Python finds
/// `pyvenv.cfg` next to, or one directory above, the executable it was started as, so the
/// file must live in the prefix), `bin/python` and `bin/python3` linking to it, and
/// `lib/python3.9/site-packages/`.
///
/// A venv, because Debian's `site.py` adds `<prefix>/lib/python3.9/site-packages` only when
/// `sys.prefix` differs from `sys.base_prefix`; a plain copy would see only
/// `/usr/lib/python3/dist-packages`. Run only on a base holding bullseye's `python3.9` (see
/// [`bullseye_python_base`]); the interpreter is taken from the same cached rootfs tar.
pub(crate) fn write_venv_python_package(
    linux64: &Path,
    cache_dir: &Path,
) -> anyhow::Result<PathBuf> {
    let rootfs_tar = debian_rootfs_tar(cache_dir, OLD_GLIBC_SUITE, BULLSEYE_PYTHON_PACKAGES)?;
    let python = tar_member(&rootfs_tar, "usr/bin/python3.9")?;
    ensure!(
        python.starts_with(b"\x7fELF"),
        "usr/bin/python3.9 in {} is not an ELF file",
        rootfs_tar.display()
    );
    let pyvenv = format!(
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = {VENV_PYTHON_VERSION}\n"
    );
    fs_err::create_dir_all(linux64)?;
    let out = linux64.join(format!("python-{VENV_PYTHON_VERSION}-h0_0.conda"));
    let mut index = linux64_index("python", VENV_PYTHON_VERSION, &["__glibc >=2.17"]);
    index["license"] = "Python-2.0".into();
    write_package(
        &out,
        index,
        &[
            file("pyvenv.cfg", pyvenv),
            executable("bin/python3.9", python),
            link("bin/python", "python3.9"),
            link("bin/python3", "python3.9"),
            // Archives carry no empty directories, so a file keeps site-packages; Python
            // ignores any that is not `.pth` or importable.
            file(
                "lib/python3.9/site-packages/README.txt",
                "site-packages of the venv python of imgbuild's tests\n",
            ),
        ],
        None,
    )?;
    Ok(out)
}

/// The bytes of the regular file `member` (without a leading `./`) in the tar at `tar_path`.
fn tar_member(tar_path: &Path, member: &str) -> anyhow::Result<Vec<u8>> {
    let mut archive = tar::Archive::new(fs_err::File::open(tar_path)?);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path.strip_prefix(".").unwrap_or(&path) == Path::new(member) {
            ensure!(
                entry.header().entry_type().is_file(),
                "{member} in {} is not a regular file",
                tar_path.display()
            );
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            return Ok(bytes);
        }
    }
    bail!("{} has no {member}", tar_path.display())
}

/// Writes `name-version-py39_0.conda` (linux-64, depends `python 3.9.*`) into `linux64`: a
/// conda package that also installs the PyPI distribution `pypi_name` `pypi_version`, the way
/// conda-forge's pip-built Python packages do. Its files, under
/// `lib/python3.9/site-packages/`: a module `<pypi_name>.py` (in file-name form) and
/// `<pypi_name>-<pypi_version>.dist-info/` with `METADATA`, `INSTALLER` (`conda`) and `RECORD`.
pub(crate) fn write_conda_python_dist(
    linux64: &Path,
    name: &str,
    version: &str,
    pypi_name: &str,
    pypi_version: &str,
) -> anyhow::Result<PathBuf> {
    let module = format!("{}.py", file_name_form(pypi_name));
    let source = format!("__version__ = \"{pypi_version}\"\n");
    conda_python_dist(
        linux64,
        name,
        version,
        pypi_name,
        pypi_version,
        &[(&module, source.as_bytes())],
        "Apache-2.0",
    )
}

/// [`write_conda_python_dist`] with the given files (paths relative to site-packages) in place
/// of the made-up module, and the given licence.
fn conda_python_dist(
    linux64: &Path,
    name: &str,
    version: &str,
    pypi_name: &str,
    pypi_version: &str,
    modules: &[(&str, &[u8])],
    license: &str,
) -> anyhow::Result<PathBuf> {
    let dist_info = format!("{}-{pypi_version}.dist-info", file_name_form(pypi_name));
    let metadata = format!(
        "Metadata-Version: 2.1\nName: {pypi_name}\nVersion: {pypi_version}\n\
         Summary: {pypi_name} as installed by the conda package {name}\n\n"
    );
    let mut site_files: Vec<(String, Vec<u8>)> = modules
        .iter()
        .map(|(path, bytes)| (path.to_string(), bytes.to_vec()))
        .collect();
    site_files.push((format!("{dist_info}/METADATA"), metadata.into_bytes()));
    site_files.push((format!("{dist_info}/INSTALLER"), b"conda\n".to_vec()));
    let mut record = String::new();
    for (path, bytes) in &site_files {
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes));
        record.push_str(&format!("{path},sha256={digest},{}\n", bytes.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    site_files.push((format!("{dist_info}/RECORD"), record.into_bytes()));

    let entries: Vec<Entry> = site_files
        .into_iter()
        .map(|(path, bytes)| file(format!("lib/python3.9/site-packages/{path}"), bytes))
        .collect();
    let mut index = linux64_index(name, version, &["python 3.9.*"]);
    index["build"] = "py39_0".into();
    index["license"] = license.into();
    fs_err::create_dir_all(linux64)?;
    let out = linux64.join(format!("{name}-{version}-py39_0.conda"));
    write_package(&out, index, &entries, None)?;
    Ok(out)
}

/// Writes the conda package `six` 1.16.0 that provides the PyPI distribution `six` 1.16.0
/// (see [`write_conda_python_dist`]), with the real `six.py` of [`SIX_1_16_0`].
pub(crate) fn write_six_conda_package(linux64: &Path, cache_dir: &Path) -> anyhow::Result<PathBuf> {
    let wheel = fetch_wheel(cache_dir, &SIX_1_16_0)?;
    let mut zip = zip::ZipArchive::new(fs_err::File::open(&wheel)?)
        .with_context(|| format!("opening {}", wheel.display()))?;
    let mut six = Vec::new();
    zip.by_name("six.py")
        .with_context(|| format!("six.py in {}", wheel.display()))?
        .read_to_end(&mut six)?;
    conda_python_dist(
        linux64,
        "six",
        "1.16.0",
        "six",
        "1.16.0",
        &[("six.py", &six)],
        "MIT",
    )
}

/// Writes a channel into `channel_dir` holding the venv `python` 3.9.2 (see
/// [`write_venv_python_package`]) and the conda `six` 1.16.0 (see
/// [`write_six_conda_package`]), indexed.
pub(crate) fn write_pypi_channel(channel_dir: &Path, cache_dir: &Path) -> anyhow::Result<()> {
    let linux64 = channel_dir.join("linux-64");
    fs_err::create_dir_all(&linux64)?;
    fs_err::create_dir_all(channel_dir.join("noarch"))?;
    write_venv_python_package(&linux64, cache_dir)?;
    write_six_conda_package(&linux64, cache_dir)?;
    index_channel(channel_dir)
}

/// The channel of [`write_pypi_channel`], built once per test process; read-only and never
/// removed, like [`super::shared_channel`]. Use it with a base from [`bullseye_python_base`].
pub(crate) fn pypi_channel() -> &'static Path {
    static CHANNEL: OnceLock<PathBuf> = OnceLock::new();
    CHANNEL.get_or_init(|| {
        kept_channel_dir("pypi-channel", |dir| {
            write_pypi_channel(dir, &test_cache_dir())
        })
    })
}
