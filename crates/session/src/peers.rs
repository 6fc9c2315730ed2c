//! `--store peers`: every agent keeps every session. New sessions go into the local store at
//! once (the handshake never waits) and are queued, per peer, to a sender task that streams them
//! over the sealed channel of `replication.rs`; a listener applies what peers send.
//!
//! Queues are bounded: when a peer is down or slow its queue fills and further sessions for it
//! are dropped and counted. That peer then misses those sessions (a client landing there pays a
//! full handshake), which is the right trade for a cache: handshakes never block on a peer.
//!
//! The listener serves peers only, and keeps room for them: a connection from an address that
//! is no peer's (nor allowed by [`PeersConfig::allow`]) is closed at accept, unread; one that
//! has not answered the challenge within [`AUTH_DEADLINE`] is closed, and at most
//! [`MAX_PENDING`] wait to (a new one closes the oldest); an authenticated one holds one of a
//! slot per peer (plus [`PEER_SLACK`]) until it has been silent for [`IDLE_TIMEOUT`], and gives
//! way sooner to a newer connection of the same peer (a restarted peer, or one back from a
//! network blip whose old connection is half open). Senders answer the challenge at once and
//! ping every [`HEARTBEAT`] when they have nothing to send, so a quiet peer is never cut.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

use crate::memory::MemoryStore;
use crate::replication::{Inbound, Message, Outbound, CHALLENGE_LEN, HELLO_LEN};
use crate::store::{SessionStore, StoreStats};
use crate::ticket::KeyRing;

/// Messages waiting for one peer, at most.
pub const QUEUE_LEN: usize = 4096;
/// Inbound connections that have not answered the challenge yet, at most: one more closes the
/// oldest of them.
pub const MAX_PENDING: usize = 16;
/// Authenticated inbound connections beyond one per configured peer, at most.
pub const PEER_SLACK: usize = 4;
/// How long an inbound connection has to answer the challenge with a frame that opens.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(5);
/// How often a sender with nothing to send pings its peer.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// An authenticated inbound connection with no frame for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// An authenticated inbound connection with no frame for this long (its sender missed two
/// pings) gives way to a new authenticated one instead of refusing it.
pub const STALE_AFTER: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection to a peer that lasts this long counts as replication running again.
const PROVEN_AFTER: Duration = Duration::from_secs(1);
/// A peer unreachable this long (from the start, or since it was lost) is worth a warning.
const DOWN_WARNING: Duration = Duration::from_secs(5);
/// The least time between two warnings of one kind from the listener.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Who else may connect to the replication listener, besides the peers' own addresses.
#[derive(Clone, Default)]
pub struct AllowFrom(Option<Arc<dyn Fn(IpAddr) -> bool + Send + Sync>>);

impl AllowFrom {
    /// The addresses `allows` says yes to.
    pub fn new(allows: impl Fn(IpAddr) -> bool + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(allows)))
    }

    fn allows(&self, ip: IpAddr) -> bool {
        self.0.as_ref().is_some_and(|f| f(ip))
    }
}

impl std::fmt::Debug for AllowFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "AllowFrom(..)"
        } else {
            "AllowFrom(peers only)"
        })
    }
}

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
    /// Who else may connect to `listen` (peers behind NAT, or connecting from another address
    /// than the one they listen on). Default: nobody but the addresses in `peers`.
    pub allow: AllowFrom,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    rejected: AtomicU64,
    refused: AtomicU64,
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
            refused: self.counters.refused.load(Ordering::Relaxed),
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
    let shared = Arc::new(Listener {
        store: store.clone(),
        ring,
        peers: config.peers.iter().map(|p| p.ip().to_canonical()).collect(),
        allow: config.allow,
        slots: Mutex::new(Slots::new(MAX_PENDING, config.peers.len() + PEER_SLACK)),
        log_stranger: Throttle::default(),
        log_crowded: Throttle::default(),
        log_deadline: Throttle::default(),
        log_fault: Throttle::default(),
    });
    tokio::spawn(listen(listener, shared));
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
    let mut link = LinkLog::new(peer, Instant::now());
    loop {
        let reason = match connect(peer, agent_id).await {
            Ok((stream, outbound)) => {
                let Some(reason) =
                    stream_to(stream, outbound, &mut rx, &ring, &counters, &mut link).await
                else {
                    return; // the store is gone
                };
                if link.up {
                    backoff = Duration::from_millis(50);
                }
                reason
            }
            Err(e) => e.to_string(),
        };
        link.lost(&reason, Instant::now());
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
        if rx.is_closed() {
            return;
        }
    }
}

