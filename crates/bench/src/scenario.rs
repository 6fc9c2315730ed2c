//! Scenarios: what one connection of `baton bench --scenario FILE` sends, in order, on one
//! keep-alive connection, with the think time before each request.
//!
//! The file is TOML, one `[[request]]` table per request:
//!
//! ```toml
//! # baton scenario
//! name = "checkout"             # optional, shown nowhere but here
//! host = "shop.example"         # optional; full URLs below must be on this host
//!
//! [[request]]
//! path = "/"                    # or a full URL on the same host: "https://shop.example/"
//!
//! [[request]]
//! think-ms = 1200               # wait this long before sending it (default 0)
//! method = "POST"               # default GET
//! path = "/cart"
//! headers = ["Content-Type: application/json", "Cookie: sid=1"]   # `Name: value`, in order
//! body = '{"sku": 42}'          # or body-base64 = "eyJza3UiOiA0Mn0="
//! ```
//!
//! Only the path is sent: the requests go to the bench URL's host (the host a full URL names
//! is checked for consistency, not connected to), and `Host` is the bench's SNI. `Host`,
//! `Content-Length` and the hop-by-hop headers (`Connection`, `Keep-Alive`,
//! `Transfer-Encoding`, `Upgrade`, `TE`, `Proxy-Connection`) are baton's, so a file that sets
//! them is refused. Errors name the request, its line and the field.
//!
//! `baton scenario import-har` writes such a file from a browser's HAR export: requests to the
//! first entry's host only, think times from the gaps between the entries' `startedDateTime`.
//!
//! Replay (`--think recorded|none|SCALE`): each virtual client picks a scenario per connection
//! (round-robin, or by `FILE:WEIGHT`), sleeps the first request's think time before
//! connecting, then sends the requests one after the other, each after its think time. Each
//! connection's requests are counted against its own scenario's length (answered, else
//! failed), so scenarios of different lengths mix exactly: `requests.expected` = ok + failed;
//! `requests_per_conn` is the common length, or 0 when they differ. Think time is not latency
//! (the total phase leaves it out).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One request of a scenario, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    pub think_ms: u64,
    pub method: String,
    /// Origin-form: `/path?query`.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

/// A parsed scenario file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scenario {
    pub name: Option<String>,
    pub host: Option<String>,
    pub requests: Vec<Request>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(default)]
    request: Vec<toml::Spanned<RawRequest>>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRequest {
    #[serde(default, skip_serializing_if = "is_zero")]
    think_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    method: Option<String>,
    path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Headers baton writes itself, or that would break the one keep-alive connection.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "te",
    "proxy-connection",
];

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses and checks a scenario file's text.
pub fn parse(text: &str) -> anyhow::Result<Scenario> {
    let raw: RawFile = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
    if raw.request.is_empty() {
        bail!("no requests: add at least one [[request]] table with a `path`");
    }
    let mut host = raw.host.clone().map(|h| h.to_ascii_lowercase());
    let mut requests = Vec::new();
    for (i, spanned) in raw.request.iter().enumerate() {
        let line = text[..spanned.span().start.min(text.len())]
            .matches('\n')
            .count()
            + 1;
        let r = spanned.get_ref();
        let req =
            request(r, &mut host).with_context(|| format!("request {} (line {line})", i + 1))?;
        requests.push(req);
    }
    Ok(Scenario {
        name: raw.name,
        host,
        requests,
    })
}

