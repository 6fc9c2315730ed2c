//! Attribution, sans IO: which fault explains each failed request and each resumption that came
//! back as a full handshake. Times are offsets from the start of the load.
//!
//! A failed request is explained only by a fault on a process on its path, and only when:
//! - an agent was SIGKILLed: the request was in flight at the kill (between the signal and
//!   the reaping of the process), or started within
//!   [`DETECT`] after it (the balancer's health checks, 0.5 s apart with two misses to take an
//!   agent out, have not yet noticed);
//! - an agent was SIGSTOPped: the request's lifetime overlaps the stop, or the [`DETECT`] after
//!   it;
//! - the dispatcher was SIGKILLed and restarted: the request was in flight at the kill or
//!   started before the new one was ready (plus [`RESTART_GRACE`]);
//! - Redis going away explains no failure (the agents fall back to their own memory): it can
//!   only cost resumptions.
//!
//! Attacks explain nothing. Everything else is unexplained, and fails the soak.

use std::collections::BTreeMap;
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

    /// Whether this fault explains `r`'s failure (see the module's rules).
    pub fn explains_failure(&self, r: &Request) -> bool {
        if self.side() != Some(r.side) {
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

/// Attributes every request to the faults that happened; one tally per side.
pub fn account(requests: &[Request], windows: &[Window]) -> BTreeMap<Side, Tally> {
    let mut out: BTreeMap<Side, Tally> = BTreeMap::new();
    for side in [Side::A, Side::B] {
        out.insert(side, Tally::default());
    }
    for r in requests {
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
                match windows.iter().find(|w| w.explains_failure(r)) {
                    Some(w) => {
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
        }
    }

    fn ok(side: Side, start: u64, offered: bool, resumed: bool) -> Request {
        Request {
            side,
            start: ms(start),
            end: ms(start + 5),
            outcome: Outcome::Ok { offered, resumed },
            local: None,
        }
    }

    fn kill(side: Side, at: u64, back: u64) -> Window {
        Window {
            fault: Fault::KillAgent { side, agent: 1 },
            at: ms(at),
            dead: ms(at + 2),
            back: ms(back),
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
        let within = failed(Side::B, 10_000 + DETECT.as_millis() as u64 - 1, 12_600);
        let later = failed(Side::B, 15_000, 15_001); // agent long out of rotation, still down
        let before = failed(Side::B, 9_000, 9_500); // done before the kill
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
            },
            Window {
                fault: Fault::Attack(Attack::Garbage),
                at: ms(9_000),
                dead: ms(9_000),
                back: ms(30_000),
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
}
