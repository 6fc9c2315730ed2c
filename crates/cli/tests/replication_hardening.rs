//! The `--store peers` replication listener under connections that are not peers (issue 15,
//! finding 2): idle connections from a peer's address, connections from addresses that are no
//! peer's, and a peer restarted while they crowd the port. Real agents, real sockets.
//!
//! `BATON=path` runs the tests against another `baton` binary (an older build, to see them
//! fail there).

mod common;

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use rustls::version::TLS13;
use rustls::HandshakeKind;

/// How long the listener gives a connection to authenticate (`peers.rs`).
const AUTH_DEADLINE: Duration = Duration::from_secs(5);
/// How long an authenticated peer connection may stay silent (`peers.rs`).
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

fn bin() -> String {
    std::env::var("BATON").unwrap_or_else(|_| BATON.to_string())
}

/// Agents with stateful sessions only (`--tickets false`), so resumption needs the store.
struct Cluster {
    pki: Pki,
    key: String,
    ports: Vec<u16>,
    /// Flags for each agent beyond the cluster's.
    extra: Vec<Vec<String>>,
    agents: Vec<Agent>,
    _dir: TempDir,
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        Cluster::with(n, |_| vec![])
    }

    fn with(n: usize, extra: impl Fn(usize) -> Vec<String>) -> Cluster {
        let pki = Pki::new();
        let dir = TempDir::new("repl-hardening");
        let key = key_file(&dir, "cluster.key");
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let mut c = Cluster {
            pki,
            key,
            ports,
            extra: (0..n).map(extra).collect(),
            agents: Vec::new(),
            _dir: dir,
        };
        c.agents = (0..n).map(|i| c.start(i)).collect();
        c
    }

    fn start(&self, i: usize) -> Agent {
        let mut args = self.pki.server_args();
        args.extend(
            [
                "--tickets",
                "false",
                "--agent-id",
                &i.to_string(),
                "--cluster-key-file",
                &self.key,
            ]
            .map(String::from),
        );
        args.extend(peer_args(&self.ports, i));
        args.extend(self.extra[i].iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (child, addrs) = spawn_ready_with(
            &bin(),
            "agent",
            &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            &args,
        );
        Agent {
            child,
            addr: addrs["tls"],
            metrics: addrs["metrics"],
            link: addrs.get("link").copied(),
        }
    }

    /// Kills agent `i`; after `down`, starts it again with the same flags (same replication
    /// port).
    fn restart(&mut self, i: usize, down: Duration) {
        let old = &mut self.agents[i];
        let _ = old.child.kill();
        let _ = old.child.wait();
        std::thread::sleep(down);
        self.agents[i] = self.start(i);
    }

    fn replication_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[i]))
    }

    /// Whether a session made on agent `from` resumes on agent `to` within `within` (new
    /// sessions are tried until then).
    fn replicates(&self, from: usize, to: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let config = Arc::new(self.pki.client(&[&TLS13], None));
            let first = fetch(&self.agents[from], &config, "/").unwrap();
            assert_eq!(first.kind, HandshakeKind::Full);
            // replication is asynchronous: give it a moment, as a client's think time would
            std::thread::sleep(Duration::from_millis(100));
            if fetch(&self.agents[to], &config, "/").unwrap().kind == HandshakeKind::Resumed {
                return true;
            }
        }
        false
    }

    fn store_event(&self, i: usize, event: &str) -> f64 {
        self.agents[i].metric(&format!(
            "baton_session_store_events_total{{event=\"{event}\"}}"
        ))
    }
}

/// A TCP connection to `to` from local address `from` (any port).
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    connect_in(&rt, from, to)
}

fn connect_in(
    rt: &tokio::runtime::Runtime,
    from: &str,
    to: SocketAddr,
) -> std::io::Result<TcpStream> {
    // std cannot bind a client socket before connecting; tokio's TcpSocket can.
    let stream = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4()?;
        s.bind(format!("{from}:0").parse().unwrap())?;
        s.connect(to).await?.into_std()
    })?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Whether the server has closed `s`: what it sent so far is read and dropped.
