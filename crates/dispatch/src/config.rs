//! The dispatcher's settings: flags, the same keys in TOML, and the resolved configuration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

use baton_ops::cidr::Cidr;
use baton_ops::duration::HumanDuration;
use baton_ops::guard::Token;

use crate::members::{self, Admin, Spec};
use crate::route::Policy;

/// `baton dispatch`: spread TLS connections over agents.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct DispatchArgs {
    /// TOML file with any of these settings (keys are the flag names); flags override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address to accept clients on (repeatable or comma separated). Default 127.0.0.1:8443; port 0
    /// picks one and prints `listening dispatch ADDR`.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub listen: Vec<SocketAddr>,
    /// An agent's TLS address (repeatable or comma separated). The order is the agents' ids: the
    /// first is agent 0, and must run with `--agent-id 0` for ticket affinity.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub agent: Vec<SocketAddr>,
    /// An agent's link address (its `--link-listen`; repeatable, in the same order as
    /// --agent). With links, every client travels to its agent as a stream of a few
    /// long-lived, authenticated connections (no connect, no PROXY header per client);
    /// `handoff` needs them.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub agent_link: Vec<SocketAddr>,
    /// The agents from a file instead of --agent (TOML `[[agent]]` tables: `id`, `addr`,
    /// `link`, `state` = active, draining or disabled). Re-read when it changes and on SIGHUP;
    /// agents that join, leave or drain take effect at once, and established streams finish.
    #[arg(long, value_name = "FILE")]
    pub agents_file: Option<PathBuf>,
    /// The admin endpoint (plain HTTP, loopback addresses only): `GET /agents` lists the
    /// agents with their state and load; `POST /agents` (a JSON agent) adds one;
    /// `POST /agents/ID/drain`, `/disable`, `/enable` and `DELETE /agents/ID` change one;
    /// `POST /handover` replaces this process. Every call needs the token of
    /// --admin-token-file. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// With --admin: the file holding the admin token (`Authorization: Bearer TOKEN`), which
    /// only its owner may read; a random one is written there if the file does not exist.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Cluster key file (the agents' --cluster-key-file): authenticates the agent links.
    #[arg(long, value_name = "FILE")]
    pub cluster_key_file: Option<PathBuf>,
    /// Link connections kept to each agent. Default 2.
    #[arg(long, value_name = "N")]
    pub link_connections: Option<usize>,
    /// round-robin, least-conn, client-ip, session or migration. Default round-robin.
    /// `migration` (CSSL-SF; `handoff`: its old name) needs agents run with `--migration true`
    /// and a shared --cluster-key-file.
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<Policy>,
    /// Send a PROXY protocol v2 header to agents (run them with `--proxy-protocol true`).
    #[arg(long, value_name = "BOOL")]
    pub proxy_protocol: Option<bool>,
    /// Expect a PROXY protocol v2 header from an L4 balancer in front, and route on the client
    /// address it carries.
    #[arg(long, value_name = "BOOL")]
    pub accept_proxy_protocol: Option<bool>,
    /// With --accept-proxy-protocol: a network the balancers connect from (ADDR/PREFIX or an
    /// address; repeatable or comma separated). Connections from anywhere else are refused: a PROXY
    /// header names the client to route as, so only the balancers may send one. Default: loopback
    /// only.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub proxy_protocol_from: Vec<Cidr>,
    /// Address for Prometheus metrics (plain HTTP, /metrics).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Time allowed for the ClientHello to arrive. Default 10s.
    #[arg(long, value_name = "DURATION")]
    pub hello_timeout: Option<HumanDuration>,
    /// Time allowed to connect to an agent. Default 2s.
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<HumanDuration>,
    /// The step every migration deadline is a multiple of, the same setting as the agents':
    /// the home agent has 1 step to take a migrated session (connect and answer), after which
    /// the handshake agent keeps it; the client's record in flight at the cut has 2, after
    /// which the connection closes. Default 1s. (`--handoff-timeout`: its old name.)
    #[arg(long, alias = "handoff-timeout", value_name = "DURATION")]
    #[serde(alias = "handoff-timeout")]
    pub migration_timeout: Option<HumanDuration>,
    /// `migration`: full handshakes a client's home agent may have done beyond the
    /// least-loaded agent and still take the client's next full handshake (no migration).
    /// Wider moves fewer sessions; the handshake counts stay within about this many of each
    /// other. Default 8; 0 sends a handshake home only when the home has done no more.
    /// (`--handoff-window`: its old name.)
    #[arg(long = "migration-window", alias = "handoff-window", value_name = "N")]
    #[serde(rename = "migration-window", alias = "handoff-window")]
    pub handoff_window: Option<u64>,
    /// Time between health checks of each agent. Default 500ms; two failures in a row take an
    /// agent out, one success brings it back.
    #[arg(long, value_name = "DURATION")]
    pub health_interval: Option<HumanDuration>,
    /// A spliced connection on which neither side sends a byte for this long is closed.
    /// Default 120s (above an agent's idle timeout, which normally ends it first).
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<HumanDuration>,
    /// Once either side of a spliced connection has ended its half, the other may stay
    /// silent only this long before the connection is closed. Default 10s.
    #[arg(long, value_name = "DURATION")]
    pub half_close_timeout: Option<HumanDuration>,
    /// TCP keepalive on client sockets: the first probe after this long without traffic
    /// (then every 10s, 3 probes), so clients that vanished free their slot. Default 60s.
    #[arg(long, value_name = "DURATION")]
    pub tcp_keepalive: Option<HumanDuration>,
    /// Connections relayed at once; more are closed at accept. Default 20000.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Runtime worker threads. Default: one per CPU (a multi-thread runtime), so a dispatcher
    /// uses its machine. 1 is a current-thread runtime, the cheapest per connection (no
    /// cross-thread wake-ups; a link writes the frames of every client that queued some in one
    /// system call): for a dispatcher that one core serves, or one dispatcher per core behind
    /// an L4 balancer.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Dispatcher restart (SIGUSR2 or `POST /restart`): time allowed for the successor to
    /// be ready, and then for every live connection to be passed to it; connections not
    /// passed by then close with the old process. Default 30s. (`--handover-timeout`: its
    /// old name.)
    #[arg(
        long = "restart-timeout",
        alias = "handover-timeout",
        value_name = "DURATION"
    )]
    #[serde(rename = "restart-timeout", alias = "handover-timeout")]
    pub handover_timeout: Option<HumanDuration>,
}

