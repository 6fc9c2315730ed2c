//! The soak's fault schedule, sans IO: a pure function from (seed, duration, quick) to a sorted
//! list of timed faults. The same seed always gives the same schedule, so a failing soak can be
//! run again exactly (`baton lab soak --seed N`).
//!
//! Shape of a run: a warm-up with load and no faults, then the fault phase, then a quiet period
//! (load, no faults, no attacks) in which every process must settle back to where it started.
//! Process faults (kill, stop, restarts) follow one another with a recovery gap between them,
//! so every fault's effect is measured on an otherwise healthy system; attacks run on their own
//! timeline across them (the point: load keeps succeeding while attacked).

use std::fmt;
use std::time::Duration;

/// The two systems under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Side {
    /// `baton up --agents 3 --policy migration --store redis`: dispatcher, agents, Redis.
    A,
    /// HAProxy `mode tcp` in front of three agents with `--store peers`.
    B,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::A => "A",
            Side::B => "B",
        })
    }
}

/// What the attacker does on each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Attack {
    /// Send a real ClientHello, then nothing.
    IdleHello,
    /// A TLS record one byte a second.
    Slowloris,
    /// Random bytes.
    Garbage,
    /// Connect and shut down the write half at once.
    HalfOpen,
}

impl Attack {
    pub const ALL: [Attack; 4] = [
        Attack::IdleHello,
        Attack::Slowloris,
        Attack::Garbage,
        Attack::HalfOpen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Attack::IdleHello => "idle-hello",
            Attack::Slowloris => "slowloris",
            Attack::Garbage => "garbage",
            Attack::HalfOpen => "half-open",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Fault {
    /// SIGKILL an agent; start it again (same ports) after the event's length.
    KillAgent { side: Side, agent: usize },
    /// SIGSTOP an agent; SIGCONT after the event's length.
    StopAgent { side: Side, agent: usize },
    /// SIGKILL Redis (side A's store); start it again, empty, after the event's length.
    KillRedis,
    /// SIGKILL side A's dispatcher; start it again (same ports) after the event's length.
    RestartDispatcher,
    /// Attack every listener of both sides for the event's length.
    Attack(Attack),
}

/// A process (or the attacker) a fault acts on: two faults on the same one never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Agent(Side, usize),
    Redis,
    Dispatcher,
    Attacker(Attack),
}

impl Fault {
    pub fn target(&self) -> Target {
        match *self {
            Fault::KillAgent { side, agent } | Fault::StopAgent { side, agent } => {
                Target::Agent(side, agent)
            }
            Fault::KillRedis => Target::Redis,
            Fault::RestartDispatcher => Target::Dispatcher,
            Fault::Attack(a) => Target::Attacker(a),
        }
    }

    /// The kind, without its target: what the report counts by.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillAgent { .. } => "agent SIGKILL",
            Fault::StopAgent { .. } => "agent SIGSTOP",
            Fault::KillRedis => "redis SIGKILL",
            Fault::RestartDispatcher => "dispatcher restart",
            Fault::Attack(a) => a.name(),
        }
    }

    pub fn is_attack(&self) -> bool {
        matches!(self, Fault::Attack(_))
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillAgent { side, agent } => write!(f, "SIGKILL agent {side}{agent}"),
            Fault::StopAgent { side, agent } => write!(f, "SIGSTOP agent {side}{agent}"),
            Fault::KillRedis => f.write_str("SIGKILL redis"),
            Fault::RestartDispatcher => f.write_str("restart dispatcher A"),
            Fault::Attack(a) => write!(f, "attack {}", a.name()),
        }
    }
}

/// A fault at `at` (from the start of the load) lasting `len` (down, stopped, or attacking).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Event {
    pub at: Duration,
    pub len: Duration,
    pub fault: Fault,
}

impl Event {
    pub fn end(&self) -> Duration {
        self.at + self.len
    }
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Load from 0 to `duration`.
    pub duration: Duration,
    /// Load without faults before the first one; the processes' start sizes are taken here.
    pub warmup: Duration,
    /// Every fault has ended by this time; then the quiet period until `duration`.
    pub faults_end: Duration,
    /// Sorted by `at`.
    pub events: Vec<Event>,
}

