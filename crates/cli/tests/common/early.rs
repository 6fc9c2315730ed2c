//! TLS 1.3 0-RTT from the client's side: an upstream that records what it executed, a rustls
//! client that sends its request as early data and keeps its first flight (to replay it byte
//! for byte), and the agents' early-data counters.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::{ClientConfig, ClientConnection};

use super::{Agent, Pki};

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub early: bool,
}

/// A plain HTTP/1.1 upstream that records every request (method, path, `Early-Data`) and
/// answers 200 `ok`: what reached it is what was executed.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let s = s.clone();
                std::thread::spawn(move || serve_upstream(conn, s));
            }
        });
        Upstream { addr, seen }
    }

    pub fn arg(&self) -> String {
        format!("--upstream=http://{}", self.addr)
    }

    pub fn requests(&self, path: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

fn serve_upstream(mut conn: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or("").split(' ');
        let method = first.next().unwrap_or("").to_string();
        let path = first.next().unwrap_or("").to_string();
        let mut early = false;
        let mut length = 0usize;
        for l in lines {
            let (k, v) = l.split_once(':').unwrap_or((l, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "early-data" => early = v.trim() == "1",
                "content-length" => length = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        while buf.len() < end + 4 + length {
            match conn.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + length);
        seen.lock().unwrap().push(Seen {
            method,
            path,
            early,
        });
        if conn
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

/// A TLS 1.3 client config trusting `pki`, with early data enabled (rustls' own session
/// store: each ticket offered once).
pub fn early_client(pki: &Pki) -> Arc<ClientConfig> {
    let mut c = pki.client(&[&rustls::version::TLS13], None);
    c.enable_early_data = true;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(c)
}

/// What one connection did.
pub struct Outcome {
    /// Bytes of the request written as early data (0: the ticket allowed none, or no ticket).
    pub early_written: usize,
    pub accepted: bool,
    pub resumed: bool,
    pub status: u16,
    /// Everything the client sent before reading anything: ClientHello and early data.
    pub first_flight: Vec<u8>,
}

/// The first flight's size only: its bytes would drown a failure's message.
impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("early_written", &self.early_written)
            .field("accepted", &self.accepted)
            .field("resumed", &self.resumed)
            .field("status", &self.status)
            .field("first_flight_bytes", &self.first_flight.len())
            .finish()
    }
}

/// A connection kept open after its first response.
pub type Kept = rustls::StreamOwned<ClientConnection, TcpStream>;

/// One connection: the request as early data where the session allows it, else (or when
/// the server refused it) after the handshake, as a browser does; then its response.
pub fn request(addr: SocketAddr, config: &Arc<ClientConfig>, req: &[u8]) -> Outcome {
    request_kept(addr, config, req).0
}

/// [`request`], and the connection, open for more.
pub fn request_kept(addr: SocketAddr, config: &Arc<ClientConfig>, req: &[u8]) -> (Outcome, Kept) {
    let mut conn = ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap();
    let early_written = match conn.early_data() {
        Some(mut early) => early.write(req).unwrap(),
        None => 0,
    };
    let mut first_flight = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut first_flight).unwrap();
    }
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.write_all(&first_flight).unwrap();
    if early_written > 0 {
        // Hold the client's Finished back until the server has answered what came in early
        // data, as it does over a real network (its answer comes a round trip before our
        // Finished could reach it); on loopback the Finished could otherwise overtake the
        // request inside the server, which then need not mark it.
        loop {
            if conn.read_tls(&mut tcp).unwrap() == 0 {
                break;
            }
            let state = conn.process_new_packets().unwrap();
            if !conn.is_handshaking()
                && (!conn.is_early_data_accepted() || state.plaintext_bytes_to_read() > 0)
            {
                break;
            }
        }
    }
    while conn.is_handshaking() || conn.wants_write() {
        conn.complete_io(&mut tcp).unwrap();
    }
    let accepted = conn.is_early_data_accepted();
    let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let sent = if accepted { early_written } else { 0 };
    stream.write_all(&req[sent..]).unwrap();
    let status = read_response(&mut stream);
    let outcome = Outcome {
        early_written,
        accepted,
        resumed,
        status,
        first_flight,
    };
    (outcome, stream)
}

/// Reads one response (head and Content-Length body); its status.
pub fn read_response(s: &mut impl Read) -> u16 {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let status = head.split(' ').nth(1).unwrap().parse().unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "response cut short");
                buf.extend_from_slice(&chunk[..n]);
            }
            return status;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "no response");
        buf.extend_from_slice(&chunk[..n]);
    }
}

pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").into_bytes()
}

/// Sends captured bytes as they are (an attacker replaying a ClientHello and its early data)
/// and reads what comes back for a while; the attacker cannot go further (no key share secret).
pub fn replay_raw(addr: SocketAddr, bytes: &[u8]) -> usize {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    tcp.write_all(bytes).unwrap();
    let mut got = 0;
    let mut buf = [0u8; 8192];
    while let Ok(n) = tcp.read(&mut buf) {
        if n == 0 {
            break;
        }
        got += n;
    }
    got
}

/// `baton_early_data_total{result="..."}` of an agent.
pub fn early(agent: &Agent, result: &str) -> u64 {
    agent.metric(&format!("baton_early_data_total{{result=\"{result}\"}}")) as u64
}

/// Waits until `f` holds (the upstream and the metrics see things a little after the client).
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits out the quarantine that agents' first connection to a shared store starts (their
/// takes are not exclusive until it ends, so they accept no early data): call it once the
/// agents are up.
pub fn store_quarantine_over() {
    std::thread::sleep(baton_session::redis::RECONNECT_QUARANTINE + Duration::from_secs(1));
}
