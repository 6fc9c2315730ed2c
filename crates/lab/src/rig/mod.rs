//! The lab's rig: the systems under test as capped process groups on this machine, the
//! baselines (nginx, HAProxy), a delay proxy for RTT, and one measured bench run against them.
//!
//! A system under test ([`Sut`]) is an entry address plus the servers behind it; every server is
//! a [`Server`] with its own CPU cap ([`cap::Confine`]) and its own counters (a Baton agent's
//! /metrics, an nginx access log), so each run reports what the servers saw, not only what the
//! client measured.

pub mod cap;
pub mod delay;
pub mod haproxy;
pub mod nginx;
pub mod redis;

use baton_ops::process::cpu_seconds_of;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use baton_bench::{BenchArgs, Report};

use baton_cluster::cluster::{Cluster, ClusterSpec, Proc, Store};
use baton_cluster::hosts::{Host, Hosts};
use baton_cluster::pki::{self, KeyKind, Pki};
use cap::{CapMode, Confine};
use nginx::Nginx;

/// Settings shared by every experiment of one `baton lab` run.
#[derive(Debug, Clone)]
pub struct Lab {
    pub baton: PathBuf,
    /// Work directory (certificates, configs, logs).
    pub dir: PathBuf,
    pub quick: bool,
    /// Added round-trip time between clients and the system under test.
    pub rtt: Option<Duration>,
    /// CPU cap of each server, percent of one core.
    pub quota: u32,
    pub cap: CapMode,
    /// `--key`: the server key the policy scenarios use instead of their default.
    pub key: Option<KeyKind>,
    /// `--hosts`: the experiments that support it run their Baton clusters (dispatcher, each
    /// agent, Redis, each client host) in network namespaces of their own (`baton_cluster::hosts`).
    pub hosts: bool,
    /// Set by an experiment for one system under test: `Some(n)` starts its every process
    /// (servers, balancer, backends) on a host of its own, and `n` client hosts that
    /// [`Lab::run`] loads from; `None` (the default) keeps it on 127.0.0.0/8.
    pub across: Option<usize>,
}

impl Lab {
    /// A cap for server `index` of a run (cgroup: `quota`% of a core; taskset: core `index`).
    pub fn confine(&self, name: &str, index: usize) -> anyhow::Result<Confine> {
        Confine::new(self.cap, name, self.quota, index)
    }

    /// Each server's CPU cap in cores, where cgroups cap it.
    fn cap_cores(&self) -> Option<f64> {
        (self.cap == CapMode::Cgroup).then(|| f64::from(self.quota) / 100.0)
    }

    /// Certificates for `kind`, generated once per lab run.
    pub fn pki(&self, kind: KeyKind) -> anyhow::Result<Pki> {
        let dir = self
            .dir
            .join(format!("pki-{}", kind.name().replace(' ', "-")));
        if dir.join("key.pem").exists() {
            return Ok(Pki {
                ca: dir.join("ca.pem"),
                cert: dir.join("cert.pem"),
                key: dir.join("key.pem"),
            });
        }
        std::fs::create_dir_all(&dir)?;
        pki::generate_kind(&dir, kind)
    }

    /// A fresh directory for one system under test.
    pub fn sut_dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let slug: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let mut dir = self.dir.join(&slug);
        let mut i = 1;
        while dir.exists() {
            i += 1;
            dir = self.dir.join(format!("{slug}-{i}"));
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Starts `baton agent` (no PROXY header, its own sessions unless `extra` says otherwise),
    /// capped.
    pub fn agent(
        &self,
        dir: &Path,
        name: &str,
        pki: &Pki,
        extra: &[String],
        confine: &Confine,
    ) -> anyhow::Result<Proc> {
        self.agent_on(dir, name, pki, extra, confine, None)
    }

    /// [`Lab::agent`] on `host` (its address, in its namespace) when there is one.
    pub fn agent_on(
        &self,
        dir: &Path,
        name: &str,
        pki: &Pki,
        extra: &[String],
        confine: &Confine,
        host: Option<&Host>,
    ) -> anyhow::Result<Proc> {
        let ip = host.map_or(std::net::Ipv4Addr::LOCALHOST, |h| h.addr);
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--listen".into(),
            format!("{ip}:0"),
            "--metrics".into(),
            format!("{ip}:0"),
            "--cert".into(),
        ];
        args.push(path(&pki.cert));
        args.extend(["--key".into(), path(&pki.key)]);
        args.extend(extra.iter().cloned());
        let log = dir.join(format!("{name}.log"));
        baton_cluster::cluster::spawn_on(&host.cloned(), &self.baton, &args, &log, Some(confine))
    }

