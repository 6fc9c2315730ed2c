//! The soak's load: open-loop requests at a fixed rate, one request per TLS connection, each
//! recorded with its start, end, outcome and error kind (what attribution needs, and what
//! `baton bench`'s aggregate report does not keep).
//!
//! A pool of virtual clients, each with its own session cache and source address
//! (127.0.0.2-9, so the dispatcher's homes spread over the agents), half TLS 1.3 and half
//! TLS 1.2. A client's every third connection starts with an empty cache (a full handshake by
//! intent); the others offer the session of its previous one. The cache is wrapped to record
//! whether a session was really offered, so a full handshake after an offer is a miss the
//! servers caused, never the client.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rustls::client::{ClientSessionMemoryCache, ClientSessionStore};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, NamedGroup};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::account::{Outcome, Request};
use super::schedule::Side;

/// How long one request may take, end to end: above a 5 s SIGSTOP with room to spare.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Virtual clients at the start (more are made while all are busy, e.g. during a SIGSTOP).
const CLIENTS: u64 = 48;

/// The load on one side.
pub struct Load {
    pub side: Side,
    pub addr: SocketAddr,
    /// Requests per second.
    pub rate: f64,
    /// Requests in flight at most; a tick beyond it is counted as skipped, not sent.
    pub max_in_flight: u64,
    pub roots: Arc<rustls::RootCertStore>,
}

pub fn roots(ca: &Path) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in
        CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))?
    {
        roots.add(c?)?;
    }
    Ok(Arc::new(roots))
}

/// What a load run recorded.
#[derive(Default)]
pub struct Recorded {
    pub requests: Vec<Request>,
    /// Ticks not sent because `max_in_flight` requests were still open.
    pub skipped: u64,
}

/// A session cache that remembers whether the last handshake was offered a session.
#[derive(Debug)]
struct Watched {
    inner: ClientSessionMemoryCache,
    offered: AtomicBool,
}

impl ClientSessionStore for Watched {
    fn set_kx_hint(&self, n: ServerName<'static>, g: NamedGroup) {
        self.inner.set_kx_hint(n, g)
    }
    fn kx_hint(&self, n: &ServerName<'_>) -> Option<NamedGroup> {
        self.inner.kx_hint(n)
    }
    fn set_tls12_session(
        &self,
        n: ServerName<'static>,
        v: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(n, v)
    }
    fn tls12_session(&self, n: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        let v = self.inner.tls12_session(n);
        if v.is_some() {
            self.offered.store(true, Ordering::SeqCst);
        }
        v
    }
    fn remove_tls12_session(&self, n: &ServerName<'static>) {
        self.inner.remove_tls12_session(n)
    }
    fn insert_tls13_ticket(
        &self,
        n: ServerName<'static>,
        v: rustls::client::Tls13ClientSessionValue,
    ) {
        self.inner.insert_tls13_ticket(n, v)
    }
    fn take_tls13_ticket(
        &self,
        n: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        let v = self.inner.take_tls13_ticket(n);
        if v.is_some() {
            self.offered.store(true, Ordering::SeqCst);
        }
        v
    }
}

/// One virtual client.
struct Client {
    src: IpAddr,
    tls13: bool,
    uses: u64,
    config: Arc<ClientConfig>,
    store: Arc<Watched>,
}

fn fresh(roots: &Arc<rustls::RootCertStore>, tls13: bool) -> (Arc<ClientConfig>, Arc<Watched>) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS12]
    };
    let store = Arc::new(Watched {
        inner: ClientSessionMemoryCache::new(8),
        offered: AtomicBool::new(false),
    });
    let mut c = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("rustls supports TLS 1.2 and 1.3")
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    c.resumption = rustls::client::Resumption::store(store.clone());
    (Arc::new(c), store)
}

