//! The dispatcher's routing decision: which agent gets a new connection, from its ClientHello,
//! the client's address, and what the dispatcher knows of the agents. A pure state machine —
//! no sockets, no clock — so every policy is tested here without a network.
//!
//! Policies (the CSSL paper's balancers, plus TLS 1.3):
//! - `round-robin` (LB-RR): the next healthy agent in turn;
//! - `least-conn`: the healthy agent with the fewest open connections;
//! - `client-ip` (LB-IP): one agent per client address, for persistence;
//! - `session` (SSL session-id balancing, extended to 1.3): a resumption goes to the agent that
//!   issued its ticket (the issuer id is in the ticket's clear header) or that holds its TLS 1.2
//!   session id (learned from ServerHellos); anything else to the least-loaded agent.
//! - `handoff` (CSSL-SF): every client has a *home agent* (by address, as `client-ip`). A
//!   resumption, cheap, goes straight home; a full handshake goes to the least-loaded agent
//!   (the home agent first when it is among them), which then hands the session to the home
//!   agent ([`Router::home_of`], `baton_migrate`).
//!
//! Whatever the policy, an ACME CA's TLS-ALPN-01 validation (a hello offering `acme-tls/1`
//! alone) goes to the least-loaded live agent: any agent can answer it, and affinity (a
//! client's home, a ticket's issuer) means nothing for it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use baton_session::TicketHeader;
use baton_wire::ClientHello;

use crate::members::Admin;

/// How connections are spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    RoundRobin,
    LeastConn,
    ClientIp,
    Session,
    /// `migration` (`handoff`: its old name).
    #[value(name = "migration", alias = "handoff")]
    #[serde(rename = "migration", alias = "handoff")]
    Handoff,
}

/// Why an agent was chosen (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The policy's own choice.
    Policy,
    /// `session`: the ticket's issuer.
    Ticket,
    /// `session`: the agent that holds this TLS 1.2 session id.
    SessionId,
    /// `session`/`client-ip`/`handoff`: the preferred agent is down or draining, so another:
    /// the least loaded, or for a home the client's second choice.
    Fallback,
    /// `handoff`: a full handshake, on the least-loaded agent (the session moves home after,
    /// unless that is the home).
    Handshake,
    /// `handoff`: a resumption, straight to the client's home agent.
    Home,
    /// An ACME TLS-ALPN-01 validation: any live agent.
    Acme,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::Policy,
        Reason::Ticket,
        Reason::SessionId,
        Reason::Fallback,
        Reason::Handshake,
        Reason::Home,
        Reason::Acme,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Policy => "policy",
            Reason::Ticket => "ticket",
            Reason::SessionId => "session_id",
            Reason::Fallback => "fallback",
            Reason::Handshake => "handshake",
            Reason::Home => "home",
            Reason::Acme => "acme",
        }
    }
}

/// What the router knows of one agent.
#[derive(Debug, Clone, Default)]
struct AgentState {
    /// Its `--agent-id`: the name tickets, links and homes use.
    id: u16,
    /// Still on the roster (a removed agent keeps its slot while its streams finish).
    present: bool,
    admin: Admin,
    healthy: bool,
    active: u32,
    /// `handoff`: handshakes running there (routed, and not yet frozen or declined).
    handshaking: u32,
    /// `handoff`: full handshakes ever routed there.
    handshakes: u64,
}

/// The routing state. Agents are slots, indexed in the order they joined; each knows its
/// agent's id. A removed agent's slot is taken by the next agent that joins once no
/// connection counts there any more, so a connection's index stays valid while it lives and
/// the table stays as large as the roster has ever been at once.
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    /// `handoff`: full handshakes a client's home may have done beyond the least-loaded
    /// agent and still take the client's next one ([`level_with`]).
    home_window: u64,
    agents: Vec<AgentState>,
    next: usize,
    sessions: SessionIds,
}

impl Router {
    /// A router over agents with ids `0..agents` (slot `i` is agent `i`).
    pub fn new(policy: Policy, agents: usize) -> Self {
        let mut r = Self {
            policy,
            home_window: 0,
            agents: Vec::new(),
            next: 0,
            sessions: SessionIds::new(100_000),
        };
        for id in 0..agents {
            r.add(id as u16);
        }
        r
    }

    /// `handoff`: lets a client's home take its full handshake while it has done up to
    /// `window` more than the least-loaded agent (0: only when it has done no more). A wider
    /// window moves fewer sessions (each costs both agents an export, an import and link
    /// messages) for handshake counts up to `window` apart.
    pub fn with_home_window(mut self, window: u64) -> Self {
        self.home_window = window;
        self
    }