    /// One measured bench run against `sut`: the servers' counters and CPU before and after,
    /// through the delay proxy when `rtt` is set. `args.url` may hold `{addr}`, replaced by the
    /// address clients connect to.
    pub fn run(&self, sut: &Sut, mut args: BenchArgs) -> anyhow::Result<Run> {
        let clients = match &sut.cluster {
            Some(c) if sut.client_hosts.is_empty() => c.client_hosts(),
            _ => sut.client_hosts.clone(),
        };
        if !clients.is_empty() {
            return self.run_on_hosts(sut, args, &clients);
        }
        let proxy = match self.rtt {
            Some(rtt) => Some(delay::DelayProxy::start(sut.entry, rtt)?),
            None => None,
        };
        let target = proxy.as_ref().map_or(sut.entry, |p| p.addr());
        let url = args.url.take().unwrap_or_else(|| "https://{addr}/".into());
        args.url = Some(url.replace("{addr}", &target.to_string()));
        args.ca = Some(sut.ca.clone());
        args.sni.get_or_insert_with(|| "localhost".into());
        args.quiet = true;
        let cfg = Arc::new(args.resolve()?);
        let before = sut.snapshot()?;
        let balancer0 = sut.balancer_pid().and_then(cpu_seconds_of);
        let client0 = baton_ops::process::usage().cpu_seconds;
        let t0 = Instant::now();
        let report = baton_bench::execute(cfg)?;
        let wall = t0.elapsed().as_secs_f64();
        let client_cpu = baton_ops::process::usage().cpu_seconds - client0;
        drop(proxy);
        let after = sut.settled(&before, report.requests.ok)?;
        let balancer1 = sut.balancer_pid().and_then(cpu_seconds_of);
        let per_server = before.iter().zip(&after).map(|(b, a)| a.minus(b)).collect();
        Ok(Run {
            report,
            per_server,
            balancer_cpu_s: balancer0.zip(balancer1).map(|(b, a)| a - b),
            client_cpu_s: client_cpu,
            wall_s: wall,
            cap_cores: self.cap_cores(),
        })
    }

