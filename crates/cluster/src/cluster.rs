//! A local cluster: N `baton agent` processes and a `baton dispatch` in front, on 127.0.0.1,
//! sharing one generated certificate and (for shared stores) a cluster key and ticket key.
//! Every process is a child of this one and is killed when the [`Cluster`] is dropped.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use crate::hosts::{Host, Hosts};
use crate::pki::{self, KeyKind, Pki};
use crate::signal::Signal;

/// Where the agents keep sessions.
#[derive(Clone, PartialEq, Eq)]
pub enum Store {
    /// Each agent its own sessions and ticket keys: the paper's LB-RR baseline.
    Memory,
    /// Sessions replicated to every agent; one ticket key for all (CSSL-SL).
    Peers,
    /// Sessions in a shared Redis; one ticket key for all.
    Redis(String),
}

impl std::fmt::Debug for Store {
    // The Redis URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Memory => f.write_str("Memory"),
            Store::Peers => f.write_str("Peers"),
            Store::Redis(url) => write!(f, "Redis({:?})", baton_session::redis::redact(url)),
        }
    }
}

impl std::str::FromStr for Store {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "memory" => Ok(Store::Memory),
            "peers" => Ok(Store::Peers),
            "redis" => Ok(Store::Redis("redis://127.0.0.1:6379/".into())),
            _ => match s.strip_prefix("redis=") {
                Some(url) => Ok(Store::Redis(url.into())),
                None => Err(format!("`{s}`: memory, peers, redis or redis=URL")),
            },
        }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `baton` binary to run.
    pub baton: PathBuf,
    /// Directory for certificates, keys and logs (created).
    pub dir: PathBuf,
    pub listen: SocketAddr,
    pub agents: usize,
    /// Dispatcher policy name (`round-robin`, `least-conn`, `client-ip`, `session`,
    /// `migration`; `handoff` is its old name).
    pub policy: String,
    pub store: Store,
    /// The server key (ECDSA P-256 unless asked otherwise).
    pub key: KeyKind,
    /// More flags for every agent.
    pub agent_args: Vec<String>,
    /// More flags for every dispatcher (e.g. `--accept-proxy-protocol true` behind a balancer).
    pub dispatcher_args: Vec<String>,
    /// CPU caps: agent `i` runs under `agent_caps[i]` when given (the lab's experiments).
    pub agent_caps: Vec<Arc<dyn Cap>>,
    /// Where the processes run and how many dispatchers there are.
    pub topology: Topology,
}

/// What a process is started under, set on its `Command` before it is spawned: the lab's CPU
/// caps (a cgroup joined, or a core pinned to, between fork and exec).
pub trait Cap: std::fmt::Debug + Send + Sync {
    fn apply(&self, cmd: &mut Command) -> anyhow::Result<()>;
}

/// Where a cluster's processes run.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// Each process in a network namespace of its own, on a bridge (`crate::hosts`), instead
    /// of all on 127.0.0.1.
    pub hosts: bool,
    /// Dispatchers with the same agents (0 means 1); the first listens on `listen`.
    pub dispatchers: usize,
    /// With `hosts`: empty namespaces for clients (`client0`, ...), for `ip netns exec`.
    pub client_hosts: usize,
}

/// One running child and the addresses it announced.
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    pub addrs: HashMap<String, SocketAddr>,
}

impl Proc {
    pub fn addr(&self, kind: &str) -> Option<SocketAddr> {
        self.addrs.get(kind).copied()
    }
}

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    pub dispatcher: Proc,
    /// Dispatchers beyond the first, with the same agents.
    pub more_dispatchers: Vec<Proc>,
    pub agents: Vec<Proc>,
    pub pki: Pki,
    pub dir: PathBuf,
    /// The Redis a `--hosts` cluster runs in a namespace of its own.
    redis: Option<Child>,
    /// The namespaces, removed after the processes (field order: dropped last).
    pub hosts: Option<Hosts>,
}