/// What a sender says about its peer: one warning when replication to it stops (or has not
/// started a while after start), one when it runs again; the rest at debug level.
#[derive(Debug)]
struct LinkLog {
    peer: SocketAddr,
    /// Whether the current connection has lasted [`PROVEN_AFTER`].
    up: bool,
    down_since: Instant,
    warned: bool,
}

impl LinkLog {
    fn new(peer: SocketAddr, now: Instant) -> Self {
        Self {
            peer,
            up: false,
            down_since: now,
            warned: false,
        }
    }

    fn up(&mut self, now: Instant) {
        if self.up {
            return;
        }
        self.up = true;
        let peer = self.peer;
        if self.warned {
            let down_s = now.duration_since(self.down_since).as_secs_f64();
            tracing::warn!(%peer, down_s, "replication to peer resumed");
        } else {
            tracing::info!(%peer, "replicating sessions to peer");
        }
        self.warned = false;
    }

    /// The connection ended, or none could be made.
    fn lost(&mut self, reason: &str, now: Instant) {
        let peer = self.peer;
        if self.up {
            self.up = false;
            self.down_since = now;
            self.warned = true;
            tracing::warn!(%peer, reason, "replication to peer stopped; reconnecting");
        } else if !self.warned && now.duration_since(self.down_since) >= DOWN_WARNING {
            self.warned = true;
            tracing::warn!(%peer, reason, "no replication to peer yet; still trying");
        } else {
            tracing::debug!(%peer, reason, "replication peer unreachable");
        }
    }
}

/// Sends to one connection until it fails (the reason) or the store is gone (`None`). Answers
/// the challenge at once and pings when idle, so the peer neither times the connection out
/// nor mistakes it for a dead one; notices at once when the peer closes it.
async fn stream_to(
    mut stream: TcpStream,
    mut out: Outbound,
    rx: &mut mpsc::Receiver<Arc<Message>>,
    ring: &SharedRing,
    counters: &Counters,
    link: &mut LinkLog,
) -> Option<String> {
    let pings = out.pings();
    let (mut rd, mut wr) = stream.split();
    let frame = |out: &mut Outbound, msg: &Message| {
        let ring = ring.read().unwrap_or_else(|p| p.into_inner());
        out.frame(&ring, msg)
    };
    if pings {
        let Some(ping) = frame(&mut out, &Message::Ping) else {
            return Some("the cluster key ring has no key".into());
        };
        if let Err(e) = write(&mut wr, &ping).await {
            return Some(e);
        }
    }
    let mut heartbeat =
        tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let proven = tokio::time::sleep(PROVEN_AFTER);
    tokio::pin!(proven);
    let mut scratch = [0u8; 64];
    loop {
        tokio::select! {
            first = rx.recv() => {
                // Batch whatever else is queued into one write.
                let mut batch = vec![first?];
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
                        match out.frame(&ring, m) {
                            Some(f) => wire.extend_from_slice(&f),
                            None => {
                                counters.dropped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                if let Err(e) = write(&mut wr, &wire).await {
                    counters.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    return Some(e);
                }
                counters.sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
                heartbeat.reset();
            }
            _ = heartbeat.tick(), if pings => {
                let Some(ping) = frame(&mut out, &Message::Ping) else {
                    return Some("the cluster key ring has no key".into());
                };
                if let Err(e) = write(&mut wr, &ping).await {
                    return Some(e);
                }
            }
            // The peer never sends after its hello: anything here ends the connection.
            read = rd.read(&mut scratch) => {
                return Some(match read {
                    Ok(0) => "the peer closed the connection (see its log)".into(),
                    Ok(_) => "the peer sent bytes after its hello".into(),
                    Err(e) => e.to_string(),
                });
            }
            () = &mut proven, if !link.up => link.up(Instant::now()),
        }
    }
}

async fn write(wr: &mut (impl AsyncWriteExt + Unpin), bytes: &[u8]) -> Result<(), String> {
    match tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("write timed out after {WRITE_TIMEOUT:?}")),
    }
}

