//! `--server-metrics`: a Baton agent's Prometheus counters before and after the run, so the
//! result carries what the server saw (full vs resumed handshakes) and what it spent (CPU,
//! crypto seconds) next to what the client measured. Also the one reader of metrics pages the
//! lab uses: [`samples`] parses the Prometheus text format and OpenMetrics alike.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The counters kept: series name with labels -> value.
pub type Sample = BTreeMap<String, f64>;

const KEPT: [&str; 7] = [
    "baton_handshakes_total",
    "baton_sessions_migrated_total",
    "baton_migration_failures_total",
    "baton_http_requests_total",
    "baton_crypto_seconds_total",
    "baton_handshake_failures_total",
    "process_cpu_seconds_total",
];

pub async fn scrape(url: &str) -> anyhow::Result<Sample> {
    let rest = url
        .strip_prefix("http://")
        .context("--server-metrics takes http://HOST:PORT/metrics")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    let body = tokio::time::timeout(Duration::from_secs(5), async {
        let mut s = tokio::net::TcpStream::connect(authority).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        s.take(4 << 20).read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    })
    .await
    .with_context(|| format!("{url}: timed out"))?
    .with_context(|| url.to_string())?;
    let body = body_of(&String::from_utf8_lossy(&body), url)?;
    Ok(parse(&body))
}

/// One sample of a metrics page.
#[derive(Debug, Clone, PartialEq)]
pub struct Series<'a> {
    /// The sample's name (`baton_handshakes_total`, `x_bucket`).
    pub name: &'a str,
    /// `name{labels}` as the page wrote it: the key of a [`Sample`].
    pub key: &'a str,
    /// Label names and values, unescaped, in the page's order.
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Series<'_> {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of a metrics page: the Prometheus text format (0.0.4) or OpenMetrics 1.0
/// (`# EOF`, exemplars after the value, float values and bucket bounds). A line that is not a
/// well-formed sample is skipped. Label values may hold spaces, `}`, `,` and escaped quotes.
pub fn samples(text: &str) -> Vec<Series<'_>> {
    text.lines().filter_map(sample).collect()
}

/// `name{labels} value [timestamp] [# exemplar]`.
fn sample(line: &str) -> Option<Series<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut at = body;
        loop {
            at = at.trim_start_matches([' ', ',']);
            if let Some(after) = at.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = at.split_once('=')?;
            let mut chars = after.strip_prefix('"')?.char_indices();
            let mut value = String::new();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((key.trim(), value));
            at = &after[1 + end + 1..];
        }
    }
    let key = &line[..line.len() - rest.len()];
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Series {
        name,
        key,
        labels,
        value,
    })
}

/// The sum of the samples named `name` that carry every label in `with` (all of them, for
/// none).
pub fn sum(samples: &[Series], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && with.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

/// The samples named `name`, by the value of their label `label`.
pub fn by_label(samples: &[Series], name: &str, label: &str) -> BTreeMap<String, f64> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter_map(|s| Some((s.label(label)?.to_string(), s.value)))
        .collect()
}

/// The series of the families `--server-metrics` keeps (handshakes, migrations, requests,
/// crypto seconds, failures, process CPU), by `name{labels}`.
pub fn parse(text: &str) -> Sample {
    samples(text)
        .into_iter()
        .filter(|s| KEPT.contains(&s.name))
        .map(|s| (s.key.to_string(), s.value))
        .collect()
}

/// `GET /metrics` from `addr` over plain HTTP/1.0, blocking (for callers without a runtime):
/// the page's text, or why not.
pub fn page_blocking(addr: std::net::SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("metrics at {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut raw = Vec::new();
    s.take(8 << 20).read_to_end(&mut raw)?;
    body_of(&String::from_utf8_lossy(&raw), &addr.to_string())
}

/// The body of a `200` HTTP/1 response, or the status line as the error.
fn body_of(response: &str, from: &str) -> anyhow::Result<String> {
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        bail!("{from}: no HTTP response")
    };
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|s| s != "200") {
        bail!("{from}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

/// After minus before, per series.
pub fn delta(before: &Sample, after: &Sample) -> Sample {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_handshakes_crypto_and_cpu() {
        let s = parse("# HELP x\nbaton_handshakes_total{version=\"1.3\",kind=\"full\"} 5\nbaton_bytes_total{direction=\"in\"} 9\nprocess_cpu_seconds_total 1.5\n");
        assert_eq!(s.len(), 2);
        let d = delta(&s, &parse("baton_handshakes_total{version=\"1.3\",kind=\"full\"} 8\nprocess_cpu_seconds_total 2.0\n"));
        assert_eq!(
            d["baton_handshakes_total{version=\"1.3\",kind=\"full\"}"],
            3.0
        );
        assert_eq!(d["process_cpu_seconds_total"], 0.5);
        // timestamps, spaces in label values, and lines that are not samples
        let s = parse("baton_handshake_failures_total{reason=\"bad cert\"} 2 1700000000000\nprocess_cpu_seconds_total\nbaton_handshakes_total{x=\"1\"} nope\n");
        assert_eq!(s.len(), 1);
        assert_eq!(
            s["baton_handshake_failures_total{reason=\"bad cert\"}"],
            2.0
        );
    }

    #[test]
    fn reads_openmetrics_pages() {
        let page = "# HELP baton_handshakes Completed TLS handshakes.\n\
                    # TYPE baton_handshakes counter\n\
                    baton_handshakes_total{version=\"1.3\",kind=\"full\"} 5\n\
                    baton_handshakes_total{version=\"1.2\",kind=\"full\"} 1\n\
                    baton_handshakes_total{version=\"1.3\",kind=\"resumed\"} 2\n\
                    baton_crypto_seconds_total{op=\"sign\"} 1.0e-3\n\
                    baton_crypto_seconds_total{op=\"hash\"} 0.5\n\
                    x_seconds_bucket{le=\"1.0\"} 3 # {trace_id=\"a b\"} 0.2 1.7e9\n\
                    x_seconds_bucket{le=\"+Inf\"} 4\n\
                    y{path=\"a}b, \\\"c\\\"\",code=\"200\"} 7 1700000000\n\
                    broken{x=\"1} 3\n\
                    process_cpu_seconds_total 0.25\n\
                    # EOF\n";
        let all = samples(page);
        assert_eq!(all.len(), 9, "{all:?}");
        assert_eq!(
            sum(&all, "baton_handshakes_total", &[("kind", "full")]),
            6.0
        );
        assert_eq!(sum(&all, "baton_handshakes_total", &[]), 8.0);
        let crypto = by_label(&all, "baton_crypto_seconds_total", "op");
        assert_eq!(crypto["sign"], 0.001);
        assert_eq!(crypto["hash"], 0.5);
        assert_eq!(sum(&all, "x_seconds_bucket", &[("le", "1.0")]), 3.0);
        let y = all.iter().find(|s| s.name == "y").unwrap();
        assert_eq!(y.label("path"), Some("a}b, \"c\""));
        assert_eq!(y.label("code"), Some("200"));
        assert_eq!(y.value, 7.0);
        let kept = parse(page);
        assert_eq!(kept.len(), 6, "{kept:?}");
        assert_eq!(
            kept["baton_handshakes_total{version=\"1.3\",kind=\"full\"}"],
            5.0
        );
        assert_eq!(kept["process_cpu_seconds_total"], 0.25);
    }
}
