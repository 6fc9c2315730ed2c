//! The one trait every session store implements.

use std::time::Instant;

/// A store of encoded TLS sessions, keyed by TLS 1.2 session id or TLS 1.3 stateful ticket id.
///
/// Values are secrets (they hold the resumption master secret): implementations zeroize them
/// when they are dropped, evicted or expire, and never log them. Implementations must not block
/// for long: they run inside a TLS handshake.
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    /// Stores `value` under `key`, replacing any earlier value. Returns whether it was stored.
    fn put(&self, key: &[u8], value: &[u8], now: Instant) -> bool;
    /// Returns a copy of the value under `key`, if present and not expired.
    fn get(&self, key: &[u8], now: Instant) -> Option<Vec<u8>>;
    /// Removes and returns the value under `key` (single-use TLS 1.3 tickets).
    fn take(&self, key: &[u8], now: Instant) -> Option<Vec<u8>>;
    /// Counters for metrics.
    fn stats(&self) -> StoreStats;
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
}
