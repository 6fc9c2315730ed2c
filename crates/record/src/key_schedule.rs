//! The part of the TLS 1.3 key schedule (RFC 8446 7.1-7.3) that outlives the handshake:
//! HKDF-Expand-Label, the next generation of an application traffic secret ("traffic upd"),
//! and the record key and IV derived from a secret ("key", "iv"). This is all a KeyUpdate
//! needs, and why a migrated TLS 1.3 session must carry its traffic secrets, not only keys.

use aws_lc_rs::hkdf;
use zeroize::Zeroizing;

use crate::error::Error;
use crate::suite::{Suite, NONCE_LEN};

/// The prefix of every TLS 1.3 label (RFC 8446 7.1).
const LABEL_PREFIX: &[u8] = b"tls13 ";

/// HKDF-Expand-Label(secret, label, context, out.len()) (RFC 8446 7.1), into `out`.
///
/// `label` is given without the "tls13 " prefix. Fails only for lengths HKDF cannot produce
/// (over 255 hash lengths) or labels/contexts over 255 bytes, which no caller here asks for.
pub fn hkdf_expand_label(
    hkdf_alg: hkdf::Algorithm,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    out: &mut [u8],
) -> Result<(), Error> {
    let out_len = u16::try_from(out.len()).map_err(|_| Error::Crypto)?;
    let label_len = u8::try_from(LABEL_PREFIX.len() + label.len()).map_err(|_| Error::Crypto)?;
    let context_len = u8::try_from(context.len()).map_err(|_| Error::Crypto)?;
    let out_len_bytes = out_len.to_be_bytes();
    let info: [&[u8]; 6] = [
        &out_len_bytes,
        &[label_len],
        LABEL_PREFIX,
        label,
        &[context_len],
        context,
    ];
    let prk = hkdf::Prk::new_less_safe(hkdf_alg, secret);
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| Error::Crypto)
}

/// An output length for aws-lc-rs' HKDF.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// KeyUpdates per direction followed from a given traffic secret to its key's generation
/// ([`TrafficSecret::followed_to`]): far more than a connection's life has (RFC 8446 suggests
/// updating after ~2^24 records), and each step is one HKDF expansion.
pub const MAX_GENERATIONS: usize = 1024;

/// A TLS 1.3 application traffic secret of one direction, for one suite.
#[derive(Clone)]
pub struct TrafficSecret {
    suite: Suite,
    secret: Zeroizing<Vec<u8>>,
}

/// The record protection derived from a traffic secret.
pub struct TrafficKeys {
    /// The AEAD key ("key").
    pub key: Zeroizing<Vec<u8>>,
    /// The IV ("iv").
    pub iv: Zeroizing<[u8; NONCE_LEN]>,
}

impl TrafficSecret {
    /// Wraps a secret; it must be one hash output long for the suite.
    pub fn new(suite: Suite, secret: &[u8]) -> Result<Self, Error> {
        if secret.len() != suite.hash_len() {
            return Err(Error::InvalidKeys(
                "traffic secret length differs from the suite's hash length",
            ));
        }
        Ok(Self {
            suite,
            secret: Zeroizing::new(secret.to_vec()),
        })
    }

    /// The secret of the next generation:
    /// HKDF-Expand-Label(secret, "traffic upd", "", Hash.length) (RFC 8446 7.2).
    pub fn next(&self) -> Result<Self, Error> {
        let mut next = Zeroizing::new(vec![0u8; self.suite.hash_len()]);
        hkdf_expand_label(
            self.suite.hkdf(),
            &self.secret,
            b"traffic upd",
            &[],
            &mut next,
        )?;
        Ok(Self {
            suite: self.suite,
            secret: next,
        })
    }

    /// The record key and IV of this generation (RFC 8446 7.3).
    pub fn keys(&self) -> Result<TrafficKeys, Error> {
        let key = self.key()?;
        let mut iv = Zeroizing::new([0u8; NONCE_LEN]);
        hkdf_expand_label(self.suite.hkdf(), &self.secret, b"iv", &[], &mut iv[..])?;
        Ok(TrafficKeys { key, iv })
    }

    /// The record key of this generation alone (one expansion, where [`keys`](Self::keys) makes
    /// two): enough to tell which generation a key came from.
    pub fn key(&self) -> Result<Zeroizing<Vec<u8>>, Error> {
        let mut key = Zeroizing::new(vec![0u8; self.suite.key_len()]);
        hkdf_expand_label(self.suite.hkdf(), &self.secret, b"key", &[], &mut key)?;
        Ok(key)
    }

    /// The secret of the generation that derives `key`: this one or one up to
    /// [`MAX_GENERATIONS`] KeyUpdates on. A migrated session carries the key log's generation-0
    /// secret, and the client may have updated its keys before the move. Following a secret a
    /// generation behind its key would derive, at the next KeyUpdate, the key already in use
    /// with its sequence reset to 0: nonce reuse, which refusing here makes impossible.
    ///
    /// The key alone tells the generation (a 16- or 32-byte HKDF output), so the IV is not
    /// derived again: one expansion per generation looked at, not two.
    pub fn followed_to(&self, key: &[u8]) -> Result<Self, Error> {
        let mut secret = self.clone();
        for _ in 0..MAX_GENERATIONS {
            if secret.key()?[..] == key[..] {
                return Ok(secret);
            }
            secret = secret.next()?;
        }
        Err(Error::InvalidKeys(
            "no generation of the traffic secret derives the given key",
        ))
    }

    /// The secret's bytes (for tests and for sealing a session object again after an update).
    pub fn expose(&self) -> &[u8] {
        &self.secret
    }
}

impl std::fmt::Debug for TrafficSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TrafficSecret({:?}, <{} bytes redacted>)",
            self.suite,
            self.secret.len()
        )
    }
}

#[cfg(test)]
#[path = "key_schedule_test.rs"]
mod tests;