async fn connect(peer: SocketAddr, agent_id: u16) -> std::io::Result<(TcpStream, Outbound)> {
    let io_err = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer))
        .await
        .map_err(|e| io_err(&e))??;
    stream.set_nodelay(true)?;
    let mut hello = [0u8; HELLO_LEN];
    match tokio::time::timeout(CONNECT_TIMEOUT, stream.read_exact(&mut hello)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(io_err(
                &"the peer closed the connection before its hello (is this agent's address \
                  among its --peer addresses or --peer-allow networks? is its listener crowded?)",
            ))
        }
        Ok(Err(e)) => return Err(e),
        Err(e) => return Err(io_err(&e)),
    }
    let outbound = Outbound::new(agent_id, &hello).map_err(|e| io_err(&e))?;
    Ok((stream, outbound))
}

/// The listener's state, shared with its connections.
struct Listener {
    store: Arc<PeerStore>,
    ring: SharedRing,
    /// The peers' addresses: who may connect, with whoever `allow` names.
    peers: Vec<IpAddr>,
    allow: AllowFrom,
    slots: Mutex<Slots<oneshot::Sender<()>>>,
    log_stranger: Throttle,
    log_crowded: Throttle,
    log_deadline: Throttle,
    log_fault: Throttle,
}

impl Listener {
    fn allowed(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.peers.contains(&ip) || self.allow.allows(ip)
    }

    fn slots(&self) -> MutexGuard<'_, Slots<oneshot::Sender<()>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refused(&self) {
        self.store.counters.refused.fetch_add(1, Ordering::Relaxed);
    }
}

async fn listen(listener: TcpListener, shared: Arc<Listener>) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "replication listener: accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if !shared.allowed(from.ip()) {
            // Closed unread: a stranger gets neither a challenge nor a slot.
            drop(stream);
            shared.refused();
            if let Some(held_back) = shared.log_stranger.check(Instant::now()) {
                tracing::warn!(
                    %from,
                    held_back,
                    "replication connection refused: not from a --peer address (give \
                     --peer-allow for peers that connect from another address)"
                );
            }
            continue;
        }
        let (close, closed) = oneshot::channel();
        let (id, evicted) = shared.slots().open(close);
        if evicted.is_some() {
            shared.refused();
            if let Some(held_back) = shared.log_crowded.check(Instant::now()) {
                tracing::warn!(
                    %from,
                    held_back,
                    "replication listener: {MAX_PENDING} connections waiting to authenticate; \
                     closed the oldest"
                );
            }
        }
        drop(evicted);
        tokio::spawn(serve(shared.clone(), stream, from, id, closed));
    }
}

/// How an inbound connection ended.
#[derive(Debug)]
enum End {
    /// The peer closed it; with its agent id if it had authenticated.
    PeerClosed(Option<u16>),
    /// No frame opened within [`AUTH_DEADLINE`].
    Deadline,
    /// Authenticated, then no frame for [`IDLE_TIMEOUT`].
    Idle(u16),
    /// Authenticated, but every peer slot holds a live connection.
    Full(u16),
    /// A frame failed a check.
    Fault(Option<u16>, String),
    /// The socket failed (a reset, most often).
    Io(Option<u16>, String),
    /// The listener closed it for a newer connection (and logged why).
    Superseded,
}

