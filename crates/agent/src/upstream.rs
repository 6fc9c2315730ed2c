//! A pool's upstreams: which one a request goes to, and which are left out because they are
//! down. No I/O here: the proxy (`proxy.rs`) reports each attempt's outcome and asks for the
//! order to try them in; the health checker (`pool.rs`) reports each check.
//!
//! Two health checks, either or both:
//! - passive, always on: an upstream that refuses a connection is passed over for
//!   [`DOWN_FOR`] (tried last, only when nothing else is left); after that the next request
//!   that picks it tries it again, and one more refusal passes it over again;
//! - active, with a pool's `health` settings: each upstream is asked `GET path` every interval;
//!   `fall` failed checks in a row take it out, `rise` passed ones bring it back ([`Checks`]).
//!   An upstream that is out is skipped (and counted); a pool with none left answers 503 at
//!   once rather than try.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use baton_ops::metrics::{counters, gauges};
use http::uri::Authority;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};

use crate::config::UpstreamBalance;

/// How long a backend that refused a connection is passed over.
pub const DOWN_FOR: Duration = Duration::from_secs(5);

/// How an attempt on a backend ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head came back.
    Answered,
    /// No connection: refused, unreachable or the connect timed out. The backend never saw
    /// the request, so it may go to another.
    Connect,
    /// No response head in time.
    Timeout,
    /// The connection broke after the request was (maybe partly) sent.
    Broken,
}

/// The failures' `kind` labels (`Answered` is counted as a response, not a failure).
const FAILURE_KINDS: [(Outcome, &str); 3] = [
    (Outcome::Connect, "connect"),
    (Outcome::Timeout, "timeout"),
    (Outcome::Broken, "broken"),
];

/// An upstream's active health: whether it is in, and how many checks in a row have said
/// otherwise. Pure: the checker feeds it each result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    pub up: bool,
    /// Checks in a row that disagreed with `up`.
    streak: u32,
}

impl Checks {
    /// Until checked, an upstream is in (a restarted agent serves at once; the passive check
    /// still passes over one that refuses).
    pub const START: Checks = Checks {
        up: true,
        streak: 0,
    };

    /// The state after one more check: `fall` failures in a row take an upstream out, `rise`
    /// passes in a row bring it back; a result that agrees with the state resets the streak.
    pub fn after(self, passed: bool, rise: u32, fall: u32) -> Checks {
        if passed == self.up {
            return Checks {
                up: self.up,
                streak: 0,
            };
        }
        let streak = self.streak.saturating_add(1);
        let needed = if self.up { fall } else { rise };
        if streak >= needed {
            Checks {
                up: !self.up,
                streak: 0,
            }
        } else {
            Checks {
                up: self.up,
                streak,
            }
        }
    }
}

#[derive(Debug)]
struct Backend {
    authority: Authority,
    /// Passed over until this many ms after `Backends::epoch`; 0 while up.
    down_until_ms: AtomicU64,
    /// Attempts by outcome, indexed by `Outcome as usize`.
    outcomes: [AtomicU64; 4],
    /// The active checks' state, and its `up` copied where requests read it without a lock.
    checks: Mutex<Checks>,
    checked_out: AtomicBool,
    /// Requests that left it out while the checks had it out.
    skipped: AtomicU64,
    /// Checks by result: passed, failed.
    probes: [AtomicU64; 2],
}

/// A pool's upstreams and the choice among them.
#[derive(Debug)]
pub struct Backends {
    pool: Arc<str>,
    backends: Vec<Backend>,
    balance: UpstreamBalance,
    next: AtomicUsize,
    epoch: Instant,
}

impl Backends {
    pub fn new(
        pool: Arc<str>,
        upstreams: &[Authority],
        balance: UpstreamBalance,
    ) -> anyhow::Result<Self> {
        if upstreams.is_empty() {
            bail!("pool {pool}: no upstreams");
        }
        let backends = upstreams
            .iter()
            .map(|a| Backend {
                authority: a.clone(),
                down_until_ms: AtomicU64::new(0),
                outcomes: Default::default(),
                checks: Mutex::new(Checks::START),
                checked_out: AtomicBool::new(false),
                skipped: AtomicU64::new(0),
                probes: Default::default(),
            })
            .collect();
        Ok(Self {
            pool,
            backends,
            balance,
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
        })
    }

