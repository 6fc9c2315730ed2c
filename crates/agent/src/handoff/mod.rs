//! Session migration, the agents' tokio shells around `baton_migrate` (where the protocol, its
//! state machines and the TLS session extraction are).
//!
//! - [`export`]: the handshake agent's side (`baton_migrate::Exporter`): cut, decrypt,
//!   extract, seal bound to the Offer, hand to the dispatcher; on Resume, serve the session
//!   itself.
//! - [`import`]: the home agent's side (`baton_migrate::Importer`): open a sealed session
//!   object, answer Ready, carry on the connection only after Commit.
//! - [`stream`]: a migrated connection (record layer over the socket) as a tokio stream.
//! - `harness` (tests only): a rustls client, the dispatcher's relay and both agents' sides in
//!   memory on virtual time, with faults, and a property test of the migration's invariants.

pub mod export;
pub mod import;
pub mod metrics;
pub mod stream;

use baton_session::migration::SessionObject;

use crate::http::ConnInfo;

/// What the HTTP side is told about a migrated connection.
pub fn conn_info(obj: &SessionObject, peer: std::net::SocketAddr) -> ConnInfo {
    ConnInfo {
        peer,
        version: if obj.version == 0x0304 {
            "TLSv1.3"
        } else {
            "TLSv1.2"
        },
        suite: format!("{:?}", rustls::CipherSuite::from(obj.suite)),
        alpn: obj
            .alpn
            .as_ref()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
        sni: obj.sni.clone(),
        resumed: obj.resumed,
        client_subject: obj.client_subject.clone(),
        // Early data never rides a migration: a migrated connection's handshake is over.
        early: None,
    }
}

#[cfg(test)]
mod harness;

#[cfg(test)]
mod leave_test;

#[cfg(test)]
mod into_layer_test;

#[cfg(test)]
mod cost_bench;
