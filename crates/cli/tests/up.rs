//! `baton up` clusters under load from many virtual clients with the SSL benchmark tool paper's 1 full : 2 resumed
//! mix (the CSSL paper's Scenario B): with sessions shared, a round-robin dispatcher needs only the
//! clients' own full handshakes; with per-agent memory it loses most resumptions; session
//! affinity recovers them without sharing. Also behind a real HAProxy in TCP round-robin mode.

mod common;

use std::time::Duration;

use common::*;
use rustls::version::{TLS12, TLS13};

/// 25 clients x 120 connections, 1 full : 2 resumed: the ideal is 1,000 full handshakes for
/// 3,000 connections (per client 40 full, 80 resumed).
const CLIENTS: usize = 25;
const PER_CLIENT: usize = 120;

/// Full handshakes the agents counted, all versions.
fn server_full(up: &Up) -> u64 {
    up.agents_sum("baton_handshakes_total{", "kind=\"full\"") as u64
}

fn scenario_b(up: &Up, v: &'static rustls::SupportedProtocolVersion) -> (Mix, u64) {
    let before = server_full(up);
    let mix = virtual_clients(up.addr(), &up.client(v), CLIENTS, PER_CLIENT, 3);
    (mix, server_full(up) - before)
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn round_robin_with_peers_needs_only_the_clients_full_handshakes() {
    let up = Up::start(&[
        "--agents",
        "3",
        "--policy",
        "round-robin",
        "--store",
        "peers",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    for v in [&TLS12, &TLS13] {
        let (mix, server_full) = scenario_b(&up, v);
        assert_eq!(
            mix,
            Mix {
                full: 1000,
                resumed: 2000,
                failed: 0
            },
            "{v:?}"
        );
        assert_eq!(server_full, 1000, "{v:?}");
    }
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn round_robin_with_memory_loses_resumptions_and_session_affinity_recovers_them() {
    let rr = Up::start(&[
        "--agents",
        "3",
        "--policy",
        "round-robin",
        "--store",
        "memory",
    ]);
    let (mix, server_full) = scenario_b(&rr, &TLS13);
    assert_eq!(mix.failed, 0);
    assert!(
        server_full > 1500,
        "LB-RR without sharing: {server_full} full handshakes"
    );
    drop(rr);
    let affinity = Up::start(&["--agents", "3", "--policy", "session", "--store", "memory"]);
    for v in [&TLS12, &TLS13] {
        let (mix, server_full) = scenario_b(&affinity, v);
        assert_eq!((mix.full, mix.failed), (1000, 0), "{v:?}");
        assert_eq!(server_full, 1000, "{v:?}");
    }
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn redis_store_needs_only_the_clients_full_handshakes() {
    let Some(redis) = Redis::start() else { return };
    let store = format!("redis={}", redis.url());
    let up = Up::start(&[
        "--agents",
        "3",
        "--policy",
        "round-robin",
        "--store",
        &store,
    ]);
    for v in [&TLS12, &TLS13] {
        let (mix, server_full) = scenario_b(&up, v);
        assert_eq!(
            mix,
            Mix {
                full: 1000,
                resumed: 2000,
                failed: 0
            },
            "{v:?}"
        );
        assert_eq!(server_full, 1000, "{v:?}");
    }
}

fn baton_namespaces() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("baton-"))
        .map(String::from)
        .collect()
}

#[test]
fn up_hosts_puts_every_process_on_a_host_of_its_own_and_removes_them() {
    if !root_or_skip("network namespaces") {
        return;
    }
    let up = Up::start(&[
        "--hosts",
        "--agents",
        "2",
        "--dispatchers",
        "2",
        "--client-hosts",
        "1",
        "--policy",
        "handoff",
        "--store",
        "peers",
    ]);
    let hosts = up.state["hosts"].as_array().unwrap().clone();
    let names: Vec<&str> = hosts.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["agent0", "agent1", "dispatch0", "dispatch1", "client0"]
    );
    // every process listens on its own host's address, none on loopback
    let addr_of = |name: &str| -> String {
        hosts.iter().find(|h| h["name"] == name).unwrap()["addr"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (i, agent) in up.state["agents"].as_array().unwrap().iter().enumerate() {
        let tls: std::net::SocketAddr = agent["tls"].as_str().unwrap().parse().unwrap();
        assert_eq!(tls.ip().to_string(), addr_of(&format!("agent{i}")));
    }
    let dispatchers: Vec<std::net::SocketAddr> = up.state["dispatchers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(dispatchers.len(), 2);
    // curl from the client host through each dispatcher: served, from the client host's
    // address (it crossed the bridge, not loopback), and the agent that served it saw that
    // address as the client's (`GET /tls` answers with the peer the agent saw), not a
    // dispatcher's
    let netns = hosts.iter().find(|h| h["name"] == "client0").unwrap()["netns"]
        .as_str()
        .unwrap()
        .to_string();
    let client = addr_of("client0");
    for d in &dispatchers {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &netns, "curl", "-s", "-m", "10"])
            .args(["-w", "\n%{http_code} %{local_ip}"])
            .args(["--cacert", up.ca()])
            .args(["--resolve", &format!("localhost:{}:{}", d.port(), d.ip())])
            .arg(format!("https://localhost:{}/tls", d.port()))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, curl) = said.rsplit_once('\n').unwrap_or(("", &said));
        assert_eq!(curl, format!("200 {client}"), "through {d}: {said}");
        let peer: std::net::SocketAddr = body
            .lines()
            .find_map(|l| l.strip_prefix("peer: "))
            .unwrap_or_else(|| panic!("no peer in {body:?}"))
            .parse()
            .unwrap();
        assert_eq!(
            peer.ip().to_string(),
            client,
            "through {d} the agent saw {peer} as the client"
        );
    }
    let served: f64 = (0..2)
        .map(|i| up.agent_sum(i, "baton_handshakes_total", ""))
        .sum();
    assert!(served >= 2.0, "{served}");
    let ours: Vec<String> = hosts
        .iter()
        .map(|h| h["netns"].as_str().unwrap().to_string())
        .collect();
    let now = baton_namespaces();
    assert!(
        ours.iter().all(|n| now.contains(n)),
        "{ours:?} not in {now:?}"
    );
    drop(up);
    // gone with `baton up`, and so is the bridge
    let left: Vec<String> = baton_namespaces()
        .into_iter()
        .filter(|n| ours.contains(n))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn up_hosts_without_privileges_says_so() {
    if !root_or_skip("setpriv drops to another user") {
        return;
    }
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .args([
            BATON,
            "up",
            "--hosts",
            "--dir",
            "/tmp/baton-up-unprivileged",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--hosts needs the privileges"), "{err}");
}

#[test]
fn up_hosts_sweeps_what_a_killed_run_left_behind() {
    if !root_or_skip("network namespaces") {
        return;
    }
    let dir = TempDir::new("up-crashed");
    let state = dir.path("state.json");
    let (mut crashed, _) = spawn_ready(
        "up",
        &["--listen", "127.0.0.1:0", "--hosts", "--agents", "1"],
        &[
            "--state",
            state.to_str().unwrap(),
            "--dir",
            &dir.arg("cluster"),
        ],
    );
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let agent_pid = s["agents"][0]["pid"].as_u64().unwrap();
    let left: Vec<String> = s["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["netns"].as_str().unwrap().to_string())
        .collect();
    // SIGKILL: no clean-up; its agent and namespaces stay
    crashed.kill().unwrap();
    crashed.wait().unwrap();
    assert!(baton_namespaces().iter().any(|n| left.contains(n)));
    assert!(std::path::Path::new(&format!("/proc/{agent_pid}")).exists());
    // the next run removes them, and the orphaned agent with them
    let up = Up::start(&["--hosts", "--agents", "1"]);
    assert!(
        !baton_namespaces().iter().any(|n| left.contains(n)),
        "leftovers of the killed run are still there"
    );
    std::thread::sleep(Duration::from_millis(200));
    let stat = std::fs::read_to_string(format!("/proc/{agent_pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "the killed run's agent still runs: {stat}"
    );
    drop(up);
}
