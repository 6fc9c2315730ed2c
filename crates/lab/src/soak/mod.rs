//! `baton lab soak`: the chaos soak. Two systems under load at once, while a fault
//! injector works through a seeded schedule:
//!
//! - side A: `baton up --agents 3 --policy migration --store redis` (the lab's [`Cluster`]) with a
//!   real `redis-server`, its dispatcher with an admin endpoint (`--admin`, a token);
//! - side B: three agents with `--store peers` (also a [`Cluster`], whose own dispatcher is
//!   stopped at once) behind HAProxy `mode tcp` (`balance roundrobin`, TCP health checks every
//!   0.5 s, two misses to take a server out, `option redispatch`, PROXY v2 to the agents), which
//!   logs the agent of every connection.
//!
//! Faults (`schedule.rs`): SIGKILL an agent and start it again on the same ports, SIGSTOP an
//! agent for 5 s, SIGKILL Redis and start it again (empty), SIGKILL A's dispatcher and start it
//! again, and the attacker (`attacker.rs`), a flood against every listener: dispatcher, agents'
//! TLS, link and replication ports, every metrics endpoint, the dispatcher's admin endpoint,
//! HAProxy. Load (`load.rs`): open-loop requests at a fixed rate on each side, each recorded
//! with its times and error; every other listener's legitimate peer is checked once a second
//! (`probe.rs`). Attribution (`account.rs`) explains a failure only by a killed or stopped
//! process that served the request (or the check), at a time the module documents; anything
//! else is unexplained. Every process's descriptors and RSS are sampled each second
//! (`sample.rs`), every agent's /metrics too (counters summed over restarts).
//!
//! The run fails on an unexplained failure of a request or a check, a listener whose
//! legitimate peer was never served, a process that ends the quiet period above its start by
//! more than the tolerances of `sample.rs`, a panic in any log, or a fault that could not be
//! carried out. (`baton signer` is not part of the soak: its socket is a Unix one, and no
//! agent of the soak uses a signer.)

pub mod account;
pub mod attacker;
pub mod load;
pub mod probe;
mod report;
pub mod sample;
pub mod schedule;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::rig::redis::Redis;
use crate::rig::Lab;
use crate::table::Table;
use account::{Check, Process, Request, Window};
use attacker::{Proto, Target};
use baton_cluster::cluster::{spawn_ready, Cluster, ClusterSpec, Proc, Store};
use baton_cluster::pki::KeyKind;
use baton_cluster::signal::Signal;
use sample::Sample;
use schedule::{Event, Fault, Plan, Side};

/// `baton lab soak`: load both systems while faults are injected; every failure accounted for.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoakArgs {
    /// Length of the load, warm-up and quiet period included (e.g. 10m). Default 10m, or 90s
    /// with --quick (each fault kind once).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Seed of the fault schedule: the same seed, the same faults at the same times.
    #[arg(long, default_value_t = 15, value_name = "N")]
    pub seed: u64,
    /// Requests per second on each side. Default 100 (two sides, a 2-core machine).
    #[arg(long, value_name = "N")]
    pub rate: Option<u32>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    baton_bench::parse_duration(s).map_err(|e| e.to_string())
}

