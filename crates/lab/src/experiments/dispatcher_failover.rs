//! Several dispatchers: two `baton dispatch` processes with the same agents behind
//! HAProxy `mode tcp` (round robin, health checks, redispatch, PROXY v2), open-loop load
//! through HAProxy, and one dispatcher SIGKILLed halfway. What it costs:
//!
//! - requests that were in flight at the kill (started before the dispatcher was reaped, not
//!   done when the signal went): the ones on the killed dispatcher die with it, and are
//!   counted apart;
//! - requests started after the kill that failed anyway (goal 0: HAProxy retries a refused
//!   connect on the survivor, then stops sending there);
//! - the resumption rate (resumed of offered) before and after;
//! - whether homes stayed: the dispatchers' own routing counters
//!   (`baton_dispatch_connections_total{reason="home"}` per agent), both dispatchers before
//!   the kill and the survivor after, beside the share each agent should get from the pure
//!   function every dispatcher runs (`baton_ops::affinity` over the agent ids and the load's
//!   client addresses). A client whose home moved shifts its eighth of the load to another
//!   agent (12.5 points); the counters' own noise is a few points.
//!
//! The load is the soak's (`soak/load.rs`): open loop at a fixed rate like `baton bench
//! --rate`, but it records each request's start, end and outcome, which is what tells a
//! request in flight at the kill from one started after it (the bench's report only counts).
//! `--policy migration` (full handshakes by load, sessions moved to the client's home agent,
//! resumptions straight home), three agents, not capped.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::rig::haproxy::Haproxy;
use crate::rig::Lab;
use crate::row;
use crate::soak::account::{Outcome, Request};
use crate::soak::load::{self, Load};
use crate::soak::schedule::Side;
use crate::table::Table;
use baton_cluster::cluster::{Cluster, ClusterSpec, Proc, Store, Topology};
use baton_cluster::pki::KeyKind;

const AGENTS: usize = 3;

