//! `--store redis=URL`: sessions in a shared Redis, with a local cache in front.
//!
//! rustls asks for sessions synchronously, inside the handshake, so the store never blocks on
//! the network for long: writes are queued to a worker thread that owns the Redis connection,
//! and a lookup that misses locally waits for Redis at most `wait`. When Redis is down, slow or
//! returns something that does not open, the lookup is a miss — the client gets a full
//! handshake, never an error — and the miss is counted as a fallback.
//!
//! Values in Redis are sealed with the cluster key (AEAD, key id, issuer) and carry their
//! expiry inside the sealed part, so Redis (and anyone reading it) never sees a secret and a
//! stale or foreign blob is a miss.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use zeroize::Zeroizing;

use crate::memory::MemoryStore;
use crate::peers::SharedRing;
use crate::store::{SessionStore, StoreStats};

/// Operations waiting for the worker, at most.
const QUEUE_LEN: usize = 8192;
const KEY_PREFIX: &[u8] = b"baton:session:";
const SEAL_CONTEXT: &[u8] = b"baton redis session v1";

#[derive(Clone)]
pub struct RedisConfig {
    pub url: String,
    pub agent_id: u16,
    /// Local cache size and session lifetime.
    pub capacity: usize,
    pub ttl: Duration,
    /// Longest a handshake waits for Redis on a local miss.
    pub wait: Duration,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

/// The worker's answer to a Get.
enum Reply {
    Value(Vec<u8>),
    Nil,
    /// Redis down or failing: a miss the caller must not take for "absent".
    Failed,
}

enum Op {
    Get {
        key: Vec<u8>,
        take: bool,
        reply: SyncSender<Reply>,
    },
    Set {
        key: Vec<u8>,
        sealed: Vec<u8>,
        ttl: Duration,
    },
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    rejected: AtomicU64,
    fallbacks: AtomicU64,
}

#[derive(Debug)]
pub struct RedisStore {
    local: MemoryStore,
    ops: SyncSender<Op>,
    ring: SharedRing,
    agent_id: u16,
    wait: Duration,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Get { .. } => "Get",
            Op::Set { .. } => "Set",
        })
    }
}

/// `url` with its password (or a credential without a user) replaced by `***`: for messages
/// and logs, which must not carry the Redis password.
pub fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let user = match authority[..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{}{user}{}", &url[..start], &rest[at..])
}

