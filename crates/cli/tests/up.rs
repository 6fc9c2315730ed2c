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