/// Above this many points between an agent's measured and expected share of home routes, the
/// homes are called changed: one client address of the load's eight is 12.5 points.
pub const HOME_TOLERANCE_POINTS: f64 = 6.0;

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let (rate, duration) = if lab.quick {
        (100.0, Duration::from_secs(20))
    } else {
        (300.0, Duration::from_secs(60))
    };
    let kill_at = duration / 2;
    let mut t = Table::new(
        "dispatcher-failover",
        format!(
            "two dispatchers (handoff, {AGENTS} agents) behind HAProxy mode tcp, {rate} requests/s open loop for {} s, RTT {}, one dispatcher SIGKILLed at {} s",
            duration.as_secs(),
            lab.rtt.map_or("none".into(), |d| format!("{} ms", d.as_millis())),
            kill_at.as_secs()
        ),
    )
    .column("phase", "phase")
    .column("requests", "requests")
    .column("failed", "failed")
    .column("resumed_percent", "resumed % of offered")
    .column("offered_got_full", "offered, got full")
    .column("home_share_percent", "home routes per agent %")
    .column("expected_share_percent", "expected %")
    .column("home_deviation_points", "max dev (points)")
    .column("fallback_routes", "fallback routes");
    if !crate::rig::haproxy::available() {
        if std::env::var_os("BATON_REQUIRE_SERVERS").is_some() {
            anyhow::bail!("haproxy is not installed");
        }
        t.note("skipped: haproxy is not installed");
        return Ok(t);
    }
    if lab.hosts {
        t.note("--hosts does not apply here: this experiment runs on 127.0.0.0/8 (the load's client addresses are 127.0.0.2-9)");
    }
    let dir = lab.sut_dir("dispatcher-failover")?;
    let mut cluster = Cluster::start(&ClusterSpec {
        baton: lab.baton.clone(),
        dir: dir.clone(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        agents: AGENTS,
        policy: "handoff".into(),
        store: Store::Memory,
        key: KeyKind::EcdsaP256,
        agent_args: Vec::new(),
        // the client's own address comes from HAProxy's PROXY header (from loopback, the
        // default --proxy-protocol-from)
        dispatcher_args: vec!["--accept-proxy-protocol".into(), "true".into()],
        agent_caps: Vec::new(),
        topology: Topology {
            hosts: false,
            dispatchers: 2,
            client_hosts: 0,
        },
    })
    .context("starting two dispatchers and their agents")?;
    let haproxy = Haproxy::start_failover("haproxy", &cluster.dispatcher_addrs(), &dir)?;
    // The lab's RTT (30 ms unless --quick): clients across a WAN keep their connections open
    // for a few round trips, so some are in flight on the dispatcher that dies (on loopback
    // a request lasts a few ms and the kill meets almost none). The proxy keeps each client's
    // address, so the dispatchers' homes see the eight clients.
    let proxy = match lab.rtt {
        Some(rtt) => Some(crate::rig::delay::DelayProxy::start(haproxy.addr(), rtt)?),
        None => None,
    };
    let entry = proxy.as_ref().map_or(haproxy.addr(), |p| p.addr());
    let roots = load::roots(&cluster.pki.ca)?;
    let metrics = |p: &Proc| p.addr("metrics").context("dispatcher metrics address");
    let survivor = metrics(&cluster.dispatcher)?;
    let doomed = metrics(&cluster.more_dispatchers[0])?;
    let agent_ids: Vec<u64> = (0..AGENTS as u64).collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let t0 = Instant::now();
    let until = t0 + duration;
    let requests = runtime.spawn(load::run(
        Load {
            side: Side::A,
            addr: entry,
            rate,
            max_in_flight: (rate * 2.0) as u64,
            roots,
        },
        t0,
        until,
    ));
    let survivor0 = routes(survivor, AGENTS)?;
    std::thread::sleep(kill_at.saturating_sub(t0.elapsed()));
    // just before the kill: what both dispatchers routed so far
    let before_s = routes(survivor, AGENTS)?;
    let before_d = routes(doomed, AGENTS)?;
    let victim = &mut cluster.more_dispatchers[0].child;
    let signalled = t0.elapsed();
    victim.kill().context("SIGKILL to the second dispatcher")?;
    victim.wait()?;
    let reaped = t0.elapsed();
    let recorded = runtime
        .block_on(requests)
        .context("the load's task ended badly")?;
    let after_s = routes(survivor, AGENTS)?;
    drop(proxy);
    drop(haproxy);
    drop(cluster);

    let before_home: Vec<u64> = (0..AGENTS)
        .map(|a| before_s.home[a] - survivor0.home[a] + before_d.home[a])
        .collect();
    let after_home: Vec<u64> = (0..AGENTS)
        .map(|a| after_s.home[a] - before_s.home[a])
        .collect();
    let expected = expected_shares(&load_clients(), &agent_ids);
    let phases = split(&recorded.requests, signalled, reaped);
    for (phase, reqs, home, fallback) in [
        (
            "before the kill (both dispatchers)",
            &phases.before,
            Some(&before_home),
            Some(before_s.fallback - survivor0.fallback + before_d.fallback),
        ),
        ("in flight at the kill", &phases.in_flight, None, None),
        (
            "after the kill (survivor)",
            &phases.after,
            Some(&after_home),
            Some(after_s.fallback - before_s.fallback),
        ),
    ] {
        let c = Counts::of(reqs);
        let shares = home.map(|h| shares(h));
        let deviation = shares.as_ref().map(|s| max_deviation(s, &expected));
        t.push(row![
            ("phase", phase),
            ("requests", c.requests),
            ("failed", c.failed),
            ("failures", c.failures),
            ("failed_from", c.failed_from),
            ("resumed_percent", c.resumed_percent()),
            ("offered_got_full", c.offered - c.resumed),
            ("home_routes", home),
            ("home_share_percent", shares.as_ref().map(|s| round1(s))),
            ("expected_share_percent", round1(&expected)),
            ("home_deviation_points", deviation),
            ("fallback_routes", fallback),
        ]);
    }
    let lost_at_kill = Counts::of(&phases.in_flight).failed;
    let after = Counts::of(&phases.after);
    t.note(format!(
        "kill: SIGKILL at {:.2} s, reaped at {:.2} s; {} requests were in flight then and {lost_at_kill} of them failed (those on the killed dispatcher die with it: its connections are its own)",
        signalled.as_secs_f64(),
        reaped.as_secs_f64(),
        phases.in_flight.len()
    ));
    t.note(format!(
        "after the kill: {} requests started, {} failed (goal 0: HAProxy redispatches a refused connect and stops sending to the dead one within 2 health checks of 0.5 s)",
        after.requests, after.failed
    ));
    t.note(format!(
        "homes: each agent's share of the dispatchers' `home` routes (resumptions sent straight to the client's home) against the share rendezvous hashing gives it over the load's 8 client addresses; a client whose home moved would shift 12.5 points (tolerance {HOME_TOLERANCE_POINTS})"
    ));
    if recorded.skipped > 0 {
        t.note(format!(
            "{} ticks not sent: {} requests were in flight (the open loop's bound)",
            recorded.skipped,
            (rate * 2.0) as u64
        ));
    }
    let before = Counts::of(&phases.before);
    if before.failed > 0 {
        t.failed
            .push(format!("{} requests failed before the kill", before.failed));
    }
    if after.failed > 0 {
        t.failed.push(format!(
            "{} requests started after the kill failed",
            after.failed
        ));
    }
    for (phase, home) in [("before", &before_home), ("after", &after_home)] {
        let dev = max_deviation(&shares(home), &expected);
        if dev > HOME_TOLERANCE_POINTS {
            t.failed.push(format!(
                "homes {phase} the kill are {dev:.1} points off rendezvous hashing's"
            ));
        }
    }
    if after_home.iter().sum::<u64>() == 0 {
        t.failed
            .push("the survivor routed no resumption home after the kill".into());
    }
    for f in t.failed.clone() {
        t.note(format!("FAILED: {f}"));
    }
    Ok(t)
}

