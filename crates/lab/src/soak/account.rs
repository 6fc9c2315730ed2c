//! Attribution, sans IO: which fault explains each failed request, each failed check of a
//! listener's legitimate peer, and each resumption that came back as a full handshake. Times
//! are offsets from the start of the load.
//!
//! A failure is excused only by a fault on a process that served it (or should have), and only
//! at the time the fault could have caused it; a time window alone excuses nothing. Which
//! process served a request:
//! - side B: HAProxy's log names the agent of every connection (by the client's address and
//!   port, [`Request::served_by`]); a request it does not name (no line, or two lines for one
//!   address that disagree) has no agent, and no agent's fault excuses it;
//! - side A: the dispatcher serves every request, so its restart excuses a request of A at the
//!   time; the agent behind it is named nowhere (not in the response, not in a log), so an
//!   agent's fault excuses at most as many failures as the dispatcher's own counters put on
//!   that agent ([`Window::budget`]: connections open on it at the signal, plus those routed to
//!   it until the balancer noticed), the earliest first.
//!
//! The time at which each fault can explain a request:
//! - an agent was SIGKILLed: the request was in flight at the kill (between the signal and
//!   the reaping of the process), or started within [`DETECT`] after it (the balancer's health
//!   checks, 0.5 s apart with two misses to take an agent out, have not yet noticed);
//! - an agent was SIGSTOPped: the request's lifetime overlaps the stop, or the [`DETECT`] after
//!   it;
//! - the dispatcher was SIGKILLed and restarted: the request was in flight at the kill or
//!   started before the new one was ready (plus [`RESTART_GRACE`]);
//! - Redis going away explains no failure (the agents fall back to their own memory): it can
//!   only cost resumptions.
//!
//! A check of a listener's legitimate peer ([`Check`]: a scrape, an admin call, a direct TLS
//! request, the dispatcher's links counted at an agent, replication seen at an agent) is
//! excused only by a kill or stop of a process it names ([`Check::on`]) that overlaps it, up to
//! [`CHECK_GRACE`] after the process was back (links and replication reconnect).
//!
//! Attacks explain nothing. Everything else is unexplained, and fails the soak.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::schedule::{Fault, Side};

/// Time for a balancer to take a dead agent out: health checks every 0.5 s, two failures in a
/// row, plus a check's own connect time and scheduling slack on a loaded 2-core machine.
pub const DETECT: Duration = Duration::from_millis(2500);
/// After a restarted dispatcher printed `ready`, time for its links to the agents to come up.
pub const RESTART_GRACE: Duration = Duration::from_secs(1);
/// How long after a fault ends a resumption that came back full still counts against it
/// (sessions lost with a process are asked for again within a few of each client's requests).
pub const MISS_TAIL: Duration = Duration::from_secs(10);
/// After a process is back, time for what depends on it to be whole again: the dispatcher's
/// links to a restarted agent (reconnect back-off), the replication between agents.
pub const CHECK_GRACE: Duration = Duration::from_secs(10);

/// A process of the systems under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Process {
    /// Side A's dispatcher.
    Dispatcher,
    Agent(Side, usize),
    Redis,
    Haproxy,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Dispatcher => f.write_str("A dispatcher"),
            Process::Agent(side, i) => write!(f, "{side} agent{i}"),
            Process::Redis => f.write_str("A redis"),
            Process::Haproxy => f.write_str("B haproxy"),
        }
    }
}

/// The process a fault acts on (none for an attack).
pub fn process_of(fault: &Fault) -> Option<Process> {
    match *fault {
        Fault::KillAgent { side, agent } | Fault::StopAgent { side, agent } => {
            Some(Process::Agent(side, agent))
        }
        Fault::KillRedis => Some(Process::Redis),
        Fault::RestartDispatcher => Some(Process::Dispatcher),
        Fault::Attack(_) => None,
    }
}

/// What one request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Served. `offered`: the client offered a session to resume; `resumed`: the server took it.
    Ok { offered: bool, resumed: bool },
    /// Failed, with the client's error kind (`connect refused`, `handshake eof`, ...).
    Failed(String),
}