    /// [`Lab::run`] for a cluster across hosts: one bench per client host, each in a thread that
    /// entered the host's network namespace (the bench's runtime threads are spawned from it
    /// and stay there), with its share of the connections and virtual clients; their reports
    /// merged exactly (`baton bench merge`). The client hosts stand in for the loopback runs'
    /// source addresses (`source_ip`), one host per address. RTT is added by `netem` on each
    /// client host's link (the whole RTT on the way out) instead of the delay proxy.
    fn run_on_hosts(
        &self,
        sut: &Sut,
        args: BenchArgs,
        clients: &[baton_cluster::hosts::Host],
    ) -> anyhow::Result<Run> {
        if let Some(rtt) = self.rtt {
            for h in clients {
                baton_cluster::hosts::netem_delay(h, rtt)?;
            }
        }
        let k = clients.len();
        // host i's share of a total: the remainder to the first hosts, at least one each
        let split = |total: Option<u64>, i: usize| {
            let k = k as u64;
            total.map(|n| (n / k + u64::from((i as u64) < n % k)).max(1))
        };
        let url = args
            .url
            .clone()
            .unwrap_or_else(|| "https://{addr}/".into())
            .replace("{addr}", &sut.entry.to_string());
        let mut cfgs = Vec::new();
        for i in 0..k {
            let mut a = args.clone();
            a.url = Some(url.clone());
            a.ca = Some(sut.ca.clone());
            a.sni.get_or_insert_with(|| "localhost".into());
            a.quiet = true;
            // the host is the source address
            a.source_ip.clear();
            a.connections = split(args.connections, i);
            a.clients = split(args.clients.map(|c| c as u64), i).map(|c| c as usize);
            // the runtimes of the client hosts share this machine's cores
            a.workers = Some(1);
            cfgs.push(Arc::new(a.resolve()?));
        }
        let before = sut.snapshot()?;
        let balancer0 = sut.balancer_pid().and_then(cpu_seconds_of);
        let client0 = baton_ops::process::usage().cpu_seconds;
        let t0 = Instant::now();
        let threads: Vec<_> = clients
            .iter()
            .zip(cfgs)
            .map(|(h, cfg)| {
                let netns = h.netns.clone();
                std::thread::spawn(move || {
                    baton_cluster::hosts::enter(&netns)?;
                    baton_bench::execute(cfg)
                })
            })
            .collect();
        let mut reports = Vec::new();
        for t in threads {
            let r = t
                .join()
                .map_err(|_| anyhow!("a client host's bench panicked"))??;
            reports.push(r);
        }
        let wall = t0.elapsed().as_secs_f64();
        let client_cpu = baton_ops::process::usage().cpu_seconds - client0;
        let report = merge_reports(&self.dir, &reports)?;
        let after = sut.settled(&before, report.requests.ok)?;
        let balancer1 = sut.balancer_pid().and_then(cpu_seconds_of);
        let per_server = before.iter().zip(&after).map(|(b, a)| a.minus(b)).collect();
        Ok(Run {
            report,
            per_server,
            balancer_cpu_s: balancer0.zip(balancer1).map(|(b, a)| a - b),
            client_cpu_s: client_cpu,
            wall_s: wall,
            cap_cores: self.cap_cores(),
        })
    }
}

/// Several client hosts' reports as one, through `baton bench merge` (counts add, histograms
/// merge, percentiles recomputed, TPS over the common span).
fn merge_reports(dir: &Path, reports: &[Report]) -> anyhow::Result<Report> {
    let dir = dir.join("client-hosts");
    std::fs::create_dir_all(&dir)?;
    let mut runs = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        let f = dir.join(format!("client{i}.json"));
        std::fs::write(&f, serde_json::to_vec(r)?)?;
        runs.push(f);
    }
    let out = dir.join("merged.json");
    baton_bench::merge_files(baton_bench::MergeArgs {
        runs,
        out: Some(out.clone()),
        report: None,
        quiet: true,
        threshold: Vec::new(),
    })?;
    let merged = serde_json::from_slice(&std::fs::read(&out)?)
        .context("reading the client hosts' merged report")?;
    Ok(merged)
}

/// The share of its CPU cap the busiest server must use over a run for the servers to count
/// as its limit ([`Run::servers_bound`]).
pub const AT_CAP: f64 = 0.85;

/// What one bench run measured, client side and server side.
#[derive(Debug)]
pub struct Run {
    pub report: Report,
    /// Per server (in the system's order): handshakes, requests, CPU during the run.
    pub per_server: Vec<ServerCounts>,
    /// CPU-seconds of the balancer (HAProxy or `baton dispatch`, all its threads), which runs
    /// uncapped and is not one of the servers.
    pub balancer_cpu_s: Option<f64>,
    /// CPU-seconds of the lab process during the run (the bench and the delay proxy).
    pub client_cpu_s: f64,
    pub wall_s: f64,
    /// Each server's CPU cap in cores (cgroup quotas; `None` when servers are pinned instead).
    pub cap_cores: Option<f64>,
}

impl Run {
    pub fn failed(&self) -> u64 {
        self.report.handshakes.failed + self.report.requests.failed
    }

    /// Full handshakes counted by the servers themselves.
    pub fn server_full(&self) -> u64 {
        self.per_server.iter().map(|s| s.full).sum()
    }

    pub fn server_resumed(&self) -> u64 {
        self.per_server.iter().map(|s| s.resumed).sum()
    }

