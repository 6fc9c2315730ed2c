//! Rolling restart of a `baton up` cluster's agents: `baton up --admin ADDR` serves
//! `POST /rollout` and `GET /status`, and `baton rollout --admin ADDR` asks for one and prints
//! what happened.
//!
//! One agent at a time: SIGTERM (the agent drains itself: GOAWAY on the dispatchers' links,
//! its streams finish, and its established sessions move elsewhere where the agent can move
//! them), wait for it to exit (bounded by the drain deadline, then SIGKILL, reported), start a
//! new process with exactly the same command line, ports and id, wait for `ready` and until
//! every dispatcher's links to it are up again, then the next agent. A failure stops the
//! rollout where it is: the agents not yet restarted are left alone, so a bad binary takes out
//! at most one agent.
//!
//! The same endpoint hot-restarts the dispatchers, each replaced by a successor process (`POST
//! /restart`, `baton rollout --restart`; see `restart.rs`), one operation at a time
//! (`control.rs`).

use baton_ops::duration::HumanDuration;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use baton_ops::guard::Token;
use serde::{Deserialize, Serialize};

use crate::client::http;
use crate::cluster::{start_ready, Cluster, Proc};
use crate::signal::{self, Signal};

/// How a rollout paces itself and how long it waits for each phase.
#[derive(Debug, Clone, Copy)]
pub struct RolloutOptions {
    /// Pause after an agent is back (links up) before the next one is stopped.
    pub pause: Duration,
    /// How long a draining agent may take to exit before it is killed.
    pub drain_deadline: Duration,
    /// How long a new agent may take to be ready and reached by every dispatcher's links.
    pub ready_deadline: Duration,
}

impl Default for RolloutOptions {
    fn default() -> Self {
        Self {
            pause: Duration::ZERO,
            // The agent's own --drain-timeout (30 s by default) and a little to exit after it:
            // an agent that needs all of its drain time is not killed as it finishes.
            drain_deadline: Duration::from_secs(35),
            ready_deadline: Duration::from_secs(30),
        }
    }
}

/// `POST /rollout`'s optional body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutRequest {
    pub pause_ms: Option<u64>,
    pub drain_timeout_ms: Option<u64>,
    pub ready_timeout_ms: Option<u64>,
}

/// Upper bounds on what a request may ask for (each phase still has a deadline).
const MAX_PAUSE_MS: u64 = 600_000;
const MAX_DEADLINE_MS: u64 = 600_000;

impl RolloutRequest {
    pub fn options(&self) -> Result<RolloutOptions, String> {
        let d = RolloutOptions::default();
        let ms = |v: Option<u64>, default: Duration, max: u64, what: &str| match v {
            None => Ok(default),
            Some(v) if v > max => Err(format!("{what} {v} ms: at most {max}")),
            Some(0) if what != "pause_ms" => Err(format!("{what} must be positive")),
            Some(v) => Ok(Duration::from_millis(v)),
        };
        Ok(RolloutOptions {
            pause: ms(self.pause_ms, d.pause, MAX_PAUSE_MS, "pause_ms")?,
            drain_deadline: ms(
                self.drain_timeout_ms,
                d.drain_deadline,
                MAX_DEADLINE_MS,
                "drain_timeout_ms",
            )?,
            ready_deadline: ms(
                self.ready_timeout_ms,
                d.ready_deadline,
                MAX_DEADLINE_MS,
                "ready_timeout_ms",
            )?,
        })
    }
}

/// What happened to one agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentRestart {
    pub id: usize,
    pub old_pid: u32,
    /// The new process (absent when it could not be started).
    pub new_pid: Option<u32>,
    /// SIGTERM to exit (or to the SIGKILL at the drain deadline).
    pub drain_ms: u64,
    /// How the old process ended, as the OS says (`exit status: 0`, `signal: 9 (SIGKILL)`).
    pub exit: String,
    /// The drain deadline passed and the old process was killed.
    pub killed: bool,
    /// Start of the new process to its `ready`.
    pub start_ms: u64,
    /// `ready` to every dispatcher's links up and the agent listed up by every dispatcher.
    pub links_ms: u64,
    /// SIGTERM to links up: how long the cluster ran without this agent.
    pub restart_ms: u64,
    /// Why this agent's restart failed (the rollout stopped there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A rollout's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RolloutReport {
    /// Every agent was restarted and is back.
    pub ok: bool,
    pub agents: Vec<AgentRestart>,
    pub total_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where the rollout checks that a restarted agent is reached again.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    /// Each dispatcher's admin endpoint (`GET /agents`); none with `--hosts` (their admin
    /// listens on their own namespace's loopback).
    pub dispatcher_admins: Vec<SocketAddr>,
    /// The admin token the dispatchers were started with (`baton up`'s own).
    pub admin_token: Option<Arc<Token>>,
    /// Link connections every dispatcher keeps to each agent (`--link-connections`, 2).
    pub links_per_dispatcher: usize,
    /// Dispatchers in the cluster.
    pub dispatchers: usize,
}