/// One request of the load (one connection, one request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub side: Side,
    pub start: Duration,
    pub end: Duration,
    pub outcome: Outcome,
    /// The client's own address and port, once its socket was bound: what a balancer's
    /// connection log names the connection by.
    pub local: Option<SocketAddr>,
    /// The agent that served it, where a log names it (side B: HAProxy's).
    pub served_by: Option<usize>,
}

/// A fault as it happened: `at` when the signal was sent, `dead` when the process was known
/// gone (reaped; for a stop, when the signal returned), `back` when it was ready again (SIGCONT
/// for a stop; the end of the attack for an attack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub fault: Fault,
    pub at: Duration,
    pub dead: Duration,
    pub back: Duration,
    /// For an agent of side A: the connections side A's dispatcher had on it at the signal
    /// plus those it routed to it until [`DETECT`] after it was back (its counters); the most
    /// failures this fault may excuse. `None`: no cap (the served-by process is known).
    pub budget: Option<u64>,
}

impl Window {
    /// The side whose requests this fault can fail or cost a resumption.
    fn side(&self) -> Option<Side> {
        match self.fault {
            Fault::KillAgent { side, .. } | Fault::StopAgent { side, .. } => Some(side),
            Fault::KillRedis | Fault::RestartDispatcher => Some(Side::A),
            Fault::Attack(_) => None,
        }
    }

    /// Whether this fault's process served `r` (or should have), as far as is known.
    fn on_path(&self, r: &Request) -> bool {
        match self.fault {
            Fault::KillAgent { side, agent } | Fault::StopAgent { side, agent } => match side {
                Side::B => r.served_by == Some(agent),
                // unnamed: capped by the budget instead
                Side::A => r.served_by.is_none_or(|a| a == agent),
            },
            Fault::RestartDispatcher => r.side == Side::A,
            Fault::KillRedis | Fault::Attack(_) => false,
        }
    }

    /// Whether this fault explains `r`'s failure (see the module's rules), budget aside.
    pub fn explains_failure(&self, r: &Request) -> bool {
        if self.side() != Some(r.side) || !self.on_path(r) {
            return false;
        }
        // in flight while the process died: from the signal to the reaping
        let in_flight_at_kill = r.start <= self.dead && self.at <= r.end;
        let started_in = |from: Duration, to: Duration| from <= r.start && r.start <= to;
        match self.fault {
            Fault::KillAgent { .. } => in_flight_at_kill || started_in(self.at, self.at + DETECT),
            Fault::StopAgent { .. } => r.start <= self.back + DETECT && self.at <= r.end,
            Fault::RestartDispatcher => {
                in_flight_at_kill || started_in(self.at, self.back + RESTART_GRACE)
            }
            Fault::KillRedis | Fault::Attack(_) => false,
        }
    }

    /// Whether a resumption offered by `r` that came back full is this fault's doing.
    pub fn explains_miss(&self, r: &Request) -> bool {
        self.side() == Some(r.side) && self.at <= r.start && r.start <= self.back + MISS_TAIL
    }

    /// Whether this fault explains the failed check `c`.
    pub fn explains_check(&self, c: &Check) -> bool {
        let Some(p) = process_of(&self.fault) else {
            return false;
        };
        c.on.contains(&p) && self.at <= c.end && c.start <= self.back + CHECK_GRACE
    }

    /// How a failure this fault explains was tied to its process, for the report.
    fn how(&self) -> String {
        match self.fault {
            Fault::KillAgent {
                side: Side::B,
                agent,
            }
            | Fault::StopAgent {
                side: Side::B,
                agent,
            } => {
                format!("B agent{agent}, named by HAProxy's log")
            }
            Fault::KillAgent { agent, .. } | Fault::StopAgent { agent, .. } => format!(
                "A agent{agent}, within the dispatcher's {} connections on it",
                self.budget.map_or("?".to_string(), |b| b.to_string())
            ),
            Fault::RestartDispatcher => "A dispatcher, which serves every A request".into(),
            _ => self.fault.kind().to_string(),
        }
    }
}

/// One check of a listener's legitimate peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The listener, as the attacker names it (`metrics A0`, `admin`, `link A1`).
    pub listener: String,
    /// The processes whose kill or stop can fail it.
    pub on: Vec<Process>,
    pub start: Duration,
    pub end: Duration,
    /// `None`: served.
    pub error: Option<String>,
}

