//! A per-agent in-memory session store: bounded LRU with a time to live per entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use crate::store::{SessionStore, StoreStats};

/// Keys longer than this are refused: TLS session ids are at most 32 bytes and rustls' stateful
/// TLS 1.3 ticket ids are 32 bytes, so anything bigger is not ours.
pub const MAX_KEY_LEN: usize = 255;
/// Values longer than this are refused: an encoded session with a client certificate chain is a
/// few KB; the bound keeps a misbehaving peer from growing the cache without limit.
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// LRU + TTL store. Recency is a monotonically increasing stamp per entry, ordered in a
/// `BTreeMap`, so eviction of the least recently used entry is `O(log n)`.
#[derive(Debug)]
pub struct MemoryStore {
    capacity: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Vec<u8>, Entry>,
    recency: BTreeMap<u64, Vec<u8>>,
    next_stamp: u64,
    stats: StoreStats,
}

#[derive(Debug)]
struct Entry {
    value: Zeroizing<Vec<u8>>,
    expires: Instant,
    stamp: u64,
}

impl MemoryStore {
    /// A store holding at most `capacity` sessions, each for at most `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity,
            ttl,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that
        // matters more than losing the cache, so a poisoned lock is simply taken over.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.recency.remove(&entry.stamp);
        Some(entry)
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Looks `key` up, dropping it if expired, and marks it recently used.
    fn lookup(&mut self, key: &[u8], now: Instant) -> Option<&Entry> {
        let expired = match self.entries.get(key) {
            None => {
                self.stats.misses += 1;
                return None;
            }
            Some(e) => e.expires <= now,
        };
        if expired {
            self.remove(key);
            self.stats.expirations += 1;
            self.stats.misses += 1;
            return None;
        }
        let stamp = self.stamp();
        let entry = self.entries.get_mut(key)?;
        let old = std::mem::replace(&mut entry.stamp, stamp);
        if let Some(k) = self.recency.remove(&old) {
            self.recency.insert(stamp, k);
        }
        self.stats.hits += 1;
        self.entries.get(key)
    }
}

impl MemoryStore {
    /// Stores `value` for at most `ttl` (never longer than the store's own TTL): for sessions
    /// that arrive from elsewhere with part of their life already spent.
    pub fn put_for(&self, key: &[u8], value: &[u8], ttl: Duration, now: Instant) -> bool {
        self.insert(key, value, ttl.min(self.ttl), now)
    }

    fn insert(&self, key: &[u8], value: &[u8], ttl: Duration, now: Instant) -> bool {
        if self.capacity == 0 || key.len() > MAX_KEY_LEN || value.len() > MAX_VALUE_LEN {
            return false;
        }
        let mut inner = self.lock();
        inner.remove(key);
        while inner.entries.len() >= self.capacity {
            let Some((_, oldest)) = inner.recency.pop_first() else {
                break;
            };
            if let Some(e) = inner.entries.remove(&oldest) {
                if e.expires <= now {
                    inner.stats.expirations += 1;
                } else {
                    inner.stats.evictions += 1;
                }
            }
        }
        let stamp = inner.stamp();
        inner.recency.insert(stamp, key.to_vec());
        inner.entries.insert(
            key.to_vec(),
            Entry {
                value: Zeroizing::new(value.to_vec()),
                expires: now + ttl,
                stamp,
            },
        );
        true
    }
}

impl SessionStore for MemoryStore {
    fn put(&self, key: &[u8], value: &[u8], now: Instant) -> bool {
        self.insert(key, value, self.ttl, now)
    }

    fn get(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.lock().lookup(key, now).map(|e| e.value.to_vec())
    }

    fn take(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        let mut inner = self.lock();
        inner.lookup(key, now)?;
        // `lookup` proved the entry exists; moving the value out avoids a copy of the secret.
        inner.remove(key).map(|mut e| std::mem::take(&mut *e.value))
    }

