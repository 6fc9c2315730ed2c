//! A keep-alive connection that came with 0-RTT lives on like any other once its first request
//! is answered: it parks while it idles, and moves to another agent when its agent is drained.
//! Real processes: agents, a dispatcher, redis-server, a counting upstream, a rustls client.

mod common;

use std::io::Write;

use common::early::{
    early, early_client, eventually, get, read_response, request, request_kept,
    store_quarantine_over, Upstream,
};
use common::{
    admin_request, key_file, linked_roster, series_sum, Agent, Dispatcher, Pki, Redis, TempDir,
};

/// The second request on a kept connection: its status.
fn again(kept: &mut common::early::Kept, path: &str) -> u16 {
    kept.write_all(&get(path)).unwrap();
    kept.flush().unwrap();
    read_response(kept)
}

/// Before the fix a connection that offered early data stayed in one hyper connection for its
/// life, never parked.
#[test]
fn an_idle_zero_rtt_connection_parks_and_wakes() {
    let pki = Pki::new();
    let upstream = Upstream::start();
    // the memory store: the only agent holding its tickets, its take is single-use too
    let a = Agent::serving(
        &pki,
        &[
            "--tickets",
            "false",
            "--early-data",
            "4096",
            &upstream.arg(),
        ],
    );
    let config = early_client(&pki);
    assert_eq!(request(a.addr, &config, &get("/first")).status, 200);
    let (o, mut kept) = request_kept(a.addr, &config, &get("/zero"));
    assert!(o.accepted && o.status == 200, "{o:?}");
    eventually("the idle connection parked", || {
        a.metric("baton_connections_parked") == 1.0
    });
    assert_eq!(again(&mut kept, "/after"), 200);
    let seen = upstream.requests("/after");
    assert_eq!(seen.len(), 1);
    assert!(!seen[0].early, "{seen:?}");
    assert_eq!(a.failures("other"), 0);
}

/// Before the fix an operator's drain at the dispatcher left such a connection where it was
/// (and an agent's own drain closed it).
#[test]
fn a_zero_rtt_connection_moves_off_a_drained_agent() {
    let Some(redis) = Redis::start() else { return };
    let pki = Pki::new();
    let dir = TempDir::new("early-moves");
    let key = key_file(&dir, "cluster.key");
    let upstream = Upstream::start();
    let store = format!("redis={}", redis.url());
    let agents: Vec<Agent> = (0..2u16)
        .map(|id| {
            Agent::serving(
                &pki,
                &[
                    "--store",
                    &store,
                    "--cluster-key-file",
                    &key,
                    "--tickets",
                    "false",
                    "--early-data",
                    "16384",
                    "--store-wait",
                    "2s",
                    "--agent-id",
                    &id.to_string(),
                    "--link-listen",
                    "127.0.0.1:0",
                    "--handoff",
                    "true",
                    &upstream.arg(),
                ],
            )
        })
        .collect();
    std::fs::write(dir.path("agents.toml"), linked_roster(&agents)).unwrap();
    // killed on drop, like the agents
    let (d, admin) = Dispatcher::with_admin(
        &dir.arg("agents.toml"),
        &["--policy", "round-robin", "--cluster-key-file", &key],
    );
    store_quarantine_over();
    let config = early_client(&pki);
    assert_eq!(request(d.addr, &config, &get("/first")).status, 200);
    // round robin: the other agent takes the ticket from Redis, and the early data
    let (o, mut kept) = request_kept(d.addr, &config, &get("/zero"));
    assert!(o.accepted && o.status == 200, "{o:?}");
    let holder = (0..2)
        .find(|&i| early(&agents[i], "accepted") == 1)
        .expect("an agent accepted the early data");
    let moved = |a: &Agent, direction: &str| {
        series_sum(
            &a.metrics_text(),
            "baton_sessions_moved_total",
            &format!("direction=\"{direction}\",reason=\"drain\""),
        )
    };
    let (status, body) = admin_request(admin, "POST", &format!("/agents/{holder}/drain"), None);
    assert_eq!(status, 200, "{body}");
    eventually("the connection moved off the drained agent", || {
        moved(&agents[holder], "out") == 1.0
    });
    assert_eq!(again(&mut kept, "/after"), 200);
    assert_eq!(moved(&agents[1 - holder], "in"), 1.0);
    assert_eq!(upstream.requests("/after").len(), 1);
    for a in &agents {
        assert_eq!(a.failures("other"), 0);
    }
}