fn request(r: &RawRequest, host: &mut Option<String>) -> anyhow::Result<Request> {
    let method = r.method.as_deref().unwrap_or("GET").to_ascii_uppercase();
    if !is_token(&method) {
        bail!("method: `{method}` is not an HTTP method");
    }
    let path = if r.path.starts_with('/') {
        r.path.clone()
    } else if let Some((scheme_host, path)) = split_full_url(&r.path) {
        match host {
            Some(h) if *h != scheme_host => bail!(
                "path: `{}` is not on host `{h}` (a scenario replays on one connection)",
                r.path
            ),
            Some(_) => {}
            None => *host = Some(scheme_host),
        }
        path
    } else {
        bail!(
            "path: `{}` is neither a path (/...) nor an http(s) URL",
            r.path
        );
    };
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        bail!("path: `{path}` has spaces or control characters (percent-encode them)");
    }
    let mut headers = Vec::new();
    for h in &r.headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("headers: `{h}` is not `Name: value`"))?;
        let (name, value) = (name.trim(), value.trim());
        if !is_token(name) {
            bail!("headers: `{name}` is not a header name");
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            bail!("headers: `{name}` has a line break in its value");
        }
        if RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
            bail!("headers: `{name}` is set by baton (the connection is kept alive for the whole scenario)");
        }
        headers.push((name.to_string(), value.to_string()));
    }
    let body = match (&r.body, &r.body_base64) {
        (Some(_), Some(_)) => bail!("body and body-base64: give one"),
        (Some(t), None) => Some(t.as_bytes().to_vec()),
        (None, Some(b)) => Some(base64_decode(b).context("body-base64")?),
        (None, None) => None,
    };
    Ok(Request {
        think_ms: r.think_ms,
        method,
        path,
        headers,
        body,
    })
}

/// `https://Host:port/p?q` -> (`host:port` lowercased, without a default port; `/p?q`).
fn split_full_url(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => return None,
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let authority = authority.to_ascii_lowercase();
    let authority = authority
        .strip_suffix(default)
        .unwrap_or(&authority)
        .to_string();
    let path = path.split('#').next().unwrap_or("/");
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else if path.is_empty() {
        "/".into()
    } else {
        path.to_string()
    };
    Some((authority, path))
}

/// Writes a scenario as a file [`parse`] reads back.
pub fn to_toml(s: &Scenario, comment: &str) -> anyhow::Result<String> {
    let raw = RawFile {
        name: s.name.clone(),
        host: s.host.clone(),
        request: s
            .requests
            .iter()
            .map(|r| {
                let (body, body_base64) = match &r.body {
                    None => (None, None),
                    Some(b) => match std::str::from_utf8(b) {
                        Ok(t) if !t.chars().any(|c| c.is_control() && !"\n\r\t".contains(c)) => {
                            (Some(t.to_string()), None)
                        }
                        _ => (None, Some(base64_encode(b))),
                    },
                };
                toml::Spanned::new(
                    0..0,
                    RawRequest {
                        think_ms: r.think_ms,
                        method: (r.method != "GET").then(|| r.method.clone()),
                        path: r.path.clone(),
                        headers: r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect(),
                        body,
                        body_base64,
                    },
                )
            })
            .collect(),
    };
    let mut out = String::new();
    for line in comment.lines() {
        let _ = writeln!(out, "# {line}");
    }
    out.push_str(&toml::to_string(&raw).context("writing the scenario as TOML")?);
    Ok(out)
}

/// What an import kept and dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub scenario: Scenario,
    /// Other hosts, and how many requests went to each.
    pub dropped_hosts: Vec<(String, usize)>,
    /// Entries that are not http(s) requests (data:, ws:, blob: ...).
    pub dropped_other: usize,
    /// Header names left out (pseudo-headers and baton's own), each once.
    pub dropped_headers: Vec<String>,
    /// What was masked (`None`: credentials kept).
    pub redacted: Option<crate::redact::Counts>,
}

