//! `baton dispatch` as a real process in front of real agents, spoken to by rustls and
//! `openssl s_client`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::version::{TLS12, TLS13};
use rustls::HandshakeKind;

/// `n` agents with ids 0..n, each with `extra(i)` flags.
fn agents(pki: &Pki, n: usize, extra: impl Fn(usize) -> Vec<String>) -> Vec<Agent> {
    (0..n)
        .map(|i| {
            let mut args = pki.server_args();
            args.extend(["--agent-id".to_string(), i.to_string()]);
            args.extend(extra(i));
            Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .collect()
}

fn total_handshakes(agents: &[Agent], version: &str, kind: &str) -> u64 {
    agents.iter().map(|a| a.handshakes(version, kind)).sum()
}

#[test]
fn round_robin_spreads_and_per_agent_memory_loses_resumptions() {
    let pki = Pki::new();
    let agents = agents(&pki, 3, |_| vec![]);
    let refs: Vec<&Agent> = agents.iter().collect();
    let d = Dispatcher::start(&refs, &["--policy", "round-robin"]);
    let config = Arc::new(pki.client(&[&TLS13], None));
    for _ in 0..6 {
        assert_eq!(fetch(&d, &config, "/").unwrap().status, 200);
    }
    for a in &agents {
        assert_eq!(
            a.handshakes("1.3", "full") + a.handshakes("1.3", "resumed"),
            2
        );
    }
    // each agent has its own ticket keys: a session resumes only where it was made
    assert!(total_handshakes(&agents, "1.3", "full") > 1);
    assert_eq!(
        d.metric("baton_dispatch_hellos_total{outcome=\"parsed\"}"),
        6.0
    );
}

#[test]
fn session_policy_sends_resumptions_to_the_issuer() {
    let pki = Pki::new();
    // TLS 1.3 stateless tickets name their issuer; TLS 1.2 session ids are learned from
    // ServerHellos (tickets off so TLS 1.2 uses ids)
    for (versions, tickets, label) in [(&TLS13, "true", "1.3"), (&TLS12, "false", "1.2")] {
        let agents = agents(&pki, 3, |_| vec!["--tickets".into(), tickets.into()]);
        let refs: Vec<&Agent> = agents.iter().collect();
        let d = Dispatcher::start(&refs, &["--policy", "session"]);
        let mut config = pki.client(&[versions], None);
        if label == "1.2" {
            config.resumption = rustls::client::Resumption::in_memory_sessions(16)
                .tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
        }
        let config = Arc::new(config);
        assert_eq!(fetch(&d, &config, "/").unwrap().kind, HandshakeKind::Full);
        for i in 0..5 {
            assert_eq!(
                fetch(&d, &config, "/").unwrap().kind,
                HandshakeKind::Resumed,
                "{label} #{i}"
            );
        }
        assert_eq!(total_handshakes(&agents, label, "full"), 1, "{label}");
        assert_eq!(total_handshakes(&agents, label, "resumed"), 5, "{label}");
        let reason = if label == "1.3" {
            "ticket"
        } else {
            "session_id"
        };
        let routed: f64 = (0..3)
            .map(|a| {
                d.metric(&format!(
                    "baton_dispatch_connections_total{{agent=\"{a}\",reason=\"{reason}\"}}"
                ))
            })
            .sum();
        assert_eq!(routed, 5.0, "{label}");
    }
}

#[test]
fn round_robin_with_shared_sessions_resumes_on_every_agent_with_openssl() {
    let pki = Pki::new();
    let dir = TempDir::new("rr-peers");
    let cluster = key_file(&dir, "cluster.key");
    let tickets = key_file(&dir, "ticket.key");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let agents = agents(&pki, 3, |i| {
        let mut a: Vec<String> = [
            "--cluster-key-file",
            &cluster,
            "--ticket-key-file",
            &tickets,
        ]
        .map(String::from)
        .to_vec();
        a.extend(peer_args(&ports, i));
        a
    });
    let refs: Vec<&Agent> = agents.iter().collect();
    let d = Dispatcher::start(&refs, &["--policy", "round-robin"]);
    std::thread::sleep(Duration::from_millis(300));
    for (flag, label) in [("-tls1_3", "1.3"), ("-tls1_2", "1.2")] {
        let sess = dir.arg(&format!("s{label}"));
        let out = s_client(&d, &[flag, "-sess_out", &sess], Duration::from_secs(1));
        assert!(text_of(&out).contains("New,"), "{}", text_of(&out));
        std::thread::sleep(Duration::from_millis(100)); // replication
        for i in 0..3 {
            let out = s_client(&d, &[flag, "-sess_in", &sess], Duration::from_millis(200));
            assert!(
                text_of(&out).contains("Reused,"),
                "{label} #{i}: {}",
                text_of(&out)
            );
        }
        // the three resumptions landed on three different agents
        let per_agent: Vec<u64> = agents
            .iter()
            .map(|a| a.handshakes(label, "resumed"))
            .collect();
        assert_eq!(per_agent, [1, 1, 1], "{label}");
    }
}

#[test]
fn proxy_protocol_passes_the_real_client_address() {
    let pki = Pki::new();
    let agents = agents(&pki, 1, |_| vec!["--proxy-protocol".into(), "true".into()]);
    let d = Dispatcher::start(&[&agents[0]], &["--proxy-protocol", "true"]);
    // connect from 127.0.0.7 so the address is distinguishable from the dispatcher's
    let sock = connect_from("127.0.0.7", d.addr);
    let config = Arc::new(pki.client(&[&TLS13], None));
    let conn = rustls::ClientConnection::new(config, "localhost".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(b"GET /tls HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("peer: 127.0.0.7:"), "{text}");
    // the dispatcher's health probes (PROXY LOCAL) are not counted as failed handshakes
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        agents[0].failures("malformed") + agents[0].failures("eof"),
        0,
        "{}",
        agents[0].metrics_text()
    );
}

/// A TCP connection to `to` from local address `from` (any port).
fn connect_from(from: &str, to: std::net::SocketAddr) -> TcpStream {
    // std cannot bind a client socket before connecting; tokio's TcpSocket can.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{from}:0").parse().unwrap()).unwrap();
        s.connect(to).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

#[test]
fn a_dead_agent_is_taken_out_and_clients_see_no_error() {
    let pki = Pki::new();
    let mut agents = agents(&pki, 3, |_| vec![]);
    let refs: Vec<&Agent> = agents.iter().collect();
    let d = Dispatcher::start(
        &refs,
        &["--policy", "round-robin", "--health-interval", "0.3"],
    );
    let config = Arc::new(pki.client(&[&TLS13], None));
    assert_eq!(fetch(&d, &config, "/").unwrap().status, 200);
    let dead = agents.remove(1);
    drop(dead);
    // every request succeeds, even those routed to the dead agent before the health check notices
    let started = Instant::now();
    for i in 0..12 {
        assert_eq!(fetch(&d, &config, "/").unwrap().status, 200, "request {i}");
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(d.metric("baton_dispatch_agent_up{agent=\"1\"}"), 0.0);
    assert_eq!(d.metric("baton_dispatch_agent_up{agent=\"0\"}"), 1.0);
}

#[test]
fn garbage_and_oversized_hellos_do_not_disturb_other_clients() {
    let pki = Pki::new();
    let agents = agents(&pki, 2, |_| vec![]);
    let refs: Vec<&Agent> = agents.iter().collect();
    let d = Dispatcher::start(&refs, &["--policy", "session", "--hello-timeout", "1"]);
    let config = Arc::new(pki.client(&[&TLS13], None));
    // not TLS
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    // a handshake record announcing a 16 MB hello, then lots of bytes
    let mut big = TcpStream::connect(d.addr).unwrap();
    big.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0xff, 0xff, 0xff];
    hello.resize(1 << 20, 0x41);
    let _ = big.write_all(&hello);
    // silence after a partial record
    let mut slow = TcpStream::connect(d.addr).unwrap();
    slow.write_all(&[0x16, 0x03, 0x01]).unwrap();
    assert_eq!(fetch(&d, &config, "/").unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fetch(&d, &config, "/").unwrap().status, 200);
    assert!(d.metric("baton_dispatch_hellos_total{outcome=\"unparsed\"}") >= 1.0);
    assert!(d.metric("baton_dispatch_hellos_total{outcome=\"timeout\"}") >= 1.0);
}
