//! What the agent counts about its signer: requests by outcome, fallbacks to a local key, and
//! the time spent waiting (a histogram, and a total the agent reports as crypto op
//! `sign_remote`, kept apart from in-process `sign` CPU: waiting on another process is not this
//! process's CPU).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

    /// Prometheus families `baton_key_signer_*`.
    pub fn render(&self, out: &mut String) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            out,
            "baton_key_signer_requests_total",
            "counter",
            "Signatures asked of the key signer, by outcome.",
        );
        for o in Outcome::ALL {
            let _ = writeln!(
                out,
                "baton_key_signer_requests_total{{result=\"{}\"}} {}",
                o.label(),
                load(&self.outcomes[o as usize])
            );
        }
        family(
            out,
            "baton_key_signer_fallbacks_total",
            "counter",
            "Signatures made with the local key because the signer was unreachable.",
        );
        let _ = writeln!(
            out,
            "baton_key_signer_fallbacks_total {}",
            load(&self.fallbacks)
        );
        family(
            out,
            "baton_key_signer_seconds",
            "histogram",
            "Time from sending a signing request to its answer (or failure).",
        );
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "baton_key_signer_seconds_bucket{{le=\"{b}\"}} {}",
                load(&self.buckets[i])
            );
        }
        let count = load(&self.count);
        let _ = writeln!(
            out,
            "baton_key_signer_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "baton_key_signer_seconds_sum {:.9}",
            load(&self.wait_ns) as f64 / 1e9
        );
        let _ = writeln!(out, "baton_key_signer_seconds_count {count}");
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
        let mut out = String::new();
        m.render(&mut out);
        for line in [
            "baton_key_signer_requests_total{result=\"ok\"} 1\n",
            "baton_key_signer_requests_total{result=\"busy\"} 1\n",
            "baton_key_signer_seconds_bucket{le=\"0.0001\"} 1\n",
            "baton_key_signer_seconds_bucket{le=\"0.005\"} 2\n",
            "baton_key_signer_seconds_count 2\n",
        ] {
            assert!(out.contains(line), "missing {line}in\n{out}");
        }
        assert_eq!(m.wait().1, 2);
    }
}
