//! A bound on what a channel's repodata answers decompress to. rattler's gateway streams
//! `repodata.json[.zst|.bz2]` through its decoders into the cache, and reads sharded
//! repodata (`*.msgpack.zst`) into memory, with no limit: 96 KiB of zstd from a hostile
//! channel became 3 GiB in the cache. This middleware on the client the gateway is given
//! decodes each chunk of such an answer as it passes, into a [`BoundedSink`] that keeps
//! nothing, and ends the body with [`TooLarge`] (naming the channel and subdir) before the
//! gateway is handed a chunk that would take it past the bound.

use std::{
    collections::BTreeMap,
    io::Write,
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};

use crate::compression::bounded::{Bound, BoundedSink, TooLarge, env_u64};

/// The most one `repodata.json` may hold, decompressed. conda-forge's linux-64 one, the
/// largest real channel, is a few hundred MB and grows by ~100 MB a year: 2 GiB leaves
/// years of room, and a bomb is cut off there (the gateway writes it to the cache, so this
/// is also the most disk a hostile channel can take per subdir, and the temporary file is
/// removed on the refusal).
pub(crate) const MAX_REPODATA: u64 = 2 << 30;
/// Sharded repodata is held in memory whole, shard by shard: conda-forge's shard index is
/// ~10 MB and its largest shard a few MB. At most [`MAX_REPODATA`] when that is lower.
pub(crate) const MAX_SHARD: u64 = 256 << 20;
/// Replaces [`MAX_REPODATA`] (bytes, a positive integer).
pub const MAX_REPODATA_ENV: &str = "IMGBUILD_MAX_REPODATA_BYTES";

/// The middleware; the bound is read from the environment when the client is made.
#[derive(Debug, Clone)]
pub struct RepodataBound {
    max: u64,
    /// The answers refused so far, by URL. The gateway retries a body that fails to decode;
    /// a second request for a bomb is refused before it is sent, so it is read once.
    refused: Arc<Mutex<BTreeMap<String, TooLarge>>>,
}

impl RepodataBound {
    pub fn from_env() -> Self {
        RepodataBound::new(env_u64(MAX_REPODATA_ENV).unwrap_or(MAX_REPODATA))
    }

    fn new(max: u64) -> Self {
        RepodataBound {
            max,
            refused: Arc::default(),
        }
    }

    /// The bound of an answer from `url`, `None` for what is no repodata (packages, PyPI).
    fn bound(&self, url: &url::Url) -> Option<(Bound, Decoding)> {
        let file = url.path_segments()?.next_back()?;
        let (max, content) = match file {
            "repodata.json" | "current_repodata.json" | "repodata_from_packages.json" => {
                (self.max, Decoding::Plain)
            }
            f if f.ends_with("repodata.json.zst") => (self.max, Decoding::Zstd),
            f if f.ends_with("repodata.json.bz2") => (self.max, Decoding::Bzip2),
            f if f.ends_with(".msgpack.zst") => (self.max.min(MAX_SHARD), Decoding::Zstd),
            _ => return None,
        };
        let rule = format!("{MAX_REPODATA_ENV} sets it; the default is {MAX_REPODATA}");
        Some((Bound::new(max, subject(url, file), rule), content))
    }
}

/// What a repodata file is compressed with, by its name.
#[derive(Debug, Clone, Copy)]
enum Decoding {
    Plain,
    Zstd,
    Bzip2,
}

/// `url` without credentials: no user info, and `***` for the token of a `/t/TOKEN` path.
fn redacted(url: &url::Url) -> url::Url {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let mut kept: Vec<String> = Vec::new();
    let mut token = false;
    for segment in url.path_segments().into_iter().flatten() {
        kept.push(if token { "***".into() } else { segment.into() });
        token = segment == "t" && !token;
    }
    url.set_path(&kept.join("/"));
    url
}

/// ``repodata.json.zst` of channel `URL` subdir `linux-64``: the channel and subdir as the
/// URL (`…/CHANNEL/SUBDIR/FILE`) names them; a shard (under the index's own base URL) by its
/// whole URL.
fn subject(url: &url::Url, file: &str) -> String {
    let mut url = redacted(url);
    if file.ends_with(".msgpack.zst") && file != "repodata_shards.msgpack.zst" {
        return format!("repodata shard `{url}`");
    }
    let mut segments: Vec<String> = url
        .path_segments()
        .map(|s| s.map(str::to_string).collect())
        .unwrap_or_default();
    segments.pop();
    let subdir = segments.pop().unwrap_or_default();
    url.set_path(&format!("{}/", segments.join("/")));
    format!("`{file}` of channel `{url}` subdir `{subdir}`")
}