async fn serve(
    shared: Arc<Listener>,
    stream: TcpStream,
    from: SocketAddr,
    id: u64,
    mut closed: oneshot::Receiver<()>,
) {
    let end = tokio::select! {
        end = receive(&shared, stream, from, id) => end,
        _ = &mut closed => End::Superseded,
    };
    shared.slots().close(id);
    let now = Instant::now();
    match end {
        End::PeerClosed(None) => {
            tracing::debug!(%from, "replication connection closed before authenticating");
        }
        End::PeerClosed(Some(agent)) => {
            tracing::info!(%from, agent, "peer closed its replication connection");
        }
        End::Deadline => {
            shared.refused();
            if let Some(held_back) = shared.log_deadline.check(now) {
                tracing::warn!(
                    %from,
                    held_back,
                    "replication connection closed: no authenticated frame within {AUTH_DEADLINE:?}"
                );
            }
        }
        End::Idle(agent) => {
            shared.refused();
            tracing::warn!(
                %from,
                agent,
                "replication connection closed: the peer sent nothing for {IDLE_TIMEOUT:?}"
            );
        }
        End::Full(agent) => {
            shared.refused();
            if let Some(held_back) = shared.log_crowded.check(now) {
                tracing::warn!(
                    %from,
                    agent,
                    held_back,
                    "replication connection refused: every peer slot holds a live connection"
                );
            }
        }
        End::Io(None, error) => {
            tracing::debug!(%from, error, "replication connection failed before authenticating");
        }
        End::Io(Some(agent), error) => {
            tracing::info!(%from, agent, error, "peer's replication connection failed");
        }
        End::Fault(agent, error) => {
            shared
                .store
                .counters
                .rejected
                .fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = shared.log_fault.check(now) {
                tracing::warn!(?agent, %from, held_back, error, "replication connection refused");
            }
        }
        End::Superseded => {}
    }
}

/// Serves one peer's connection: the challenge, then frames until it ends.
async fn receive(shared: &Listener, mut stream: TcpStream, from: SocketAddr, id: u64) -> End {
    let mut limit = tokio::time::Instant::now() + AUTH_DEADLINE;
    let mut challenge = [0u8; CHALLENGE_LEN];
    if aws_lc_rs::rand::fill(&mut challenge).is_err() {
        return End::Fault(None, "random number generator failed".into());
    }
    let mut inbound = Inbound::new(challenge);
    match tokio::time::timeout_at(limit, stream.write_all(&inbound.hello())).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return End::Io(None, e.to_string()),
        Err(_) => return End::Deadline,
    }
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match tokio::time::timeout_at(limit, stream.read(&mut buf)).await {
            Ok(Ok(0)) => return End::PeerClosed(inbound.peer()),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return End::Io(inbound.peer(), e.to_string()),
            Err(_) => {
                return match inbound.peer() {
                    None => End::Deadline,
                    Some(agent) => End::Idle(agent),
                }
            }
        };
        let before = inbound.peer();
        let pushed = {
            let ring = shared.ring.read().unwrap_or_else(|p| p.into_inner());
            inbound.push(&ring, &buf[..n])
        };
        let msgs = match pushed {
            Ok(msgs) => msgs,
            Err(e) => return End::Fault(inbound.peer(), e.to_string()),
        };
        if msgs.is_empty() {
            continue; // part of a frame: the clock runs on
        }
        let now = Instant::now();
        match (before, inbound.peer()) {
            (None, Some(agent)) => {
                let who = Who {
                    agent,
                    ip: from.ip().to_canonical(),
                };
                match shared.slots().authenticated(id, who, now) {
                    Ok(None) => tracing::info!(%from, agent, "peer connected for replication"),
                    Ok(Some((old, _close))) => {
                        // `_close` is dropped here: that closes the old connection.
                        if old == who {
                            tracing::info!(
                                %from,
                                agent,
                                "peer reconnected; its previous connection, silent, closed"
                            );
                        } else {
                            tracing::warn!(
                                %from,
                                agent,
                                old_agent = old.agent,
                                old_from = %old.ip,
                                "replication listener full: a silent peer connection closed \
                                 for a new one"
                            );
                        }
                    }
                    Err(Refusal::Full) => return End::Full(agent),
                    Err(Refusal::Gone) => return End::Superseded,
                }
            }
            _ => shared.slots().seen(id, now),
        }
        limit = tokio::time::Instant::now() + IDLE_TIMEOUT;
        for (_, msg) in msgs {
            match msg {
                Message::Put { key, value, ttl_ms } => {
                    store_received(&shared.store);
                    shared.store.local.put_for(
                        &key,
                        &value,
                        Duration::from_millis(ttl_ms as u64),
                        now,
                    );
                }
                Message::Remove { key } => {
                    store_received(&shared.store);
                    shared.store.local.remove(&key);
                }
                Message::Ping => {}
            }
        }
    }
}

