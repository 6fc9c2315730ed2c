//! Hardening findings 1, 3, 4 and 5 (issue 15) with real processes: a dispatcher's slots come
//! back from clients that go quiet, PROXY headers are believed only from the configured
//! networks, a client that trickles bytes cannot hold an agent's connection, and a ClientHello
//! in 1-byte records cannot make the dispatcher buffer more than its bound.
//!
//! Every wait here is bounded well below the old behaviour it tells apart from the new (held
//! for the agent's 60 s idle timeout, or forever), so a slow machine does not fail them.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_wire::proxy_v2::{self, ProxyHeader};
use common::*;

fn tls13(pki: &Pki) -> Arc<rustls::ClientConfig> {
    Arc::new(pki.client(&[&rustls::version::TLS13], None))
}

/// The first flight of a real rustls client: a ClientHello.
fn client_hello(pki: &Pki) -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(tls13(pki), name).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// A TLS connection whose handshake is done, then left silent by the client.
fn handshaken(
    addr: SocketAddr,
    pki: &Pki,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(tls13(pki), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

/// Reads until the peer closes or `limit` passes; how long it took, if it closed.
fn closed_within(s: &mut impl Read, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            // a reset, or TLS that ended without close_notify: closed all the same
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Finding 1: clients that send a ClientHello and go quiet used to hold their dispatcher slot
/// until they left, long after the agent gave up on them; with every slot taken, everyone
/// else was turned away at accept.
#[test]
fn quiet_clients_give_their_dispatcher_slots_back() {
    let pki = Pki::new();
    let agent = Agent::serving(&pki, &["--handshake-timeout", "1s"]);
    let dispatcher = Dispatcher::start(
        &[&agent],
        &["--max-connections", "3", "--half-close-timeout", "1"],
    );
    let hello = client_hello(&pki);
    let quiet: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(dispatcher.addr).unwrap();
            s.write_all(&hello).unwrap();
            s // held open, never read, never closed
        })
        .collect();
    // all three are at the agent: the dispatcher's slots are full
    wait_for("the quiet clients routed", Duration::from_secs(10), || {
        dispatcher.metric("baton_dispatch_hellos_total{outcome=\"parsed\"}") >= 3.0
    });
    // the agent's handshake timeout (1 s) ends its side; the dispatcher's half-close bound
    // (1 s) ends the rest; then a new client gets a slot
    std::thread::sleep(Duration::from_secs(3));
    let config = tls13(&pki);
    let mut served = None;
    for _ in 0..20 {
        match fetch(&dispatcher, &config, "/") {
            Ok(f) => {
                served = Some(f.status);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
    assert_eq!(served, Some(200), "the quiet clients still hold every slot");
    drop(quiet);
}

/// Finding 1: a spliced connection neither side speaks on is closed by the dispatcher's idle
/// timeout, not held until the agent's (60 s here).
#[test]
fn a_silent_splice_is_closed_by_the_dispatcher() {
    let pki = Pki::new();
    let agent = Agent::serving(&pki, &["--idle-timeout", "60s"]);
    let dispatcher = Dispatcher::start(&[&agent], &["--idle-timeout", "1"]);
    let mut tls = handshaken(dispatcher.addr, &pki);
    let took = closed_within(&mut tls, Duration::from_secs(20));
    assert!(took.is_some(), "the dispatcher kept a silent connection");
}

fn proxy_header(source: &str, destination: SocketAddr) -> Vec<u8> {
    let mut head = Vec::new();
    proxy_v2::encode(
        &ProxyHeader::Proxy {
            source: source.parse().unwrap(),
            destination,
        },
        &mut head,
    );
    head
}

/// Finding 3: a PROXY header names the client; from outside --proxy-protocol-from it is
/// refused, on the dispatcher and on the agent, and counted.
#[test]
fn proxy_headers_are_believed_only_from_configured_networks() {
    let pki = Pki::new();
    let config = tls13(&pki);
    let untrusted = Agent::serving(
        &pki,
        &[
            "--proxy-protocol",
            "true",
            "--proxy-protocol-from",
            "10.0.0.0/8",
        ],
    );
    let mut s = TcpStream::connect(untrusted.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(&proxy_header("203.0.113.7:4000", untrusted.addr));
    let _ = s.write_all(&client_hello(&pki));
    assert!(closed_within(&mut s, Duration::from_secs(10)).is_some());
    assert_eq!(untrusted.failures("untrusted_source"), 1);
    assert_eq!(untrusted.handshakes("1.3", "full"), 0);

    // loopback is trusted by default: the dispatcher in front sends headers from there
    let trusting = Agent::serving(&pki, &["--proxy-protocol", "true"]);
    let front = Dispatcher::start(&[&trusting], &["--proxy-protocol", "true"]);
    assert_eq!(fetch(&front, &config, "/").unwrap().status, 200);
    assert_eq!(trusting.failures("untrusted_source"), 0);

    // a dispatcher behind a balancer it does not trust refuses before reading anything
    let guarded = Dispatcher::start(
        &[&trusting],
        &[
            "--accept-proxy-protocol",
            "true",
            "--proxy-protocol-from",
            "192.0.2.0/24",
        ],
    );
    let mut s = TcpStream::connect(guarded.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(&proxy_header("203.0.113.7:4000", guarded.addr));
    assert!(closed_within(&mut s, Duration::from_secs(10)).is_some());
    wait_for("the refusal counted", Duration::from_secs(5), || {
        guarded.metric("baton_dispatch_proxy_refused_total") == 1.0
    });
    assert_eq!(
        guarded.metric("baton_dispatch_hellos_total{outcome=\"parsed\"}"),
        0.0
    );

    // from a trusted network (a second loopback address here) the header is used
    let open = Dispatcher::start(
        &[&trusting],
        &[
            "--accept-proxy-protocol",
            "true",
            "--proxy-protocol-from",
            "127.0.0.2/32",
            "--proxy-protocol",
            "true",
        ],
    );
    let mut s = socket_from("127.0.0.2", open.addr);
    s.write_all(&proxy_header("203.0.113.7:4000", open.addr))
        .unwrap();
    s.write_all(&client_hello(&pki)).unwrap();
    let mut first = [0u8; 5];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut first).unwrap();
    assert_eq!(first[0], 0x16, "a ServerHello record");
}

/// A TCP connection to `to` from source address `from` (any port).
fn socket_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(socket.connect(to)).unwrap();
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Finding 4: after the handshake, a partial TLS record sent one byte a second restarted the
/// idle timer forever; the first request's deadline now holds however the bytes come.
#[test]
fn a_trickled_record_cannot_hold_an_agent_connection() {
    let pki = Pki::new();
    let agent = Agent::serving(&pki, &["--request-timeout", "3s", "--idle-timeout", "60s"]);
    let mut tls = handshaken(agent.addr, &pki);
    tls.sock
        .set_read_timeout(Some(Duration::from_millis(900)))
        .unwrap();
    // an application-data record header promising 64 bytes, then one byte a second
    tls.sock.write_all(&[0x17, 0x03, 0x03, 0x00, 0x40]).unwrap();
    let start = Instant::now();
    let mut closed = false;
    while start.elapsed() < Duration::from_secs(15) {
        if tls.sock.write_all(&[0]).is_err() {
            closed = true;
            break;
        }
        let mut b = [0u8; 64];
        match tls.sock.read(&mut b) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(
        closed,
        "the agent kept a connection that never completed a request"
    );
    assert_eq!(
        agent.metric("baton_slow_requests_total{reason=\"deadline\"}"),
        1.0
    );
}

/// Finding 4: a request head sent one byte a second is cut by --min-header-rate (after its
/// grace), long before --header-timeout; a normal request on the same agent is served.
#[test]
fn a_request_head_below_the_minimum_rate_is_cut() {
    let pki = Pki::new();
    let agent = Agent::serving(
        &pki,
        &[
            "--header-timeout",
            "60s",
            "--request-timeout",
            "60s",
            "--min-header-rate",
            "512",
        ],
    );
    assert_eq!(fetch(&agent, &tls13(&pki), "/").unwrap().status, 200);
    let mut tls = handshaken(agent.addr, &pki);
    tls.sock
        .set_read_timeout(Some(Duration::from_millis(900)))
        .unwrap();
    let head = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let start = Instant::now();
    let mut closed = false;
    for b in head {
        if tls.write_all(&[*b]).and_then(|_| tls.flush()).is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 256];
        match tls.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => panic!("a response to a head that never completed"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    assert!(closed, "a head at one byte a second was kept");
    assert_eq!(
        agent.metric("baton_slow_requests_total{reason=\"rate\"}"),
        1.0
    );
}

/// Finding 5: the ClientHello bound counted payload, so 1-byte records (6 raw bytes each)
/// made the dispatcher buffer six times the bound for the whole hello timeout. Raw bytes are
/// capped now: past the bound the dispatcher stops reading and hands over what it has.
#[test]
fn a_hello_in_one_byte_records_is_cut_at_the_raw_bound() {
    let pki = Pki::new();
    let agent = Agent::serving(&pki, &[]);
    let dispatcher = Dispatcher::start(&[&agent], &["--hello-timeout", "60"]);
    let mut s = TcpStream::connect(dispatcher.addr).unwrap();
    // a handshake message header promising a 60,000-byte ClientHello, then its body, each
    // byte in a record of its own: 72 KiB on the wire carry only ~12 KiB of the hello
    let mut payload = vec![0x01, 0x00, 0xea, 0x60, 0x03, 0x03];
    payload.resize(12 * 1024, 0x2a);
    let mut wire = Vec::with_capacity(payload.len() * 6);
    for b in payload {
        wire.extend_from_slice(&[0x16, 0x03, 0x01, 0x00, 0x01, b]);
    }
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(&wire); // the dispatcher may stop reading part-way
    wait_for(
        "the dispatcher gave up on the hello",
        Duration::from_secs(10),
        || dispatcher.metric("baton_dispatch_hellos_total{outcome=\"too_large\"}") == 1.0,
    );
}
