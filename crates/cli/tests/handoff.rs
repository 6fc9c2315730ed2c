//! Session migration (CSSL-SF) with real processes: `baton up --policy handoff` or a
//! dispatcher and agents started by hand, real clients (curl, `openssl s_client`, rustls,
//! `baton bench`). A full handshake runs on the least-loaded agent; the session then moves to
//! the client's home agent, which carries the rest of the same TCP stream.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use baton_migrate::{Frame, RefuseReason, Splitter};
use baton_session::migration::{DirectionState, SessionObject, DEFAULT_TTL};
use baton_session::KeyRing;
use common::*;
use rustls::pki_types::ServerName;

fn migrated_out(up: &Up) -> f64 {
    up.agents_sum("baton_sessions_migrated_total", "direction=\"out\"")
}

fn migrated_in(up: &Up) -> f64 {
    up.agents_sum("baton_sessions_migrated_total", "direction=\"in\"")
}

/// Every session handed off was imported: the handshake agent counts its hand-off when the
/// dispatcher releases its stream, which waits a few milliseconds for the next frame to that
/// agent (`baton_link::RELEASE_DELAY`), so the count may trail the import for that long.
fn assert_migrations_settle(up: &Up) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while migrated_out(up) != migrated_in(up) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(migrated_out(up), migrated_in(up));
}

fn url(up: &Up, path: &str) -> String {
    format!("https://localhost:{}{path}", up.addr().port())
}

fn resolve(up: &Up) -> String {
    format!("localhost:{}:127.0.0.1", up.addr().port())
}

#[test]
fn curl_keep_alive_across_the_move_tls12_and_tls13() {
    let up = Up::handoff(&[]);
    for version in [
        ["--tlsv1.2", "--tls-max", "1.2"],
        ["--tlsv1.3", "--tls-max", "1.3"],
    ] {
        let before = migrated_in(&up);
        let mut bodies = Vec::new();
        // Consecutive full handshakes alternate between the agents (least-loaded, the home
        // first on a tie), so among four connections some run the handshake away from home
        // and move.
        for _ in 0..4 {
            let dir = TempDir::new("curl-handoff");
            let (a, b) = (dir.arg("a"), dir.arg("b"));
            let mut args = vec!["--cacert", up.ca(), "--resolve"];
            let resolve = resolve(&up);
            args.push(&resolve);
            args.extend_from_slice(&version);
            let (u1, u2) = (url(&up, "/bytes/100000"), url(&up, "/bytes/7"));
            args.extend_from_slice(&[
                "-w",
                "%{http_code} %{num_connects}\n",
                &u1,
                "-o",
                &a,
                &u2,
                "-o",
                &b,
            ]);
            let out = curl(&args);
            let text = text_of(&out);
            assert!(out.status.success(), "{text}");
            // one connection: the second transfer reused it
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "200 1\n200 0\n",
                "{text}"
            );
            let (body_a, body_b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
            assert_eq!(body_a.len() + body_b.len(), 100_007);
            assert_eq!(body_b.len(), 7);
            bodies.push(body_a);
        }
        // moved or not, every connection delivered the same bytes in the same order
        assert!(bodies.windows(2).all(|w| w[0] == w[1]));
        let moved = migrated_in(&up) - before;
        assert!(moved >= 1.0, "{version:?}: no connection migrated");
    }
    assert_migrations_settle(&up);
    assert_eq!(up.agents_sum("baton_migration_failures_total", ""), 0.0);
}

#[test]
fn http2_across_the_move() {
    let up = Up::handoff(&[]);
    let before = migrated_in(&up);
    for _ in 0..4 {
        let resolve = resolve(&up);
        let (u1, u2) = (url(&up, "/bytes/70000"), url(&up, "/tls"));
        let out = curl(&[
            "--cacert",
            up.ca(),
            "--resolve",
            &resolve,
            "--http2",
            "-w",
            "%{http_version} %{num_connects} %{size_download}\n",
            "-o",
            "/dev/null",
            &u1,
            &u2,
        ]);
        let text = text_of(&out);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("2 1 70000\n"), "{text}");
        // /tls describes the connection as the agent serving it sees it: still h2
        assert!(text.contains("alpn: h2"), "{text}");
    }
    assert!(migrated_in(&up) - before >= 1.0);
}