/// The load's client addresses (`soak/load.rs`: 127.0.0.2-9, one in turn per virtual client).
fn load_clients() -> Vec<IpAddr> {
    (0..8u8).map(|i| IpAddr::from([127, 0, 0, 2 + i])).collect()
}

/// Each agent's share (percent) of `clients`' homes, by the function every dispatcher runs.
fn expected_shares(clients: &[IpAddr], ids: &[u64]) -> Vec<f64> {
    let mut n = vec![0u64; ids.len()];
    for c in clients {
        if let Some(i) = baton_ops::affinity::best(*c, ids.iter().map(|id| (*id, true))) {
            n[i] += 1;
        }
    }
    shares(&n)
}

fn shares(n: &[u64]) -> Vec<f64> {
    let total: u64 = n.iter().sum();
    n.iter()
        .map(|&x| {
            if total == 0 {
                0.0
            } else {
                100.0 * x as f64 / total as f64
            }
        })
        .collect()
}

fn max_deviation(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn round1(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| (x * 10.0).round() / 10.0).collect()
}

/// A dispatcher's routing counters: per agent id, connections sent home; fallbacks in all.
struct Routes {
    home: Vec<u64>,
    fallback: u64,
}

fn routes(metrics: SocketAddr, agents: usize) -> anyhow::Result<Routes> {
    let page = baton_bench::scrape::page_blocking(metrics)?;
    let samples = baton_bench::scrape::samples(&page);
    let name = "baton_dispatch_connections_total";
    let home = (0..agents)
        .map(|a| {
            let id = a.to_string();
            baton_bench::scrape::sum(&samples, name, &[("agent", &id), ("reason", "home")]) as u64
        })
        .collect();
    let fallback = baton_bench::scrape::sum(&samples, name, &[("reason", "fallback")]) as u64;
    Ok(Routes { home, fallback })
}