/// Runs the soak; its tables (the caller prints them; any `failed` entry fails the run).
pub fn run(lab: &Lab, args: SoakArgs) -> anyhow::Result<Vec<Table>> {
    let duration = args.duration.unwrap_or(if lab.quick {
        schedule::QUICK_DURATION
    } else {
        schedule::FULL_DURATION
    });
    let plan = schedule::schedule(args.seed, duration, lab.quick);
    let rate = args.rate.unwrap_or(100).max(1) as f64;
    if !crate::rig::haproxy::available() {
        bail!(
            "the soak needs haproxy ({}; BATON_HAPROXY names another)",
            crate::rig::haproxy::binary().display()
        );
    }
    if !crate::rig::redis::available() {
        bail!("the soak needs redis-server");
    }
    println!(
        "soak: seed {}, {} s of load at {rate}/s per side, faults from {} s to {} s, then quiet \
         (servers not capped: --quota and --rtt do not apply)",
        args.seed,
        plan.duration.as_secs(),
        plan.warmup.as_secs(),
        plan.faults_end.as_secs()
    );
    for e in &plan.events {
        println!(
            "  {:>6.1} s  {:<24} for {:.1} s",
            e.at.as_secs_f64(),
            e.fault.to_string(),
            e.len.as_secs_f64()
        );
    }
    let dir = lab.dir.join("soak");
    std::fs::create_dir_all(&dir)?;
    let sys = Systems::start(lab, &dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut outcome = runtime.block_on(drive(&plan, rate, args.seed, sys))?;
    let log = std::fs::read(dir.join("haproxy").join("haproxy.log")).unwrap_or_default();
    name_agents(
        &mut outcome.requests,
        &String::from_utf8_lossy(&log),
        outcome.wall0,
    );
    Ok(report::report(&plan, &dir, outcome))
}

// ---------------------------------------------------------------------------------------------
// the systems under test

/// HAProxy in front of side B: like the lab's (`rig/haproxy.rs`), plus what a production
/// configuration has and a soak needs: health checks, redispatch of refused connects, and the
/// PROXY header the agents expect.
struct Haproxy {
    child: Child,
    addr: SocketAddr,
}

impl Haproxy {
    fn start(servers: &[SocketAddr], dir: &Path) -> anyhow::Result<Haproxy> {
        let dir = dir.join("haproxy");
        std::fs::create_dir_all(&dir)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], crate::rig::free_port()?));
        let sock = dir.join("stats.sock");
        // every connection logged with its client's address and port and the agent it went to
        let mut cfg = format!(
            "global\n  nbthread 1\n  maxconn 4000\n  stats socket {} mode 600 level user\n  \
             log stdout format raw local0\n\
             defaults\n  mode tcp\n  log global\n  log-format \"conn %ci:%cp %s %ts %Ts.%ms\"\n  \
             timeout connect 2s\n  timeout client 30s\n  \
             timeout server 30s\n  retries 3\n  option redispatch 1\n\
             frontend fe\n  bind {addr}\n  default_backend be\n\
             backend be\n  balance roundrobin\n  \
             default-server inter 500ms fall 2 rise 1 send-proxy-v2\n",
            sock.display()
        );
        for (i, a) in servers.iter().enumerate() {
            cfg.push_str(&format!("  server s{i} {a} check\n"));
        }
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, cfg)?;
        let log = std::fs::File::create(dir.join("haproxy.log"))?;
        let mut child = Command::new(crate::rig::haproxy::binary())
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting haproxy")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "haproxy exited at start ({status}): {}",
                    std::fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("haproxy did not start in 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Haproxy { child, addr })
    }
}

/// Each client address and port in HAProxy's log (`conn ADDR SERVER STATE ACCEPTED` lines):
/// when it was accepted (Unix time, s) and its agent (server `sI`; `None` for `<NOSRV>`). A
/// port comes back in a long run, so one address may have several.
fn served_by(log: &str) -> HashMap<SocketAddr, Vec<(f64, Option<usize>)>> {
    let mut out: HashMap<SocketAddr, Vec<(f64, Option<usize>)>> = HashMap::new();
    for line in log.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let ["conn", addr, server, _state, accepted] = w.as_slice() else {
            continue;
        };
        let (Ok(addr), Ok(accepted)) = (addr.parse(), accepted.parse()) else {
            continue;
        };
        let agent = server.strip_prefix('s').and_then(|i| i.parse().ok());
        out.entry(addr).or_default().push((accepted, agent));
    }
    out
}

/// How far HAProxy's accept may be from the client's start of a request, to be its line, s.
const ACCEPT_SLACK: f64 = 1.0;

