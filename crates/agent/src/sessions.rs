//! The seams between rustls and Baton's session state (`baton-session`): the stateful session
//! cache (TLS 1.2 session ids, TLS 1.3 stateful tickets) and the ticketer (stateless tickets).
//!
//! Issue "dispatcher and cluster-wide sessions" plugs shared stores and a shared key ring in
//! here; rustls only ever sees these two adapters.

use std::sync::Arc;
use std::time::Instant;

use baton_session::{SessionStore, TicketSealer};
use rustls::server::{ProducesTickets, StoresServerSessions};

use crate::metering::{CryptoOp, METER};
use crate::metrics::Metrics;

/// rustls' session cache, backed by any [`SessionStore`].
#[derive(Debug)]
pub struct SessionCache {
    pub store: Arc<dyn SessionStore>,
    /// The config's tickets allow early data: each is stored, and the store has answered,
    /// before rustls sends it (`SessionStore::put_acknowledged`); false from the store means
    /// rustls sends no ticket.
    pub acknowledged: bool,
}

impl StoresServerSessions for SessionCache {
    fn put(&self, key: Vec<u8>, mut value: Vec<u8>) -> bool {
        let now = Instant::now();
        let stored = match self.acknowledged {
            true => self.store.put_acknowledged(&key, &value, now),
            false => self.store.put(&key, &value, now),
        };
        // The encoded session holds the resumption secret; the store keeps its own copy.
        zeroize::Zeroize::zeroize(&mut value);
        stored
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.store.get(key, Instant::now())
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.store.take(key, Instant::now())
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// rustls' ticketer, backed by a [`TicketSealer`] (local rotating keys or a key file).
#[derive(Debug)]
pub struct Ticketer {
    pub sealer: Arc<TicketSealer>,
    pub metrics: Arc<Metrics>,
}

impl ProducesTickets for Ticketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.sealer.lifetime().as_secs().min(u32::MAX as u64) as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let ticket = METER.time(CryptoOp::Ticket, || {
            self.sealer.seal_at(plain, Instant::now())
        });
        self.metrics.ticket(if ticket.is_some() {
            "issued"
        } else {
            "seal_failed"
        });
        ticket
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let plain = METER.time(CryptoOp::Ticket, || {
            self.sealer.open_at(cipher, Instant::now())
        });
        self.metrics.ticket(if plain.is_some() {
            "opened"
        } else {
            "rejected"
        });
        plain
    }
}