/// The requests of a run, by where they stand to the kill.
struct Phases {
    /// Done before the signal.
    before: Vec<Request>,
    /// Started before the dispatcher was reaped and not done when the signal went.
    in_flight: Vec<Request>,
    /// Started after the dispatcher was reaped.
    after: Vec<Request>,
}

fn split(requests: &[Request], signalled: Duration, reaped: Duration) -> Phases {
    let mut p = Phases {
        before: Vec::new(),
        in_flight: Vec::new(),
        after: Vec::new(),
    };
    for r in requests {
        if r.end < signalled {
            p.before.push(r.clone());
        } else if r.start < reaped {
            p.in_flight.push(r.clone());
        } else {
            p.after.push(r.clone());
        }
    }
    p
}

/// Requests, failures (and their kinds), sessions offered and resumed.
struct Counts {
    requests: usize,
    failed: usize,
    failures: std::collections::BTreeMap<String, usize>,
    /// Each failed request's client address and port (what HAProxy's connection log names it
    /// by, and so the dispatcher it went to; with `--rtt` the delay proxy's instead).
    failed_from: Vec<String>,
    offered: usize,
    resumed: usize,
}

impl Counts {
    fn of(reqs: &[Request]) -> Counts {
        let mut c = Counts {
            requests: reqs.len(),
            failed: 0,
            failures: Default::default(),
            failed_from: Vec::new(),
            offered: 0,
            resumed: 0,
        };
        for r in reqs {
            match &r.outcome {
                Outcome::Ok { offered, resumed } => {
                    c.offered += usize::from(*offered);
                    c.resumed += usize::from(*offered && *resumed);
                }
                Outcome::Failed(kind) => {
                    c.failed += 1;
                    *c.failures.entry(kind.clone()).or_default() += 1;
                    c.failed_from
                        .push(r.local.map_or("unbound".into(), |a| a.to_string()));
                }
            }
        }
        c
    }

    fn resumed_percent(&self) -> Option<f64> {
        (self.offered > 0)
            .then(|| (1000.0 * self.resumed as f64 / self.offered as f64).round() / 10.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(start: u64, end: u64, ok: bool) -> Request {
        Request {
            side: Side::A,
            start: Duration::from_millis(start),
            end: Duration::from_millis(end),
            outcome: if ok {
                Outcome::Ok {
                    offered: true,
                    resumed: true,
                }
            } else {
                Outcome::Failed("response eof".into())
            },
            local: None,
            served_by: None,
        }
    }

    #[test]
    fn requests_are_split_at_the_kill() {
        // signal at 1000 ms, reaped at 1010 ms
        let reqs = [
            req(0, 999, true),     // done before
            req(990, 1005, false), // in flight: died with the dispatcher
            req(1005, 1020, true), // started before the reaping: in flight too
            req(1010, 1030, true), // after
        ];
        let p = split(
            &reqs,
            Duration::from_millis(1000),
            Duration::from_millis(1010),
        );
        assert_eq!(
            (p.before.len(), p.in_flight.len(), p.after.len()),
            (1, 2, 1)
        );
        assert_eq!(Counts::of(&p.in_flight).failed, 1);
        assert_eq!(Counts::of(&p.in_flight).failed_from, ["unbound"]);
        assert_eq!(Counts::of(&p.after).failed, 0);
    }

    #[test]
    fn expected_shares_add_up_and_a_moved_home_is_beyond_the_tolerance() {
        let ids = [0, 1, 2];
        let e = expected_shares(&load_clients(), &ids);
        assert!((e.iter().sum::<f64>() - 100.0).abs() < 1e-9);
        assert_eq!(max_deviation(&e, &e), 0.0);
        // one client of the eight moved to another agent: 12.5 points, beyond the tolerance
        let clients = load_clients();
        let mut n = [0u64; 3];
        for (i, c) in clients.iter().enumerate() {
            let home = baton_ops::affinity::best(*c, ids.iter().map(|id| (*id, true))).unwrap();
            n[if i == 0 { (home + 1) % 3 } else { home }] += 1;
        }
        assert!(max_deviation(&shares(&n), &e) > HOME_TOLERANCE_POINTS);
    }
}
