//! Session state that outlives one TLS connection: the stores that keep TLS 1.2 session ids and
//! TLS 1.3 stateful tickets, and the ticket key ring that seals stateless tickets.
//!
//! Everything here is synchronous and takes time as a parameter, because rustls calls its
//! session seams (`StoresServerSessions`, `ProducesTickets`) synchronously from the handshake and
//! because rotation and expiry must be testable without sleeping. The agent adapts these types to
//! rustls; later the cluster (issue "dispatcher and cluster-wide sessions") adds shared stores
//! behind the same [`SessionStore`] trait.

mod error;
mod memory;
mod store;
pub mod ticket;

pub use error::Error;
pub use memory::MemoryStore;
pub use store::{SessionStore, StoreStats};
pub use ticket::{generate_key_line, KeyRing, Rotation, TicketHeader, TicketKey, TicketSealer};