/// How long a SIGSTOP lasts (the 5 s).
pub const STOP_LEN: Duration = Duration::from_secs(5);
/// Agents per side.
pub const AGENTS: usize = 3;
/// An attack's length in quick mode: past the servers' 10 s handshake and ClientHello
/// deadlines, so the report shows them closing what the attacker holds.
pub const ATTACK_LEN_QUICK: Duration = Duration::from_secs(11);
/// Quick mode's default length of load.
pub const QUICK_DURATION: Duration = Duration::from_secs(90);
/// Full mode's default.
pub const FULL_DURATION: Duration = Duration::from_secs(600);

/// The quiet period at the end: long enough for every server-side timeout the attacks lean on
/// (the agents' and dispatcher's 10 s handshake / ClientHello deadlines) to have fired twice.
pub fn quiet(duration: Duration, quick: bool) -> Duration {
    if quick {
        Duration::from_secs(25)
    } else {
        // a tenth of the run, at least 60 s
        (duration / 10).max(Duration::from_secs(60))
    }
}

/// A small deterministic generator (splitmix64): no dependency, same numbers on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[lo, hi]`, in whole milliseconds.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo, hi) = (lo.as_millis() as u64, hi.as_millis() as u64);
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// The process-fault kinds, without targets yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    KillAgentA,
    KillAgentB,
    StopAgent,
    KillRedis,
    RestartDispatcher,
}

const KINDS: [Kind; 5] = [
    Kind::KillAgentA,
    Kind::KillAgentB,
    Kind::StopAgent,
    Kind::KillRedis,
    Kind::RestartDispatcher,
];

fn materialise(kind: Kind, rng: &mut Rng) -> Event {
    let agent = rng.below(AGENTS as u64) as usize;
    let s = Duration::from_secs;
    let (fault, len) = match kind {
        Kind::KillAgentA => (
            Fault::KillAgent {
                side: Side::A,
                agent,
            },
            rng.between(s(2), s(4)),
        ),
        Kind::KillAgentB => (
            Fault::KillAgent {
                side: Side::B,
                agent,
            },
            rng.between(s(2), s(4)),
        ),
        Kind::StopAgent => {
            let side = if rng.below(2) == 0 { Side::A } else { Side::B };
            (Fault::StopAgent { side, agent }, STOP_LEN)
        }
        Kind::KillRedis => (Fault::KillRedis, rng.between(s(3), s(6))),
        Kind::RestartDispatcher => (
            Fault::RestartDispatcher,
            rng.between(Duration::from_millis(500), s(2)),
        ),
    };
    Event {
        at: Duration::ZERO,
        len,
        fault,
    }
}

