//! The reverse proxy's backends: which one a request goes to, and which are passed over
//! because they just refused a connection (a passive health check). No I/O here: the proxy
//! (`proxy.rs`) reports each attempt's outcome and asks for the order to try them in.
//!
//! A backend that refuses a connection is passed over for [`DOWN_FOR`]; after that the next
//! request that picks it tries it again, and one more refusal passes it over again. Nothing is
//! probed in the background: a farm of idle backends costs nothing, and a backend that comes
//! back is in use again within [`DOWN_FOR`].

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use baton_ops::metrics::{counters, gauges};
use http::uri::Authority;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};

use crate::config::{parse_upstream, UpstreamBalance};

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

#[derive(Debug)]
struct Backend {
    authority: Authority,
    /// Passed over until this many ms after `Backends::epoch`; 0 while up.
    down_until_ms: AtomicU64,
    /// Attempts by outcome, indexed by `Outcome as usize`.
    outcomes: [AtomicU64; 4],
}

/// The backends and the choice among them.
#[derive(Debug)]
pub struct Backends {
    backends: Vec<Backend>,
    balance: UpstreamBalance,
    next: AtomicUsize,
    epoch: Instant,
}

impl Backends {
    pub fn new(urls: &[String], balance: UpstreamBalance) -> anyhow::Result<Self> {
        if urls.is_empty() {
            bail!("no --upstream given");
        }
        let backends = urls
            .iter()
            .map(|u| {
                Ok(Backend {
                    authority: parse_upstream(u)?,
                    down_until_ms: AtomicU64::new(0),
                    outcomes: Default::default(),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            backends,
            balance,
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
        })
    }

    pub fn authority(&self, backend: usize) -> &Authority {
        &self.backends[backend].authority
    }

    /// The backends to try for one request from `client`, best first: the balance's choice,
    /// then the others in turn after it; those passed over come last, so they are tried only
    /// when nothing else is left (a farm that is all down is still asked, not given up on).
    pub fn order(&self, client: IpAddr, now: Instant) -> Vec<usize> {
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

    pub fn is_up(&self, backend: usize, now: Instant) -> bool {
        self.backends[backend].down_until_ms.load(Ordering::Relaxed) <= self.ms(now)
    }

    fn ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Per-backend families, for the agent's collector (read at scrape time).
    pub fn encode(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        gauges(
            e,
            "baton_upstream_up",
            "1 if the backend is in use, 0 while it is passed over after refusing a connection.",
            self.backends.iter().enumerate().map(|(i, b)| {
                let up = i64::from(self.is_up(i, now));
                (
                    UpstreamLabel {
                        upstream: b.authority.to_string(),
                    },
                    up,
                )
            }),
        )?;
        counters(
            e,
            "baton_upstream_responses",
            "Response heads received from each backend.",
            self.backends.iter().map(|b| {
                let n = b.outcomes[Outcome::Answered as usize].load(Ordering::Relaxed);
                (
                    UpstreamLabel {
                        upstream: b.authority.to_string(),
                    },
                    n,
                )
            }),
        )?;
        counters(
            e,
            "baton_upstream_failures",
            "Failed attempts on each backend: connect (refused or unreachable; the request then goes to another backend if it has no body), timeout, broken.",
            self.backends.iter().flat_map(|b| {
                FAILURE_KINDS.iter().map(move |&(outcome, kind)| {
                    let n = b.outcomes[outcome as usize].load(Ordering::Relaxed);
                    (UpstreamKindLabel { upstream: b.authority.to_string(), kind }, n)
                })
            }),
        )
    }
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct UpstreamLabel {
    upstream: String,
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct UpstreamKindLabel {
    upstream: String,
    kind: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn farm(n: usize, balance: UpstreamBalance) -> Backends {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 8000 + i))
            .collect();
        Backends::new(&urls, balance).unwrap()
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
        let rr = Backends::new(&urls, UpstreamBalance::RoundRobin).unwrap();
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

        let by_ip = Backends::new(&urls, UpstreamBalance::ClientIp).unwrap();
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
        assert!(Backends::new(&[], UpstreamBalance::RoundRobin).is_err());
        assert!(Backends::new(&["https://x:1".into()], UpstreamBalance::RoundRobin).is_err());
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
        let text = crate::metrics::tests::encoded(move |e| b.encode(e));
        assert!(text.contains(
            "baton_upstream_failures_total{upstream=\"127.0.0.1:8000\",kind=\"timeout\"} 1"
        ));
        assert!(text.contains(
            "baton_upstream_failures_total{upstream=\"127.0.0.1:8000\",kind=\"broken\"} 1"
        ));
        assert!(text.contains("baton_upstream_up{upstream=\"127.0.0.1:8000\"} 1"));
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
        let text = crate::metrics::tests::encoded(move |e| b.encode(e));
        assert!(text.contains("baton_upstream_up{upstream=\"127.0.0.1:8001\"} 0"));
        assert!(text.contains(
            "baton_upstream_failures_total{upstream=\"127.0.0.1:8001\",kind=\"connect\"} 1"
        ));
    }
}
