//! The rustls floor (`scripts/bench-agent`): the leanest HTTPS server rustls + aws-lc-rs allow
//! on this machine, so that the agent's CPU per handshake can be read against what the TLS
//! library alone costs, not only against the crypto (`crypto_limit.rs`) and nginx.
//!
//! One thread, mio's poll and rustls' buffered `ServerConnection`; no runtime, no timers, no
//! HTTP library, no metrics, no limits: it answers the first request head on a connection
//! (anything ending in CRLF CRLF) with a fixed response of `BODY` bytes and
//! `Connection: close`, sends close_notify with it and closes. The TLS set-up is the agent's
//! by default: the same versions and cipher suites (aws-lc-rs, client order), two TLS 1.3
//! tickets and TLS 1.2 tickets from rustls' own ticketer, a session cache for TLS 1.2 session
//! ids. Not a server for anything else: a peer that stalls holds its connection for ever.
//!
//! Usage: rustls_floor CERT_PEM KEY_PEM [TLS_VERSIONS: 1.2,1.3] [BODY: 1024]
//! Prints `listening tls 127.0.0.1:PORT`, `listening stats 127.0.0.1:PORT` and `ready`, then
//! serves until killed. A connection to the stats port reads `full N resumed N`: the
//! handshakes of the requests answered so far (the stats socket is plain TCP, so asking
//! counts no handshake).
//!
//! `FLOOR_NO_TICKETS=1`: no stateless tickets, as the agent's `--tickets false` (TLS 1.2 then
//! resumes by session id from the cache, TLS 1.3 by stateful tickets).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ServerSessionMemoryCache;
use rustls::{ServerConfig, ServerConnection};

const LISTENER: Token = Token(usize::MAX);
const STATS: Token = Token(usize::MAX - 1);

struct Conn {
    tcp: TcpStream,
    tls: ServerConnection,
    /// The request head so far (only its end is looked for).
    head: Vec<u8>,
    answered: bool,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() >= 3,
        "usage: rustls_floor CERT_PEM KEY_PEM [1.2,1.3] [BODY]"
    );
    let versions = args.get(3).map(String::as_str).unwrap_or("1.2,1.3");
    let body = args.get(4).map(|b| b.parse()).transpose()?.unwrap_or(1024);
    let config = Arc::new(config(&args[1], &args[2], versions)?);
    let response = {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
             content-length: {body}\r\nconnection: close\r\n\r\n"
        )
        .into_bytes();
        r.resize(r.len() + body, b'x');
        r
    };

    let mut listener = TcpListener::bind("127.0.0.1:0".parse()?)?;
    let mut stats = TcpListener::bind("127.0.0.1:0".parse()?)?;
    println!("listening tls {}", listener.local_addr()?);
    println!("listening stats {}", stats.local_addr()?);
    println!("ready");
    io::stdout().flush()?;

    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    poll.registry()
        .register(&mut stats, STATS, Interest::READABLE)?;
    let mut events = Events::with_capacity(1024);
    let mut conns: HashMap<Token, Conn> = HashMap::new();
    let mut next = 0usize;
    // full and resumed handshakes answered so far: whoever measures checks what it measured
    let mut kinds = [0u64; 2];
    loop {
        poll.poll(&mut events, None)?;
        for event in events.iter() {
            if event.token() == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((mut tcp, _)) => {
                            tcp.set_nodelay(true)?;
                            let token = Token(next);
                            next = next.wrapping_add(1) % (usize::MAX - 2);
                            poll.registry().register(
                                &mut tcp,
                                token,
                                Interest::READABLE | Interest::WRITABLE,
                            )?;
                            let tls = ServerConnection::new(config.clone())?;
                            let conn = Conn {
                                tcp,
                                tls,
                                head: Vec::new(),
                                answered: false,
                            };
                            conns.insert(token, conn);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e.into()),
                    }
                }
                continue;
            }
            if event.token() == STATS {
                // one line to whoever connects (`full N resumed N`), then closed
                while let Ok((mut peer, _)) = stats.accept() {
                    let _ = writeln!(peer, "full {} resumed {}", kinds[0], kinds[1]);
                }
                continue;
            }
            let token = event.token();
            let Some(conn) = conns.get_mut(&token) else {
                continue;
            };
            let answered = conn.answered;
            let more = conn.ready(&response);
            if !answered && conn.answered {
                let resumed = conn.tls.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                kinds[usize::from(resumed)] += 1;
            }
            if !more {
                // closed on drop, which takes it out of the poll too (no deregister call)
                conns.remove(&token);
            }
        }
    }
}

impl Conn {
    /// Reads, answers and writes what it can; false when the connection is done.
    fn ready(&mut self, response: &[u8]) -> bool {
        // once answered, only what is left to send matters: nothing more is read, so a
        // client's close cannot cut a response still waiting for room in the socket
        if self.answered {
            return self.flush();
        }
        loop {
            match self.tls.read_tls(&mut self.tcp) {
                Ok(0) => return false,
                Ok(_) => {
                    if self.tls.process_new_packets().is_err() {
                        let _ = self.tls.write_tls(&mut self.tcp);
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        let mut buf = [0u8; 4096];
        loop {
            match self.tls.reader().read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.head.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        if self.head.windows(4).any(|w| w == b"\r\n\r\n") {
            self.answered = true;
            if self.tls.writer().write_all(response).is_err() {
                return false;
            }
            self.tls.send_close_notify();
        }
        self.flush()
    }

    /// Writes what rustls has queued; once answered and all written, the FIN. False when the
    /// connection is done.
    fn flush(&mut self) -> bool {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
        if self.answered {
            let _ = self.tcp.shutdown(std::net::Shutdown::Write);
            return false;
        }
        true
    }
}

fn config(cert: &str, key: &str, versions: &str) -> anyhow::Result<ServerConfig> {
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    // the agent's own `--tls-versions` parsing (its provider is metered, so not that)
    let names: Vec<String> = versions.split(',').map(String::from).collect();
    let wanted = baton_agent::parse_tls_versions(&names)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&wanted)?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.session_storage = ServerSessionMemoryCache::new(20_000);
    if std::env::var_os("FLOOR_NO_TICKETS").is_none() {
        config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    }
    config.send_tls13_tickets = 2;
    Ok(config)
}
