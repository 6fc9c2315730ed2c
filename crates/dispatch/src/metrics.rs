//! The dispatcher's counters, rendered as Prometheus text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_ops::family;

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

#[derive(Debug)]
pub struct Metrics {
    /// [agent][reason]
    routed: Vec<[AtomicU64; 6]>,
    /// [migrated, declined, aborted, fell_back]
    handoffs: [AtomicU64; 4],
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
    pub fn handoff(&self, outcome: baton_wire::handoff::Outcome) {
        let label = crate::handoff::outcome_label(outcome);
        let i = HANDOFF_OUTCOMES
            .iter()
            .position(|l| *l == label)
            .unwrap_or(0);
        self.handoffs[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text; `state(agent)` gives (up, active connections).
    pub fn render(&self, state: impl Fn(usize) -> (bool, u32)) -> String {
        let mut out = String::with_capacity(2048);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        family(
            &mut out,
            "baton_dispatch_connections_total",
            "counter",
            "Connections routed, by agent and reason.",
        );
        for (agent, reasons) in self.routed.iter().enumerate() {
            for (i, r) in Reason::ALL.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "baton_dispatch_connections_total{{agent=\"{agent}\",reason=\"{}\"}} {}",
                    r.label(),
                    load(&reasons[i])
                );
            }
        }
        family(
            &mut out,
            "baton_dispatch_connections_active",
            "gauge",
            "Connections open, by agent.",
        );
        family(
            &mut out,
            "baton_dispatch_agent_up",
            "gauge",
            "1 if the agent passes health checks.",
        );
        family(
            &mut out,
            "baton_dispatch_connect_failures_total",
            "counter",
            "Failed connections to an agent.",
        );
        for agent in 0..self.routed.len() {
            let (up, active) = state(agent);
            let _ = writeln!(
                out,
                "baton_dispatch_connections_active{{agent=\"{agent}\"}} {active}"
            );
            let _ = writeln!(
                out,
                "baton_dispatch_agent_up{{agent=\"{agent}\"}} {}",
                up as u8
            );
            let _ = writeln!(
                out,
                "baton_dispatch_connect_failures_total{{agent=\"{agent}\"}} {}",
                load(&self.connect_failures[agent])
            );
        }
        family(
            &mut out,
            "baton_dispatch_hellos_total",
            "counter",
            "First bytes of connections, by how reading the ClientHello ended.",
        );
        for (i, o) in HelloOutcome::ALL.iter().enumerate() {
            let _ = writeln!(
                out,
                "baton_dispatch_hellos_total{{outcome=\"{}\"}} {}",
                o.label(),
                load(&self.hello[i])
            );
        }
        family(
            &mut out,
            "baton_dispatch_handoffs_total",
            "counter",
            "`handoff` connections offered for migration, by outcome: migrated to the home agent, \
             declined (the handshake agent was home), aborted before extraction, or fell back to \
             the handshake agent (home agent refused, failed or timed out).",
        );
        for (i, o) in HANDOFF_OUTCOMES.iter().enumerate() {
            let _ = writeln!(
                out,
                "baton_dispatch_handoffs_total{{outcome=\"{o}\"}} {}",
                load(&self.handoffs[i])
            );
        }
        family(
            &mut out,
            "baton_dispatch_no_agent_total",
            "counter",
            "Connections closed because no agent was up.",
        );
        let _ = writeln!(
            out,
            "baton_dispatch_no_agent_total {}",
            load(&self.no_agent)
        );
        family(
            &mut out,
            "baton_dispatch_rejected_total",
            "counter",
            "Connections closed at accept (--max-connections).",
        );
        let _ = writeln!(
            out,
            "baton_dispatch_rejected_total {}",
            load(&self.rejected)
        );
        family(
            &mut out,
            "baton_dispatch_proxy_refused_total",
            "counter",
            "Connections refused at accept: a PROXY header was expected, but the peer is outside --proxy-protocol-from.",
        );
        let _ = writeln!(
            out,
            "baton_dispatch_proxy_refused_total {}",
            load(&self.proxy_refused)
        );
        family(
            &mut out,
            "baton_dispatch_bytes_total",
            "counter",
            "Bytes relayed, by direction.",
        );
        let _ = writeln!(
            out,
            "baton_dispatch_bytes_total{{direction=\"from_client\"}} {}",
            load(&self.bytes_in)
        );
        let _ = writeln!(
            out,
            "baton_dispatch_bytes_total{{direction=\"to_client\"}} {}",
            load(&self.bytes_out)
        );
        baton_ops::render_process(&mut out);
        out
    }
}
