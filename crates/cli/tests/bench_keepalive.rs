//! `baton bench --requests-per-conn K --think-time T`: keep-alive clients that pause between
//! requests, against a real `baton agent` whose idle timeout closes their connections between
//! requests. What is counted: requests failed, requests never sent (`unsent`), connections the
//! server closed while the client still had requests to send (`closed`), full and resumed
//! handshakes, and the latency of each request with the think time left out.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn bench(args: &[&str], dir: &TempDir, name: &str) -> Value {
    let json = dir.arg(name);
    let out = Command::new(BATON)
        .arg("bench")
        .args(args)
        .args(["--json", &json, "--quiet"])
        .output()
        .expect("run baton bench");
    let v: Value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("no JSON from baton bench: {}", text_of(&out)));
    // whatever else a run shows: every request is ok, failed or unsent, exactly
    assert_eq!(
        n(&v, "requests.ok") + n(&v, "requests.failed") + n(&v, "requests.unsent"),
        n(&v, "requests.expected"),
        "{v}"
    );
    assert_eq!(
        n(&v, "requests.expected"),
        n(&v, "connections") * n(&v, "config.requests_per_conn"),
        "{v}"
    );
    v
}

/// Answered requests in the per-second request histograms.
fn by_second_count(v: &Value) -> u64 {
    v["timeline"]["request_by_second"]
        .as_array()
        .map(|secs| {
            secs.iter()
                .flat_map(|h| h["counts"].as_array().unwrap().iter())
                .map(|pair| pair[1].as_u64().unwrap())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn idle_keepalive_connections_closed_between_requests_are_counted_as_closed_not_failed() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-keepalive");
    // the agent closes a connection idle for 300 ms: every client below thinks 1.2 s after its
    // first response, so the server closes each connection between request 1 and request 2
    let agent = Agent::serving(&pki, &["--idle-timeout", "300ms"]);
    let served = agent.served();
    let v = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "6",
            "-c",
            "2",
            "--requests-per-conn",
            "3",
            "--think-time",
            "1200ms",
            "--tls-version",
            "1.3",
        ],
        &dir,
        "closed.json",
    );
    assert_eq!(v["errors"]["closed"].as_u64(), Some(6), "{v}");
    assert_eq!(
        (
            n(&v, "requests.ok"),
            n(&v, "requests.failed"),
            n(&v, "requests.unsent")
        ),
        (6, 0, 12),
        "one request answered per connection, the other two never sent: {v}"
    );
    assert!(
        v["error_examples"]["closed"]
            .as_str()
            .unwrap()
            .contains("idle connection after 1 of 3"),
        "{v}"
    );
    // the agent served exactly what the client counted as answered
    assert_eq!(agent.served() - served, 6);
    // a closed connection's session still resumes: 1 full every 3 connections per client
    assert_eq!(
        (n(&v, "handshakes.full"), n(&v, "handshakes.resumed")),
        (2, 4),
        "{v}"
    );
    assert_eq!(n(&v, "latency_ms.request.count"), 6, "{v}");
    assert_eq!(by_second_count(&v), 6, "{v}");

    // TLS 1.2 the same (the close is seen during the think time, before a request is written)
    let v = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "4",
            "-c",
            "2",
            "--requests-per-conn",
            "2",
            "--think-time",
            "1200ms",
            "--tls-version",
            "1.2",
        ],
        &dir,
        "closed12.json",
    );
    assert_eq!(v["errors"]["closed"].as_u64(), Some(4), "{v}");
    assert_eq!(
        (
            n(&v, "requests.ok"),
            n(&v, "requests.failed"),
            n(&v, "requests.unsent")
        ),
        (4, 0, 4),
        "{v}"
    );
}

#[test]
fn think_time_keeps_connections_open_and_stays_out_of_latency() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-think");
    let agent = Agent::serving(&pki, &["--idle-timeout", "30s"]);
    let served = agent.served();
    // a think time far longer than a request on loopback: were it counted, every request after
    // the first and every transaction would take longer than it
    let v = bench(
        &[
            &agent.url("/"),
            "--ca",
            &pki.arg("ca.pem"),
            "--connections",
            "2",
            "-c",
            "2",
            "--requests-per-conn",
            "3",
            "--think-time",
            "2s",
        ],
        &dir,
        "think.json",
    );
    assert!(v["errors"].as_object().unwrap().is_empty(), "{v}");
    assert_eq!(
        (
            n(&v, "requests.ok"),
            n(&v, "requests.failed"),
            n(&v, "requests.unsent")
        ),
        (6, 0, 0),
        "{v}"
    );
    assert_eq!(agent.served() - served, 6);
    assert_eq!(v["config"]["think_time_s"].as_f64(), Some(2.0), "{v}");
    assert_eq!(n(&v, "latency_ms.request.count"), 6, "{v}");
    assert_eq!(by_second_count(&v), 6, "{v}");
    // the requests were due at 0, 2 and 4 s into each connection: three distinct seconds
    let seconds_used = v["timeline"]["request_by_second"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| !h["counts"].as_array().unwrap().is_empty())
        .count();
    assert!(seconds_used >= 3, "{v}");
    for phase in ["request", "total"] {
        let max = v["latency_ms"][phase]["max"].as_f64().unwrap();
        assert!(max < 2000.0, "{phase} includes think time: {max} ms: {v}");
    }

    // flags that make no sense together are refused (exit 2)
    for bad in [
        vec!["--think-time", "300ms"],
        vec!["--think-time", "300ms", "--requests-per-conn", "1"],
        vec!["--think-time", "soon", "--requests-per-conn", "2"],
    ] {
        let out = Command::new(BATON)
            .args(["bench", &agent.url("/"), "--insecure", "-n", "1"])
            .args(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text_of(&out));
    }
}