/// Names the agent of every request of side B from HAProxy's log: the line of its address
/// whose accept is nearest its start (`wall0`: the start of the load, in Unix time), if
/// within [`ACCEPT_SLACK`].
fn name_agents(requests: &mut [Request], log: &str, wall0: f64) {
    let by = served_by(log);
    for r in requests.iter_mut().filter(|r| r.side == Side::B) {
        let at = wall0 + r.start.as_secs_f64();
        r.served_by = r
            .local
            .and_then(|l| by.get(&l))
            .and_then(|lines| {
                lines
                    .iter()
                    .map(|(accepted, agent)| ((accepted - at).abs(), *agent))
                    .filter(|(off, _)| *off <= ACCEPT_SLACK)
                    .min_by(|a, b| a.0.total_cmp(&b.0))
            })
            .and_then(|(_, agent)| agent);
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything the soak runs; faults act on it under a lock.
struct Systems {
    baton: PathBuf,
    a: Cluster,
    b: Cluster,
    redis: Redis,
    haproxy: Haproxy,
    restarts: usize,
    /// The token of A's dispatcher's admin endpoint.
    admin_token: Arc<baton_ops::guard::Token>,
}

impl Systems {
    fn start(lab: &Lab, dir: &Path) -> anyhow::Result<Systems> {
        let redis = Redis::start(dir)?;
        // A's dispatcher has an admin endpoint, as `baton up --admin` gives it: one more
        // listener to attack, and its legitimate peer calls it with the token
        std::fs::create_dir_all(dir.join("a"))?;
        let token_file = dir.join("a").join("admin-token");
        let admin_token = Arc::new(baton_ops::guard::Token::load_or_create(&token_file)?);
        let admin_args = [
            "--admin".to_string(),
            "127.0.0.1:0".into(),
            "--admin-token-file".into(),
            token_file.display().to_string(),
        ];
        let spec = |name: &str,
                    policy: &str,
                    store: Store,
                    agent_args: &[&str],
                    dispatcher_args: &[String]|
         -> anyhow::Result<ClusterSpec> {
            Ok(ClusterSpec {
                baton: lab.baton.clone(),
                dir: dir.join(name),
                listen: SocketAddr::from(([127, 0, 0, 1], crate::rig::free_port()?)),
                agents: schedule::AGENTS,
                policy: policy.into(),
                store,
                key: KeyKind::EcdsaP256,
                agent_args: agent_args.iter().map(|a| a.to_string()).collect(),
                dispatcher_args: dispatcher_args.to_vec(),
                agent_caps: Vec::new(),
                topology: Default::default(),
            })
        };
        // no stateless tickets on side A: sessions live in Redis, so its outage costs something
        let a = Cluster::start(&spec(
            "a",
            "handoff",
            Store::Redis(redis.url()),
            &["--tickets", "false"],
            &admin_args,
        )?)?;
        let mut b = Cluster::start(&spec("b", "round-robin", Store::Peers, &[], &[])?)?;
        // side B's front is HAProxy: its own dispatcher goes
        let _ = b.dispatcher.child.kill();
        let _ = b.dispatcher.child.wait();
        let servers: Vec<SocketAddr> = b
            .agents
            .iter()
            .map(|p| p.addr("tls").context("agent TLS address"))
            .collect::<anyhow::Result<_>>()?;
        let haproxy = Haproxy::start(&servers, dir)?;
        Ok(Systems {
            baton: lab.baton.clone(),
            a,
            b,
            redis,
            haproxy,
            restarts: 0,
            admin_token,
        })
    }

    fn cluster(&mut self, side: Side) -> &mut Cluster {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Every listener an attacker can reach, named by kind and process.
    fn listeners(&self) -> Vec<Target> {
        let target = |name: String, addr: SocketAddr, proto: Proto| Target { name, addr, proto };
        let d = &self.a.dispatcher;
        let mut out = vec![target("dispatcher".into(), self.a.addr(), Proto::Tls)];
        if let Some(addr) = d.addr("metrics") {
            out.push(target("metrics dispatcher".into(), addr, Proto::Http));
        }
        if let Some(addr) = d.addr("admin") {
            out.push(target("admin".into(), addr, Proto::Http));
        }
        for (side, c) in [(Side::A, &self.a), (Side::B, &self.b)] {
            for (i, p) in c.agents.iter().enumerate() {
                for (kind, proto) in [
                    ("tls", Proto::Tls),
                    ("link", Proto::Binary),
                    ("metrics", Proto::Http),
                ] {
                    if let Some(addr) = p.addr(kind) {
                        out.push(target(format!("{kind} {side}{i}"), addr, proto));
                    }
                }
                if let Some(peer) = flag_value(&cmdline(p.child.id()), "--peer-listen") {
                    if let Ok(addr) = peer.parse() {
                        out.push(target(format!("peer {side}{i}"), addr, Proto::Binary));
                    }
                }
            }
        }
        out.push(target("haproxy".into(), self.haproxy.addr, Proto::Tls));
        out
    }

    /// The legitimate peers to check besides the load: every metrics endpoint (with what an
    /// agent's page says about its links or its replication), the admin endpoint, every
    /// agent's TLS listener.
    fn probes(&self, roots: [&Arc<rustls::RootCertStore>; 2]) -> Vec<probe::Probe> {
        let d = &self.a.dispatcher;
        let links = baton_cluster::rollout::links_per_dispatcher(&[]);
        let mut out = Vec::new();
        if let Some(addr) = d.addr("metrics") {
            out.push(probe::Probe::Metrics {
                process: Process::Dispatcher,
                addr,
                links,
            });
        }
        if let Some(addr) = d.addr("admin") {
            out.push(probe::Probe::Admin {
                addr,
                token: self.admin_token.clone(),
            });
        }
        for (side, c, roots) in [(Side::A, &self.a, roots[0]), (Side::B, &self.b, roots[1])] {
            for (i, p) in c.agents.iter().enumerate() {
                let process = Process::Agent(side, i);
                if let Some(addr) = p.addr("metrics") {
                    out.push(probe::Probe::Metrics {
                        process,
                        addr,
                        links,
                    });
                }
                if let Some(addr) = p.addr("tls") {
                    out.push(probe::Probe::Tls {
                        process,
                        addr,
                        roots: roots.clone(),
                    });
                }
            }
        }
        out
    }
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

/// A process's arguments for a restart on the same ports: each `FLAG 127.0.0.1:0` becomes the
/// address it announced as `kind`.
fn pinned(
    args: &[String],
    addrs: &HashMap<String, SocketAddr>,
    map: &[(&str, &str)],
) -> Vec<String> {
    let mut out: Vec<String> = args.iter().skip(1).cloned().collect();
    for i in 1..out.len() {
        if !out[i].ends_with(":0") {
            continue;
        }
        if let Some((_, kind)) = map.iter().find(|(flag, _)| out[i - 1] == *flag) {
            if let Some(a) = addrs.get(*kind) {
                out[i] = a.to_string();
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// what is watched: processes, their samples and counters

/// One process slot (a process and its restarts).
struct Slot {
    name: String,
    pid: u32,
    metrics: Option<SocketAddr>,
    samples: Vec<Sample>,
    /// Latest counters of each incarnation (pid).
    counters: BTreeMap<u32, Counters>,
}

#[derive(Debug, Clone, Default)]
struct Counters {
    full: u64,
    resumed: u64,
    /// The series of [`WATCHED`] families, agent labels dropped.
    other: BTreeMap<String, u64>,
}

/// The servers' own counters the report shows besides handshakes: how agents ended the
/// attackers' connections, how the dispatcher routed around dead agents, Redis fallbacks.
const WATCHED: &[&str] = &[
    "baton_handshake_failures_total",
    "baton_migration_failures_total",
    "baton_session_store_events_total",
    "baton_dispatch_connect_failures_total",
    "baton_dispatch_migrations_total",
    "baton_dispatch_hellos_total",
    "baton_dispatch_no_agent_total",
    "baton_dispatch_rejected_total",
];

/// Every sample of a Prometheus / OpenMetrics text page: (series with labels, value).
fn series(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            // `name{labels} value [timestamp]`; label values may hold spaces, so split after '}'
            let (key, rest) = match l.rfind('}') {
                Some(i) => (&l[..=i], &l[i + 1..]),
                None => l.split_once(' ')?,
            };
            let value = rest.split_whitespace().next()?.parse().ok()?;
            Some((key.trim().to_string(), value))
        })
        .collect()
}

/// `family{a="1",agent="2"}` without its `agent` label (counts are summed over agents).
fn without_agent(series: &str) -> String {
    let Some((family, labels)) = series.split_once('{') else {
        return series.to_string();
    };
    let labels: Vec<&str> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|l| !l.is_empty() && !l.starts_with("agent="))
        .collect();
    if labels.is_empty() {
        family.to_string()
    } else {
        format!("{family}{{{}}}", labels.join(","))
    }
}

/// Full and resumed handshakes from an agent's /metrics (short timeouts: a stopped agent
/// accepts and never answers).
fn scrape(addr: SocketAddr) -> Option<Counters> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(800))).ok()?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = Vec::new();
    s.take(8 << 20).read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let body = text.split_once("\r\n\r\n")?.1;
    let m = series(body);
    let sum = |label: &str| -> u64 {
        m.iter()
            .filter(|(k, _)| k.starts_with("baton_handshakes_total{") && k.contains(label))
            .map(|(_, v)| *v as u64)
            .sum()
    };
    let mut other = BTreeMap::new();
    for (k, v) in &m {
        if WATCHED.iter().any(|f| k.split('{').next() == Some(*f)) {
            *other.entry(without_agent(k)).or_default() += *v as u64;
        }
    }
    Some(Counters {
        full: sum("kind=\"full\""),
        resumed: sum("kind=\"resumed\""),
        other,
    })
}

struct Watch {
    t0: Instant,
    slots: Vec<Slot>,
}

impl Watch {
    fn new(sys: &Systems, t0: Instant) -> Watch {
        let mut slots = vec![Slot::new(
            "A dispatcher",
            sys.a.dispatcher.child.id(),
            sys.a.dispatcher.addr("metrics"),
        )];
        for (side, c) in [(Side::A, &sys.a), (Side::B, &sys.b)] {
            for (i, p) in c.agents.iter().enumerate() {
                slots.push(Slot::new(
                    &format!("{side} agent{i}"),
                    p.child.id(),
                    p.addr("metrics"),
                ));
            }
        }
        slots.push(Slot::new("A redis", sys.redis.pid(), None));
        slots.push(Slot::new("B haproxy", sys.haproxy.child.id(), None));
        Watch { t0, slots }
    }

    fn slot(&mut self, name: &str) -> &mut Slot {
        self.slots
            .iter_mut()
            .find(|s| s.name == name)
            .expect("a known slot")
    }

    /// One round: every process's size, every agent's counters.
    fn round(w: &Mutex<Watch>) {
        let (t, todo): (Duration, Vec<(usize, u32, Option<SocketAddr>)>) = {
            let w = w.lock().unwrap();
            (
                w.t0.elapsed(),
                w.slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (i, s.pid, s.metrics))
                    .collect(),
            )
        };
        for (i, pid, metrics) in todo {
            let s = sample::sample(pid, t);
            let c = metrics.and_then(scrape);
            let mut w = w.lock().unwrap();
            let slot = &mut w.slots[i];
            if slot.pid != pid {
                continue; // restarted meanwhile
            }
            if let Some(s) = s {
                slot.samples.push(s);
            }
            if let Some(c) = c {
                slot.counters.insert(pid, c);
            }
        }
    }
}

impl Slot {
    fn new(name: &str, pid: u32, metrics: Option<SocketAddr>) -> Slot {
        Slot {
            name: name.into(),
            pid,
            metrics,
            samples: Vec::new(),
            counters: BTreeMap::new(),
        }
    }

    fn totals(&self) -> Counters {
        self.counters
            .values()
            .fold(Counters::default(), |mut a, c| {
                a.add(c);
                a
            })
    }
}

impl Counters {
    fn add(&mut self, c: &Counters) {
        self.full += c.full;
        self.resumed += c.resumed;
        for (k, v) in &c.other {
            *self.other.entry(k.clone()).or_default() += v;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the run

struct SoakRun {
    requests: Vec<Request>,
    skipped: BTreeMap<Side, u64>,
    windows: Vec<(Event, Result<Window, String>)>,
    /// The listeners' legitimate peers, checked.
    checks: Vec<Check>,
    /// What the attacker flooded.
    targets: Vec<Target>,
    /// The start of the load, Unix time in seconds (HAProxy's log has no other clock).
    wall0: f64,
    attacks: Vec<(Event, BTreeMap<String, attacker::Stats>)>,
    watch: Watch,
    warmup: Duration,
}

async fn drive(plan: &Plan, rate: f64, seed: u64, sys: Systems) -> anyhow::Result<SoakRun> {
    let roots_a = load::roots(&sys.a.pki.ca)?;
    let roots_b = load::roots(&sys.b.pki.ca)?;
    let (entry_a, entry_b) = (sys.a.addr(), sys.haproxy.addr);
    let targets = sys.listeners();
    let probes = sys.probes([&roots_a, &roots_b]);
    // let peers and links settle
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    let wall0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let until = t0 + plan.duration;
    let watch = Arc::new(Mutex::new(Watch::new(&sys, t0)));
    let sys = Arc::new(Mutex::new(sys));

    // sampling, once a second until told to stop
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let (watch, stop) = (watch.clone(), stop.clone());
        move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                Watch::round(&watch);
                next += Duration::from_secs(1);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        }
    });

    let mut loads = tokio::task::JoinSet::new();
    for (side, addr, roots) in [(Side::A, entry_a, roots_a), (Side::B, entry_b, roots_b)] {
        let l = load::Load {
            side,
            addr,
            rate,
            max_in_flight: 2000,
            roots,
        };
        loads.spawn(async move { (side, load::run(l, t0, until).await) });
    }

    // the listeners' legitimate peers, for as long as the load
    let checks: Arc<Mutex<Vec<Check>>> = Arc::default();
    let mut checking = tokio::task::JoinSet::new();
    for p in probes {
        checking.spawn(probe::run(p, t0, until, checks.clone()));
    }

    let mut faults = tokio::task::JoinSet::new();
    let mut attacks = tokio::task::JoinSet::new();
    for (n, e) in plan.events.iter().copied().enumerate() {
        let start = tokio::time::Instant::from_std(t0 + e.at);
        match e.fault {
            Fault::Attack(kind) => {
                let targets = targets.clone();
                attacks.spawn(async move {
                    tokio::time::sleep_until(start).await;
                    let s = attacker::attack(kind, targets, e.len, seed ^ n as u64).await;
                    (e, s)
                });
            }
            _ => {
                let (sys, watch) = (sys.clone(), watch.clone());
                faults.spawn(async move {
                    tokio::time::sleep_until(start).await;
                    let w = tokio::task::spawn_blocking(move || inject(&sys, &watch, e, t0))
                        .await
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| format!("{e:#}")));
                    if let Err(err) = &w {
                        eprintln!("soak: {} failed: {err}", e.fault);
                    }
                    (e, w)
                });
            }
        }
    }
    let mut requests = Vec::new();
    let mut skipped = BTreeMap::new();
    while let Some(r) = loads.join_next().await {
        let (side, rec) = r?;
        requests.extend(rec.requests);
        skipped.insert(side, rec.skipped);
    }
    let mut windows = Vec::new();
    while let Some(r) = faults.join_next().await {
        windows.push(r?);
    }
    windows.sort_by_key(|(e, _)| e.at);
    let mut attack_stats = Vec::new();
    while let Some(r) = attacks.join_next().await {
        attack_stats.push(r?);
    }
    attack_stats.sort_by_key(|(e, _)| e.at);
    while checking.join_next().await.is_some() {}
    let checks = std::mem::take(&mut *checks.lock().unwrap());
    // the load is over: connections close, then the last sample is the end
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let _ = tokio::task::spawn_blocking(move || sampler.join()).await;
    Watch::round(&watch);
    // stop everything before the logs are read
    drop(Arc::try_unwrap(sys).map_err(|_| anyhow!("systems still shared"))?);
    let watch = Arc::try_unwrap(watch)
        .map_err(|_| anyhow!("samples still shared"))?
        .into_inner()
        .unwrap();
    Ok(SoakRun {
        requests,
        skipped,
        windows,
        checks,
        targets,
        wall0,
        attacks: attack_stats,
        watch,
        warmup: plan.warmup,
    })
}

