//! `--server-metrics`: a Baton agent's Prometheus counters before and after the run, so the
//! result carries what the server saw (full vs resumed handshakes) and what it spent (CPU,
//! crypto seconds) next to what the client measured.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The counters kept: series name with labels -> value.
pub type Sample = BTreeMap<String, f64>;

const KEPT: [&str; 7] = [
    "baton_handshakes_total",
    "baton_sessions_migrated_total",
    "baton_handoff_failures_total",
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
    let text = String::from_utf8_lossy(&body);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("{url}: no HTTP response")
    };
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|s| s != "200") {
        bail!("{url}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(parse(body))
}

/// Prometheus text format: `name{labels} value [timestamp]`; label values may hold spaces.
pub fn parse(text: &str) -> Sample {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let end = match l.find('{') {
                Some(_) => l.rfind('}')? + 1,
                None => l.find(char::is_whitespace)?,
            };
            let (series, rest) = l.split_at(end);
            let value = rest.split_whitespace().next()?;
            KEPT.iter()
                .any(|k| series == *k || series.starts_with(&format!("{k}{{")))
                .then(|| Some((series.to_string(), value.parse().ok()?)))?
        })
        .collect()
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
}
