//! The agent's counters, and the `prometheus-client` collector that encodes them.
//!
//! Counters are plain atomics with a fixed label set each, so counting on the hot path is one
//! relaxed add (no registry lookup, lock or hashing per event); the collector reads them, the
//! session store's stats and the crypto meter at scrape time, with typed label sets.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use baton_ops::metrics::{counter, counters, gauge};
use baton_session::SessionStore;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder,
};
use prometheus_client::registry::Registry;

use crate::metering::{CryptoOp, METER};

/// TLS version of a handshake, as a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Tls12,
    Tls13,
}

/// Why a handshake did not complete, as a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// No shared version, suite, group or signature scheme (includes refused weak protocols).
    Incompatible,
    /// Bytes that are not well-formed TLS.
    Malformed,
    /// The client sent an alert (e.g. it did not trust our certificate).
    AlertReceived,
    /// Missing or invalid client certificate in mutual mode.
    ClientCert,
    /// A protocol violation by the peer.
    Misbehaved,
    /// The peer closed or reset the connection mid-handshake.
    Eof,
    /// The handshake did not finish within --handshake-timeout.
    Timeout,
    /// The key signer (`--key-signer`) gave no signature: unreachable, stalled, or refused.
    Signer,
    /// A PROXY header was expected from a peer outside --proxy-protocol-from: refused unread.
    Untrusted,
    /// Anything else.
    Other,
}

impl FailureReason {
    const ALL: [FailureReason; 10] = [
        FailureReason::Incompatible,
        FailureReason::Malformed,
        FailureReason::AlertReceived,
        FailureReason::ClientCert,
        FailureReason::Misbehaved,
        FailureReason::Eof,
        FailureReason::Timeout,
        FailureReason::Signer,
        FailureReason::Untrusted,
        FailureReason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Incompatible => "incompatible",
            FailureReason::Malformed => "malformed",
            FailureReason::AlertReceived => "alert_received",
            FailureReason::ClientCert => "client_cert",
            FailureReason::Misbehaved => "misbehaved",
            FailureReason::Eof => "eof",
            FailureReason::Timeout => "timeout",
            FailureReason::Signer => "signer",
            FailureReason::Untrusted => "untrusted_source",
            FailureReason::Other => "other",
        }
    }

    /// Classifies an error from the handshake.
    pub fn of(err: &std::io::Error) -> Self {
        use rustls::Error as E;
        if let Some(tls) = err.get_ref().and_then(|e| e.downcast_ref::<E>()) {
            return match tls {
                E::PeerIncompatible(_) => FailureReason::Incompatible,
                E::InvalidMessage(_)
                | E::InappropriateMessage { .. }
                | E::InappropriateHandshakeMessage { .. }
                | E::DecryptError => FailureReason::Malformed,
                E::AlertReceived(_) => FailureReason::AlertReceived,
                E::NoCertificatesPresented | E::InvalidCertificate(_) => FailureReason::ClientCert,
                E::PeerMisbehaved(_) => FailureReason::Misbehaved,
                E::Other(e) if e.0.is::<baton_signer::client::SignFailed>() => {
                    FailureReason::Signer
                }
                _ => FailureReason::Other,
            };
        }
        match err.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionAborted => FailureReason::Eof,
            std::io::ErrorKind::TimedOut => FailureReason::Timeout,
            _ => FailureReason::Other,
        }
    }
}

const EARLY_RESULTS: [&str; 3] = ["accepted", "rejected", "replay_refused"];
const TICKET_RESULTS: [&str; 4] = ["issued", "opened", "rejected", "seal_failed"];
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Everything the agent counts.
#[derive(Debug, Default)]
pub struct Metrics {
    /// [version][full, resumed]
    handshakes: [[AtomicU64; 2]; 2],
    hello_retries: AtomicU64,
    failures: [AtomicU64; 10],
    /// Connections cut for a slow request: [--request-timeout, --min-header-rate].
    slow_requests: [AtomicU64; 2],
    /// HTTP/2 connections cut by the bounds in `h2bounds`, by [`crate::h2bounds::Cut`].
    h2_cuts: [AtomicU64; 3],
    connections_active: AtomicI64,
    /// HTTP/1.1 connections parked between requests (`crate::conn::park`).
    connections_parked: AtomicI64,
    connections_total: AtomicU64,
    connections_rejected: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    tickets: [AtomicU64; 4],
    requests: [AtomicU64; 5],
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// ClientHellos that offered TLS 1.3 early data.
    early_offered: AtomicU64,
    /// What became of it: [accepted, rejected, replay_refused].
    early_results: [AtomicU64; 3],
    /// Requests received in early data: [served, too_early (425)].
    early_requests: [AtomicU64; 2],
    /// Session migration (CSSL-SF).
    pub handoff: crate::migration::metrics::HandoffMetrics,
    /// The session store, for its size and hit counters.
    store: Mutex<Option<Arc<dyn SessionStore>>>,
}

