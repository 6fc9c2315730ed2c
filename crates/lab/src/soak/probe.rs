//! The listeners' legitimate peers, checked once a second while the load runs (and so while
//! the attacker floods them): each a [`Check`] that attribution (`account.rs`) excuses only by
//! a fault on a process it names.
//!
//! - every metrics endpoint: a scrape (`GET /metrics`, a 200 with a page);
//! - the dispatcher's admin endpoint: `GET /agents` with the token, a 200;
//! - every agent's TLS listener: a request of its own (a PROXY header, as a balancer sends, a
//!   TLS handshake and `GET /`, a 200);
//! - side A's links: the agent's scrape counts the dispatcher's link connections
//!   (`baton_link_connections_active`), all of them up;
//! - side B's replication: the agent's scrape shows sessions received from its peers
//!   (`baton_session_store_events_total{event="received"}`) in the last [`REPLICATION_WINDOW`].
//!
//! The load's own requests are the dispatcher's and HAProxy's legitimate peer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_ops::guard::Token;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::account::{Check, Process};
use super::schedule::Side;

/// A check slower than this failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Replication must have brought a session in this long.
pub const REPLICATION_WINDOW: Duration = Duration::from_secs(5);
/// A PROXY v2 header of command LOCAL: what a balancer's health check sends (no address).
const PROXY_LOCAL: [u8; 16] = [
    0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a, 0x20, 0x00, 0x00, 0x00,
];

/// What to check on one listener.
#[derive(Clone)]
pub enum Probe {
    /// A metrics endpoint of `process`; an agent's page also tells about its links (side A,
    /// `links` of them expected) or its replication (side B).
    Metrics {
        process: Process,
        addr: SocketAddr,
        links: usize,
    },
    /// The dispatcher's admin endpoint.
    Admin { addr: SocketAddr, token: Arc<Token> },
    /// An agent's TLS listener.
    Tls {
        process: Process,
        addr: SocketAddr,
        roots: Arc<rustls::RootCertStore>,
    },
}

/// Checks `probe` once a second from `t0` until `until`; every check into `out`.
pub async fn run(probe: Probe, t0: Instant, until: Instant, out: Arc<Mutex<Vec<Check>>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // (when, sessions received) of an agent of side B
    let mut received: VecDeque<(Duration, f64)> = VecDeque::new();
    while Instant::now() < until {
        tick.tick().await;
        let start = t0.elapsed();
        let checks = match &probe {
            Probe::Metrics {
                process,
                addr,
                links,
            } => metrics(*process, *addr, *links, start, t0, &mut received).await,
            Probe::Admin { addr, token } => {
                let (addr, token) = (*addr, token.clone());
                let r = tokio::task::spawn_blocking(move || {
                    baton_cluster::client::http(addr, &token, "GET", "/agents", "", CHECK_TIMEOUT)
                })
                .await;
                let error = match r {
                    Ok(Ok((200, _))) => None,
                    Ok(Ok((status, _))) => Some(format!("status {status}")),
                    Ok(Err(e)) => Some(short(&format!("{e:#}"))),
                    Err(e) => Some(e.to_string()),
                };
                vec![check("admin", vec![Process::Dispatcher], start, t0, error)]
            }
            Probe::Tls {
                process,
                addr,
                roots,
            } => {
                let r = tokio::time::timeout(CHECK_TIMEOUT, tls(*addr, roots)).await;
                let error = match r {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(_) => Some("timeout".into()),
                };
                vec![check(
                    &listener("tls", *process),
                    vec![*process],
                    start,
                    t0,
                    error,
                )]
            }
        };
        out.lock().unwrap().extend(checks);
    }
}

fn check(
    listener: &str,
    on: Vec<Process>,
    start: Duration,
    t0: Instant,
    error: Option<String>,
) -> Check {
    Check {
        listener: listener.into(),
        on,
        start,
        end: t0.elapsed(),
        error,
    }
}