impl RedisStore {
    /// Checks the URL and starts the worker thread (which connects, and reconnects, by itself:
    /// an agent starts even while Redis is down).
    pub fn start(config: RedisConfig, ring: SharedRing) -> Result<Arc<Self>, String> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| format!("--store redis={}: {e}", redact(&config.url)))?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_LEN);
        let counters = Arc::new(Counters::default());
        let worker_counters = counters.clone();
        std::thread::Builder::new()
            .name("baton-redis".into())
            .spawn(move || worker(client, rx, worker_counters))
            .map_err(|e| format!("starting Redis worker: {e}"))?;
        Ok(Arc::new(Self {
            local: MemoryStore::new(config.capacity, config.ttl),
            ops: tx,
            ring,
            agent_id: config.agent_id,
            wait: config.wait,
            counters,
        }))
    }

    fn seal(&self, key: &[u8], value: &[u8], expires_ms: u64) -> Option<Vec<u8>> {
        let mut plain = Zeroizing::new(Vec::with_capacity(8 + value.len()));
        plain.extend_from_slice(&expires_ms.to_be_bytes());
        plain.extend_from_slice(value);
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        ring.seal(self.agent_id, &plain, &[SEAL_CONTEXT, key].concat())
    }

    /// The value and its remaining lifetime, if the blob opens and has not expired.
    fn open(&self, key: &[u8], sealed: &[u8]) -> Option<(Zeroizing<Vec<u8>>, Duration)> {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        let plain = Zeroizing::new(ring.open(sealed, &[SEAL_CONTEXT, key].concat())?);
        let expires = u64::from_be_bytes(plain.get(..8)?.try_into().ok()?);
        let left = expires.checked_sub(unix_ms())?;
        Some((
            Zeroizing::new(plain[8..].to_vec()),
            Duration::from_millis(left),
        ))
    }

    fn fetch(&self, key: &[u8], take: bool, now: Instant) -> Option<Vec<u8>> {
        match self.ask(key, take, now) {
            Shared::Found(v) => Some(v),
            Shared::Absent | Shared::Unavailable => None,
        }
    }

    /// Asks Redis for `key` (GETDEL when `take`), waiting at most `wait`.
    fn ask(&self, key: &[u8], take: bool, now: Instant) -> Shared {
        let (reply, answer) = mpsc::sync_channel(1);
        let op = Op::Get {
            key: key.to_vec(),
            take,
            reply,
        };
        if self.ops.try_send(op).is_err() {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
            return Shared::Unavailable;
        }
        let sealed = match answer.recv_timeout(self.wait) {
            Ok(Reply::Value(sealed)) => sealed,
            Ok(Reply::Nil) => return Shared::Absent,
            // Redis down: counted by the worker.
            Ok(Reply::Failed) => return Shared::Unavailable,
            Err(_) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                return Shared::Unavailable;
            }
        };
        let Some((value, left)) = self.open(key, &sealed) else {
            // Deleted by the GETDEL all the same: nobody else gets it either.
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Shared::Absent;
        };
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        if !take {
            self.local.put_for(key, &value, left, now);
        }
        Shared::Found(value.to_vec())
    }
}

/// What Redis answered for a key.
enum Shared {
    /// A blob that opened (and, for a take, that this GETDEL deleted).
    Found(Vec<u8>),
    /// Redis answered: no such key (or a blob that does not open).
    Absent,
    /// Redis did not answer in time, or is down.
    Unavailable,
}

/// The single-use decision of a take: only Redis's own GETDEL can say that this agent is the
/// one that removed the session. A copy in the local cache is never exclusive: another agent
/// may have taken the shared copy already (the local cache of the agent that issued a ticket
/// keeps it after a peer resumed it), or will take it once Redis is back.
fn combine(local: Option<Vec<u8>>, shared: Shared) -> crate::Taken {
    use crate::Taken;
    match (shared, local) {
        (Shared::Found(v), _) => Taken::Exclusive(v),
        (Shared::Absent, Some(v)) => Taken::Reused(v),
        (Shared::Unavailable, Some(v)) => Taken::Local(v),
        (Shared::Absent, None) => Taken::Absent,
        (Shared::Unavailable, None) => Taken::Unavailable,
    }
}

