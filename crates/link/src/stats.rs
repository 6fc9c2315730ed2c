//! The agent side's link counters, encoded next to the agent's metrics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

#[derive(Debug, Default)]
pub struct LinkStats {
    pub(crate) connections: AtomicI64,
    pub(crate) auth_failures: AtomicU64,
    pub(crate) streams: AtomicU64,
    pub(crate) refused: AtomicU64,
    /// Connections from outside `--link-allow`, closed at accept.
    pub(crate) disallowed: AtomicU64,
    /// Connections still authenticating pushed out by a newcomer.
    pub(crate) evicted: AtomicU64,
    pub(crate) reattached: AtomicU64,
    pub(crate) reattach_failed: AtomicU64,
    /// Link connections torn down for a record that did not open.
    pub(crate) integrity_failures: AtomicU64,
}

impl LinkStats {
    pub fn connections_active(&self) -> i64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn auth_failures(&self) -> u64 {
        self.auth_failures.load(Ordering::Relaxed)
    }

    /// Connections from outside `--link-allow`, closed at accept.
    pub fn disallowed(&self) -> u64 {
        self.disallowed.load(Ordering::Relaxed)
    }

    /// Connections still authenticating pushed out by a newcomer.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Streams handed over by a dispatcher that continued on its successor's stream.
    pub fn reattached(&self) -> u64 {
        self.reattached.load(Ordering::Relaxed)
    }

    /// Handovers that did not continue: nobody re-attached before the deadline, the agent
    /// could not wait (a token already waiting, too many waiting), or a re-attach stream
    /// named a token nobody waits for (refused).
    pub fn reattach_failed(&self) -> u64 {
        self.reattach_failed.load(Ordering::Relaxed)
    }

    /// Link connections torn down because a record on them did not open (changed, replayed,
    /// inserted or dropped bytes, or not from the dispatcher that made the link).
    pub fn integrity_failures(&self) -> u64 {
        self.integrity_failures.load(Ordering::Relaxed)
    }

    /// The `baton_link_*` families, for the agent's collector (read at scrape time).
    pub fn encode(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConstGauge::new(self.connections_active()).encode(e.encode_descriptor(
            "baton_link_connections_active",
            "Authenticated agent-link connections from dispatchers.",
            None,
            MetricType::Gauge,
        )?)?;
        ConstCounter::new(l(&self.auth_failures) + l(&self.refused)).encode(e.encode_descriptor(
            "baton_link_auth_failures",
            "Link connections closed before authenticating (wrong key, stall, garbage, over the limit).",
            None,
            MetricType::Counter,
        )?)?;
        let mut family = e.encode_descriptor(
            "baton_link_connections_shut_out",
            "Link connections closed before authenticating for who they were: from outside \
             --link-allow (disallowed), or pushed out by a newcomer while still authenticating \
             (evicted).",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in [("disallowed", &self.disallowed), ("evicted", &self.evicted)] {
            ConstCounter::new(l(n)).encode(family.encode_family(&[("reason", reason)])?)?;
        }
        ConstCounter::new(l(&self.integrity_failures)).encode(e.encode_descriptor(
            "baton_link_integrity_failures",
            "Link connections torn down because a message on them did not authenticate (changed, replayed, inserted or dropped bytes); the dispatcher reconnects.",
            None,
            MetricType::Counter,
        )?)?;
        ConstCounter::new(l(&self.streams)).encode(e.encode_descriptor(
            "baton_link_streams",
            "Client streams received over the agent link (re-attach streams not included).",
            None,
            MetricType::Counter,
        )?)?;
        let mut family = e.encode_descriptor(
            "baton_link_streams_reattached",
            "Streams a dispatcher handed over to its successor: continued on the successor's stream (reattached), or not (failed: nobody re-attached in time, or a re-attach was refused).",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in [
            ("reattached", &self.reattached),
            ("failed", &self.reattach_failed),
        ] {
            ConstCounter::new(l(n)).encode(family.encode_family(&[("outcome", outcome)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Stats(std::sync::Arc<LinkStats>);

    impl Collector for Stats {
        fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            self.0.encode(&mut e)
        }
    }

    #[test]
    fn reattach_outcomes_are_one_labelled_family() {
        let stats = std::sync::Arc::new(LinkStats::default());
        stats.reattached.fetch_add(3, Ordering::Relaxed);
        stats.reattach_failed.fetch_add(2, Ordering::Relaxed);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Stats(stats)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("# TYPE baton_link_streams_reattached counter\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_link_streams_reattached_total{outcome=\"reattached\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("baton_link_streams_reattached_total{outcome=\"failed\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("baton_link_streams_total 0\n"), "{text}");
        assert!(
            text.contains("baton_link_integrity_failures_total 0\n"),
            "{text}"
        );
    }
}