#[derive(Deserialize)]
struct Har {
    log: HarLog,
}
#[derive(Deserialize)]
struct HarLog {
    entries: Vec<HarEntry>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HarEntry {
    #[serde(default)]
    started_date_time: Option<String>,
    request: HarRequest,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HarRequest {
    method: String,
    url: String,
    #[serde(default)]
    headers: Vec<HarHeader>,
    #[serde(default)]
    post_data: Option<HarPostData>,
}
#[derive(Deserialize)]
struct HarHeader {
    name: String,
    value: String,
}
#[derive(Deserialize)]
struct HarPostData {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    encoding: Option<String>,
}

/// Turns observed requests (a HAR file's entries, `baton record`'s exchanges) into a scenario,
/// in the order given: one host only (the first request's, or the one given), think time =
/// the gap between a request's start and the previous kept one's, baton's own headers left
/// out. What it drops is counted for the summary.
#[derive(Debug, Default)]
pub struct Collector {
    out: Imported,
    host: Option<String>,
    last_start: Option<f64>,
}

/// Where [`Collector::push`] put a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Kept,
    OtherHost,
    /// Not an http(s) URL (data:, ws:, blob: ...).
    NotHttp,
}

/// `host[:port]` as scenarios compare hosts: lowercase, without the default https port.
pub fn normalize_host(h: &str) -> String {
    let h = h.to_ascii_lowercase();
    h.strip_suffix(":443").map(str::to_string).unwrap_or(h)
}

impl Collector {
    /// `host`: keep the requests to this `host[:port]` only (default: the first request's).
    pub fn new(host: Option<&str>) -> Collector {
        Collector {
            host: host.map(normalize_host),
            ..Default::default()
        }
    }

    /// One observed request: `url` absolute, `start_ms` on any clock (`None`: unknown, think
    /// time 0). A request the scenario format cannot hold is an error and is not kept.
    pub fn push(
        &mut self,
        method: &str,
        url: &str,
        start_ms: Option<f64>,
        headers: &[(String, String)],
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Pushed> {
        let Some((h, path)) = split_full_url(url) else {
            self.out.dropped_other += 1;
            return Ok(Pushed::NotHttp);
        };
        let host = self.host.get_or_insert_with(|| h.clone());
        if *host != h {
            match self.out.dropped_hosts.iter_mut().find(|(x, _)| *x == h) {
                Some((_, n)) => *n += 1,
                None => self.out.dropped_hosts.push((h, 1)),
            }
            return Ok(Pushed::OtherHost);
        }
        let think_ms = match (self.last_start, start_ms) {
            (Some(a), Some(b)) if b > a => (b - a).round() as u64,
            _ => 0,
        };
        let mut kept = Vec::new();
        for (name, value) in headers {
            let lower = name.to_ascii_lowercase();
            if name.starts_with(':') || RESERVED.contains(&lower.as_str()) {
                if !self.out.dropped_headers.contains(&lower) {
                    self.out.dropped_headers.push(lower);
                }
                continue;
            }
            kept.push((name.clone(), value.clone()));
        }
        let r = Request {
            think_ms,
            method: method.to_ascii_uppercase(),
            path,
            headers: kept,
            body,
        };
        // what the parser would refuse is refused here
        let raw = RawRequest {
            think_ms,
            method: Some(r.method.clone()),
            path: r.path.clone(),
            headers: r.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect(),
            ..Default::default()
        };
        request(&raw, &mut None)?;
        if start_ms.is_some() {
            self.last_start = start_ms;
        }
        self.out.scenario.requests.push(r);
        Ok(Pushed::Kept)
    }

    /// The scenario and what was dropped; an error when nothing was kept.
    pub fn finish(mut self) -> anyhow::Result<Imported> {
        if self.out.scenario.requests.is_empty() {
            bail!("no http(s) requests to keep");
        }
        self.out.scenario.host = self.host;
        Ok(self.out)
    }
}

/// A HAR export (`log.entries[].request`) as a scenario: the first entry's host only, in the
/// file's order, think time = the gap between one entry's `startedDateTime` and the previous
/// kept one's (0 for the first, and where a time is missing or goes backwards). Unless
/// `keep_credentials`, credentials and request bodies are masked as `baton record` masks them
/// ([`crate::redact`]), counted in `redacted`.
pub fn import_har(json: &str, keep_credentials: bool) -> anyhow::Result<Imported> {
    let har: Har = serde_json::from_str(json).context("not a HAR file (log.entries[].request)")?;
    let mut c = Collector::new(None);
    let mut redacted = crate::redact::Counts::default();
    for (i, e) in har.log.entries.iter().enumerate() {
        let entry = || format!("entry {}", i + 1);
        let start = match &e.started_date_time {
            Some(t) => Some(
                parse_rfc3339_ms(t)
                    .with_context(|| format!("{}: startedDateTime `{t}`", entry()))?,
            ),
            None => None,
        };
        let body = match &e.request.post_data {
            Some(HarPostData {
                text: Some(t),
                encoding,
            }) => Some(if encoding.as_deref() == Some("base64") {
                base64_decode(t).with_context(|| format!("{}: postData.text", entry()))?
            } else {
                t.as_bytes().to_vec()
            }),
            _ => None,
        };
        let mut headers: Vec<(String, String)> = e
            .request
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let mut body = body;
        let mut url = std::borrow::Cow::Borrowed(e.request.url.as_str());
        if !keep_credentials {
            use crate::redact;
            for (name, value) in &mut headers {
                if let Some(v) = redact::header_value(name, value) {
                    *value = v;
                    redacted.headers += 1;
                }
            }
            let (u, params) = redact::url(&url);
            redacted.params += params;
            url = u.into();
            if let Some(b) = body.as_mut().filter(|b| !b.is_empty()) {
                b.fill(b'x');
                redacted.bodies += 1;
            }
        }
        c.push(&e.request.method, &url, start, &headers, body)
            .with_context(entry)?;
    }
    let mut imported = c.finish().context("the HAR file")?;
    imported.redacted = (!keep_credentials).then_some(redacted);
    Ok(imported)
}

/// `2024-05-01T10:00:00.123Z` or `...+02:00` (RFC 3339, what HAR files hold) -> milliseconds
/// since the epoch.
fn parse_rfc3339_ms(s: &str) -> anyhow::Result<f64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| anyhow::anyhow!("not an RFC 3339 date-time: {e}"))?;
    // through whole microseconds: nanoseconds since 1970 are past what an f64 holds exactly
    Ok((t.unix_timestamp_nanos() / 1000) as f64 / 1000.0)
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Standard or URL-safe alphabet, padded or not, whitespace (line breaks) ignored.
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurpose};
    use base64::{alphabet, Engine as _};
    let clean: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let config = general_purpose::GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent);
    GeneralPurpose::new(&alphabet::STANDARD, config)
        .decode(&clean)
        .or_else(|e| {
            GeneralPurpose::new(&alphabet::URL_SAFE, config)
                .decode(&clean)
                .map_err(|_| e)
        })
        .map_err(|e| anyhow::anyhow!("not base64: {e}"))
}