fn store_received(store: &PeerStore) {
    store.counters.received.fetch_add(1, Ordering::Relaxed);
}

/// A peer as the listener knows it: the agent id it authenticated as, and its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Who {
    agent: u16,
    ip: IpAddr,
}

/// Why an authenticated connection gets no slot.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Every peer slot holds a live connection.
    Full,
    /// The connection was closed meanwhile (for a newer one).
    Gone,
}

/// Who holds the listener's connections, by id: a table with time passed in, so the policy is
/// tested without sockets. `T` closes its connection when dropped; whatever the table gives
/// back, the caller drops.
#[derive(Debug)]
struct Slots<T> {
    max_pending: usize,
    max_peers: usize,
    next_id: u64,
    /// Not authenticated yet, oldest first.
    pending: VecDeque<(u64, T)>,
    peers: Vec<PeerSlot<T>>,
}

#[derive(Debug)]
struct PeerSlot<T> {
    id: u64,
    who: Who,
    last_frame: Instant,
    close: T,
}

impl<T> Slots<T> {
    fn new(max_pending: usize, max_peers: usize) -> Self {
        Self {
            max_pending: max_pending.max(1),
            max_peers: max_peers.max(1),
            next_id: 0,
            pending: VecDeque::new(),
            peers: Vec::new(),
        }
    }

    /// A new connection, waiting to authenticate: its id, and the oldest waiting one if there
    /// are too many (to close).
    fn open(&mut self, close: T) -> (u64, Option<T>) {
        let id = self.next_id;
        self.next_id += 1;
        let evicted = if self.pending.len() >= self.max_pending {
            self.pending.pop_front().map(|(_, c)| c)
        } else {
            None
        };
        self.pending.push_back((id, close));
        (id, evicted)
    }

    /// Connection `id` authenticated as `who`. It takes a peer slot: a free one, else the one
    /// of a silent earlier connection of the same peer, else of any silent connection (who held
    /// it, and its handle, come back to close it); if every slot holds a live connection it is
    /// refused.
    fn authenticated(
        &mut self,
        id: u64,
        who: Who,
        now: Instant,
    ) -> Result<Option<(Who, T)>, Refusal> {
        let at = self
            .pending
            .iter()
            .position(|(i, _)| *i == id)
            .ok_or(Refusal::Gone)?;
        let (_, close) = self.pending.remove(at).ok_or(Refusal::Gone)?;
        let slot = PeerSlot {
            id,
            who,
            last_frame: now,
            close,
        };
        let stale = |s: &PeerSlot<T>| now.saturating_duration_since(s.last_frame) >= STALE_AFTER;
        let same = self.peers.iter().position(|s| s.who == who && stale(s));
        let victim = same.or_else(|| {
            if self.peers.len() < self.max_peers {
                return None;
            }
            self.peers
                .iter()
                .enumerate()
                .filter(|(_, s)| stale(s))
                .min_by_key(|(_, s)| s.last_frame)
                .map(|(i, _)| i)
        });
        match victim {
            Some(i) => {
                let old = std::mem::replace(&mut self.peers[i], slot);
                Ok(Some((old.who, old.close)))
            }
            None if self.peers.len() < self.max_peers => {
                self.peers.push(slot);
                Ok(None)
            }
            None => Err(Refusal::Full),
        }
    }

