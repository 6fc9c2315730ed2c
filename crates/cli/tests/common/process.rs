//! `baton agent` and `baton dispatch` as child processes, started through the lab's
//! `start_ready` (wait for `ready`, collect the `listening KIND ADDR` lines).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{metrics_page, series_sum, series_value, Endpoint, Pki};

pub const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Starts `baton SUBCOMMAND FIXED ARGS`, waits for `ready` on stdout and returns the
/// addresses announced as `listening KIND ADDR`.
pub fn spawn_ready(
    subcommand: &str,
    fixed: &[&str],
    args: &[&str],
) -> (Child, HashMap<String, SocketAddr>) {
    spawn_ready_with(BATON, subcommand, fixed, args)
}

/// [`spawn_ready`] with another `baton` binary (the release build, for balance bounds).
pub fn spawn_ready_with(
    bin: &str,
    subcommand: &str,
    fixed: &[&str],
    args: &[&str],
) -> (Child, HashMap<String, SocketAddr>) {
    spawn_ready_env(bin, subcommand, fixed, args, &[])
}

/// [`spawn_ready_with`] with `env` added to the child's environment.
pub fn spawn_ready_env(
    bin: &str,
    subcommand: &str,
    fixed: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> (Child, HashMap<String, SocketAddr>) {
    let mut cmd = Command::new(bin);
    cmd.envs(env.iter().copied());
    cmd.arg(subcommand)
        .args(fixed)
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stderr(Stdio::inherit());
    let p = baton_cluster::cluster::start_ready(cmd, None).unwrap_or_else(|e| panic!("{e:#}"));
    (p.child, p.addrs)
}

/// Standard output and error of a finished command, as one text.
pub fn text_of(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A running `baton agent`, killed on drop.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    /// The agent link's address (`--link-listen`), if it has one.
    pub link: Option<SocketAddr>,
}

impl Agent {
    /// Starts `baton agent --listen 127.0.0.1:0 --metrics 127.0.0.1:0 ARGS` and waits for
    /// `ready`.
    pub fn start(args: &[&str]) -> Agent {
        let (child, addrs) = spawn_ready(
            "agent",
            &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            args,
        );
        Agent {
            child,
            addr: addrs["tls"],
            metrics: addrs["metrics"],
            link: addrs.get("link").copied(),
        }
    }

    /// [`Agent::start`] serving `pki`'s ECDSA and RSA certificates, with `extra` flags.
    pub fn serving(pki: &Pki, extra: &[&str]) -> Agent {
        let mut args = pki.server_args();
        args.extend(extra.iter().map(|s| s.to_string()));
        Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn connect(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port())
    }

    /// The metrics page.
    pub fn metrics_text(&self) -> String {
        metrics_page(self.metrics)
    }

    /// The value of one metric line, `name{labels}` exactly as rendered.
    pub fn metric(&self, series: &str) -> f64 {
        series_value(&self.metrics_text(), series)
    }

    pub fn handshakes(&self, version: &str, kind: &str) -> u64 {
        self.metric(&format!(
            "baton_handshakes_total{{version=\"{version}\",kind=\"{kind}\"}}"
        )) as u64
    }

    pub fn failures(&self, reason: &str) -> u64 {
        self.metric(&format!(
            "baton_handshake_failures_total{{reason=\"{reason}\"}}"
        )) as u64
    }

    /// Responses the agent has sent so far (all status classes).
    pub fn served(&self) -> u64 {
        series_sum(&self.metrics_text(), "baton_http_requests_total{", "") as u64
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to exit (after SIGTERM), at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn rss_bytes(&self) -> u64 {
        baton_ops::process::rss_bytes_of(self.child.id()).expect("the agent runs")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Endpoint for Agent {
    fn tls_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A running `baton dispatch`, killed on drop.
pub struct Dispatcher {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
}

impl Dispatcher {
    /// `baton dispatch --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --agent ... ARGS`.
    pub fn start(agents: &[&Agent], args: &[&str]) -> Dispatcher {
        // Agents with a link are reached over it (the caller gives --cluster-key-file).
        let mut all: Vec<String> = agents
            .iter()
            .flat_map(|a| {
                let link = a.link.map(|l| ["--agent-link".to_string(), l.to_string()]);
                ["--agent".to_string(), a.addr.to_string()]
                    .into_iter()
                    .chain(link.into_iter().flatten())
            })
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (child, addrs) = spawn_ready(
            "dispatch",
            &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            &all,
        );
        Dispatcher {
            child,
            addr: addrs["dispatch"],
            metrics: addrs["metrics"],
        }
    }

    pub fn metric(&self, series: &str) -> f64 {
        series_value(&metrics_page(self.metrics), series)
    }

    /// `baton dispatch --agents-file FILE --admin 127.0.0.1:0` (with the tests' admin token)
    /// and `extra`; the dispatcher and its admin address.
    pub fn with_admin(file: &str, extra: &[&str]) -> (Dispatcher, SocketAddr) {
        let mut args = vec![
            "--agents-file",
            file,
            "--admin",
            "127.0.0.1:0",
            "--admin-token-file",
            super::admin_token_file(),
        ];
        args.extend_from_slice(extra);
        let (child, addrs) = spawn_ready(
            "dispatch",
            &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            &args,
        );
        let d = Dispatcher {
            child,
            addr: addrs["dispatch"],
            metrics: addrs["metrics"],
        };
        (d, addrs["admin"])
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Endpoint for Dispatcher {
    fn tls_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Whether the tests run as root (network namespaces, switching users).
pub fn is_root() -> bool {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// Whether haproxy is installed; without it a test skips, unless BATON_REQUIRE_SERVERS says
/// it must not (CI).
pub fn have_haproxy() -> bool {
    if Command::new("haproxy").arg("-v").output().is_ok() {
        return true;
    }
    super::require_or_skip("haproxy", "the L4 balancer in front of the cluster");
    false
}

/// The agents file naming `agents` by their ids (positions), with their links.
pub fn linked_roster(agents: &[Agent]) -> String {
    agents
        .iter()
        .enumerate()
        .map(|(id, a)| {
            format!(
                "[[agent]]\nid = {id}\naddr = \"{}\"\nlink = \"{}\"\n\n",
                a.addr,
                a.link.unwrap()
            )
        })
        .collect()
}
