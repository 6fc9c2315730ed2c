//! Session migration, the agents' tokio shells around `baton_migrate` (where the protocol, its
//! state machines and the TLS session extraction are).
//!
//! - [`export`]: the handshake agent's side (`baton_migrate::Exporter`): cut, decrypt,
//!   extract, seal bound to the Offer, hand to the dispatcher; on Resume, serve the session
//!   itself.
//! - [`import`]: the home agent's side (`baton_migrate::Importer`): open a sealed session
//!   object, answer Ready, carry on the connection only after Commit.
//! - [`offer`]: how a link stream begins (an Offer, an Import, or a ClientHello).
//! - [`replay`]: the home agent's memory of the objects it imported.
//! - [`stream`]: a migrated connection (record layer over the socket) as a tokio stream.
//! - `harness` (tests only): a rustls client, the dispatcher's relay and both agents' sides in
//!   memory on virtual time, with faults, and a property test of the migration's invariants.

pub mod export;
pub mod import;
pub mod metrics;
pub mod offer;
pub mod replay;
pub mod stream;

#[cfg(test)]
mod harness;

#[cfg(test)]
mod leave_test;

#[cfg(test)]
mod into_layer_test;

#[cfg(test)]
mod cost_bench;
