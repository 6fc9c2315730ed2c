//! `--store peers`: every agent keeps every session. New sessions go into the local store at
//! once (the handshake never waits) and are queued, per peer, to a sender task that streams them
//! over the sealed channel of `replication.rs`; a listener applies what peers send.
//!
//! Queues are bounded: when a peer is down or slow its queue fills and further sessions for it
//! are dropped and counted. That peer then misses those sessions (a client landing there pays a
//! full handshake), which is the right trade for a cache: handshakes never block on a peer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use zeroize::Zeroizing;

use crate::memory::MemoryStore;
use crate::replication::{Inbound, Message, Outbound, CHALLENGE_LEN, HELLO_LEN};
use crate::store::{SessionStore, StoreStats};
use crate::ticket::KeyRing;

/// Messages waiting for one peer, at most.
pub const QUEUE_LEN: usize = 4096;
/// Inbound peer connections served at once, at most.
const MAX_INBOUND: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of the peer store.
#[derive(Debug, Clone)]
pub struct PeersConfig {
    pub agent_id: u16,
    /// Where this agent accepts its peers' replication connections.
    pub listen: SocketAddr,
    /// The other agents' replication addresses.
    pub peers: Vec<SocketAddr>,
    pub capacity: usize,
    pub ttl: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    rejected: AtomicU64,
}

/// The local store plus one queue per peer.
#[derive(Debug)]
pub struct PeerStore {
    local: MemoryStore,
    queues: Vec<mpsc::Sender<Arc<Message>>>,
    counters: Arc<Counters>,
}

impl PeerStore {
    fn broadcast(&self, msg: Message) {
        let msg = Arc::new(msg);
        for q in &self.queues {
            if q.try_send(msg.clone()).is_err() {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl SessionStore for PeerStore {
    fn put(&self, key: &[u8], value: &[u8], now: Instant) -> bool {
        let stored = self.local.put(key, value, now);
        if stored {
            self.broadcast(Message::Put {
                key: key.to_vec(),
                value: Zeroizing::new(value.to_vec()),
                ttl_ms: self.local.ttl().as_millis().min(u32::MAX as u128) as u32,
            });
        }
        stored
    }

    fn get(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.local.get(key, now)
    }

    fn take(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        let value = self.local.take(key, now)?;
        // Single use across the cluster: the other copies go too.
        self.broadcast(Message::Remove { key: key.to_vec() });
        Some(value)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            sent: self.counters.sent.load(Ordering::Relaxed),
            received: self.counters.received.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
            ..self.local.stats()
        }
    }
}

/// The cluster key ring, replaceable on reload.
pub type SharedRing = Arc<RwLock<KeyRing>>;

/// Binds the replication listener and starts the sender tasks. Must run inside a tokio runtime.
pub async fn start(config: PeersConfig, ring: SharedRing) -> std::io::Result<Arc<PeerStore>> {
    let listener = TcpListener::bind(config.listen).await?;
    let counters = Arc::new(Counters::default());
    let mut queues = Vec::new();
    for peer in &config.peers {
        let (tx, rx) = mpsc::channel(QUEUE_LEN);
        queues.push(tx);
        tokio::spawn(sender(
            *peer,
            config.agent_id,
            rx,
            ring.clone(),
            counters.clone(),
        ));
    }
    let store = Arc::new(PeerStore {
        local: MemoryStore::new(config.capacity, config.ttl),
        queues,
        counters: counters.clone(),
    });
    tokio::spawn(listen(listener, store.clone(), ring));
    Ok(store)
}

/// Streams queued messages to one peer, reconnecting with backoff while it is unreachable.
async fn sender(
    peer: SocketAddr,
    agent_id: u16,
    mut rx: mpsc::Receiver<Arc<Message>>,
    ring: SharedRing,
    counters: Arc<Counters>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut conn = match connect(peer, agent_id).await {
            Ok(c) => {
                backoff = Duration::from_millis(50);
                c
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "replication peer unreachable");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                if rx.is_closed() {
                    return;
                }
                continue;
            }
        };
        tracing::info!(%peer, "replicating sessions to peer");
        loop {
            let Some(first) = rx.recv().await else { return };
            // Batch whatever else is queued into one write.
            let mut batch = vec![first];
            while batch.len() < 256 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let mut wire = Vec::new();
            {
                let ring = ring.read().unwrap_or_else(|p| p.into_inner());
                for m in &batch {
                    match conn.1.frame(&ring, m) {
                        Some(f) => wire.extend_from_slice(&f),
                        None => {
                            counters.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            let written = tokio::time::timeout(WRITE_TIMEOUT, conn.0.write_all(&wire)).await;
            if matches!(written, Ok(Ok(()))) {
                counters
                    .sent
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            } else {
                counters
                    .dropped
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                tracing::warn!(%peer, "replication connection lost; reconnecting");
                break;
            }
        }
    }
}

async fn connect(peer: SocketAddr, agent_id: u16) -> std::io::Result<(TcpStream, Outbound)> {
    let io_err = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer))
        .await
        .map_err(|e| io_err(&e))??;
    stream.set_nodelay(true)?;
    let mut hello = [0u8; HELLO_LEN];
    tokio::time::timeout(CONNECT_TIMEOUT, stream.read_exact(&mut hello))
        .await
        .map_err(|e| io_err(&e))??;
    let outbound = Outbound::new(agent_id, &hello).map_err(|e| io_err(&e))?;
    Ok((stream, outbound))
}

async fn listen(listener: TcpListener, store: Arc<PeerStore>, ring: SharedRing) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_INBOUND));
    loop {
        let Ok((stream, from)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue; // dropped: too many peer connections
        };
        let store = store.clone();
        let ring = ring.clone();
        tokio::spawn(async move {
            if let Err(e) = receive(stream, &store, &ring).await {
                store.counters.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%from, error = %e, "replication connection refused");
            }
            drop(slot);
        });
    }
}

/// Serves one peer's connection; the error (text) only ends up in a log line.
async fn receive(
    mut stream: TcpStream,
    store: &PeerStore,
    ring: &SharedRing,
) -> Result<(), String> {
    let mut challenge = [0u8; CHALLENGE_LEN];
    aws_lc_rs::rand::fill(&mut challenge).map_err(|_| "random number generator failed")?;
    let mut inbound = Inbound::new(challenge);
    stream
        .write_all(&inbound.hello())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        let msgs = {
            let ring = ring.read().unwrap_or_else(|p| p.into_inner());
            inbound.push(&ring, &buf[..n]).map_err(|e| e.to_string())?
        };
        let now = Instant::now();
        for (_, msg) in msgs {
            store.counters.received.fetch_add(1, Ordering::Relaxed);
            match msg {
                Message::Put { key, value, ttl_ms } => {
                    store
                        .local
                        .put_for(&key, &value, Duration::from_millis(ttl_ms as u64), now);
                }
                Message::Remove { key } => store.local.remove(&key),
            }
        }
    }
}
