//! The link's Noise primitives from aws-lc-rs: ChaCha20-Poly1305 as snow's `ChaChaPoly`, and
//! X25519 as its `25519`.
//!
//! The Noise protocol stays snow's: it asks the cipher for `ENCRYPT(k, n, ad, plaintext)` and
//! `DECRYPT` exactly as the Noise specification (section 5.1, 12.3) defines them: a 96-bit nonce
//! of 32 zero bits and the 64-bit counter little-endian, a 16-byte tag after the ciphertext. A
//! test checks the bytes against snow's own implementation. Why not snow's: aws-lc's assembly
//! seals the link's small records several times faster than the portable crate, without a
//! copy (out of place both ways), and the expanded key lives in aws-lc, which wipes it when the
//! cipher is dropped; snow's keeps the key in a plain array.
//!
//! The X25519 keys (each link handshake's ephemeral keys) are wiped when dropped, which snow's
//! own do not do. The hash (BLAKE2s) and the random numbers stay snow's defaults (its default
//! resolver will not build without a cipher and a DH of its own either: those only serve the
//! tests that check these against them).

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey};
use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver, FallbackResolver};
use snow::types::{Cipher, Dh, Hash, Random};
use zeroize::Zeroizing;

const TAG_LEN: usize = 16;

/// The resolver the link's handshakes are built with: this cipher, snow's defaults for the rest.
pub(crate) fn resolver() -> Box<dyn CryptoResolver + Send> {
    Box::new(FallbackResolver::new(
        Box::new(AwsLc),
        Box::new(DefaultResolver),
    ))
}

struct AwsLc;

impl CryptoResolver for AwsLc {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        None
    }

    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        match choice {
            DHChoice::Curve25519 => Some(Box::new(X25519 {
                private: Zeroizing::new([0; 32]),
                public: [0; 32],
            })),
            _ => None,
        }
    }

    fn resolve_hash(&self, _: &HashChoice) -> Option<Box<dyn Hash>> {
        None
    }

    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        match choice {
            CipherChoice::ChaChaPoly => Some(Box::new(ChaChaPoly { key: None })),
            _ => None,
        }
    }
}

/// `None` until snow sets a key (it never encrypts before).
struct ChaChaPoly {
    key: Option<LessSafeKey>,
}

impl ChaChaPoly {
    fn key(&self) -> &LessSafeKey {
        // snow calls encrypt/decrypt only on a cipher state that has a key
        self.key
            .as_ref()
            .expect("snow sets the key before using the cipher")
    }
}