#[derive(Serialize)]
struct State<'a> {
    dispatcher: SocketAddr,
    dispatcher_metrics: Option<SocketAddr>,
    /// Every dispatcher's client address, the first one included.
    dispatchers: Vec<SocketAddr>,
    ca: &'a Path,
    agents: Vec<AgentState>,
    /// With `--hosts`: each namespace (`ip netns exec NAME ...`) and its address.
    hosts: Vec<HostState>,
    /// `baton up --admin`: its address and the file of the token every call must send.
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_token_file: Option<&'a Path>,
}

#[derive(Serialize)]
struct HostState {
    name: String,
    netns: String,
    addr: std::net::Ipv4Addr,
}

#[derive(Serialize)]
struct AgentState {
    id: usize,
    pid: u32,
    tls: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
}

impl Cluster {
    /// Starts the cluster. The replication ports of `--store peers` are picked free before the
    /// agents bind them, so another process may take one meanwhile: a start that fails with
    /// "Address already in use" is retried (three attempts in all) with new ports.
    pub fn start(spec: &ClusterSpec) -> anyhow::Result<Cluster> {
        let mut attempt = 1;
        loop {
            match Self::start_once(spec) {
                Err(e) if attempt < 3 && format!("{e:#}").contains("Address already in use") => {
                    tracing::warn!(attempt, error = %format!("{e:#}"), "a port was taken meanwhile; starting again");
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    fn start_once(spec: &ClusterSpec) -> anyhow::Result<Cluster> {
        if spec.agents == 0 || spec.agents > 64 {
            bail!("--agents must be between 1 and 64");
        }
        std::fs::create_dir_all(&spec.dir)
            .with_context(|| format!("creating {}", spec.dir.display()))?;
        let pki = pki::generate_kind(&spec.dir, spec.key)?;
        // The agent links authenticate with the cluster key, so every cluster has one; ticket
        // keys are shared only with a shared store (or migration, whose resumptions go home).
        let handoff = matches!(spec.policy.as_str(), "migration" | "handoff");
        let shared = spec.store != Store::Memory || handoff;
        let cluster_key = spec.dir.join("cluster.key");
        let ticket_key = spec.dir.join("ticket.key");
        for path in [&cluster_key, &ticket_key] {
            let line = baton_session::generate_key_line()?;
            pki::write_private(path, format!("{line}\n").as_bytes())?;
        }
        let mut hosts = match spec.topology.hosts {
            true => Some(Hosts::create()?),
            false => None,
        };
        // Each agent's host (or none: 127.0.0.1), made before any process starts.
        let mut agent_hosts = Vec::new();
        for id in 0..spec.agents {
            agent_hosts.push(match &mut hosts {
                Some(h) => Some(h.add(&format!("agent{id}"))?),
                None => None,
            });
        }
        let ip_of = |h: &Option<Host>| -> std::net::IpAddr {
            h.as_ref()
                .map_or(std::net::Ipv4Addr::LOCALHOST, |h| h.addr)
                .into()
        };
        let peer_addrs: Vec<SocketAddr> = match spec.store {
            Store::Peers => agent_hosts
                .iter()
                .map(|h| match h {
                    // a namespace has its ports to itself
                    Some(h) => Ok(SocketAddr::from((h.addr, 7100))),
                    None => free_port().map(|p| SocketAddr::from(([127, 0, 0, 1], p))),
                })
                .collect::<anyhow::Result<_>>()?,
            _ => Vec::new(),
        };
        // `--store redis` across hosts: a Redis of its own host (a URL given is used as is).
        let mut redis = None;
        let mut store = spec.store.clone();
        if let (Some(h), Store::Redis(url)) = (&mut hosts, &spec.store) {
            if url == "redis://127.0.0.1:6379/" {
                let host = h.add("redis")?;
                redis = Some(crate::redis::start_in(&host, &spec.dir)?);
                store = Store::Redis(format!("redis://{}:6379/", host.addr));
            }
        }
        // only the dispatchers may open link connections: this machine's loopback, or the
        // hosts' bridge
        let link_allow = hosts
            .as_ref()
            .map_or_else(|| "127.0.0.0/8".to_string(), Hosts::network);
        let mut agents = Vec::new();
        for (id, host) in agent_hosts.iter().enumerate() {
            let ip = ip_of(host);
            let mut args: Vec<String> = vec![
                "agent".into(),
                "--listen".into(),
                format!("{ip}:0"),
                "--metrics".into(),
                format!("{ip}:0"),
                "--agent-id".into(),
                id.to_string(),
                "--cert".into(),
                path(&pki.cert),
                "--key".into(),
                path(&pki.key),
                "--proxy-protocol".into(),
                "true".into(),
                "--link-listen".into(),
                format!("{ip}:0"),
                "--link-allow".into(),
                link_allow.clone(),
                "--cluster-key-file".into(),
                path(&cluster_key),
            ];
            if shared {
                args.extend(["--ticket-key-file".into(), path(&ticket_key)]);
            }
            // Whatever the policy: a session can move between agents (CSSL-SF under
            // `handoff`, and off an agent that drains under any policy, e.g. a rollout).
            args.extend(["--migration".into(), "true".into()]);
            match &store {
                Store::Memory => {}
                Store::Peers => args.extend(peer_args_at(&peer_addrs, id)),
                Store::Redis(url) => args.extend(["--store".into(), format!("redis={url}")]),
            }
            args.extend(agent_workers(
                spec.agents,
                &spec.agent_args,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ));
            args.extend(spec.agent_args.iter().cloned());
            let log = spec.dir.join(format!("agent-{id}.log"));
            let cap = spec.agent_caps.get(id).map(|c| &**c);
            match spawn_on(host, &spec.baton, &args, &log, cap) {
                Ok(p) => agents.push(p),
                Err(e) => {
                    // nothing of a failed start may outlive it
                    stop_all(
                        agents
                            .iter_mut()
                            .map(|a| &mut a.child)
                            .chain(redis.as_mut()),
                    );
                    return Err(e);
                }
            }
        }
        let mut args: Vec<String> = vec![
            "dispatch".into(),
            "--policy".into(),
            spec.policy.clone(),
            "--proxy-protocol".into(),
            "true".into(),
            "--cluster-key-file".into(),
            path(&cluster_key),
        ];
        args.extend(spec.dispatcher_args.iter().cloned());
        for a in &agents {
            let addr = a
                .addr("tls")
                .ok_or_else(|| anyhow!("agent announced no TLS address"))?;
            let link = a
                .addr("link")
                .ok_or_else(|| anyhow!("agent announced no link address"))?;
            args.extend(["--agent".into(), addr.to_string()]);
            args.extend(["--agent-link".into(), link.to_string()]);
        }
        // Every dispatcher gets the same agents, so all make the same choices (homes by
        // rendezvous hashing over agent ids).
        let mut dispatchers = Vec::new();
        for i in 0..spec.topology.dispatchers.max(1) {
            let host = match &mut hosts {
                Some(h) => Some(h.add(&format!("dispatch{i}"))?),
                None => None,
            };
            let ip = ip_of(&host);
            let listen = match (&host, i) {
                (None, 0) => spec.listen,
                (None, _) => SocketAddr::from(([127, 0, 0, 1], 0)),
                (Some(_), _) => SocketAddr::new(ip, spec.listen.port()),
            };
            let mut all = args.clone();
            all.extend([
                "--listen".into(),
                listen.to_string(),
                "--metrics".into(),
                format!("{ip}:0"),
            ]);
            let log = spec.dir.join(format!(
                "dispatch{}.log",
                if i == 0 { String::new() } else { i.to_string() }
            ));
            match spawn_on(&host, &spec.baton, &all, &log, None) {
                Ok(p) => dispatchers.push(p),
                Err(e) => {
                    let started = agents.iter_mut().chain(dispatchers.iter_mut());
                    stop_all(started.map(|p| &mut p.child).chain(redis.as_mut()));
                    return Err(e);
                }
            }
        }
        if let Some(h) = &mut hosts {
            for i in 0..spec.topology.client_hosts {
                h.add(&format!("client{i}"))?;
            }
        }
        let dispatcher = dispatchers.remove(0);
        Ok(Cluster {
            dispatcher,
            more_dispatchers: dispatchers,
            agents,
            pki,
            dir: spec.dir.clone(),
            redis,
            hosts,
        })
    }

    /// The client hosts of a `--hosts` cluster (`client0`, ...), in order; empty on loopback.
    pub fn client_hosts(&self) -> Vec<Host> {
        self.hosts
            .iter()
            .flat_map(|h| h.hosts())
            .filter(|h| h.name.starts_with("client"))
            .cloned()
            .collect()
    }

    /// Every dispatcher's client-facing address, the first one's first.
    pub fn dispatcher_addrs(&self) -> Vec<SocketAddr> {
        std::iter::once(&self.dispatcher)
            .chain(&self.more_dispatchers)
            .filter_map(|d| d.addr("dispatch"))
            .collect()
    }

    /// The dispatcher's client-facing address.
    pub fn addr(&self) -> SocketAddr {
        self.dispatcher
            .addr("dispatch")
            .expect("dispatcher announced its address before ready")
    }

    /// Writes the cluster's addresses as JSON (for scripts and tests).
    /// Writes the cluster's addresses to `file`, with `baton up`'s admin endpoint (its address
    /// and token file) if it has one.
    pub fn write_state(
        &self,
        file: &Path,
        admin: Option<(SocketAddr, &Path)>,
    ) -> anyhow::Result<()> {
        let state = State {
            admin: admin.map(|(a, _)| a),
            admin_token_file: admin.map(|(_, t)| t),
            dispatcher: self.addr(),
            dispatcher_metrics: self.dispatcher.addr("metrics"),
            dispatchers: self.dispatcher_addrs(),
            ca: &self.pki.ca,
            agents: self
                .agents
                .iter()
                .enumerate()
                .map(|(id, a)| AgentState {
                    id,
                    pid: a.child.id(),
                    tls: a.addr("tls"),
                    metrics: a.addr("metrics"),
                })
                .collect(),
            hosts: self
                .hosts
                .iter()
                .flat_map(|h| h.hosts())
                .map(|h| HostState {
                    name: h.name.clone(),
                    netns: h.netns.clone(),
                    addr: h.addr,
                })
                .collect(),
        };
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&state)?)?;
        std::fs::rename(&tmp, file)?;
        Ok(())
    }

    /// Whether the dispatcher has exited (then the cluster is unreachable), and which agents
    /// have: an agent's death is survivable — the dispatcher routes around it.
    pub fn exited(&mut self) -> (Option<std::process::ExitStatus>, Vec<usize>) {
        let dispatcher = std::iter::once(&mut self.dispatcher)
            .chain(self.more_dispatchers.iter_mut())
            .find_map(|d| d.child.try_wait().ok().flatten());
        let agents = self
            .agents
            .iter_mut()
            .enumerate()
            .filter_map(|(i, a)| a.child.try_wait().ok().flatten().map(|_| i))
            .collect();
        (dispatcher, agents)
    }

    /// Stops every process: SIGTERM (agents drain), then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let mut all: Vec<&mut Child> = std::iter::once(&mut self.dispatcher.child)
            .chain(self.more_dispatchers.iter_mut().map(|d| &mut d.child))
            .chain(self.agents.iter_mut().map(|a| &mut a.child))
            .chain(self.redis.iter_mut())
            .collect();
        for c in all.iter_mut() {
            // a child reaped already (a dispatcher that handed over, an agent that died) may
            // have its pid reused by now: never signalled
            if !matches!(c.try_wait(), Ok(None)) {
                continue;
            }
            crate::signal::send(c.id(), Signal::TERM);
        }
        let deadline = std::time::Instant::now() + grace;
        for c in all.iter_mut() {
            while std::time::Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop(Duration::from_millis(500));
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `--store peers` flags for agent `i` of agents replicating on 127.0.0.1:`ports`.
pub fn peer_args(ports: &[u16], i: usize) -> Vec<String> {
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    peer_args_at(&addrs, i)
}

/// `--store peers` flags for agent `i` of agents replicating on `addrs`.
pub fn peer_args_at(addrs: &[SocketAddr], i: usize) -> Vec<String> {
    let mut args = vec![
        "--store".to_string(),
        "peers".into(),
        "--peer-listen".into(),
        addrs[i].to_string(),
    ];
    for (j, a) in addrs.iter().enumerate() {
        if j != i {
            args.extend(["--peer".into(), a.to_string()]);
        }
    }
    args
}

/// A free TCP port on 127.0.0.1 (for addresses that must be known before a process starts).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// SIGKILL and reap.
fn stop_all<'a>(children: impl Iterator<Item = &'a mut Child>) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// [`spawn_ready_in`] inside `host` when there is one.
pub fn spawn_on(
    host: &Option<Host>,
    baton: &Path,
    args: &[String],
    log: &Path,
    cap: Option<&dyn Cap>,
) -> anyhow::Result<Proc> {
    let Some(host) = host else {
        return spawn_ready_in(baton, args, log, cap);
    };
    let stderr =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = host.command(baton);
    cmd.args(args).stderr(stderr);
    if let Some(c) = cap {
        c.apply(&mut cmd)?;
    }
    start_ready(cmd, Some(log))
}

/// The agents of one machine share its cores: each runs `cores / agents` workers (at least
/// one; one is a current-thread runtime), unless `--agent-arg` says otherwise. An agent's own
/// default, a worker per core, would put `agents` times as many busy threads as cores on this
/// machine: measured on 2 cores with 2 agents (`scripts/bench-handoff --before-agent-workers`),
/// 14-16 % more agent CPU per full handshake, and more per migration, than one worker each.
fn agent_workers(agents: usize, agent_args: &[String], cores: usize) -> Vec<String> {
    let given = agent_args
        .iter()
        .any(|a| a == "--workers" || a.starts_with("--workers="));
    if given {
        return Vec::new();
    }
    let each = (cores / agents.max(1)).max(1);
    vec!["--workers".into(), each.to_string()]
}

/// Starts `baton ARGS` with stderr to `log`, and waits (at most 30 s) for `ready` on stdout,
/// collecting `listening KIND ADDR` lines.
pub fn spawn_ready(baton: &Path, args: &[String], log: &Path) -> anyhow::Result<Proc> {
    spawn_ready_in(baton, args, log, None)
}

/// [`spawn_ready`] under a CPU cap (the process joins it before exec).
pub fn spawn_ready_in(
    baton: &Path,
    args: &[String],
    log: &Path,
    cap: Option<&dyn Cap>,
) -> anyhow::Result<Proc> {
    let stderr =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(baton);
    cmd.args(args).stderr(stderr);
    if let Some(c) = cap {
        c.apply(&mut cmd)?;
    }
    start_ready(cmd, Some(log))
}

/// Starts `cmd` (a `baton` subcommand; its stdout is piped here) and waits, at most 30 s between
/// lines, for `ready` on its stdout, collecting `listening KIND ADDR` lines. Its stdout is
/// drained until it exits. `log` is where its stderr goes, if to a file: an error quotes its
/// tail.
pub fn start_ready(mut cmd: Command, log: Option<&Path>) -> anyhow::Result<Proc> {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let what = match cmd.get_args().next() {
        Some(sub) => format!("{program} {}", sub.to_string_lossy()),
        None => program,
    };
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                // nobody listens any more; keep draining so the child never blocks
            }
        }
    });
    let mut addrs = HashMap::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["listening", kind, addr] => {
                        addrs.insert(kind.to_string(), addr.parse()?);
                    }
                    ["ready"] => return Ok(Proc { child, addrs }),
                    _ => {}
                }
            }
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let Some(log) = log else {
                    bail!("{what} did not start ({status:?})");
                };
                let tail = std::fs::read_to_string(log).unwrap_or_default();
                bail!(
                    "{what} did not start ({status:?}); its log:\n{}",
                    tail.lines()
                        .rev()
                        .take(10)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::agent_workers;

    #[test]
    fn agents_share_the_cores_unless_told_otherwise() {
        assert_eq!(agent_workers(2, &[], 2), ["--workers", "1"]);
        assert_eq!(agent_workers(3, &[], 2), ["--workers", "1"]);
        assert_eq!(agent_workers(3, &[], 16), ["--workers", "5"]);
        assert_eq!(agent_workers(1, &[], 8), ["--workers", "8"]);
        assert!(agent_workers(2, &["--workers=4".into()], 2).is_empty());
        assert!(agent_workers(2, &["--workers".into(), "4".into()], 2).is_empty());
        assert!(!agent_workers(2, &["--workers-x=4".into()], 2).is_empty());
    }
}