/// A listener's name as the attacker knows it: `metrics A0`, `link B2`, `metrics dispatcher`.
pub fn listener(kind: &str, p: Process) -> String {
    match p {
        Process::Agent(side, i) => format!("{kind} {side}{i}"),
        Process::Dispatcher => format!("{kind} dispatcher"),
        other => format!("{kind} {other}"),
    }
}

/// An error without the addresses and causes that make every line different.
fn short(e: &str) -> String {
    let e = e.rsplit(": ").next().unwrap_or(e);
    e.chars().take(60).collect()
}

async fn metrics(
    process: Process,
    addr: SocketAddr,
    links: usize,
    start: Duration,
    t0: Instant,
    received: &mut VecDeque<(Duration, f64)>,
) -> Vec<Check> {
    let page = tokio::time::timeout(
        CHECK_TIMEOUT,
        tokio::task::spawn_blocking(move || baton_bench::scrape::page_blocking(addr)),
    )
    .await;
    let page = match page {
        Ok(Ok(Ok(p))) => p,
        Ok(Ok(Err(e))) => {
            let error = Some(short(&format!("{e:#}")));
            return vec![check(
                &listener("metrics", process),
                vec![process],
                start,
                t0,
                error,
            )];
        }
        Ok(Err(e)) => {
            let error = Some(e.to_string());
            return vec![check(
                &listener("metrics", process),
                vec![process],
                start,
                t0,
                error,
            )];
        }
        Err(_) => {
            let error = Some("timeout".into());
            return vec![check(
                &listener("metrics", process),
                vec![process],
                start,
                t0,
                error,
            )];
        }
    };
    let mut out = vec![check(
        &listener("metrics", process),
        vec![process],
        start,
        t0,
        None,
    )];
    let samples = baton_bench::scrape::samples(&page);
    match process {
        Process::Agent(Side::A, _) => {
            let have = baton_bench::scrape::sum(&samples, "baton_link_connections_active", &[]);
            let error = (have < links as f64)
                .then(|| format!("{have} of {links} links from the dispatcher"));
            // the dispatcher's links to this agent: either end's fault can cut them
            let on = vec![process, Process::Dispatcher];
            out.push(check(&listener("link", process), on, start, t0, error));
        }
        Process::Agent(Side::B, _) => {
            let now = baton_bench::scrape::sum(
                &samples,
                "baton_session_store_events_total",
                &[("event", "received")],
            );
            // a restarted agent counts from zero: its history starts again
            if received.back().is_some_and(|(_, v)| now < *v) {
                received.clear();
            }
            received.push_back((start, now));
            while received.len() > 1 && start - received[1].0 >= REPLICATION_WINDOW {
                received.pop_front();
            }
            let (since, before) = received[0];
            if start - since >= REPLICATION_WINDOW {
                let error = (now <= before).then(|| {
                    format!(
                        "no session from its peers in {} s",
                        REPLICATION_WINDOW.as_secs()
                    )
                });
                // every agent of B feeds every other
                let on = (0..super::schedule::AGENTS)
                    .map(|i| Process::Agent(Side::B, i))
                    .collect();
                let mut c = check(&listener("peer", process), on, start, t0, error);
                c.start = since;
                out.push(c);
            }
        }
        _ => {}
    }
    out
}

/// A PROXY header, a TLS handshake and `GET /` on `addr`: a 200, or why not.
async fn tls(addr: SocketAddr, roots: &Arc<rustls::RootCertStore>) -> Result<(), String> {
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {:?}", e.kind()))?;
    tcp.write_all(&PROXY_LOCAL)
        .await
        .map_err(|e| format!("proxy header {:?}", e.kind()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").expect("a valid name");
    let mut s = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake {:?}", e.kind()))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("request {:?}", e.kind()))?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head)
        .await
        .map_err(|e| format!("response {:?}", e.kind()))?;
    if &head[..] != b"HTTP/1.1 200" {
        return Err(format!("status {}", String::from_utf8_lossy(&head[9..])));
    }
    Ok(())
}
