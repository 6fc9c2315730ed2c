//! The dispatcher's counters: atomics on the connection path, encoded by a collector at
//! scrape time (with the router's per-agent health and open connections).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_ops::metrics::{counter, counters, gauges};
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder,
};

use crate::route::Reason;

/// How reading a connection's first bytes ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloOutcome {
    Parsed,
    /// Not a TLS ClientHello (or malformed): forwarded anyway, the agent answers it.
    Unparsed,
    /// Over the size bound: forwarded as far as read, routed without a hello.
    TooLarge,
    Timeout,
    /// Closed before a complete hello.
    Closed,
}

impl HelloOutcome {
    const ALL: [HelloOutcome; 5] = [
        HelloOutcome::Parsed,
        HelloOutcome::Unparsed,
        HelloOutcome::TooLarge,
        HelloOutcome::Timeout,
        HelloOutcome::Closed,
    ];

    fn label(self) -> &'static str {
        match self {
            HelloOutcome::Parsed => "parsed",
            HelloOutcome::Unparsed => "unparsed",
            HelloOutcome::TooLarge => "too_large",
            HelloOutcome::Timeout => "timeout",
            HelloOutcome::Closed => "closed",
        }
    }
}

const HANDOFF_OUTCOMES: [&str; 4] = ["migrated", "declined", "aborted", "fell_back"];
/// How a move asked for by a draining agent (Leave) ended: `stayed` when there was no agent
/// to move to.
const DRAIN_OUTCOMES: [&str; 4] = ["migrated", "stayed", "aborted", "fell_back"];
/// What became of a live connection in a dispatcher handover: `passed` to the successor (the
/// old process), `taken` over from the predecessor (the successor), `kept` (re-attached here
/// after the successor failed), `lost` (closed: no re-attach, the agent closed it, or a
/// deadline).
pub const HANDOVER_OUTCOMES: [&str; 4] = ["passed", "taken", "kept", "lost"];