/// `--think`: recorded think times, none, or scaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Think {
    Recorded,
    None,
    Scale(f64),
}

impl Think {
    pub fn parse(s: &str) -> anyhow::Result<Think> {
        match s {
            "recorded" => Ok(Think::Recorded),
            "none" => Ok(Think::None),
            x => match x.parse::<f64>() {
                Ok(f) if f >= 0.0 && f.is_finite() => Ok(Think::Scale(f)),
                _ => bail!("--think `{s}`: recorded, none, or a scale factor like 0.5"),
            },
        }
    }

    fn apply(self, ms: u64) -> Duration {
        match self {
            Think::Recorded => Duration::from_millis(ms),
            Think::None => Duration::ZERO,
            Think::Scale(f) => Duration::from_secs_f64(ms as f64 * f / 1000.0),
        }
    }
}

/// `FILE` or `FILE:WEIGHT` -> (file, weight).
pub fn file_and_weight(s: &str) -> anyhow::Result<(String, u32)> {
    if let Some((file, w)) = s.rsplit_once(':') {
        if !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()) {
            let w: u32 = w
                .parse()
                .with_context(|| format!("--scenario `{s}`: weight"))?;
            if w == 0 {
                bail!("--scenario `{s}`: the weight must be at least 1");
            }
            return Ok((file.to_string(), w));
        }
    }
    Ok((s.to_string(), 1))
}

