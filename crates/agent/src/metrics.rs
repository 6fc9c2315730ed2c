//! The agent's counters and their Prometheus text rendering.
//!
//! Counters are plain atomics with a fixed label set each, so counting on the hot path is one
//! relaxed add and rendering needs no registry.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use baton_session::SessionStore;

use baton_ops::family;

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
    connections_active: AtomicI64,
    connections_total: AtomicU64,
    connections_rejected: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    tickets: [AtomicU64; 4],
    requests: [AtomicU64; 5],
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// Session migration (CSSL-SF).
    pub handoff: crate::handoff::metrics::HandoffMetrics,
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

    pub fn connection_opened(&self) {
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        self.connections_active.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections_active.fetch_sub(1, Ordering::Relaxed);
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

    /// Prometheus text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);

        family(
            &mut out,
            "baton_handshakes_total",
            "counter",
            "Completed TLS handshakes.",
        );
        for (vi, v) in ["1.2", "1.3"].iter().enumerate() {
            for (ki, k) in ["full", "resumed"].iter().enumerate() {
                let n = load(&self.handshakes[vi][ki]);
                let _ = writeln!(
                    out,
                    "baton_handshakes_total{{version=\"{v}\",kind=\"{k}\"}} {n}"
                );
            }
        }
        family(
            &mut out,
            "baton_hello_retry_requests_total",
            "counter",
            "Full handshakes that needed a HelloRetryRequest.",
        );
        let _ = writeln!(
            out,
            "baton_hello_retry_requests_total {}",
            load(&self.hello_retries)
        );

        family(
            &mut out,
            "baton_handshake_failures_total",
            "counter",
            "TLS handshakes that failed, by reason.",
        );
        for r in FailureReason::ALL {
            let n = load(&self.failures[r as usize]);
            let _ = writeln!(
                out,
                "baton_handshake_failures_total{{reason=\"{}\"}} {n}",
                r.label()
            );
        }

        self.handoff.render(&mut out);

        family(
            &mut out,
            "baton_connections_active",
            "gauge",
            "TCP connections being served.",
        );
        let _ = writeln!(
            out,
            "baton_connections_active {}",
            self.active_connections()
        );
        family(
            &mut out,
            "baton_connections_total",
            "counter",
            "TCP connections accepted.",
        );
        let _ = writeln!(
            out,
            "baton_connections_total {}",
            load(&self.connections_total)
        );
        family(
            &mut out,
            "baton_connections_rejected_total",
            "counter",
            "TCP connections closed at accept because --max-connections was reached.",
        );
        let _ = writeln!(
            out,
            "baton_connections_rejected_total {}",
            load(&self.connections_rejected)
        );
        family(
            &mut out,
            "baton_slow_requests_total",
            "counter",
            "Connections cut because a request came too slowly: past --request-timeout (deadline) or below --min-header-rate (rate).",
        );
        for (i, reason) in ["deadline", "rate"].iter().enumerate() {
            let _ = writeln!(
                out,
                "baton_slow_requests_total{{reason=\"{reason}\"}} {}",
                load(&self.slow_requests[i])
            );
        }

        family(
            &mut out,
            "baton_bytes_total",
            "counter",
            "Bytes on the wire (TLS records), by direction.",
        );
        let _ = writeln!(
            out,
            "baton_bytes_total{{direction=\"in\"}} {}",
            load(&self.bytes_in)
        );
        let _ = writeln!(
            out,
            "baton_bytes_total{{direction=\"out\"}} {}",
            load(&self.bytes_out)
        );

        family(
            &mut out,
            "baton_http_requests_total",
            "counter",
            "HTTP responses sent, by status class.",
        );
        for (i, c) in STATUS_CLASSES.iter().enumerate() {
            let _ = writeln!(
                out,
                "baton_http_requests_total{{code=\"{c}\"}} {}",
                load(&self.requests[i])
            );
        }

        family(
            &mut out,
            "baton_tickets_total",
            "counter",
            "Session tickets issued, opened, rejected.",
        );
        for (i, r) in TICKET_RESULTS.iter().enumerate() {
            let _ = writeln!(
                out,
                "baton_tickets_total{{result=\"{r}\"}} {}",
                load(&self.tickets[i])
            );
        }

        if let Some(store) = self
            .store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let s = store.stats();
            family(
                &mut out,
                "baton_session_cache_entries",
                "gauge",
                "Sessions in the session cache.",
            );
            let _ = writeln!(out, "baton_session_cache_entries {}", s.entries);
            family(
                &mut out,
                "baton_session_cache_lookups_total",
                "counter",
                "Session cache lookups, by result.",
            );
            let _ = writeln!(
                out,
                "baton_session_cache_lookups_total{{result=\"hit\"}} {}",
                s.hits
            );
            let _ = writeln!(
                out,
                "baton_session_cache_lookups_total{{result=\"miss\"}} {}",
                s.misses
            );
            family(
                &mut out,
                "baton_session_cache_removed_total",
                "counter",
                "Sessions dropped from the cache, by cause.",
            );
            let _ = writeln!(
                out,
                "baton_session_cache_removed_total{{cause=\"evicted\"}} {}",
                s.evictions
            );
            let _ = writeln!(
                out,
                "baton_session_cache_removed_total{{cause=\"expired\"}} {}",
                s.expirations
            );
            family(
                &mut out,
                "baton_session_store_events_total",
                "counter",
                "Shared session store (peers, Redis) traffic and faults, by event.",
            );
            for (event, n) in [
                ("sent", s.sent),
                ("received", s.received),
                ("dropped", s.dropped),
                ("rejected", s.rejected),
                ("refused", s.refused),
                ("fallback", s.fallbacks),
            ] {
                let _ = writeln!(
                    out,
                    "baton_session_store_events_total{{event=\"{event}\"}} {n}"
                );
            }
        }

        family(
            &mut out,
            "baton_crypto_seconds_total",
            "counter",
            "Seconds spent in cryptography, by operation.",
        );
        for op in CryptoOp::ALL {
            let _ = writeln!(
                out,
                "baton_crypto_seconds_total{{op=\"{}\"}} {:.9}",
                op.label(),
                METER.seconds(op)
            );
        }
        crate::keysigner::render_crypto(&mut out, true);
        family(
            &mut out,
            "baton_crypto_operations_total",
            "counter",
            "Cryptographic operations (records for bulk), by operation.",
        );
        for op in CryptoOp::ALL {
            let _ = writeln!(
                out,
                "baton_crypto_operations_total{{op=\"{}\"}} {}",
                op.label(),
                METER.calls(op)
            );
        }
        crate::keysigner::render_crypto(&mut out, false);
        crate::keysigner::render(&mut out);

        family(
            &mut out,
            "baton_reloads_total",
            "counter",
            "SIGHUP reloads of certificates and ticket keys, by result.",
        );
        let _ = writeln!(
            out,
            "baton_reloads_total{{result=\"ok\"}} {}",
            load(&self.reloads_ok)
        );
        let _ = writeln!(
            out,
            "baton_reloads_total{{result=\"failed\"}} {}",
            load(&self.reloads_failed)
        );

        baton_ops::render_process(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counted_values() {
        let m = Metrics::default();
        m.handshake(Version::Tls13, false, false);
        m.handshake(Version::Tls13, true, false);
        m.handshake(Version::Tls13, true, false);
        m.handshake(Version::Tls12, false, true);
        m.failure(FailureReason::Timeout);
        m.request(200);
        m.request(404);
        let text = m.render();
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