    /// Cores the client used on average (bench + delay proxy).
    pub fn client_cores(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.client_cpu_s / self.wall_s
        } else {
            0.0
        }
    }

    /// Servers' CPU-seconds per transaction (the comparison that survives a noisy machine).
    pub fn server_cpu_per_tx_ms(&self) -> Option<f64> {
        let cpu: Option<f64> = self.per_server.iter().map(|s| s.cpu_s).sum();
        let n = self.report.requests.ok;
        cpu.filter(|_| n > 0).map(|c| c * 1e3 / n as f64)
    }

    /// The balancer's CPU-milliseconds per transaction, where a balancer stands in front.
    pub fn balancer_cpu_per_tx_ms(&self) -> Option<f64> {
        let n = self.report.requests.ok;
        self.balancer_cpu_s
            .filter(|_| n > 0)
            .map(|c| c * 1e3 / n as f64)
    }

    /// Whether the servers, not the client, the RTT or the balancer, limited the throughput:
    /// the busiest server used at least [`AT_CAP`] of its cap over the run, and every server
    /// was throttled at some point. (Throttled once is not enough: a run whose clients wait
    /// on round trips most of the time still meets the cap in bursts.) `None` without cgroups.
    pub fn servers_bound(&self) -> Option<bool> {
        let t: Option<Vec<u64>> = self.per_server.iter().map(|s| s.throttled).collect();
        let throttled = t.map(|t| t.iter().all(|&n| n > 0))?;
        let busiest = self
            .per_server
            .iter()
            .filter_map(|s| s.cpu_s)
            .fold(0.0f64, f64::max);
        let used = match self.cap_cores {
            Some(cap) if cap > 0.0 && self.wall_s > 0.0 => busiest / (cap * self.wall_s),
            _ => 1.0,
        };
        Some(throttled && used >= AT_CAP)
    }
}

/// One server's counters (cumulative, or a difference of two snapshots).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ServerCounts {
    pub full: u64,
    pub resumed: u64,
    pub requests: u64,
    /// Sessions this agent handed off (`out`) and imported (`in`) (CSSL-SF).
    pub migrated_out: u64,
    pub migrated_in: u64,
    /// Migrations that did not happen (`baton_migration_failures_total`, every reason).
    pub handoff_failures: u64,
    pub cpu_s: Option<f64>,
    pub throttled: Option<u64>,
}

impl ServerCounts {
    fn minus(&self, b: &ServerCounts) -> ServerCounts {
        ServerCounts {
            full: self.full.saturating_sub(b.full),
            resumed: self.resumed.saturating_sub(b.resumed),
            requests: self.requests.saturating_sub(b.requests),
            migrated_out: self.migrated_out.saturating_sub(b.migrated_out),
            migrated_in: self.migrated_in.saturating_sub(b.migrated_in),
            handoff_failures: self.handoff_failures.saturating_sub(b.handoff_failures),
            cpu_s: self.cpu_s.zip(b.cpu_s).map(|(a, b)| a - b),
            throttled: self
                .throttled
                .zip(b.throttled)
                .map(|(a, b)| a.saturating_sub(b)),
        }
    }
}

/// Where a server's own counts come from.
pub enum Counter {
    /// A Baton agent's /metrics.
    Metrics(SocketAddr),
    /// An nginx access log (index into the system's nginx instances).
    Nginx(usize),
    /// A server that counts nothing we can read (plain backends).
    None,
}

/// One capped server of a system under test.
pub struct Server {
    pub name: String,
    pub counter: Counter,
    pub confine: Confine,
    /// For the taskset fallback's CPU accounting (no cpuacct group): the server's process.
    pub pid: u32,
}

/// A running system under test. Dropping it stops everything it started.
pub struct Sut {
    pub name: String,
    /// Where clients connect.
    pub entry: SocketAddr,
    pub ca: PathBuf,
    pub servers: Vec<Server>,
    pub nginx: Vec<Nginx>,
    pub haproxy: Option<haproxy::Haproxy>,
    pub cluster: Option<Cluster>,
    pub agents: Vec<Proc>,
    /// Uncapped helpers (plain backends) kept alive with the system.
    pub backends: Vec<Nginx>,
    /// With [`Lab::across`]: the client hosts [`Lab::run`] loads from.
    pub client_hosts: Vec<Host>,
    /// With [`Lab::across`]: the namespaces of its processes, removed after them (last field).
    pub hosts: Option<Hosts>,
}

