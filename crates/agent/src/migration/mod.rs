//! Session migration, the agents' tokio shells around `baton_migrate` (where the protocol, its
//! state machines and the TLS session extraction are).
//!
//! - [`export`]: the handshake agent's side (pumps `baton_migrate::ExportDriver`): cut,
//!   decrypt, extract, seal bound to the Offer, hand to the dispatcher; on Resume, serve the
//!   session itself.
//! - [`import`]: the home agent's side (pumps `baton_migrate::ImportDriver`): open a sealed
//!   session object, answer Ready, carry on the connection only after Commit.
//! - [`offer`]: how a link stream begins (an Offer, an Import, or a ClientHello).
//! - [`replay`]: the home agent's memory of the objects it imported.
//! - `harness` (tests only): a rustls client and the shipped drivers of the dispatcher's move
//!   and both agents' sides in memory on virtual time, with faults, and a property test of
//!   the migration's invariants.
//!
//! These shells use `crate::transport` (the socket, the TLS engine), never the connection
//! path (`crate::conn`), which calls them.

pub mod export;
pub mod import;
pub mod metrics;
pub mod offer;
pub mod replay;

#[cfg(test)]
mod harness;

#[cfg(test)]
mod leave_test;

#[cfg(test)]
mod into_layer_test;

#[cfg(test)]
mod cost_bench;
