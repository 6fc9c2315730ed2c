//! The protocol version and the AEAD of a session, and the few numbers that follow from them
//! (key length, hash of the TLS 1.3 key schedule, record overhead, how many records one key may
//! protect). Baton's agent refuses every legacy suite, so three AEADs are all there is: what a
//! migrated session can carry is decided here, once.

use aws_lc_rs::{aead, hkdf};

/// The TLS version of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// TLS 1.2 (RFC 5246) with an AEAD suite (RFC 5288, RFC 7905).
    Tls12,
    /// TLS 1.3 (RFC 8446).
    Tls13,
}

/// The record protection of the session.
///
/// In TLS 1.3 these are `TLS_AES_128_GCM_SHA256`, `TLS_AES_256_GCM_SHA384` and
/// `TLS_CHACHA20_POLY1305_SHA256`; in TLS 1.2 the `ECDHE_*_WITH_AES_128_GCM_SHA256`,
/// `ECDHE_*_WITH_AES_256_GCM_SHA384` and `ECDHE_*_WITH_CHACHA20_POLY1305_SHA256` suites (the
/// key exchange and the PRF hash are spent once the handshake is over).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suite {
    /// AES-128-GCM.
    Aes128Gcm,
    /// AES-256-GCM.
    Aes256Gcm,
    /// ChaCha20-Poly1305.
    Chacha20Poly1305,
}

/// Bytes of the AEAD tag appended to every record by all three AEADs.
pub const TAG_LEN: usize = 16;

/// Bytes of the nonce (and so of the IV) of all three AEADs.
pub const NONCE_LEN: usize = 12;

/// Bytes of the explicit nonce that TLS 1.2 AES-GCM records carry before the ciphertext
/// (RFC 5288 3). ChaCha20-Poly1305 (RFC 7905) and TLS 1.3 carry none.
pub const GCM_EXPLICIT_NONCE_LEN: usize = 8;

/// How many records one AES-GCM key protects before we replace it (TLS 1.3) or close (TLS 1.2).
///
/// RFC 8446 5.5 allows 2^24.5 full-size records under one AES-GCM key, keeping an attacker's
/// advantage in telling ciphertext from random below 2^-60. We stop at 2^24, below that bound
/// and the same as rustls' `confidentiality_limit`, so a rustls peer and we agree on when a key
/// is worn out.
pub const AES_GCM_CONFIDENTIALITY_LIMIT: u64 = 1 << 24;

/// How many records one ChaCha20-Poly1305 key protects: no bound short of the sequence space
/// (RFC 8446 5.5: the limit is larger than 2^64), so only [`crate::SEQ_SOFT_LIMIT`] applies.
pub const CHACHA20_POLY1305_CONFIDENTIALITY_LIMIT: u64 = u64::MAX;

impl Suite {
    /// The AEAD key length in bytes.
    pub fn key_len(self) -> usize {
        self.aead().key_len()
    }

    /// The aws-lc-rs AEAD algorithm.
    pub fn aead(self) -> &'static aead::Algorithm {
        match self {
            Self::Aes128Gcm => &aead::AES_128_GCM,
            Self::Aes256Gcm => &aead::AES_256_GCM,
            Self::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    /// The HKDF of the TLS 1.3 key schedule: SHA-384 for `TLS_AES_256_GCM_SHA384`, SHA-256
    /// for the other two.
    pub fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Self::Aes256Gcm => hkdf::HKDF_SHA384,
            Self::Aes128Gcm | Self::Chacha20Poly1305 => hkdf::HKDF_SHA256,
        }
    }

    /// The output length of that hash, which is also the length of a TLS 1.3 traffic secret.
    pub fn hash_len(self) -> usize {
        match self {
            Self::Aes256Gcm => 48,
            Self::Aes128Gcm | Self::Chacha20Poly1305 => 32,
        }
    }

    /// How many records one key of this AEAD may protect (see the constants' docs).
    pub fn confidentiality_limit(self) -> u64 {
        match self {
            Self::Aes128Gcm | Self::Aes256Gcm => AES_GCM_CONFIDENTIALITY_LIMIT,
            Self::Chacha20Poly1305 => CHACHA20_POLY1305_CONFIDENTIALITY_LIMIT,
        }
    }

    /// Whether TLS 1.2 records of this suite carry an explicit nonce.
    pub(crate) fn tls12_explicit_nonce_len(self) -> usize {
        match self {
            Self::Aes128Gcm | Self::Aes256Gcm => GCM_EXPLICIT_NONCE_LEN,
            Self::Chacha20Poly1305 => 0,
        }
    }

    /// Bytes a record's payload grows by when sealed, not counting the 5-byte header: explicit
    /// nonce (TLS 1.2 GCM), the inner content type (TLS 1.3) and the tag.
    pub fn overhead(self, version: Version) -> usize {
        match version {
            Version::Tls12 => self.tls12_explicit_nonce_len() + TAG_LEN,
            Version::Tls13 => 1 + TAG_LEN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_match_the_suites() {
        assert_eq!(Suite::Aes128Gcm.key_len(), 16);
        assert_eq!(Suite::Aes256Gcm.key_len(), 32);
        assert_eq!(Suite::Chacha20Poly1305.key_len(), 32);
        assert_eq!(Suite::Aes256Gcm.hash_len(), 48);
        assert_eq!(Suite::Chacha20Poly1305.hash_len(), 32);
        assert_eq!(Suite::Aes128Gcm.overhead(Version::Tls12), 24);
        assert_eq!(Suite::Chacha20Poly1305.overhead(Version::Tls12), 16);
        assert_eq!(Suite::Aes256Gcm.overhead(Version::Tls13), 17);
    }
}
