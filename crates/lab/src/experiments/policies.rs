//! What Scenario A and B share: a list of cluster configurations (balancer policy x TLS server),
//! each started, loaded by the same bench run, and stopped, with the server-side counts per
//! server, and a ratio to the single server of the same implementation.

use baton_bench::BenchArgs;
use serde_json::json;

use std::path::PathBuf;

use crate::rig::{Backend, Lab, Run, Sut};
use crate::row;
use crate::table::{ratio, Table};
use baton_cluster::cluster::Store;
use baton_cluster::pki::KeyKind;

/// Starts a configuration's system under test.
pub type Build = Box<dyn Fn(&Lab) -> anyhow::Result<Sut>>;

/// One configuration of a policy comparison.
pub struct Config {
    pub name: &'static str,
    /// The TLS implementation doing the work (`nginx` or `baton`), for the single-server ratio.
    pub server: &'static str,
    /// The paper's figure for this configuration (requests/s), if it measured it.
    pub paper_tps: Option<f64>,
    /// True for the 1-server reference row.
    pub single: bool,
    /// True for a `baton dispatch --policy migration` row (its migrations are checked).
    pub handoff: bool,
    /// Where its processes talk: `loopback`, or `veth` (hosts of their own, `--hosts`).
    pub net: &'static str,
    /// True for the rows balanced by `baton dispatch` (whose CPU is the balancer's).
    pub dispatcher: bool,
    pub build: Build,
}