    /// A frame arrived on connection `id`.
    fn seen(&mut self, id: u64, now: Instant) {
        if let Some(s) = self.peers.iter_mut().find(|s| s.id == id) {
            s.last_frame = now;
        }
    }

    /// Connection `id` ended: its slot is free.
    fn close(&mut self, id: u64) {
        self.pending.retain(|(i, _)| *i != id);
        self.peers.retain(|s| s.id != id);
    }
}

/// At most one log line of a kind per [`LOG_EVERY`], counting those held back.
#[derive(Debug, Default)]
struct Throttle(Mutex<Option<(Instant, u64)>>);

impl Throttle {
    /// `Some(lines held back since the last one)` when a line may be logged now.
    fn check(&self, now: Instant) -> Option<u64> {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *last {
            Some((at, held)) if now.saturating_duration_since(*at) < LOG_EVERY => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let n = *held;
                *at = now;
                *held = 0;
                Some(n)
            }
            None => {
                *last = Some((now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(agent: u16) -> Who {
        Who {
            agent,
            ip: IpAddr::from([127, 0, 0, 1]),
        }
    }

    #[test]
    fn a_new_connection_closes_the_oldest_unauthenticated_one() {
        let mut slots = Slots::new(2, 2);
        let (a, none) = slots.open("a");
        assert_eq!(none, None);
        let (_, none) = slots.open("b");
        assert_eq!(none, None);
        let (c, oldest) = slots.open("c");
        assert_eq!(oldest, Some("a"));
        // the closed one cannot authenticate any more; the newest can
        let t = Instant::now();
        assert_eq!(slots.authenticated(a, who(1), t), Err(Refusal::Gone));
        assert_eq!(slots.authenticated(c, who(1), t), Ok(None));
        assert_eq!(slots.pending.len(), 1);
    }

    #[test]
    fn a_peer_reconnecting_replaces_its_silent_connection() {
        let t = Instant::now();
        let mut slots = Slots::new(4, 1);
        let (old, _) = slots.open("old");
        assert_eq!(slots.authenticated(old, who(1), t), Ok(None));
        slots.seen(old, t + Duration::from_secs(1));
        // still pinging: a second connection claiming the same peer finds no room
        let (dup, _) = slots.open("dup");
        let soon = t + Duration::from_secs(2);
        assert_eq!(slots.authenticated(dup, who(1), soon), Err(Refusal::Full));
        // silent for STALE_AFTER (a half-open connection of a restarted peer): replaced
        let (new, _) = slots.open("new");
        let later = t + Duration::from_secs(1) + STALE_AFTER;
        assert_eq!(
            slots.authenticated(new, who(1), later),
            Ok(Some((who(1), "old")))
        );
        slots.close(old); // the old connection's task ends: the new one keeps the slot
        assert_eq!(slots.peers.len(), 1);
        assert_eq!(slots.peers[0].id, new);
    }

    #[test]
    fn live_peers_keep_their_slots_and_a_silent_one_gives_way() {
        let t = Instant::now();
        let mut slots = Slots::new(4, 2);
        let (a, _) = slots.open("a");
        let (b, _) = slots.open("b");
        assert_eq!(slots.authenticated(a, who(1), t), Ok(None));
        assert_eq!(slots.authenticated(b, who(2), t), Ok(None));
        let later = t + STALE_AFTER;
        slots.seen(b, later);
        // full: agent 3 takes the silent agent 1's slot, not the live agent 2's
        let (c, _) = slots.open("c");
        assert_eq!(
            slots.authenticated(c, who(3), later),
            Ok(Some((who(1), "a")))
        );
        let (d, _) = slots.open("d");
        assert_eq!(slots.authenticated(d, who(4), later), Err(Refusal::Full));
        // a slot freed by a closed connection is taken without closing anyone
        slots.close(b);
        let (e, _) = slots.open("e");
        assert_eq!(slots.authenticated(e, who(2), later), Ok(None));
        // the same agent from another address is another peer
        let other = Who {
            ip: IpAddr::from([10, 0, 0, 2]),
            ..who(3)
        };
        let (f, _) = slots.open("f");
        assert_eq!(slots.authenticated(f, other, later), Err(Refusal::Full));
    }

    #[test]
    fn a_sender_warns_once_when_replication_stops_and_once_when_it_resumes() {
        let t = Instant::now();
        let mut link = LinkLog::new("127.0.0.1:1".parse().unwrap(), t);
        // peers come up in any order: early failures are not worth a warning
        link.lost("refused", t + Duration::from_secs(1));
        assert!(!link.warned);
        link.lost("refused", t + DOWN_WARNING);
        assert!(link.warned, "still down after {DOWN_WARNING:?}");
        link.up(t + DOWN_WARNING + Duration::from_secs(1));
        assert!(link.up && !link.warned);
        // a connection that ran, lost: warned at once, and the outage timed from then
        let lost_at = t + Duration::from_secs(60);
        link.lost("reset", lost_at);
        assert!(!link.up && link.warned);
        assert_eq!(link.down_since, lost_at);
        link.lost("refused", lost_at + DOWN_WARNING);
        assert_eq!(link.down_since, lost_at);
        link.up(lost_at + DOWN_WARNING);
        assert!(link.up && !link.warned);
    }

    #[test]
    fn throttled_logs_count_what_they_held_back() {
        let t = Instant::now();
        let log = Throttle::default();
        assert_eq!(log.check(t), Some(0));
        assert_eq!(log.check(t + Duration::from_secs(1)), None);
        assert_eq!(log.check(t + Duration::from_secs(2)), None);
        assert_eq!(log.check(t + LOG_EVERY), Some(2));
        assert_eq!(log.check(t + LOG_EVERY), None);
    }

    #[test]
    fn only_peers_and_allowed_networks_may_connect() {
        let ring = Arc::new(RwLock::new(KeyRing::new(Vec::new())));
        let listener = |allow: AllowFrom| Listener {
            store: Arc::new(PeerStore {
                local: MemoryStore::new(1, Duration::from_secs(1)),
                queues: Vec::new(),
                counters: Arc::default(),
            }),
            ring: ring.clone(),
            peers: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
            allow,
            slots: Mutex::new(Slots::new(1, 1)),
            log_stranger: Throttle::default(),
            log_crowded: Throttle::default(),
            log_deadline: Throttle::default(),
            log_fault: Throttle::default(),
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let peers_only = listener(AllowFrom::default());
        assert!(peers_only.allowed(ip("10.0.0.1")));
        // what a dual-stack listener reports for an IPv4 peer
        assert!(peers_only.allowed(ip("::ffff:10.0.0.1")));
        assert!(peers_only.allowed(ip("fd00::1")));
        assert!(!peers_only.allowed(ip("10.0.0.2")));
        assert!(!peers_only.allowed(ip("127.0.0.1")));
        let nat = listener(AllowFrom::new(|ip| ip == IpAddr::from([192, 0, 2, 7])));
        assert!(nat.allowed(ip("192.0.2.7")));
        assert!(nat.allowed(ip("10.0.0.1")));
        assert!(!nat.allowed(ip("192.0.2.8")));
    }
}
