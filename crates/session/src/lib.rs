//! Session state that outlives one TLS connection: the stores that keep TLS 1.2 session ids and
//! TLS 1.3 stateful tickets, and the ticket key ring that seals stateless tickets.
//!
//! The store trait, the stores' data structures, the ticket ring and the replication protocol
//! are synchronous and take time as a parameter, because rustls calls its session seams
//! (`StoresServerSessions`, `ProducesTickets`) synchronously from the handshake and because
//! rotation, expiry and replication must be testable without sleeping or sockets. Only the
//! shared backends do I/O: `peers` (tokio tasks) and `redis` (a worker thread), behind the
//! default feature `backends` (without it, the crate has no tokio).

#![forbid(unsafe_code)]

mod error;
pub mod fuzzing;
mod memory;
pub mod migration;
#[cfg(feature = "backends")]
pub mod peers;
#[cfg(feature = "backends")]
pub mod redis;
pub mod replication;
mod store;
pub mod ticket;

pub use error::Error;
pub use memory::MemoryStore;
pub use migration::{ImportError, ReplayGuard, SessionObject};
#[cfg(feature = "backends")]
pub use peers::{AllowFrom, PeerStore, PeersConfig, SharedRing};
#[cfg(feature = "backends")]
pub use redis::{RedisConfig, RedisStore};
pub use store::{SessionStore, StoreStats, Taken, TakenKind};
pub use ticket::{generate_key_line, KeyRing, Rotation, TicketHeader, TicketKey, TicketSealer};
