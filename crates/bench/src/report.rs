//! The result: a JSON document (the contract other tools read) and a human summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::accounting::{ErrorClass, Kind};
use crate::config::BenchConfig;
use crate::scrape::Sample;
use crate::stats::{raw, summary, RawHistogram, Stats, Summary, PHASES, TIMELINE_MS};
use crate::threshold::Verdict;

/// One run's result, or several runs merged (`bench merge` reads it back, so it round-trips).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub url: String,
    pub handshakes: Handshakes,
    pub requests: Requests,
    pub errors: BTreeMap<ErrorClass, u64>,
    /// The first failure's cause in each error class.
    pub error_examples: BTreeMap<ErrorClass, String>,
    /// Completed handshakes by what they agreed on: "version suite group" (group `-` for a
    /// TLS 1.2 resumption, which has no key exchange).
    pub negotiated: BTreeMap<String, u64>,
    pub latency_ms: BTreeMap<String, Summary>,
    /// Transactions per second (connections that completed their requests).
    pub tps: f64,
    /// Successful requests per second.
    pub rps: f64,
    /// Bytes received from the server (HTTP heads and bodies, after TLS).
    pub bytes: u64,
    pub connections: u64,
    pub duration_s: f64,
    /// This process's CPU time (user + system) during the run.
    pub client_cpu_s: f64,
    pub config: BenchConfig,
    /// Server counters scraped before and after (`--server-metrics`), per URL: the deltas.
    pub server: BTreeMap<String, Sample>,
    /// Raw latency histograms per phase, for exact merging (`bench merge`).
    pub histograms: BTreeMap<String, RawHistogram>,
    /// Transactions ended per interval since the start (throughput over time).
    #[serde(default)]
    pub timeline: Timeline,
    /// `--early-data`: first requests sent as early data (0-RTT), as the server answered.
    #[serde(default)]
    pub early_data: EarlyData,
    /// Set when this is several runs merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<Merged>,
    /// `--threshold`: each one as written canonically, the measured figure, passed or crossed
    /// (absent without thresholds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds: Vec<Verdict>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timeline {
    pub interval_ms: u64,
    /// Transactions completed in each interval.
    pub completed: Vec<u64>,
    /// Transactions failed in each interval.
    pub failed: Vec<u64>,
    /// Request latency by the second in which each request started (raw histograms, as in
    /// `histograms`; second 0 first): windows such as "during a restart" are read from one run
    /// by adding the seconds they span. Absent in runs of older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_by_second: Vec<RawHistogram>,
}