#[derive(Debug, Clone)]
pub struct DispatchConfig {
    pub listen: Vec<SocketAddr>,
    pub agents: Vec<SocketAddr>,
    /// Each agent's link address, in agent order; empty: TCP per client.
    pub agent_links: Vec<SocketAddr>,
    /// `--agents-file`: the roster, instead of `agents` and `agent_links`.
    pub agents_file: Option<PathBuf>,
    pub admin: Option<SocketAddr>,
    /// The admin token (`--admin-token-file`), with `admin`.
    pub admin_token: Option<Arc<Token>>,
    pub cluster_key_file: Option<PathBuf>,
    pub link_connections: usize,
    pub policy: Policy,
    pub proxy_protocol: bool,
    pub accept_proxy_protocol: bool,
    /// Who may send a PROXY header (`--proxy-protocol-from`).
    pub proxy_protocol_from: Vec<Cidr>,
    pub metrics: Option<SocketAddr>,
    pub hello_timeout: Duration,
    pub connect_timeout: Duration,
    pub migration_timeouts: baton_migrate::Timeouts,
    pub handoff_window: u64,
    pub health_interval: Duration,
    pub idle_timeout: Duration,
    pub half_close_timeout: Duration,
    pub handover_timeout: Duration,
    pub tcp_keepalive: Duration,
    pub max_connections: usize,
    pub workers: usize,
}

impl DispatchConfig {
    /// The roster at start: the agents file, or `--agent`/`--agent-link` with ids in order.
    pub fn initial_agents(&self) -> anyhow::Result<Vec<Spec>> {
        let specs = match &self.agents_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading agents file {}", path.display()))?;
                members::parse_file(&text)
                    .with_context(|| format!("agents file {}", path.display()))?
            }
            None => self
                .agents
                .iter()
                .enumerate()
                .map(|(id, addr)| Spec {
                    id: id as u16,
                    addr: *addr,
                    link: self.agent_links.get(id).copied(),
                    admin: Admin::Active,
                })
                .collect(),
        };
        if self.policy == Policy::Handoff && specs.iter().any(|s| s.link.is_none()) {
            bail!("--policy migration needs a link address for every agent (migrations travel on the links)");
        }
        Ok(specs)
    }
}

