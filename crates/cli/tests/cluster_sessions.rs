//! Agents sharing sessions (CSSL-SL): a client's session from one agent resumes on another,
//! through peer replication or a real Redis; with per-agent memory it does not.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::version::{TLS12, TLS13};
use rustls::HandshakeKind;

/// `n` agents with stateful sessions only (`--tickets false`), so resumption needs the store.
fn cluster(
    pki: &Pki,
    store: &[&str],
    per_agent: impl Fn(usize) -> Vec<String>,
    n: usize,
) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let mut args = pki.server_args();
            args.extend(["--tickets", "false", "--agent-id", &i.to_string()].map(String::from));
            args.extend(store.iter().map(|s| s.to_string()));
            args.extend(per_agent(i));
            Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .collect()
}

/// One full handshake on agent 0, then resumptions on agents 1, 2, 0, 1, ... each of which must
/// have learned the session from the one before.
fn resumes_across(agents: &[Agent], pki: &Pki) {
    for v in [&TLS12, &TLS13] {
        let config = Arc::new(pki.client(&[v], None));
        assert_eq!(
            fetch(&agents[0], &config, "/").unwrap().kind,
            HandshakeKind::Full
        );
        for i in 1..=4 {
            let agent = &agents[i % agents.len()];
            // replication is asynchronous: give it a moment, as a real client's think time would
            let deadline = Instant::now() + Duration::from_secs(5);
            std::thread::sleep(Duration::from_millis(50));
            let kind = fetch(agent, &config, "/").unwrap().kind;
            assert_eq!(
                kind,
                HandshakeKind::Resumed,
                "{v:?}: connection {i} on agent {}",
                i % agents.len()
            );
            assert!(Instant::now() < deadline);
        }
    }
}

#[test]
fn peers_store_resumes_on_every_agent() {
    let pki = Pki::new();
    let dir = TempDir::new("peers");
    let key = key_file(&dir, "cluster.key");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let agents = cluster(
        &pki,
        &["--cluster-key-file", &key],
        |i| peer_args(&ports, i),
        3,
    );
    std::thread::sleep(Duration::from_millis(300)); // peers connect
    resumes_across(&agents, &pki);
    let received: f64 = agents
        .iter()
        .map(|a| a.metric("baton_session_store_events_total{event=\"received\"}"))
        .sum();
    assert!(received > 0.0);
}

#[test]
fn memory_store_does_not_resume_on_another_agent() {
    let pki = Pki::new();
    let agents = cluster(&pki, &[], |_| vec![], 2);
    for v in [&TLS12, &TLS13] {
        let config = Arc::new(pki.client(&[v], None));
        assert_eq!(
            fetch(&agents[0], &config, "/").unwrap().kind,
            HandshakeKind::Full
        );
        assert_eq!(
            fetch(&agents[1], &config, "/").unwrap().kind,
            HandshakeKind::Full
        );
    }
}

#[test]
fn redis_store_resumes_on_every_agent_and_survives_redis_stopping() {
    let Some(mut server) = Redis::start() else {
        return;
    };
    let pki = Pki::new();
    let dir = TempDir::new("redis");
    let key = key_file(&dir, "cluster.key");
    let url = format!("redis={}", server.url());
    let agents = cluster(
        &pki,
        &[
            "--store",
            &url,
            "--cluster-key-file",
            &key,
            "--store-wait",
            "200ms",
        ],
        |_| vec![],
        3,
    );
    resumes_across(&agents, &pki);

    // Redis goes away: handshakes still succeed (full where the session is not local), counted.
    server.stop();
    let config = Arc::new(pki.client(&[&TLS12], None));
    assert_eq!(fetch(&agents[0], &config, "/").unwrap().status, 200);
    for agent in &agents[1..] {
        let f = fetch(agent, &config, "/").unwrap();
        assert_eq!((f.status, f.kind), (200, HandshakeKind::Full));
    }
    let fallbacks: f64 = agents
        .iter()
        .map(|a| a.metric("baton_session_store_events_total{event=\"fallback\"}"))
        .sum();
    assert!(fallbacks >= 1.0);
}
