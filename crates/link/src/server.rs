//! The agent's side: accept link connections, authenticate them, and hand out every client
//! stream they carry (a successor dispatcher's re-attach streams excepted: they go to the
//! stream that waits for them, see [`crate::rejoin`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use baton_session::SharedRing;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Mutex, Semaphore};

use baton_ops::cidr::Cidr;
use baton_ops::slots::{Slots, Table};

use crate::auth::{self, AgentHello, Refused};
use crate::driver::{Accepting, Driver, Shared};
use crate::mux::Role;
use crate::rejoin::Registry;
use crate::seal::Transport;
use crate::{LinkStats, LinkStream};

/// Link connections authenticating at once, and from one address: a newcomer pushes out the
/// oldest (of its own address first), so silent connections cannot keep a dispatcher out.
const MAX_AUTHENTICATING: usize = 64;
const AUTHENTICATING_PER_SOURCE: usize = 32;
/// Authenticated link connections at once (dispatchers x their connections per agent).
const MAX_LINKS: usize = 1024;
/// Streams accepted but not yet taken by the agent.
const QUEUE: usize = 4096;

pub struct LinkListener {
    streams: Mutex<mpsc::Receiver<LinkStream>>,
    stats: Arc<LinkStats>,
    draining: watch::Sender<bool>,
    registry: Arc<Registry>,
}

impl LinkListener {
    /// Serves link connections on `listener` for agent `agent_id`, authenticating with the
    /// cluster key `ring` (read at each handshake, so a reload takes effect). Connections from
    /// outside `allow` are closed at accept, unread (empty: from anywhere).
    pub fn new(listener: TcpListener, agent_id: u16, ring: SharedRing, allow: Vec<Cidr>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let stats = Arc::new(LinkStats::default());
        let registry = Arc::new(Registry::new(stats.clone()));
        let (draining, drain) = watch::channel(false);
        tokio::spawn(accept_loop(
            listener,
            agent_id,
            ring,
            allow,
            Links {
                tx,
                stats: stats.clone(),
                registry: registry.clone(),
            },
            drain,
        ));
        Self {
            streams: Mutex::new(rx),
            stats,
            draining,
            registry,
        }
    }

    /// How long a stream handed over by its dispatcher waits for the successor's re-attach
    /// stream before its reads and writes fail ([`REATTACH_TIMEOUT`](crate::REATTACH_TIMEOUT)
    /// unless set; for handovers that begin after the call).
    pub fn set_reattach_timeout(&self, timeout: Duration) {
        self.registry.set_timeout(timeout);
    }

    /// The agent is going away: tells every dispatcher so (a GOAWAY on each link:
    /// streams already opened are still delivered by [`accept`](Self::accept) and run to
    /// their end; new ones are refused before any byte of theirs is sent, so a dispatcher
    /// takes the client elsewhere) and stops accepting link connections. Streams already
    /// waiting for a handover's successor keep waiting, but a successor cannot reach a
    /// draining agent (no new link connections), so they fail at their deadline.
    pub fn drain(&self) {
        self.draining.send_replace(true);
    }

    /// The next client stream from any link; `None` once the listener is gone.
    pub async fn accept(&self) -> Option<LinkStream> {
        self.streams.lock().await.recv().await
    }

    pub fn stats(&self) -> Arc<LinkStats> {
        self.stats.clone()
    }
}

/// What every link connection of a listener shares.
#[derive(Clone)]
struct Links {
    tx: mpsc::Sender<LinkStream>,
    stats: Arc<LinkStats>,
    registry: Arc<Registry>,
}