impl Metrics {
    pub fn set_store(&self, store: Arc<dyn SessionStore>) {
        *self.store.lock().unwrap_or_else(|p| p.into_inner()) = Some(store);
    }

    pub fn handshake(&self, version: Version, resumed: bool, hello_retry: bool) {
        self.handshakes[version as usize][resumed as usize].fetch_add(1, Ordering::Relaxed);
        if hello_retry {
            self.hello_retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn failure(&self, reason: FailureReason) {
        self.failures[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A connection cut because its request came too slowly: past `--request-timeout`
    /// (`rate == false`) or below `--min-header-rate`.
    pub fn slow_request(&self, rate: bool) {
        self.slow_requests[rate as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// An HTTP/2 connection cut for a slow head or too many cancelled streams.
    pub fn h2_cut(&self, why: crate::h2bounds::Cut) {
        self.h2_cuts[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_opened(&self) {
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        self.connections_active.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections_active.fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection parked (`true`) or woke up again (`false`).
    pub fn parked(&self, parked: bool) {
        let d = if parked { 1 } else { -1 };
        self.connections_parked.fetch_add(d, Ordering::Relaxed);
    }

    pub fn parked_connections(&self) -> i64 {
        self.connections_parked.load(Ordering::Relaxed)
    }

    pub fn connection_rejected(&self) {
        self.connections_rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub fn bytes_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn bytes_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn ticket(&self, result: &str) {
        if let Some(i) = TICKET_RESULTS.iter().position(|r| *r == result) {
            self.tickets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A ClientHello offered early data.
    pub fn early_offered(&self) {
        self.early_offered.fetch_add(1, Ordering::Relaxed);
    }

    /// What became of offered early data: `accepted`, `rejected` or `replay_refused`.
    pub fn early_result(&self, result: &str) {
        if let Some(i) = EARLY_RESULTS.iter().position(|r| *r == result) {
            self.early_results[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request received in early data was served, or answered `425 Too Early`.
    pub fn early_request(&self, too_early: bool) {
        self.early_requests[too_early as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn request(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.requests[class].fetch_add(1, Ordering::Relaxed);
    }

    pub fn reload(&self, ok: bool) {
        let c = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn active_connections(&self) -> i64 {
        self.connections_active.load(Ordering::Relaxed)
    }

    pub fn handshakes_of(&self, version: Version, resumed: bool) -> u64 {
        self.handshakes[version as usize][resumed as usize].load(Ordering::Relaxed)
    }

    /// The agent's families, for its collector: the atomics, the session store's stats and the
    /// crypto meter, all read at scrape time.
    pub fn encode(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);

        counters(
            e,
            "baton_handshakes",
            "Completed TLS handshakes.",
            [Version::Tls12, Version::Tls13]
                .into_iter()
                .flat_map(|version| {
                    [(false, "full"), (true, "resumed")]
                        .into_iter()
                        .map(move |(resumed, kind)| {
                            let n = self.handshakes_of(version, resumed);
                            (HandshakeLabels { version, kind }, n)
                        })
                }),
        )?;
        counter(
            e,
            "baton_hello_retry_requests",
            "Full handshakes that needed a HelloRetryRequest.",
            load(&self.hello_retries),
        )?;
        counters(
            e,
            "baton_handshake_failures",
            "TLS handshakes that failed, by reason.",
            FailureReason::ALL.into_iter().map(|reason| {
                (
                    ReasonLabel { reason },
                    load(&self.failures[reason as usize]),
                )
            }),
        )?;

        self.handoff.encode(e)?;

        gauge(
            e,
            "baton_connections_active",
            "TCP connections being served.",
            self.active_connections(),
        )?;
        gauge(
            e,
            "baton_connections_parked",
            "HTTP/1.1 connections idle between requests and parked: on the record layer, their TLS buffers and working state given back.",
            self.parked_connections(),
        )?;
        counter(
            e,
            "baton_connections",
            "TCP connections accepted.",
            load(&self.connections_total),
        )?;
        counter(
            e,
            "baton_connections_rejected",
            "TCP connections closed at accept because --max-connections was reached.",
            load(&self.connections_rejected),
        )?;
        counters(
            e,
            "baton_slow_requests",
            "Connections cut because a request came too slowly: past --request-timeout (deadline) or below --min-header-rate (rate).",
            ["deadline", "rate"]
                .into_iter()
                .zip(&self.slow_requests)
                .map(|(reason, n)| (SlowLabel { reason }, load(n))),
        )?;
        counters(
            e,
            "baton_h2_connections_cut",
            "HTTP/2 connections cut (GOAWAY, then closed): a request head part-way in past --header-timeout (header_timeout) or below --min-header-rate (header_rate), or more streams cancelled than --h2-max-resets (resets).",
            crate::h2bounds::Cut::ALL.into_iter().map(|why| {
                (
                    SlowLabel { reason: why.label() },
                    load(&self.h2_cuts[why as usize]),
                )
            }),
        )?;
        counters(
            e,
            "baton_bytes",
            "Bytes on the wire (TLS records), by direction.",
            [
                (DirectionLabel { direction: "in" }, load(&self.bytes_in)),
                (DirectionLabel { direction: "out" }, load(&self.bytes_out)),
            ],
        )?;
        counters(
            e,
            "baton_http_requests",
            "HTTP responses sent, by status class.",
            STATUS_CLASSES
                .into_iter()
                .zip(&self.requests)
                .map(|(code, n)| (CodeLabel { code }, load(n))),
        )?;
        counters(
            e,
            "baton_tickets",
            "Session tickets issued, opened, rejected.",
            TICKET_RESULTS
                .into_iter()
                .zip(&self.tickets)
                .map(|(result, n)| (ResultLabel { result }, load(n))),
        )?;

        counter(
            e,
            "baton_early_data_offered",
            "TLS 1.3 ClientHellos that offered early data (0-RTT).",
            load(&self.early_offered),
        )?;
        counters(
            e,
            "baton_early_data",
            "Offered early data by outcome: accepted; rejected (no single-use guarantee here: early data off, store down or slow, a connection that may migrate); replay_refused (the ticket was taken already, or its age is outside the window).",
            EARLY_RESULTS
                .into_iter()
                .zip(&self.early_results)
                .map(|(result, n)| (ResultLabel { result }, load(n))),
        )?;
        counters(
            e,
            "baton_early_data_requests",
            "HTTP requests received in early data, before the handshake completed: served (marked Early-Data: 1) or too_early (425).",
            ["served", "too_early"]
                .into_iter()
                .zip(&self.early_requests)
                .map(|(result, n)| (ResultLabel { result }, load(n))),
        )?;

        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(store) = store {
            let s = store.stats();
            gauge(
                e,
                "baton_session_cache_entries",
                "Sessions in the session cache.",
                s.entries as i64,
            )?;
            counters(
                e,
                "baton_session_cache_lookups",
                "Session cache lookups, by result.",
                [
                    (ResultLabel { result: "hit" }, s.hits),
                    (ResultLabel { result: "miss" }, s.misses),
                ],
            )?;
            counters(
                e,
                "baton_session_cache_removed",
                "Sessions dropped from the cache, by cause.",
                [
                    (CauseLabel { cause: "evicted" }, s.evictions),
                    (CauseLabel { cause: "expired" }, s.expirations),
                ],
            )?;
            counters(
                e,
                "baton_session_store_events",
                "Shared session store (peers, Redis) traffic and faults, by event.",
                [
                    ("sent", s.sent),
                    ("received", s.received),
                    ("dropped", s.dropped),
                    ("rejected", s.rejected),
                    ("refused", s.refused),
                    ("fallback", s.fallbacks),
                    ("reconnected", s.reconnects),
                    ("unacknowledged", s.unacknowledged),
                ]
                .map(|(event, n)| (EventLabel { event }, n)),
            )?;
        }

        // In-process crypto from the meter, and time waiting on the key signer as `sign_remote`.
        let remote = crate::keysigner::remote_wait();
        counters(
            e,
            "baton_crypto_seconds",
            "Seconds spent in cryptography, by operation.",
            CryptoOp::ALL
                .into_iter()
                .map(|op| (op.label(), METER.seconds(op)))
                .chain(remote.map(|(secs, _)| ("sign_remote", secs)))
                .map(|(op, v)| (OpLabel { op }, v)),
        )?;
        counters(
            e,
            "baton_crypto_operations",
            "Cryptographic operations (records for bulk), by operation.",
            CryptoOp::ALL
                .into_iter()
                .map(|op| (op.label(), METER.calls(op)))
                .chain(remote.map(|(_, calls)| ("sign_remote", calls)))
                .map(|(op, v)| (OpLabel { op }, v)),
        )?;
        crate::keysigner::encode(e)?;

        counters(
            e,
            "baton_reloads",
            "SIGHUP reloads of certificates and ticket keys, by result.",
            [
                (ResultLabel { result: "ok" }, load(&self.reloads_ok)),
                (ResultLabel { result: "failed" }, load(&self.reloads_failed)),
            ],
        )
    }
}

/// Everything an agent's /metrics shows, read at scrape time: its counters, its backends'
/// (`--upstream`), its agent link's, and (registered beside it) the process's CPU and memory.
#[derive(Debug)]
pub struct Collected {
    pub metrics: Arc<Metrics>,
    /// Every pool's upstreams.
    pub upstreams: Vec<Arc<crate::upstream::Backends>>,
    pub link: Option<Arc<baton_link::LinkStats>>,
}

impl Collected {
    /// A registry of this and the process collector, for `baton_ops::serve_metrics`.
    pub fn registry(self) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        registry.register_collector(Box::new(baton_ops::metrics::ProcessCollector));
        registry
    }
}

impl Collector for Collected {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.metrics.encode(&mut e)?;
        crate::upstream::encode_all(&self.upstreams, &mut e)?;
        if let Some(l) = &self.link {
            l.encode(&mut e)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct HandshakeLabels {
    version: Version,
    kind: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct ReasonLabel {
    reason: FailureReason,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct SlowLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct EventLabel {
    event: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

impl EncodeLabelValue for Version {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            Version::Tls12 => "1.2",
            Version::Tls13 => "1.3",
        })
    }
}

impl EncodeLabelValue for FailureReason {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.label())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What `encode` writes, as /metrics would show it.
    pub(crate) fn encoded(
        f: impl Fn(&mut DescriptorEncoder) -> std::fmt::Result + Send + Sync + 'static,
    ) -> String {
        struct C<F>(F);
        impl<F> std::fmt::Debug for C<F> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("test collector")
            }
        }
        impl<F: Fn(&mut DescriptorEncoder) -> std::fmt::Result + Send + Sync + 'static> Collector for C<F> {
            fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
                (self.0)(&mut e)
            }
        }
        let mut registry = Registry::default();
        registry.register_collector(Box::new(C(f)));
        baton_ops::metrics::encode(&registry)
    }

    #[test]
    fn renders_counted_values() {
        let m = Arc::new(Metrics::default());
        m.handshake(Version::Tls13, false, false);
        m.handshake(Version::Tls13, true, false);
        m.handshake(Version::Tls13, true, false);
        m.handshake(Version::Tls12, false, true);
        m.failure(FailureReason::Timeout);
        m.request(200);
        m.request(404);
        let text = Collected {
            metrics: m,
            upstreams: Vec::new(),
            link: None,
        };
        let text = baton_ops::metrics::encode(&text.registry());
        for line in [
            "baton_handshakes_total{version=\"1.3\",kind=\"full\"} 1",
            "baton_handshakes_total{version=\"1.3\",kind=\"resumed\"} 2",
            "baton_handshakes_total{version=\"1.2\",kind=\"full\"} 1",
            "baton_hello_retry_requests_total 1",
            "baton_handshake_failures_total{reason=\"timeout\"} 1",
            "baton_http_requests_total{code=\"2xx\"} 1",
            "baton_http_requests_total{code=\"4xx\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(text.contains("baton_crypto_seconds_total{op=\"sign\"}"));
        assert!(text.contains("process_cpu_seconds_total "));
    }

    #[test]
    fn classifies_handshake_errors() {
        let tls = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        assert_eq!(
            FailureReason::of(&tls(rustls::Error::PeerIncompatible(
                rustls::PeerIncompatible::NoCipherSuitesInCommon
            ))),
            FailureReason::Incompatible
        );
        assert_eq!(
            FailureReason::of(&tls(rustls::Error::NoCertificatesPresented)),
            FailureReason::ClientCert
        );
        assert_eq!(
            FailureReason::of(&std::io::ErrorKind::UnexpectedEof.into()),
            FailureReason::Eof
        );
        let signer = baton_signer::client::SignFailed {
            key: "abcd".into(),
            cause: baton_signer::client::ClientError::Timeout(std::time::Duration::from_secs(1)),
        };
        let other = rustls::OtherError(std::sync::Arc::new(signer));
        assert_eq!(
            FailureReason::of(&tls(rustls::Error::Other(other))),
            FailureReason::Signer
        );
        let unrelated = rustls::OtherError(std::sync::Arc::new(std::fmt::Error));
        assert_eq!(
            FailureReason::of(&tls(rustls::Error::Other(unrelated))),
            FailureReason::Other
        );
    }
}
