//! Migration counters: sessions handed out and taken in, failures by reason, and how long a
//! migration took from the handshake agent's Freeze to the dispatcher's verdict.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_ops::metrics::{counter, counters, histogram};
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder,
};

/// Why a migration did not happen (the connection was still served: by the handshake agent,
/// or, for refused imports, by the dispatcher's fallback to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoffFailure {
    /// Handshake agent: no TLS 1.3 traffic secret was captured (KeyUpdate would be impossible).
    NoSecrets,
    /// Handshake agent: the client sent more than a session object carries before its cut.
    TooMuchPlaintext,
    /// Handshake agent: extraction or sealing failed.
    Export,
    /// Handshake agent: the dispatcher's answer did not come in time, or broke the protocol.
    Protocol,
    /// Handshake agent: the home agent did not take it; served here from the record layer.
    FellBack,
    /// Home agent: the object did not open (key, tampering, wrong agent).
    ImportSeal,
    /// Home agent: the object had expired.
    ImportExpired,
    /// Home agent: already imported once.
    ImportReplay,
    /// Home agent: the object opened but was unusable.
    ImportInvalid,
    /// Home agent: Ready was sent, but the dispatcher aborted, reset the stream or did not
    /// commit in time; the keys were dropped unused.
    Uncommitted,
}

impl HandoffFailure {
    const ALL: [HandoffFailure; 10] = [
        HandoffFailure::NoSecrets,
        HandoffFailure::TooMuchPlaintext,
        HandoffFailure::Export,
        HandoffFailure::Protocol,
        HandoffFailure::FellBack,
        HandoffFailure::ImportSeal,
        HandoffFailure::ImportExpired,
        HandoffFailure::ImportReplay,
        HandoffFailure::ImportInvalid,
        HandoffFailure::Uncommitted,
    ];

    fn label(self) -> &'static str {
        match self {
            HandoffFailure::NoSecrets => "no_secrets",
            HandoffFailure::TooMuchPlaintext => "too_much_plaintext",
            HandoffFailure::Export => "export",
            HandoffFailure::Protocol => "protocol",
            HandoffFailure::FellBack => "fell_back",
            HandoffFailure::ImportSeal => "import_seal",
            HandoffFailure::ImportExpired => "import_expired",
            HandoffFailure::ImportReplay => "import_replay",
            HandoffFailure::ImportInvalid => "import_invalid",
            HandoffFailure::Uncommitted => "uncommitted",
        }
    }
}

/// Upper bounds of the migration time histogram, in seconds.
const BUCKETS: [f64; 10] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

#[derive(Debug, Default)]
pub struct HandoffMetrics {
    out: AtomicU64,
    into: AtomicU64,
    declined: AtomicU64,
    failures: [AtomicU64; 10],
    buckets: [AtomicU64; 10],
    count: AtomicU64,
    sum_ns: AtomicU64,
    /// [export, import]: thread CPU of the synchronous migration work.
    cpu_ns: [AtomicU64; 2],
    /// Sessions moved because their agent drained: [out, in].
    drain_moved: [AtomicU64; 2],
    /// Connections a drain closed instead of moving them.
    drain_closed: AtomicU64,
}

/// Why a session moved between agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// After a full handshake away from the client's home agent (CSSL-SF).
    Handshake,
    /// Its agent drained.
    Drain,
}

/// Which side of a migration spent CPU.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    /// Decrypting up to the cut, extracting, building the object, sealing.
    Export = 0,
    /// Opening the object and building the record layer.
    Import = 1,
}