    /// A new agent takes clients from now on (healthy until a check says otherwise); its slot.
    pub fn add(&mut self, id: u16) -> usize {
        // level with the agents already taking clients, so that the newcomer is not owed
        // every handshake they have done ([`Router::least_handshaking`])
        let handshakes = self.fewest_handshakes().unwrap_or(0);
        let state = AgentState {
            id,
            present: true,
            healthy: true,
            handshakes,
            ..Default::default()
        };
        let free = self
            .agents
            .iter()
            .position(|a| !a.present && a.active == 0 && a.handshaking == 0);
        match free {
            Some(slot) => {
                self.agents[slot] = state;
                slot
            }
            None => {
                self.agents.push(state);
                self.agents.len() - 1
            }
        }
    }

    /// Slots in the table, those of removed agents included.
    pub fn table_len(&self) -> usize {
        self.agents.len()
    }

    /// The agent leaves the roster: no new clients, no homes; its open connections still
    /// count there until they close.
    pub fn remove(&mut self, agent: usize) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.present = false;
        }
    }

    pub fn set_admin(&mut self, agent: usize, admin: Admin) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.admin = admin;
        }
    }

    /// The slot of the agent on the roster with this id.
    pub fn slot_of(&self, id: u16) -> Option<usize> {
        self.agents.iter().position(|a| a.present && a.id == id)
    }

    /// The id of the agent in `slot`.
    pub fn id_of(&self, agent: usize) -> Option<u16> {
        self.agents.get(agent).map(|a| a.id)
    }

    /// Slots on the roster, in order.
    pub fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.agents.len()).filter(|a| self.agents[*a].present)
    }

    /// On the roster, active and healthy: may get new clients and be a home.
    fn takes_clients(&self, agent: usize) -> bool {
        self.agents
            .get(agent)
            .is_some_and(|a| a.present && a.healthy && a.admin == Admin::Active)
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Picks the agent for a new connection and counts it as open there. `None` when every
    /// agent is down. `hello` is `None` when the first bytes were not a parsable ClientHello
    /// (the connection is still forwarded; the agent answers with the proper alert).
    pub fn route(
        &mut self,
        hello: Option<&ClientHello>,
        client: IpAddr,
    ) -> Option<(usize, Reason)> {
        if hello.is_some_and(is_acme_validation) {
            let choice = self.least_conn().map(|a| (a, Reason::Acme))?;
            self.agents[choice.0].active += 1;
            return Some(choice);
        }
        let choice = match self.policy {
            Policy::RoundRobin => self.round_robin().map(|a| (a, Reason::Policy)),
            Policy::LeastConn => self.least_conn().map(|a| (a, Reason::Policy)),
            Policy::ClientIp => self.by_client(client),
            Policy::Session => self
                .by_session(hello)
                .or_else(|| self.least_conn().map(|a| (a, Reason::Policy))),
            Policy::Handoff => self.for_handoff(hello, client),
        }?;
        self.agents[choice.0].active += 1;
        if self.policy == Policy::Handoff {
            self.agents[choice.0].handshaking += 1;
            if choice.1 == Reason::Handshake {
                self.agents[choice.0].handshakes += 1;
            }
        }
        Some(choice)
    }

    /// The client's home agent under `handoff` (and `client-ip`): its first choice by
    /// rendezvous hashing ([`baton_ops::affinity`]) among the healthy agents. While its first
    /// choice is down a client lives at its second, and no other client moves; every
    /// dispatcher with the same agents makes the same choice. `None` when all are down.
    pub fn home_of(&self, client: IpAddr) -> Option<usize> {
        self.choose_home(client, |r, a| r.takes_clients(a))
    }

    /// Where a live connection of `client` goes when its agent `leaving` drains: its home
    /// among the agents that take clients, `leaving` aside (it may not know yet that it is
    /// going: the Leave comes before its health check fails).
    pub fn home_excluding(&self, client: IpAddr, leaving: usize) -> Option<usize> {
        self.choose_home(client, |r, a| a != leaving && r.takes_clients(a))
    }

    /// The best-scoring slot for `client` among the agents on the roster that `may` allow.
    fn choose_home(&self, client: IpAddr, may: impl Fn(&Self, usize) -> bool) -> Option<usize> {
        // Every slot is a candidate, a removed one never available: positions are slots.
        let candidates = self.agents.iter().enumerate();
        let candidates =
            candidates.map(|(slot, a)| (u64::from(a.id), a.present && may(self, slot)));
        baton_ops::affinity::best(client, candidates)
    }

    /// The client's home and whether it is its first choice (`Reason::Home`, or
    /// `Reason::Fallback` while that agent is down).
    fn home_with_reason(&self, client: IpAddr, first: Reason) -> Option<(usize, Reason)> {
        let home = self.home_of(client)?;
        let all_up = self.choose_home(client, |_, _| true) == Some(home);
        Some((home, if all_up { first } else { Reason::Fallback }))
    }

    /// A live connection taken over from a predecessor dispatcher now counts at `agent`.
    pub fn adopted(&mut self, agent: usize) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.active += 1;
        }
    }

    /// A connection counted at `from` now lives at `to` (a session migrated home).
    pub fn moved(&mut self, from: usize, to: usize) {
        if to < self.agents.len() {
            self.closed(from);
            self.agents[to].active += 1;
        }
    }

    /// `handoff`: the handshake of a connection routed to `agent` is over (the agent froze or
    /// declined it, or the connection ended first).
    pub fn handshake_done(&mut self, agent: usize) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.handshaking = a.handshaking.saturating_sub(1);
        }
    }

    /// A connection routed to `agent` has ended.
    pub fn closed(&mut self, agent: usize) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.active = a.active.saturating_sub(1);
        }
    }

    pub fn set_health(&mut self, agent: usize, healthy: bool) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.healthy = healthy;
        }
    }

    pub fn admin(&self, agent: usize) -> Admin {
        self.agents.get(agent).map_or(Admin::Disabled, |a| a.admin)
    }

    pub fn is_healthy(&self, agent: usize) -> bool {
        self.agents.get(agent).is_some_and(|a| a.healthy)
    }

    pub fn active(&self, agent: usize) -> u32 {
        self.agents.get(agent).map_or(0, |a| a.active)
    }

    /// A TLS 1.2 ServerHello from `agent` named `session_id`: later resumptions of it go there.
    pub fn learned_session_id(&mut self, session_id: &[u8], agent: usize) {
        if !session_id.is_empty() && agent < self.agents.len() {
            self.sessions.insert(session_id, agent);
        }
    }

    fn round_robin(&mut self) -> Option<usize> {
        let n = self.agents.len();
        for i in 0..n {
            let a = (self.next + i) % n;
            if self.takes_clients(a) {
                self.next = (a + 1) % n;
                return Some(a);
            }
        }
        None
    }

    fn least_conn(&mut self) -> Option<usize> {
        self.least_by(|a| a.active)
    }

    /// The healthy agent with the least of `load`; ties are broken in turn, so equal agents
    /// share the load instead of the first taking all.
    fn least_by<K: Ord>(&mut self, load: impl Fn(&AgentState) -> K) -> Option<usize> {
        let n = self.agents.len();
        let start = self.next;
        let best = (0..n)
            .map(|i| (start + i) % n)
            .filter(|a| self.takes_clients(*a))
            .min_by_key(|a| load(&self.agents[*a]))?;
        self.next = (best + 1) % n;
        Some(best)
    }

    fn by_client(&mut self, client: IpAddr) -> Option<(usize, Reason)> {
        self.home_with_reason(client, Reason::Policy)
    }

    fn for_handoff(
        &mut self,
        hello: Option<&ClientHello>,
        client: IpAddr,
    ) -> Option<(usize, Reason)> {
        if hello.is_some_and(offers_resumption) {
            return self.home_with_reason(client, Reason::Home);
        }
        let least = self.least_handshaking()?;
        // The client's home when it is level with the least loaded ([`level_with`]): a
        // handshake there has nothing to move, so sessions move only as much as levelling the
        // loads needs. When homes are uneven (Scenario A: two client hosts at home on one
        // agent, one on the other) that is a third as many moves as spreading alone.
        let pick = match self.home_of(client) {
            Some(home) if level_with(&self.agents[home], &self.agents[least], self.home_window) => {
                home
            }
            _ => least,
        };
        Some((pick, Reason::Handshake))
    }

    /// The healthy agent running the fewest handshakes. Handshakes, not connections: after a
    /// migration the bulk connection lives at its home agent, and an agent that is home to
    /// more clients must not be spared handshakes for it (the CSSL paper: handshakes are what the
    /// cluster balances; bulk follows persistence).
    /// Fewest handshakes running; among agents running as many, the one that has done fewest
    /// so far. Turn-taking alone would let the counts drift apart whenever one agent was busy
    /// for a while; this pulls them back together as soon as the loads are level again.
    ///
    /// Spreading by load alone lets the faster agent take more handshakes for as long as it
    /// stays faster (in Scenario A the home of two client hosts also carries two thirds of the
    /// bulk, so it is the slower): the counts drifted up to 12 % apart over 900 handshakes. So
    /// every [`DRIFT_WINDOW`] handshakes an agent has done beyond the fewest done by an agent
    /// that takes clients count as one more running, up to [`DRIFT_CAP`]: the drift stays
    /// within a few windows, and an agent that lags (back from a drain) is preferred by at
    /// most that many handshakes in flight, never sent every handshake.
    fn least_handshaking(&mut self) -> Option<usize> {
        let fewest = self.fewest_handshakes()?;
        self.least_by(|a| (a.handshaking + ahead_of(a.handshakes, fewest), a.handshakes))
    }

    /// The fewest full handshakes done by an agent that takes clients.
    fn fewest_handshakes(&self) -> Option<u64> {
        (0..self.agents.len())
            .filter(|a| self.takes_clients(*a))
            .map(|a| self.agents[a].handshakes)
            .min()
    }

    fn by_session(&mut self, hello: Option<&ClientHello>) -> Option<(usize, Reason)> {
        let hello = hello?;
        let healthy = |r: &Self, a: usize| r.takes_clients(a);
        // TLS 1.3: the first PSK identity is the client's preferred ticket.
        let ticket = hello
            .pre_shared_key()
            .and_then(|p| p.identities.first())
            .map(|i| i.identity.as_slice())
            .or_else(|| hello.session_ticket().filter(|t| !t.is_empty()));
        if let Some(issuer) = ticket
            .and_then(TicketHeader::parse)
            .map(|h| self.slot_of(h.issuer).unwrap_or(usize::MAX))
        {
            if healthy(self, issuer) {
                return Some((issuer, Reason::Ticket));
            }
            return self.least_conn().map(|a| (a, Reason::Fallback));
        }
        if !hello.offers_tls13() && !hello.session_id.is_empty() {
            if let Some(agent) = self.sessions.get(&hello.session_id) {
                if healthy(self, agent) {
                    return Some((agent, Reason::SessionId));
                }
                return self.least_conn().map(|a| (a, Reason::Fallback));
            }
        }
        None
    }
}

