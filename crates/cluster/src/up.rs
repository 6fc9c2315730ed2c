//! `baton up`: a local cluster (dispatcher + N agents) until SIGTERM/SIGINT.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::cluster::{Cluster, ClusterSpec, Store};
use crate::restart::Seen;
use crate::rollout::Watch;

/// `baton up`: start a dispatcher and N agents on this machine.
#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    /// Where clients connect (the dispatcher). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8443", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Number of agents.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub agents: usize,
    /// Dispatcher policy (handoff: CSSL-SF, full handshakes on the least-loaded agent, sessions
    /// then migrated to the client's home agent).
    #[arg(long, default_value = "round-robin", value_name = "POLICY",
          value_parser = ["round-robin", "least-conn", "client-ip", "session", "handoff"])]
    pub policy: String,
    /// Session store: memory (per agent, nothing shared), peers, redis or redis=URL.
    #[arg(long, default_value = "memory", value_name = "STORE")]
    pub store: Store,
    /// Write the cluster's addresses (and the CA to trust) as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Directory for certificates, keys and logs. Default: a new one under /tmp.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// RSA-2048 certificate instead of ECDSA P-256 (same as `--key-type rsa-2048`).
    #[arg(long)]
    pub rsa: bool,
    /// Server key type: ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072 or rsa-4096. Default
    /// ecdsa-p256.
    #[arg(long, value_name = "TYPE", conflicts_with = "rsa")]
    pub key_type: Option<crate::pki::KeyKind>,
    /// The old name of --key-type (`--key` names a PEM file everywhere else).
    #[arg(long = "key", hide = true, value_name = "TYPE", conflicts_with_all = ["rsa", "key_type"])]
    pub old_key: Option<crate::pki::KeyKind>,
    /// A flag passed to every agent (repeatable), e.g. --agent-arg=--body-size=4096.
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// A flag passed to every dispatcher (repeatable), e.g. --dispatcher-arg=--workers=1.
    #[arg(
        long = "dispatcher-arg",
        value_name = "ARG",
        allow_hyphen_values = true
    )]
    pub dispatcher_args: Vec<String>,
    /// Dispatchers with the same agents (they make the same choices: run them behind an L4
    /// balancer). The first listens on --listen; the others on free ports (or, with --hosts,
    /// on --listen's port of their own host).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub dispatchers: usize,
    /// Every process on a host of its own: a network namespace with its own address on a
    /// bridge, so traffic crosses a real network stack (root only). `--store redis` then runs
    /// Redis on a host too. Namespaces are removed on exit, and leftovers of a crashed run at
    /// the next start.
    #[arg(long)]
    pub hosts: bool,
    /// With --hosts: this many empty client hosts (`ip netns exec NETNS curl ...`), listed in
    /// --state and on stdout.
    #[arg(long, default_value_t = 0, value_name = "N", requires = "hosts")]
    pub client_hosts: usize,
    /// An admin endpoint (plain HTTP, loopback addresses only; off by default): `POST
    /// /rollout` restarts the agents one at a time (body optional: `{"pause_ms": N,
    /// "drain_timeout_ms": N, "ready_timeout_ms": N}`), `POST /restart` hot-restarts each
    /// dispatcher, replaced by a successor process (body optional: `{"timeout_ms": N}`; `POST
    /// /handover` is an alias), `GET /status` lists the processes. Each agent is back once
    /// every dispatcher's links to it are up again. Every call needs the token written to
    /// `admin-token` in --dir (printed as `admin-token FILE`, and in --state). See `baton
    /// rollout` (and `--restart`).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// With --admin: the admin token's file instead of `admin-token` in --dir (a random token
    /// is written there, mode 0600, if the file does not exist).
    #[arg(long, value_name = "FILE", requires = "admin")]
    pub admin_token_file: Option<PathBuf>,
}

