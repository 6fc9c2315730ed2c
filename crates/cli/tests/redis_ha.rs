//! The Redis session store beyond one server, with real processes (issue 17): Redis Sentinel
//! (a primary, a replica, three sentinels; the primary SIGKILLed under load) and Redis Cluster
//! (three primaries with a replica each; keys spread over the shards, a shard's primary
//! SIGKILLed under load). Two agents share sessions through the store; clients make a full
//! handshake on one agent and resume on the other. What must hold: no request fails, the
//! handshakes the outage costs are full ones (counted), and resumptions across agents come
//! back within a bounded time (printed; run with `--nocapture` to see the figures).
//!
//! Every process is started on 127.0.0.1 ports picked here and killed on drop; every wait is
//! bounded in time.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::version::{TLS12, TLS13};
use rustls::HandshakeKind;

const PRIMARY_SET: &str = "batonset";

/// A `redis-server` (data node or sentinel), SIGKILLed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn spawn(port: u16, args: &[String]) -> Server {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server");
        let server = Server { child, port };
        assert!(
            until(Duration::from_secs(10), || cli(port, &["PING"]) == "PONG"),
            "redis-server on port {port} did not answer PING"
        );
        server
    }

    /// A data node; `extra` adds e.g. `--replicaof` or the cluster flags.
    fn data(dir: &Path, port: u16, extra: &[&str]) -> Server {
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            dir.to_str().unwrap(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        Server::spawn(port, &args)
    }

    /// A sentinel watching `primary` (quorum 2, down after 500 ms).
    fn sentinel(dir: &Path, port: u16, primary: u16) -> Server {
        let conf = dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor {PRIMARY_SET} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {PRIMARY_SET} 500\n\
                 sentinel failover-timeout {PRIMARY_SET} 3000\n\
                 sentinel parallel-syncs {PRIMARY_SET} 1\n",
                dir.display()
            ),
        )
        .unwrap();
        Server::spawn(
            port,
            &[conf.to_str().unwrap().to_string(), "--sentinel".into()],
        )
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-cli -p PORT ARGS`, its trimmed standard output ("" when it could not run).
fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Polls `ok` every 100 ms for at most `limit`; whether it became true.
fn until(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A port whose cluster bus port (+10000) is free too (a few bounded tries). Ports are handed
/// out once per process, so clusters of tests running side by side never pick the same.
fn cluster_port() -> u16 {
    use std::sync::atomic::AtomicU16;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 200) as u16 * 50;
    for _ in 0..500 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 10000;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn redis_installed() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("redis-cli")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        require_or_skip("redis-server and redis-cli", "Redis Sentinel and Cluster");
    }
    ok
}

/// A primary, a replica of it, and three sentinels.
struct SentinelSet {
    primary: Server,
    replica: Server,
    sentinels: Vec<Server>,
    _dir: TempDir,
}

impl SentinelSet {
    fn start() -> SentinelSet {
        let dir = TempDir::new("sentinel");
        let (p, r) = (free_port(), free_port());
        let primary = Server::data(&dir.0, p, &[]);
        let replica_dir = dir.path("replica");
        std::fs::create_dir_all(&replica_dir).unwrap();
        let replica = Server::data(
            &replica_dir,
            r,
            &["--replicaof", "127.0.0.1", &p.to_string()],
        );
        assert!(
            until(Duration::from_secs(10), || cli(r, &["INFO", "replication"])
                .contains("master_link_status:up")),
            "the replica did not sync"
        );
        let sentinels: Vec<Server> = (0..3)
            .map(|_| Server::sentinel(&dir.0, free_port(), p))
            .collect();
        // Each sentinel knows the replica and the two other sentinels: a failover can happen.
        for s in &sentinels {
            assert!(
                until(Duration::from_secs(15), || {
                    let info = cli(s.port, &["INFO", "sentinel"]);
                    info.contains("slaves=1") && info.contains("sentinels=3")
                }),
                "sentinel {} did not discover the set: {}",
                s.port,
                cli(s.port, &["INFO", "sentinel"])
            );
        }
        SentinelSet {
            primary,
            replica,
            sentinels,
            _dir: dir,
        }
    }

    fn store(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!(
            "redis-sentinel=redis+sentinel://{}/{PRIMARY_SET}",
            hosts.join(",")
        )
    }

    /// The port the sentinels name as the primary now.
    fn primary_port(&self) -> Option<u16> {
        let out = cli(
            self.sentinels[0].port,
            &["SENTINEL", "get-master-addr-by-name", PRIMARY_SET],
        );
        out.lines().nth(1)?.trim().parse().ok()
    }
}

/// Three primaries, each with a replica, as one Redis Cluster.
struct Cluster {
    nodes: Vec<Server>,
    _dir: TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = TempDir::new("cluster");
        let ports: Vec<u16> = (0..6).map(|_| cluster_port()).collect();
        let nodes: Vec<Server> = ports
            .iter()
            .map(|&p| {
                let node_dir = dir.path(&p.to_string());
                std::fs::create_dir_all(&node_dir).unwrap();
                Server::data(
                    &node_dir,
                    p,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                    ],
                )
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        create.args(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = create
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(out.status.success(), "{}", text_of(&out));
        let cluster = Cluster { nodes, _dir: dir };
        assert!(
            until(Duration::from_secs(20), || cluster.nodes.iter().all(|n| {
                cli(n.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
            }) && cluster.primaries().len()
                == 3
                && cluster.nodes.iter().all(|n| {
                    let role = cli(n.port, &["ROLE"]);
                    !role.starts_with("slave")
                        || cli(n.port, &["INFO", "replication"]).contains("master_link_status:up")
                })),
            "the cluster did not come up"
        );
        cluster
    }

    fn store(&self) -> String {
        // Two seed nodes: the client learns the others from them.
        format!(
            "redis-cluster=redis://127.0.0.1:{},127.0.0.1:{}/",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// Indices of the nodes that are primaries now.
    fn primaries(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| cli(self.nodes[i].port, &["ROLE"]).starts_with("master"))
            .collect()
    }

    fn keys(&self, i: usize) -> u64 {
        cli(self.nodes[i].port, &["DBSIZE"]).parse().unwrap_or(0)
    }
}

/// Two agents with stateful sessions only (`--tickets false`): resuming on the other agent
/// needs the store.
fn two_agents(pki: &Pki, key: &str, store: &str) -> Vec<Agent> {
    (0..2)
        .map(|i| {
            Agent::serving(
                pki,
                &[
                    "--tickets",
                    "false",
                    "--agent-id",
                    &i.to_string(),
                    "--store",
                    store,
                    "--cluster-key-file",
                    key,
                    "--store-wait",
                    "200ms",
                ],
            )
        })
        .collect()
}

/// A client config with a session cache of its own (a client that has not been here yet).
fn fresh(base: &rustls::ClientConfig) -> Arc<rustls::ClientConfig> {
    let mut c = base.clone();
    c.resumption = rustls::client::Resumption::in_memory_sessions(8);
    Arc::new(c)
}

/// A full handshake on one agent, then (after `think`) a resumption attempt on the other.
fn resumes_on_the_other(
    from: SocketAddr,
    to: SocketAddr,
    base: &rustls::ClientConfig,
    think: Duration,
) -> Result<bool, String> {
    let config = fresh(base);
    let first = fetch_addr(from, &config, "/")?;
    if first.status != 200 {
        return Err(format!("status {}", first.status));
    }
    std::thread::sleep(think);
    let second = fetch_addr(to, &config, "/")?;
    if second.status != 200 {
        return Err(format!("status {}", second.status));
    }
    Ok(second.kind == HandshakeKind::Resumed)
}

/// A resumption attempt on the other agent: when it ended (since the load began) and whether
/// it resumed; `None` for a failed request.
type Attempt = (Duration, Option<bool>);

/// `threads` clients doing [`resumes_on_the_other`] in a loop (alternating which agent comes
/// first, TLS 1.3 and 1.2) until `stop`.
fn load(
    agents: &[Agent],
    pki: &Pki,
    threads: usize,
    stop: Arc<AtomicBool>,
    start: Instant,
) -> Vec<std::thread::JoinHandle<Vec<Attempt>>> {
    let addrs = [agents[0].addr, agents[1].addr];
    (0..threads)
        .map(|t| {
            let version = if t % 2 == 0 { &TLS13 } else { &TLS12 };
            let base = pki.client(&[version], None);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let (a, b) = (addrs[i % 2], addrs[(i + 1) % 2]);
                    let r = resumes_on_the_other(a, b, &base, Duration::from_millis(20));
                    if let Err(e) = &r {
                        eprintln!("request failed: {e}");
                    }
                    out.push((start.elapsed(), r.ok()));
                    i += 1;
                }
                out
            })
        })
        .collect()
}

/// What a failover cost, from the clients' side.
#[derive(Debug)]
struct Outage {
    attempts: usize,
    failed: usize,
    /// Resumption attempts before the kill, and how many resumed.
    before: (usize, usize),
    /// Attempts after the kill that did not resume (each a full handshake more).
    missed_after: usize,
    /// From the kill to the end of the last attempt that did not resume, if any did not.
    last_miss: Option<Duration>,
    /// Attempts that resumed after the last miss.
    hits_after: usize,
}

fn outage(attempts: &[Attempt], kill: Duration) -> Outage {
    let mut sorted = attempts.to_vec();
    sorted.sort_by_key(|a| a.0);
    let failed = sorted.iter().filter(|a| a.1.is_none()).count();
    let before: Vec<_> = sorted.iter().filter(|a| a.0 < kill).collect();
    let after: Vec<_> = sorted.iter().filter(|a| a.0 >= kill).collect();
    let last_miss = after.iter().rposition(|a| a.1 == Some(false));
    Outage {
        attempts: sorted.len(),
        failed,
        before: (
            before.len(),
            before.iter().filter(|a| a.1 == Some(true)).count(),
        ),
        missed_after: after.iter().filter(|a| a.1 == Some(false)).count(),
        last_miss: last_miss.map(|i| after[i].0 - kill),
        hits_after: match last_miss {
            Some(i) => after[i + 1..].iter().filter(|a| a.1 == Some(true)).count(),
            None => after.iter().filter(|a| a.1 == Some(true)).count(),
        },
    }
}

fn store_event(agent: &Agent, event: &str) -> u64 {
    agent.metric(&format!(
        "baton_session_store_events_total{{event=\"{event}\"}}"
    )) as u64
}

/// Runs the load, calls `kill` after `before`, keeps going for `after`; the outage.
fn failover_under_load(
    agents: &[Agent],
    pki: &Pki,
    before: Duration,
    after: Duration,
    kill: impl FnOnce(),
) -> Outage {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let clients = load(agents, pki, 4, stop.clone(), start);
    std::thread::sleep(before);
    let killed_at = start.elapsed();
    kill();
    std::thread::sleep(after);
    stop.store(true, Ordering::Relaxed);
    let attempts: Vec<Attempt> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let o = outage(&attempts, killed_at);
    let counters: Vec<String> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "agent {i}: fallback {} dropped {} reconnected {} full {}",
                store_event(a, "fallback"),
                store_event(a, "dropped"),
                store_event(a, "reconnected"),
                a.handshakes("1.3", "full") + a.handshakes("1.2", "full"),
            )
        })
        .collect();
    eprintln!("{o:?}\n{}", counters.join("\n"));
    o
}

/// The common checks: nothing failed, resumption worked before, and came back after.
fn check(o: &Outage, agents: &[Agent]) {
    assert_eq!(o.failed, 0, "{o:?}");
    assert!(
        o.before.0 >= 20 && o.before.1 * 10 >= o.before.0 * 9,
        "{o:?}"
    );
    assert!(o.missed_after >= 1, "the kill cost nothing? {o:?}");
    let back = o.last_miss.expect("a miss");
    assert!(back < Duration::from_secs(15), "{o:?}");
    assert!(o.hits_after >= 20, "{o:?}");
    for a in agents {
        assert!(store_event(a, "reconnected") >= 1);
        assert!(store_event(a, "fallback") >= 1);
    }
}

#[test]
fn sentinel_sessions_resume_across_agents() {
    if !redis_installed() {
        return;
    }
    let set = SentinelSet::start();
    let pki = Pki::new();
    let dir = TempDir::new("sentinel-agents");
    let key = key_file(&dir, "cluster.key");
    let agents = two_agents(&pki, &key, &set.store());
    for v in [&TLS13, &TLS12] {
        let base = pki.client(&[v], None);
        for (a, b) in [(0, 1), (1, 0)] {
            let resumed = resumes_on_the_other(
                agents[a].addr,
                agents[b].addr,
                &base,
                Duration::from_millis(50),
            );
            assert_eq!(resumed, Ok(true), "{v:?} {a} -> {b}");
        }
    }
    // The sessions went to the primary, and were replicated.
    assert!(cli(set.primary.port, &["DBSIZE"]).parse::<u64>().unwrap() >= 1);
    assert!(until(Duration::from_secs(5), || cli(
        set.replica.port,
        &["DBSIZE"]
    )
    .parse::<u64>()
    .unwrap_or(0)
        >= 1));
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn sentinel_failover_under_load_fails_nothing_and_resumptions_come_back() {
    if !redis_installed() {
        return;
    }
    let mut set = SentinelSet::start();
    let pki = Pki::new();
    let dir = TempDir::new("sentinel-agents");
    let key = key_file(&dir, "cluster.key");
    let agents = two_agents(&pki, &key, &set.store());
    let (old, new) = (set.primary.port, set.replica.port);
    let o = failover_under_load(
        &agents,
        &pki,
        Duration::from_secs(2),
        Duration::from_secs(10),
        || set.primary.kill(),
    );
    assert_eq!(
        set.primary_port(),
        Some(new),
        "the replica took over from {old}"
    );
    check(&o, &agents);
    eprintln!(
        "sentinel failover: {} attempts, 0 failed, {} full handshakes more than usual, \
         resumptions across agents back {:?} after the kill",
        o.attempts,
        o.missed_after,
        o.last_miss.unwrap()
    );
}

#[test]
fn cluster_spreads_sessions_over_the_shards() {
    if !redis_installed() {
        return;
    }
    let cluster = Cluster::start();
    let pki = Pki::new();
    let dir = TempDir::new("cluster-agents");
    let key = key_file(&dir, "cluster.key");
    let agents = two_agents(&pki, &key, &cluster.store());
    // Full handshakes on agent 0; their sessions land in Redis.
    let base = pki.client(&[&TLS12], None);
    let configs: Vec<_> = (0..40).map(|_| fresh(&base)).collect();
    for c in &configs {
        assert_eq!(fetch(&agents[0], c, "/").unwrap().kind, HandshakeKind::Full);
    }
    let primaries = cluster.primaries();
    assert!(until(Duration::from_secs(5), || {
        primaries.iter().map(|&i| cluster.keys(i)).sum::<u64>() >= 40
    }));
    let per_shard: Vec<u64> = primaries.iter().map(|&i| cluster.keys(i)).collect();
    eprintln!("sessions per shard: {per_shard:?}");
    assert!(
        per_shard.iter().filter(|&&n| n > 0).count() >= 2,
        "{per_shard:?}"
    );
    // Each resumes on agent 1, which learns it from the shard that holds it.
    for c in &configs {
        assert_eq!(
            fetch(&agents[1], c, "/").unwrap().kind,
            HandshakeKind::Resumed
        );
    }
    // TLS 1.3 tickets too (taken with GETDEL on the key's shard).
    let base = pki.client(&[&TLS13], None);
    for _ in 0..10 {
        let r = resumes_on_the_other(
            agents[1].addr,
            agents[0].addr,
            &base,
            Duration::from_millis(50),
        );
        assert_eq!(r, Ok(true));
    }
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn cluster_shard_failover_under_load_fails_nothing_and_resumptions_come_back() {
    if !redis_installed() {
        return;
    }
    let mut cluster = Cluster::start();
    let pki = Pki::new();
    let dir = TempDir::new("cluster-agents");
    let key = key_file(&dir, "cluster.key");
    let agents = two_agents(&pki, &key, &cluster.store());
    // Not a seed node: the agents must learn the new primary from the cluster.
    let victim = *cluster.primaries().iter().find(|&&i| i >= 2).unwrap();
    let o = failover_under_load(
        &agents,
        &pki,
        Duration::from_secs(2),
        Duration::from_secs(10),
        || cluster.nodes[victim].kill(),
    );
    check(&o, &agents);
    eprintln!(
        "cluster shard failover: {} attempts, 0 failed, {} full handshakes more than usual, \
         resumptions across agents back {:?} after the kill",
        o.attempts,
        o.missed_after,
        o.last_miss.unwrap()
    );
}
