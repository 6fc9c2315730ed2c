//! `baton lab` quick runs of the CSSL paper's scenarios, end to end: real `baton` agents and
//! dispatchers, real nginx and HAProxy baselines, each server in its own CPU cap. The
//! assertions are about counts the servers kept themselves (handshakes per server, connections
//! per HAProxy backend, processes seen in each cap), never about speed.

mod common;

use std::path::Path;
use std::process::Command;

use common::TempDir;
use serde_json::Value;

/// Runs `baton lab EXPERIMENT --quick --json FILE` and returns the experiment's rows.
fn lab(experiment: &str, dir: &TempDir) -> Vec<Value> {
    if !Path::new("/usr/sbin/nginx").exists() || !Path::new("/usr/sbin/haproxy").exists() {
        assert!(
            std::env::var_os("BATON_REQUIRE_SERVERS").is_none(),
            "nginx and haproxy are required"
        );
        eprintln!("nginx or haproxy not installed: skipping");
        return Vec::new();
    }
    let json = dir.path("lab.json");
    let html = dir.path("lab.html");
    let out = Command::new(lab_binary())
        .args(["lab", experiment, "--quick", "--json"])
        .arg(&json)
        .arg("--report")
        .arg(&html)
        .arg("--dir")
        .arg(dir.path("work"))
        .output()
        .expect("running baton lab");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "baton lab {experiment} failed:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");
    // the report is one self-contained page: tables and inline SVG, nothing fetched
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!("<h2>{experiment}</h2>")), "{page}");
    assert!(page.contains("<svg") && page.contains("<table>"), "{page}");
    for external in ["<script", "<link", "src=", "@import", "url("] {
        assert!(
            !page.contains(external),
            "report refers to something outside: {external}"
        );
    }
    // ours beside the paper's figure in one chart, a colour per system and a legend
    assert!(
        page.contains(">this machine</text>") && page.contains(">paper</text>"),
        "no grouped chart with the paper beside ours: {page}"
    );
    if let Some(chromium) = common::chromium() {
        let png = dir.path("lab.png");
        common::screenshot(chromium, &html, &png, 900, 1600);
        let (_, _, colours) = common::png_colours(&png);
        assert!(colours > 20, "{colours} distinct colours: blank?");
    }
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let exp = &v["experiments"][0];
    assert_eq!(exp["experiment"], experiment);
    exp["rows"].as_array().unwrap().clone()
}

/// The optimised build when `BATON_LAB_BIN` names it (`scripts/test` builds it), else this
/// test build. How evenly load-based routing spreads handshakes depends on how fast the agents
/// and dispatcher turn them around, so the spread is asserted only for the optimised build.
fn lab_binary() -> std::path::PathBuf {
    std::env::var_os("BATON_LAB_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_baton").into())
}

fn optimised() -> bool {
    std::env::var_os("BATON_LAB_BIN").is_some()
}

fn find<'a>(rows: &'a [Value], config: &str, server: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["config"] == config && r["server"] == server)
        .unwrap_or_else(|| panic!("no row {config} / {server} in {rows:#?}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn per_server(r: &Value) -> Vec<u64> {
    r["per_server_handshakes"]
        .as_array()
        .unwrap()
        .iter()
        .map(u)
        .collect()
}

fn has_process(r: &Value, name: &str) -> bool {
    r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_str().unwrap().starts_with(&format!("{name}:")))
}