/// The Noise nonce for ChaChaPoly: 4 zero bytes, then the counter little-endian.
fn nonce(n: u64) -> Nonce {
    let mut bytes = [0u8; NONCE_LEN];
    bytes[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(bytes)
}

impl Cipher for ChaChaPoly {
    fn name(&self) -> &'static str {
        "ChaChaPoly"
    }

    fn set(&mut self, key: &[u8; 32]) {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key");
        self.key = Some(LessSafeKey::new(unbound));
    }

    fn encrypt(&self, nonce_n: u64, ad: &[u8], plaintext: &[u8], out: &mut [u8]) -> usize {
        let n = plaintext.len();
        let (ciphertext, tag) = out[..n + TAG_LEN].split_at_mut(n);
        self.key()
            .seal_out_of_place_scatter(
                nonce(nonce_n),
                Aad::from(ad),
                plaintext,
                ciphertext,
                &[],
                tag,
            )
            // only buffer lengths can fail, and snow sizes `out` for the tag
            .expect("room for the ciphertext and the tag");
        n + TAG_LEN
    }

    fn decrypt(
        &self,
        nonce_n: u64,
        ad: &[u8],
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, snow::Error> {
        let Some(n) = ciphertext.len().checked_sub(TAG_LEN) else {
            return Err(snow::Error::Decrypt);
        };
        if out.len() < n {
            return Err(snow::Error::Decrypt);
        }
        let (body, tag) = ciphertext.split_at(n);
        self.key()
            .open_separate_gather(nonce(nonce_n), Aad::from(ad), body, tag, &mut out[..n])
            .map_err(|_| snow::Error::Decrypt)?;
        Ok(n)
    }
}

/// One X25519 key pair; the private half wiped when dropped.
struct X25519 {
    private: Zeroizing<[u8; 32]>,
    public: [u8; 32],
}

impl X25519 {
    fn key(&self) -> Result<PrivateKey, snow::Error> {
        PrivateKey::from_private_key(&agreement::X25519, &self.private[..])
            .map_err(|_| snow::Error::Dh)
    }

    fn derive_public(&mut self) -> Result<(), snow::Error> {
        let public = self
            .key()?
            .compute_public_key()
            .map_err(|_| snow::Error::Dh)?;
        self.public.copy_from_slice(public.as_ref());
        Ok(())
    }
}

impl Dh for X25519 {
    fn name(&self) -> &'static str {
        "25519"
    }

    fn pub_len(&self) -> usize {
        32
    }

    fn priv_len(&self) -> usize {
        32
    }

    fn set(&mut self, private: &[u8]) {
        // snow hands over exactly priv_len() bytes
        self.private.copy_from_slice(&private[..32]);
        // any 32 bytes are an X25519 private key (clamped when used)
        self.derive_public().expect("any 32 bytes are a key");
    }

    fn generate(&mut self, rng: &mut dyn Random) -> Result<(), snow::Error> {
        rng.try_fill_bytes(&mut self.private[..])?;
        self.derive_public()
    }

    fn pubkey(&self) -> &[u8] {
        &self.public
    }

    fn privkey(&self) -> &[u8] {
        &self.private[..]
    }

    fn dh(&self, public: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        let peer =
            UnparsedPublicKey::new(&agreement::X25519, public.get(..32).ok_or(snow::Error::Dh)?);
        // aws-lc refuses a peer key of small order (an all-zero shared secret)
        agreement::agree(&self.key()?, peer, snow::Error::Dh, |shared| {
            out[..32].copy_from_slice(shared);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// snow's own ChaChaPoly (the portable crate), to check ours against byte for byte.
    fn snows() -> Box<dyn Cipher> {
        DefaultResolver
            .resolve_cipher(&CipherChoice::ChaChaPoly)
            .expect("snow's default resolver has ChaChaPoly")
    }

    fn ours() -> Box<dyn Cipher> {
        AwsLc
            .resolve_cipher(&CipherChoice::ChaChaPoly)
            .expect("ours")
    }

    #[test]
    fn seals_and_opens_the_same_bytes_as_snows_own() {
        let key = [7u8; 32];
        let (mut a, mut b) = (ours(), snows());
        a.set(&key);
        b.set(&key);
        for (n, len) in [(0u64, 0usize), (1, 1), (2, 63), (255, 300), (1 << 40, 4096)] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 + 5) as u8).collect();
            let ad = if n % 2 == 0 {
                &b"handshake hash"[..]
            } else {
                &[][..]
            };
            let mut x = vec![0u8; len + TAG_LEN];
            let mut y = vec![0u8; len + TAG_LEN];
            assert_eq!(a.encrypt(n, ad, &plain, &mut x), len + TAG_LEN);
            b.encrypt(n, ad, &plain, &mut y);
            assert_eq!(x, y, "nonce {n}, {len} bytes");
            // each opens the other's
            let mut back = vec![0u8; len];
            assert_eq!(a.decrypt(n, ad, &y, &mut back).unwrap(), len);
            assert_eq!(back, plain);
            assert_eq!(b.decrypt(n, ad, &x, &mut back).unwrap(), len);
        }
    }

    #[test]
    fn x25519_agrees_with_snows_own() {
        let mut ours = AwsLc.resolve_dh(&DHChoice::Curve25519).expect("ours");
        let mut snows = DefaultResolver
            .resolve_dh(&DHChoice::Curve25519)
            .expect("snow's default resolver has 25519");
        let mut peer = DefaultResolver.resolve_dh(&DHChoice::Curve25519).unwrap();
        peer.set(&[0x5a; 32]);
        for seed in [1u8, 77, 255] {
            let private: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(seed) ^ seed).collect();
            ours.set(&private);
            snows.set(&private);
            assert_eq!(ours.pubkey(), snows.pubkey(), "seed {seed}");
            let (mut x, mut y, mut z) = ([0u8; 32], [0u8; 32], [0u8; 32]);
            ours.dh(peer.pubkey(), &mut x).unwrap();
            snows.dh(peer.pubkey(), &mut y).unwrap();
            peer.dh(ours.pubkey(), &mut z).unwrap();
            assert_eq!(x, y);
            assert_eq!(x, z);
        }
        // a peer key of small order gives no secret
        assert!(ours.dh(&[0u8; 32], &mut [0u8; 32]).is_err());
        assert!(ours.dh(&[9u8; 5], &mut [0u8; 32]).is_err());
    }

    #[test]
    fn a_changed_byte_a_wrong_nonce_or_a_short_message_does_not_open() {
        let mut a = ours();
        a.set(&[9u8; 32]);
        let mut sealed = vec![0u8; 10 + TAG_LEN];
        a.encrypt(3, &[], b"0123456789", &mut sealed);
        let mut out = [0u8; 64];
        assert!(a.decrypt(4, &[], &sealed, &mut out).is_err());
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(a.decrypt(3, &[], &bad, &mut out).is_err(), "byte {i}");
        }
        assert!(a.decrypt(3, &[], &sealed[..TAG_LEN - 1], &mut out).is_err());
        assert!(a.decrypt(3, &[], &sealed, &mut out[..5]).is_err());
        assert_eq!(a.decrypt(3, &[], &sealed, &mut out).unwrap(), 10);
    }
}
