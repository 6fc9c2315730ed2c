//! `baton up` as a child process, read through the state file it writes.

use std::net::SocketAddr;
use std::process::{Child, Command};

use super::{metrics_page, series_sum, spawn_ready_with, TempDir, BATON};

/// `baton up` with a state file; SIGTERM on drop stops it and its children.
pub struct Up {
    child: Child,
    pub state: serde_json::Value,
    _dir: TempDir,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

impl Up {
    pub fn start(args: &[&str]) -> Up {
        Self::start_with(BATON, args)
    }

    /// Two agents under `handoff`, sharing sessions (`--store peers`), plus `extra`; the
    /// dispatcher sends a full handshake home only when the home has done no more than the
    /// other agent (`--handoff-window 0`), so that a few sequential connections alternate and
    /// some move.
    pub fn handoff(extra: &[&str]) -> Up {
        let mut args = vec!["--agents", "2", "--policy", "handoff", "--store", "peers"];
        args.push("--dispatcher-arg=--handoff-window=0");
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// `baton up` whose dispatcher listens on `listen` (a port known beforehand).
    pub fn start_on(listen: SocketAddr, args: &[&str]) -> Up {
        Self::start_at(BATON, &listen.to_string(), args)
    }

    /// `baton up` from binary `bin` (its agents and dispatcher are the same binary).
    pub fn start_with(bin: &str, args: &[&str]) -> Up {
        Self::start_at(bin, "127.0.0.1:0", args)
    }

    fn start_at(bin: &str, listen: &str, args: &[&str]) -> Up {
        let dir = TempDir::new("up");
        let state = dir.path("state.json");
        let (child, _) = spawn_ready_with(
            bin,
            "up",
            &[
                "--listen",
                listen,
                "--state",
                state.to_str().unwrap(),
                "--dir",
                &dir.arg("cluster"),
            ],
            args,
        );
        let state = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        Up {
            child,
            state,
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.state["dispatcher"].as_str().unwrap().parse().unwrap()
    }

    pub fn ca(&self) -> &str {
        self.state["ca"].as_str().unwrap()
    }

    pub fn agent_pid(&self, i: usize) -> u64 {
        self.state["agents"][i]["pid"].as_u64().unwrap()
    }

    /// A rustls client config trusting the cluster's CA.
    pub fn client(&self, v: &'static rustls::SupportedProtocolVersion) -> rustls::ClientConfig {
        let roots = baton_lab::soak::load::roots(self.ca().as_ref()).unwrap();
        rustls::ClientConfig::builder_with_protocol_versions(&[v])
            .with_root_certificates(roots)
            .with_no_client_auth()
    }

    /// Sum of agent `i`'s metric lines starting with `prefix` and containing `filter`.
    pub fn agent_sum(&self, i: usize, prefix: &str, filter: &str) -> f64 {
        let metrics = self.state["agents"][i]["metrics"].as_str().unwrap();
        series_sum(&metrics_page(metrics.parse().unwrap()), prefix, filter)
    }

    /// Sum over the agents of the metric lines starting with `prefix` and containing `filter`.
    pub fn agents_sum(&self, prefix: &str, filter: &str) -> f64 {
        (0..self.state["agents"].as_array().unwrap().len())
            .map(|i| self.agent_sum(i, prefix, filter))
            .sum()
    }
}