/// Carries out one process fault (blocking); when it happened and when the process was back.
fn inject(
    sys: &Mutex<Systems>,
    watch: &Mutex<Watch>,
    e: Event,
    t0: Instant,
) -> anyhow::Result<Window> {
    // side A's dispatcher names no agent per request: its counters on the agent cap what the
    // fault may excuse (`account.rs`)
    let dispatcher_metrics = sys.lock().unwrap().a.dispatcher.addr("metrics");
    let on_agent = move |agent: usize| match dispatcher_metrics {
        Some(m) => dispatcher_on(m, agent),
        None => None,
    };
    match e.fault {
        Fault::KillAgent { side, agent } => {
            let before = (side == Side::A).then(|| on_agent(agent));
            let later = std::thread::spawn(move || {
                std::thread::sleep(account::DETECT);
                (side == Side::A).then(|| on_agent(agent))
            });
            let (args, at, addrs, log) = {
                let mut s = sys.lock().unwrap();
                let c = s.cluster(side);
                let p = &mut c.agents[agent];
                let (args, at) =
                    kill_keeping_counters(p, &format!("{side} agent{agent}"), watch, t0);
                let addrs = p.addrs.clone();
                let log = c
                    .dir
                    .join(format!("agent-{agent}.{}.log", e.at.as_millis()));
                (args, at, addrs, log)
            };
            let dead = t0.elapsed();
            std::thread::sleep(e.len);
            let args = pinned(
                &args,
                &addrs,
                &[
                    ("--listen", "tls"),
                    ("--metrics", "metrics"),
                    ("--link-listen", "link"),
                ],
            );
            let baton = sys.lock().unwrap().baton.clone();
            let p = respawn(&baton, &args, &log)?;
            let back = t0.elapsed();
            let pid = p.child.id();
            {
                let mut s = sys.lock().unwrap();
                s.restarts += 1;
                s.cluster(side).agents[agent] = p;
            }
            watch
                .lock()
                .unwrap()
                .slot(&format!("{side} agent{agent}"))
                .pid = pid;
            let after = later.join().unwrap_or(None);
            Ok(Window {
                fault: e.fault,
                at,
                dead,
                back,
                budget: budget(before, after),
            })
        }
        Fault::StopAgent { side, agent } => {
            let pid = sys.lock().unwrap().cluster(side).agents[agent].child.id();
            let before = (side == Side::A).then(|| on_agent(agent));
            let at = t0.elapsed();
            baton_cluster::signal::send(pid, Signal::STOP);
            let dead = t0.elapsed();
            std::thread::sleep(e.len);
            baton_cluster::signal::send(pid, Signal::CONT);
            let back = t0.elapsed();
            let after = (side == Side::A).then(|| {
                std::thread::sleep(account::DETECT);
                on_agent(agent)
            });
            Ok(Window {
                fault: e.fault,
                at,
                dead,
                back,
                budget: budget(before, after),
            })
        }
        Fault::KillRedis => {
            let at = t0.elapsed();
            sys.lock().unwrap().redis.kill();
            let dead = t0.elapsed();
            std::thread::sleep(e.len);
            let pid = {
                let mut s = sys.lock().unwrap();
                s.redis.spawn()?;
                s.redis.pid()
            };
            watch.lock().unwrap().slot("A redis").pid = pid;
            Ok(Window {
                fault: e.fault,
                at,
                dead,
                back: t0.elapsed(),
                budget: None,
            })
        }
        Fault::RestartDispatcher => {
            let (args, at, addrs, log) = {
                let mut s = sys.lock().unwrap();
                let (args, at) =
                    kill_keeping_counters(&mut s.a.dispatcher, "A dispatcher", watch, t0);
                let log = s.a.dir.join(format!("dispatch.{}.log", e.at.as_millis()));
                (args, at, s.a.dispatcher.addrs.clone(), log)
            };
            let dead = t0.elapsed();
            std::thread::sleep(e.len);
            let args = pinned(
                &args,
                &addrs,
                &[
                    ("--listen", "dispatch"),
                    ("--metrics", "metrics"),
                    ("--admin", "admin"),
                ],
            );
            let baton = sys.lock().unwrap().baton.clone();
            let p = respawn(&baton, &args, &log)?;
            let back = t0.elapsed();
            let pid = p.child.id();
            sys.lock().unwrap().a.dispatcher = p;
            watch.lock().unwrap().slot("A dispatcher").pid = pid;
            Ok(Window {
                fault: e.fault,
                at,
                dead,
                back,
                budget: None,
            })
        }
        Fault::Attack(_) => bail!("attacks are not process faults"),
    }
}