/// Reads one HTTP/1.1 response with a Content-Length from a keep-alive stream.
fn read_response(s: &mut impl Read) -> (u16, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("response head");
        head.push(byte[0]);
        assert!(head.len() < 16 * 1024, "head too long");
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .expect("content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, body)
}

#[test]
fn rustls_client_key_updates_and_large_bodies_both_ways_after_the_move() {
    let up = Up::handoff(&[]);
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        // every connection a full handshake (a resumption goes straight home: no move)
        let mut config = up.client(v);
        config.resumption = rustls::client::Resumption::disabled();
        let config = Arc::new(config);
        let mut moved_connections = 0;
        for _ in 0..4 {
            let before = migrated_in(&up);
            let tcp = TcpStream::connect(up.addr()).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            write!(tls, "GET /bytes/10 HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
            let (status, body) = read_response(&mut tls);
            assert_eq!((status, body.len()), (200, 10));
            // a 1 MiB upload, then a 1 MB download
            let upload = vec![b'u'; 1 << 20];
            write!(
                tls,
                "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
                upload.len()
            )
            .unwrap();
            tls.write_all(&upload).unwrap();
            assert_eq!(read_response(&mut tls).0, 200);
            write!(
                tls,
                "GET /bytes/1000000 HTTP/1.1\r\nHost: localhost\r\n\r\n"
            )
            .unwrap();
            let (status, body) = read_response(&mut tls);
            assert_eq!((status, body.len()), (200, 1_000_000));
            if v == &rustls::version::TLS13 {
                // KeyUpdate with update_requested: the agent follows the client's new key
                // and answers with its own
                tls.conn.refresh_traffic_keys().unwrap();
                for i in 0..3 {
                    write!(
                        tls,
                        "GET /bytes/{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
                        5000 + i
                    )
                    .unwrap();
                    let (status, body) = read_response(&mut tls);
                    assert_eq!((status, body.len()), (200, 5000 + i));
                    tls.conn.refresh_traffic_keys().unwrap();
                }
            }
            write!(
                tls,
                "GET /bytes/3 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            assert_eq!(read_response(&mut tls).1.len(), 3);
            if migrated_in(&up) > before {
                moved_connections += 1;
            }
        }
        assert!(moved_connections >= 1, "{v:?}: nothing migrated");
    }
    assert_eq!(up.agents_sum("baton_migration_failures_total", ""), 0.0);
}

#[test]
fn a_request_riding_with_the_clients_finished_and_longer_than_one_read_moves() {
    // rustls at the handshake agent reads the link in 4 KiB pieces: the handshake ends with
    // part of this request's record inside rustls and the rest still on the stream.
    let up = Up::handoff(&[]);
    let mut config = up.client(&rustls::version::TLS13);
    config.resumption = rustls::client::Resumption::disabled();
    let config = Arc::new(config);
    let before = migrated_in(&up);
    for _ in 0..6 {
        let tcp = TcpStream::connect(up.addr()).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
        // written before the handshake: rustls sends it right behind its Finished
        let body = vec![b'r'; 10_000];
        write!(
            conn.writer(),
            "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        conn.writer().write_all(&body).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        assert_eq!(read_response(&mut tls).0, 200);
        write!(tls, "GET /bytes/7 HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let (status, got) = read_response(&mut tls);
        assert_eq!((status, got.len()), (200, 7));
    }
    assert!(migrated_in(&up) > before, "nothing migrated");
    assert_eq!(up.agents_sum("baton_migration_failures_total", ""), 0.0);
}

#[test]
fn openssl_s_client_key_update_after_the_move() {
    let up = Up::handoff(&[]);
    let before = migrated_in(&up);
    let mut answered = 0;
    for _ in 0..4 {
        let mut child = Command::new("openssl")
            .args(["s_client", "-connect", &up.addr().to_string()])
            .args([
                "-servername",
                "localhost",
                "-CAfile",
                up.ca(),
                "-tls1_3",
                "-msg",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("openssl");
        let mut stdin = child.stdin.take().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        stdin
            .write_all(b"GET /bytes/11 HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // s_client's command: KeyUpdate with update_requested
        stdin.write_all(b"K\n").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        stdin
            .write_all(b"GET /bytes/13 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let text = text_of(&out);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
        assert!(text.contains("KEYUPDATE"), "{text}");
        // the agent's own KeyUpdate, answering update_requested
        if text
            .lines()
            .any(|l| l.starts_with("<<< TLS 1.3, Handshake") && l.contains("KeyUpdate"))
        {
            answered += 1;
        }
    }
    assert!(migrated_in(&up) - before >= 1.0);
    assert_eq!(answered, 4, "every server answered update_requested");
}

#[test]
fn scenario_a_three_hosts_two_agents_full_handshakes_balanced() {
    // The release build when `scripts/test` built it (BATON_LAB_BIN): the balance bound is
    // the 10 % there; a dev build on a loaded 2-core machine has come out up to 14 %
    // apart, so without it the bound only separates load-spreading from address routing
    // (which would split these three hosts 2:1, hi - lo = hi / 2).
    let release = std::env::var("BATON_LAB_BIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file());
    let (bin, bound) = match &release {
        Some(p) => (p.as_str(), 0.10),
        None => (BATON, 0.25),
    };
    let up = Up::start_with(
        bin,
        &["--agents", "2", "--policy", "handoff", "--store", "peers"],
    );
    let dir = TempDir::new("scenario-a");
    let json = dir.arg("run.json");
    let target = format!("https://127.0.0.1:{}/bytes/5120", up.addr().port());
    let out = Command::new(bin)
        .args([
            "bench",
            &target,
            "--ca",
            up.ca(),
            "--sni",
            "localhost",
            "--quiet",
        ])
        .args([
            "--resume", "none", "-n", "3000", "-c", "30", "--json", &json,
        ])
        .args(["--timeout", "10s"])
        .args(["--source-ip", "127.0.0.2", "--source-ip", "127.0.0.3"])
        .args(["--source-ip", "127.0.0.4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text_of(&out));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["requests"]["ok"].as_u64(), Some(3000), "{report}");
    assert_eq!(report["requests"]["failed"].as_u64(), Some(0), "{report}");
    assert_eq!(
        report["handshakes"]["full"].as_u64(),
        Some(3000),
        "{report}"
    );
    let full: Vec<f64> = (0..2)
        .map(|i| up.agent_sum(i, "baton_handshakes_total", "kind=\"full\""))
        .collect();
    assert_eq!(full[0] + full[1], 3000.0, "{full:?}");
    let (lo, hi) = (full[0].min(full[1]), full[0].max(full[1]));
    assert!(
        hi - lo <= bound * hi,
        "full handshakes per agent {full:?} (bound {bound}, release build: {})",
        release.is_some()
    );
    assert!(migrated_in(&up) > 0.0);
    assert_migrations_settle(&up);
    assert_eq!(up.agents_sum("baton_migration_failures_total", ""), 0.0);
}

struct Cluster {
    agents: Vec<Agent>,
    dir: TempDir,
    pki: Pki,
    /// The dispatcher's cluster key file.
    dispatcher_key: String,
}

/// Key lines with distinct ids (the first line of a file is the key that seals).
const K_DISPATCH: &str =
    "00000011 1111111111111111111111111111111111111111111111111111111111111111";
const K_AGENT0: &str = "00000022 2222222222222222222222222222222222222222222222222222222222222222";

/// Two agents run by hand (so one can be killed or stopped) with their links. With
/// `same_key` false, agent 0 seals with a key agent 1 lacks (each still authenticates its
/// link with the dispatcher): every session object agent 0 exports fails to open at agent 1.
fn agents(same_key: bool) -> Cluster {
    let pki = Pki::new();
    let dir = TempDir::new("handoff-agents");
    let (keys, dispatcher_key) = if same_key {
        let k = cluster_key_file(&dir, "k", &[K_DISPATCH]);
        ([k.clone(), k.clone()], k)
    } else {
        (
            [
                cluster_key_file(&dir, "k0", &[K_AGENT0, K_DISPATCH]),
                cluster_key_file(&dir, "k1", &[K_DISPATCH]),
            ],
            cluster_key_file(&dir, "kd", &[K_DISPATCH, K_AGENT0]),
        )
    };
    let tickets = key_file(&dir, "tickets");
    let agents = (0..2)
        .map(|i| {
            let mut args = pki.server_args();
            let id = i.to_string();
            args.extend(
                [
                    "--agent-id",
                    &id,
                    "--handoff",
                    "true",
                    "--link-listen",
                    "127.0.0.1:0",
                    "--cluster-key-file",
                    &keys[i],
                    "--ticket-key-file",
                    &tickets,
                    "--proxy-protocol",
                    "true",
                ]
                .map(String::from),
            );
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Agent::start(&args)
        })
        .collect();
    Cluster {
        agents,
        dir,
        pki,
        dispatcher_key,
    }
}

fn dispatcher(c: &Cluster) -> Dispatcher {
    let d = Dispatcher::start(
        &[&c.agents[0], &c.agents[1]],
        &[
            "--policy",
            "handoff",
            "--handoff-window",
            "0",
            "--cluster-key-file",
            &c.dispatcher_key,
            "--migration-timeout",
            "500ms",
            // a dead agent is noticed only when a connection to it fails
            "--health-interval",
            "60",
        ],
    );
    // both links up before the first client
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .agents
        .iter()
        .any(|a| a.metric("baton_link_connections_active") < 1.0)
    {
        assert!(Instant::now() < deadline, "links did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// A source address on 127/8 whose home is agent `home`.
fn source_with_home(home: usize) -> IpAddr {
    (2..250)
        .map(|i| IpAddr::from([127, 0, 0, i]))
        .find(|ip| baton_ops::affinity::slot(*ip, 2) == Some(home))
        .unwrap()
}

/// One full handshake from `src` (at home on agent 1) while the loads are level: it goes home
/// (the home first on a tie), so the next full handshake goes to agent 0, the least loaded, and
/// its session is offered to agent 1.
fn level_towards_agent_0(src: IpAddr, d: &Dispatcher, pki: &Pki, agents: &[Agent]) {
    let out = curl_from(src, d, pki, "/bytes/1");
    assert!(out.status.success(), "{}", text_of(&out));
    assert_eq!((agents[0].served(), agents[1].served()), (0, 1));
}

fn curl_from(src: IpAddr, d: &Dispatcher, pki: &Pki, path: &str) -> std::process::Output {
    let resolve = format!("localhost:{}:127.0.0.1", d.addr.port());
    let src = src.to_string();
    let url = format!("https://localhost:{}{path}", d.addr.port());
    curl(&[
        "--interface",
        &src,
        "--cacert",
        &pki.arg("ca.pem"),
        "--resolve",
        &resolve,
        &url,
    ])
}

#[test]
fn home_agent_dead_or_hung_the_handshake_agent_serves_it() {
    for fault in ["KILL", "STOP"] {
        let mut c = agents(true);
        let d = dispatcher(&c);
        // A client whose home is agent 1, its full handshake on agent 0: it migrates there.
        let src = source_with_home(1);
        level_towards_agent_0(src, &d, &c.pki, &c.agents);
        c.agents[1].signal(fault);
        let out = curl_from(src, &d, &c.pki, "/bytes/4321");
        assert!(out.status.success(), "{fault}: {}", text_of(&out));
        assert_eq!(out.stdout.len(), 4321);
        assert_eq!(
            c.agents[0].metric("baton_sessions_migrated_total{direction=\"out\"}"),
            0.0
        );
        if fault == "STOP" {
            // Hung past the timeout: the dispatcher fell back before any Ready...
            assert_eq!(
                c.agents[0].metric("baton_migration_failures_total{reason=\"fell_back\"}"),
                1.0
            );
            assert_eq!(
                d.metric("baton_dispatch_migrations_total{outcome=\"fell_back\"}"),
                1.0
            );
            // ...and the home agent, woken late, finds its import stream reset: it never
            // takes the session, so the request ran once and nobody encrypts twice.
            c.agents[1].signal("CONT");
            std::thread::sleep(Duration::from_millis(500));
            assert_eq!(
                c.agents[1].metric("baton_sessions_migrated_total{direction=\"in\"}"),
                0.0
            );
            assert_eq!(c.agents[1].served(), 1, "only the first client's request");
        } else {
            // Killed: its links close at once, the dispatcher has no link to send it to,
            // and the handshake agent keeps the client (declines) or falls back.
            let kept = c.agents[0].metric("baton_migration_failures_total{reason=\"fell_back\"}")
                + d.metric("baton_dispatch_migrations_total{outcome=\"declined\"}");
            assert!(kept >= 1.0);
        }
        assert_eq!(c.agents[0].served(), 1);
        let _ = c.agents[1].wait_exit(Duration::from_millis(10));
    }
}

#[test]
fn refused_session_objects_fall_back_and_the_client_never_notices() {
    // agent 0 seals with a key agent 1 does not have: every import fails to open
    let c = agents(false);
    let d = dispatcher(&c);
    let src = source_with_home(1);
    level_towards_agent_0(src, &d, &c.pki, &c.agents);
    let out = curl_from(src, &d, &c.pki, "/bytes/999");
    assert!(out.status.success(), "{}", text_of(&out));
    assert_eq!(out.stdout.len(), 999);
    assert_eq!(
        c.agents[1].metric("baton_migration_failures_total{reason=\"import_seal\"}"),
        1.0
    );
    assert_eq!(
        c.agents[0].metric("baton_migration_failures_total{reason=\"fell_back\"}"),
        1.0
    );
}

fn ring_of(path: &str) -> Arc<std::sync::RwLock<KeyRing>> {
    let ring = KeyRing::parse_key_file(
        &std::fs::read_to_string(path).unwrap(),
        std::time::Instant::now(),
    )
    .unwrap();
    Arc::new(std::sync::RwLock::new(ring))
}

/// A dispatcher's link to one agent, from the test.
struct TestLink {
    rt: tokio::runtime::Runtime,
    pool: baton_link::LinkPool,
}

impl TestLink {
    fn new(agent: &Agent, id: u16, key: &str) -> TestLink {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let pool = {
            let _g = rt.enter();
            baton_link::LinkPool::new(agent.link.unwrap(), id, ring_of(key), 1)
        };
        TestLink { rt, pool }
    }

    fn handle(&self) -> Option<baton_link::LinkHandle> {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Some(h) = self.pool.pick() {
                return Some(h);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Opens an import stream with `token`, sends `frame`, returns the stream and the frame
    /// the agent answers with.
    fn import(&self, token: [u8; 16], frame: &Frame) -> (baton_link::LinkStream, Option<Frame>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let h = self.handle().expect("link up");
        self.rt.block_on(async {
            let meta = baton_link::StreamMeta {
                source: SocketAddr::from(([127, 0, 0, 9], 5555)),
                destination: SocketAddr::from(([127, 0, 0, 1], 443)),
                token: Some(token),
                drain: false,
                shed: None,
                follows: false,
                reattach: None,
            };
            let mut s = h.open(meta).await.unwrap();
            s.write_all(&frame.to_bytes()).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            let answer = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return None;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if let Ok(split) = Splitter::new().split(&got) {
                        if split.frame.is_some() {
                            return split.frame;
                        }
                    }
                }
            })
            .await
            .unwrap_or(None);
            (s, answer)
        })
    }

    fn send(&self, s: &mut baton_link::LinkStream, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.rt.block_on(s.write_all(bytes)).unwrap();
    }
}

#[test]
fn home_agent_refuses_garbage_expired_misaddressed_rebound_and_replayed_sessions() {
    let c = agents(true);
    let key = c.dir.arg("k");
    let ring = ring_of(&key);
    let ring = ring.read().unwrap();
    let object = |home: u16, ttl_from: SystemTime| SessionObject {
        id: SessionObject::new_id(),
        home,
        expires_ms: SessionObject::expiry(ttl_from, DEFAULT_TTL),
        version: 0x0303,
        suite: 0xc02b,
        tx: DirectionState {
            seq: 1,
            key: vec![1; 16].into(),
            iv: [2; 12],
            secret: None,
        },
        rx: DirectionState {
            seq: 1,
            key: vec![3; 16].into(),
            iv: [4; 12],
            secret: None,
        },
        resumed: false,
        alpn: None,
        sni: None,
        client_subject: None,
        plaintext: Vec::new().into(),
    };
    let home = &c.agents[1];
    let link = TestLink::new(home, 1, &key);
    let link_id = link.handle().unwrap().id();
    let token = [7u8; 16];
    let binding = [&link_id[..], &token[..]].concat();
    let refused = |frame: Frame| link.import(token, &frame).1;
    assert_eq!(
        refused(Frame::Import(b"not a sealed session".to_vec())),
        Some(Frame::Refused(RefuseReason::Seal))
    );
    let long_ago = SystemTime::now() - DEFAULT_TTL - Duration::from_secs(5);
    let expired = object(1, long_ago).seal(&ring, 0, &binding).unwrap();
    assert_eq!(
        refused(Frame::Import(expired)),
        Some(Frame::Refused(RefuseReason::Expired))
    );
    let for_agent_0 = object(0, SystemTime::now())
        .seal(&ring, 0, &binding)
        .unwrap();
    assert_eq!(
        refused(Frame::Import(for_agent_0)),
        Some(Frame::Refused(RefuseReason::Seal))
    );
    let mut tampered = object(1, SystemTime::now())
        .seal(&ring, 0, &binding)
        .unwrap();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x80;
    assert_eq!(
        refused(Frame::Import(tampered)),
        Some(Frame::Refused(RefuseReason::Seal))
    );
    // bound to this link but another stream's token (copied off the wire to a new stream)
    let good = object(1, SystemTime::now())
        .seal(&ring, 0, &binding)
        .unwrap();
    assert_eq!(
        link.import([8; 16], &Frame::Import(good.clone())).1,
        Some(Frame::Refused(RefuseReason::Seal))
    );
    // Ready, but never committed: the stream goes away and the keys with it
    let (s, answer) = link.import(token, &Frame::Import(good.clone()));
    assert_eq!(answer, Some(Frame::Ready));
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while home.metric("baton_migration_failures_total{reason=\"uncommitted\"}") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the uncommitted import was not dropped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        refused(Frame::Import(good)),
        Some(Frame::Refused(RefuseReason::Replay))
    );
    // a fresh object, Ready, then Commit: imported
    let fresh = object(1, SystemTime::now())
        .seal(&ring, 0, &binding)
        .unwrap();
    let (mut s, answer) = link.import(token, &Frame::Import(fresh));
    assert_eq!(answer, Some(Frame::Ready));
    link.send(&mut s, &Frame::Commit.to_bytes());
    let deadline = Instant::now() + Duration::from_secs(5);
    while home.metric("baton_sessions_migrated_total{direction=\"in\"}") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the committed import was not taken"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        home.metric("baton_migration_failures_total{reason=\"import_seal\"}"),
        4.0
    );
}

#[test]
fn public_port_answers_handoff_frames_with_an_alert_never_an_import() {
    let c = agents(true);
    let agent = &c.agents[1];
    let mut s = TcpStream::connect(agent.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = Vec::new();
    baton_wire::proxy_v2::encode(
        &baton_wire::proxy_v2::ProxyHeader::Proxy {
            source: SocketAddr::from(([127, 0, 0, 9], 5555)),
            destination: agent.addr,
        },
        &mut head,
    );
    head.extend(Frame::Import(vec![1; 100]).to_bytes());
    s.write_all(&head).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got.first(), Some(&0x15), "a TLS alert record: {got:?}");
    assert!(Splitter::new()
        .split(&got)
        .map_or(true, |x| x.frame.is_none()));
    assert_eq!(
        agent.metric("baton_sessions_migrated_total{direction=\"in\"}"),
        0.0
    );
    assert_eq!(
        agent.metric("baton_migration_failures_total{reason=\"import_seal\"}"),
        0.0
    );
}

#[test]
fn link_port_without_the_cluster_key_gets_nothing_and_keeps_nothing() {
    let c = agents(true);
    let agent = &c.agents[0];
    // a first handshake message of the right shape that does not open: closed, no answer
    let mut s = TcpStream::connect(agent.link.unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s.write_all(&baton_link::auth::HEADER).unwrap();
    s.write_all(&[0, 48]).unwrap();
    s.write_all(&[0x5a; 48]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "the agent proved nothing to a peer without the key"
    );
    // a dispatcher with another key never gets a link
    let dir = TempDir::new("wrong-key");
    let wrong = key_file(&dir, "wrong");
    let link = TestLink::new(agent, 0, &wrong);
    assert!(link.handle().is_none());
    assert!(agent.metric("baton_link_auth_failures_total") >= 2.0);
    assert_eq!(agent.metric("baton_link_connections_active"), 0.0);
    assert_eq!(agent.metric("baton_link_streams_total"), 0.0);
    // and the agent still serves its own dispatcher
    let d = dispatcher(&c);
    let out = curl_from(source_with_home(0), &d, &c.pki, "/bytes/10");
    assert!(out.status.success(), "{}", text_of(&out));
}