/// Whether a hello is an ACME CA's TLS-ALPN-01 validation (RFC 8737): `acme-tls/1` and no
/// other protocol offered.
pub fn is_acme_validation(hello: &ClientHello) -> bool {
    matches!(hello.alpn_protocols(), Some([only]) if only == b"acme-tls/1")
}

/// Whether a hello tries to resume: a PSK (TLS 1.3 ticket), a TLS 1.2 ticket, or a TLS 1.2
/// session id (a TLS 1.3 client's session id is a random compatibility value, not a session).
fn offers_resumption(hello: &ClientHello) -> bool {
    hello
        .pre_shared_key()
        .is_some_and(|p| !p.identities.is_empty())
        || hello.session_ticket().is_some_and(|t| !t.is_empty())
        || !hello.offers_tls13() && !hello.session_id.is_empty()
}

/// TLS 1.2 session id -> agent, bounded: the oldest entries go first.
#[derive(Debug)]
struct SessionIds {
    map: HashMap<Vec<u8>, usize>,
    order: VecDeque<Vec<u8>>,
    capacity: usize,
}

impl SessionIds {
    fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    fn insert(&mut self, id: &[u8], agent: usize) {
        if self.map.insert(id.to_vec(), agent).is_none() {
            self.order.push_back(id.to_vec());
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    fn get(&self, id: &[u8]) -> Option<usize> {
        self.map.get(id).copied()
    }
}

/// `handoff`: handshakes an agent has done beyond the fewest, in windows, as extra load
/// ([`Router::least_handshaking`]).
const DRIFT_WINDOW: u64 = 8;
const DRIFT_CAP: u32 = 4;

fn ahead_of(done: u64, fewest: u64) -> u32 {
    let windows = done.saturating_sub(fewest) / DRIFT_WINDOW;
    u32::try_from(windows).unwrap_or(u32::MAX).min(DRIFT_CAP)
}

/// `handoff`: whether a client's home may take its full handshake instead of the least-loaded
/// agent: no more than `window` handshakes done beyond it so far (so preferring homes cannot
/// drift the counts further apart than that) and at most twice as many in flight, plus one.
/// With homes uneven (Scenario A: one agent home to two client hosts of three) the heavier
/// home also carries two thirds of the bulk, so it is the slower and runs more handshakes at
/// once; a handshake queued there costs less than moving a session (an export, an import and
/// five link messages), so only that home's excess moves: the least the balance needs (at one
/// more in flight, about twice as many sessions moved in the lab's Scenario A). An agent that
/// stalls collects handshakes in flight and stops being preferred. The window lets the lighter
/// agent's own clients stay home while its count is a little ahead.
fn level_with(home: &AgentState, least: &AgentState, window: u64) -> bool {
    home.handshakes <= least.handshakes + window && home.handshaking <= 2 * least.handshaking + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_wire::{ClientExtension, OfferedPsks, PskIdentity};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn hello() -> ClientHello {
        ClientHello {
            legacy_version: baton_wire::ProtocolVersion::TLSV1_2,
            random: [7; 32],
            session_id: vec![],
            cipher_suites: vec![baton_wire::CipherSuite(0xc02b)],
            compression_methods: vec![baton_wire::Compression(0)],
            extensions: vec![],
        }
    }

    fn ticket_from(issuer: u16) -> Vec<u8> {
        let sealer = baton_session::TicketSealer::local(
            issuer,
            std::time::Duration::from_secs(60),
            std::time::Instant::now(),
        )
        .unwrap();
        sealer
            .seal_at(b"session", std::time::Instant::now())
            .unwrap()
    }

    #[test]
    fn round_robin_skips_the_dead() {
        let mut r = Router::new(Policy::RoundRobin, 3);
        let picks: Vec<usize> = (0..6)
            .map(|_| r.route(None, ip("127.0.0.1")).unwrap().0)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        r.set_health(1, false);
        let picks: Vec<usize> = (0..4)
            .map(|_| r.route(None, ip("127.0.0.1")).unwrap().0)
            .collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        for a in 0..3 {
            r.set_health(a, false);
        }
        assert_eq!(r.route(None, ip("127.0.0.1")), None);
    }

    #[test]
    fn handshakes_go_to_the_least_loaded_and_home_when_it_is_level() {
        let mut r = Router::new(Policy::Handoff, 2);
        let c = ip("127.0.0.9");
        let full = Some(hello());
        let home = r.home_of(c).unwrap();
        let away = 1 - home;
        // (agent, then done at once?): level, the home first; it stays busy with that one
        let expect = |r: &mut Router, agent: usize, done: bool| {
            assert_eq!(r.route(full.as_ref(), c).unwrap().0, agent);
            if done {
                r.handshake_done(agent);
            }
        };
        expect(&mut r, home, false);
        // the home has done more: away
        expect(&mut r, away, true);
        // one more in flight at home than away, as many done: still the home (one handshake
        // queued there costs less than a move)...
        expect(&mut r, home, false);
        // ...but not two more in flight
        expect(&mut r, away, true);
        expect(&mut r, away, true);
        r.handshake_done(home);
        r.handshake_done(home);
        // the home has done fewer (2 against 3): it is the least loaded; then level (3
        // each): the home; then it has done more: away
        expect(&mut r, home, true);
        expect(&mut r, home, true);
        expect(&mut r, away, true);
    }

    /// Scenario A's client hosts: two at home on one agent (`x`), one on the other (`y`).
    fn scenario_a_clients(r: &Router) -> ([IpAddr; 3], usize, usize) {
        let mut at = [Vec::new(), Vec::new()];
        for last in 1..=60u8 {
            let c = IpAddr::from([127, 0, 0, last]);
            at[r.home_of(c).unwrap()].push(c);
        }
        let (x, y) = if at[0].len() >= 2 { (0, 1) } else { (1, 0) };
        ([at[x][0], at[x][1], at[y][0]], x, y)
    }

    /// Scenario A's shape with handshakes in flight, the heavier home (which carries two
    /// thirds of the bulk too) slower: it runs up to eight at once where the other runs four,
    /// the oldest finishing as a new one comes. (Sessions moved, handshakes per agent) for a
    /// home window.
    fn scenario_a_in_flight(window: u64) -> (u32, [u64; 2]) {
        let mut r = Router::new(Policy::Handoff, 2).with_home_window(window);
        let (clients, x, y) = scenario_a_clients(&r);
        let (mut moves, mut done) = (0, [0u64; 2]);
        let mut running = [0u32; 2];
        let mut at_once = [0u32; 2];
        (at_once[x], at_once[y]) = (8, 4);
        for i in 0..3000 {
            let c = clients[i % 3];
            let (a, _) = r.route(Some(&hello()), c).unwrap();
            done[a] += 1;
            moves += u32::from(a != r.home_of(c).unwrap());
            running[a] += 1;
            if running[a] > at_once[a] {
                running[a] -= 1;
                r.handshake_done(a);
            }
        }
        (moves, done)
    }

    #[test]
    fn a_slower_home_still_takes_its_clients_handshakes_so_only_its_excess_moves() {
        // level: 1,500 each; the ideal is 500 moves (the heavier home's excess), though that
        // home always has twice as many handshakes in flight
        for window in [0, 8] {
            let (moves, done) = scenario_a_in_flight(window);
            assert!(done[0].abs_diff(done[1]) <= window.max(1), "{done:?}");
            assert!(
                (490..=510).contains(&moves),
                "window {window}: {moves} moved"
            );
        }
    }

    #[test]
    fn a_faster_agent_takes_more_handshakes_only_a_few_windows_ahead() {
        let mut r = Router::new(Policy::Handoff, 2);
        let mut done = [0u64; 2];
        // agent 0 finishes every handshake at once; agent 1 holds three in flight before it
        // finishes one (slower, as the home of most bulk is): by load alone 0 takes nearly all
        for last in 0..2000u32 {
            let c = IpAddr::from([10, 0, (last >> 8) as u8, last as u8]);
            let (a, _) = r.route(Some(&hello()), c).unwrap();
            done[a] += 1;
            if a == 0 || r.agents[1].handshaking >= 3 {
                r.handshake_done(a);
            }
        }
        let apart = done[0].abs_diff(done[1]);
        assert!(
            apart <= DRIFT_WINDOW * u64::from(DRIFT_CAP),
            "{done:?}: {apart} apart"
        );
    }

    #[test]
    fn a_new_agent_shares_handshakes_instead_of_taking_all_it_missed() {
        let mut r = Router::new(Policy::Handoff, 2);
        let full = Some(hello());
        for last in 0..200u8 {
            let (a, _) = r
                .route(full.as_ref(), ip(&format!("10.0.1.{last}")))
                .unwrap();
            r.handshake_done(a);
        }
        let new = r.add(2);
        let mut got = [0u32; 3];
        for last in 0..30u8 {
            let (a, _) = r
                .route(full.as_ref(), ip(&format!("10.0.2.{last}")))
                .unwrap();
            r.handshake_done(a);
            got[a] += 1;
        }
        assert!(got.iter().all(|g| (9..=11).contains(g)), "{got:?}");
        assert_eq!(r.agents[new].handshakes, 100 + u64::from(got[new]));
    }

    #[test]
    fn least_conn_follows_open_connections() {
        let mut r = Router::new(Policy::LeastConn, 3);
        let (a, _) = r.route(None, ip("127.0.0.1")).unwrap();
        let (b, _) = r.route(None, ip("127.0.0.1")).unwrap();
        let (c, _) = r.route(None, ip("127.0.0.1")).unwrap();
        assert_eq!(
            {
                let mut v = vec![a, b, c];
                v.sort();
                v
            },
            [0, 1, 2]
        );
        r.closed(1);
        //             agents: 0 1 2
        // open after close:   1 0 1
        //                       ^ least loaded
        assert_eq!(r.route(None, ip("127.0.0.1")).unwrap().0, 1);
    }

    #[test]
    fn client_ip_is_sticky_and_spreads_addresses() {
        let mut r = Router::new(Policy::ClientIp, 3);
        let first = r.route(None, ip("10.0.0.7")).unwrap().0;
        for _ in 0..5 {
            assert_eq!(
                r.route(None, ip("10.0.0.7")).unwrap(),
                (first, Reason::Policy)
            );
        }
        let used: std::collections::HashSet<usize> = (1..=50u8)
            .map(|i| r.route(None, IpAddr::from([127, 0, 0, i])).unwrap().0)
            .collect();
        assert_eq!(used.len(), 3, "50 addresses use every agent");
        r.set_health(first, false);
        let (other, reason) = r.route(None, ip("10.0.0.7")).unwrap();
        assert_ne!(other, first);
        assert_eq!(reason, Reason::Fallback);
    }

    #[test]
    fn session_policy_follows_ticket_issuer_and_session_ids() {
        let mut r = Router::new(Policy::Session, 3);
        // TLS 1.3 PSK identity issued by agent 2
        let mut h = hello();
        h.extensions.push(ClientExtension::SupportedVersions(vec![
            baton_wire::ProtocolVersion::TLSV1_3,
        ]));
        h.extensions
            .push(ClientExtension::PreSharedKey(OfferedPsks {
                identities: vec![PskIdentity {
                    identity: ticket_from(2),
                    obfuscated_ticket_age: 1,
                }],
                binders: vec![vec![0; 32]],
            }));
        assert_eq!(
            r.route(Some(&h), ip("127.0.0.1")),
            Some((2, Reason::Ticket))
        );
        // TLS 1.2 ticket extension issued by agent 1
        let mut h12 = hello();
        h12.extensions
            .push(ClientExtension::SessionTicket(ticket_from(1)));
        assert_eq!(
            r.route(Some(&h12), ip("127.0.0.1")),
            Some((1, Reason::Ticket))
        );
        // TLS 1.2 session id learned from agent 0's ServerHello
        r.learned_session_id(&[9; 32], 0);
        let mut hid = hello();
        hid.session_id = vec![9; 32];
        assert_eq!(
            r.route(Some(&hid), ip("127.0.0.1")),
            Some((0, Reason::SessionId))
        );
        // a foreign ticket / unknown id: least loaded
        let mut unknown = hello();
        unknown.session_id = vec![1; 32];
        unknown
            .extensions
            .push(ClientExtension::SessionTicket(vec![0xde, 0xad]));
        assert_eq!(
            r.route(Some(&unknown), ip("127.0.0.1")).unwrap().1,
            Reason::Policy
        );
        // the issuer is down: somebody else, marked as a fallback
        r.set_health(2, false);
        assert_eq!(
            r.route(Some(&h), ip("127.0.0.1")).unwrap().1,
            Reason::Fallback
        );
    }

    /// A 0-RTT hello (a PSK and early data) is a resumption like any other: under `handoff`
    /// it goes straight home, never to a handshake agent whose session would migrate (early
    /// data never rides a migration), from every client address.
    #[test]
    fn handoff_sends_early_data_home() {
        let mut r = Router::new(Policy::Handoff, 3);
        let mut zero_rtt = hello();
        zero_rtt.extensions.extend([
            ClientExtension::SupportedVersions(vec![baton_wire::ProtocolVersion::TLSV1_3]),
            ClientExtension::EarlyData,
            ClientExtension::PreSharedKey(OfferedPsks {
                identities: vec![PskIdentity {
                    identity: vec![9; 32],
                    obfuscated_ticket_age: 1234,
                }],
                binders: vec![vec![0; 32]],
            }),
        ]);
        assert!(zero_rtt.early_data());
        for last in 1..=40u8 {
            let client = IpAddr::from([127, 0, 0, last]);
            let home = r.home_of(client).unwrap();
            assert_eq!(r.route(Some(&zero_rtt), client), Some((home, Reason::Home)));
        }
    }

    #[test]
    fn a_full_handshake_goes_home_when_home_is_among_the_least_loaded() {
        let mut r = Router::new(Policy::Handoff, 2);
        let (clients, _, _) = scenario_a_clients(&r);
        let (mut moves, mut done) = (0, [0usize; 2]);
        for i in 0..3000 {
            let c = clients[i % 3];
            let (a, reason) = r.route(Some(&hello()), c).unwrap();
            assert_eq!(reason, Reason::Handshake);
            r.handshake_done(a);
            done[a] += 1;
            if a != r.home_of(c).unwrap() {
                moves += 1;
            }
        }
        // level: 1,500 each; only x's clients that must handshake on y move (500), where
        // turn-taking alone would move about half of everything
        assert_eq!(done, [1500, 1500]);
        assert_eq!(moves, 500);
    }

    #[test]
    fn handoff_spreads_handshakes_and_sends_resumptions_home() {
        let mut r = Router::new(Policy::Handoff, 2);
        let client = ip("127.0.0.3");
        let home = r.home_of(client).unwrap();
        // full handshakes from one address still alternate by load
        let first = r.route(Some(&hello()), client).unwrap();
        let second = r.route(Some(&hello()), client).unwrap();
        assert_eq!(first.1, Reason::Handshake);
        assert_ne!(first.0, second.0, "least-loaded, not by address");
        // the one on the other agent migrates home: the connection count follows it, but
        // handshakes are what is balanced
        let away = if first.0 == home { second.0 } else { first.0 };
        r.handshake_done(first.0);
        r.handshake_done(second.0);
        r.moved(away, home);
        assert_eq!((r.active(home), r.active(1 - home)), (2, 0));
        let third = r.route(Some(&hello()), client).unwrap();
        let fourth = r.route(Some(&hello()), client).unwrap();
        assert_ne!(third.0, fourth.0, "both agents still get handshakes");
        // a resumption goes straight home, whoever is less loaded
        let mut resume = hello();
        resume
            .extensions
            .push(ClientExtension::SessionTicket(vec![1, 2, 3]));
        assert_eq!(r.route(Some(&resume), client), Some((home, Reason::Home)));
        // a TLS 1.3 hello's random session id is not a resumption
        let mut fresh13 = hello();
        fresh13.session_id = vec![5; 32];
        fresh13
            .extensions
            .push(ClientExtension::SupportedVersions(vec![
                baton_wire::ProtocolVersion::TLSV1_3,
            ]));
        assert_eq!(
            r.route(Some(&fresh13), client).unwrap().1,
            Reason::Handshake
        );
        // home down: the client's second choice is its home meanwhile, and says so
        r.set_health(home, false);
        assert_eq!(r.home_of(client), Some(1 - home));
        assert_eq!(
            r.route(Some(&resume), client),
            Some((1 - home, Reason::Fallback))
        );
        r.set_health(1 - home, false);
        assert_eq!(r.home_of(client), None);
        assert_eq!(r.route(Some(&resume), client), None);
    }

    #[test]
    fn an_agent_down_moves_only_its_own_clients() {
        let clients: Vec<IpAddr> = (1..=200u8).map(|i| IpAddr::from([10, 0, 1, i])).collect();
        let mut r = Router::new(Policy::Handoff, 4);
        let before: Vec<_> = clients.iter().map(|c| r.home_of(*c).unwrap()).collect();
        r.set_health(2, false);
        for (c, was) in clients.iter().zip(&before) {
            let now = r.home_of(*c).unwrap();
            if *was == 2 {
                assert_ne!(now, 2);
            } else {
                assert_eq!(now, *was, "{c} moved though its home is up");
            }
        }
        // and two routers (two dispatchers) with the same agents agree
        let mut other = Router::new(Policy::ClientIp, 4);
        other.set_health(2, false);
        for c in &clients {
            assert_eq!(other.route(None, *c).map(|x| x.0), r.home_of(*c));
        }
    }

    #[test]
    fn membership_changes_move_only_the_clients_they_must() {
        let clients: Vec<IpAddr> = (1..=240u8).map(|i| IpAddr::from([10, 0, 2, i])).collect();
        let mut r = Router::new(Policy::Handoff, 3);
        let homes = |r: &Router| -> Vec<Option<u16>> {
            clients
                .iter()
                .map(|c| r.home_of(*c).and_then(|a| r.id_of(a)))
                .collect()
        };
        let before = homes(&r);
        // an agent joins with id 9: it takes some clients, nobody else moves
        let nine = r.add(9);
        let joined = homes(&r);
        let moved = before.iter().zip(&joined).filter(|(b, j)| b != j).count();
        assert!(joined
            .iter()
            .zip(&before)
            .all(|(j, b)| j == b || *j == Some(9)));
        assert!(
            (30..=90).contains(&moved),
            "{moved} of 240 moved to the newcomer"
        );
        // draining it gives exactly those clients back, and it gets no new handshakes
        r.set_admin(nine, Admin::Draining);
        assert_eq!(homes(&r), before);
        for _ in 0..6 {
            let (a, _) = r.route(Some(&hello()), clients[0]).unwrap();
            assert_ne!(a, nine);
        }
        // removing agent 1 moves its clients only
        let one = r.slot_of(1).unwrap();
        r.remove(one);
        assert_eq!(r.slot_of(1), None);
        let after = homes(&r);
        for (b, a) in before.iter().zip(&after) {
            if *b != Some(1) {
                assert_eq!(a, b);
            } else {
                assert!(a.is_some() && *a != Some(1));
            }
        }
        r.add(1);
        assert_eq!(homes(&r), before, "a returning id gets its clients back");
        // a ticket names its issuer by id, whatever the slot
        let mut r = Router::new(Policy::Session, 0);
        r.add(5);
        let seven = r.add(7);
        let mut resume = hello();
        resume
            .extensions
            .push(ClientExtension::SessionTicket(ticket_from(7)));
        assert_eq!(
            r.route(Some(&resume), ip("10.0.0.1")),
            Some((seven, Reason::Ticket))
        );
    }

    #[test]
    fn session_ids_are_bounded() {
        let mut s = SessionIds::new(2);
        s.insert(b"a", 0);
        s.insert(b"b", 1);
        s.insert(b"c", 2);
        assert_eq!(
            (s.get(b"a"), s.get(b"b"), s.get(b"c")),
            (None, Some(1), Some(2))
        );
    }

    #[test]
    fn removed_slots_are_reused_once_no_connection_counts_there() {
        let mut r = Router::new(Policy::LeastConn, 2);
        // a connection open on agent 1 keeps its slot while it lives
        let (busy, _) = r.route(None, ip("10.0.0.1")).unwrap();
        r.remove(busy);
        let newcomer = r.add(7);
        assert_ne!(newcomer, busy);
        assert_eq!(r.table_len(), 3);
        r.closed(busy);
        // then the next agent takes it, and the table stops growing
        for i in 0..10_000u32 {
            let slot = r.add(100 + (i % 50) as u16);
            r.remove(slot);
        }
        assert_eq!(r.table_len(), 3);
        assert_eq!(r.slots().count(), 2);
        assert!(r.route(None, ip("10.0.0.2")).is_some());
    }

    fn with_alpn(protocols: &[&[u8]]) -> ClientHello {
        let mut h = hello();
        h.extensions.push(ClientExtension::Alpn(
            protocols.iter().map(|p| p.to_vec()).collect(),
        ));
        h
    }

    #[test]
    fn acme_validations_are_only_acme_tls_alone() {
        assert!(is_acme_validation(&with_alpn(&[b"acme-tls/1"])));
        assert!(!is_acme_validation(&with_alpn(&[b"h2", b"acme-tls/1"])));
        assert!(!is_acme_validation(&with_alpn(&[b"http/1.1"])));
        assert!(!is_acme_validation(&hello()));
    }

    proptest::proptest! {
        /// Whatever the policy, the agents' health and the client (a home, a ticket's
        /// issuer): a validation goes to a live agent, never to a dead one, and to none only
        /// when all are down.
        #[test]
        fn acme_validations_go_to_a_live_agent(
            policy in proptest::sample::select(vec![
                Policy::RoundRobin, Policy::LeastConn, Policy::ClientIp, Policy::Session, Policy::Handoff,
            ]),
            health in proptest::collection::vec(proptest::bool::ANY, 1..6),
            client in proptest::num::u32::ANY,
            issuer in 0u16..6,
            load in proptest::collection::vec(0usize..4, 0..6),
        ) {
            let mut r = Router::new(policy, health.len());
            let client = IpAddr::from(client.to_be_bytes());
            // some open connections, so that least-loaded and homes differ
            for (i, n) in load.iter().enumerate() {
                for _ in 0..*n {
                    if i < health.len() { r.adopted(i); }
                }
            }
            for (a, up) in health.iter().enumerate() {
                r.set_health(a, *up);
            }
            let mut h = with_alpn(&[b"acme-tls/1"]);
            // a ticket naming an agent (maybe a dead one) must not pin it
            h.extensions.push(ClientExtension::SessionTicket(ticket_from(issuer)));
            let chosen = r.route(Some(&h), client);
            match chosen {
                Some((a, reason)) => {
                    proptest::prop_assert!(health[a], "routed to dead agent {}", a);
                    proptest::prop_assert_eq!(reason, Reason::Acme);
                }
                None => proptest::prop_assert!(health.iter().all(|up| !up)),
            }
        }
    }
}