/// Runs the load from `t0` until `until`; returns every request, in order of completion.
pub async fn run(load: Load, t0: Instant, until: Instant) -> Recorded {
    let load = Arc::new(load);
    let created = Arc::new(AtomicU64::new(0));
    let new_client = |n: u64| {
        let tls13 = n.is_multiple_of(2);
        let (config, store) = fresh(&load.roots, tls13);
        Client {
            src: IpAddr::from([127, 0, 0, 2 + (n % 8) as u8]),
            tls13,
            uses: 0,
            config,
            store,
        }
    };
    let pool: Vec<Client> = (0..CLIENTS)
        .map(|_| new_client(created.fetch_add(1, Ordering::SeqCst)))
        .collect();
    let idle: Arc<Mutex<Vec<Client>>> = Arc::new(Mutex::new(pool));
    let in_flight = Arc::new(AtomicU64::new(0));
    let out: Arc<Mutex<Recorded>> = Arc::default();
    let period = Duration::from_secs_f64(1.0 / load.rate);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    while Instant::now() < until {
        tick.tick().await;
        while tasks.try_join_next().is_some() {}
        if in_flight.load(Ordering::SeqCst) >= load.max_in_flight {
            out.lock().unwrap().skipped += 1;
            continue;
        }
        // a client not busy with another request (so its session is there to offer)
        let popped = idle.lock().unwrap().pop();
        let mut client =
            popped.unwrap_or_else(|| new_client(created.fetch_add(1, Ordering::SeqCst)));
        if client.uses % 3 == 2 {
            (client.config, client.store) = fresh(&load.roots, client.tls13);
        }
        client.uses += 1;
        in_flight.fetch_add(1, Ordering::SeqCst);
        let (load, idle, in_flight, out) =
            (load.clone(), idle.clone(), in_flight.clone(), out.clone());
        tasks.spawn(async move {
            client.store.offered.store(false, Ordering::SeqCst);
            let start = t0.elapsed();
            let mut local = None;
            let result = tokio::time::timeout(
                REQUEST_TIMEOUT,
                one(&load, client.src, &client.config, &mut local),
            )
            .await;
            let end = t0.elapsed();
            let outcome = match result {
                Ok(Ok(resumed)) => Outcome::Ok {
                    offered: client.store.offered.load(Ordering::SeqCst),
                    resumed,
                },
                Ok(Err(kind)) => Outcome::Failed(kind),
                Err(_) => Outcome::Failed("timeout (15 s)".into()),
            };
            out.lock().unwrap().requests.push(Request {
                side: load.side,
                start,
                end,
                outcome,
                local,
                served_by: None,
            });
            idle.lock().unwrap().insert(0, client);
            in_flight.fetch_sub(1, Ordering::SeqCst);
        });
    }
    while tasks.join_next().await.is_some() {}
    let mut r = std::mem::take(&mut *out.lock().unwrap());
    r.requests.sort_by_key(|q| q.start);
    r
}

/// One connection, one `GET /`: `Ok(resumed)` or the error kind; `local` is set to the
/// connection's own address once bound.
async fn one(
    load: &Load,
    src: IpAddr,
    config: &Arc<ClientConfig>,
    local: &mut Option<SocketAddr>,
) -> Result<bool, String> {
    let sock = tokio::net::TcpSocket::new_v4().map_err(|e| format!("socket {:?}", e.kind()))?;
    sock.bind(SocketAddr::new(src, 0))
        .map_err(|e| format!("bind {:?}", e.kind()))?;
    *local = sock.local_addr().ok();
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, sock.connect(load.addr)).await {
        Err(_) => return Err("connect timeout".into()),
        Ok(Err(e)) => return Err(io_kind("connect", &e)),
        Ok(Ok(s)) => s,
    };
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from("localhost").expect("a valid name");
    let mut tls = TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| io_kind("handshake", &e))?;
    let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| io_kind("request", &e))?;
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    let (status, body_at, len) = loop {
        let n = tls
            .read(&mut chunk)
            .await
            .map_err(|e| io_kind("response", &e))?;
        if n == 0 {
            return Err("response eof".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..h]).to_ascii_lowercase();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<u16>().ok())
                .unwrap_or(0);
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            break (status, h + 4, len);
        }
        if buf.len() > 64 << 10 {
            return Err("response head too long".into());
        }
    };
    if status != 200 {
        return Err(format!("status {status}"));
    }
    let Some(len) = len else {
        return Err("no content-length".into());
    };
    while buf.len() < body_at + len {
        let n = tls
            .read(&mut chunk)
            .await
            .map_err(|e| io_kind("body", &e))?;
        if n == 0 {
            return Err("body eof".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(resumed)
}

/// `phase` and a short name for what went wrong.
fn io_kind(phase: &str, e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    let what = match e.kind() {
        ConnectionRefused => "refused".to_string(),
        ConnectionReset => "reset".into(),
        ConnectionAborted => "aborted".into(),
        UnexpectedEof => "eof".into(),
        BrokenPipe => "broken pipe".into(),
        TimedOut => "timeout".into(),
        InvalidData => match e.get_ref() {
            // a rustls error: its variant name without the details
            Some(inner) => {
                let s = inner.to_string();
                format!("tls: {}", s.split([':', '(']).next().unwrap_or(&s).trim())
            }
            None => "invalid data".into(),
        },
        k => format!("{k:?}"),
    };
    format!("{phase} {what}")
}