/// Per listener: its legitimate peer's checks.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CheckTally {
    pub ok: u64,
    pub excused: u64,
    /// Unexplained failures by error.
    pub unexplained: BTreeMap<String, u64>,
    /// The first few unexplained failures: (start s, error).
    pub examples: Vec<(f64, String)>,
}

impl CheckTally {
    pub fn unexplained_total(&self) -> u64 {
        self.unexplained.values().sum()
    }
}

/// Every check, by listener, against the faults that happened.
pub fn account_checks(checks: &[Check], windows: &[Window]) -> BTreeMap<String, CheckTally> {
    let mut out: BTreeMap<String, CheckTally> = BTreeMap::new();
    for c in checks {
        let t = out.entry(c.listener.clone()).or_default();
        match &c.error {
            None => t.ok += 1,
            Some(_) if windows.iter().any(|w| w.explains_check(c)) => t.excused += 1,
            Some(e) => {
                *t.unexplained.entry(e.clone()).or_default() += 1;
                if t.examples.len() < 5 {
                    t.examples.push((c.start.as_secs_f64(), e.clone()));
                }
            }
        }
    }
    out
}

/// Counts for one side.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Tally {
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    /// Handshakes the client meant to be full (no session offered) that were.
    pub full_new: u64,
    pub resumed: u64,
    /// Explained failures by fault kind, then by error kind.
    pub explained: BTreeMap<String, BTreeMap<String, u64>>,
    /// Explained failures by how they were tied to the faulted process.
    pub attributed: BTreeMap<String, u64>,
    /// Unexplained failures by error kind.
    pub unexplained: BTreeMap<String, u64>,
    /// Offered resumptions that came back full, by the fault kind that explains them
    /// (`none` outside every fault).
    pub misses: BTreeMap<String, u64>,
    /// The first few unexplained failures, for the report: (start s, end s, error).
    pub unexplained_examples: Vec<(f64, f64, String)>,
    /// When the first few misses outside every fault started, s.
    pub stray_misses: Vec<f64>,
}

impl Tally {
    pub fn explained_total(&self) -> u64 {
        self.explained.values().flat_map(|m| m.values()).sum()
    }

    pub fn unexplained_total(&self) -> u64 {
        self.unexplained.values().sum()
    }
}

/// For each request, the fault (index in `windows`) that explains its failure: the first
/// that does and has budget left, requests taken the earliest first.
pub fn attribute(requests: &[Request], windows: &[Window]) -> Vec<Option<usize>> {
    let mut left: Vec<Option<u64>> = windows.iter().map(|w| w.budget).collect();
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| requests[i].start);
    let mut out = vec![None; requests.len()];
    for i in order {
        let r = &requests[i];
        if !matches!(r.outcome, Outcome::Failed(_)) {
            continue;
        }
        let by = (0..windows.len()).find(|&w| windows[w].explains_failure(r) && left[w] != Some(0));
        if let Some(w) = by {
            if let Some(n) = &mut left[w] {
                *n -= 1;
            }
        }
        out[i] = by;
    }
    out
}