/// What side A's dispatcher has on `agent`, from its metrics at `addr`: (connections open on
/// it, connections routed to it so far); `None` if three scrapes failed.
fn dispatcher_on(addr: SocketAddr, agent: usize) -> Option<(u64, u64)> {
    let label = agent.to_string();
    for _ in 0..3 {
        let Ok(page) = baton_bench::scrape::page_blocking(addr) else {
            continue;
        };
        let m = baton_bench::scrape::samples(&page);
        let with = [("agent", label.as_str())];
        let active = baton_bench::scrape::sum(&m, "baton_dispatch_connections_active", &with);
        let routed = baton_bench::scrape::sum(&m, "baton_dispatch_connections_total", &with);
        return Some((active as u64, routed as u64));
    }
    None
}

/// The failures an agent's fault may excuse on side A: what the dispatcher had open on it at
/// the signal, plus what it routed to it until the balancer noticed. `None` off side A; an
/// unknown count excuses nothing.
fn budget(before: Option<Option<(u64, u64)>>, after: Option<Option<(u64, u64)>>) -> Option<u64> {
    match (before?, after?) {
        (Some((open, routed_before)), Some((_, routed_after))) => {
            Some(open + routed_after.saturating_sub(routed_before))
        }
        _ => Some(0),
    }
}

