//! Package indexes: what files a project offers. PEP 691 JSON when the index speaks it,
//! PEP 503 HTML otherwise (one request asks for both, the JSON preferred), and `find-links`
//! locations: a local directory of distributions or an HTML page of links.

use std::path::PathBuf;

use pep508_rs::PackageName;
use rattler_digest::Sha256Hash;
use rattler_networking::LazyClient;
use serde::Deserialize;
use url::Url;

pub use crate::recipe::pypi::{FindLinks, Sources};

const JSON_TYPE: &str = "application/vnd.pypi.simple.v1+json";
const ACCEPT: &str = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01";

/// One distribution file a project offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistFile {
    pub filename: String,
    pub url: Url,
    pub sha256: Option<Sha256Hash>,
    /// `Requires-Python` as the index states it (PEP 503 `data-requires-python`).
    pub requires_python: Option<String>,
    pub yanked: bool,
    /// The index serves the file's core metadata at `<url>.metadata` (PEP 658/714), with
    /// this sha256 when it gave one.
    pub metadata: Option<Option<Sha256Hash>>,
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("The package index page `{url}` could not be fetched: {reason}")]
    Fetch { url: Url, reason: String },
    #[error("The package index page `{url}` is not a valid {format} project page: {reason}")]
    Parse {
        url: Url,
        format: &'static str,
        reason: String,
    },
    #[error("The find-links directory `{}` cannot be read", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The most bytes of one project or find-links page. The largest pages of real indexes
/// (a project with thousands of nightly wheels) are a few tens of MB; more is not a page.
pub(crate) const MAX_PAGE_BYTES: u64 = 128 << 20;

/// PEP 503: project names in URLs are lowercase, runs of `-_.` become `-`.
pub fn normalized(name: &PackageName) -> String {
    // PackageName is already normalized that way.
    name.as_ref().to_string()
}

#[derive(Deserialize)]
struct JsonPage {
    files: Vec<JsonFile>,
}

#[derive(Deserialize)]
struct JsonFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: std::collections::BTreeMap<String, String>,
    #[serde(rename = "requires-python")]
    requires_python: Option<String>,
    #[serde(default)]
    yanked: serde_json::Value,
    // PyPI sends both names (PEP 714 renamed the field); either says the same.
    #[serde(rename = "core-metadata", default)]
    core_metadata: serde_json::Value,
    #[serde(rename = "dist-info-metadata", default)]
    dist_info_metadata: serde_json::Value,
}

fn sha256_of(hex: &str) -> Option<Sha256Hash> {
    rattler_digest::parse_digest_from_hex::<rattler_digest::Sha256>(hex)
}

/// A PEP 691 `core-metadata` value: `true`, or a hashes table.
fn json_metadata(value: &serde_json::Value) -> Option<Option<Sha256Hash>> {
    match value {
        serde_json::Value::Bool(true) => Some(None),
        serde_json::Value::Object(hashes) => Some(
            hashes
                .get("sha256")
                .and_then(|v| v.as_str())
                .and_then(sha256_of),
        ),
        _ => None,
    }
}

fn parse_json(body: &str, base: &Url) -> Result<Vec<DistFile>, String> {
    let page: JsonPage = serde_json::from_str(body).map_err(|e| e.to_string())?;
    page.files
        .into_iter()
        .map(|file| {
            let url = base
                .join(&file.url)
                .map_err(|e| format!("`{}`: {e}", file.url))?;
            Ok(DistFile {
                sha256: file.hashes.get("sha256").and_then(|h| sha256_of(h)),
                requires_python: file.requires_python.filter(|r| !r.trim().is_empty()),
                yanked: !matches!(
                    file.yanked,
                    serde_json::Value::Bool(false) | serde_json::Value::Null
                ),
                metadata: json_metadata(&file.core_metadata)
                    .or_else(|| json_metadata(&file.dist_info_metadata)),
                url,
                filename: file.filename,
            })
        })
        .collect()
}

/// A PEP 658/714 attribute value: `true`, or `<hash-name>=<hex>`.
fn html_metadata(value: &str) -> Option<Option<Sha256Hash>> {
    match value.split_once('=') {
        Some(("sha256", hex)) => Some(sha256_of(hex)),
        Some(_) => Some(None),
        None if value.eq_ignore_ascii_case("true") => Some(None),
        None => None,
    }
}