    pub fn len(&self) -> usize {
        self.backends.len()
    }

    pub fn authority(&self, backend: usize) -> &Authority {
        &self.backends[backend].authority
    }

    /// The backends to try for one request from `client`, best first: the balance's choice,
    /// then the others in turn after it; those passed over come last, so they are tried only
    /// when nothing else is left (a farm that is all down is still asked, not given up on).
    /// Those the active checks have out are left out (and counted): empty when all are.
    pub fn order(&self, client: IpAddr, now: Instant) -> Vec<usize> {
        let mut order = self.passive_order(client, now);
        order.retain(|&i| {
            let b = &self.backends[i];
            let out = b.checked_out.load(Ordering::Relaxed);
            if out {
                b.skipped.fetch_add(1, Ordering::Relaxed);
            }
            !out
        });
        order
    }

    fn passive_order(&self, client: IpAddr, now: Instant) -> Vec<usize> {
        let n = self.backends.len();
        let first = match self.balance {
            UpstreamBalance::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            UpstreamBalance::ClientIp => baton_ops::affinity::slot(client, n).unwrap_or(0),
        };
        let now = self.ms(now);
        let mut order: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
        // stable: the up ones keep their turn, and so do the down ones behind them
        order.sort_by_key(|&i| self.backends[i].down_until_ms.load(Ordering::Relaxed) > now);
        order
    }

    /// Counts how an attempt on `backend` ended; a refused connection passes it over for
    /// [`DOWN_FOR`], an answer brings it back at once.
    pub fn report(&self, backend: usize, outcome: Outcome, now: Instant) {
        let b = &self.backends[backend];
        b.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Answered => b.down_until_ms.store(0, Ordering::Relaxed),
            Outcome::Connect => {
                let until = self.ms(now + DOWN_FOR).max(1);
                b.down_until_ms.store(until, Ordering::Relaxed);
            }
            Outcome::Timeout | Outcome::Broken => {}
        }
    }

    /// Records one active check of `backend`; returns whether that changed its state (for
    /// the log).
    pub fn checked(&self, backend: usize, passed: bool, rise: u32, fall: u32) -> Option<bool> {
        let b = &self.backends[backend];
        b.probes[usize::from(!passed)].fetch_add(1, Ordering::Relaxed);
        let mut checks = b.checks.lock().unwrap_or_else(|p| p.into_inner());
        let before = checks.up;
        *checks = checks.after(passed, rise, fall);
        b.checked_out.store(!checks.up, Ordering::Relaxed);
        (checks.up != before).then_some(checks.up)
    }

    /// In use: neither passed over after a refusal nor out by the active checks.
    pub fn is_up(&self, backend: usize, now: Instant) -> bool {
        let b = &self.backends[backend];
        b.down_until_ms.load(Ordering::Relaxed) <= self.ms(now)
            && !b.checked_out.load(Ordering::Relaxed)
    }

    fn ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_millis() as u64
    }

    fn label(&self, b: &Backend) -> UpstreamLabel {
        UpstreamLabel {
            upstream: b.authority.to_string(),
            pool: self.pool.to_string(),
        }
    }

    fn kind_label(&self, b: &Backend, kind: &'static str) -> UpstreamKindLabel {
        UpstreamKindLabel {
            upstream: b.authority.to_string(),
            pool: self.pool.to_string(),
            kind,
        }
    }
}