/// The decoders of one answer: the transfer encoding (gzip, which the gateway asks for and
/// decodes itself) around the file's own compression, ending in the sink that counts.
struct Check {
    decoder: Box<dyn Write + Send>,
    raw: u64,
    bound: Bound,
    url: String,
    refused: Arc<Mutex<BTreeMap<String, TooLarge>>>,
}

impl Check {
    #[cfg(test)]
    fn new(bound: Bound, content: Decoding, gzip: bool) -> std::io::Result<Self> {
        Check::for_url(bound, content, gzip, String::new(), Arc::default())
    }

    fn for_url(
        bound: Bound,
        content: Decoding,
        gzip: bool,
        url: String,
        refused: Arc<Mutex<BTreeMap<String, TooLarge>>>,
    ) -> std::io::Result<Self> {
        let sink = BoundedSink::new(bound.clone());
        let inner: Box<dyn Write + Send> = match content {
            Decoding::Plain => Box::new(sink),
            Decoding::Zstd => Box::new(zstd::stream::write::Decoder::new(sink)?),
            Decoding::Bzip2 => Box::new(bzip2::write::BzDecoder::new(sink)),
        };
        let decoder: Box<dyn Write + Send> = if gzip {
            Box::new(flate2::write::MultiGzDecoder::new(inner))
        } else {
            inner
        };
        Ok(Check {
            decoder,
            raw: 0,
            bound,
            url,
            refused,
        })
    }

    /// Decodes `chunk` into the sink; an error once the bound is passed, and the URL is
    /// remembered as refused.
    fn feed(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        // The bytes on the wire count as well: plain or not, no more than the bound.
        self.raw = self.raw.saturating_add(chunk.len() as u64);
        let result = if self.raw > self.bound.max {
            Err(std::io::Error::other(self.bound.exceeded()))
        } else {
            self.decoder.write_all(chunk)
        };
        if let Err(err) = &result
            && let Some(too_large) = TooLarge::in_io(err)
            && let Ok(mut refused) = self.refused.lock()
        {
            refused.insert(self.url.clone(), too_large.clone());
        }
        result
    }
}

#[async_trait::async_trait]
impl Middleware for RepodataBound {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some((bound, content)) = self.bound(req.url()) else {
            return next.run(req, extensions).await;
        };
        let url = req.url().to_string();
        let known = self.refused.lock().ok().and_then(|r| r.get(&url).cloned());
        if let Some(too_large) = known {
            return Err(reqwest_middleware::Error::middleware(too_large));
        }
        let response = next.run(req, extensions).await?;
        if !response.status().is_success() {
            return Ok(response);
        }
        let check = Check::for_url(
            bound,
            content,
            is_gzip(&response),
            url,
            self.refused.clone(),
        )
        .map_err(reqwest_middleware::Error::middleware)?;
        bounded_response(response, check).map_err(reqwest_middleware::Error::middleware)
    }
}

/// Whether the answer is gzip on the wire (which the gateway decodes itself).
fn is_gzip(response: &Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"))
}

/// `response` with a body that passes each chunk on only once [`Check::feed`] took it.
fn bounded_response(response: Response, check: Check) -> std::io::Result<Response> {
    let check = Mutex::new(check);
    let mut builder = http::Response::builder()
        .status(response.status())
        .version(response.version())
        .url(response.url().clone());
    if let Some(headers) = builder.headers_mut() {
        *headers = response.headers().clone();
    }
    let body = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        let mut check = check
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        check.feed(&chunk)?;
        Ok::<_, std::io::Error>(chunk)
    });
    builder
        .body(reqwest::Body::wrap_stream(body))
        .map(Response::from)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_channel_and_subdir_without_credentials() {
        let bound = RepodataBound::new(10);
        let url = url::Url::parse(
            "https://u:p@example.org/t/secret/conda-forge/linux-64/repodata.json.zst",
        )
        .unwrap();
        let (bound, _) = bound.bound(&url).unwrap();
        assert_eq!(
            bound.subject,
            "`repodata.json.zst` of channel `https://example.org/t/***/conda-forge/` subdir `linux-64`"
        );
        let package = url::Url::parse("https://example.org/c/linux-64/x-1-0.conda").unwrap();
        assert!(RepodataBound::new(10).bound(&package).is_none());
    }

    #[test]
    fn a_check_refuses_what_decodes_past_the_bound() {
        let bomb = zstd::bulk::compress(&vec![b' '; 4 << 20], 3).unwrap();
        let small = Bound::new(1 << 20, "x", "y");
        let mut check = Check::new(small, Decoding::Zstd, false).unwrap();
        assert!(check.feed(&bomb).is_err());
        let enough = Bound::new(4 << 20, "x", "y");
        Check::new(enough, Decoding::Zstd, false)
            .unwrap()
            .feed(&bomb)
            .unwrap();
    }
}