fn parse_html(body: &str, base: &Url) -> Result<Vec<DistFile>, String> {
    let dom = tl::parse(body, tl::ParserOptions::default()).map_err(|e| e.to_string())?;
    let parser = dom.parser();
    // A `<base href>` moves what relative links are relative to.
    let base = dom
        .query_selector("base")
        .and_then(|mut q| q.next())
        .and_then(|h| h.get(parser))
        .and_then(|n| n.as_tag())
        .and_then(|t| t.attributes().get("href").flatten())
        .and_then(|href| base.join(&href.as_utf8_str()).ok())
        .unwrap_or_else(|| base.clone());
    let mut files = Vec::new();
    let Some(anchors) = dom.query_selector("a") else {
        return Ok(files);
    };
    for handle in anchors {
        let Some(tag) = handle.get(parser).and_then(|n| n.as_tag()) else {
            continue;
        };
        let attributes = tag.attributes();
        let attribute = |name: &str| {
            attributes
                .get(name)
                .flatten()
                .map(|v| html_escape::decode_html_entities(&v.as_utf8_str()).into_owned())
        };
        let Some(href) = attribute("href") else {
            continue;
        };
        let mut url = base.join(&href).map_err(|e| format!("`{href}`: {e}"))?;
        let sha256 = url
            .fragment()
            .and_then(|f| f.strip_prefix("sha256="))
            .and_then(sha256_of);
        url.set_fragment(None);
        let Some(filename) = url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .map(percent_decode)
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        let metadata = attribute("data-core-metadata")
            .or_else(|| attribute("data-dist-info-metadata"))
            .and_then(|v| html_metadata(&v));
        files.push(DistFile {
            filename,
            url,
            sha256,
            requires_python: attribute("data-requires-python").filter(|r| !r.trim().is_empty()),
            yanked: attributes.contains("data-yanked"),
            metadata,
        });
    }
    Ok(files)
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| text.to_string())
}

/// A project page's files: PEP 691 JSON when `json`, else PEP 503 HTML (also the form of a
/// find-links page), with links resolved against `base`. Public for the fuzz target
/// (`fuzz/fuzz_targets/pypi_inputs.rs`).
pub fn parse_page(body: &str, json: bool, base: &Url) -> Result<Vec<DistFile>, String> {
    let files = if json {
        parse_json(body, base)?
    } else {
        parse_html(body, base)?
    };
    check_links(base, &files)?;
    Ok(files)
}

/// Refuses a page at `base` that links a file it may not (see [`may_link`]).
fn check_links(base: &Url, files: &[DistFile]) -> Result<(), String> {
    match files.iter().find(|f| !may_link(base, &f.url)) {
        Some(file) => Err(format!(
            "`{}` links `{}`, which is not on the web: a remote page may link only http and https files",
            file.filename, file.url
        )),
        None => Ok(()),
    }
}

/// Whether a page at `base` may send the client to `url`. A page from the web must not name
/// a file on the build host (a private wheel in another build's cache, say): what a
/// stranger's page links is fetched, never read from the disk. A local page may link both.
fn may_link(base: &Url, url: &Url) -> bool {
    let web = |u: &Url| matches!(u.scheme(), "http" | "https");
    !web(base) || web(url)
}

/// The files of `project` on the index at `index` (`https://pypi.org/simple`); `None` when
/// the index does not know the project.
pub(crate) async fn project_files(
    client: &LazyClient,
    index: &Url,
    project: &PackageName,
) -> Result<Option<Vec<DistFile>>, IndexError> {
    let mut url = index.clone();
    let path = format!(
        "{}/{}/",
        url.path().trim_end_matches('/'),
        normalized(project)
    );
    url.set_path(&path);
    let Some(page) = get_page(client, &url, ACCEPT).await? else {
        return Ok(None);
    };
    let format = if page.json {
        "PEP 691 JSON"
    } else {
        "PEP 503 HTML"
    };
    let parsed = parse_page(&page.body, page.json, &page.base).map_err(|reason| (reason, format));
    parsed
        .map(Some)
        .map_err(|(reason, format)| IndexError::Parse {
            url: page.base,
            format,
            reason,
        })
}

/// A page as fetched: where it ended up after redirects (links are relative to that), its
/// text, and whether the server answered with PEP 691 JSON.
struct Page {
    base: Url,
    body: String,
    json: bool,
}

