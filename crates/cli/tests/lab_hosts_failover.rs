//! Issue 17's lab experiments, small: `baton lab dispatcher-failover --quick` (two dispatchers
//! behind HAProxy, one SIGKILLed under open-loop load) and `baton lab scenario-b --hosts
//! --quick` (every row in network namespaces, the dispatcher rows also on loopback). Real
//! `baton` processes, real HAProxy and nginx, namespaces the run creates and removes. The assertions are about
//! what the processes counted (requests, failures, the dispatchers' routes, the servers'
//! handshakes) and logged (HAProxy's connections), never about speed.

mod common;

use std::process::{Command, Output};

use common::{have_haproxy, require_or_skip, root_or_skip, TempDir};
use serde_json::Value;

fn lab_binary() -> std::path::PathBuf {
    std::env::var_os("BATON_LAB_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_baton").into())
}

/// `baton lab EXPERIMENT --quick ARGS --json FILE`: its pid, output and its one table's rows.
fn lab(experiment: &str, args: &[&str], dir: &TempDir) -> (u32, Output, Vec<Value>) {
    let json = dir.path("lab.json");
    let child = Command::new(lab_binary())
        .args(["lab", experiment, "--quick"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--dir")
        .arg(dir.path("work"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running baton lab");
    let pid = child.id();
    let out = child.wait_with_output().expect("waiting for baton lab");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let rows = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v["experiments"][0]["rows"].as_array().cloned())
        .unwrap_or_default();
    (pid, out, rows)
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn one_of_two_dispatchers_dies_under_load_and_nothing_started_after_fails() {
    if !have_haproxy() {
        return;
    }
    let dir = TempDir::new("lab-dispatcher-failover");
    let (_, out, rows) = lab("dispatcher-failover", &[], &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "baton lab failed: {stderr}");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let (before, at, after) = (&rows[0], &rows[1], &rows[2]);
    assert!(before["phase"].as_str().unwrap().starts_with("before"));
    assert!(at["phase"].as_str().unwrap().starts_with("in flight"));
    assert!(after["phase"].as_str().unwrap().starts_with("after"));
    // the load ran on both sides of the kill (100/s for 10 s each, open loop)
    assert!(n(&before["requests"]) >= 500, "{before}");
    assert!(n(&after["requests"]) >= 500, "{after}");
    // nothing failed but what was on the killed dispatcher when it died
    assert_eq!(n(&before["failed"]), 0, "{before}");
    assert_eq!(n(&after["failed"]), 0, "{after}");
    // ... which HAProxy's connection log tells: it names each connection by the client's
    // address and port, and the dispatcher it went to (s0 the survivor, s1 the killed one)
    let log = std::fs::read_to_string(dir.path("work/dispatcher-failover/haproxy/haproxy.log"))
        .expect("HAProxy's connection log");
    for server in ["be/s0", "be/s1"] {
        assert!(log.contains(&format!(" {server} ")), "no {server}: {log}");
    }
    let from: Vec<&str> = at["failed_from"]
        .as_array()
        .unwrap_or_else(|| panic!("{at}"))
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(from.len() as u64, n(&at["failed"]), "{at}");
    for client in from {
        let servers: Vec<&str> = log
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some(client)).then(|| words.find(|w| w.starts_with("be/")))?
            })
            .collect();
        // (a port may have served another client earlier: one of its connections is the one)
        assert!(
            servers.contains(&"be/s1"),
            "{client} failed at the kill, but HAProxy sent it to {servers:?}, not the killed dispatcher: {at}"
        );
    }
    // sessions resume through either dispatcher, and through the survivor alone
    for r in [before, after] {
        assert!(r["resumed_percent"].as_f64().unwrap() > 90.0, "{r}");
        // homes: every agent's share of the home routes is rendezvous hashing's, before the
        // kill (both dispatchers) and after (the survivor alone); none fell back
        let dev = r["home_deviation_points"].as_f64().unwrap();
        assert!(dev <= 6.0, "homes off by {dev} points: {r}");
        assert_eq!(n(&r["fallback_routes"]), 0, "{r}");
        let routed: u64 = r["home_routes"].as_array().unwrap().iter().map(n).sum();
        assert!(routed > 0, "{r}");
    }
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn scenario_b_across_hosts_runs_every_row_on_veth_and_leaves_no_namespace() {
    if !root_or_skip("network namespaces") || !have_haproxy() {
        return;
    }
    if !std::path::Path::new("/usr/sbin/nginx").exists() {
        return require_or_skip("nginx", "the scenario's baseline servers");
    }
    let dir = TempDir::new("lab-scenario-b-hosts");
    let (pid, out, rows) = lab("scenario-b", &["--hosts"], &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "baton lab failed: {stderr}");
    // every configuration across hosts, and the two through `baton dispatch` also on
    // loopback just before their veth row
    let nets: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["config"].as_str().unwrap(),
                r["server"].as_str().unwrap(),
                r["net"].as_str().unwrap(),
            )
        })
        .collect();
    let on = |config: &str, server: &str, net: &str| nets.contains(&(config, server, net));
    for (config, server) in [
        ("LB-RR", "nginx"),
        ("LB-RR", "baton"),
        ("TLS proxy (RR)", "nginx"),
        ("TLS proxy (RR)", "baton"),
        ("1 server", "nginx"),
        ("1 server", "baton"),
    ] {
        assert!(
            on(config, server, "veth"),
            "{config} ({server}) not across hosts: {nets:?}"
        );
    }
    for config in ["CSSL-SL disabled (memory)", "CSSL-SL enabled (peers)"] {
        assert!(
            on(config, "baton", "veth") && on(config, "baton", "loopback"),
            "{nets:?}"
        );
    }
    assert_eq!(rows.len(), 10, "{nets:?}");
    for r in &rows {
        assert_eq!(n(&r["failed"]), 0, "{r}");
        // every connection was counted by the TLS servers themselves
        assert!(n(&r["server_requests"]) >= 600, "{r}");
        if r["config"].as_str().unwrap().starts_with("CSSL") {
            assert!(
                r["dispatcher_cpu_us_per_conn"].as_f64().unwrap() > 0.0,
                "{r}"
            );
        }
    }
    // HAProxy across hosts: in the path (it logged the connections) and round robin
    let lb = rows
        .iter()
        .find(|r| r["config"] == "LB-RR" && r["server"] == "baton")
        .unwrap();
    let per: Vec<u64> = lb["balancer_per_server"]
        .as_array()
        .unwrap()
        .iter()
        .map(n)
        .collect();
    assert_eq!(per.iter().sum::<u64>(), 600, "{lb}");
    // shared sessions: only each client's first connection of three is a full handshake,
    // across hosts as on loopback (the agents' own counts)
    for r in rows
        .iter()
        .filter(|r| r["config"] == "CSSL-SL enabled (peers)")
    {
        assert_eq!(n(&r["full_handshakes"]), 200, "{r}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("across hosts"), "{stdout}");
    // removed on exit: no namespace and no bridge of that run (its pid is in their names)
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(
        !netns.contains(&format!("baton-{pid}-")),
        "left behind:\n{netns}"
    );
    let bridges = Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .output()
        .unwrap();
    let bridges = String::from_utf8_lossy(&bridges.stdout);
    assert!(
        !bridges.contains(&format!(" bt{pid}:")),
        "left behind:\n{bridges}"
    );
}

#[test]
fn across_hosts_without_privileges_says_so_and_stops() {
    if !root_or_skip("setpriv drops to another user") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("baton-lab-unprivileged-{}", std::process::id()));
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(lab_binary())
        .args(["lab", "scenario-b", "--hosts", "--quick", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--hosts needs the privileges"), "{err}");
}