impl SessionStore for RedisStore {
    fn put(&self, key: &[u8], value: &[u8], now: Instant) -> bool {
        let stored = self.local.put(key, value, now);
        let ttl = self.local.ttl();
        let Some(sealed) = self.seal(key, value, unix_ms() + ttl.as_millis() as u64) else {
            return stored;
        };
        match self.ops.try_send(Op::Set {
            key: key.to_vec(),
            sealed,
            ttl,
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        stored
    }

    fn get(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.local
            .get(key, now)
            .or_else(|| self.fetch(key, false, now))
    }

    fn take(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        // Single use across the cluster: the shared copy must go whether or not we had it.
        let local = self.local.take(key, now);
        let shared = self.fetch(key, true, now);
        local.or(shared)
    }

    fn take_once(&self, key: &[u8], now: Instant) -> crate::Taken {
        let local = self.local.take(key, now);
        combine(local, self.ask(key, true, now))
    }

    fn stats(&self) -> StoreStats {
        let c = &self.counters;
        StoreStats {
            sent: c.sent.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            ..self.local.stats()
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn redis_key(key: &[u8]) -> Vec<u8> {
    [KEY_PREFIX, key].concat()
}

/// Owns the connection: serves queued operations, reconnects with backoff. While Redis is
/// unreachable, lookups are answered "miss" at once (and counted), writes are dropped.
fn worker(client: redis::Client, ops: Receiver<Op>, counters: Arc<Counters>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match client.get_connection_with_timeout(Duration::from_secs(1)) {
            Ok(mut con) => {
                let _ = con.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = con.set_write_timeout(Some(Duration::from_secs(1)));
                backoff = Duration::from_millis(50);
                tracing::info!("connected to Redis session store");
                loop {
                    let Ok(op) = ops.recv() else { return };
                    if let Err(e) = serve(&mut con, op, &counters) {
                        tracing::warn!(error = %e, "Redis session store failed; reconnecting");
                        break;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "Redis session store unreachable"),
        }
        // Down: answer everything that arrives during the backoff without waiting.
        let until = Instant::now() + backoff;
        backoff = (backoff * 2).min(Duration::from_secs(2));
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match ops.recv_timeout(left) {
                Ok(Op::Get { reply, .. }) => {
                    counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.try_send(Reply::Failed);
                }
                Ok(Op::Set { .. }) => {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

fn serve(con: &mut redis::Connection, op: Op, counters: &Counters) -> redis::RedisResult<()> {
    match op {
        Op::Get { key, take, reply } => {
            let cmd = if take { "GETDEL" } else { "GET" };
            match redis::cmd(cmd)
                .arg(redis_key(&key))
                .query::<Option<Vec<u8>>>(con)
            {
                Ok(v) => {
                    let _ = reply.try_send(v.map_or(Reply::Nil, Reply::Value));
                    Ok(())
                }
                Err(e) => {
                    counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.try_send(Reply::Failed);
                    Err(e)
                }
            }
        }
        Op::Set { key, sealed, ttl } => {
            let r = redis::cmd("SET")
                .arg(redis_key(&key))
                .arg(sealed)
                .arg("PX")
                .arg(ttl.as_millis().max(1) as u64)
                .query::<()>(con);
            match &r {
                Ok(()) => counters.sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => counters.dropped.fetch_add(1, Ordering::Relaxed),
            };
            r
        }
    }
}

#[cfg(test)]
mod take_tests {
    use super::{combine, Shared};
    use crate::TakenKind;

    /// Every combination of the local cache and Redis's answer: exclusive only when Redis's
    /// GETDEL handed the value over, whatever the local cache holds.
    #[test]
    fn only_redis_getdel_is_exclusive() {
        let v = || vec![7u8; 4];
        let shared = || [Shared::Found(v()), Shared::Absent, Shared::Unavailable];
        for local in [Some(v()), None] {
            for (i, s) in shared().into_iter().enumerate() {
                let taken = combine(local.clone(), s);
                let want = match (i, local.is_some()) {
                    (0, _) => TakenKind::Exclusive,
                    (1, true) => TakenKind::Reused,
                    (_, true) => TakenKind::Local,
                    (1, false) => TakenKind::Absent,
                    _ => TakenKind::Unavailable,
                };
                assert_eq!(
                    taken.kind(),
                    want,
                    "local {:?}, shared #{i}",
                    local.is_some()
                );
                assert_eq!(taken.into_value().is_some(), local.is_some() || i == 0);
            }
        }
    }
}

#[cfg(test)]
mod redact_tests {
    #[test]
    fn redacts_the_password() {
        use super::redact;
        assert_eq!(
            redact("redis://u:secret@h:6379/0"),
            "redis://u:***@h:6379/0"
        );
        assert_eq!(redact("redis://:secret@h/"), "redis://:***@h/");
        assert_eq!(redact("rediss://secret@h"), "rediss://***@h");
        assert_eq!(redact("redis://h:6379/?a=b@c"), "redis://h:6379/?a=b@c");
        assert_eq!(redact("redis://u:p@ss@h/"), "redis://u:***@h/");
    }
}