/// Every pool's upstream families, for the agent's collector (read at scrape time): one
/// family each, with a series per pool and upstream.
pub fn encode_all(
    pools: &[Arc<Backends>],
    e: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    if pools.is_empty() {
        return Ok(());
    }
    let now = Instant::now();
    let all = || {
        pools.iter().flat_map(|p| {
            p.backends
                .iter()
                .enumerate()
                .map(move |(i, b)| (&**p, i, b))
        })
    };
    gauges(
        e,
        "baton_upstream_up",
        "1 if the upstream is in use, 0 while it is passed over after refusing a connection or out by its pool's health checks.",
        all().map(|(p, i, b)| (p.label(b), i64::from(p.is_up(i, now)))),
    )?;
    counters(
        e,
        "baton_upstream_responses",
        "Response heads received from each upstream.",
        all().map(|(p, _, b)| {
            (
                p.label(b),
                b.outcomes[Outcome::Answered as usize].load(Ordering::Relaxed),
            )
        }),
    )?;
    counters(
        e,
        "baton_upstream_failures",
        "Failed attempts on each upstream: connect (refused, unreachable or a failed TLS handshake; the request then goes to another upstream if it has no body), timeout, broken.",
        all().flat_map(|(p, _, b)| {
            FAILURE_KINDS.iter().map(move |&(outcome, kind)| {
                (p.kind_label(b, kind), b.outcomes[outcome as usize].load(Ordering::Relaxed))
            })
        }),
    )?;
    counters(
        e,
        "baton_upstream_skipped",
        "Requests that left the upstream out because its pool's health checks had it out.",
        all().map(|(p, _, b)| (p.label(b), b.skipped.load(Ordering::Relaxed))),
    )?;
    counters(
        e,
        "baton_upstream_health_checks",
        "Active health checks of each upstream, by result (passed, failed).",
        all().flat_map(|(p, _, b)| {
            [("passed", 0), ("failed", 1)]
                .into_iter()
                .map(move |(kind, i)| (p.kind_label(b, kind), b.probes[i].load(Ordering::Relaxed)))
        }),
    )
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct UpstreamLabel {
    upstream: String,
    pool: String,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct UpstreamKindLabel {
    upstream: String,
    pool: String,
    kind: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[String], balance: UpstreamBalance) -> anyhow::Result<Backends> {
        let auths: Vec<Authority> = urls
            .iter()
            .map(|u| crate::route_config::parse_upstream(u))
            .collect::<anyhow::Result<_>>()?;
        Backends::new("p".into(), &auths, balance)
    }

    fn farm(n: usize, balance: UpstreamBalance) -> Arc<Backends> {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 8000 + i))
            .collect();
        Arc::new(pool(&urls, balance).unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn round_robin_or_by_client_address() {
        let now = Instant::now();
        let urls = [
            "http://127.0.0.1:81",
            "http://127.0.0.1:82",
            "http://127.0.0.1:83",
        ]
        .map(String::from);
        let port = |b: &Backends, i: usize| b.authority(i).port_u16().unwrap();
        let rr = pool(&urls, UpstreamBalance::RoundRobin).unwrap();
        let client = ip("127.0.0.9");
        let picked: Vec<u16> = (0..6)
            .map(|_| port(&rr, rr.order(client, now)[0]))
            .collect();
        assert_eq!(picked, [81, 82, 83, 81, 82, 83]);
        assert_eq!(
            rr.order(client, now),
            vec![0, 1, 2],
            "the others follow in turn"
        );

        let by_ip = pool(&urls, UpstreamBalance::ClientIp).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for host in 1..=40u8 {
            let ip = IpAddr::from([127, 0, 0, host]);
            let first = by_ip.order(ip, now)[0];
            assert!(
                (0..5).all(|_| by_ip.order(ip, now)[0] == first),
                "client {ip} moved"
            );
            seen.insert(port(&by_ip, first));
        }
        assert_eq!(seen.len(), 3, "40 clients all landed on {seen:?}");
        assert!(pool(&[], UpstreamBalance::RoundRobin).is_err());
    }

    #[test]
    fn a_refusing_backend_is_passed_over_then_tried_again() {
        let t0 = Instant::now();
        let b = farm(3, UpstreamBalance::ClientIp);
        let client = ip("127.0.0.7");
        let home = b.order(client, t0);
        b.report(home[0], Outcome::Connect, t0);
        assert!(!b.is_up(home[0], t0));
        // the client's backend goes last; the others keep their order
        let passed_over = b.order(client, t0 + Duration::from_secs(1));
        assert_eq!(passed_over, vec![home[1], home[2], home[0]]);
        // back in turn once DOWN_FOR is over, without anyone probing it
        let later = t0 + DOWN_FOR + Duration::from_millis(1);
        assert!(b.is_up(home[0], later));
        assert_eq!(b.order(client, later), home);
        // and an answer brings it back at once
        b.report(home[0], Outcome::Connect, later);
        b.report(home[0], Outcome::Answered, later);
        assert_eq!(b.order(client, later), home);
    }

    #[test]
    fn only_refused_connections_pass_a_backend_over() {
        let now = Instant::now();
        let b = farm(2, UpstreamBalance::RoundRobin);
        b.report(0, Outcome::Timeout, now);
        b.report(0, Outcome::Broken, now);
        assert!(
            b.is_up(0, now),
            "it took the request: slow or broken, not down"
        );
        let text = crate::metrics::tests::encoded(move |e| encode_all(std::slice::from_ref(&b), e));
        assert!(text.contains(
            "baton_upstream_failures_total{upstream=\"127.0.0.1:8000\",pool=\"p\",kind=\"timeout\"} 1"
        ));
        assert!(text.contains(
            "baton_upstream_failures_total{upstream=\"127.0.0.1:8000\",pool=\"p\",kind=\"broken\"} 1"
        ));
        assert!(text.contains("baton_upstream_up{upstream=\"127.0.0.1:8000\",pool=\"p\"} 1"));
    }

    #[test]
    fn when_all_are_down_all_are_still_tried() {
        let now = Instant::now();
        let b = farm(2, UpstreamBalance::RoundRobin);
        b.report(0, Outcome::Connect, now);
        b.report(1, Outcome::Connect, now);
        let mut order = b.order(ip("127.0.0.1"), now);
        order.sort();
        assert_eq!(order, vec![0, 1]);
        let text = crate::metrics::tests::encoded(move |e| encode_all(std::slice::from_ref(&b), e));
        assert!(text.contains("baton_upstream_up{upstream=\"127.0.0.1:8001\",pool=\"p\"} 0"));
        assert!(text.contains(
            "baton_upstream_failures_total{upstream=\"127.0.0.1:8001\",pool=\"p\",kind=\"connect\"} 1"
        ));
    }

    #[test]
    fn checks_take_out_after_fall_and_bring_back_after_rise() {
        let (rise, fall) = (2, 3);
        let run = |results: &[bool]| {
            results
                .iter()
                .scan(Checks::START, |c, &r| {
                    *c = c.after(r, rise, fall);
                    Some(c.up)
                })
                .collect::<Vec<_>>()
        };
        // a failure between passes resets the count: three in a row are needed
        assert_eq!(
            run(&[false, false, true, false, false, false]),
            [true, true, true, true, true, false]
        );
        // once out, two passes in a row bring it back; a failure between them starts over
        assert_eq!(
            run(&[false, false, false, true, false, true, true]),
            [true, true, false, false, false, false, true]
        );
        assert!(!Checks::START.after(false, 1, 1).up);
    }

    #[test]
    fn an_upstream_the_checks_have_out_is_skipped_and_counted() {
        let now = Instant::now();
        let b = farm(2, UpstreamBalance::RoundRobin);
        for _ in 0..2 {
            assert_eq!(b.checked(0, false, 1, 2), None);
            b.checked(0, false, 1, 2);
        }
        assert!(!b.is_up(0, now));
        for _ in 0..4 {
            assert_eq!(b.order(ip("127.0.0.1"), now), vec![1]);
        }
        assert_eq!(b.checked(1, false, 1, 1), Some(false));
        assert!(
            b.order(ip("127.0.0.1"), now).is_empty(),
            "none left: no try"
        );
        assert_eq!(b.checked(0, true, 1, 2), Some(true));
        assert_eq!(b.order(ip("127.0.0.1"), now), vec![0]);
        let text = crate::metrics::tests::encoded(move |e| encode_all(std::slice::from_ref(&b), e));
        assert!(
            text.contains("baton_upstream_skipped_total{upstream=\"127.0.0.1:8000\",pool=\"p\"} 5"),
            "{text}"
        );
        assert!(text.contains(
            "baton_upstream_health_checks_total{upstream=\"127.0.0.1:8000\",pool=\"p\",kind=\"failed\"} 4"
        ), "{text}");
        assert!(text.contains("baton_upstream_up{upstream=\"127.0.0.1:8001\",pool=\"p\"} 0"));
    }
}
