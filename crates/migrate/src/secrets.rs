//! Capturing TLS 1.3 application traffic secrets for connections that may migrate.
//!
//! rustls' `dangerous_extract_secrets` gives key, IV and sequence numbers, but a KeyUpdate
//! after the move needs the traffic secret the key came from (`shared/MIGRATION-NOTES.md`).
//! rustls hands that secret only to a `KeyLog`, keyed by the client random. This log keeps it
//! in memory — never written anywhere — and only for connections that asked for it before
//! their handshake ([`SecretLog::expect`]); everything else it is offered is ignored, so a
//! normal handshake costs one lookup. Entries are zeroized when taken or dropped, and the map
//! is bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use zeroize::Zeroizing;

/// Connections waiting for secrets at once, at most; beyond it [`SecretLog::expect`] says no and
/// that connection is not offered for migration.
const MAX_EXPECTED: usize = 16 * 1024;

const CLIENT: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER: &str = "SERVER_TRAFFIC_SECRET_0";

/// The generation-0 application traffic secrets of one TLS 1.3 connection.
#[derive(Default, Clone)]
pub struct TrafficSecrets {
    pub client: Option<Zeroizing<Vec<u8>>>,
    pub server: Option<Zeroizing<Vec<u8>>>,
}

/// A `rustls::KeyLog` that keeps the secrets of expected connections in memory.
#[derive(Default)]
pub struct SecretLog {
    expected: Mutex<HashMap<[u8; 32], TrafficSecrets>>,
}

impl std::fmt::Debug for SecretLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretLog { .. }")
    }
}

impl SecretLog {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], TrafficSecrets>> {
        self.expected.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for the secrets of the connection whose ClientHello carried `client_random`.
    /// The returned guard forgets them when dropped; `None` if too many are waiting.
    pub fn expect(self: &Arc<Self>, client_random: [u8; 32]) -> Option<Expected> {
        let mut map = self.map();
        if map.len() >= MAX_EXPECTED || map.contains_key(&client_random) {
            return None;
        }
        map.insert(client_random, TrafficSecrets::default());
        Some(Expected {
            log: self.clone(),
            client_random,
        })
    }
}

/// Interest in one connection's secrets.
pub struct Expected {
    log: Arc<SecretLog>,
    client_random: [u8; 32],
}

impl Expected {
    /// The secrets captured so far (both, after a TLS 1.3 handshake; none in TLS 1.2).
    pub fn take(&self) -> TrafficSecrets {
        self.log
            .map()
            .get_mut(&self.client_random)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.log.map().remove(&self.client_random);
    }
}

impl rustls::KeyLog for SecretLog {
    fn will_log(&self, label: &str) -> bool {
        label == CLIENT || label == SERVER
    }

    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let Ok(random) = <[u8; 32]>::try_from(client_random) else {
            return;
        };
        let mut map = self.map();
        let Some(entry) = map.get_mut(&random) else {
            return;
        };
        let value = Some(Zeroizing::new(secret.to_vec()));
        match label {
            CLIENT => entry.client = value,
            SERVER => entry.server = value,
            _ => {}
        }
    }
}

/// The client random of a ClientHello at the start of `head` (a first record that holds at
/// least the hello's first 43 bytes); `None` otherwise.
pub fn client_random(head: &[u8]) -> Option<[u8; 32]> {
    // record header (5), handshake type + length (4), client_version (2), random (32)
    if head.len() < 43 || head[0] != 0x16 || head[5] != 0x01 {
        return None;
    }
    head[11..43].try_into().ok()
}

/// Whether `head`, the first bytes of a connection, could be the start of a ClientHello (a
/// handshake record whose first message is a client_hello), whose random is worth waiting for.
pub fn client_random_may_follow(head: &[u8]) -> bool {
    head.first() == Some(&0x16) && head.get(5).is_none_or(|&t| t == 0x01)
}

#[cfg(test)]
mod tests {
    use rustls::KeyLog;

    use super::*;

    #[test]
    fn keeps_only_expected_connections_and_forgets_on_drop() {
        let log = Arc::new(SecretLog::default());
        log.log(CLIENT, &[1; 32], b"ignored");
        assert!(log.map().is_empty());
        {
            let e = log.expect([2; 32]).unwrap();
            assert!(log.expect([2; 32]).is_none(), "one interest per random");
            log.log(CLIENT, &[2; 32], b"c");
            log.log(SERVER, &[2; 32], b"s");
            log.log("EXPORTER_SECRET", &[2; 32], b"x");
            let s = e.take();
            assert_eq!(s.client.as_deref().map(|v| &v[..]), Some(&b"c"[..]));
            assert_eq!(s.server.as_deref().map(|v| &v[..]), Some(&b"s"[..]));
            assert!(e.take().client.is_none(), "taken once");
        }
        assert!(log.map().is_empty());
        assert!(!log.will_log("CLIENT_HANDSHAKE_TRAFFIC_SECRET"));
    }

    #[test]
    fn finds_the_client_random() {
        let mut hello = vec![0x16, 3, 1, 0, 200, 1, 0, 0, 196, 3, 3];
        hello.extend([7u8; 32]);
        assert_eq!(client_random(&hello), Some([7; 32]));
        assert_eq!(client_random(&hello[..42]), None);
        assert!(client_random_may_follow(&hello[..5]));
        assert!(client_random_may_follow(&hello[..11]));
        hello[5] = 2;
        assert_eq!(client_random(&hello), None);
        assert!(!client_random_may_follow(&hello[..11]));
        assert!(!client_random_may_follow(b"GET / HTTP/1.1"));
        assert!(!client_random_may_follow(b""));
    }
}