/// What a merged report was made of.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Merged {
    pub runs: u64,
    /// The runs' URLs, each once.
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EarlyData {
    /// Completed handshakes whose first request went as early data.
    pub offered: u64,
    /// ... that the server accepted (answered at 0-RTT).
    pub accepted: u64,
    /// ... that the server refused (the request was sent again after the handshake).
    pub rejected: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handshakes {
    pub full: u64,
    pub resumed: u64,
    pub resume_refused: u64,
    pub failed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Requests {
    pub ok: u64,
    pub failed: u64,
    /// Requests not sent because the server closed the keep-alive connection before them
    /// (counted neither ok nor failed; their connections are in `errors.closed`). Absent in
    /// runs of older versions.
    #[serde(default)]
    pub unsent: u64,
    /// What the connections were to make: ok + failed + unsent (absent in runs of older
    /// versions).
    #[serde(default)]
    pub expected: u64,
    pub by_status: BTreeMap<u16, u64>,
}

/// Requests per connection as the summary says it: a number, or the scenarios' counts.
pub(crate) fn req_per_conn(c: &BenchConfig) -> String {
    if c.requests_per_conn > 0 {
        return c.requests_per_conn.to_string();
    }
    let counts: Vec<String> = c.scenarios.iter().map(|s| s.requests.to_string()).collect();
    counts.join("/")
}

pub fn build(
    cfg: &BenchConfig,
    s: &Stats,
    elapsed_s: f64,
    cpu_s: f64,
    server: BTreeMap<String, Sample>,
) -> Report {
    let completed = s.latency[3].len();
    let per_s = |x: u64| {
        if elapsed_s > 0.0 {
            x as f64 / elapsed_s
        } else {
            0.0
        }
    };
    Report {
        url: cfg.url.clone(),
        handshakes: Handshakes {
            full: s.full,
            resumed: s.resumed,
            resume_refused: s.resume_refused,
            failed: s.handshake_failed,
        },
        requests: Requests {
            ok: s.requests_ok,
            failed: s.requests_failed,
            unsent: s.requests_unsent,
            expected: s.requests_expected,
            by_status: s.by_status.clone(),
        },
        errors: s.errors.clone(),
        error_examples: s.examples.clone(),
        negotiated: s.negotiated.iter().map(|(k, v)| (k.name(), *v)).collect(),
        // plus, for kinds that occurred, the time to first byte from the transaction's start
        // (`ttfb` counts from the handshake's end, which with 0-RTT comes after the response)
        latency_ms: phases(s)
            .map(|(p, h)| (p.to_string(), summary(h)))
            .collect(),
        tps: per_s(completed),
        rps: per_s(s.requests_ok),
        bytes: s.bytes,
        connections: s.transactions,
        duration_s: elapsed_s,
        client_cpu_s: cpu_s,
        config: cfg.clone(),
        server,
        histograms: phases(s).map(|(p, h)| (p.to_string(), raw(h))).collect(),
        timeline: Timeline {
            interval_ms: TIMELINE_MS,
            completed: s.timeline.iter().map(|x| x[0]).collect(),
            failed: s.timeline.iter().map(|x| x[1]).collect(),
            request_by_second: s.request_by_second.iter().map(raw).collect(),
        },
        early_data: EarlyData {
            offered: s.early_offered,
            accepted: s.early_accepted,
            rejected: s.early_rejected,
        },
        merged: None,
        thresholds: Vec::new(),
    }
}

/// The latency histograms of a run by JSON key: the phases, then TTFB by connection kind
/// (those that occurred), then each request's latency (`request`, when any was answered).
fn phases(s: &Stats) -> impl Iterator<Item = (&'static str, &hdrhistogram::Histogram<u64>)> {
    PHASES
        .iter()
        .copied()
        .zip(s.latency.iter())
        .chain(
            Kind::ALL
                .iter()
                .map(|k| k.key())
                .zip(s.ttfb_by_kind.iter())
                .filter(|(_, h)| !h.is_empty()),
        )
        .chain(std::iter::once((REQUEST, &s.request)).filter(|(_, h)| !h.is_empty()))
}

/// The JSON key of the per-request latency (`latency_ms`, `histograms`).
pub const REQUEST: &str = "request";

/// The summary a person reads: a few aligned tables.
pub fn human(r: &Report) -> String {
    let c = &r.config;
    let mut o = String::new();
    let version = c
        .tls_version
        .as_deref()
        .map_or("TLS 1.2+1.3".to_string(), |v| format!("TLS {v}"));
    if let Some(m) = &r.merged {
        let _ = writeln!(o, "baton bench merge: {} runs", m.runs);
    }
    let _ = writeln!(
        o,
        "baton bench {}  {} connections, {} clients, {} req/conn{}, {}, resume {}, 1 full every {}{}",
        r.url,
        r.connections,
        c.clients,
        req_per_conn(c),
        if c.streams > 1 {
            format!(" ({} streams at once)", c.streams)
        } else {
            String::new()
        },
        version,
        serde_json::to_value(c.resume)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
        c.full_every,
        c.rate
            .map_or(String::new(), |x| format!(", open loop {x}/s"))
    );
    let h = &r.handshakes;
    let _ = writeln!(
        o,
        "\n  handshakes   full {:>8}   resumed {:>8}   resume refused {:>6}   failed {:>6}",
        h.full, h.resumed, h.resume_refused, h.failed
    );
    for (i, (what, count)) in r.negotiated.iter().enumerate() {
        let label = if i == 0 { "negotiated" } else { "" };
        let _ = writeln!(o, "  {label:<11}{count:>10}   {what}");
    }
    let statuses: Vec<String> = r
        .requests
        .by_status
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let _ = writeln!(
        o,
        "  requests     ok   {:>8}   failed  {:>8}   ({})",
        r.requests.ok,
        r.requests.failed,
        statuses.join(", ")
    );
    if r.requests.unsent > 0 {
        // not failures: the server closed the connection first; a client sends them again
        let _ = writeln!(
            o,
            "               unsent {:>6}   (the server closed the keep-alive connection before them)",
            r.requests.unsent
        );
    }
    let e = &r.early_data;
    if e.offered > 0 {
        let _ = writeln!(
            o,
            "  early data   offered {:>5}   accepted {:>7}   rejected {:>13}",
            e.offered, e.accepted, e.rejected
        );
    }
    if r.errors.is_empty() {
        let _ = writeln!(o, "  errors       none");
    }
    for (i, (class, count)) in r.errors.iter().enumerate() {
        let label = if i == 0 { "errors" } else { "" };
        let example = r
            .error_examples
            .get(class)
            .filter(|e| !e.is_empty())
            .map_or(String::new(), |e| format!("   e.g. {e}"));
        let class = format!("{class:?}").to_lowercase();
        let _ = writeln!(o, "  {label:<11}{count:>10}   {class}{example}");
    }
    let _ = writeln!(
        o,
        "  throughput   {:.1} TPS   {:.1} RPS   {:.2} MB in {:.2} s",
        r.tps,
        r.rps,
        r.bytes as f64 / 1e6,
        r.duration_s
    );
    let _ = writeln!(
        o,
        "\n  latency ms   {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    // TTFB by kind counts from the transaction's start, TCP connect included
    for (phase, s) in PHASES
        .iter()
        .copied()
        .chain(Kind::ALL.iter().map(|k| k.key()))
        .chain([REQUEST])
        .filter_map(|p| Some((p, r.latency_ms.get(p)?)))
    {
        let _ = writeln!(
            o,
            "  {:<11}  {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            phase, s.p50, s.p90, s.p99, s.p999, s.max, s.mean
        );
    }
    let per_tx = if r.connections > 0 {
        r.client_cpu_s / r.connections as f64 * 1000.0
    } else {
        0.0
    };
    let cores = if r.duration_s > 0.0 {
        r.client_cpu_s / r.duration_s
    } else {
        0.0
    };
    let _ = writeln!(
        o,
        "\n  client CPU   {:.3} s ({per_tx:.3} ms per connection, {cores:.2} of {} cores)",
        r.client_cpu_s, c.workers
    );
    for (url, d) in &r.server {
        let get = |k: &str| d.get(k).copied().unwrap_or(0.0);
        let full = get("baton_handshakes_total{version=\"1.2\",kind=\"full\"}")
            + get("baton_handshakes_total{version=\"1.3\",kind=\"full\"}");
        let resumed = get("baton_handshakes_total{version=\"1.2\",kind=\"resumed\"}")
            + get("baton_handshakes_total{version=\"1.3\",kind=\"resumed\"}");
        let cpu = get("process_cpu_seconds_total");
        let crypto: f64 = d
            .iter()
            .filter(|(k, _)| k.starts_with("baton_crypto_seconds_total"))
            .map(|(_, v)| v)
            .sum();
        let _ = writeln!(o, "  server       {url}: full {full:.0}  resumed {resumed:.0}  CPU {cpu:.3} s  crypto {crypto:.3} s ({:.0}% of CPU)", if cpu > 0.0 { crypto / cpu * 100.0 } else { 0.0 });
    }
    if !r.thresholds.is_empty() {
        o.push('\n');
        o.push_str(&crate::threshold::lines(&r.thresholds));
    }
    o
}