/// GETs `url` asking for `accept`; `None` when the server has no such page (404).
async fn get_page(
    client: &LazyClient,
    url: &Url,
    accept: &str,
) -> Result<Option<Page>, IndexError> {
    let fetch_error = |reason: String| IndexError::Fetch {
        url: url.clone(),
        reason,
    };
    let response = client
        .client()
        .get(url.clone())
        .header(reqwest::header::ACCEPT, accept)
        .send()
        .await
        .map_err(|e| fetch_error(crate::http::error_chain(&e)))?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(fetch_error(format!("HTTP {}", response.status())));
    }
    let base = response.url().clone();
    let json = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(JSON_TYPE));
    let body = crate::http::read_bounded(response, MAX_PAGE_BYTES)
        .await
        .map_err(|e| fetch_error(e.to_string()))?;
    let body = String::from_utf8(body).map_err(|_| fetch_error("it is not UTF-8".into()))?;
    Ok(Some(Page { base, body, json }))
}

/// Every file in a `find-links` location (not only `project`'s: the caller filters by the
/// parsed file name).
pub(crate) async fn find_links_files(
    client: &LazyClient,
    location: &FindLinks,
) -> Result<Vec<DistFile>, IndexError> {
    match location {
        FindLinks::Directory(path) => {
            let read_error = |source| IndexError::Directory {
                path: path.clone(),
                source,
            };
            let mut files = Vec::new();
            for entry in fs_err::read_dir(path).map_err(read_error)? {
                let entry = entry.map_err(read_error)?;
                let filename = entry.file_name().to_string_lossy().into_owned();
                if !entry.file_type().map_err(read_error)?.is_file() {
                    continue;
                }
                let Ok(url) = Url::from_file_path(entry.path()) else {
                    continue;
                };
                files.push(DistFile {
                    filename,
                    url,
                    sha256: None,
                    requires_python: None,
                    yanked: false,
                    metadata: None,
                });
            }
            files.sort_by(|a, b| a.filename.cmp(&b.filename));
            Ok(files)
        }
        FindLinks::Page(url) => {
            let page =
                get_page(client, url, "text/html")
                    .await?
                    .ok_or_else(|| IndexError::Fetch {
                        url: url.clone(),
                        reason: format!("HTTP {}", reqwest::StatusCode::NOT_FOUND),
                    })?;
            parse_page(&page.body, false, &page.base).map_err(|reason| IndexError::Parse {
                url: page.base,
                format: "HTML",
                reason,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Url {
        Url::parse("https://pypi.example/simple/six/").unwrap()
    }

    #[test]
    fn html_pages_give_hashes_python_bounds_yanks_and_metadata() {
        let sha = "a".repeat(64);
        let html = format!(
            r#"<!DOCTYPE html><html><body>
            <a href="../../files/six-1.16.0-py2.py3-none-any.whl#sha256={sha}" data-requires-python="&gt;=2.7, !=3.0.*" data-core-metadata="sha256={sha}">six-1.16.0-py2.py3-none-any.whl</a>
            <a href="https://cdn.example/six-1.15.0.tar.gz" data-yanked="">six-1.15.0.tar.gz</a>
            </body></html>"#
        );
        let files = parse_html(&html, &base()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].filename, "six-1.16.0-py2.py3-none-any.whl");
        assert_eq!(
            files[0].url.as_str(),
            "https://pypi.example/files/six-1.16.0-py2.py3-none-any.whl"
        );
        assert_eq!(files[0].requires_python.as_deref(), Some(">=2.7, !=3.0.*"));
        assert!(files[0].sha256.is_some());
        assert!(matches!(files[0].metadata, Some(Some(_))));
        assert!(!files[0].yanked);
        assert!(files[1].yanked && files[1].sha256.is_none() && files[1].metadata.is_none());
    }

    #[test]
    fn json_pages_give_the_same_fields() {
        let sha = "b".repeat(64);
        let json = format!(
            r#"{{"meta":{{"api-version":"1.1"}},"name":"six","files":[
              {{"filename":"six-1.16.0-py2.py3-none-any.whl","url":"../../files/six-1.16.0-py2.py3-none-any.whl","hashes":{{"sha256":"{sha}"}},"requires-python":">=2.7","core-metadata":true,"dist-info-metadata":true,"yanked":false}},
              {{"filename":"six-1.0.tar.gz","url":"https://cdn.example/six-1.0.tar.gz","hashes":{{}},"yanked":"broken"}}]}}"#
        );
        let files = parse_json(&json, &base()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].metadata, Some(None));
        assert_eq!(files[0].requires_python.as_deref(), Some(">=2.7"));
        assert!(files[0].sha256.is_some() && !files[0].yanked);
        assert!(files[1].yanked && files[1].sha256.is_none());
    }
}
