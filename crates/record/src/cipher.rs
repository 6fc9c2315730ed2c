//! Nonce and additional-data construction per version, the one place where TLS 1.2 and 1.3
//! records differ cryptographically:
//!
//! - TLS 1.3 (RFC 8446 5.3): nonce = IV XOR sequence number (big-endian, right-aligned);
//!   AAD = the 5-byte record header.
//! - TLS 1.2 ChaCha20-Poly1305 (RFC 7905 2): the same nonce; AAD = seq || type || version ||
//!   plaintext length (RFC 5246 6.2.3.3).
//! - TLS 1.2 AES-GCM (RFC 5288 3): nonce = 4-byte salt || 8-byte explicit nonce carried in the
//!   record. The receiver takes it from the record. As sender we use IV[4..12] XOR seq, as
//!   rustls does (`crypto/aws_lc_rs/tls12.rs`): unique per key because the sequence is, and
//!   a migrated session continues exactly the nonces rustls would have used.

use aws_lc_rs::aead::{LessSafeKey, UnboundKey};

use crate::error::Error;
use crate::message::ContentType;
use crate::suite::{Suite, NONCE_LEN};

/// Bytes in a record header: type, legacy version, length (`baton-wire`'s, as are the limits
/// below that the protocol fixes).
pub use baton_wire::record::{HEADER_LEN, MAX_PLAINTEXT_LEN};

/// The legacy record version every record after the handshake carries (TLS 1.2's 0x0303,
/// which TLS 1.3 keeps on the wire, RFC 8446 5.1).
pub const RECORD_VERSION: u16 = 0x0303;

/// The largest TLS 1.3 record payload on the wire (2^14 + 256, RFC 8446 5.2).
pub const TLS13_MAX_CIPHERTEXT_LEN: usize = MAX_PLAINTEXT_LEN + 256;

/// The largest TLS 1.2 record payload on the wire (2^14 + 2048, RFC 5246 6.2.3).
pub const TLS12_MAX_CIPHERTEXT_LEN: usize = baton_wire::record::MAX_CIPHERTEXT_LEN;

/// When the sending sequence number reaches this, the key must be replaced (TLS 1.3
/// KeyUpdate) or the connection closed (TLS 1.2) before it wraps. It leaves 2^16 - 2 sequence
/// numbers for the KeyUpdate, close_notify or alert that follow. rustls' value, so both ends
/// of a migrated session agree.
pub const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;

/// No record is sealed or opened at or above this sequence number: a sequence number must
/// never wrap (RFC 8446 5.3, RFC 5246 6.1), since the next one would repeat a nonce under
/// the same key. rustls' value.
pub const SEQ_HARD_LIMIT: u64 = 0xffff_ffff_ffff_fffe;

/// A record header.
pub fn header(typ: ContentType, len: usize) -> Result<[u8; HEADER_LEN], Error> {
    let len = u16::try_from(len).map_err(|_| Error::RecordOverflow {
        len,
        max: usize::from(u16::MAX),
    })?;
    let [v0, v1] = RECORD_VERSION.to_be_bytes();
    let [l0, l1] = len.to_be_bytes();
    Ok([typ.0, v0, v1, l0, l1])
}

/// IV XOR the sequence number, big-endian in the last 8 bytes (RFC 8446 5.3).
pub fn xor_nonce(iv: &[u8; NONCE_LEN], seq: u64) -> [u8; NONCE_LEN] {
    let mut nonce = *iv;
    for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
        *n ^= s;
    }
    nonce
}

/// TLS 1.2 AES-GCM: the 4-byte salt (IV[0..4]) followed by the record's explicit nonce.
pub fn gcm_nonce(iv: &[u8; NONCE_LEN], explicit: &[u8; 8]) -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    nonce[..4].copy_from_slice(&iv[..4]);
    nonce[4..].copy_from_slice(explicit);
    nonce
}

/// TLS 1.2 additional data: seq || type || version || plaintext length (RFC 5246 6.2.3.3).
pub fn tls12_aad(seq: u64, typ: ContentType, version: [u8; 2], plaintext_len: u16) -> [u8; 13] {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = typ.0;
    aad[9..11].copy_from_slice(&version);
    aad[11..].copy_from_slice(&plaintext_len.to_be_bytes());
    aad
}

/// An aws-lc-rs AEAD key for the suite, or `InvalidKeys` if the length is wrong.
pub(crate) fn aead_key(suite: Suite, key: &[u8]) -> Result<LessSafeKey, Error> {
    if key.len() != suite.key_len() {
        return Err(Error::InvalidKeys("key length differs from the suite's"));
    }
    UnboundKey::new(suite.aead(), key)
        .map(LessSafeKey::new)
        .map_err(|_| Error::InvalidKeys("the AEAD refused the key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_is_iv_xor_big_endian_seq() {
        let iv = [0xff; 12];
        let n = xor_nonce(&iv, 0x0102_0304_0506_0708);
        assert_eq!(
            n,
            [0xff, 0xff, 0xff, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9, 0xf8, 0xf7]
        );
        assert_eq!(xor_nonce(&iv, 0), iv);
    }

    #[test]
    fn gcm_nonce_is_salt_then_explicit() {
        let mut iv = [0u8; 12];
        iv[..4].copy_from_slice(&[1, 2, 3, 4]);
        iv[4..].copy_from_slice(&[9; 8]);
        assert_eq!(
            gcm_nonce(&iv, &[5; 8]),
            [1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 5, 5]
        );
    }

    #[test]
    fn tls12_aad_layout() {
        let aad = tls12_aad(2, ContentType::APPLICATION_DATA, [3, 3], 0x1234);
        assert_eq!(aad, [0, 0, 0, 0, 0, 0, 0, 2, 23, 3, 3, 0x12, 0x34]);
    }

    #[test]
    fn header_refuses_lengths_over_u16() {
        assert_eq!(header(ContentType::ALERT, 19).unwrap(), [21, 3, 3, 0, 19]);
        assert!(header(ContentType::ALERT, 70_000).is_err());
    }

    #[test]
    fn aead_key_checks_length() {
        assert!(aead_key(Suite::Aes128Gcm, &[0; 16]).is_ok());
        assert!(aead_key(Suite::Aes128Gcm, &[0; 32]).is_err());
        assert!(aead_key(Suite::Chacha20Poly1305, &[0; 16]).is_err());
    }
}