impl DispatchArgs {
    /// The flags over the `--config` file's keys, before defaults and rules.
    pub(crate) fn merged(self) -> anyhow::Result<Self> {
        Ok(match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                let file: DispatchArgs = toml::from_str(&text)
                    .with_context(|| format!("config file {}", path.display()))?;
                self.over(file)
            }
            None => self,
        })
    }

    pub fn resolve(self) -> anyhow::Result<DispatchConfig> {
        self.resolve_with(|path| Token::load_or_create(path).map(Some))
    }

    /// [`Self::resolve`], with the admin token file read (or created) by `token`: `baton
    /// check` looks at the file without creating it.
    pub(crate) fn resolve_with(
        self,
        token: impl FnOnce(&Path) -> anyhow::Result<Option<Token>>,
    ) -> anyhow::Result<DispatchConfig> {
        let args = self.merged()?;
        if args.agent.is_empty() && args.agents_file.is_none() {
            bail!(
                "no agents: give --agent ADDR for each agent, in agent-id order, or --agents-file"
            );
        }
        if !args.agent.is_empty() && args.agents_file.is_some() {
            bail!("give the agents with --agent or in --agents-file, not both");
        }
        let admin_token = match (args.admin, &args.admin_token_file) {
            (Some(admin), _) if !admin.ip().is_loopback() => {
                bail!("--admin {admin}: the admin endpoint listens on loopback addresses only")
            }
            (Some(_), Some(path)) => token(path)?.map(Arc::new),
            (Some(_), None) => bail!(
                "--admin needs --admin-token-file FILE: the token every admin call must send \
                 (a random one is written there, mode 0600, if the file does not exist)"
            ),
            (None, _) => None,
        };
        let policy = args.policy.unwrap_or(Policy::RoundRobin);
        if !args.agent_link.is_empty() && args.agent_link.len() != args.agent.len() {
            bail!(
                "--agent-link: give one per --agent, in the same order ({} agents, {} links)",
                args.agent.len(),
                args.agent_link.len()
            );
        }
        if !args.agent_link.is_empty() && args.cluster_key_file.is_none() {
            bail!("--agent-link needs --cluster-key-file (the key the links authenticate with)");
        }
        if policy == Policy::Handoff && args.agent_link.is_empty() && args.agents_file.is_none() {
            bail!("--policy migration needs --agent-link for every agent (migrations travel on the links)");
        }
        let secs = |v: Option<HumanDuration>, d: f64, name: &str| -> anyhow::Result<Duration> {
            let v = v.map_or(Duration::from_secs_f64(d), |v| v.0);
            if v.is_zero() || v >= Duration::from_secs(3600) {
                bail!("--{name} must be more than 0 and less than 1h");
            }
            Ok(v)
        };
        Ok(DispatchConfig {
            listen: if args.listen.is_empty() {
                vec!["127.0.0.1:8443".parse().expect("literal address")]
            } else {
                args.listen
            },
            agents: args.agent,
            agent_links: args.agent_link,
            agents_file: args.agents_file,
            admin: args.admin,
            admin_token,
            cluster_key_file: args.cluster_key_file,
            link_connections: args.link_connections.unwrap_or(2).clamp(1, 64),
            policy,
            proxy_protocol: args.proxy_protocol.unwrap_or(false),
            accept_proxy_protocol: args.accept_proxy_protocol.unwrap_or(false),
            proxy_protocol_from: if args.proxy_protocol_from.is_empty() {
                Cidr::loopback()
            } else {
                args.proxy_protocol_from
            },
            metrics: args.metrics,
            hello_timeout: secs(args.hello_timeout, 10.0, "hello-timeout")?,
            connect_timeout: secs(args.connect_timeout, 2.0, "connect-timeout")?,
            migration_timeouts: baton_migrate::Timeouts::from_setting(
                args.migration_timeout.map(|d| d.0),
            )
            .map_err(anyhow::Error::msg)?,
            handoff_window: args.handoff_window.unwrap_or(8),
            health_interval: secs(args.health_interval, 0.5, "health-interval")?,
            idle_timeout: secs(args.idle_timeout, 120.0, "idle-timeout")?,
            half_close_timeout: secs(args.half_close_timeout, 10.0, "half-close-timeout")?,
            tcp_keepalive: secs(args.tcp_keepalive, 60.0, "tcp-keepalive")?,
            handover_timeout: secs(args.handover_timeout, 30.0, "restart-timeout")?,
            max_connections: args.max_connections.unwrap_or(20_000).max(1),
            workers: args
                .workers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1),
        })
    }

    fn over(self, file: Self) -> Self {
        let list = |a: Vec<SocketAddr>, b: Vec<SocketAddr>| if a.is_empty() { b } else { a };
        Self {
            config: self.config,
            listen: list(self.listen, file.listen),
            agent: list(self.agent, file.agent),
            agent_link: list(self.agent_link, file.agent_link),
            agents_file: self.agents_file.or(file.agents_file),
            admin: self.admin.or(file.admin),
            admin_token_file: self.admin_token_file.or(file.admin_token_file),
            cluster_key_file: self.cluster_key_file.or(file.cluster_key_file),
            link_connections: self.link_connections.or(file.link_connections),
            policy: self.policy.or(file.policy),
            proxy_protocol: self.proxy_protocol.or(file.proxy_protocol),
            accept_proxy_protocol: self.accept_proxy_protocol.or(file.accept_proxy_protocol),
            proxy_protocol_from: if self.proxy_protocol_from.is_empty() {
                file.proxy_protocol_from
            } else {
                self.proxy_protocol_from
            },
            metrics: self.metrics.or(file.metrics),
            hello_timeout: self.hello_timeout.or(file.hello_timeout),
            connect_timeout: self.connect_timeout.or(file.connect_timeout),
            migration_timeout: self.migration_timeout.or(file.migration_timeout),
            handoff_window: self.handoff_window.or(file.handoff_window),
            health_interval: self.health_interval.or(file.health_interval),
            idle_timeout: self.idle_timeout.or(file.idle_timeout),
            half_close_timeout: self.half_close_timeout.or(file.half_close_timeout),
            tcp_keepalive: self.tcp_keepalive.or(file.tcp_keepalive),
            max_connections: self.max_connections.or(file.max_connections),
            workers: self.workers.or(file.workers),
            handover_timeout: self.handover_timeout.or(file.handover_timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_and_flags() {
        let file: DispatchArgs = toml::from_str(
            "agent = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\npolicy = \"session\"\nhello-timeout = 3\n\
             proxy-protocol-from = [\"10.0.0.0/8\"]\n",
        )
        .unwrap();
        let flags = DispatchArgs {
            policy: Some(Policy::LeastConn),
            ..Default::default()
        };
        let c = flags.over(file).resolve().unwrap();
        assert_eq!(c.agents.len(), 2);
        assert_eq!(c.policy, Policy::LeastConn);
        assert_eq!(c.hello_timeout, Duration::from_secs(3));
        assert_eq!(c.proxy_protocol_from, vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(c.half_close_timeout, Duration::from_secs(10));
        assert!(DispatchArgs::default().resolve().is_err());
        assert!(toml::from_str::<DispatchArgs>("agents = []").is_err());
    }

    #[test]
    fn the_migration_timeout_and_its_old_name() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: DispatchArgs,
        }
        let resolve = |flags: &[&str]| {
            let mut argv = vec!["dispatch", "--agent", "127.0.0.1:1"];
            argv.extend_from_slice(flags);
            <Cli as clap::Parser>::try_parse_from(argv)
                .map_err(|e| e.to_string())
                .and_then(|c| c.args.resolve().map_err(|e| e.to_string()))
                .map(|c| c.migration_timeouts.step())
        };
        assert_eq!(resolve(&[]), Ok(Duration::from_secs(1)));
        assert_eq!(
            resolve(&["--migration-timeout", "250ms"]),
            Ok(Duration::from_millis(250))
        );
        // the old flag took float seconds, and means the same
        assert_eq!(
            resolve(&["--handoff-timeout", "0.5"]),
            Ok(Duration::from_millis(500))
        );
        assert!(resolve(&["--migration-timeout", "0"]).is_err());
        let file: DispatchArgs = toml::from_str("handoff-timeout = 0.25").unwrap();
        assert_eq!(
            file.migration_timeout.map(|d| d.0),
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn migration_and_restart_names_and_their_old_aliases() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: DispatchArgs,
        }
        let parse = |flags: &[&str]| {
            let mut argv = vec!["dispatch", "--agent", "127.0.0.1:1"];
            argv.extend_from_slice(flags);
            <Cli as clap::Parser>::try_parse_from(argv)
                .map(|c| c.args)
                .map_err(|e| e.to_string())
        };
        let new = [
            "--policy",
            "migration",
            "--migration-window",
            "3",
            "--restart-timeout",
            "7s",
        ];
        let old = [
            "--policy",
            "handoff",
            "--handoff-window",
            "3",
            "--handover-timeout",
            "7s",
        ];
        for flags in [new, old] {
            let a = parse(&flags).unwrap();
            assert_eq!(a.policy, Some(Policy::Handoff));
            assert_eq!(a.handoff_window, Some(3));
            assert_eq!(
                a.handover_timeout.map(|d| d.0),
                Some(Duration::from_secs(7))
            );
        }
        for toml in [
            "policy = \"migration\"\nmigration-window = 3\nrestart-timeout = \"7s\"",
            "policy = \"handoff\"\nhandoff-window = 3\nhandover-timeout = \"7s\"",
        ] {
            let a: DispatchArgs = toml::from_str(toml).unwrap();
            assert_eq!(a.policy, Some(Policy::Handoff));
            assert_eq!(a.handoff_window, Some(3));
            assert_eq!(
                a.handover_timeout.map(|d| d.0),
                Some(Duration::from_secs(7))
            );
        }
        // what --help and error messages call it
        use clap::ValueEnum;
        let name = Policy::Handoff.to_possible_value().unwrap();
        assert_eq!(name.get_name(), "migration");
    }
}
