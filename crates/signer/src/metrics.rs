//! What the agent counts about its signer: requests by outcome, fallbacks to a local key, and
//! the time spent waiting (a histogram, and a total the agent reports as crypto op
//! `sign_remote`, kept apart from in-process `sign` CPU: waiting on another process is not this
//! process's CPU).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use crate::client::ClientError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// No signer at the socket, or it closed the connection.
    Unreachable,
    Timeout,
    /// The signer's queue was full.
    Busy,
    /// Authentication failed (either direction).
    Auth,
    /// The signer answered another error (unknown key, unsupported scheme, signing failed).
    Refused,
    Protocol,
}

impl Outcome {
    const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Unreachable,
        Outcome::Timeout,
        Outcome::Busy,
        Outcome::Auth,
        Outcome::Refused,
        Outcome::Protocol,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Unreachable => "unreachable",
            Outcome::Timeout => "timeout",
            Outcome::Busy => "busy",
            Outcome::Auth => "auth",
            Outcome::Refused => "refused",
            Outcome::Protocol => "protocol",
        }
    }
}

/// Upper bounds of the signer latency histogram, in seconds (a P-256 signature is ~25 us, an
/// RSA-2048 one ~1 ms, plus the round trip).
const BUCKETS: [f64; 11] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0,
];

#[derive(Debug)]
pub struct ClientMetrics {
    outcomes: [AtomicU64; 7],
    fallbacks: AtomicU64,
    buckets: [AtomicU64; 11],
    count: AtomicU64,
    wait_ns: AtomicU64,
    /// When the last warning was logged (ns since `epoch`), to log at most one a second.
    last_warn: AtomicU64,
    epoch: Instant,
}

impl Default for ClientMetrics {
    fn default() -> Self {
        Self {
            outcomes: Default::default(),
            fallbacks: AtomicU64::new(0),
            buckets: Default::default(),
            count: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            last_warn: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl ClientMetrics {
    pub fn record(&self, outcome: Outcome, took: Duration) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.wait_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Seconds spent waiting on the signer, and requests made (crypto op `sign_remote`).
    pub fn wait(&self) -> (f64, u64) {
        (
            self.wait_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.count.load(Ordering::Relaxed),
        )
    }

    pub fn outcome(&self, o: Outcome) -> u64 {
        self.outcomes[o as usize].load(Ordering::Relaxed)
    }

    pub fn fallback(&self, e: &ClientError, path: &Path) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        if self.may_warn() {
            tracing::warn!(signer = %path.display(), error = %e, "key signer unreachable; signing with the local key (--key-signer-fallback local)");
        }
    }

    pub fn warn(&self, e: &ClientError, path: &Path) {
        if self.may_warn() {
            tracing::warn!(signer = %path.display(), error = %e, "key signer failed; handshake fails (fallback closed)");
        }
    }

    fn may_warn(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64 + 1;
        let last = self.last_warn.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= 1_000_000_000)
            && self
                .last_warn
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The `baton_key_signer_*` families, for the agent's collector (read at scrape time: the
    /// counters stay atomics on the signing path).
    pub fn encode(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut family = e.encode_descriptor(
            "baton_key_signer_requests",
            "Signatures asked of the key signer, by outcome.",
            None,
            MetricType::Counter,
        )?;
        for o in Outcome::ALL {
            let labels = ResultLabel { result: o };
            ConstCounter::new(load(&self.outcomes[o as usize]))
                .encode(family.encode_family(&labels)?)?;
        }
        ConstCounter::new(load(&self.fallbacks)).encode(e.encode_descriptor(
            "baton_key_signer_fallbacks",
            "Signatures made with the local key because the signer was unreachable.",
            None,
            MetricType::Counter,
        )?)?;
        // The buckets are cumulative atomics; the encoder takes each bucket's own count.
        let count = load(&self.count);
        let mut buckets = Vec::with_capacity(BUCKETS.len() + 1);
        let mut below = 0;
        for (b, n) in BUCKETS.iter().zip(&self.buckets) {
            let n = load(n).max(below);
            buckets.push((*b, n - below));
            below = n;
        }
        let count = count.max(below);
        buckets.push((f64::MAX, count - below));
        e.encode_descriptor(
            "baton_key_signer_seconds",
            "Time from sending a signing request to its answer (or failure).",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(
            load(&self.wait_ns) as f64 / 1e9,
            count,
            &buckets,
            None,
        )
    }
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct ResultLabel {
    result: Outcome,
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_outcomes_counted() {
        let m = ClientMetrics::default();
        m.record(Outcome::Ok, Duration::from_micros(80));
        m.record(Outcome::Busy, Duration::from_millis(3));
        let out = encoded(m);
        for line in [
            "baton_key_signer_requests_total{result=\"ok\"} 1\n",
            "baton_key_signer_requests_total{result=\"busy\"} 1\n",
            "baton_key_signer_seconds_bucket{le=\"0.0001\"} 1\n",
            "baton_key_signer_seconds_bucket{le=\"0.005\"} 2\n",
            "baton_key_signer_seconds_bucket{le=\"1.0\"} 2\n",
            "baton_key_signer_seconds_bucket{le=\"+Inf\"} 2\n",
            "baton_key_signer_seconds_count 2\n",
            "baton_key_signer_fallbacks_total 0\n",
        ] {
            assert!(out.contains(line), "missing {line}in\n{out}");
        }
    }

    fn encoded(m: ClientMetrics) -> String {
        #[derive(Debug)]
        struct C(ClientMetrics);
        impl prometheus_client::collector::Collector for C {
            fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                self.0.encode(&mut e)
            }
        }
        assert_eq!(m.wait().1, 2);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(C(m)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }
}