/// The baselines really ran: nginx processes in the nginx servers' caps, HAProxy in the path
/// with every connection logged and counted per backend, and the servers' own counts adding up
/// to what the client sent.
fn check_baselines(rows: &[Value], connections: u64) {
    for r in rows {
        assert_eq!(u(&r["failed"]), 0, "failures in {r:#}");
        if r["server"] == "nginx" {
            assert!(has_process(r, "nginx"), "no nginx process seen: {r:#}");
        } else {
            assert!(has_process(r, "baton"), "no baton process seen: {r:#}");
        }
        let config = r["config"].as_str().unwrap();
        if config.starts_with("LB-") {
            assert!(has_process(r, "haproxy"), "no haproxy process seen: {r:#}");
            assert_eq!(u(&r["balancer_logged"]), connections, "{r:#}");
            let per: u64 = r["balancer_per_server"]
                .as_array()
                .unwrap()
                .iter()
                .map(u)
                .sum();
            assert_eq!(per, connections, "HAProxy's per-server counts: {r:#}");
        }
        let client = u(&r["client_full"]) + u(&r["client_resumed"]);
        assert_eq!(client, connections, "{r:#}");
        // one request per connection, counted by the TLS servers themselves
        assert_eq!(u(&r["server_requests"]), connections, "{r:#}");
        // The balancer's CPU is measured wherever one stands in front: HAProxy, or the
        // dispatcher (which relays every byte, so it always used some).
        let balancer = &r["balancer_cpu_ms_per_tx"];
        if config.starts_with("LB-") {
            assert!(balancer.as_f64().is_some(), "{r:#}");
        } else if config.starts_with("CSSL") {
            assert!(balancer.as_f64().is_some_and(|ms| ms > 0.0), "{r:#}");
        } else {
            assert!(balancer.is_null(), "no balancer in {config}: {r:#}");
        }
    }
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn scenario_b_quick_shared_sessions_need_fewer_full_handshakes_than_round_robin() {
    let dir = TempDir::new("lab-b");
    let rows = lab("scenario-b", &dir);
    if rows.is_empty() {
        return;
    }
    check_baselines(&rows, 600);
    let full = |c: &str, s: &str| u(&find(&rows, c, s)["full_handshakes"]);
    let shared = full("CSSL-SL enabled (peers)", "baton");
    // each client's first connection of three is full: 200 of 600
    assert_eq!(
        shared, 200,
        "CSSL-SL: only the clients' own full handshakes"
    );
    assert!(shared < full("LB-RR", "baton"), "{rows:#?}");
    assert!(shared < full("LB-RR", "nginx"), "{rows:#?}");
    assert!(
        shared < full("CSSL-SL disabled (memory)", "baton"),
        "{rows:#?}"
    );
    // a single server resumes everything it issued
    assert_eq!(full("1 server", "nginx"), 200);
    assert_eq!(full("1 server", "baton"), 200);
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn scenario_a_quick_handoff_spreads_full_handshakes_evenly() {
    let dir = TempDir::new("lab-a");
    let rows = lab("scenario-a", &dir);
    if rows.is_empty() {
        return;
    }
    check_baselines(&rows, 900);
    let on = per_server(find(&rows, "CSSL-SF enabled (handoff)", "baton"));
    assert_eq!(on.len(), 2);
    assert_eq!(on.iter().sum::<u64>(), 900);
    let (max, min) = (*on.iter().max().unwrap(), *on.iter().min().unwrap());
    let apart = (max - min) as f64 / ((max + min) as f64 / 2.0);
    if optimised() {
        assert!(
            apart <= 0.10,
            "CSSL-SF full handshakes per agent more than 10% apart: {on:?}"
        );
    } else {
        // a dev build turns handshakes around slower; 12-25% apart seen here (0-2% optimised)
        eprintln!(
            "dev build: CSSL-SF handshakes {on:?}, {:.0}% apart (bound checked with BATON_LAB_BIN)",
            apart * 100.0
        );
        assert!(
            apart <= 0.5,
            "CSSL-SF handshakes far apart even for a dev build: {on:?}"
        );
    }
    // client-ip affinity puts the three hosts 2:1 on the two agents
    let off = per_server(find(&rows, "CSSL-SF disabled (client-ip)", "baton"));
    let mut off_sorted = off.clone();
    off_sorted.sort();
    assert_eq!(off_sorted, vec![300, 600], "client-ip: {off:?}");
}

#[test]
fn homes_move_about_one_in_n_when_an_agent_joins_or_leaves() {
    let dir = TempDir::new("lab-homes");
    let json = dir.path("homes.json");
    let out = Command::new(lab_binary())
        .args(["lab", "homes", "--quick", "--quota", "0", "--json"])
        .arg(&json)
        .arg("--dir")
        .arg(dir.path("work"))
        .output()
        .expect("running baton lab homes");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["experiments"][0]["rows"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 6, "3, 5 and 8 agents, join and leave");
    for r in &rows {
        let (moved, ideal) = (f(r, "moved_percent"), f(r, "ideal_percent"));
        assert!((moved - ideal).abs() < ideal * 0.15, "{r}");
        // what hash % N did: most clients move
        assert!(f(r, "modulo_moved_percent") > 60.0, "{r}");
    }
}

fn f(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in {row}"))
}