impl Sut {
    fn empty(name: &str, ca: PathBuf) -> Sut {
        Sut {
            name: name.into(),
            entry: SocketAddr::from(([127, 0, 0, 1], 0)),
            ca,
            servers: Vec::new(),
            nginx: Vec::new(),
            haproxy: None,
            cluster: None,
            agents: Vec::new(),
            backends: Vec::new(),
            client_hosts: Vec::new(),
            hosts: None,
        }
    }

    /// [`Sut::empty`], with its hosts and client hosts when the lab asks for them
    /// ([`Lab::across`]).
    fn empty_on(lab: &Lab, name: &str, ca: PathBuf) -> anyhow::Result<Sut> {
        let mut sut = Sut::empty(name, ca);
        if let Some(n) = lab.across {
            let mut hosts = Hosts::create()?;
            for i in 0..n {
                sut.client_hosts.push(hosts.add(&format!("client{i}"))?);
            }
            sut.hosts = Some(hosts);
        }
        Ok(sut)
    }

    /// A new host named `name` for one process, when the system runs across hosts.
    fn host(&mut self, name: &str) -> anyhow::Result<Option<Host>> {
        match &mut self.hosts {
            Some(h) => Ok(Some(h.add(name)?)),
            None => Ok(None),
        }
    }

    /// The balancer's process: HAProxy, or the cluster's dispatcher.
    pub fn balancer_pid(&self) -> Option<u32> {
        self.haproxy
            .as_ref()
            .map(|h| h.pid())
            .or_else(|| self.cluster.as_ref().map(|c| c.dispatcher.child.id()))
    }

