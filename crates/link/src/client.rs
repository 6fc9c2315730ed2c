//! The dispatcher's side: a pool of authenticated link connections to one agent, kept up in
//! the background, on which client streams are opened.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use baton_session::SharedRing;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::auth::{Initiator, Refused};
use crate::driver::{Driver, Shared};
use crate::mux::Role;
use crate::seal::Transport;
use crate::stream::At;
use crate::{LinkStream, StreamMeta};

/// Reconnection backoff after a failed or lost link connection.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// One live link connection.
pub struct LinkHandle {
    link: Arc<Shared>,
}

impl Clone for LinkHandle {
    fn clone(&self) -> Self {
        self.link.lock().handles += 1;
        Self {
            link: self.link.clone(),
        }
    }
}

impl Drop for LinkHandle {
    fn drop(&mut self) {
        self.link.lock().handle_dropped();
    }
}

impl LinkHandle {
    fn new(link: Arc<Shared>) -> Self {
        link.lock().handles += 1;
        Self { link }
    }

    /// The link id the agent gave this connection.
    pub fn id(&self) -> [u8; 16] {
        self.link.link_id
    }

    /// Whether new streams may be opened on it (up, and the agent not going away).
    pub fn is_alive(&self) -> bool {
        self.link.alive.load(Ordering::Relaxed)
    }

    /// Opens a client stream on exactly this connection. Returns at once; the agent's answer
    /// is awaited by the stream's first read.
    pub async fn open(&self, meta: StreamMeta) -> std::io::Result<LinkStream> {
        let id = {
            let mut conn = self.link.lock();
            let id = conn.open(&meta);
            if !conn.open_for_streams() {
                self.link.alive.store(false, Ordering::Relaxed);
            }
            id?
        };
        let at = At {
            link: self.link.clone(),
            id,
        };
        Ok(LinkStream::client(at, meta))
    }
}

/// The link connections to one agent.
pub struct LinkPool {
    slots: Arc<Vec<Mutex<Option<LinkHandle>>>>,
    next: AtomicUsize,
    addr: SocketAddr,
}

impl LinkPool {
    /// Keeps `connections` links to the agent `agent_id` at `addr`, authenticated with the
    /// cluster key `ring`, reconnecting lost ones in the background. Call within a tokio
    /// runtime.
    pub fn new(addr: SocketAddr, agent_id: u16, ring: SharedRing, connections: usize) -> Self {
        let slots: Arc<Vec<_>> =
            Arc::new((0..connections.max(1)).map(|_| Mutex::new(None)).collect());
        for i in 0..slots.len() {
            tokio::spawn(keep_up(
                addr,
                agent_id,
                ring.clone(),
                Arc::downgrade(&slots),
                i,
            ));
        }
        Self {
            slots,
            next: AtomicUsize::new(0),
            addr,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A live connection, in turn among the live ones; `None` if none is up now.
    pub fn pick(&self) -> Option<LinkHandle> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).find_map(|k| {
            let slot = self.slots[(start + k) % n]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            slot.as_ref().filter(|h| h.is_alive()).cloned()
        })
    }

    /// Whether at least one connection is up.
    pub fn is_up(&self) -> bool {
        self.slots.iter().any(|s| {
            s.lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(LinkHandle::is_alive)
        })
    }
}

/// Keeps slot `i` filled with a live connection, for as long as the pool exists.
async fn keep_up(
    addr: SocketAddr,
    agent_id: u16,
    ring: SharedRing,
    slots: Weak<Vec<Mutex<Option<LinkHandle>>>>,
    i: usize,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        match connect(addr, agent_id, &ring).await {
            Ok((handle, driver)) => {
                backoff = BACKOFF_MIN;
                // The pool is gone: so is this keeper (its connection with it).
                let Some(s) = slots.upgrade() else { return };
                *s[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
                drop(s);
                if let Err(e) = driver.run().await {
                    tracing::debug!(%addr, error = %e, "agent link lost");
                }
                let Some(s) = slots.upgrade() else { return };
                *s[i].lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
            Err(e) => {
                // An agent of another build is a deployment mistake: said loudly.
                let other_version = e
                    .get_ref()
                    .and_then(|e| e.downcast_ref::<Refused>())
                    .is_some_and(|r| matches!(r, Refused::OtherVersion(_)));
                if other_version {
                    tracing::warn!(%addr, error = %e, "agent link refused");
                } else {
                    tracing::debug!(%addr, error = %e, "agent link connect failed");
                }
            }
        }
        if slots.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn connect(
    addr: SocketAddr,
    agent_id: u16,
    ring: &SharedRing,
) -> std::io::Result<(LinkHandle, Driver)> {
    let timeout = |_| std::io::Error::from(std::io::ErrorKind::TimedOut);
    let mut tcp = tokio::time::timeout(crate::AUTH_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(timeout)??;
    crate::tune(&tcp);
    let (link_id, transport) =
        tokio::time::timeout(crate::AUTH_TIMEOUT, authenticate(&mut tcp, agent_id, ring))
            .await
            .map_err(timeout)??;
    let link = Shared::new(Role::Dispatcher, link_id);
    let handle = LinkHandle::new(link.clone());
    Ok((handle, Driver::new(tcp, transport, link, None)))
}

/// The dispatcher's half of the handshake; returns the agent's link id and the link's keys.
async fn authenticate(
    tcp: &mut TcpStream,
    agent_id: u16,
    ring: &SharedRing,
) -> std::io::Result<([u8; 16], Transport)> {
    let (initiator, first) = {
        let ring = ring.read().unwrap_or_else(|p| p.into_inner());
        Initiator::start(&ring)?
    };
    tcp.write_all(&first).await?;
    let reply = crate::server::read_message(tcp).await?;
    let (hello, transport) = initiator.finish(&reply, agent_id)?;
    Ok((hello.link_id, transport))
}
