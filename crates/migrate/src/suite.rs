//! The record layer that carries a migrated session on: the version and AEAD a session
//! object names, and the keys and sequence numbers it holds.

use baton_record::{DirectionSecrets, RecordLayer, SessionKeys, Suite, Version};
use baton_session::migration::{DirectionState, SessionObject};

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