impl Cluster {
    /// Agent `i`'s command line as the kernel has it (`/proc/PID/cmdline`), with the ports it
    /// announced pinned in place of any port 0 (`--listen`, `--metrics`, `--link-listen`), so
    /// that a process started from it is reached where the old one was.
    pub fn agent_command_line(&self, i: usize) -> anyhow::Result<Vec<String>> {
        let a = self.agents.get(i).ok_or_else(|| anyhow!("no agent {i}"))?;
        let pid = a.child.id();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
            .with_context(|| format!("reading agent {i}'s command line (pid {pid})"))?;
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        if argv.get(1).map(String::as_str) != Some("agent") {
            bail!("agent {i} (pid {pid}) is not a running `baton agent`: {argv:?}");
        }
        Ok(pin_ports(argv, a))
    }

    /// Restarts agent `i` from `argv` (see [`Cluster::agent_command_line`]): SIGTERM, wait for
    /// it to exit (SIGKILL at `opts.drain_deadline`), start `argv` again (in the agent's host
    /// with `--hosts`; a CPU cap of the lab's is not applied again), wait for `ready`, then
    /// until `watch` sees the dispatchers' links to it up. `abort` stops the waits early (the
    /// cluster is being stopped). The old process is always reaped; the new one replaces it
    /// in `self.agents` once started.
    pub fn restart_agent(
        &mut self,
        i: usize,
        argv: &[String],
        opts: &RolloutOptions,
        watch: &Watch,
        abort: &AtomicBool,
    ) -> AgentRestart {
        let began = Instant::now();
        let old = &mut self.agents[i];
        let old_pid = old.child.id();
        let mut r = AgentRestart {
            id: i,
            old_pid,
            new_pid: None,
            drain_ms: 0,
            exit: String::new(),
            killed: false,
            start_ms: 0,
            links_ms: 0,
            restart_ms: 0,
            error: None,
        };
        // 1. drain: the agent's own SIGTERM handling, bounded here
        if matches!(old.child.try_wait(), Ok(None)) {
            signal::send(old_pid, Signal::TERM);
        }
        let deadline = began + opts.drain_deadline;
        let status = loop {
            match old.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline && !abort.load(Ordering::Relaxed) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => break None,
            }
        };
        let status = match status {
            Some(s) => s,
            None => {
                r.killed = true;
                let _ = old.child.kill();
                match old.child.wait() {
                    Ok(s) => s,
                    Err(e) => {
                        r.error = Some(format!("reaping agent {i} (pid {old_pid}): {e}"));
                        return r;
                    }
                }
            }
        };
        r.drain_ms = began.elapsed().as_millis() as u64;
        r.exit = status.to_string();
        if abort.load(Ordering::Relaxed) {
            r.error = Some("stopped: the cluster is shutting down".into());
            return r;
        }
        // 2. the same command line again
        let started = Instant::now();
        let proc = match self.spawn_agent_again(i, argv) {
            Ok(p) => p,
            Err(e) => {
                r.error = Some(format!("starting agent {i} again: {e:#}"));
                return r;
            }
        };
        r.new_pid = Some(proc.child.id());
        r.start_ms = started.elapsed().as_millis() as u64;
        let metrics = proc.addr("metrics");
        self.agents[i] = proc;
        // 3. reached again by every dispatcher
        let ready = Instant::now();
        let until = ready + opts.ready_deadline;
        loop {
            let last = match reached(i, metrics, watch) {
                Ok(()) => break,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= until || abort.load(Ordering::Relaxed) {
                r.error = Some(format!(
                    "agent {i} started (pid {}) but the dispatchers did not reach it within {:?}: {last}",
                    r.new_pid.unwrap_or(0),
                    opts.ready_deadline
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        r.links_ms = ready.elapsed().as_millis() as u64;
        r.restart_ms = began.elapsed().as_millis() as u64;
        r
    }

    /// Starts `argv` as agent `i` (stderr appended to its log). A port the old process held
    /// may be briefly refused ("Address already in use") while the kernel finishes closing
    /// its sockets: a few tries, 200 ms apart.
    fn spawn_agent_again(&self, i: usize, argv: &[String]) -> anyhow::Result<Proc> {
        let (program, args) = argv.split_first().ok_or_else(|| anyhow!("empty argv"))?;
        let log = self.dir.join(format!("agent-{i}.log"));
        let host = self
            .hosts
            .iter()
            .flat_map(|h| h.hosts())
            .find(|h| h.name == format!("agent{i}"));
        let mut attempt = 1;
        loop {
            let stderr = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .with_context(|| format!("opening {}", log.display()))?;
            let mut cmd = match host {
                Some(h) => h.command(program),
                None => Command::new(program),
            };
            cmd.args(args).stderr(stderr);
            match start_ready(cmd, Some(&log)) {
                Err(e) if attempt < 5 && format!("{e:#}").contains("Address already in use") => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                r => return r,
            }
        }
    }
}

/// `argv` with each `--listen`/`--metrics`/`--link-listen` value replaced by the address the
/// process announced for it (which differs only where the flag asked for port 0).
fn pin_ports(mut argv: Vec<String>, p: &Proc) -> Vec<String> {
    let mut j = 0;
    while j + 1 < argv.len() {
        let kind = match argv[j].as_str() {
            "--listen" => Some("tls"),
            "--metrics" => Some("metrics"),
            "--link-listen" => Some("link"),
            _ => None,
        };
        if let Some(addr) = kind.and_then(|k| p.addr(k)) {
            argv[j + 1] = addr.to_string();
            j += 2;
        } else {
            j += 1;
        }
    }
    argv
}

/// Whether every dispatcher reaches agent `id` again: the new process counts every
/// dispatcher's link connections (`baton_link_connections_active`), and each dispatcher's
/// admin endpoint lists it as up and active.
fn reached(id: usize, metrics: Option<SocketAddr>, watch: &Watch) -> anyhow::Result<()> {
    let want = (watch.dispatchers * watch.links_per_dispatcher) as f64;
    if let Some(m) = metrics {
        let page = baton_bench::scrape::page_blocking(m)?;
        let samples = baton_bench::scrape::samples(&page);
        let have = baton_bench::scrape::sum(&samples, "baton_link_connections_active", &[]);
        if have < want {
            bail!("{have} of {want} link connections from the dispatchers");
        }
    }
    for admin in &watch.dispatcher_admins {
        let token = watch
            .admin_token
            .as_deref()
            .ok_or_else(|| anyhow!("no admin token for the dispatchers"))?;
        let (status, body) = http(*admin, token, "GET", "/agents", "", Duration::from_secs(5))?;
        if status != 200 {
            bail!("GET http://{admin}/agents: {status}");
        }
        let listed: serde_json::Value = serde_json::from_str(&body)
            .with_context(|| format!("GET http://{admin}/agents: not JSON"))?;
        let me = listed
            .as_array()
            .and_then(|a| a.iter().find(|x| x["id"].as_u64() == Some(id as u64)))
            .ok_or_else(|| anyhow!("dispatcher {admin} does not list agent {id}"))?;
        if me["up"] != true || me["state"] != "active" {
            bail!("dispatcher {admin} lists agent {id} as {me}");
        }
    }
    Ok(())
}

/// `baton rollout`: restart a `baton up` cluster's agents one at a time.
#[derive(clap::Args, Debug, Clone)]
pub struct RolloutArgs {
    /// The admin address of `baton up --admin`.
    #[arg(long, value_name = "ADDR")]
    pub admin: SocketAddr,
    /// The admin token file of that `baton up` (it prints the path: `admin-token FILE`, and
    /// writes it in its --state file as `admin_token_file`).
    #[arg(long, value_name = "FILE", env = "BATON_ADMIN_TOKEN_FILE")]
    pub admin_token_file: std::path::PathBuf,
    /// Pause between one agent being back and the next being stopped (e.g. 2s).
    #[arg(long, value_name = "DURATION")]
    pub pause: Option<HumanDuration>,
    /// How long each agent may take to drain and exit before it is killed. Default 35s (an
    /// agent's own --drain-timeout is 30s).
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<HumanDuration>,
    /// How long each new agent may take to be ready and reached by the dispatchers. Default 30s.
    #[arg(long, value_name = "DURATION")]
    pub ready_timeout: Option<HumanDuration>,
    /// Print the JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Hot-restart every dispatcher instead, each replaced by a successor process (`POST
    /// /restart`: one at a time, SIGUSR2, until the old process is gone and the successor
    /// serves). With it, --ready-timeout bounds each dispatcher's restart (default 40s).
    #[arg(long, visible_alias = "handover", conflicts_with_all = ["pause", "drain_timeout"])]
    pub restart: bool,
}

/// `baton rollout`: asks `baton up --admin` for a rolling restart and prints its summary; an
/// error when any agent failed to come back.
pub fn rollout_cli(args: RolloutArgs) -> anyhow::Result<()> {
    let ms = |d: &Option<HumanDuration>| -> anyhow::Result<Option<u64>> {
        Ok(d.map(|d| d.0.as_millis() as u64))
    };
    let token = Token::load(&args.admin_token_file)?;
    if args.restart {
        return crate::restart::restart_cli(
            args.admin,
            &token,
            ms(&args.ready_timeout)?,
            args.json,
        );
    }
    let body = serde_json::json!({
        "pause_ms": ms(&args.pause)?,
        "drain_timeout_ms": ms(&args.drain_timeout)?,
        "ready_timeout_ms": ms(&args.ready_timeout)?,
    });
    // the answer comes when the last agent is back: bounded by the phases' own deadlines
    let (status, answer) = http(
        args.admin,
        &token,
        "POST",
        "/rollout",
        &body.to_string(),
        Duration::from_secs(3600),
    )?;
    let report: RolloutReport = match serde_json::from_str(&answer) {
        Ok(r) => r,
        Err(_) => bail!(
            "baton up at {} answered {status}: {}",
            args.admin,
            answer.trim()
        ),
    };
    if args.json {
        println!("{answer}");
    } else {
        print!("{}", table(&report));
    }
    if !report.ok {
        bail!(
            "rollout stopped: {}",
            report.error.as_deref().unwrap_or("see above")
        );
    }
    Ok(())
}

/// The summary a person reads.
pub fn table(r: &RolloutReport) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}  exit",
        "agent", "old pid", "new pid", "drain ms", "start ms", "links ms", "restart ms"
    );
    for a in &r.agents {
        let _ = writeln!(
            o,
            "{:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}  {}{}",
            a.id,
            a.old_pid,
            a.new_pid.map_or("-".into(), |p| p.to_string()),
            a.drain_ms,
            a.start_ms,
            a.links_ms,
            a.restart_ms,
            a.exit,
            if a.killed {
                " (killed at the drain deadline)"
            } else {
                ""
            }
        );
        if let Some(e) = &a.error {
            let _ = writeln!(o, "      error: {e}");
        }
    }
    let _ = writeln!(
        o,
        "{} in {:.1} s",
        if r.ok {
            format!("{} agents restarted", r.agents.len())
        } else {
            "rollout stopped".into()
        },
        r.total_ms as f64 / 1000.0
    );
    o
}

/// The `--link-connections` a dispatcher command line asks for (2 by default).
pub fn links_per_dispatcher(dispatch_args: &[String]) -> usize {
    dispatch_args
        .windows(2)
        .find(|w| w[0] == "--link-connections")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(2usize)
        .clamp(1, 64)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn ports_announced_replace_port_zero() {
        let child = Command::new("true").spawn().unwrap();
        let mut p = Proc {
            child,
            addrs: HashMap::from([
                ("tls".into(), "127.0.0.1:4001".parse().unwrap()),
                ("metrics".into(), "127.0.0.1:4002".parse().unwrap()),
                ("link".into(), "127.0.0.1:4003".parse().unwrap()),
            ]),
        };
        let argv: Vec<String> = [
            "/bin/baton",
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--agent-id",
            "2",
            "--link-listen",
            "127.0.0.1:0",
            "--peer-listen",
            "127.0.0.1:7001",
        ]
        .map(String::from)
        .to_vec();
        let pinned = pin_ports(argv, &p);
        assert_eq!(
            pinned,
            [
                "/bin/baton",
                "agent",
                "--listen",
                "127.0.0.1:4001",
                "--metrics",
                "127.0.0.1:4002",
                "--agent-id",
                "2",
                "--link-listen",
                "127.0.0.1:4003",
                "--peer-listen",
                "127.0.0.1:7001"
            ]
        );
        let _ = p.child.wait();
    }

    #[test]
    fn request_bodies_are_checked() {
        let o = RolloutRequest::default().options().unwrap();
        assert_eq!(o.drain_deadline, Duration::from_secs(35));
        let o: RolloutRequest = serde_json::from_str(r#"{"pause_ms": 1500}"#).unwrap();
        assert_eq!(o.options().unwrap().pause, Duration::from_millis(1500));
        assert!(serde_json::from_str::<RolloutRequest>(r#"{"pause": 1}"#).is_err());
        let too_long = RolloutRequest {
            drain_timeout_ms: Some(MAX_DEADLINE_MS + 1),
            ..Default::default()
        };
        assert!(too_long.options().is_err());
        let zero = RolloutRequest {
            ready_timeout_ms: Some(0),
            ..Default::default()
        };
        assert!(zero.options().is_err());
        assert_eq!(
            links_per_dispatcher(&["--link-connections".into(), "3".into()]),
            3
        );
        assert_eq!(links_per_dispatcher(&[]), 2);
    }
}