/// The eight systems both scenarios compare, and the paper's figure for each: an L4 balancer
/// (HAProxy) in front of two nginx and of two Baton agents, nginx and a Baton agent as the single
/// TLS proxy in front of two plain backends, `baton dispatch` with the CSSL feature off and on,
/// and one server of each implementation.
pub struct Lineup {
    /// Prefix of the systems' directories.
    pub slug: &'static str,
    /// HAProxy `balance` and the row name, e.g. (`source`, `LB-IP`).
    pub balance: (&'static str, &'static str),
    /// Row name and whether the proxy keeps a client on one backend (`ip_hash`).
    pub proxy: (&'static str, bool),
    /// Row name, dispatcher policy and store, with the feature off and on.
    pub off: (&'static str, &'static str, Store),
    pub on: (&'static str, &'static str, Store),
    /// The paper's requests/s: balancer, proxy, off, on, one server.
    pub paper: [f64; 5],
    pub key: KeyKind,
    pub www: PathBuf,
}

impl Lineup {
    pub fn configs(self) -> Vec<Config> {
        let Lineup {
            slug,
            balance,
            proxy,
            off,
            on,
            paper,
            key,
            www,
        } = self;
        let config = |name, server, paper: f64, single, build: Build| Config {
            name,
            server,
            paper_tps: Some(paper),
            single,
            handoff: false,
            net: "loopback",
            dispatcher: false,
            build,
        };
        let dir = move |what: &str| format!("{slug}-{what}");
        let (w1, w2, w3, w4) = (www.clone(), www.clone(), www.clone(), www.clone());
        vec![
            config(
                balance.1,
                "nginx",
                paper[0],
                false,
                Box::new(move |l| {
                    Sut::haproxy(l, &dir("lb-nginx"), balance.0, 2, Backend::Nginx, key, &w1)
                }),
            ),
            config(
                balance.1,
                "baton",
                paper[0],
                false,
                Box::new(move |l| {
                    Sut::haproxy(l, &dir("lb-baton"), balance.0, 2, Backend::Baton, key, &w2)
                }),
            ),
            config(
                proxy.0,
                "nginx",
                paper[1],
                false,
                Box::new(move |l| {
                    Sut::tls_proxy(l, &dir("tls-proxy"), Backend::Nginx, 2, proxy.1, key, &w3)
                }),
            ),
            config(
                proxy.0,
                "baton",
                paper[1],
                false,
                Box::new(move |l| {
                    let name = dir("tls-proxy-baton");
                    Sut::tls_proxy(l, &name, Backend::Baton, 2, proxy.1, key, &w4)
                }),
            ),
            Config {
                dispatcher: true,
                ..config(
                    off.0,
                    "baton",
                    paper[2],
                    false,
                    Box::new(move |l| {
                        Sut::baton_cluster(l, &dir("off"), 2, off.1, off.2.clone(), key, &[])
                    }),
                )
            },
            Config {
                handoff: on.1 == "handoff",
                dispatcher: true,
                ..config(
                    on.0,
                    "baton",
                    paper[3],
                    false,
                    Box::new(move |l| {
                        Sut::baton_cluster(l, &dir("on"), 2, on.1, on.2.clone(), key, &[])
                    }),
                )
            },
            config(
                "1 server",
                "nginx",
                paper[4],
                true,
                Box::new(move |l| {
                    Sut::nginx_servers(l, &dir("single-nginx"), 1, key, &www, None, None)
                }),
            ),
            config(
                "1 server",
                "baton",
                paper[4],
                true,
                Box::new(move |l| Sut::baton_single(l, &dir("single-baton"), key, &[])),
            ),
        ]
    }
}

impl Lineup {
    /// `--hosts`: every configuration across hosts (its servers, balancer or TLS proxy, plain
    /// backends and `client_hosts` client hosts each in a network namespace of its own,
    /// [`Lab::across`]), and before each row that goes through `baton dispatch` the same row on
    /// loopback, so the dispatcher's CPU per connection over veth stands beside loopback from
    /// the same run.
    pub fn across_hosts(self, client_hosts: usize) -> Vec<Config> {
        let mut out = Vec::new();
        for c in self.configs() {
            let Config {
                name,
                server,
                paper_tps,
                single,
                handoff,
                dispatcher,
                build,
                ..
            } = c;
            let build = std::rc::Rc::new(build);
            let make = |net, across: Option<usize>, build: std::rc::Rc<Build>| Config {
                name,
                server,
                paper_tps,
                single,
                handoff,
                dispatcher,
                net,
                build: Box::new(move |l: &Lab| {
                    build(&Lab {
                        across,
                        ..l.clone()
                    })
                }),
            };
            if dispatcher {
                out.push(make("loopback", None, build.clone()));
            }
            out.push(make("veth", Some(client_hosts), build));
        }
        out
    }
}

/// `--hosts` notes: what ran where, and the dispatcher's CPU per connection over veth against
/// loopback for each configuration (the same workload, one run after the other).
pub fn hosts_notes(t: &mut Table, runs: &[(Config, Run, Evidence)]) {
    t.note("across hosts: each veth row's servers, balancer or TLS proxy, plain backends and client hosts ran in network namespaces of their own on one bridge (every byte crossed veth); each row through baton dispatch also ran on loopback just before (net loopback), the same workload, for the dispatcher's CPU per connection; x single compares with the single server on the same net");
    for (c, r, _) in runs.iter().filter(|(c, _, _)| c.net == "veth") {
        let lo = runs
            .iter()
            .find(|(l, _, _)| l.name == c.name && l.net == "loopback")
            .and_then(|(_, l, _)| dispatcher_us_per_conn(l));
        if let (Some(veth), Some(lo)) = (dispatcher_us_per_conn(r), lo) {
            t.note(format!(
                "{}: dispatcher CPU per connection {veth:.0} us over veth, {lo:.0} us on loopback (x{:.2})",
                c.name,
                veth / lo
            ));
        }
    }
}

/// The dispatcher process's CPU-seconds (from /proc) over the connections the client made,
/// in microseconds.
pub fn dispatcher_us_per_conn(r: &Run) -> Option<f64> {
    let conns = r.report.handshakes.full + r.report.handshakes.resumed;
    r.balancer_cpu_s
        .filter(|_| conns > 0)
        .map(|c| c * 1e6 / conns as f64)
}

/// A comparison's table with the columns every comparison has first.
pub fn table(name: &str, title: String) -> Table {
    Table::new(name, title)
        .column("config", "config")
        .column("server", "server")
        .column("tps", "TPS")
        .column("failed", "failed")
}

/// The rows every comparison has, plus `extra` cells per run; then the notes on headroom.
pub fn finish(
    t: &mut Table,
    lab: &Lab,
    runs: &[(Config, Run, Evidence)],
    paper_single: f64,
    extra: impl Fn(&Config, &Run) -> serde_json::Map<String, serde_json::Value>,
) {
    for (c, r, ev) in runs {
        let single = single_tps(runs, c.server, c.net);
        let mut row = row(c, r, ev, single, paper_single);
        row.extend(extra(c, r));
        t.push(row);
    }
    super::run_notes(
        t,
        lab,
        runs.iter()
            .map(|(c, r, _)| (format!("{} ({})", c.name, c.server), r)),
    );
}

/// Proof that the systems compared really ran what they claim: the programs seen in each
/// server's cgroup and the balancer's own counts.
#[derive(Debug, Default)]
pub struct Evidence {
    /// `name:pid` of every process seen in the servers' caps during the run.
    pub processes: Vec<String>,
    /// HAProxy's connections per server (`show stat`), if HAProxy balanced.
    pub balancer_per_server: Option<Vec<u64>>,
    /// Connections HAProxy logged.
    pub balancer_logged: Option<usize>,
}

/// Runs every configuration with `bench()`'s arguments; skips the nginx/HAProxy ones (with a
/// note) only if those programs are missing and `BATON_REQUIRE_SERVERS` is unset.
pub fn compare(
    lab: &Lab,
    table: &mut Table,
    configs: Vec<Config>,
    bench: &dyn Fn() -> BenchArgs,
) -> anyhow::Result<Vec<(Config, Run, Evidence)>> {
    let require = std::env::var_os("BATON_REQUIRE_SERVERS").is_some();
    let mut out = Vec::new();
    for c in configs {
        let needs_nginx = c.server == "nginx" || c.name.contains("TLS proxy");
        if needs_nginx && !crate::rig::nginx::available() && !require {
            table.note(format!("{}: skipped, nginx is not installed", c.name));
            continue;
        }
        if c.name.starts_with("LB-") && !crate::rig::haproxy::available() && !require {
            table.note(format!("{}: skipped, haproxy is not installed", c.name));
            continue;
        }
        println!("   {} ({})", c.name, c.server);
        let sut = (c.build)(lab).map_err(|e| e.context(format!("starting {}", c.name)))?;
        let run = lab.run(&sut, bench())?;
        for e in sut.baseline_errors().iter().take(3) {
            table.note(format!("{}: nginx logged: {e}", c.name));
        }
        let mut ev = Evidence {
            processes: sut
                .servers
                .iter()
                .flat_map(|s| s.confine.pids().into_iter().chain([s.pid]))
                .collect::<std::collections::BTreeSet<u32>>()
                .into_iter()
                .filter_map(|pid| comm(pid).map(|n| format!("{n}:{pid}")))
                .collect(),
            ..Default::default()
        };
        if let Some(h) = &sut.haproxy {
            let logged = h.logged_connections();
            if logged == 0 {
                anyhow::bail!(
                    "{}: HAProxy logged no connection: it was not in the path",
                    c.name
                );
            }
            ev.balancer_logged = Some(logged);
            ev.balancer_per_server = Some(h.per_server_connections()?);
            if let Some(name) = comm(h.pid()) {
                ev.processes.push(format!("{name}:{}", h.pid()));
            }
        }
        drop(sut);
        out.push((c, run, ev));
    }
    Ok(out)
}

/// The common row: config, server, TPS, failures, per-server full handshakes and their
/// spread, servers' CPU per transaction, ratio to the single server, the paper's figure and
/// ratio.
pub fn row(
    c: &Config,
    r: &Run,
    ev: &Evidence,
    single_tps: Option<f64>,
    paper_single: f64,
) -> serde_json::Map<String, serde_json::Value> {
    // the servers that served (a standby counted nothing)
    let serving: Vec<_> = r
        .per_server
        .iter()
        .filter(|s| s.full + s.resumed > 0 || s.requests > 0)
        .collect();
    let per: Vec<u64> = serving.iter().map(|s| s.full).collect();
    let spread = spread_percent(&per);
    let mut m = row![
        ("config", c.name),
        ("server", c.server),
        ("tps", r.report.tps),
        ("failed", r.failed()),
        ("per_server_handshakes", per),
        ("spread_percent", spread),
        ("server_cpu_ms_per_tx", r.server_cpu_per_tx_ms()),
        // each serving server's CPU-seconds (JSON only): how evenly the work itself, not only
        // the handshakes, was spread (in Scenario A the busiest server sets the TPS)
        (
            "per_server_cpu_s",
            serving.iter().map(|s| s.cpu_s).collect::<Vec<_>>()
        ),
        ("balancer_cpu_ms_per_tx", r.balancer_cpu_per_tx_ms()),
        (
            "server_requests",
            r.per_server.iter().map(|s| s.requests).sum::<u64>()
        ),
        (
            "migrated",
            r.per_server.iter().map(|s| s.migrated_out).sum::<u64>()
        ),
        (
            "handoff_failures",
            r.per_server.iter().map(|s| s.handoff_failures).sum::<u64>()
        ),
        ("client_full", r.report.handshakes.full),
        ("client_resumed", r.report.handshakes.resumed),
        ("servers_at_cap", r.servers_bound()),
    ];
    m.insert(
        "ratio_to_single".into(),
        json!(single_tps.and_then(|s| ratio(r.report.tps, s))),
    );
    m.insert("paper_tps".into(), json!(c.paper_tps));
    m.insert("net".into(), json!(c.net));
    m.insert(
        "dispatcher_cpu_us_per_conn".into(),
        json!(dispatcher_us_per_conn(r).filter(|_| c.dispatcher)),
    );
    m.insert("processes".into(), json!(ev.processes));
    m.insert("balancer_per_server".into(), json!(ev.balancer_per_server));
    m.insert("balancer_logged".into(), json!(ev.balancer_logged));
    m.insert(
        "paper_ratio".into(),
        json!(c.paper_tps.and_then(|p| ratio(p, paper_single))),
    );
    m
}

/// What makes a CSSL-SF (`handoff`) row wrong, from the agents' own counters: no session
/// migrated (the feature was not in the path), or any migration failed or fell back (the row
/// would measure something else than the design). `None` when the row is sound.
pub fn handoff_fault(r: &Run) -> Option<String> {
    let out: u64 = r.per_server.iter().map(|s| s.migrated_out).sum();
    let into: u64 = r.per_server.iter().map(|s| s.migrated_in).sum();
    let failed: u64 = r.per_server.iter().map(|s| s.handoff_failures).sum();
    if out == 0 {
        Some("no session migrated".into())
    } else if failed > 0 {
        Some(format!(
            "{failed} migrations failed or fell back ({out} moved)"
        ))
    } else if out != into {
        Some(format!("{out} sessions handed off but {into} imported"))
    } else {
        None
    }
}

/// Marks every `handoff` row of `runs` that [`handoff_fault`] finds wrong as failed (a note,
/// and the table's `failed`, which fails the lab run once the table is printed).
pub fn check_handoff(t: &mut Table, runs: &[(Config, Run, Evidence)]) {
    for (c, r, _) in runs.iter().filter(|(c, _, _)| c.handoff) {
        if let Some(why) = handoff_fault(r) {
            t.note(format!("FAILED {}: {why}", c.name));
            t.failed.push(format!("{}: {why}", c.name));
        }
    }
}

/// (max - min) / mean of the per-server counts, in percent (0 for one server).
pub fn spread_percent(v: &[u64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let max = *v.iter().max()? as f64;
    let min = *v.iter().min()? as f64;
    let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
    (mean > 0.0).then(|| (max - min) / mean * 100.0)
}

/// TPS of the single-server row of implementation `server` on `net`.
pub fn single_tps(runs: &[(Config, Run, Evidence)], server: &str, net: &str) -> Option<f64> {
    runs.iter()
        .find(|(c, _, _)| c.single && c.server == server && c.net == net)
        .map(|(_, r, _)| r.report.tps)
}

/// A process's command name (`/proc/PID/comm`), while it runs.
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_relative_to_the_mean() {
        assert_eq!(spread_percent(&[100, 100]), Some(0.0));
        assert_eq!(spread_percent(&[150, 50]), Some(100.0));
        assert_eq!(spread_percent(&[7]), None);
    }
}