fn closed(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// Someone who keeps `n` idle connections open to `to` from `from`, opening a new one every
/// 20 ms in place of each the server closes, until dropped: whatever slot the listener frees,
/// this takes at once.
struct Crowd {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<usize>>,
}

impl Crowd {
    fn start(from: &'static str, to: SocketAddr, n: usize) -> Crowd {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut open: Vec<TcpStream> = Vec::new();
            let mut opened = 0;
            while !flag.load(Ordering::Relaxed) {
                open.retain_mut(|s| !closed(s));
                if open.len() < n {
                    if let Ok(s) = connect_in(&rt, from, to) {
                        open.push(s);
                        opened += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            opened
        });
        Crowd {
            stop,
            thread: Some(thread),
        }
    }

    /// Connections opened in all.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// 80 idle connections from a peer's own address (127.0.0.1), topped up as they are closed,
/// against agent 0's replication port; agent 1 restarts behind them. Before the fix they held
/// all 64 slots, so the restarted agent was turned away and its sessions never reached agent 0.
#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_restarted_peer_gets_back_in_past_idle_connections_from_a_peer_address() {
    let mut c = Cluster::new(2);
    assert!(
        c.replicates(0, 1, Duration::from_secs(5)),
        "1 learns from 0"
    );
    assert!(
        c.replicates(1, 0, Duration::from_secs(5)),
        "0 learns from 1"
    );

    let crowd = Crowd::start("127.0.0.1", c.replication_addr(0), 80);
    std::thread::sleep(Duration::from_secs(2)); // the crowd is in
                                                // while agent 1 is down, the crowd takes the slot its connection held
    c.restart(1, Duration::from_secs(1));
    assert!(
        c.replicates(1, 0, Duration::from_secs(8)),
        "a session made on the restarted agent 1 never resumed on agent 0"
    );
    assert!(
        c.replicates(0, 1, Duration::from_secs(8)),
        "agent 0 no longer replicates to the restarted agent 1"
    );
    let opened = crowd.stop();
    assert!(
        opened > 80,
        "the listener closed idle connections ({opened} opened)"
    );
    // every crowd connection was closed unserved, or is still waiting to be
    assert!(c.store_event(0, "refused") >= (opened - 16) as f64);
}

/// Connections from an address that is no peer's (127.0.0.2) are closed at accept, before the
/// listener sends anything, and counted; a peer restarted meanwhile gets in.
#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn connections_from_other_addresses_are_closed_at_accept() {
    let mut c = Cluster::new(2);
    assert!(c.replicates(1, 0, Duration::from_secs(5)));

    let to = c.replication_addr(0);
    let mut strangers: Vec<TcpStream> = (0..80)
        .map(|_| connect_from("127.0.0.2", to).unwrap())
        .collect();
    for s in &mut strangers {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("a connection from 127.0.0.2 was served: {other:?}"),
        }
    }
    assert_eq!(c.store_event(0, "refused"), 80.0);

    let crowd = Crowd::start("127.0.0.2", to, 80);
    std::thread::sleep(Duration::from_secs(1));
    c.restart(1, Duration::from_secs(1));
    assert!(
        c.replicates(1, 0, Duration::from_secs(8)),
        "a session made on the restarted agent 1 never resumed on agent 0"
    );
    drop(crowd);
}

/// Connections from a peer's address that never authenticate (silent, or dribbling a frame
/// header) are closed once the authentication deadline passes; authenticated peers that have
/// nothing to replicate for longer than the idle timeout are not (their heartbeats keep them).
#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn unauthenticated_connections_are_closed_after_the_deadline_and_idle_peers_are_not() {
    let c = Cluster::new(2);
    let started = Instant::now();
    assert!(c.replicates(0, 1, Duration::from_secs(5)));
    // no session from here on, until past the idle timeout

    let to = c.replication_addr(1);
    let mut silent: Vec<TcpStream> = (0..3)
        .map(|_| connect_from("127.0.0.1", to).unwrap())
        .collect();
    let mut dribbler = connect_from("127.0.0.1", to).unwrap();
    let opened = Instant::now();
    let mut hello = [0u8; 21];
    dribbler
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    dribbler.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..4], b"BTNP");

    // the dribbler announces a 4 KiB frame, then sends one byte of it every 100 ms
    use std::io::Write;
    dribbler.write_all(&4096u32.to_be_bytes()).unwrap();
    let mut closed_at = Vec::new();
    let mut dribbler_closed = None;
    let limit = AUTH_DEADLINE + Duration::from_secs(4);
    while opened.elapsed() < limit && (!silent.is_empty() || dribbler_closed.is_none()) {
        std::thread::sleep(Duration::from_millis(100));
        silent.retain_mut(|s| {
            let gone = closed(s);
            if gone {
                closed_at.push(opened.elapsed());
            }
            !gone
        });
        if dribbler_closed.is_none() && (closed(&mut dribbler) || dribbler.write_all(&[0]).is_err())
        {
            dribbler_closed = Some(opened.elapsed());
        }
    }
    assert!(
        silent.is_empty(),
        "{} silent connection(s) still open after {limit:?}",
        silent.len()
    );
    let dribbler_closed = dribbler_closed.expect("the dribbling connection is still open");
    for t in closed_at.iter().chain([&dribbler_closed]) {
        assert!(
            *t >= AUTH_DEADLINE - Duration::from_millis(500),
            "closed after {t:?}, before the deadline"
        );
    }
    assert_eq!(c.store_event(1, "refused"), 4.0);

    // the peers were idle (nothing to replicate) for longer than the idle timeout
    let idle_until = started + IDLE_TIMEOUT + Duration::from_secs(3);
    std::thread::sleep(idle_until.saturating_duration_since(Instant::now()));
    assert!(c.replicates(0, 1, Duration::from_millis(500)));
    assert!(c.replicates(1, 0, Duration::from_millis(500)));
    // no peer connection was cut for idleness: the refusals are the four above
    assert_eq!(c.store_event(1, "refused"), 4.0);
    assert_eq!(c.store_event(0, "refused"), 0.0);
    assert_eq!(c.store_event(0, "dropped"), 0.0);
    assert_eq!(c.store_event(1, "dropped"), 0.0);
}

/// `--peer-allow` lets a network besides the peers' addresses in (peers behind NAT); the rest
/// stay out. It needs `--store peers`.
#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn peer_allow_admits_another_network() {
    let c = Cluster::with(2, |i| {
        if i == 0 {
            vec!["--peer-allow".into(), "127.0.0.2/32".into()]
        } else {
            vec![]
        }
    });
    assert!(c.replicates(1, 0, Duration::from_secs(5)));
    let to = c.replication_addr(0);
    let mut allowed = connect_from("127.0.0.2", to).unwrap();
    allowed
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut hello = [0u8; 21];
    allowed.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..5], b"BTNP\x02");
    let mut stranger = connect_from("127.0.0.3", to).unwrap();
    stranger
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    assert!(matches!(stranger.read(&mut hello), Ok(0)));
    assert_eq!(c.store_event(0, "refused"), 1.0);

    let out = std::process::Command::new(bin())
        .args([
            "agent",
            "--self-signed",
            "ecdsa-p256",
            "--peer-allow",
            "10.0.0.0/8",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--peer-allow only applies to --store peers"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