/// One request as a connection sends it.
#[derive(Debug)]
pub struct Step {
    pub think: Duration,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The HTTP/1.1 request, built once.
    pub wire: Bytes,
}

/// The scenarios of a run and the order in which connections take them.
#[derive(Debug)]
pub struct Mix {
    pub scenarios: Vec<Arc<[Step]>>,
    /// Scenario index per slot; connection `i` takes `schedule[i % len]` (weights spread out).
    schedule: Vec<usize>,
}

impl Mix {
    pub fn new(scenarios: &[(Scenario, u32)], think: Think, host_header: &str) -> Mix {
        let compiled = scenarios
            .iter()
            .map(|(s, _)| {
                s.requests
                    .iter()
                    .map(|r| Step {
                        think: think.apply(r.think_ms),
                        method: r.method.clone(),
                        path: r.path.clone(),
                        headers: r.headers.clone(),
                        body: Bytes::from(r.body.clone().unwrap_or_default()),
                        wire: wire(r, host_header),
                    })
                    .collect::<Vec<_>>()
                    .into()
            })
            .collect();
        let weights: Vec<u32> = scenarios.iter().map(|(_, w)| *w).collect();
        Mix {
            scenarios: compiled,
            schedule: schedule(&weights),
        }
    }

    /// The scenario of the run's `i`-th connection.
    pub fn pick(&self, i: u64) -> Arc<[Step]> {
        self.scenarios[self.schedule[(i % self.schedule.len() as u64) as usize]].clone()
    }
}

/// Smooth weighted round-robin (as nginx): weights 3,1 -> 0,0,1,0; equal weights -> 0,1,2...
/// The weights are reduced by their gcd and the cycle capped at 10,000 slots.
fn schedule(weights: &[u32]) -> Vec<usize> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let g = weights.iter().fold(0u64, |g, &w| gcd(g, w as u64)).max(1);
    let mut w: Vec<u64> = weights.iter().map(|&x| x as u64 / g).collect();
    let mut total: u64 = w.iter().sum();
    if total > 10_000 {
        let f = total as f64 / 10_000.0;
        w = w
            .iter()
            .map(|&x| ((x as f64 / f).round() as u64).max(1))
            .collect();
        total = w.iter().sum();
    }
    let mut current = vec![0i64; w.len()];
    (0..total)
        .map(|_| {
            for (c, x) in current.iter_mut().zip(&w) {
                *c += *x as i64;
            }
            let best = (0..w.len())
                .max_by_key(|&i| (current[i], -(i as i64)))
                .unwrap_or(0);
            current[best] -= total as i64;
            best
        })
        .collect()
}

fn wire(r: &Request, host: &str) -> Bytes {
    let mut s = format!("{} {} HTTP/1.1\r\nHost: {host}\r\n", r.method, r.path);
    let has = |n: &str| r.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if !has("user-agent") {
        s.push_str("User-Agent: baton-bench\r\n");
    }
    if !has("accept") {
        s.push_str("Accept: */*\r\n");
    }
    for (k, v) in &r.headers {
        let _ = write!(s, "{k}: {v}\r\n");
    }
    let body = r.body.as_deref().unwrap_or_default();
    if r.body.is_some() || matches!(r.method.as_str(), "POST" | "PUT" | "PATCH") {
        let _ = write!(s, "Content-Length: {}\r\n", body.len());
    }
    s.push_str("\r\n");
    let mut b = s.into_bytes();
    b.extend_from_slice(body);
    Bytes::from(b)
}