    /// Exclusive: a memory store is used alone (`--store memory`) only where no other process
    /// holds its sessions, and its lock makes the removal atomic. (The shared stores keep a
    /// `MemoryStore` as their local cache, but answer `take_once` themselves.)
    fn take_once(&self, key: &[u8], now: Instant) -> crate::Taken {
        match self.take(key, now) {
            Some(v) => crate::Taken::Exclusive(v),
            None => crate::Taken::Absent,
        }
    }

    fn stats(&self) -> StoreStats {
        let inner = self.lock();
        StoreStats {
            entries: inner.entries.len() as u64,
            ..inner.stats
        }
    }
}

impl MemoryStore {
    /// Removes `key` if present, without counting a lookup (a removal replicated from a peer).
    pub fn remove(&self, key: &[u8]) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// However many threads race for one session, exactly one is handed it, exclusively.
    #[test]
    fn take_once_is_single_use_under_races() {
        for round in 0..50 {
            let store = std::sync::Arc::new(MemoryStore::new(16, Duration::from_secs(60)));
            let now = Instant::now();
            store.put(b"ticket", b"secret", now);
            let winners: usize = std::thread::scope(|s| {
                let takers: Vec<_> = (0..8)
                    .map(|_| {
                        let store = store.clone();
                        s.spawn(move || {
                            matches!(store.take_once(b"ticket", now), crate::Taken::Exclusive(_))
                        })
                    })
                    .collect();
                takers.into_iter().map(|t| t.join().unwrap() as usize).sum()
            });
            assert_eq!(winners, 1, "round {round}");
            assert_eq!(store.take_once(b"ticket", now), crate::Taken::Absent);
        }
    }

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn get_take_and_expiry() {
        let s = MemoryStore::new(4, TTL);
        let t0 = Instant::now();
        assert!(s.put(b"a", b"one", t0));
        assert_eq!(s.get(b"a", t0).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.get(b"a", t0 + TTL), None, "expired at exactly ttl");
        assert!(s.put(b"b", b"two", t0));
        assert_eq!(s.take(b"b", t0).as_deref(), Some(&b"two"[..]));
        assert_eq!(s.take(b"b", t0), None, "take is single use");
        let st = s.stats();
        assert_eq!((st.entries, st.hits, st.expirations), (0, 2, 1));
    }

    #[test]
    fn evicts_least_recently_used() {
        let s = MemoryStore::new(2, TTL);
        let t = Instant::now();
        s.put(b"a", b"1", t);
        s.put(b"b", b"2", t);
        // touch a, so b is the least recently used
        s.get(b"a", t);
        s.put(b"c", b"3", t);
        assert!(s.get(b"b", t).is_none());
        assert!(s.get(b"a", t).is_some());
        assert!(s.get(b"c", t).is_some());
        assert_eq!(s.stats().evictions, 1);
    }

    #[test]
    fn refuses_oversized_and_zero_capacity() {
        let t = Instant::now();
        assert!(!MemoryStore::new(0, TTL).put(b"a", b"1", t));
        let s = MemoryStore::new(2, TTL);
        assert!(!s.put(&[0; MAX_KEY_LEN + 1], b"1", t));
        assert!(!s.put(b"k", &vec![0; MAX_VALUE_LEN + 1], t));
    }

    proptest! {
        /// Whatever the operations, the store never exceeds its capacity and its recency index
        /// stays in step with its entries.
        #[test]
        fn bounded_and_consistent(ops in proptest::collection::vec((0u8..3, 0u8..16, 0u64..30), 0..200)) {
            let s = MemoryStore::new(5, TTL);
            let t0 = Instant::now();
            for (op, key, secs) in ops {
                let now = t0 + Duration::from_secs(secs);
                match op {
                    0 => { s.put(&[key], &[key; 3], now); }
                    1 => { s.get(&[key], now); }
                    _ => { s.take(&[key], now); }
                }
                let inner = s.lock();
                prop_assert!(inner.entries.len() <= 5);
                prop_assert_eq!(inner.entries.len(), inner.recency.len());
            }
        }
    }
}
