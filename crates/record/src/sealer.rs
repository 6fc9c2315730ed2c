//! The sending half of one key generation: one AEAD key, its IV and the next sequence number,
//! laid out like rustls' `crypto/cipher/record_layer.rs`. [`Sealer::seal_with_seq`] takes the
//! sequence number explicitly (pure, testable against known answers); [`Sealer::seal`] uses and
//! advances its own and refuses to reuse a nonce. A KeyUpdate replaces the whole `Sealer`,
//! which resets the sequence to 0.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce};
use zeroize::Zeroizing;

use crate::cipher::{
    aead_key, gcm_nonce, header, tls12_aad, xor_nonce, HEADER_LEN, MAX_PLAINTEXT_LEN,
    SEQ_HARD_LIMIT, SEQ_SOFT_LIMIT,
};
use crate::error::Error;
use crate::message::ContentType;
use crate::suite::{Suite, Version, NONCE_LEN, TAG_LEN};

/// Seals records under one key.
pub struct Sealer {
    version: Version,
    suite: Suite,
    key: LessSafeKey,
    /// The key's bytes (the AEAD object keeps them out of reach): a session that moves on
    /// carries them ([`crate::RecordLayer::export`]).
    key_bytes: Zeroizing<Vec<u8>>,
    iv: Zeroizing<[u8; NONCE_LEN]>,
    seq: u64,
}

impl Sealer {
    /// A sealer whose next record gets sequence number `seq`.
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

    /// The sequence number of the next record.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether this key has protected as many records as it should (the suite's
    /// confidentiality limit, or [`SEQ_SOFT_LIMIT`]): replace it (TLS 1.3) or close (TLS 1.2)
    /// before sealing application data again.
    pub fn is_worn_out(&self) -> bool {
        self.seq >= SEQ_SOFT_LIMIT.min(self.suite.confidentiality_limit())
    }

    /// Bytes a record of `plaintext_len` takes on the wire, header included.
    pub fn record_len(&self, plaintext_len: usize) -> usize {
        HEADER_LEN + plaintext_len + self.suite.overhead(self.version)
    }

    /// Seals `payload` of type `typ` as the record with sequence number `seq` and appends the
    /// whole record (header included) to `out`. On error `out` is left as it was.
    pub fn seal_with_seq(
        &self,
        seq: u64,
        typ: ContentType,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        if payload.len() > MAX_PLAINTEXT_LEN {
            return Err(Error::RecordOverflow {
                len: payload.len(),
                max: MAX_PLAINTEXT_LEN,
            });
        }
        let before = out.len();
        let result = match self.version {
            Version::Tls13 => self.seal_tls13(seq, typ, payload, out),
            Version::Tls12 => self.seal_tls12(seq, typ, payload, out),
        };
        if result.is_err() {
            out.truncate(before);
        }
        result
    }

    /// Seals the next record (see [`Self::seal_with_seq`]) and advances the sequence number.
    /// Refuses with [`Error::KeyExhausted`] at [`SEQ_HARD_LIMIT`].
    pub fn seal(
        &mut self,
        typ: ContentType,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        if self.seq >= SEQ_HARD_LIMIT {
            return Err(Error::KeyExhausted);
        }
        self.seal_with_seq(self.seq, typ, payload, out)?;
        self.seq += 1;
        Ok(())
    }

    fn seal_tls13(
        &self,
        seq: u64,
        typ: ContentType,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        // TLSInnerPlaintext = content || type, no padding; outer type is always 23.
        let hdr = header(ContentType::APPLICATION_DATA, payload.len() + 1 + TAG_LEN)?;
        out.extend_from_slice(&hdr);
        let start = out.len();
        out.extend_from_slice(payload);
        out.push(typ.0);
        let nonce = Nonce::assume_unique_for_key(xor_nonce(&self.iv, seq));
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(hdr), &mut out[start..])
            .map_err(|_| Error::Crypto)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    fn seal_tls12(
        &self,
        seq: u64,
        typ: ContentType,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let explicit_len = self.suite.tls12_explicit_nonce_len();
        let hdr = header(typ, explicit_len + payload.len() + TAG_LEN)?;
        out.extend_from_slice(&hdr);
        let nonce = xor_nonce(&self.iv, seq);
        // GCM: the explicit nonce on the wire is IV[4..12] XOR seq, i.e. the nonce's tail,
        // which makes the receiver's salt || explicit the same nonce.
        let nonce = if explicit_len > 0 {
            let mut explicit = [0u8; 8];
            explicit.copy_from_slice(&nonce[4..]);
            out.extend_from_slice(&explicit);
            gcm_nonce(&self.iv, &explicit)
        } else {
            nonce
        };
        // payload.len() <= MAX_PLAINTEXT_LEN, checked by the caller
        let aad = tls12_aad(seq, typ, [hdr[1], hdr[2]], payload.len() as u16);
        let start = out.len();
        out.extend_from_slice(payload);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[start..],
            )
            .map_err(|_| Error::Crypto)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("version", &self.version)
            .field("suite", &self.suite)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}
