//! Session migration (CSSL-SF), the agents' side of `baton_wire::handoff` (where the protocol
//! and the dispatcher's state machine are written down).
//!
//! - [`session`]: the handshake agent's TLS work, without I/O: decrypting up to the cut,
//!   extracting the session from rustls into a session object.
//! - [`export`]: the shell of the handshake agent's side (`baton_wire::handoff::Exporter`):
//!   cut, decrypt, extract, seal bound to the Offer, hand to the dispatcher; on Resume,
//!   serve the session itself.
//! - [`import`]: the shell of the home agent's side (`baton_wire::handoff::Importer`): open a
//!   sealed session object, answer Ready, carry on the connection only after Commit.
//! - [`stream`]: a migrated connection (record layer over the socket) as a tokio stream.
//! - [`secrets`]: TLS 1.3 traffic secrets captured for KeyUpdate after the move.
//! - `harness` (tests only): a rustls client, the dispatcher's relay and both agents' sides in
//!   memory on virtual time, with faults, and a property test of the migration's invariants.

pub mod export;
pub mod import;
pub mod metrics;
pub mod secrets;
pub mod session;
pub mod stream;

use baton_record::{DirectionSecrets, RecordLayer, SessionKeys, Suite, Version};
use baton_session::migration::{DirectionState, SessionObject};

use crate::http::ConnInfo;
pub use secrets::SecretLog;

/// The record layer's version and AEAD for a TLS version and IANA suite; `None` for anything
/// the agent does not negotiate.
pub fn record_suite(version: u16, suite: u16) -> Option<(Version, Suite)> {
    let v = match version {
        0x0303 => Version::Tls12,
        0x0304 => Version::Tls13,
        _ => return None,
    };
    let s = match (v, suite) {
        (Version::Tls13, 0x1301) => Suite::Aes128Gcm,
        (Version::Tls13, 0x1302) => Suite::Aes256Gcm,
        (Version::Tls13, 0x1303) => Suite::Chacha20Poly1305,
        // ECDHE_ECDSA / ECDHE_RSA _WITH_AES_128_GCM_SHA256, _AES_256_GCM_SHA384,
        // _CHACHA20_POLY1305_SHA256
        (Version::Tls12, 0xc02b | 0xc02f) => Suite::Aes128Gcm,
        (Version::Tls12, 0xc02c | 0xc030) => Suite::Aes256Gcm,
        (Version::Tls12, 0xcca9 | 0xcca8) => Suite::Chacha20Poly1305,
        _ => return None,
    };
    Some((v, s))
}

fn direction(d: &DirectionState) -> DirectionSecrets {
    DirectionSecrets {
        seq: d.seq,
        key: d.key.clone(),
        iv: d.iv,
        traffic_secret: d.secret.clone(),
    }
}

/// The record layer that carries on `obj`'s connection.
pub fn record_layer(obj: &SessionObject) -> Option<RecordLayer> {
    let (version, suite) = record_suite(obj.version, obj.suite)?;
    RecordLayer::new(SessionKeys {
        version,
        suite,
        tx: direction(&obj.tx),
        rx: direction(&obj.rx),
    })
    .ok()
}

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
