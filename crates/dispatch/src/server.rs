//! The dispatcher's tokio shell: accept, peek at the ClientHello (bounded, under a deadline),
//! ask the router, connect to the agent, replay what was read, and splice both ways. With the
//! `session` policy it also reads the agent's ServerHello on the way back to learn TLS 1.2
//! session ids. Every byte read from the client is forwarded unchanged: the parse is a peek.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_wire::proxy_v2::{self, ProxyHeader};
use baton_wire::{HelloReader, Progress, ServerHelloReader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::DispatchConfig;
use crate::metrics::{HelloOutcome, Metrics};
use crate::route::{Policy, Router};

pub(crate) struct Shared {
    pub(crate) config: DispatchConfig,
    router: Arc<Mutex<Router>>,
    pub(crate) metrics: Metrics,
}

impl Shared {
    /// The PROXY v2 header that opens a stream to an agent (`--proxy-protocol`), or nothing.
    pub(crate) fn proxy_head(&self, source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
        let mut head = Vec::with_capacity(64);
        if self.config.proxy_protocol {
            proxy_v2::encode(
                &ProxyHeader::Proxy {
                    source,
                    destination,
                },
                &mut head,
            );
        }
        head
    }

    pub(crate) fn router(&self) -> std::sync::MutexGuard<'_, Router> {
        self.router.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub async fn run(config: DispatchConfig) -> anyhow::Result<()> {
    let router = Arc::new(Mutex::new(Router::new(config.policy, config.agents.len())));
    // Machine-readable start-up lines on stdout: scripts and tests wait for `ready`.
    let (listeners, metrics_listener) =
        baton_ops::listen::open("dispatch", &config.listen, config.metrics)?;
    let shared = Arc::new(Shared {
        metrics: Metrics::new(config.agents.len()),
        router: router.clone(),
        config,
    });
    let stop = CancellationToken::new();
    tokio::spawn(crate::health::check_forever(
        shared.config.agents.clone(),
        router,
        shared.config.health_interval,
        shared.config.proxy_protocol,
    ));
    if let Some(l) = metrics_listener {
        let s = shared.clone();
        let render = Arc::new(move || {
            let r = s.router();
            s.metrics.render(|a| (r.is_healthy(a), r.active(a)))
        });
        tokio::spawn(baton_ops::serve_metrics(l, render, stop.clone()));
    }
    let tracker = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(shared.config.max_connections));
    for l in listeners {
        tokio::spawn(accept_loop(
            l,
            shared.clone(),
            permits.clone(),
            tracker.clone(),
            stop.clone(),
        ));
    }
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    stop.cancel();
    tracker.close();
    // Relayed connections carry on until their ends close, for a bounded time.
    let _ = tokio::time::timeout(Duration::from_secs(10), tracker.wait()).await;
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        let (client, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            shared.metrics.rejected();
            continue;
        };
        let _ = client.set_nodelay(true);
        let shared = shared.clone();
        tracker.spawn(async move {
            if let Err(e) = handle(client, peer, &shared).await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(permit);
        });
    }
}

/// Everything read from the client before the agent was chosen, and what it said.
struct FirstBytes {
    bytes: Vec<u8>,
    hello: Option<baton_wire::ClientHello>,
}

