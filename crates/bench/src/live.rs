//! `--metrics ADDR`: the run's figures while it runs, for Prometheus (or a person with curl)
//! to watch a long run: requests, failures, handshakes by kind, errors by class, request
//! latency, connections open. The final, exact figures are the report's; these are counters
//! kept alongside, updated once per transaction and request, only when asked for.
//!
//! Hot path: the labelled counters are created once and kept (a family lookup per event
//! would lock and hash), so an update is an atomic add.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::accounting::{End, ErrorClass, Handshake, Settled};

type Labels = [(&'static str, &'static str); 1];

/// The live counters of a run (or of a sweep's runs, added up).
#[derive(Debug)]
pub struct Live {
    requests_ok: Counter,
    requests_failed: Counter,
    requests_unsent: Counter,
    /// full, resumed, failed
    handshakes: [Counter; 3],
    resume_refused: Counter,
    /// By [`ErrorClass`], in its order.
    errors: [Counter; 6],
    transactions: Counter,
    open: Gauge,
    latency: Histogram,
}

const CLASSES: [(ErrorClass, &str); 6] = [
    (ErrorClass::Connect, "connect"),
    (ErrorClass::Tls, "tls"),
    (ErrorClass::Timeout, "timeout"),
    (ErrorClass::Http, "http"),
    (ErrorClass::Io, "io"),
    (ErrorClass::Closed, "closed"),
];

/// What one transaction adds to the live counters: its answers (from its [`End`]) and how it
/// settled. Taken from the transaction itself, not from a [`Stats`] before and after it: the
/// virtual clients of a worker share one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    pub requests_ok: u64,
    pub requests_failed: u64,
    pub requests_unsent: u64,
    /// full, resumed, failed (the order of [`Live::handshakes`])
    pub handshakes: [u64; 3],
    pub resume_refused: u64,
}

impl Tally {
    pub fn of(end: &End, s: &Settled) -> Self {
        let (full, resumed, refused) = match s.handshake {
            Some(Handshake::Full) => (1, 0, 0),
            Some(Handshake::Resumed) => (0, 1, 0),
            Some(Handshake::ResumeRefused) => (1, 0, 1),
            None => (0, 0, 0),
        };
        Tally {
            requests_ok: end.ok.into(),
            requests_failed: u64::from(end.responses - end.ok) + s.unanswered,
            requests_unsent: s.unsent,
            handshakes: [full, resumed, s.handshake_failed.into()],
            resume_refused: refused,
        }
    }
}

impl Live {
    /// The counters, and a registry that serves them (with the process's CPU and memory).
    pub fn new() -> (Arc<Live>, Registry) {
        let mut registry = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        let handshakes = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let get = |f: &Family<Labels, Counter>, k: &'static str, v: &'static str| {
            f.get_or_create(&[(k, v)]).clone()
        };
        let live = Live {
            requests_ok: get(&requests, "result", "ok"),
            requests_failed: get(&requests, "result", "failed"),
            requests_unsent: get(&requests, "result", "unsent"),
            handshakes: ["full", "resumed", "failed"].map(|k| get(&handshakes, "kind", k)),
            resume_refused: Counter::default(),
            errors: CLASSES.map(|(_, c)| get(&errors, "class", c)),
            transactions: Counter::default(),
            open: Gauge::default(),
            // 100 us to about 52 s
            latency: Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
        };
        registry.register(
            "baton_bench_requests",
            "Requests by result: ok (2xx, 3xx), failed (by status or unanswered), unsent (the \
             server closed the keep-alive connection first).",
            requests,
        );
        registry.register(
            "baton_bench_handshakes",
            "TLS handshakes by kind as negotiated: full, resumed, failed.",
            handshakes,
        );
        registry.register(
            "baton_bench_resume_refused",
            "Full handshakes where a resumption was offered and refused.",
            live.resume_refused.clone(),
        );
        registry.register(
            "baton_bench_errors",
            "Failed transactions by error class.",
            errors,
        );
        registry.register(
            "baton_bench_transactions",
            "Transactions (connections) ended, completed or failed.",
            live.transactions.clone(),
        );
        registry.register(
            "baton_bench_connections_open",
            "Connections open now (TCP connected, not yet closed).",
            live.open.clone(),
        );
        registry.register(
            "baton_bench_request_duration_seconds",
            "Each answered request, from when it started (the first with its connection's \
             connect and handshake) to its response's last byte.",
            live.latency.clone(),
        );
        registry.register_collector(Box::new(baton_ops::metrics::ProcessCollector));
        (Arc::new(live), registry)
    }

    /// One transaction ended: what it added, and its error class.
    pub fn add(&self, t: &Tally, error: Option<ErrorClass>) {
        self.requests_ok.inc_by(t.requests_ok);
        self.requests_failed.inc_by(t.requests_failed);
        self.requests_unsent.inc_by(t.requests_unsent);
        for (counter, n) in self.handshakes.iter().zip(t.handshakes) {
            counter.inc_by(n);
        }
        self.resume_refused.inc_by(t.resume_refused);
        if let Some(class) = error {
            if let Some(i) = CLASSES.iter().position(|(c, _)| *c == class) {
                self.errors[i].inc();
            }
        }
        self.transactions.inc();
    }

    pub fn connected(&self) {
        self.open.inc();
    }

    pub fn closed(&self) {
        self.open.dec();
    }

    pub fn request(&self, latency: std::time::Duration) {
        self.latency.observe(latency.as_secs_f64());
    }
}

/// Serves `registry` at http://ADDR/metrics on a thread of its own (bounded like every Baton
/// metrics endpoint) for as long as the process runs; returns the bound address.
pub fn serve(addr: SocketAddr, registry: Registry) -> anyhow::Result<SocketAddr> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listener = {
        let _in = runtime.enter();
        baton_ops::listen::bind(addr).with_context(|| format!("--metrics {addr}"))?
    };
    let bound = listener.local_addr()?;
    let counters = baton_ops::control::Counters::new("metrics");
    let mut registry = registry;
    registry.register_collector(Box::new(baton_ops::control::Collected(vec![
        counters.clone()
    ])));
    std::thread::Builder::new()
        .name("bench-metrics".into())
        .spawn(move || {
            runtime.block_on(baton_ops::serve_metrics(
                listener,
                Arc::new(registry),
                counters,
                tokio_util::sync::CancellationToken::new(),
            ))
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_adds_its_deltas() {
        let (live, registry) = Live::new();
        // four requests answered, one of them with an error status, then a timeout
        let end = End {
            handshake_started: true,
            handshake: Some(Handshake::Full),
            first_byte: true,
            responses: 4,
            ok: 3,
            error: Some(ErrorClass::Timeout),
            ..End::default()
        };
        live.connected();
        live.request(std::time::Duration::from_millis(3));
        let settled = crate::accounting::settle(&end, 4);
        live.add(&Tally::of(&end, &settled), end.error);
        let text = baton_ops::metrics::encode(&registry);
        for line in [
            "baton_bench_requests_total{result=\"ok\"} 3",
            "baton_bench_requests_total{result=\"failed\"} 1",
            "baton_bench_handshakes_total{kind=\"full\"} 1",
            "baton_bench_handshakes_total{kind=\"resumed\"} 0",
            "baton_bench_errors_total{class=\"timeout\"} 1",
            "baton_bench_transactions_total 1",
            "baton_bench_connections_open 1",
            "baton_bench_request_duration_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