async fn accept_loop(
    listener: TcpListener,
    agent_id: u16,
    ring: SharedRing,
    allow: Vec<Cidr>,
    shared: Links,
    drain: watch::Receiver<bool>,
) {
    let stats = shared.stats.clone();
    let authenticating = Slots::new(Table::new(MAX_AUTHENTICATING, AUTHENTICATING_PER_SOURCE, 0));
    let links = Arc::new(Semaphore::new(MAX_LINKS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            // Draining: no new links (the listener closes with this loop).
            _ = wait_drain(drain.clone()) => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "link accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        if shared.tx.is_closed() {
            return;
        }
        if !allow.is_empty() && !Cidr::any_contains(&allow, peer.ip()) {
            stats.disallowed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "link connection from outside --link-allow closed");
            continue;
        }
        let Some((auth_slot, evicted)) = authenticating.admit(peer.ip()) else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        stats.evicted.fetch_add(evicted as u64, Ordering::Relaxed);
        let Ok(link_permit) = links.clone().try_acquire_owned() else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        crate::tune(&tcp);
        let (ring, shared, stats, drain) =
            (ring.clone(), shared.clone(), stats.clone(), drain.clone());
        tokio::spawn(async move {
            let mut tcp = tcp;
            let authed = tokio::select! {
                a = tokio::time::timeout(
                    crate::AUTH_TIMEOUT,
                    authenticate(&mut tcp, agent_id, &ring, || auth_slot.heard()),
                ) => a.ok(),
                // pushed out by a newcomer: not authenticated in time to stay
                _ = auth_slot.evicted() => None,
            };
            drop(auth_slot);
            let (link_id, transport) = match authed {
                Some(Ok(done)) => done,
                failed => {
                    // None: timed out, or pushed out by a newcomer
                    let e = failed.and_then(Result::err);
                    let refused = e
                        .as_ref()
                        .and_then(|e| e.get_ref()?.downcast_ref::<Refused>());
                    if let Some(Refused::OtherVersion(_)) = refused {
                        tracing::info!(%peer, error = ?e, "link connection refused");
                    } else {
                        tracing::debug!(%peer, error = ?e, "link connection failed to authenticate");
                    }
                    stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            stats.connections.fetch_add(1, Ordering::Relaxed);
            let link = Shared::new(Role::Agent, link_id);
            let accepting = Accepting::new(
                shared.tx.clone(),
                shared.registry.clone(),
                stats.clone(),
                Box::pin(wait_drain(drain)),
            );
            if let Err(e) = Driver::new(tcp, transport, link, Some(accepting))
                .run()
                .await
            {
                tracing::debug!(%peer, error = %e, "link connection ended");
            }
            stats.connections.fetch_sub(1, Ordering::Relaxed);
            drop(link_permit);
        });
    }
}

/// The agent's half of the handshake; returns the link id and the link's keys. Nothing is
/// sent before the dispatcher's first message has opened with the cluster key.
/// `heard` runs once the peer has sent its first message's head.
async fn authenticate(
    tcp: &mut TcpStream,
    agent_id: u16,
    ring: &SharedRing,
    heard: impl FnOnce(),
) -> std::io::Result<([u8; 16], Transport)> {
    let first = read_message_then(tcp, heard).await?;
    let hello = AgentHello {
        agent_id,
        link_id: crate::token(),
    };
    let psks = auth::psks(&ring.read().unwrap_or_else(|p| p.into_inner()));
    let (reply, transport) = auth::respond(&psks, &first, &hello)?;
    drop(psks);
    tcp.write_all(&reply).await?;
    Ok((hello.link_id, transport))
}

/// One handshake message: its head checked, its Noise message returned.
pub(crate) async fn read_message(tcp: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    read_message_then(tcp, || {}).await
}

async fn read_message_then(tcp: &mut TcpStream, heard: impl FnOnce()) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; auth::HEAD_LEN];
    tcp.read_exact(&mut head).await?;
    heard();
    let len = auth::message_len(&head)?;
    let mut message = vec![0u8; len];
    tcp.read_exact(&mut message).await?;
    Ok(message)
}

/// Resolves once the agent drains (never, if the listener is gone without draining).
async fn wait_drain(mut drain: watch::Receiver<bool>) {
    if drain.wait_for(|d| *d).await.is_err() {
        std::future::pending::<()>().await;
    }
}