pub fn up(args: UpArgs) -> anyhow::Result<()> {
    if let Some(a) = args.admin {
        if !a.ip().is_loopback() {
            anyhow::bail!("--admin {a}: the admin endpoint listens on loopback addresses only");
        }
    }
    // a dispatcher that is hot-restarted leaves its successor to us when it exits: watched
    // and stopped here like the processes we start
    crate::restart::become_subreaper();
    let baton = std::env::current_exe().context("locating the baton binary")?;
    let owns_dir = args.dir.is_none();
    let dir = match args.dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("baton-up-{}", std::process::id())),
    };
    let policy = args.policy.clone();
    // One admin token for the cluster: `baton up`'s own endpoint and its dispatchers'.
    let admin_token = match args.admin {
        Some(_) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = args
                .admin_token_file
                .clone()
                .unwrap_or_else(|| dir.join("admin-token"));
            let token = baton_ops::guard::Token::load_or_create(&path)?;
            Some((path, std::sync::Arc::new(token)))
        }
        None => None,
    };
    if args.old_key.is_some() {
        eprintln!("baton up: --key is now --key-type (the old name goes in the next release)");
    }
    let old_key = args.old_key;
    let cluster = Cluster::start(&ClusterSpec {
        baton,
        dir: dir.clone(),
        listen: args.listen,
        agents: args.agents,
        policy: args.policy,
        store: args.store.clone(),
        key: args.key_type.or(old_key).unwrap_or(if args.rsa {
            crate::pki::KeyKind::Rsa(2048)
        } else {
            crate::pki::KeyKind::EcdsaP256
        }),
        agent_args: args.agent_args,
        // the rollout asks each dispatcher (GET /agents) whether a restarted agent is back; in
        // namespaces their loopback is their own, so there the agents' link counts alone say it
        dispatcher_args: match (&admin_token, args.hosts) {
            (Some((path, _)), false) => vec![
                "--admin".into(),
                "127.0.0.1:0".into(),
                "--admin-token-file".into(),
                path.display().to_string(),
            ],
            _ => Vec::new(),
        }
        .into_iter()
        .chain(args.dispatcher_args)
        .collect(),
        agent_caps: Vec::new(),
        topology: crate::cluster::Topology {
            hosts: args.hosts,
            dispatchers: args.dispatchers,
            client_hosts: args.client_hosts,
        },
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // bound before `ready`, and announced with the other addresses
    let admin = match args.admin {
        Some(addr) => {
            let _in = runtime.enter();
            Some(
                baton_ops::listen::bind(addr)
                    .with_context(|| format!("admin endpoint on {addr}"))?,
            )
        }
        None => None,
    };
    if let Some(state) = &args.state {
        let admin = match (&admin, &admin_token) {
            (Some(l), Some((path, _))) => Some((l.local_addr()?, path.as_path())),
            _ => None,
        };
        cluster.write_state(state, admin)?;
    }
    {
        let mut out = std::io::stdout().lock();
        if let (Some(l), Some((path, _))) = (&admin, &admin_token) {
            writeln!(out, "listening admin {}", l.local_addr()?)?;
            writeln!(out, "admin-token {}", path.display())?;
        }
        for d in cluster.dispatcher_addrs() {
            writeln!(out, "listening dispatch {d}")?;
        }
        if let Some(m) = cluster.dispatcher.addr("metrics") {
            writeln!(out, "listening metrics {m}")?;
        }
        for (i, a) in cluster.agents.iter().enumerate() {
            if let (Some(tls), Some(m)) = (a.addr("tls"), a.addr("metrics")) {
                writeln!(out, "agent {i} tls {tls} metrics {m}")?;
            }
        }
        for h in cluster.hosts.iter().flat_map(|h| h.hosts()) {
            writeln!(out, "host {} netns {} addr {}", h.name, h.netns, h.addr)?;
        }
        writeln!(out, "ca {}", cluster.pki.ca.display())?;
        writeln!(out, "ready")?;
        out.flush()?;
    }
    eprintln!(
        "baton up: {} agents, policy {policy}, store {:?}, clients -> https://{} (trust {}); Ctrl-C stops",
        cluster.agents.len(),
        args.store,
        cluster.addr(),
        cluster.pki.ca.display()
    );
    let watch = Watch {
        dispatcher_admins: std::iter::once(&cluster.dispatcher)
            .chain(&cluster.more_dispatchers)
            .filter_map(|d| d.addr("admin"))
            .collect(),
        admin_token: admin_token.as_ref().map(|(_, t)| t.clone()),
        links_per_dispatcher: crate::rollout::links_per_dispatcher(&[]),
        dispatchers: 1 + cluster.more_dispatchers.len(),
    };
    // The cluster is shared with the admin endpoint's rollouts: the main loop looks at it
    // only when no restart holds it (try_lock), so a draining agent never delays a signal.
    let control = crate::control::Control::new(cluster, watch)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let ended = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        if let (Some(listener), Some((path, token))) = (admin, &admin_token) {
            eprintln!(
                "baton up: admin endpoint on http://{} (POST /rollout, POST /restart, GET /status), \
                 token in {}",
                listener.local_addr()?,
                path.display()
            );
            tokio::spawn(crate::admin::serve(
                listener,
                token.clone(),
                control.clone(),
                stop.clone(),
            ));
        }
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        // by pid: an agent restarted by a rollout is a new process, reported again if it dies
        let mut reported = Vec::new();
        loop {
            tokio::select! {
                _ = term.recv() => return Ok::<_, anyhow::Error>(None),
                _ = int.recv() => return Ok(None),
                _ = tick.tick() => {
                    let Ok(mut cluster) = control.cluster.try_lock() else { continue };
                    // a dispatcher that exited: followed to its successor (a hot restart), or
                    // the end of the cluster
                    let (_, agents) = cluster.exited();
                    for seen in control.check_dispatchers(&mut cluster) {
                        match seen {
                            Seen::Restarted { i, old, new } => eprintln!(
                                "baton up: dispatcher {i} restarted: pid {old} exited, pid {new} serves"
                            ),
                            Seen::Exited { i, pid, status } => {
                                return Ok(Some(format!("dispatcher {i}, pid {pid}: {status}")));
                            }
                        }
                    }
                    for a in agents {
                        let pid = cluster.agents[a].child.id();
                        if !reported.contains(&pid) {
                            eprintln!("baton up: agent {a} exited; the dispatcher routes around it");
                            reported.push(pid);
                        }
                    }
                    control.refresh(&mut cluster);
                }
            }
        }
    })?;
    // a rollout in progress gives up at its next wait, and releases the cluster
    control
        .abort
        .store(true, std::sync::atomic::Ordering::Relaxed);
    stop.cancel();
    let mut cluster = control.cluster.lock().unwrap_or_else(|p| p.into_inner());
    // successors after a hot restart are no children of the cluster's: stopped beside them
    let grace = Duration::from_secs(5);
    let successors = control.stop_successors();
    let deadline = std::time::Instant::now() + grace;
    cluster.stop(grace);
    successors.finish(deadline);
    if owns_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match ended {
        Some(status) => anyhow::bail!("the dispatcher exited ({status}); cluster stopped"),
        None => Ok(()),
    }
}