/// `baton scenario ...`.
#[derive(clap::Args, Debug)]
pub struct ScenarioCli {
    #[command(subcommand)]
    pub command: ScenarioCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum ScenarioCommand {
    /// Convert a browser's HAR export into a scenario file for `baton bench --scenario`: the
    /// requests to the first entry's host, in order, with the recorded gaps as think times.
    ImportHar {
        /// The HAR file (browser dev tools: "Save all as HAR").
        #[arg(value_name = "FILE.har")]
        har: std::path::PathBuf,
        /// The scenario file to write (0600).
        #[arg(long, value_name = "FILE.toml")]
        out: std::path::PathBuf,
        /// Keep cookies, authorization and other credential headers and query parameters,
        /// and request bodies, as exported. By default they are replaced by x's of the same
        /// length, as `baton record` does.
        #[arg(long)]
        keep_credentials: bool,
    },
}

/// Runs `baton scenario ...`; the summary goes to standard error.
pub fn main(cli: ScenarioCli) -> anyhow::Result<()> {
    match cli.command {
        ScenarioCommand::ImportHar {
            har,
            out,
            keep_credentials,
        } => {
            let text = std::fs::read_to_string(&har)
                .with_context(|| format!("reading {}", har.display()))?;
            let imported =
                import_har(&text, keep_credentials).with_context(|| har.display().to_string())?;
            let mut comment = format!(
                "baton scenario, imported from {} (think-ms: gaps between startedDateTime)",
                har.display()
            );
            if let Some(c) = imported.redacted {
                comment.push('\n');
                comment.push_str(&crate::redact::comment(c));
            }
            let toml = to_toml(&imported.scenario, &comment)?;
            // what was written must read back
            parse(&toml).context("the imported scenario does not read back")?;
            write_atomically(&out, toml.as_bytes())?;
            eprintln!("{}", summary(&imported, &out));
            Ok(())
        }
    }
}

/// The summary of an import (or a recording) written to `out`: how many requests to which host,
/// and what was dropped.
pub fn summary(i: &Imported, out: &std::path::Path) -> String {
    let mut s = format!(
        "wrote {}: {} requests to {}",
        out.display(),
        i.scenario.requests.len(),
        i.scenario.host.as_deref().unwrap_or("?")
    );
    if i.dropped_hosts.is_empty() && i.dropped_other == 0 {
        s.push_str("; nothing dropped");
    }
    for (h, n) in &i.dropped_hosts {
        let _ = write!(s, "\ndropped {n} request(s) to {h}");
    }
    if i.dropped_other > 0 {
        let _ = write!(s, "\ndropped {} non-http(s) entries", i.dropped_other);
    }
    if !i.dropped_headers.is_empty() {
        let _ = write!(
            s,
            "\nleft out headers baton sets itself: {}",
            i.dropped_headers.join(", ")
        );
    }
    s
}

/// Writes a scenario file (or any file) `path` whole or not at all, readable by its owner only
/// (it may hold credentials): a fresh temporary file next to it, created 0600, synced, renamed
/// over it.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path
        .file_name()
        .with_context(|| format!("--out {}: not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    // a stale temporary file of an earlier run with this pid (and whatever mode) goes first
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"# a scenario
name = "shop"

[[request]]
path = "https://Shop.example/"

[[request]]
think-ms = 1200
method = "post"
path = "/cart?x=1"
headers = ["Content-Type: application/json", "Cookie: a=b"]
body = '{"sku": 42}'

[[request]]
path = "/img"
body-base64 = "AAEC/w=="
"#;

    #[test]
    fn parses_a_scenario() {
        let s = parse(FILE).unwrap();
        assert_eq!(s.host.as_deref(), Some("shop.example"));
        assert_eq!(s.requests.len(), 3);
        assert_eq!(s.requests[0].path, "/");
        assert_eq!(s.requests[0].method, "GET");
        let r = &s.requests[1];
        assert_eq!((r.think_ms, r.method.as_str()), (1200, "POST"));
        assert_eq!(r.headers[1], ("Cookie".into(), "a=b".into()));
        assert_eq!(r.body.as_deref(), Some(&b"{\"sku\": 42}"[..]));
        assert_eq!(s.requests[2].body.as_deref(), Some(&[0, 1, 2, 255][..]));
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn errors_name_the_request_line_and_field() {
        let e = err(
            "[[request]]\npath = \"/\"\n\n[[request]]\npath = \"/\"\nheaders = [\"Host: x\"]\n",
        );
        assert!(
            e.contains("request 2 (line 4)") && e.contains("Host"),
            "{e}"
        );
        let e = err("[[request]]\npath = \"/\"\nheaders = [\"nocolon\"]\n");
        assert!(e.contains("line 1") && e.contains("headers"), "{e}");
        let e = err("[[request]]\npath = \"x\"\n");
        assert!(e.contains("path"), "{e}");
        let e = err("[[request]]\npath = \"/\"\nbody-base64 = \"!!\"\n");
        assert!(e.contains("body-base64"), "{e}");
        let e = err("[[request]]\npath = \"/\"\nbody = \"a\"\nbody-base64 = \"YQ==\"\n");
        assert!(e.contains("give one"), "{e}");
        let e = err("[[request]]\npath = \"/\"\nthink = 3\n");
        assert!(e.contains("line 3") && e.contains("think"), "{e}");
        let e = err("[[request]]\nmethod = \"GET\"\n");
        assert!(e.contains("path"), "{e}");
        let e = err("host = \"a\"\n[[request]]\npath = \"https://b/\"\n");
        assert!(e.contains("not on host"), "{e}");
        let e = err("[[request]]\npath = \"/a b\"\n");
        assert!(e.contains("spaces"), "{e}");
        assert!(err("name = \"x\"\n").contains("no requests"));
    }

    #[test]
    fn base64_round_trips() {
        for n in 0..40u8 {
            let data: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37)).collect();
            assert_eq!(base64_decode(&base64_encode(&data)).unwrap(), data);
        }
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\nbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("-_8").unwrap(), [0xfb, 0xff]);
        assert!(base64_decode("a$").is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01.5Z").unwrap(), 1500.0);
        let a = parse_rfc3339_ms("2024-05-01T10:00:00.000+02:00").unwrap();
        let b = parse_rfc3339_ms("2024-05-01T08:00:00.250Z").unwrap();
        assert_eq!(b - a, 250.0);
        assert!(parse_rfc3339_ms("yesterday").is_err());
    }

    const HAR: &str = r#"{"log": {"version": "1.2", "entries": [
      {"startedDateTime": "2024-05-01T10:00:00.000Z", "request": {"method": "GET",
        "url": "https://shop.example/", "headers": [{"name": ":authority", "value": "shop.example"},
        {"name": "Accept", "value": "text/html"}, {"name": "Host", "value": "shop.example"}]}},
      {"startedDateTime": "2024-05-01T10:00:00.100Z", "request": {"method": "GET",
        "url": "https://cdn.example/a.js", "headers": []}},
      {"startedDateTime": "2024-05-01T10:00:00.400Z", "request": {"method": "POST",
        "url": "https://shop.example/cart", "headers": [{"name": "Content-Length", "value": "2"}],
        "postData": {"mimeType": "text/plain", "text": "hi"}}},
      {"startedDateTime": "2024-05-01T10:00:00.500Z", "request": {"method": "GET",
        "url": "data:image/png;base64,AAAA", "headers": []}}
    ]}}"#;

    #[test]
    fn imports_a_har_and_reads_it_back() {
        let i = import_har(HAR, true).unwrap();
        assert_eq!(i.dropped_hosts, vec![("cdn.example".to_string(), 1)]);
        assert_eq!(i.dropped_other, 1);
        assert_eq!(
            i.dropped_headers,
            vec![
                ":authority".to_string(),
                "host".into(),
                "content-length".into()
            ]
        );
        let s = &i.scenario;
        assert_eq!(s.requests.len(), 2);
        assert_eq!(
            s.requests[0].headers,
            vec![("Accept".into(), "text/html".into())]
        );
        assert_eq!(
            (s.requests[1].think_ms, s.requests[1].method.as_str()),
            (400, "POST")
        );
        let text = to_toml(s, "imported").unwrap();
        assert!(text.starts_with("# imported\n"));
        assert_eq!(&parse(&text).unwrap(), s);
        assert!(summary(&i, std::path::Path::new("x.toml"))
            .contains("dropped 1 request(s) to cdn.example"));
        assert!(import_har("{}", true).is_err());
    }

    #[test]
    fn an_imported_har_keeps_no_credentials_unless_asked() {
        let har = r#"{"log": {"entries": [
          {"request": {"method": "POST", "url": "https://shop.example/login?next=/&access_token=s3cr3t",
            "headers": [{"name": "Cookie", "value": "sid=abc123; theme=dark"},
                        {"name": "Authorization", "value": "Bearer tok-42"},
                        {"name": "Accept", "value": "text/html"}],
            "postData": {"mimeType": "application/x-www-form-urlencoded", "text": "user=a&password=hunter2"}}}
        ]}}"#;
        let i = import_har(har, false).unwrap();
        let text = to_toml(&i.scenario, "x").unwrap();
        for secret in ["abc123", "dark", "tok-42", "s3cr3t", "hunter2"] {
            assert!(!text.contains(secret), "{secret} in\n{text}");
        }
        let r = &i.scenario.requests[0];
        assert!(r.path.ends_with("access_token=xxxxxx"), "{}", r.path);
        assert!(r
            .headers
            .contains(&("Cookie".into(), "sid=xxxxxx; theme=xxxx".into())));
        assert!(r
            .headers
            .contains(&("Authorization".into(), "Bearer xxxxxx".into())));
        assert!(r.headers.contains(&("Accept".into(), "text/html".into())));
        assert_eq!(r.body.as_deref().map(<[u8]>::len), Some(23));
        let c = i.redacted.unwrap();
        assert_eq!((c.headers, c.params, c.bodies), (2, 1, 1));
        // kept as exported when asked
        let kept = import_har(har, true).unwrap();
        let text = to_toml(&kept.scenario, "x").unwrap();
        assert!(text.contains("tok-42") && text.contains("hunter2") && kept.redacted.is_none());
    }

    #[test]
    fn weights_and_think() {
        assert_eq!(schedule(&[1, 1, 1]), vec![0, 1, 2]);
        let s = schedule(&[3, 1]);
        assert_eq!(s.len(), 4);
        assert_eq!(s.iter().filter(|&&x| x == 0).count(), 3);
        assert_eq!(schedule(&[200, 100]).len(), 3);
        assert_eq!(file_and_weight("a.toml:3").unwrap(), ("a.toml".into(), 3));
        assert_eq!(file_and_weight("a.toml").unwrap(), ("a.toml".into(), 1));
        assert!(file_and_weight("a.toml:0").is_err());
        assert_eq!(
            Think::parse("0.5").unwrap().apply(1000),
            Duration::from_millis(500)
        );
        assert_eq!(Think::parse("none").unwrap().apply(1000), Duration::ZERO);
        assert!(Think::parse("-1").is_err());
    }

    #[test]
    fn request_bytes() {
        let s = parse(FILE).unwrap();
        let mix = Mix::new(&[(s, 1)], Think::Recorded, "h");
        let steps = mix.pick(7);
        let w = std::str::from_utf8(&steps[1].wire).unwrap();
        assert!(w.starts_with("POST /cart?x=1 HTTP/1.1\r\nHost: h\r\nUser-Agent: baton-bench\r\n"));
        assert!(
            w.ends_with("Content-Length: 11\r\n\r\n{\"sku\": 42}"),
            "{w}"
        );
        assert_eq!(steps[1].think, Duration::from_millis(1200));
    }

    #[test]
    fn the_scenario_file_is_written_0600_even_over_a_readable_one() {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = std::env::temp_dir().join(format!("baton-record-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("s.toml");
        write_atomically(&out, b"one").unwrap();
        assert_eq!(mode(&out), 0o600);
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_atomically(&out, b"two").unwrap();
        assert_eq!(mode(&out), 0o600);
        assert_eq!(std::fs::read(&out).unwrap(), b"two");
        // only the file is left, no temporary one
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