/// Attributes every request to the faults that happened; one tally per side. A fault with a
/// budget explains failures until it is spent, the earliest first.
pub fn account(requests: &[Request], windows: &[Window]) -> BTreeMap<Side, Tally> {
    let mut out: BTreeMap<Side, Tally> = BTreeMap::new();
    for side in [Side::A, Side::B] {
        out.insert(side, Tally::default());
    }
    let by = attribute(requests, windows);
    for (r, by) in requests.iter().zip(by) {
        let t = out.entry(r.side).or_default();
        t.sent += 1;
        match &r.outcome {
            Outcome::Ok { offered, resumed } => {
                t.ok += 1;
                match (offered, resumed) {
                    (_, true) => t.resumed += 1,
                    (false, false) => t.full_new += 1,
                    (true, false) => {
                        // the latest fault that can explain it
                        let by = windows
                            .iter()
                            .filter(|w| w.explains_miss(r))
                            .max_by_key(|w| w.at)
                            .map_or("none", |w| w.fault.kind());
                        if by == "none" && t.stray_misses.len() < 10 {
                            t.stray_misses.push(r.start.as_secs_f64());
                        }
                        *t.misses.entry(by.to_string()).or_default() += 1;
                    }
                }
            }
            Outcome::Failed(kind) => {
                t.failed += 1;
                match by.map(|i| &windows[i]) {
                    Some(w) => {
                        *t.attributed.entry(w.how()).or_default() += 1;
                        *t.explained
                            .entry(w.fault.kind().to_string())
                            .or_default()
                            .entry(kind.clone())
                            .or_default() += 1;
                    }
                    None => {
                        *t.unexplained.entry(kind.clone()).or_default() += 1;
                        if t.unexplained_examples.len() < 10 {
                            t.unexplained_examples.push((
                                r.start.as_secs_f64(),
                                r.end.as_secs_f64(),
                                kind.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::schedule::Attack;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn failed(side: Side, start: u64, end: u64) -> Request {
        Request {
            side,
            start: ms(start),
            end: ms(end),
            outcome: Outcome::Failed("handshake eof".into()),
            local: None,
            served_by: None,
        }
    }

    fn served(mut r: Request, agent: usize) -> Request {
        r.served_by = Some(agent);
        r
    }

    fn ok(side: Side, start: u64, offered: bool, resumed: bool) -> Request {
        Request {
            side,
            start: ms(start),
            end: ms(start + 5),
            outcome: Outcome::Ok { offered, resumed },
            local: None,
            served_by: None,
        }
    }

    fn kill(side: Side, at: u64, back: u64) -> Window {
        Window {
            fault: Fault::KillAgent { side, agent: 1 },
            at: ms(at),
            dead: ms(at + 2),
            back: ms(back),
            budget: None,
        }
    }

    #[test]
    fn a_request_in_flight_at_a_kill_is_explained_on_its_side_only() {
        let w = [kill(Side::A, 10_000, 13_000)];
        let t = account(
            &[
                failed(Side::A, 9_990, 10_020),
                failed(Side::B, 9_990, 10_020),
            ],
            &w,
        );
        assert_eq!(t[&Side::A].explained_total(), 1);
        assert_eq!(t[&Side::A].unexplained_total(), 0);
        assert_eq!(
            t[&Side::A].explained["agent SIGKILL"]["handshake eof"],
            1,
            "by fault kind and error kind"
        );
        assert_eq!(t[&Side::B].unexplained_total(), 1, "B had no fault");
    }

    #[test]
    fn after_a_kill_only_until_the_health_checks_notice() {
        let w = [kill(Side::B, 10_000, 20_000)];
        let within = served(
            failed(Side::B, 10_000 + DETECT.as_millis() as u64 - 1, 12_600),
            1,
        );
        let later = served(failed(Side::B, 15_000, 15_001), 1); // long out of rotation, still down
        let before = served(failed(Side::B, 9_000, 9_500), 1); // done before the kill
        let t = account(&[within, later, before], &w);
        assert_eq!(t[&Side::B].explained_total(), 1);
        assert_eq!(t[&Side::B].unexplained_total(), 2);
        assert_eq!(t[&Side::B].unexplained_examples.len(), 2);
    }

    #[test]
    fn a_stop_explains_what_overlaps_it() {
        let w = [Window {
            fault: Fault::StopAgent {
                side: Side::A,
                agent: 0,
            },
            at: ms(10_000),
            dead: ms(10_000),
            back: ms(15_000),
            budget: None,
        }];
        let t = account(
            &[
                failed(Side::A, 9_000, 10_001),
                failed(Side::A, 14_000, 16_000),
                failed(Side::A, 17_000, 17_001),
                failed(Side::A, 18_000, 18_001),
            ],
            &w,
        );
        assert_eq!(t[&Side::A].explained["agent SIGSTOP"]["handshake eof"], 3);
        assert_eq!(t[&Side::A].unexplained_total(), 1);
    }

    #[test]
    fn dispatcher_restart_covers_its_down_time_on_side_a() {
        let w = [Window {
            fault: Fault::RestartDispatcher,
            at: ms(10_000),
            dead: ms(10_003),
            back: ms(11_500),
            budget: None,
        }];
        let t = account(
            &[
                // started as the signal went, reset before the process was reaped
                failed(Side::A, 10_001, 10_002),
                failed(Side::A, 9_990, 10_010),
                failed(Side::A, 11_000, 11_001),
                failed(Side::A, 12_400, 12_401),
                failed(Side::A, 12_600, 12_601),
                failed(Side::B, 11_000, 11_001),
            ],
            &w,
        );
        assert_eq!(t[&Side::A].explained_total(), 4);
        assert_eq!(t[&Side::A].unexplained_total(), 1);
        assert_eq!(t[&Side::B].unexplained_total(), 1);
    }

    #[test]
    fn redis_and_attacks_explain_no_failure_but_redis_explains_misses() {
        let w = [
            Window {
                fault: Fault::KillRedis,
                at: ms(10_000),
                dead: ms(10_001),
                back: ms(14_000),
                budget: None,
            },
            Window {
                fault: Fault::Attack(Attack::Garbage),
                at: ms(9_000),
                dead: ms(9_000),
                back: ms(30_000),
                budget: None,
            },
        ];
        let t = account(
            &[
                failed(Side::A, 10_010, 10_020),
                ok(Side::A, 12_000, true, false),
                ok(Side::A, 40_000, true, false),
                ok(Side::A, 12_000, true, true),
                ok(Side::A, 12_000, false, false),
            ],
            &w,
        );
        let a = &t[&Side::A];
        assert_eq!(a.unexplained_total(), 1);
        assert_eq!(a.misses["redis SIGKILL"], 1);
        assert_eq!(a.misses["none"], 1);
        assert_eq!(a.stray_misses, vec![40.0]);
        assert_eq!((a.sent, a.ok, a.failed), (5, 4, 1));
        assert_eq!((a.resumed, a.full_new), (1, 1));
    }

    #[test]
    fn on_side_b_only_the_agent_haproxy_named_is_excused() {
        let w = [kill(Side::B, 10_000, 13_000)];
        let t = account(
            &[
                served(failed(Side::B, 9_990, 10_020), 1),
                served(failed(Side::B, 9_991, 10_020), 2),
                failed(Side::B, 9_992, 10_020),
            ],
            &w,
        );
        let b = &t[&Side::B];
        assert_eq!(b.explained_total(), 1, "the one agent1 served");
        assert_eq!(
            b.unexplained_total(),
            2,
            "agent2's, and one HAProxy did not name"
        );
        assert_eq!(b.attributed["B agent1, named by HAProxy's log"], 1);
    }

    #[test]
    fn on_side_a_an_agent_excuses_no_more_than_the_dispatcher_had_on_it() {
        let mut w = kill(Side::A, 10_000, 13_000);
        w.budget = Some(2);
        let requests = [
            failed(Side::A, 9_990, 10_020),
            failed(Side::A, 9_980, 10_020),
            failed(Side::A, 9_970, 10_020),
        ];
        let t = account(&requests, &[w.clone()]);
        assert_eq!(t[&Side::A].explained_total(), 2);
        assert_eq!(t[&Side::A].unexplained_total(), 1);
        // the earliest are the ones excused
        assert_eq!(
            attribute(&requests, &[w]),
            vec![None, Some(0), Some(0)],
            "by start"
        );
    }

    #[test]
    fn a_check_is_excused_only_by_a_fault_on_a_process_it_names() {
        let check = |listener: &str, on: Vec<Process>, start: u64| Check {
            listener: listener.into(),
            on,
            start: ms(start),
            end: ms(start + 100),
            error: Some("connect refused".into()),
        };
        let w = [kill(Side::A, 10_000, 13_000)];
        let a1 = Process::Agent(Side::A, 1);
        let t = account_checks(
            &[
                check("metrics A1", vec![a1], 10_500),
                check(
                    "metrics A1",
                    vec![a1],
                    13_000 + CHECK_GRACE.as_millis() as u64 - 200,
                ),
                check(
                    "metrics A1",
                    vec![a1],
                    13_000 + CHECK_GRACE.as_millis() as u64 + 1,
                ),
                check("metrics A2", vec![Process::Agent(Side::A, 2)], 10_500),
                Check {
                    error: None,
                    ..check("admin", vec![Process::Dispatcher], 10_500)
                },
            ],
            &w,
        );
        assert_eq!(t["metrics A1"].excused, 2);
        assert_eq!(t["metrics A1"].unexplained_total(), 1, "after the grace");
        assert_eq!(
            t["metrics A2"].unexplained_total(),
            1,
            "another agent's kill"
        );
        assert_eq!((t["admin"].ok, t["admin"].excused), (1, 0));
    }
}
