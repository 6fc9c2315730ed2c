//! The receiving half of one key generation: one AEAD key, its IV and the sequence number the
//! peer's next record must carry. Decrypts in place and returns the record's (inner) content
//! type and plaintext; a KeyUpdate from the peer replaces the whole `Opener`, sequence 0.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce};
use zeroize::Zeroizing;

use crate::cipher::{
    aead_key, gcm_nonce, tls12_aad, xor_nonce, HEADER_LEN, MAX_PLAINTEXT_LEN, SEQ_HARD_LIMIT,
};
use crate::error::{Error, PeerMisbehaved};
use crate::message::ContentType;
use crate::suite::{Suite, Version, NONCE_LEN, TAG_LEN};

/// Opens records under one key.
pub struct Opener {
    version: Version,
    suite: Suite,
    key: LessSafeKey,
    /// The key's bytes (the AEAD object keeps them out of reach): a session that moves on
    /// carries them ([`crate::RecordLayer::export`]).
    key_bytes: Zeroizing<Vec<u8>>,
    iv: Zeroizing<[u8; NONCE_LEN]>,
    seq: u64,
}

/// A decrypted record: its content type and where its plaintext lies in the payload buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The content type (TLS 1.3: the inner type).
    pub typ: ContentType,
    /// The plaintext's range within the payload slice given to `open`.
    pub range: std::ops::Range<usize>,
}

impl Opener {
    /// An opener expecting the peer's next record to carry sequence number `seq`.
    pub fn new(
        version: Version,
        suite: Suite,
        key: &[u8],
        iv: &[u8; NONCE_LEN],
        seq: u64,
    ) -> Result<Self, Error> {
        Ok(Self {
            version,
            suite,
            key: aead_key(suite, key)?,
            key_bytes: Zeroizing::new(key.to_vec()),
            iv: Zeroizing::new(*iv),
            seq,
        })
    }

    /// The key and IV, for carrying the session on elsewhere.
    pub(crate) fn key_iv(&self) -> (&[u8], &[u8; NONCE_LEN]) {
        (&self.key_bytes, &self.iv)
    }

    /// The sequence number the next record must carry.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Decrypts, in place, the record with header `hdr` and payload `payload` as sequence
    /// number `seq`. TLS 1.3: strips the padding and returns the inner type.
    pub fn open_with_seq(
        &self,
        seq: u64,
        hdr: &[u8; HEADER_LEN],
        payload: &mut [u8],
    ) -> Result<Opened, Error> {
        match self.version {
            Version::Tls13 => self.open_tls13(seq, hdr, payload),
            Version::Tls12 => self.open_tls12(seq, hdr, payload),
        }
    }

    /// Decrypts the next record (see [`Self::open_with_seq`]) and advances the sequence
    /// number; refuses at [`SEQ_HARD_LIMIT`].
    pub fn open(&mut self, hdr: &[u8; HEADER_LEN], payload: &mut [u8]) -> Result<Opened, Error> {
        if self.seq >= SEQ_HARD_LIMIT {
            return Err(Error::PeerSequenceExhausted);
        }
        let opened = self.open_with_seq(self.seq, hdr, payload)?;
        self.seq += 1;
        Ok(opened)
    }

    fn open_tls13(
        &self,
        seq: u64,
        hdr: &[u8; HEADER_LEN],
        payload: &mut [u8],
    ) -> Result<Opened, Error> {
        if payload.len() < TAG_LEN {
            return Err(Error::DecryptFailed);
        }
        let nonce = Nonce::assume_unique_for_key(xor_nonce(&self.iv, seq));
        let inner = self
            .key
            .open_in_place(nonce, Aad::from(*hdr), payload)
            .map_err(|_| Error::DecryptFailed)?;
        // TLSInnerPlaintext: content || type || zeros, at most 2^14 + 1 before the padding
        // (RFC 8446 5.4).
        if inner.len() > MAX_PLAINTEXT_LEN + 1 {
            return Err(Error::RecordOverflow {
                len: inner.len(),
                max: MAX_PLAINTEXT_LEN + 1,
            });
        }
        let Some(type_at) = inner.iter().rposition(|&b| b != 0) else {
            return Err(PeerMisbehaved::MissingInnerContentType.into());
        };
        Ok(Opened {
            typ: ContentType(inner[type_at]),
            range: 0..type_at,
        })
    }

    fn open_tls12(
        &self,
        seq: u64,
        hdr: &[u8; HEADER_LEN],
        payload: &mut [u8],
    ) -> Result<Opened, Error> {
        let explicit_len = self.suite.tls12_explicit_nonce_len();
        let Some(plaintext_len) = payload.len().checked_sub(explicit_len + TAG_LEN) else {
            return Err(Error::DecryptFailed);
        };
        let nonce = match payload.get(..explicit_len).map(<[u8; 8]>::try_from) {
            Some(Ok(explicit)) => gcm_nonce(&self.iv, &explicit),
            _ => xor_nonce(&self.iv, seq),
        };
        let typ = ContentType(hdr[0]);
        let aad_len = u16::try_from(plaintext_len).map_err(|_| Error::DecryptFailed)?;
        let aad = tls12_aad(seq, typ, [hdr[1], hdr[2]], aad_len);
        let plaintext = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut payload[explicit_len..],
            )
            .map_err(|_| Error::DecryptFailed)?;
        if plaintext.len() > MAX_PLAINTEXT_LEN {
            return Err(Error::RecordOverflow {
                len: plaintext.len(),
                max: MAX_PLAINTEXT_LEN,
            });
        }
        Ok(Opened {
            typ,
            range: explicit_len..explicit_len + plaintext.len(),
        })
    }
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("version", &self.version)
            .field("suite", &self.suite)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "cipher_test.rs"]
pub(crate) mod tests;
