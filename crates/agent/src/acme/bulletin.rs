//! What the agents of a cluster tell each other about certificates, through the session store
//! they share (peers or Redis): heartbeats, issued certificates with their keys, the ACME
//! account, and the challenge answers of an order in progress.
//!
//! Every value is sealed under the cluster key (on top of whatever the store does) and posted
//! under a key that names its topic and a time bucket. The agent that orders posts again in
//! every bucket: an agent that starts late or was cut off reads the current and the previous
//! bucket and so learns within one bucket what is current, and no reader is fooled by a copy
//! a store cached locally (Redis's local cache keeps a key for the session lifetime; a new
//! bucket is a new key). Only the agent that orders posts certificates: a store's local copy
//! of one's own post would hide a newer one from another agent under the same key.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use baton_session::{SessionStore, SharedRing};

/// How often holders post, and heartbeats are sent.
pub const PERIOD: Duration = Duration::from_secs(2);
/// The span of one bucket: a post is read for one to two buckets.
const BUCKET_SECS: u64 = 5;
/// Bound into every seal: a blob of another kind (a session) never opens as one of these.
const CONTEXT: &[u8] = b"baton-acme-v1/";

#[derive(Clone)]
pub struct Bulletin {
    store: Arc<dyn SessionStore>,
    ring: SharedRing,
    me: u16,
}

impl std::fmt::Debug for Bulletin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bulletin(agent {})", self.me)
    }
}

fn bucket(now: SystemTime) -> u64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / BUCKET_SECS)
}

fn key(topic: &str, bucket: u64) -> Vec<u8> {
    format!("baton-acme/{topic}/{bucket}").into_bytes()
}

impl Bulletin {
    pub fn new(store: Arc<dyn SessionStore>, ring: SharedRing, me: u16) -> Self {
        Self { store, ring, me }
    }

    /// Posts `value` under `topic` for the current bucket. May block briefly (a Redis store
    /// queues without waiting; peers replicate in the background).
    pub fn post(&self, topic: &str, value: &[u8], now: SystemTime) -> bool {
        let key = key(topic, bucket(now));
        let sealed = {
            let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
            ring.seal_large(self.me, value, &[CONTEXT, &key].concat())
        };
        match sealed {
            Some(sealed) => self.store.put(&key, &sealed, Instant::now()),
            None => false,
        }
    }

    /// What was posted under `topic` in the current and the previous bucket (the current
    /// first), each opened; blobs that do not open under the cluster key are ignored. May block
    /// for the store's wait (Redis).
    pub fn read(&self, topic: &str, now: SystemTime) -> Vec<Vec<u8>> {
        let b = bucket(now);
        [b, b.saturating_sub(1)]
            .into_iter()
            .filter_map(|b| {
                let key = key(topic, b);
                let sealed = self.store.get(&key, Instant::now())?;
                let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
                ring.open(&sealed, &[CONTEXT, &key].concat())
            })
            .collect()
    }

    /// Posts `value` under `topic` without a bucket: for what never changes once made (the
    /// account), kept as long as a session (and again with each post).
    pub fn keep(&self, topic: &str, value: &[u8]) -> bool {
        let key = format!("baton-acme/{topic}").into_bytes();
        let sealed = {
            let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
            ring.seal_large(self.me, value, &[CONTEXT, &key].concat())
        };
        match sealed {
            Some(sealed) => self.store.put(&key, &sealed, Instant::now()),
            None => false,
        }
    }

    /// What [`Bulletin::keep`] kept under `topic`.
    pub fn kept(&self, topic: &str) -> Option<Vec<u8>> {
        let key = format!("baton-acme/{topic}").into_bytes();
        let sealed = self.store.get(&key, Instant::now())?;
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        ring.open(&sealed, &[CONTEXT, &key].concat())
    }

    /// Takes or renews the cluster-wide lock on `topic` for `token` ([`SessionStore::lock`]):
    /// `None` where the store has none (peers) or did not answer.
    pub fn lock(&self, topic: &str, token: &[u8], ttl: Duration) -> Option<bool> {
        self.store
            .lock(format!("baton-acme/lock/{topic}").as_bytes(), token, ttl)
    }

    /// Releases the lock on `topic` if `token` holds it.
    pub fn unlock(&self, topic: &str, token: &[u8]) {
        self.store
            .unlock(format!("baton-acme/lock/{topic}").as_bytes(), token)
    }

    pub fn me(&self) -> u16 {
        self.me
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_session::{KeyRing, MemoryStore};
    use std::sync::RwLock;

    fn ring(line: &str) -> SharedRing {
        Arc::new(RwLock::new(
            KeyRing::parse_key_file(line, Instant::now()).unwrap(),
        ))
    }

    #[test]
    fn posts_are_read_back_for_two_buckets_and_sealed() {
        let line = baton_session::generate_key_line().unwrap();
        let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new(100, Duration::from_secs(60)));
        let b = Bulletin::new(store.clone(), ring(&line), 1);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(b.post("cert/x", b"hello", t0));
        assert_eq!(b.read("cert/x", t0), vec![b"hello".to_vec()]);
        assert_eq!(
            b.read("cert/x", t0 + Duration::from_secs(BUCKET_SECS))
                .len(),
            1
        );
        assert!(b
            .read("cert/x", t0 + Duration::from_secs(2 * BUCKET_SECS))
            .is_empty());
        // the value at rest is not the plain text, and another cluster key cannot open it
        let raw = store
            .get(&key("cert/x", bucket(t0)), Instant::now())
            .unwrap();
        assert!(!raw.windows(5).any(|w| w == b"hello"));
        let other = Bulletin::new(store, ring(&baton_session::generate_key_line().unwrap()), 2);
        assert!(other.read("cert/x", t0).is_empty());
    }
}