/// SIGKILLs `p` and reaps it, keeping its counters up to the kill in `slot` (a restarted
/// process counts from zero); its command line, to start it again, and when the signal went.
fn kill_keeping_counters(
    p: &mut Proc,
    slot: &str,
    watch: &Mutex<Watch>,
    t0: Instant,
) -> (Vec<String>, Duration) {
    let pid = p.child.id();
    let args = cmdline(pid);
    if let Some(m) = p.addr("metrics").and_then(scrape) {
        watch.lock().unwrap().slot(slot).counters.insert(pid, m);
    }
    let at = t0.elapsed();
    baton_cluster::signal::send(pid, Signal::KILL);
    let _ = p.child.wait();
    (args, at)
}

/// Starts a process again on its ports; a port still held a moment after a kill is retried.
fn respawn(baton: &Path, args: &[String], log: &Path) -> anyhow::Result<Proc> {
    let mut last = None;
    for _ in 0..5 {
        match spawn_ready(baton, args, log) {
            Ok(p) => return Ok(p),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Err(last.unwrap_or_else(|| anyhow!("no attempt")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_pages_are_read_whole() {
        let page = "# TYPE baton_dispatch_connect_failures counter\n\
                    baton_dispatch_connect_failures_total{agent=\"0\"} 3\n\
                    baton_handshakes_total{version=\"1.3\",kind=\"full\"} 12 1700000000\n\
                    process_cpu_seconds_total 1.5\n# EOF\n";
        assert_eq!(
            series(page),
            vec![
                (
                    "baton_dispatch_connect_failures_total{agent=\"0\"}".to_string(),
                    3.0
                ),
                (
                    "baton_handshakes_total{version=\"1.3\",kind=\"full\"}".to_string(),
                    12.0
                ),
                ("process_cpu_seconds_total".to_string(), 1.5),
            ]
        );
    }

    #[test]
    fn agent_labels_are_dropped_from_series() {
        assert_eq!(
            without_agent("baton_dispatch_connect_failures_total{agent=\"2\"}"),
            "baton_dispatch_connect_failures_total"
        );
        assert_eq!(
            without_agent("baton_dispatch_connections_total{agent=\"1\",reason=\"ticket\"}"),
            "baton_dispatch_connections_total{reason=\"ticket\"}"
        );
        assert_eq!(without_agent("x_total"), "x_total");
    }

    #[test]
    fn haproxy_log_names_each_requests_agent_by_address_and_time() {
        let log = "conn 127.0.0.2:40000 s1 -- 1000.100\n\
                   [WARNING] a line that is not a connection\n\
                   conn 127.0.0.3:40001 <NOSRV> CD 1000.200\n\
                   conn 127.0.0.4:40002 s0 -- 1001.000\n\
                   conn 127.0.0.4:40002 s2 -- 1050.000\n";
        let req = |local: &str, start_ms: u64| Request {
            side: Side::B,
            start: Duration::from_millis(start_ms),
            end: Duration::from_millis(start_ms + 5),
            outcome: account::Outcome::Failed("response eof".into()),
            local: Some(local.parse().unwrap()),
            served_by: None,
        };
        let mut r = vec![
            req("127.0.0.2:40000", 100),
            req("127.0.0.3:40001", 200),
            req("127.0.0.4:40002", 1_000),
            req("127.0.0.4:40002", 49_990),
            req("127.0.0.4:40002", 20_000),
            req("127.0.0.6:40004", 100),
        ];
        name_agents(&mut r, log, 1000.0);
        let named: Vec<Option<usize>> = r.iter().map(|r| r.served_by).collect();
        assert_eq!(
            named,
            [Some(1), None, Some(0), Some(2), None, None],
            "by address, then the nearest accept; none without a server or a line near it"
        );
    }

    #[test]
    fn a_budget_is_what_the_dispatcher_had_on_the_agent() {
        assert_eq!(budget(Some(Some((3, 100))), Some(Some((0, 104)))), Some(7));
        assert_eq!(budget(None, None), None, "not side A: no cap");
        assert_eq!(
            budget(Some(None), Some(Some((0, 1)))),
            Some(0),
            "unknown: nothing"
        );
    }

    #[test]
    fn a_restart_keeps_the_announced_ports() {
        let args: Vec<String> = [
            "/bin/baton",
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--link-listen",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:7000",
        ]
        .map(String::from)
        .to_vec();
        let addrs: HashMap<String, SocketAddr> = [
            ("tls", "127.0.0.1:4001"),
            ("metrics", "127.0.0.1:4002"),
            ("link", "127.0.0.1:4003"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect();
        let p = pinned(
            &args,
            &addrs,
            &[
                ("--listen", "tls"),
                ("--metrics", "metrics"),
                ("--link-listen", "link"),
            ],
        );
        assert_eq!(
            p.join(" "),
            "agent --listen 127.0.0.1:4001 --metrics 127.0.0.1:4002 --link-listen 127.0.0.1:4003 \
             --peer-listen 127.0.0.1:7000"
        );
    }
}