async fn handle(mut client: TcpStream, peer: SocketAddr, shared: &Shared) -> std::io::Result<()> {
    let cfg = &shared.config;
    let deadline = tokio::time::Instant::now() + cfg.hello_timeout;
    let mut source = peer;
    if cfg.accept_proxy_protocol {
        match tokio::time::timeout_at(deadline, baton_ops::proxy_header::read(&mut client)).await {
            Ok(Ok(Some(ProxyHeader::Proxy { source: s, .. }))) => source = s,
            Ok(Ok(_)) => return Ok(()), // LOCAL (a balancer's health check) or closed
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
    }
    let first = match tokio::time::timeout_at(deadline, read_hello(&mut client)).await {
        Ok(Ok(first)) => first,
        Ok(Err(e)) => {
            shared.metrics.hello(HelloOutcome::Closed);
            return Err(e);
        }
        Err(_) => {
            shared.metrics.hello(HelloOutcome::Timeout);
            return Ok(());
        }
    };
    shared
        .metrics
        .hello(match (&first.hello, first.bytes.len()) {
            (Some(_), _) => HelloOutcome::Parsed,
            (None, n) if n >= baton_wire::DEFAULT_MESSAGE_LIMIT => HelloOutcome::TooLarge,
            (None, _) => HelloOutcome::Unparsed,
        });

    // Route; if the chosen agent refuses the connection, mark it down and ask again once.
    let mut tries = 0;
    let (agent_idx, mut agent) = loop {
        let Some((idx, reason)) = shared.router().route(first.hello.as_ref(), source.ip()) else {
            shared.metrics.no_agent();
            return Ok(());
        };
        let addr = cfg.agents[idx];
        match tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                shared.metrics.routed(idx, reason);
                break (idx, s);
            }
            _ => {
                shared.metrics.connect_failed(idx);
                let mut r = shared.router();
                r.closed(idx);
                r.set_health(idx, false);
                drop(r);
                tries += 1;
                if tries >= cfg.agents.len().min(3) {
                    return Ok(());
                }
            }
        }
    };
    // `handoff`: a full handshake on an agent other than the client's home agent migrates.
    // `handoff`: every connection is offered, so its agent says when the handshake is over
    // (Freeze, or Decline when it is the home agent already): the router balances handshakes.
    let home = {
        let router = shared.router();
        match router.policy() {
            Policy::Handoff => Some(router.home_of(source.ip()).unwrap_or(agent_idx)),
            _ => None,
        }
    };
    if let Some(home_idx) = home {
        let _ = agent.set_nodelay(true);
        let destination = client.local_addr().unwrap_or(peer);
        let mut head = shared.proxy_head(source, destination);
        head.extend_from_slice(&baton_wire::handoff::Relay::offer(home_idx as u16));
        let result = match agent.write_all(&head).await {
            Ok(()) => {
                crate::handoff::relay(
                    &mut client,
                    agent,
                    agent_idx,
                    home_idx,
                    source,
                    destination,
                    &first.bytes,
                    shared,
                )
                .await
            }
            Err(e) => Err(e),
        };
        let ended_on = match result {
            Ok((idx, up, down)) => {
                shared.metrics.bytes(up, down);
                idx
            }
            Err(_) => agent_idx,
        };
        shared.router().closed(ended_on);
        return result.map(|_| ());
    }
    let result = relay(
        &mut client,
        &mut agent,
        peer,
        source,
        first,
        agent_idx,
        shared,
    )
    .await;
    shared.router().closed(agent_idx);
    result
}

/// Reads until a ClientHello is complete (or proves not to be one, or exceeds the bound).
async fn read_hello(client: &mut TcpStream) -> std::io::Result<FirstBytes> {
    let mut reader = HelloReader::new();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        bytes.extend_from_slice(&buf[..n]);
        match reader.push(&buf[..n]) {
            Ok(Progress::NeedMore) => continue,
            Ok(Progress::Done(hello, _)) => {
                return Ok(FirstBytes {
                    bytes,
                    hello: Some(hello),
                })
            }
            // Not a hello we can read: forward what we have and let the agent answer it.
            Err(_) => return Ok(FirstBytes { bytes, hello: None }),
        }
    }
}

async fn relay(
    client: &mut TcpStream,
    agent: &mut TcpStream,
    peer: SocketAddr,
    source: SocketAddr,
    first: FirstBytes,
    agent_idx: usize,
    shared: &Shared,
) -> std::io::Result<()> {
    let _ = agent.set_nodelay(true);
    let mut head = shared.proxy_head(source, client.local_addr().unwrap_or(peer));
    head.extend_from_slice(&first.bytes);
    agent.write_all(&head).await?;
    let mut to_client = 0u64;
    if shared.config.policy == Policy::Session {
        to_client = learn_session_id(agent, client, agent_idx, shared).await?;
    }
    let result = tokio::io::copy_bidirectional(client, agent).await;
    let (up, down) = result.as_ref().map_or((0, 0), |(u, d)| (*u, *d));
    shared
        .metrics
        .bytes(first.bytes.len() as u64 + up, to_client + down);
    result.map(|_| ())
}

/// Forwards the agent's first bytes to the client while reading its ServerHello; a TLS 1.2
/// session id in it is remembered for this agent. Returns the bytes forwarded.
async fn learn_session_id(
    agent: &mut TcpStream,
    client: &mut TcpStream,
    agent_idx: usize,
    shared: &Shared,
) -> std::io::Result<u64> {
    let mut reader = ServerHelloReader::new();
    let mut buf = [0u8; 4096];
    let mut forwarded = 0u64;
    let deadline = tokio::time::Instant::now() + shared.config.hello_timeout;
    loop {
        let n = match tokio::time::timeout_at(deadline, agent.read(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Ok(forwarded), // let the splice carry on; nothing learned
        };
        if n == 0 {
            return Ok(forwarded);
        }
        client.write_all(&buf[..n]).await?;
        forwarded += n as u64;
        match reader.push(&buf[..n]) {
            Ok(Progress::NeedMore) => continue,
            Ok(Progress::Done(sh, _)) => {
                if let Some(id) = sh.tls12_session_id() {
                    shared.router().learned_session_id(id, agent_idx);
                }
                return Ok(forwarded);
            }
            Err(_) => return Ok(forwarded),
        }
    }
}