#[derive(Debug)]
pub struct Metrics {
    /// [agent][reason]
    routed: Vec<[AtomicU64; Reason::ALL.len()]>,
    /// [migrated, declined, aborted, fell_back]
    handoffs: [AtomicU64; 4],
    /// [migrated, stayed, aborted, fell_back]
    drain_moves: [AtomicU64; 4],
    handovers: [AtomicU64; 4],
    connect_failures: Vec<AtomicU64>,
    hello: [AtomicU64; 5],
    no_agent: AtomicU64,
    rejected: AtomicU64,
    proxy_refused: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl Metrics {
    pub fn new(agents: usize) -> Self {
        Self {
            routed: (0..agents).map(|_| Default::default()).collect(),
            connect_failures: (0..agents).map(|_| AtomicU64::new(0)).collect(),
            hello: Default::default(),
            handoffs: Default::default(),
            drain_moves: Default::default(),
            handovers: Default::default(),
            no_agent: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            proxy_refused: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }

    pub fn routed(&self, agent: usize, reason: Reason) {
        if let Some(r) = self.routed.get(agent) {
            let i = Reason::ALL.iter().position(|x| *x == reason).unwrap_or(0);
            r[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A removed agent's slot was taken by a new agent: its per-agent counters start over.
    pub fn reset_slot(&self, slot: usize) {
        if let Some(r) = self.routed.get(slot) {
            r.iter().for_each(|c| c.store(0, Ordering::Relaxed));
        }
        if let Some(c) = self.connect_failures.get(slot) {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub fn connect_failed(&self, agent: usize) {
        if let Some(c) = self.connect_failures.get(agent) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn hello(&self, outcome: HelloOutcome) {
        let i = HelloOutcome::ALL
            .iter()
            .position(|x| *x == outcome)
            .unwrap_or(0);
        self.hello[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn no_agent(&self) {
        self.no_agent.fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection refused because it came from outside `--proxy-protocol-from`.
    pub fn proxy_refused(&self) {
        self.proxy_refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn bytes(&self, from_client: u64, to_client: u64) {
        self.bytes_in.fetch_add(from_client, Ordering::Relaxed);
        self.bytes_out.fetch_add(to_client, Ordering::Relaxed);
    }

    /// How a `handoff` connection's migration ended.
    pub fn handoff(&self, outcome: baton_migrate::Outcome) {
        let label = outcome.label();
        let i = HANDOFF_OUTCOMES
            .iter()
            .position(|l| *l == label)
            .unwrap_or(0);
        self.handoffs[i].fetch_add(1, Ordering::Relaxed);
    }

    /// How a move asked for by a draining agent ended (`None`: it stayed, nowhere to go).
    pub fn drain_move(&self, outcome: Option<baton_migrate::Outcome>) {
        let label = outcome.map_or("stayed", baton_migrate::Outcome::label);
        let i = DRAIN_OUTCOMES.iter().position(|l| *l == label).unwrap_or(0);
        self.drain_moves[i].fetch_add(1, Ordering::Relaxed);
    }

    /// One connection's handover, by [`HANDOVER_OUTCOMES`] label.
    pub fn handover(&self, outcome: &'static str) {
        let i = HANDOVER_OUTCOMES
            .iter()
            .position(|l| *l == outcome)
            .unwrap_or(3);
        self.handovers[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The families, for a collector: `agents` are the agents on the roster as the router
    /// sees them at scrape time, `(slot, id, up, active connections)`; series are labelled by
    /// agent id.
    pub fn encode(
        &self,
        e: &mut DescriptorEncoder,
        agents: &[(usize, u16, bool, u32)],
    ) -> Result<(), std::fmt::Error> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counters(
            e,
            "baton_dispatch_connections",
            "Connections routed, by agent and reason.",
            agents.iter().flat_map(|&(slot, agent, ..)| {
                let reasons = self.routed.get(slot);
                Reason::ALL.iter().enumerate().map(move |(i, &reason)| {
                    let n = reasons.map_or(0, |r| load(&r[i]));
                    (AgentReason { agent, reason }, n)
                })
            }),
        )?;
        gauges(
            e,
            "baton_dispatch_connections_active",
            "Connections open, by agent.",
            agents
                .iter()
                .map(|&(_, agent, _, active)| (AgentLabel { agent }, active)),
        )?;
        gauges(
            e,
            "baton_dispatch_agent_up",
            "1 if the agent passes health checks.",
            agents
                .iter()
                .map(|&(_, agent, up, _)| (AgentLabel { agent }, i64::from(up))),
        )?;
        counters(
            e,
            "baton_dispatch_connect_failures",
            "Failed connections to an agent.",
            agents.iter().map(|&(slot, agent, ..)| {
                let n = self.connect_failures.get(slot).map_or(0, load);
                (AgentLabel { agent }, n)
            }),
        )?;
        counters(
            e,
            "baton_dispatch_hellos",
            "First bytes of connections, by how reading the ClientHello ended.",
            HelloOutcome::ALL
                .iter()
                .zip(&self.hello)
                .map(|(&outcome, n)| (HelloLabel { outcome }, load(n))),
        )?;
        counters(
            e,
            "baton_dispatch_migrations",
            "`migration` connections offered for migration, by outcome: migrated to the home agent, \
             declined (the handshake agent was home), aborted before extraction, or fell back to \
             the handshake agent (home agent refused, failed or timed out).",
            HANDOFF_OUTCOMES
                .iter()
                .zip(&self.handoffs)
                .map(|(&outcome, n)| (HandoffLabel { outcome }, load(n))),
        )?;
        counters(
            e,
            "baton_dispatch_drain_moves",
            "Live connections an agent that drains asked to move (Leave), by outcome: migrated \
             to another agent, stayed (no agent to move to), aborted (the agent could not export \
             it), or fell back to the draining agent (the new agent refused, failed or timed out).",
            DRAIN_OUTCOMES
                .iter()
                .zip(&self.drain_moves)
                .map(|(&outcome, n)| (HandoffLabel { outcome }, load(n))),
        )?;
        counters(
            e,
            "baton_dispatch_restart_connections",
            "Live connections in a dispatcher restart, by outcome: passed to the successor, \
             taken over from the predecessor, kept (re-attached here after the successor \
             failed), or lost (closed).",
            HANDOVER_OUTCOMES
                .iter()
                .zip(&self.handovers)
                .map(|(&outcome, n)| (HandoffLabel { outcome }, load(n))),
        )?;
        counter(
            e,
            "baton_dispatch_no_agent",
            "Connections closed because no agent was up.",
            load(&self.no_agent),
        )?;
        counter(
            e,
            "baton_dispatch_rejected",
            "Connections closed at accept (--max-connections).",
            load(&self.rejected),
        )?;
        counter(
            e,
            "baton_dispatch_proxy_refused",
            "Connections refused at accept: a PROXY header was expected, but the peer is outside --proxy-protocol-from.",
            load(&self.proxy_refused),
        )?;
        counters(
            e,
            "baton_dispatch_bytes",
            "Bytes relayed, by direction.",
            [
                (
                    DirectionLabel {
                        direction: "from_client",
                    },
                    load(&self.bytes_in),
                ),
                (
                    DirectionLabel {
                        direction: "to_client",
                    },
                    load(&self.bytes_out),
                ),
            ],
        )
    }
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct AgentReason {
    agent: u16,
    reason: Reason,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct AgentLabel {
    agent: u16,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct HelloLabel {
    outcome: HelloOutcome,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct HandoffLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

impl EncodeLabelValue for Reason {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.label())
    }
}

impl EncodeLabelValue for HelloOutcome {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_ops::metrics::encode;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Fixed(Metrics);

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            self.0.encode(&mut e, &[(0, 0, true, 3), (1, 1, false, 3)])
        }
    }

    #[test]
    fn encodes_counted_values_and_router_state() {
        let m = Metrics::new(2);
        m.routed(1, Reason::Ticket);
        m.hello(HelloOutcome::TooLarge);
        m.handoff(baton_migrate::Outcome::Migrated);
        m.bytes(5, 7);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(m)));
        let text = encode(&registry);
        for line in [
            "baton_dispatch_connections_total{agent=\"1\",reason=\"ticket\"} 1",
            "baton_dispatch_connections_total{agent=\"0\",reason=\"policy\"} 0",
            "baton_dispatch_connections_active{agent=\"1\"} 3",
            "baton_dispatch_agent_up{agent=\"0\"} 1",
            "baton_dispatch_agent_up{agent=\"1\"} 0",
            "baton_dispatch_hellos_total{outcome=\"too_large\"} 1",
            "baton_dispatch_migrations_total{outcome=\"migrated\"} 1",
            "baton_dispatch_no_agent_total 0",
            "baton_dispatch_bytes_total{direction=\"to_client\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}