    /// Every server's counters once they account for the run: nginx writes its access log
    /// every second and HAProxy logs a connection when both sides have closed, both a moment
    /// after the client is done; a handshake agent counts a session handed off when the
    /// dispatcher releases its stream, which waits for the next frame to that agent or a few
    /// milliseconds (`baton_link::RELEASE_DELAY`), so the last migrations' imports can be
    /// counted before their hand-offs. Waits (at most 10 s) until the servers counted
    /// `requests` more than `before`, as many sessions handed off as imported, and HAProxy
    /// logged every connection it passed on.
    fn settled(&self, before: &[ServerCounts], requests: u64) -> anyhow::Result<Vec<ServerCounts>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.snapshot()?;
            let run: Vec<ServerCounts> = now.iter().zip(before).map(|(n, b)| n.minus(b)).collect();
            let counted: u64 = run.iter().map(|c| c.requests).sum();
            let out: u64 = run.iter().map(|c| c.migrated_out).sum();
            let into: u64 = run.iter().map(|c| c.migrated_in).sum();
            let logged = self.haproxy.as_ref().is_none_or(|h| h.all_logged());
            if (counted >= requests && out == into && logged) || Instant::now() >= deadline {
                return Ok(now);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every server's cumulative counters now.
    pub fn snapshot(&self) -> anyhow::Result<Vec<ServerCounts>> {
        self.servers
            .iter()
            .map(|s| {
                let mut c = match &s.counter {
                    Counter::Metrics(addr) => agent_counts(*addr)?,
                    Counter::Nginx(i) => {
                        let n = self.nginx[*i].counts()?;
                        ServerCounts {
                            full: n.full,
                            resumed: n.resumed,
                            requests: n.requests,
                            ..Default::default()
                        }
                    }
                    Counter::None => ServerCounts::default(),
                };
                // no cpuacct group counting the server: its process alone
                c.cpu_s = s.confine.cpu_seconds().or_else(|| cpu_seconds_of(s.pid));
                c.throttled = s.confine.throttled();
                Ok(c)
            })
            .collect()
    }

    /// Errors the baselines logged (nginx error logs), to show next to the results.
    pub fn baseline_errors(&self) -> Vec<String> {
        self.nginx
            .iter()
            .chain(&self.backends)
            .flat_map(|n| n.logged_errors())
            .collect()
    }

    /// One Baton agent, capped.
    pub fn baton_single(
        lab: &Lab,
        name: &str,
        kind: KeyKind,
        extra: &[String],
    ) -> anyhow::Result<Sut> {
        let dir = lab.sut_dir(name)?;
        let pki = lab.pki(kind)?;
        let mut sut = Sut::empty_on(lab, name, pki.ca.clone())?;
        let confine = lab.confine("agent0", 0)?;
        let host = sut.host("agent0")?;
        let agent = lab.agent_on(&dir, "agent0", &pki, extra, &confine, host.as_ref())?;
        sut.entry = agent
            .addr("tls")
            .context("agent announced no TLS address")?;
        sut.servers.push(Server {
            name: "agent0".into(),
            counter: Counter::Metrics(agent.addr("metrics").context("agent metrics address")?),
            pid: agent.child.id(),
            confine,
        });
        sut.agents.push(agent);
        Ok(sut)
    }

    /// N Baton agents behind `baton dispatch` with `policy` and `store` (CSSL).
    pub fn baton_cluster(
        lab: &Lab,
        name: &str,
        agents: usize,
        policy: &str,
        store: Store,
        kind: KeyKind,
        agent_args: &[String],
    ) -> anyhow::Result<Sut> {
        let topology = baton_cluster::cluster::Topology {
            hosts: lab.across.is_some(),
            dispatchers: 1,
            client_hosts: lab.across.unwrap_or(0),
        };
        Sut::baton_cluster_on(lab, name, agents, policy, store, kind, agent_args, topology)
    }

    /// [`Sut::baton_cluster`] with a topology: across hosts (network namespaces, with client
    /// hosts that [`Lab::run`] then loads from), or with several dispatchers.
    #[allow(clippy::too_many_arguments)]
    pub fn baton_cluster_on(
        lab: &Lab,
        name: &str,
        agents: usize,
        policy: &str,
        store: Store,
        kind: KeyKind,
        agent_args: &[String],
        topology: baton_cluster::cluster::Topology,
    ) -> anyhow::Result<Sut> {
        let dir = lab.sut_dir(name)?;
        let caps: Vec<Arc<Confine>> = (0..agents)
            .map(|i| lab.confine(&format!("agent{i}"), i).map(Arc::new))
            .collect::<anyhow::Result<_>>()?;
        let cluster = Cluster::start(&ClusterSpec {
            baton: lab.baton.clone(),
            dir: dir.clone(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            agents,
            policy: policy.into(),
            store,
            key: kind,
            agent_args: agent_args.to_vec(),
            dispatcher_args: Vec::new(),
            agent_caps: caps
                .iter()
                .map(|c| c.clone() as Arc<dyn baton_cluster::Cap>)
                .collect(),
            topology,
        })?;
        let mut sut = Sut::empty(name, cluster.pki.ca.clone());
        sut.entry = cluster.addr();
        for (i, (a, c)) in cluster.agents.iter().zip(caps).enumerate() {
            sut.servers.push(Server {
                name: format!("agent{i}"),
                counter: Counter::Metrics(a.addr("metrics").context("agent metrics address")?),
                pid: a.child.id(),
                confine: Arc::try_unwrap(c).map_err(|_| anyhow!("cap still shared"))?,
            });
        }
        sut.cluster = Some(cluster);
        Ok(sut)
    }

    /// N TLS servers (Baton agents with their own sessions, or nginx) behind HAProxy `mode tcp`
    /// with `balance` (`source` = LB-IP, `roundrobin` = LB-RR).
    pub fn haproxy(
        lab: &Lab,
        name: &str,
        balance: &str,
        servers: usize,
        backend: Backend,
        kind: KeyKind,
        www: &Path,
    ) -> anyhow::Result<Sut> {
        let mut sut = match backend {
            Backend::Baton => Sut::baton_agents(lab, name, servers, kind)?,
            Backend::Nginx => Sut::nginx_servers(lab, name, servers, kind, www, None, None)?,
        };
        let addrs: Vec<SocketAddr> = match backend {
            Backend::Baton => sut
                .agents
                .iter()
                .map(|a| a.addr("tls").context("agent address"))
                .collect::<anyhow::Result<_>>()?,
            Backend::Nginx => sut.nginx.iter().map(Nginx::addr).collect(),
        };
        let dir = lab
            .dir
            .join(format!("{}-lb", sut.servers[0].confine.name()));
        let host = sut.host("lb")?;
        let h = haproxy::Haproxy::start_on("haproxy", balance, &addrs, &dir, host.as_ref())?;
        sut.entry = h.addr();
        sut.haproxy = Some(h);
        Ok(sut)
    }

    /// N Baton agents, each its own sessions and ticket keys, no balancer.
    fn baton_agents(lab: &Lab, name: &str, n: usize, kind: KeyKind) -> anyhow::Result<Sut> {
        let dir = lab.sut_dir(name)?;
        let pki = lab.pki(kind)?;
        let mut sut = Sut::empty_on(lab, name, pki.ca.clone())?;
        for i in 0..n {
            let confine = lab.confine(&format!("agent{i}"), i)?;
            let name = format!("agent{i}");
            let host = sut.host(&name)?;
            let agent = lab.agent_on(&dir, &name, &pki, &[], &confine, host.as_ref())?;
            sut.servers.push(Server {
                name: format!("agent{i}"),
                counter: Counter::Metrics(agent.addr("metrics").context("agent metrics")?),
                pid: agent.child.id(),
                confine,
            });
            sut.agents.push(agent);
        }
        sut.entry = sut.agents[0].addr("tls").context("agent address")?;
        Ok(sut)
    }

    /// N nginx TLS servers, each its own session cache and ticket keys, no balancer.
    pub fn nginx_servers(
        lab: &Lab,
        name: &str,
        n: usize,
        kind: KeyKind,
        www: &Path,
        ciphers: Option<String>,
        curve: Option<String>,
    ) -> anyhow::Result<Sut> {
        let dir = lab.sut_dir(name)?;
        let pki = lab.pki(kind)?;
        let mut sut = Sut::empty_on(lab, name, pki.ca.clone())?;
        for i in 0..n {
            let confine = lab.confine(&format!("nginx{i}"), i)?;
            let host = sut.host(&format!("nginx{i}"))?;
            let spec = nginx::Spec {
                ciphers: ciphers.clone(),
                curve: curve.clone(),
                ..nginx::Spec::new(&format!("nginx{i}"), nginx::Role::TlsServer, &pki, www)
            };
            let ng = Nginx::start_on(&spec, &dir, Some(&confine), host.as_ref())?;
            sut.servers.push(Server {
                name: format!("nginx{i}"),
                counter: Counter::Nginx(i),
                pid: ng.pid(),
                confine,
            });
            sut.nginx.push(ng);
        }
        sut.entry = sut.nginx[0].addr();
        Ok(sut)
    }

    /// The single TLS reverse proxy (capped like one server) in front of `backends` plain-HTTP
    /// nginx servers (each capped too): the CSSL paper's Pound, played by nginx (`upstream` block,
    /// `ip_hash` or round robin) or by a Baton agent (`--upstream` per backend,
    /// `--upstream-balance client-ip` or `round-robin`) in front of the same farm.
    pub fn tls_proxy(
        lab: &Lab,
        name: &str,
        proxy: Backend,
        backends: usize,
        ip_hash: bool,
        kind: KeyKind,
        www: &Path,
    ) -> anyhow::Result<Sut> {
        let dir = lab.sut_dir(name)?;
        let pki = lab.pki(kind)?;
        let mut sut = Sut::empty_on(lab, name, pki.ca.clone())?;
        let addrs = sut.plain_backends(lab, &dir, &pki, backends, www)?;
        let confine = lab.confine("tls-proxy", 0)?;
        let host = sut.host("tls-proxy")?;
        match proxy {
            Backend::Nginx => {
                let role = nginx::Role::TlsProxy {
                    backends: addrs,
                    ip_hash,
                };
                let spec = nginx::Spec::new("tls-proxy", role, &pki, www);
                let ng = Nginx::start_on(&spec, &dir, Some(&confine), host.as_ref())?;
                sut.proxy_in_front(ng.addr(), Counter::Nginx(0), ng.pid(), confine);
                sut.nginx.push(ng);
            }
            Backend::Baton => {
                let mut extra: Vec<String> = addrs
                    .iter()
                    .flat_map(|a| ["--upstream".to_string(), format!("http://{a}")])
                    .collect();
                let balance = if ip_hash { "client-ip" } else { "round-robin" };
                extra.extend(["--upstream-balance".into(), balance.into()]);
                let agent =
                    lab.agent_on(&dir, "tls-proxy", &pki, &extra, &confine, host.as_ref())?;
                let metrics = agent.addr("metrics").context("agent metrics address")?;
                let entry = agent
                    .addr("tls")
                    .context("agent announced no TLS address")?;
                sut.proxy_in_front(entry, Counter::Metrics(metrics), agent.child.id(), confine);
                sut.agents.push(agent);
            }
        }
        Ok(sut)
    }

    /// The TLS proxy is where clients connect, and the first server listed.
    fn proxy_in_front(&mut self, entry: SocketAddr, counter: Counter, pid: u32, confine: Confine) {
        self.entry = entry;
        let name = "tls-proxy".into();
        self.servers.insert(
            0,
            Server {
                name,
                counter,
                pid,
                confine,
            },
        );
    }

    /// `n` plain-HTTP nginx backends, each capped (their CPU is part of the system's cost,
    /// though they do no TLS) and counted as servers without handshakes; their addresses.
    fn plain_backends(
        &mut self,
        lab: &Lab,
        dir: &Path,
        pki: &Pki,
        n: usize,
        www: &Path,
    ) -> anyhow::Result<Vec<SocketAddr>> {
        let mut addrs = Vec::new();
        for i in 0..n {
            let confine = lab.confine(&format!("backend{i}"), i + 1)?;
            let spec = nginx::Spec::new(&format!("backend{i}"), nginx::Role::Plain, pki, www);
            let host = self.host(&format!("backend{i}"))?;
            let ng = Nginx::start_on(&spec, dir, Some(&confine), host.as_ref())?;
            addrs.push(ng.addr());
            self.servers.push(Server {
                name: format!("backend{i}"),
                counter: Counter::None,
                pid: ng.pid(),
                confine,
            });
            self.backends.push(ng);
        }
        Ok(addrs)
    }
}

/// Which TLS implementation plays a role: the servers behind a balancer, or the TLS proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Baton,
    Nginx,
}

impl Drop for Sut {
    fn drop(&mut self) {
        // Balancer first (no new connections), then the servers; their caps go last (a cgroup
        // can only be removed once its processes are gone).
        self.haproxy.take();
        self.cluster.take();
        for a in &mut self.agents {
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
        self.nginx.clear();
        self.backends.clear();
        self.servers.clear();
    }
}

/// Full/resumed handshakes and requests from a Baton agent's /metrics.
fn agent_counts(addr: SocketAddr) -> anyhow::Result<ServerCounts> {
    let page = baton_bench::scrape::page_blocking(addr)?;
    let samples = baton_bench::scrape::samples(&page);
    let sum = |name: &str, with: &[(&str, &str)]| -> u64 {
        baton_bench::scrape::sum(&samples, name, with) as u64
    };
    Ok(ServerCounts {
        full: sum("baton_handshakes_total", &[("kind", "full")]),
        resumed: sum("baton_handshakes_total", &[("kind", "resumed")]),
        requests: sum("baton_http_requests_total", &[]),
        migrated_out: sum("baton_sessions_migrated_total", &[("direction", "out")]),
        migrated_in: sum("baton_sessions_migrated_total", &[("direction", "in")]),
        handoff_failures: sum("baton_migration_failures_total", &[]),
        ..Default::default()
    })
}

pub use baton_cluster::free_port;

/// Waits, at most `limit`, until something accepts on 127.0.0.1:`port` (a server just started).
pub fn wait_port(port: u16, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("nothing listens on 127.0.0.1:{port}")
}

fn path(p: &Path) -> String {
    p.display().to_string()
}
