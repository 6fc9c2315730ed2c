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
}

impl LinkStats {
    pub fn connections_active(&self) -> i64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn auth_failures(&self) -> u64 {
        self.auth_failures.load(Ordering::Relaxed)
    }

    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// The three `baton_link_*` families, for the agent's collector (read at scrape time).
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
        ConstCounter::new(l(&self.streams)).encode(e.encode_descriptor(
            "baton_link_streams",
            "Client streams received over the agent link.",
            None,
            MetricType::Counter,
        )?)
    }
}
