//! The agent side's link counters, rendered next to the agent's metrics.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

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

    /// Prometheus text for the three families.
    pub fn render_prometheus(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = write!(
            out,
            "# HELP baton_link_connections_active Authenticated agent-link connections from dispatchers.\n\
             # TYPE baton_link_connections_active gauge\n\
             baton_link_connections_active {}\n\
             # HELP baton_link_auth_failures_total Link connections closed before authenticating (wrong key, stall, garbage, over the limit).\n\
             # TYPE baton_link_auth_failures_total counter\n\
             baton_link_auth_failures_total {}\n\
             # HELP baton_link_streams_total Client streams received over the agent link.\n\
             # TYPE baton_link_streams_total counter\n\
             baton_link_streams_total {}\n",
            self.connections_active(),
            l(&self.auth_failures) + l(&self.refused),
            l(&self.streams),
        );
    }
}
