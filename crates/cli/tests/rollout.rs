//! `baton up --admin` and `baton rollout`: the agents restarted one at a time under keep-alive
//! load (issue 18). Real processes on 127.0.0.1: the cluster, `baton bench` with think time,
//! `baton rollout`, curl.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// `baton up` with `--admin`, SIGTERM on drop (it stops its children).
struct Cluster {
    child: Child,
    addrs: HashMap<String, SocketAddr>,
    dir: TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let until = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cluster {
    fn start(args: &[&str]) -> Cluster {
        let dir = TempDir::new("rollout");
        let (child, addrs) = spawn_ready(
            "up",
            &[
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--state",
                &dir.arg("state.json"),
                "--dir",
                &dir.arg("cluster"),
            ],
            args,
        );
        Cluster { child, addrs, dir }
    }

    fn admin(&self) -> SocketAddr {
        self.addrs["admin"]
    }

    fn url(&self) -> String {
        format!("https://localhost:{}/", self.addrs["dispatch"].port())
    }

    fn ca(&self) -> String {
        self.dir.arg("cluster/ca.pem")
    }

    fn status(&self) -> Value {
        let (code, body) =
            baton_lab::rollout::http(self.admin(), "GET", "/status", "", Duration::from_secs(5))
                .unwrap();
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    fn agent_pids(&self) -> Vec<u64> {
        self.status()["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["pid"].as_u64().unwrap())
            .collect()
    }

    /// curl through the dispatcher (the certificate names localhost).
    fn curl(&self) -> std::process::Output {
        let port = self.addrs["dispatch"].port();
        curl(&[
            "--cacert",
            &self.ca(),
            "--resolve",
            &format!("localhost:{port}:127.0.0.1"),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &self.url(),
        ])
    }
}

#[test]
fn rollout_replaces_every_agent_under_keepalive_load_and_the_cluster_serves_after() {
    let c = Cluster::start(&["--agents", "3", "--policy", "handoff"]);
    let before = c.agent_pids();
    assert_eq!(before.len(), 3);
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );

    // keep-alive clients: 6 requests per connection, 250 ms apart, TLS 1.2 and 1.3 offered;
    // an open-loop schedule of 15 connections a second for 12 s (enough clients to keep it)
    let json = c.dir.arg("bench.json");
    let port = c.addrs["dispatch"].port();
    let bench = Command::new(BATON)
        .args([
            "bench",
            &format!("https://127.0.0.1:{port}/"),
            "--sni",
            "localhost",
            "--ca",
            &c.ca(),
            "-d",
            "12s",
            "--rate",
            "15",
            "-c",
            "40",
            "--requests-per-conn",
            "6",
            "--think-time",
            "250ms",
            "--json",
            &json,
            "--quiet",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    // the agents one at a time, a second apart, while the clients hold their connections
    let rollout = Command::new(BATON)
        .args([
            "rollout",
            "--admin",
            &c.admin().to_string(),
            "--pause",
            "1s",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(rollout.status.success(), "{}", text_of(&rollout));
    let report: Value = serde_json::from_slice(&rollout.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text_of(&rollout)));
    assert_eq!(report["ok"], true, "{report}");
    let restarted = report["agents"].as_array().unwrap();
    assert_eq!(restarted.len(), 3, "{report}");
    for (i, a) in restarted.iter().enumerate() {
        assert_eq!(a["id"].as_u64(), Some(i as u64), "{report}");
        assert_eq!(a["old_pid"].as_u64(), Some(before[i]), "{report}");
        assert_ne!(a["new_pid"].as_u64(), Some(before[i]), "{report}");
        eprintln!(
            "agent {i}: drain {} ms ({}), back after {} ms, killed {}",
            a["drain_ms"], a["exit"], a["restart_ms"], a["killed"]
        );
    }
    // every agent is a new process; the old ones are gone
    let after = c.agent_pids();
    for (i, (old, new)) in before.iter().zip(&after).enumerate() {
        assert_ne!(old, new, "agent {i} was not replaced");
        assert!(
            !baton_lab::rollout::alive(*old as u32),
            "agent {i}'s old process {old} still runs"
        );
        assert!(baton_lab::rollout::alive(*new as u32), "agent {i}: {new}");
    }
    let status = c.status();
    assert_eq!(status["rollout"]["running"], false, "{status}");
    assert_eq!(status["rollout"]["last"]["ok"], true, "{status}");

    let done = bench.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap_or_default())
        .unwrap_or_else(|e| panic!("bench JSON: {e}: {}", text_of(&done)));
    assert!(n(&v, "requests.ok") > 0, "{v}");
    // what a restart may not cost: a request
    assert_eq!(n(&v, "requests.failed"), 0, "{v}");
    // what it should not cost either (the goal is 0; reported until the drain move is proven
    // under load): connections closed under the clients, requests they could not send,
    // resumptions refused
    eprintln!(
        "under the rollout: {} connections, requests ok {} failed {} unsent {}, errors {}, handshakes full {} resumed {} resume_refused {}",
        n(&v, "connections"),
        n(&v, "requests.ok"),
        n(&v, "requests.failed"),
        n(&v, "requests.unsent"),
        v["errors"],
        n(&v, "handshakes.full"),
        n(&v, "handshakes.resumed"),
        n(&v, "handshakes.resume_refused"),
    );

    // and after it, the cluster serves
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );
}

#[test]
fn rollout_admin_refuses_what_it_cannot_do() {
    let c = Cluster::start(&["--agents", "1"]);
    let admin = c.admin();
    let ask = |method: &str, path: &str, body: &str| {
        baton_lab::rollout::http(admin, method, path, body, Duration::from_secs(30)).unwrap()
    };
    assert_eq!(ask("POST", "/rollout", "{\"pause\": 1}").0, 400);
    assert_eq!(ask("POST", "/rollout", "{\"drain_timeout_ms\": 0}").0, 400);
    assert_eq!(ask("POST", "/rollout", &"x".repeat(10_000)).0, 413);
    assert_eq!(ask("GET", "/nothing", "").0, 404);
    // an admin endpoint on another address than loopback is refused at start
    let out = Command::new(BATON)
        .args(["up", "--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text_of(&out).contains("loopback"), "{}", text_of(&out));
    // nobody at the address: `baton rollout` says so and fails
    let out = Command::new(BATON)
        .args(["rollout", "--admin", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // one agent, empty body: restarted
    let (code, body) = ask("POST", "/rollout", "");
    assert_eq!(code, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["agents"][0]["killed"], false, "{r}");
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );
}
