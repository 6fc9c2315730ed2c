//! The one trait every session store implements.

use std::time::{Duration, Instant};

/// A store of encoded TLS sessions, keyed by TLS 1.2 session id or TLS 1.3 stateful ticket id.
///
/// Values are secrets (they hold the resumption master secret): implementations zeroize them
/// when they are dropped, evicted or expire, and never log them. Implementations must not block
/// for long: they run inside a TLS handshake.
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    /// Stores `value` under `key`, replacing any earlier value. Returns whether it was stored.
    fn put(&self, key: &[u8], value: &[u8], now: Instant) -> bool;
    /// [`put`](Self::put) for a session whose ticket will allow early data (TLS 1.3 0-RTT):
    /// returns true only once every agent's [`take_once`](Self::take_once) can find the value,
    /// false if that is not known within the store's wait (the ticket is then not sent). A
    /// ticket in a client's hands before the store has it could be resumed elsewhere first
    /// (found nowhere: refused, and the request sent again after the handshake), then replayed
    /// with its early data once the value lands: one request, run twice. The default stores
    /// locally, where every take finds it at once.
    fn put_acknowledged(&self, key: &[u8], value: &[u8], now: Instant) -> bool {
        self.put(key, value, now)
    }
    /// Whether a [`put_acknowledged`](Self::put_acknowledged) is expected to be answered within
    /// the store's wait now: false while the shared store is down or its writes are slow, when
    /// new tickets go out without early data instead (and stored without waiting).
    fn acknowledges_promptly(&self) -> bool {
        true
    }
    /// Returns a copy of the value under `key`, if present and not expired.
    fn get(&self, key: &[u8], now: Instant) -> Option<Vec<u8>>;
    /// Removes and returns the value under `key` (single-use TLS 1.3 tickets).
    fn take(&self, key: &[u8], now: Instant) -> Option<Vec<u8>>;
    /// [`take`](Self::take), saying whether this call is the only one anywhere in the cluster
    /// that can have been handed this value (what TLS 1.3 0-RTT needs: RFC 8446 section 8.1).
    /// The default promises nothing: a found value is `Local`.
    fn take_once(&self, key: &[u8], now: Instant) -> Taken {
        match self.take(key, now) {
            Some(value) => Taken::Local(value),
            None => Taken::Absent,
        }
    }
    /// Counters for metrics.
    fn stats(&self) -> StoreStats;
    /// Takes, or renews, a lock over the whole cluster: `key` held under `token` for `ttl`
    /// from now. `Some(true)`: `token` holds it; `Some(false)`: another token does; `None`:
    /// this store has no cluster-wide lock, or gave no answer within its wait. Blocks for up to
    /// the store's wait: not for a handshake's path.
    fn lock(&self, _key: &[u8], _token: &[u8], _ttl: Duration) -> Option<bool> {
        None
    }
    /// Releases the lock under `key` if `token` still holds it (never another's).
    fn unlock(&self, _key: &[u8], _token: &[u8]) {}
}

/// What [`SessionStore::take_once`] found.
#[derive(PartialEq, Eq)]
pub enum Taken {
    /// Removed by this call from the one place it lived cluster-wide (a Redis GETDEL, or the
    /// only store that ever held it): no other take anywhere can return it again.
    Exclusive(Vec<u8>),
    /// A copy from somewhere that cannot promise the value was not (or will not be) handed out
    /// elsewhere too: a local cache while the shared store is down or slow, or a replicated
    /// copy whose removal reaches the peers only after the fact. Good for a 1-RTT resumption.
    Local(Vec<u8>),
    /// A local copy of a session the shared store answered it no longer has: taken by another
    /// agent already (a replay, or a second use of the ticket), or lost by the store.
    Reused(Vec<u8>),
    /// Nowhere: never stored, expired, or taken already (a replay, or a second use).
    Absent,
    /// Not found locally, and the shared store could not be asked (down, slow, queue full).
    Unavailable,
}

impl Taken {
    /// The value, if any, whatever its guarantee.
    pub fn into_value(self) -> Option<Vec<u8>> {
        match self {
            Taken::Exclusive(v) | Taken::Local(v) | Taken::Reused(v) => Some(v),
            Taken::Absent | Taken::Unavailable => None,
        }
    }

    /// The outcome without the value (for decisions and logs: values are secrets).
    pub fn kind(&self) -> TakenKind {
        match self {
            Taken::Exclusive(_) => TakenKind::Exclusive,
            Taken::Local(_) => TakenKind::Local,
            Taken::Reused(_) => TakenKind::Reused,
            Taken::Absent => TakenKind::Absent,
            Taken::Unavailable => TakenKind::Unavailable,
        }
    }
}

/// The value never appears in debug output: it holds a resumption secret.
impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind())
    }
}

/// [`Taken`] without its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakenKind {
    Exclusive,
    Local,
    Reused,
    Absent,
    Unavailable,
}

/// Counters a store keeps for the agent's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub expirations: u64,
    /// Sessions (and removals) sent to the shared store or to peers.
    pub sent: u64,
    /// Sessions (and removals) received from peers, or found in the shared store.
    pub received: u64,
    /// Sends dropped because a queue was full or a peer unreachable.
    pub dropped: u64,
    /// Frames or blobs refused (failed authentication, malformed, expired).
    pub rejected: u64,
    /// Peer connections this agent closed unserved or cut: from an address that is no peer's,
    /// no slot free, not authenticated in time, or silent past the idle timeout.
    pub refused: u64,
    /// Lookups answered "miss" because the shared store was down or slow (a full handshake).
    pub fallbacks: u64,
    /// Connections to the shared store made again after losing it: a restart, or a failover
    /// followed to the promoted replica (Redis Sentinel, a Redis Cluster shard).
    pub reconnects: u64,
    /// Sessions whose ticket was not sent: it would have allowed early data, and the shared
    /// store had not stored it within the wait ([`SessionStore::put_acknowledged`]).
    pub unacknowledged: u64,
}