/// The schedule of a run of `duration` (load time, warm-up and quiet period included).
///
/// Quick mode: each process-fault kind once, in a seeded order (SIGKILL an agent of A, of B,
/// SIGSTOP one agent, SIGKILL Redis, restart the dispatcher), and each attack once. Full mode:
/// every kind once first, then seeded picks until the fault phase is full; attacks of seeded
/// kinds and lengths throughout. Process faults never overlap one another (each is followed by
/// a recovery gap); attacks of one kind never overlap each other; everything ends by
/// `faults_end`, before the quiet period.
pub fn schedule(seed: u64, duration: Duration, quick: bool) -> Plan {
    let mut rng = Rng::new(seed);
    let s = Duration::from_secs;
    let warmup = if quick { s(8) } else { s(15) };
    let faults_end = duration.saturating_sub(quiet(duration, quick)).max(warmup);
    let recovery = if quick { s(3) } else { s(5) };
    let mut events = Vec::new();

    // process faults, one after another
    let mut order = KINDS.to_vec();
    rng.shuffle(&mut order);
    let mut t = warmup;
    let mut i = 0;
    loop {
        let kind = match order.get(i) {
            Some(k) => *k,
            None if quick => break,
            None => KINDS[rng.below(KINDS.len() as u64) as usize],
        };
        i += 1;
        let gap = if quick {
            rng.between(s(1), s(3))
        } else {
            rng.between(s(3), s(15))
        };
        let mut e = materialise(kind, &mut rng);
        e.at = t + gap;
        if e.end() + recovery > faults_end {
            break;
        }
        t = e.end() + recovery;
        events.push(e);
    }

    // attacks, on their own timeline
    let mut t = warmup;
    let mut kinds = Attack::ALL.to_vec();
    rng.shuffle(&mut kinds);
    let mut i = 0;
    loop {
        let kind = match kinds.get(i) {
            Some(k) => *k,
            None if quick => break,
            None => Attack::ALL[rng.below(4) as usize],
        };
        i += 1;
        let (gap, len) = if quick {
            (rng.between(s(1), s(2)), ATTACK_LEN_QUICK)
        } else {
            (rng.between(s(5), s(20)), rng.between(s(10), s(30)))
        };
        let e = Event {
            at: t + gap,
            len,
            fault: Fault::Attack(kind),
        };
        if e.end() > faults_end {
            break;
        }
        t = e.end();
        events.push(e);
    }
    events.sort_by_key(|e| (e.at, e.len));
    Plan {
        duration,
        warmup,
        faults_end,
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn kinds(p: &Plan) -> HashSet<String> {
        p.events
            .iter()
            .map(|e| match e.fault {
                Fault::KillAgent { side, .. } => format!("kill {side}"),
                f => f.kind().to_string(),
            })
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        for quick in [true, false] {
            let d = if quick { QUICK_DURATION } else { FULL_DURATION };
            assert_eq!(schedule(7, d, quick), schedule(7, d, quick));
        }
        assert_ne!(
            schedule(1, QUICK_DURATION, true),
            schedule(2, QUICK_DURATION, true)
        );
    }

    #[test]
    fn quick_mode_has_every_fault_kind_once() {
        for seed in 0..200 {
            let p = schedule(seed, QUICK_DURATION, true);
            let k = kinds(&p);
            for want in [
                "kill A",
                "kill B",
                "agent SIGSTOP",
                "redis SIGKILL",
                "dispatcher restart",
                "idle-hello",
                "slowloris",
                "garbage",
                "half-open",
            ] {
                assert!(
                    k.contains(want),
                    "seed {seed}: no {want} in {:#?}",
                    p.events
                );
            }
            assert_eq!(p.events.len(), 9, "seed {seed}");
        }
    }

    #[test]
    fn sorted_no_overlap_on_a_process_and_all_over_before_the_quiet_period() {
        for (seed, quick, d) in (0..100)
            .map(|s| (s, true, QUICK_DURATION))
            .chain((0..40).map(|s| (s, false, FULL_DURATION)))
            .chain((0..20).map(|s| (s, false, Duration::from_secs(3600))))
        {
            let p = schedule(seed, d, quick);
            assert!(p.events.windows(2).all(|w| w[0].at <= w[1].at));
            assert!(p.faults_end + quiet(d, quick) <= d);
            for (i, a) in p.events.iter().enumerate() {
                assert!(a.at >= p.warmup, "seed {seed}: {a:?} in the warm-up");
                assert!(
                    a.end() <= p.faults_end,
                    "seed {seed}: {a:?} in the quiet period"
                );
                assert!(a.len > Duration::ZERO);
                for b in &p.events[i + 1..] {
                    let overlap = a.at < b.end() && b.at < a.end();
                    assert!(
                        !(overlap && a.fault.target() == b.fault.target()),
                        "seed {seed}: {a:?} and {b:?} on one process"
                    );
                    // process faults do not overlap each other at all
                    assert!(
                        !(overlap && !a.fault.is_attack() && !b.fault.is_attack()),
                        "seed {seed}: {a:?} and {b:?} at once"
                    );
                }
            }
            if let Fault::StopAgent { .. } = p.events[0].fault {
                assert_eq!(p.events[0].len, STOP_LEN);
            }
        }
    }

    #[test]
    fn full_mode_repeats_faults_and_covers_every_kind() {
        let p = schedule(3, FULL_DURATION, false);
        let process = p.events.iter().filter(|e| !e.fault.is_attack()).count();
        assert!(process >= 10, "{} process faults in 10 min", process);
        assert_eq!(kinds(&p).len(), 9, "{:#?}", p.events);
        assert_eq!(p.faults_end, FULL_DURATION - Duration::from_secs(60));
    }

    #[test]
    fn targets_are_real_agents() {
        for seed in 0..50 {
            for e in schedule(seed, FULL_DURATION, false).events {
                if let Fault::KillAgent { agent, .. } | Fault::StopAgent { agent, .. } = e.fault {
                    assert!(agent < AGENTS);
                }
            }
        }
    }
}
