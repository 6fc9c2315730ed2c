//! The client floor (`scripts/bench-client-cost`): the leanest HTTPS client rustls + aws-lc-rs
//! allow on this machine, so that `baton bench`'s CPU per handshake can be read against what
//! the TLS library and the kernel alone cost, not only against h2load.
//!
//! One thread, mio's poll and rustls' buffered `ClientConnection`; no runtime, no timers, no
//! HTTP parsing, no statistics. Each connection makes a full TLS 1.3 handshake
//! (TLS_AES_128_GCM_SHA256, X25519, no resumption), sends `GET / HTTP/1.1` with
//! `Connection: close` in the segment of its Finished (as `baton bench` does), reads until the
//! server closes, answers with close_notify and closes. The server's certificate is not
//! checked (as `baton bench --insecure`), its handshake signature is. Not a client for
//! anything else: a server that stalls holds its connection for ever.
//!
//! Usage: client_floor HOST:PORT CONNECTIONS CLIENTS
//! Prints `ok N` (connections whose response began `HTTP/1.1 200`); exits 1 if any other.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

struct Conn {
    tcp: TcpStream,
    tls: ClientConnection,
    /// The first bytes of the response (enough to see its status).
    head: Vec<u8>,
}

enum Progress {
    More,
    /// The server closed; whether the response was a 200.
    Done(bool),
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 4,
        "usage: client_floor HOST:PORT CONNECTIONS CLIENTS"
    );
    let addr: SocketAddr = args[1].parse()?;
    let total: u64 = args[2].parse()?;
    let clients: usize = args[3].parse()?;
    let request = format!(
        "GET / HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
        args[1]
    );
    let config = Arc::new(config()?);
    // an address, as `baton bench https://IP:PORT/` has: no SNI
    let name = ServerName::IpAddress(addr.ip().into());

    let mut poll = Poll::new()?;
    let mut events = Events::with_capacity(1024);
    let mut slots: Vec<Option<Conn>> = (0..clients).map(|_| None).collect();
    let (mut started, mut finished, mut ok) = (0u64, 0u64, 0u64);
    let start = |slot: usize, poll: &Poll| -> anyhow::Result<Conn> {
        let mut tcp = TcpStream::connect(addr)?;
        tcp.set_nodelay(true)?;
        poll.registry().register(
            &mut tcp,
            Token(slot),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let mut tls = ClientConnection::new(config.clone(), name.clone())?;
        // handed over before the handshake: rustls sends it with the client's Finished
        tls.writer().write_all(request.as_bytes())?;
        Ok(Conn {
            tcp,
            tls,
            head: Vec::with_capacity(16),
        })
    };
    for (i, slot) in slots.iter_mut().enumerate() {
        if started < total {
            *slot = Some(start(i, &poll)?);
            started += 1;
        }
    }
    while finished < total {
        poll.poll(&mut events, None)?;
        for event in events.iter() {
            let i = event.token().0;
            let Some(conn) = slots[i].as_mut() else {
                continue;
            };
            match conn.ready() {
                Progress::More => continue,
                Progress::Done(good) => {
                    finished += 1;
                    ok += u64::from(good);
                    // closed on drop, which takes it out of the poll too
                    slots[i] = None;
                    if started < total {
                        slots[i] = Some(start(i, &poll)?);
                        started += 1;
                    }
                }
            }
        }
    }
    println!("ok {ok}");
    if ok != total {
        std::process::exit(1);
    }
    Ok(())
}

impl Conn {
    /// Writes, reads and writes again what it can.
    fn ready(&mut self) -> Progress {
        if self.flush().is_err() {
            return Progress::Done(false);
        }
        let mut eof = false;
        loop {
            match self.tls.read_tls(&mut self.tcp) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(_) => {
                    if self.tls.process_new_packets().is_err() {
                        return Progress::Done(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return Progress::Done(false),
            }
        }
        let mut buf = [0u8; 4096];
        let closed = loop {
            match self.tls.reader().read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => {
                    let want = 16 - self.head.len().min(16);
                    self.head.extend_from_slice(&buf[..n.min(want)]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break eof,
                // the TCP stream ended without close_notify: the response is still whole
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break true,
                Err(_) => return Progress::Done(false),
            }
        };
        if closed {
            self.tls.send_close_notify();
            let _ = self.flush();
            return Progress::Done(self.head.starts_with(b"HTTP/1.1 200"));
        }
        match self.flush() {
            Ok(()) => Progress::More,
            Err(_) => Progress::Done(false),
        }
    }

    /// Writes what rustls has queued, until the socket takes no more.
    fn flush(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // not connected yet: the writable event comes when it is
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// TLS 1.3 only, TLS_AES_128_GCM_SHA256 and X25519 only (what the cost benchmark's agent
/// accepts), no resumption, any certificate (its handshake signature checked).
fn config() -> anyhow::Result<ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites =
        vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256];
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let provider = Arc::new(provider);
    let verifier = baton_bench::any_certificate(provider.clone());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}
