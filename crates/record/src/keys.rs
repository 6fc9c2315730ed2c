//! What a migrated session hands the record layer: per direction the key, IV and next sequence
//! number that rustls' `dangerous_extract_secrets` returns, plus (TLS 1.3) the traffic secret
//! the key came from, without which no KeyUpdate can be followed. Everything here is secret:
//! it is zeroized on drop and `Debug` prints lengths, never bytes.

use std::fmt;

use zeroize::Zeroizing;

use crate::suite::{Suite, Version, NONCE_LEN};

/// One direction's state as rustls extracted it.
#[derive(Clone)]
pub struct DirectionSecrets {
    /// The *next* sequence number (rustls' `ExtractedSecrets` semantics).
    pub seq: u64,
    /// The AEAD key.
    pub key: Zeroizing<Vec<u8>>,
    /// TLS 1.2 GCM: the 4-byte salt followed by 8 bytes (rustls' extracted `Iv`; the explicit
    /// nonce on the wire is those 8 bytes XOR the sequence number). TLS 1.2 ChaCha20-Poly1305
    /// and TLS 1.3: the 12-byte IV.
    pub iv: [u8; NONCE_LEN],
    /// TLS 1.3: the application traffic secret of this key generation or of an earlier one
    /// (the key log's `CLIENT_TRAFFIC_SECRET_0` / `SERVER_TRAFFIC_SECRET_0`: the record layer
    /// follows it to the key's), needed for KeyUpdate. `None` in TLS 1.2, or when unknown:
    /// then a KeyUpdate from the peer is a clean fatal error.
    pub traffic_secret: Option<Zeroizing<Vec<u8>>>,
}

impl Drop for DirectionSecrets {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.iv);
    }
}

impl fmt::Debug for DirectionSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectionSecrets")
            .field("seq", &self.seq)
            .field("key", &Redacted(self.key.len()))
            .field("iv", &Redacted(self.iv.len()))
            .field(
                "traffic_secret",
                &self.traffic_secret.as_ref().map(|s| Redacted(s.len())),
            )
            .finish()
    }
}

/// Both directions of an established session, from our (the server's) point of view: `tx` is
/// what we send (rustls' `ExtractedSecrets::tx`), `rx` what we receive.
#[derive(Clone, Debug)]
pub struct SessionKeys {
    /// The negotiated version.
    pub version: Version,
    /// The negotiated AEAD.
    pub suite: Suite,
    /// Our sending direction.
    pub tx: DirectionSecrets,
    /// Our receiving direction.
    pub rx: DirectionSecrets,
}

/// Prints `<n bytes redacted>` in place of a secret.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes redacted>", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_key_material() {
        let secrets = DirectionSecrets {
            seq: 7,
            key: Zeroizing::new(vec![0xab; 16]),
            iv: [0xcd; 12],
            traffic_secret: Some(Zeroizing::new(vec![0xef; 32])),
        };
        let keys = SessionKeys {
            version: Version::Tls13,
            suite: Suite::Aes128Gcm,
            tx: secrets.clone(),
            rx: secrets,
        };
        let text = format!("{keys:?} {keys:#?}");
        for needle in ["ab", "AB", "171", "cd", "205", "ef", "239"] {
            assert!(!text.contains(needle), "{needle} in {text}");
        }
        assert!(text.contains("seq: 7"));
        assert!(text.contains("<16 bytes redacted>"));
    }
}
