//! `baton up --admin` and `baton rollout`: the agents restarted one at a time under keep-alive
//! load, and the dispatchers hot-restarted, each replaced by a successor process (`POST
//! /restart`, `baton rollout --restart`, and their aliases `POST /handover` and `--handover`).
//! Real processes on 127.0.0.1: the cluster, `baton bench` with think time, `baton rollout`,
//! curl.

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
            .stderr(Stdio::null())
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
        Self::start_with(BATON, TempDir::new("rollout"), args)
    }

    /// `bin up ARGS`, its files in `dir`.
    fn start_with(bin: &str, dir: TempDir, args: &[&str]) -> Cluster {
        let (child, addrs) = spawn_ready_with(
            bin,
            "up",
            &[
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--admin-token-file",
                admin_token_file(),
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

    fn ca(&self) -> String {
        self.dir.arg("cluster/ca.pem")
    }

    fn status(&self) -> Value {
        let (code, body) = baton_cluster::client::http(
            self.admin(),
            &admin_token(),
            "GET",
            "/status",
            "",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    fn agent_pids(&self) -> Vec<u64> {
        pids(&self.status(), "agents")
    }

    fn dispatcher_pids(&self) -> Vec<u32> {
        pids(&self.status(), "dispatchers")
            .into_iter()
            .map(|p| p as u32)
            .collect()
    }

    /// `baton rollout FLAG --json` (`--restart`, or its alias `--handover`): the answer, once
    /// it succeeded.
    fn restart(&self, flag: &str) -> Value {
        let out = Command::new(BATON)
            .args([
                "rollout",
                "--admin",
                &self.admin().to_string(),
                "--admin-token-file",
                admin_token_file(),
                flag,
                "--json",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text_of(&out));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text_of(&out)))
    }

    /// curl through the dispatcher (the certificate names localhost).
    fn curl(&self) -> std::process::Output {
        self.curl_at(self.addrs["dispatch"].port())
    }

    fn curl_at(&self, port: u16) -> std::process::Output {
        let url = format!("https://localhost:{port}/");
        curl(&[
            "--cacert",
            &self.ca(),
            "--resolve",
            &format!("localhost:{port}:127.0.0.1"),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ])
    }
}

/// The `pid` of each entry of `status[list]`.
fn pids(status: &Value, list: &str) -> Vec<u64> {
    status[list]
        .as_array()
        .unwrap_or_else(|| panic!("{status}"))
        .iter()
        .map(|a| a["pid"].as_u64().unwrap())
        .collect()
}

fn alive(pid: u32) -> bool {
    baton_cluster::procs::alive(pid)
}

fn signal(pid: u32, sig: &str) {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
}

/// `baton bench` with keep-alive clients through `c`'s dispatcher for `secs`: 6 requests per
/// connection, 250 ms apart, TLS 1.2 and 1.3 offered, an open-loop schedule of 15 connections
/// a second (enough clients to keep it); its JSON report goes to `json`.
fn keepalive_load(c: &Cluster, secs: u64, json: &str) -> std::process::Child {
    let port = c.addrs["dispatch"].port();
    Command::new(BATON)
        .args([
            "bench",
            &format!("https://127.0.0.1:{port}/"),
            "--sni",
            "localhost",
            "--ca",
            &c.ca(),
            "-d",
            &format!("{secs}s"),
            "--rate",
            "15",
            "-c",
            "40",
            "--requests-per-conn",
            "6",
            "--think-time",
            "250ms",
            "--json",
            json,
            "--quiet",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a restart under the keep-alive load of [`keepalive_load`] (its bench report `v`) may
/// not cost: a request, a connection closed under a client (and the requests it could not
/// send on it), an error of any kind, or a resumption refused (an extra full handshake).
fn nothing_lost(under: &str, v: &Value) {
    assert!(n(v, "requests.ok") > 0, "under {under}: {v}");
    assert_eq!(n(v, "requests.failed"), 0, "failed under {under}: {v}");
    assert_eq!(n(v, "requests.unsent"), 0, "unsent under {under}: {v}");
    let errors = v["errors"].as_object().unwrap_or_else(|| panic!("{v}"));
    assert!(
        errors.is_empty(),
        "errors under {under} (closed: connections cut): {v}"
    );
    assert_eq!(
        n(v, "handshakes.resume_refused"),
        0,
        "resumptions refused under {under} (extra full handshakes): {v}"
    );
    assert_eq!(n(v, "handshakes.failed"), 0, "under {under}: {v}");
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

    // keep-alive clients for 12 s
    let json = c.dir.arg("bench.json");
    let bench = keepalive_load(&c, 12, &json);
    std::thread::sleep(Duration::from_secs(3));
    // the agents one at a time, a second apart, while the clients hold their connections
    let rollout = Command::new(BATON)
        .args([
            "rollout",
            "--admin",
            &c.admin().to_string(),
            "--admin-token-file",
            admin_token_file(),
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
        // each drained and exited by itself, none SIGKILLed at the drain deadline
        assert_eq!(a["killed"], false, "{report}");
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
            !baton_cluster::procs::alive(*old as u32),
            "agent {i}'s old process {old} still runs"
        );
        assert!(baton_cluster::procs::alive(*new as u32), "agent {i}: {new}");
    }
    let status = c.status();
    assert_eq!(status["rollout"]["running"], false, "{status}");
    assert_eq!(status["rollout"]["last"]["ok"], true, "{status}");

    let done = bench.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap_or_default())
        .unwrap_or_else(|e| panic!("bench JSON: {e}: {}", text_of(&done)));
    nothing_lost("the rollout", &v);

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
        baton_cluster::client::http(
            admin,
            &admin_token(),
            method,
            path,
            body,
            Duration::from_secs(30),
        )
        .unwrap()
    };
    assert_eq!(ask("POST", "/rollout", "{\"pause\": 1}").0, 400);
    assert_eq!(ask("POST", "/rollout", "{\"drain_timeout_ms\": 0}").0, 400);
    assert_eq!(ask("POST", "/rollout", &"x".repeat(10_000)).0, 413);
    for path in ["/restart", "/handover"] {
        assert_eq!(ask("POST", path, "{\"timeout_ms\": 0}").0, 400, "{path}");
        assert_eq!(ask("POST", path, "{\"pause_ms\": 1}").0, 400, "{path}");
    }
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
        .args([
            "rollout",
            "--admin",
            &format!("127.0.0.1:{}", free_port()),
            "--admin-token-file",
            admin_token_file(),
        ])
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

#[test]
fn a_hot_restart_replaces_the_dispatcher_under_keepalive_load_and_a_rollout_works_after() {
    let c = Cluster::start(&["--agents", "2", "--policy", "handoff"]);
    let first = c.dispatcher_pids()[0];
    let json = c.dir.arg("bench.json");
    let bench = keepalive_load(&c, 8, &json);
    std::thread::sleep(Duration::from_secs(2));

    // the dispatcher hands its listeners and live connections to a successor
    let report = c.restart("--restart");
    eprintln!("hot restart: {report}");
    assert_eq!(report["ok"], true, "{report}");
    let d = &report["dispatchers"][0];
    assert_eq!(
        report["dispatchers"].as_array().unwrap().len(),
        1,
        "{report}"
    );
    assert_eq!(d["old_pid"].as_u64(), Some(first as u64), "{report}");
    let second = d["new_pid"].as_u64().expect("a successor") as u32;
    assert_ne!(second, first);
    assert!(!alive(first), "the old dispatcher {first} still runs");
    assert!(alive(second));
    assert_eq!(
        c.dispatcher_pids(),
        [second],
        "GET /status follows the successor"
    );
    assert_eq!(d["lost"].as_u64(), Some(0), "{report}");
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );

    // and the successor is replaced in turn (its successor is found under this `baton up`)
    std::thread::sleep(Duration::from_secs(1));
    let (code, body) = baton_cluster::client::http(
        c.admin(),
        &admin_token(),
        "POST",
        "/restart",
        "",
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let again: Value = serde_json::from_str(&body).unwrap();
    let third = again["dispatchers"][0]["new_pid"].as_u64().unwrap() as u32;
    assert_eq!(
        again["dispatchers"][0]["old_pid"].as_u64(),
        Some(second as u64)
    );
    assert!(!alive(second) && alive(third), "{again}");
    let status = c.status();
    assert_eq!(status["restart"]["last"]["ok"], true, "{status}");
    assert_eq!(status["restart"]["running"], false, "{status}");
    // and under its alias
    assert_eq!(status["handover"], status["restart"], "{status}");

    let done = bench.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap_or_default())
        .unwrap_or_else(|e| panic!("bench JSON: {e}: {}", text_of(&done)));
    nothing_lost("two hot restarts", &v);

    // the agents restart as before: the successor answers the rollout on the admin socket it
    // inherited, and its links come up to each new agent (after the load: a rollout under
    // load is the first test's)
    let rollout = Command::new(BATON)
        .args([
            "rollout",
            "--admin",
            &c.admin().to_string(),
            "--admin-token-file",
            admin_token_file(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(rollout.status.success(), "{}", text_of(&rollout));
    let r: Value = serde_json::from_slice(&rollout.stdout).unwrap();
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["agents"].as_array().unwrap().len(), 2, "{r}");
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );

    // stopping `baton up` stops the successor it never started
    drop(c);
    let until = Instant::now() + Duration::from_secs(5);
    while alive(third) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(third), "the dispatcher {third} outlived baton up");
}

#[test]
fn restarted_dispatchers_are_followed_and_one_that_dies_stops_the_cluster() {
    // two dispatchers with the same command line (ports 0): each successor is told apart
    let mut c = Cluster::start(&["--agents", "1", "--dispatchers", "2"]);
    let admin = c.admin();
    let ask = |method: &str, path: &str| {
        baton_cluster::client::http(
            admin,
            &admin_token(),
            method,
            path,
            "",
            Duration::from_secs(120),
        )
        .unwrap()
    };
    let first = c.dispatcher_pids();
    assert_eq!(first.len(), 2);

    // one operation at a time: no hot restart while a rollout runs
    let rollout = std::thread::spawn(move || {
        baton_cluster::client::http(
            admin,
            &admin_token(),
            "POST",
            "/rollout",
            "",
            Duration::from_secs(120),
        )
        .unwrap()
    });
    let until = Instant::now() + Duration::from_secs(10);
    while c.status()["rollout"]["running"] != true {
        assert!(Instant::now() < until, "the rollout did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (code, body) = ask("POST", "/restart");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("rollout"), "{body}");
    let (code, body) = rollout.join().unwrap();
    assert_eq!(code, 200, "{body}");

    // both, one after the other (asked by the alias)
    let (code, body) = ask("POST", "/handover");
    assert_eq!(code, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    let second: Vec<u32> = r["dispatchers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["new_pid"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(second.len(), 2, "{r}");
    for (i, pid) in second.iter().enumerate() {
        assert!(!first.contains(pid), "{r}");
        assert!(alive(*pid), "{r}");
        assert!(!alive(first[i]), "{r}");
    }
    assert_ne!(second[0], second[1], "{r}");
    assert_eq!(c.dispatcher_pids(), second);

    // SIGUSR2 from elsewhere: `baton up` notices the exit and follows the successor
    signal(second[1], "-USR2");
    let until = Instant::now() + Duration::from_secs(20);
    let third = loop {
        let now = c.dispatcher_pids();
        if now[1] != second[1] && alive(now[1]) {
            break now[1];
        }
        assert!(
            Instant::now() < until,
            "baton up did not follow dispatcher 1: {now:?}"
        );
        assert!(matches!(c.child.try_wait(), Ok(None)), "baton up stopped");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(c.dispatcher_pids()[0], second[0]);
    for d in c.status()["dispatchers"].as_array().unwrap() {
        let port = d["addrs"]["dispatch"].as_str().unwrap();
        let port: u16 = port.rsplit(':').next().unwrap().parse().unwrap();
        let out = c.curl_at(port);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "200",
            "{}",
            text_of(&out)
        );
    }

    // a dispatcher that dies without a successor still stops the cluster, successors too
    let agent = c.agent_pids()[0] as u32;
    signal(second[0], "-KILL");
    let until = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = c.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "baton up runs on without dispatcher 0"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{status}");
    assert!(
        !alive(third),
        "dispatcher 1's successor {third} outlived baton up"
    );
    assert!(!alive(agent), "the agent {agent} outlived baton up");
}

#[test]
fn a_hot_restart_whose_successor_fails_leaves_the_dispatcher_serving() {
    // `baton up` from a copy of the binary, which the test replaces as an upgrade would
    let dir = TempDir::new("rollout-broken");
    let bin = dir.arg("baton");
    std::fs::copy(BATON, &bin).unwrap();
    let c = Cluster::start_with(&bin, dir, &["--agents", "1"]);
    let first = c.dispatcher_pids()[0];
    let ask = || {
        baton_cluster::client::http(
            c.admin(),
            &admin_token(),
            "POST",
            "/restart",
            "",
            Duration::from_secs(60),
        )
        .unwrap()
    };
    // a successor that cannot start: the old process says so and serves on (the running
    // file stays where it is, replaced as an upgrade replaces it: a new file renamed over it)
    let good = c.dir.arg("baton.good");
    std::fs::copy(BATON, &good).unwrap();
    std::fs::write(c.dir.arg("broken"), "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(
        c.dir.arg("broken"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::rename(c.dir.arg("broken"), &bin).unwrap();
    let began = Instant::now();
    let (code, body) = ask();
    assert_eq!(code, 500, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["ok"], false, "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("handover failed; serving on"), "{r}");
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
    assert!(alive(first));
    assert_eq!(c.dispatcher_pids(), [first]);
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );
    // the binary back: the same dispatcher is replaced, asked by `baton rollout --handover`
    // (the alias of --restart)
    std::fs::rename(&good, &bin).unwrap();
    let report = c.restart("--handover");
    assert_eq!(report["ok"], true, "{report}");
    assert!(!alive(first));
    let out = c.curl();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        text_of(&out)
    );
}