impl HandoffMetrics {
    pub fn migrated_out(&self, took: Duration, why: Why) {
        self.out.fetch_add(1, Ordering::Relaxed);
        if why == Why::Drain {
            self.drain_moved[0].fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn cpu(&self, side: Side, spent: Duration) {
        self.cpu_ns[side as usize].fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn migrated_in(&self, why: Why) {
        self.into.fetch_add(1, Ordering::Relaxed);
        if why == Why::Drain {
            self.drain_moved[1].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A drain closed a live connection (it could not move: not reached through a
    /// dispatcher, HTTP/2, nowhere to go, or the move failed).
    pub fn drain_closed(&self) {
        self.drain_closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Offered, but this agent is the home agent already.
    pub fn declined(&self) {
        self.declined.fetch_add(1, Ordering::Relaxed);
    }

    pub fn failure(&self, why: HandoffFailure) {
        self.failures[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn out_total(&self) -> u64 {
        self.out.load(Ordering::Relaxed)
    }

    /// The migration families, for the agent's collector (atomics read at scrape time).
    pub fn encode(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counters(
            e,
            "baton_sessions_migrated",
            "TLS sessions moved to their home agent after the handshake (CSSL-SF): out = handed \
             off by this agent, in = imported by it.",
            [
                (DirectionLabel { direction: "out" }, load(&self.out)),
                (DirectionLabel { direction: "in" }, load(&self.into)),
            ],
        )?;
        let handshake = |i: usize| load(if i == 0 { &self.out } else { &self.into });
        counters(
            e,
            "baton_sessions_moved",
            "Live TLS sessions moved between agents, by direction and reason: handshake = after a \
             full handshake away from the client's home agent (CSSL-SF), drain = because their \
             agent drained (SIGTERM or the dispatcher's admin drain).",
            [("out", 0), ("in", 1)]
                .into_iter()
                .flat_map(|(direction, i)| {
                    let drain = load(&self.drain_moved[i]);
                    [
                        (
                            MovedLabel {
                                direction,
                                reason: "handshake",
                            },
                            handshake(i).saturating_sub(drain),
                        ),
                        (
                            MovedLabel {
                                direction,
                                reason: "drain",
                            },
                            drain,
                        ),
                    ]
                }),
        )?;
        counter(
            e,
            "baton_drain_closed_connections",
            "Live connections this agent closed when it drained instead of moving them.",
            load(&self.drain_closed),
        )?;
        counter(
            e,
            "baton_migration_declined",
            "Connections offered for migration whose home agent was this agent.",
            load(&self.declined),
        )?;
        counters(
            e,
            "baton_migration_failures",
            "Migrations that did not happen, by reason; the connection was served all the same.",
            HandoffFailure::ALL.iter().map(|&reason| {
                (
                    FailureLabel { reason },
                    load(&self.failures[reason as usize]),
                )
            }),
        )?;
        counters(
            e,
            "baton_migration_cpu_seconds",
            "Thread CPU of the migration work itself (export: decrypting up to the cut, \
             extraction, sealing; import: opening, record layer set-up), not the I/O around it.",
            ["export", "import"]
                .iter()
                .zip(&self.cpu_ns)
                .map(|(&side, ns)| (SideLabel { side }, load(ns) as f64 / 1e9)),
        )?;
        let cumulative: Vec<u64> = self.buckets.iter().map(load).collect();
        histogram(
            e,
            "baton_migration_seconds",
            "Time from the handshake agent's cut to the dispatcher's verdict, for \
             sessions migrated out.",
            &BUCKETS,
            &cumulative,
            load(&self.count),
            load(&self.sum_ns) as f64 / 1e9,
        )
    }
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct MovedLabel {
    direction: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct FailureLabel {
    reason: HandoffFailure,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct SideLabel {
    side: &'static str,
}

impl EncodeLabelValue for HandoffFailure {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = HandoffMetrics::default();
        m.migrated_out(Duration::from_micros(300), Why::Handshake);
        m.migrated_out(Duration::from_millis(20), Why::Drain);
        m.migrated_in(Why::Drain);
        m.drain_closed();
        m.failure(HandoffFailure::ImportReplay);
        let out = crate::metrics::tests::encoded(move |e| m.encode(e));
        assert!(
            out.contains("baton_migration_seconds_bucket{le=\"0.0005\"} 1\n"),
            "{out}"
        );
        assert!(out.contains("baton_migration_seconds_bucket{le=\"0.025\"} 2\n"));
        assert!(out.contains("baton_migration_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(out.contains("baton_migration_seconds_bucket{le=\"1.0\"} 2\n"));
        assert!(out.contains("baton_migration_seconds_count 2\n"));
        assert!(out.contains("baton_sessions_migrated_total{direction=\"out\"} 2\n"));
        assert!(out.contains("baton_migration_failures_total{reason=\"import_replay\"} 1\n"));
        assert!(
            out.contains("baton_sessions_moved_total{direction=\"out\",reason=\"handshake\"} 1\n")
        );
        assert!(out.contains("baton_sessions_moved_total{direction=\"out\",reason=\"drain\"} 1\n"));
        assert!(out.contains("baton_sessions_moved_total{direction=\"in\",reason=\"drain\"} 1\n"));
        assert!(out.contains("baton_drain_closed_connections_total 1\n"));
    }
}
