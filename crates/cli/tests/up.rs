//! `baton up` clusters under load from many virtual clients with seed 001's 1 full : 2 resumed
//! mix (seed 000 Scenario B): with sessions shared, a round-robin dispatcher needs only the
//! clients' own full handshakes; with per-agent memory it loses most resumptions; session
//! affinity recovers them without sharing. Also behind a real HAProxy in TCP round-robin mode.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use rustls::version::{TLS12, TLS13};

struct Up {
    child: Child,
    state: serde_json::Value,
    _dir: TempDir,
}

impl Drop for Up {
    fn drop(&mut self) {
        // SIGTERM so `baton up` stops its children too
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

impl Up {
    fn start(args: &[&str]) -> Up {
        let dir = TempDir::new("up");
        let state = dir.path("state.json");
        let (child, _) = spawn_ready(
            "up",
            &[
                "--listen",
                "127.0.0.1:0",
                "--state",
                state.to_str().unwrap(),
                "--dir",
                &dir.arg("cluster"),
            ],
            args,
        );
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        Up {
            child,
            state,
            _dir: dir,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.state["dispatcher"].as_str().unwrap().parse().unwrap()
    }

    fn client(&self, v: &'static rustls::SupportedProtocolVersion) -> rustls::ClientConfig {
        client_trusting(self.state["ca"].as_str().unwrap(), v)
    }

    fn agent_metrics(&self) -> Vec<SocketAddr> {
        self.state["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["metrics"].as_str().unwrap().parse().unwrap())
            .collect()
    }

    /// Full handshakes the agents counted, all versions.
    fn server_full(&self) -> u64 {
        self.agent_metrics()
            .iter()
            .map(|m| {
                let (_, text) = plain_get(*m, "/metrics");
                text.lines()
                    .filter(|l| {
                        l.starts_with("baton_handshakes_total{") && l.contains("kind=\"full\"")
                    })
                    .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                    .sum::<u64>()
            })
            .sum()
    }
}

fn client_trusting(ca: &str, v: &'static rustls::SupportedProtocolVersion) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_protocol_versions(&[v])
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// 25 clients x 120 connections, 1 full : 2 resumed: the ideal is 1,000 full handshakes for
/// 3,000 connections (per client 40 full, 80 resumed).
const CLIENTS: usize = 25;
const PER_CLIENT: usize = 120;

fn scenario_b(up: &Up, v: &'static rustls::SupportedProtocolVersion) -> (Mix, u64) {
    let before = up.server_full();
    let mix = virtual_clients(up.addr(), &up.client(v), CLIENTS, PER_CLIENT, 3);
    (mix, up.server_full() - before)
}

#[test]
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
fn redis_store_needs_only_the_clients_full_handshakes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Ok(mut redis) = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
    else {
        assert!(
            std::env::var_os("BATON_REQUIRE_REDIS").is_none(),
            "redis-server required"
        );
        return;
    };
    std::thread::sleep(Duration::from_millis(300));
    let store = format!("redis=redis://127.0.0.1:{port}/");
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
    let _ = redis.kill();
    let _ = redis.wait();
}
