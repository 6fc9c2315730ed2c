//! Stateless session tickets and everything else sealed with a key file: sealing with a ring of
//! keys that rotates.
//!
//! Wire layout of a sealed blob (what a dispatcher may read without any key):
//!
//! ```text
//! 0       version (2)
//! 1..5    key id, big endian: which key of the ring sealed it
//! 5..7    issuer: the agent id that issued it (0 for a lone agent)
//! 7..23   salt (random, 16 bytes): picks the key this blob is sealed with
//! 23..35  nonce (random, 12 bytes)
//! 35..    AES-256-GCM(plain) || tag under HKDF-Expand(prk, "baton seal v2 key" || salt),
//!         with bytes 0..23 and the caller's context as associated data; prk is
//!         HKDF-Expand(HKDF-Extract("baton seal v2", ring key), "baton seal v2 prk"), once a key
//! ```
//!
//! The key id and the issuer sit outside the sealed part on purpose: the cluster's dispatcher
//! routes a resumption to the agent that holds the session without decrypting anything.
//!
//! # Key budget
//!
//! The same ring seals tickets ([`TicketSealer`]) and, with the cluster key file, session
//! objects ([`crate::migration`]), replication frames ([`crate::replication`]), Redis entries
//! and the dispatcher link's proofs. Key files are shared by every agent of a cluster and live
//! until an operator rotates them, so a key's own lifetime bounds nothing: AES-GCM with random
//! 96-bit nonces under one key is good for about 2^32 seals (NIST SP 800-38D), which 100k seals
//! per second use up in 12 hours. So no blob is sealed under a ring key itself: each seal draws a
//! fresh 128-bit salt and derives a one-off AES-256 key from the ring key with HKDF-SHA256. Two
//! seals share a key only if their salts collide, and reuse a key *and* nonce only if their 28
//! random bytes collide: after 2^64 seals under one ring key the chance is below 2^-96. The ring
//! key itself seals nothing (it only keys HMAC, and opens version 1 blobs). Seals are counted
//! per key all the same: a [`TicketSealer`] that makes its own keys rotates when a key is
//! [`TicketSealer::local`]'s interval old or has sealed [`SEAL_BUDGET`] blobs, whichever comes
//! first; file keys are rotated by the operator (`baton ticket-key`), which this scheme makes
//! a matter of hygiene rather than of volume.
//!
//! Version 1 blobs (before version 2: the 7-byte header, the nonce at 7..19, sealed under the
//! ring key itself) still open, so tickets and Redis entries issued before an upgrade stay
//! valid; nothing seals them any more. Rotating the key files after the upgrade retires the
//! keys that sealed them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf::{Prk, Salt, HKDF_SHA256};
use baton_wire::codec::{Codec, Reader};
use zeroize::Zeroizing;

use crate::Error;

/// The format [`KeyRing`] seals: a per-seal key derived from the ring key and a salt.
pub const TICKET_VERSION: u8 = 2;
/// The format before: sealed under the ring key itself, a random nonce only. Still opened.
pub const LEGACY_TICKET_VERSION: u8 = 1;
const HEADER_LEN: usize = 1 + 4 + 2;
const TAG_LEN: usize = 16;
/// The random salt of a version 2 blob, from which its key is derived.
pub const SALT_LEN: usize = 16;
/// Bytes a seal adds to its plaintext.
pub const OVERHEAD: usize = HEADER_LEN + SALT_LEN + NONCE_LEN + TAG_LEN;
const LEGACY_OVERHEAD: usize = HEADER_LEN + NONCE_LEN + TAG_LEN;
/// Seals after which a locally made key is replaced (besides its age). Per-seal keys make the
/// ring key good for far more (see the module documentation); this is the old random-nonce
/// guidance kept as a second line.
pub const SEAL_BUDGET: u64 = 1 << 32;
/// HKDF labels: the extract salt and the expand info for the per-seal keys.
const DERIVE_SALT: &[u8] = b"baton seal v2";
const DERIVE_PRK: &[u8] = b"baton seal v2 prk";
const DERIVE_KEY: &[u8] = b"baton seal v2 key";
/// The expand info's prefix of [`KeyRing::derive_secrets`] (apart from every seal key's).
const DERIVE_PURPOSE: &[u8] = b"baton derive: ";
/// Plaintexts larger than this are refused: rustls' encoded sessions are far smaller, and a bound
/// keeps tickets within what every client stores.
pub const MAX_PLAIN_LEN: usize = 16 * 1024;
/// Keys a ring keeps at most; older ones are forgotten (and their tickets with them).
pub const MAX_KEYS: usize = 16;

/// The fields of a ticket readable without a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketHeader {
    pub key_id: u32,
    pub issuer: u16,
}

impl TicketHeader {
    /// Reads the clear header of a ticket sealed by [`TicketSealer`] (either format); `None` if
    /// it is not one.
    pub fn parse(ticket: &[u8]) -> Option<Self> {
        let mut r = Reader::new(ticket);
        let min = match u8::read(&mut r).ok()? {
            TICKET_VERSION => OVERHEAD,
            LEGACY_TICKET_VERSION => LEGACY_OVERHEAD,
            _ => return None,
        };
        if ticket.len() < min {
            return None;
        }
        Self::read(&mut r).ok()
    }
}

/// The header after its version byte (the same in both formats).
impl Codec for TicketHeader {
    fn encode(&self, out: &mut Vec<u8>) {
        self.key_id.encode(out);
        self.issuer.encode(out);
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, baton_wire::Error> {
        Ok(Self {
            key_id: u32::read(r)?,
            issuer: u16::read(r)?,
        })
    }
}

/// One ticket key.
pub struct TicketKey {
    id: u32,
    /// The key itself: opens version 1 blobs only.
    legacy: LessSafeKey,
    /// What version 2 keys are expanded from: HKDF-Extract of the key, expanded once.
    prk: Prk,
    created: Instant,
    /// Blobs sealed with this key.
    seals: AtomicU64,
}

impl std::fmt::Debug for TicketKey {
    // The key itself is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKey")
            .field("id", &format_args!("{:08x}", self.id))
            .field("seals", &self.seals())
            .finish()
    }
}

impl TicketKey {
    /// A key from its 32 secret bytes.
    pub fn new(id: u32, secret: &[u8; 32], created: Instant) -> Self {
        // AES-256 accepts any 32 bytes, so this cannot fail.
        let unbound = UnboundKey::new(&AES_256_GCM, secret).expect("32-byte AES-256 key");
        // 32 bytes are within what one HKDF-SHA256 expansion gives, so this cannot fail either.
        let prk = Prk::from(
            Salt::new(HKDF_SHA256, DERIVE_SALT)
                .extract(secret)
                .expand(&[DERIVE_PRK], HKDF_SHA256)
                .expect("a 32-byte HKDF-SHA256 output"),
        );
        Self {
            id,
            legacy: LessSafeKey::new(unbound),
            prk,
            created,
            seals: AtomicU64::new(0),
        }
    }

    /// The one-off key of the blob with this salt.
    fn derive(&self, salt: &[u8; SALT_LEN]) -> Option<LessSafeKey> {
        let info = [DERIVE_KEY, &salt[..]];
        let okm = self.prk.expand(&info, &AES_256_GCM).ok()?;
        Some(LessSafeKey::new(UnboundKey::from(okm)))
    }

    /// Blobs sealed with this key so far (by this process).
    pub fn seals(&self) -> u64 {
        self.seals.load(Ordering::Relaxed)
    }

    /// A fresh random key with a random id.
    pub fn generate(now: Instant) -> Result<Self, Error> {
        let mut secret = Zeroizing::new([0u8; 32]);
        let mut id = [0u8; 4];
        aws_lc_rs::rand::fill(&mut secret[..]).map_err(|_| Error::Rng)?;
        aws_lc_rs::rand::fill(&mut id).map_err(|_| Error::Rng)?;
        Ok(Self::new(u32::from_be_bytes(id), &secret, now))
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

/// An ordered set of keys: the first seals, all open.
#[derive(Debug, Default)]
pub struct KeyRing {
    keys: Vec<TicketKey>,
}

impl KeyRing {
    pub fn new(keys: Vec<TicketKey>) -> Self {
        Self { keys }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn key_ids(&self) -> Vec<u32> {
        self.keys.iter().map(|k| k.id).collect()
    }

    /// Blobs sealed so far with the key that seals (0 for an empty ring).
    pub fn seals(&self) -> u64 {
        self.keys.first().map_or(0, TicketKey::seals)
    }

    /// Reads a key file (cluster or ticket keys, [`Self::parse_key_file`]). Refused when group
    /// or others may read it: whoever reads it can open every ticket and session object.
    pub fn read_key_file(path: &std::path::Path, now: Instant) -> Result<Self, Error> {
        use std::os::unix::fs::PermissionsExt;
        let at = |e: std::io::Error| Error::KeyFile(format!("{}: {e}", path.display()));
        let meta = std::fs::metadata(path).map_err(at)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::KeyFile(format!(
                "{}: readable by group or others (mode {mode:o}); chmod 600 it",
                path.display()
            )));
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(at)?);
        Self::parse_key_file(&text, now)
            .map_err(|e| Error::KeyFile(format!("{}: {e}", path.display())))
    }

    /// Parses a ticket key file: one key a line, `<8 hex digits id> <64 hex digits key>`, the
    /// first line seals new tickets, the others still open old ones. `#` starts a comment.
    pub fn parse_key_file(text: &str, now: Instant) -> Result<Self, Error> {
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| Error::KeyFile(format!("line {}: {what}", n + 1));
            let mut fields = line.split_whitespace();
            let (Some(id), Some(key), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(bad(
                    "expected `<key id: 8 hex digits> <key: 64 hex digits>`",
                ));
            };
            let id = decode_hex::<4>(id).ok_or_else(|| bad("key id is not 8 hex digits"))?;
            let secret = Zeroizing::new(
                decode_hex::<32>(key).ok_or_else(|| bad("key is not 64 hex digits"))?,
            );
            let id = u32::from_be_bytes(id);
            if keys.iter().any(|k: &TicketKey| k.id == id) {
                return Err(bad("duplicate key id"));
            }
            keys.push(TicketKey::new(id, &secret, now));
        }
        if keys.is_empty() {
            return Err(Error::KeyFile("no keys in file".into()));
        }
        if keys.len() > MAX_KEYS {
            return Err(Error::KeyFile(format!("more than {MAX_KEYS} keys")));
        }
        Ok(Self { keys })
    }

    /// One 32-byte secret per key, in ring order (the sealing key first), for the purpose that
    /// `label` names (HKDF-Expand of the key's PRK): what a protocol that takes a pre-shared
    /// key uses instead of the key itself, so that no two uses of a key share a secret.
    pub fn derive_secrets(&self, label: &[u8]) -> Vec<Zeroizing<[u8; 32]>> {
        self.keys
            .iter()
            .filter_map(|k| {
                let mut out = Zeroizing::new([0u8; 32]);
                let info = [DERIVE_PURPOSE, label];
                let okm = k.prk.expand(&info, HKDF_SHA256).ok()?;
                okm.fill(&mut out[..]).ok()?;
                Some(out)
            })
            .collect()
    }

    /// Seals `plain`; `context` is bound into the associated data without being sent (the
    /// opener must supply the same), which ties a blob to a channel or a position in it.
    pub fn seal(&self, issuer: u16, plain: &[u8], context: &[u8]) -> Option<Vec<u8>> {
        if plain.len() > MAX_PLAIN_LEN {
            return None;
        }
        self.seal_large(issuer, plain, context)
    }

    /// [`KeyRing::seal`] without the ticket size bound, for session objects that carry client
    /// plaintext (bounded by their own limit).
    pub fn seal_large(&self, issuer: u16, plain: &[u8], context: &[u8]) -> Option<Vec<u8>> {
        let key = self.keys.first()?;
        // Salt and nonce in one draw: the random generator costs as much as the derivation.
        let mut random = [0u8; SALT_LEN + NONCE_LEN];
        aws_lc_rs::rand::fill(&mut random).ok()?;
        let (salt, nonce) = random.split_at(SALT_LEN);
        let salt: &[u8; SALT_LEN] = salt.try_into().ok()?;
        let nonce: [u8; NONCE_LEN] = nonce.try_into().ok()?;
        let sealing = key.derive(salt)?;
        key.seals.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD + context.len());
        TICKET_VERSION.encode(&mut out);
        TicketHeader {
            key_id: key.id,
            issuer,
        }
        .encode(&mut out);
        out.extend_from_slice(salt);
        let clear = out.len();
        out.extend_from_slice(context);
        let aad = Aad::from(&out[..]);
        let mut body = Vec::with_capacity(plain.len() + TAG_LEN);
        body.extend_from_slice(plain);
        sealing
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), aad, &mut body)
            .ok()?;
        out.truncate(clear);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        Some(out)
    }

    /// Opens what [`KeyRing::seal`] sealed with the same `context` (or a version 1 blob sealed
    /// before); `None` for anything else.
    pub fn open(&self, ticket: &[u8], context: &[u8]) -> Option<Vec<u8>> {
        let header = TicketHeader::parse(ticket)?;
        let key = self.keys.iter().find(|k| k.id == header.key_id)?;
        let derived;
        let (opening, clear) = if ticket[0] == TICKET_VERSION {
            let salt = ticket[HEADER_LEN..HEADER_LEN + SALT_LEN].try_into().ok()?;
            derived = key.derive(salt)?;
            (&derived, HEADER_LEN + SALT_LEN)
        } else {
            // Version 1: the ring key itself, the 7-byte header as associated data.
            (&key.legacy, HEADER_LEN)
        };
        let nonce = Nonce::try_assume_unique_for_key(&ticket[clear..clear + NONCE_LEN]).ok()?;
        let aad = [&ticket[..clear], context].concat();
        let mut body = ticket[clear + NONCE_LEN..].to_vec();
        let plain_len = opening
            .open_in_place(nonce, Aad::from(&aad[..]), &mut body)
            .ok()?
            .len();
        body.truncate(plain_len);
        Some(body)
    }
}

/// How the ring gets new keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// The sealer generates a key itself every interval, or sooner once the key has sealed
    /// `seals` blobs (a lone agent).
    Local { every: Duration, seals: u64 },
    /// Keys come from outside (a key file reloaded on SIGHUP, later a cluster store).
    External,
}

/// Seals and opens tickets with a rotating [`KeyRing`]. Time is a parameter so rotation is
/// testable without sleeping.
#[derive(Debug)]
pub struct TicketSealer {
    issuer: u16,
    lifetime: Duration,
    rotation: Rotation,
    ring: RwLock<KeyRing>,
}

impl TicketSealer {
    /// A sealer that makes its own keys, a new one every `lifetime` or every [`SEAL_BUDGET`]
    /// seals, whichever comes first; a key stays usable for opening while tickets it sealed may
    /// still be valid.
    pub fn local(issuer: u16, lifetime: Duration, now: Instant) -> Result<Self, Error> {
        Ok(Self {
            issuer,
            lifetime,
            rotation: Rotation::Local {
                every: lifetime,
                seals: SEAL_BUDGET,
            },
            ring: RwLock::new(KeyRing::new(vec![TicketKey::generate(now)?])),
        })
    }

    /// A local sealer's keys rotate after `seals` seals instead of [`SEAL_BUDGET`] (no effect
    /// on a sealer whose keys are given).
    pub fn with_seal_budget(mut self, seals: u64) -> Self {
        if let Rotation::Local { every, .. } = self.rotation {
            self.rotation = Rotation::Local {
                every,
                seals: seals.max(1),
            };
        }
        self
    }

    /// A sealer whose keys are given (and replaced with [`TicketSealer::replace_ring`]).
    pub fn external(issuer: u16, lifetime: Duration, ring: KeyRing) -> Self {
        Self {
            issuer,
            lifetime,
            rotation: Rotation::External,
            ring: RwLock::new(ring),
        }
    }

    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    pub fn rotation(&self) -> Rotation {
        self.rotation
    }

    /// Installs new keys (a reloaded key file).
    pub fn replace_ring(&self, ring: KeyRing) {
        *self.ring.write().unwrap_or_else(|p| p.into_inner()) = ring;
    }

    pub fn key_ids(&self) -> Vec<u32> {
        self.ring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .key_ids()
    }

    pub fn seal_at(&self, plain: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.rotate_if_due(now);
        self.ring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .seal(self.issuer, plain, &[])
    }

    pub fn open_at(&self, ticket: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.rotate_if_due(now);
        self.ring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .open(ticket, &[])
    }

    fn rotate_if_due(&self, now: Instant) {
        let Rotation::Local { every, seals } = self.rotation else {
            return;
        };
        let due = |ring: &KeyRing| {
            ring.keys.first().is_none_or(|k| {
                now.saturating_duration_since(k.created) >= every || k.seals() >= seals
            })
        };
        if !due(&self.ring.read().unwrap_or_else(|p| p.into_inner())) {
            return;
        }
        let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
        if !due(&ring) {
            return; // another thread rotated first
        }
        let Ok(key) = TicketKey::generate(now) else {
            return; // keep sealing with the old key rather than fail handshakes
        };
        ring.keys.insert(0, key);
        // A key that stopped sealing by `created + every` (sooner if it used up its seals) may
        // still open tickets for `lifetime`.
        let keep_until = every + self.lifetime;
        ring.keys
            .retain(|k| now.saturating_duration_since(k.created) < keep_until);
        ring.keys.truncate(MAX_KEYS);
    }
}

fn decode_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// Formats one key file line for a fresh random key (`baton ticket-key`).
pub fn generate_key_line() -> Result<String, Error> {
    let mut id = [0u8; 4];
    let mut secret = Zeroizing::new([0u8; 32]);
    aws_lc_rs::rand::fill(&mut id).map_err(|_| Error::Rng)?;
    aws_lc_rs::rand::fill(&mut secret[..]).map_err(|_| Error::Rng)?;
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let line = format!("{} {}", hex(&id), hex(&secret[..]));
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn seal_open_round_trip_and_header() {
        let t = Instant::now();
        let s = TicketSealer::local(7, HOUR, t).unwrap();
        let ticket = s.seal_at(b"session", t).unwrap();
        let h = TicketHeader::parse(&ticket).unwrap();
        assert_eq!(h.issuer, 7);
        assert_eq!(vec![h.key_id], s.key_ids());
        assert_eq!(s.open_at(&ticket, t).as_deref(), Some(&b"session"[..]));
    }

    #[test]
    fn tampering_is_a_miss() {
        let t = Instant::now();
        let s = TicketSealer::local(1, HOUR, t).unwrap();
        let ticket = s.seal_at(b"session", t).unwrap();
        for i in 0..ticket.len() {
            let mut bad = ticket.clone();
            bad[i] ^= 0x01;
            assert_eq!(s.open_at(&bad, t), None, "flipped byte {i}");
        }
        assert_eq!(s.open_at(&ticket[..ticket.len() - 1], t), None);
    }

    #[test]
    fn local_rotation_keeps_old_keys_for_a_lifetime() {
        let t0 = Instant::now();
        let s = TicketSealer::local(1, HOUR, t0).unwrap();
        let old = s.seal_at(b"old", t0).unwrap();
        // one rotation later the old ticket still opens, new tickets use a new key
        let t1 = t0 + HOUR;
        let new = s.seal_at(b"new", t1).unwrap();
        assert_ne!(
            TicketHeader::parse(&old).unwrap().key_id,
            TicketHeader::parse(&new).unwrap().key_id
        );
        assert_eq!(s.open_at(&old, t1 + HOUR / 2).as_deref(), Some(&b"old"[..]));
        // once its key has been retired for a full lifetime, it no longer opens
        assert_eq!(
            s.open_at(&old, t0 + 2 * HOUR + Duration::from_secs(1)),
            None
        );
        assert!(s
            .open_at(&new, t0 + 2 * HOUR + Duration::from_secs(1))
            .is_some());
    }

    #[test]
    fn key_file_parsing() {
        let t = Instant::now();
        let line1 = generate_key_line().unwrap();
        let line2 = generate_key_line().unwrap();
        let ring =
            KeyRing::parse_key_file(&format!("# comment\n{line1}\n\n{line2} # old\n"), t).unwrap();
        assert_eq!(ring.key_ids().len(), 2);
        assert_eq!(format!("{:08x}", ring.key_ids()[0]), line1[..8]);
        assert!(KeyRing::parse_key_file("", t).is_err());
        // a key file others can read is refused; a private one is read
        {
            use std::os::unix::fs::PermissionsExt;
            let path = std::env::temp_dir().join(format!("baton-keyfile-{}", std::process::id()));
            std::fs::write(&path, format!("{line1}\n")).unwrap();
            for (mode, ok) in [(0o644, false), (0o640, false), (0o600, true), (0o400, true)] {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
                let got = KeyRing::read_key_file(&path, t);
                assert_eq!(got.is_ok(), ok, "mode {mode:o}: {got:?}");
            }
            std::fs::remove_file(&path).unwrap();
        }
        assert!(KeyRing::parse_key_file("0011 22", t).is_err());
        assert!(
            KeyRing::parse_key_file(&format!("{line1}\n{line1}"), t).is_err(),
            "dup id"
        );
        let bad = format!("{} zz{}", &line1[..8], &line1[11..]);
        assert!(KeyRing::parse_key_file(&bad, t).is_err());
    }

    #[test]
    fn file_keys_shared_between_sealers() {
        let t = Instant::now();
        let text = generate_key_line().unwrap();
        let a = TicketSealer::external(1, HOUR, KeyRing::parse_key_file(&text, t).unwrap());
        let b = TicketSealer::external(2, HOUR, KeyRing::parse_key_file(&text, t).unwrap());
        let ticket = a.seal_at(b"x", t).unwrap();
        assert_eq!(b.open_at(&ticket, t).as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn derived_secrets_follow_the_ring_and_the_label() {
        let t = Instant::now();
        let (a, b) = (generate_key_line().unwrap(), generate_key_line().unwrap());
        let one = KeyRing::parse_key_file(&a, t).unwrap();
        let two = KeyRing::parse_key_file(&format!("{b}\n{a}"), t).unwrap();
        let s1 = one.derive_secrets(b"x");
        let s2 = two.derive_secrets(b"x");
        assert_eq!((s1.len(), s2.len()), (1, 2));
        assert_eq!(s1[0], s2[1], "the same key, the same secret");
        assert_ne!(s2[0], s2[1]);
        assert_ne!(one.derive_secrets(b"y")[0], s1[0], "another label");
        // the same file read twice (two processes) derives the same
        assert_eq!(
            KeyRing::parse_key_file(&a, t).unwrap().derive_secrets(b"x")[0],
            s1[0]
        );
    }

    /// A blob sealed by the version 1 code (before per-seal keys): key 7 = `[0x42; 32]`,
    /// issuer 3, context `ctx`.
    const GOLDEN_V1: &str =
        "010000000700036bbbaaaad11c5c81da684fb46c53be2b9f38c933a5fbd4e0ec94680b2f6f\
                             1965067087a9a41ab8cf867dc4b71eda89cc5ab5b0d38e9e33";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn ring42() -> KeyRing {
        KeyRing::new(vec![TicketKey::new(7, &[0x42; 32], Instant::now())])
    }

    /// What the version 1 code sealed: the ring key itself, nonce after the 7-byte header.
    fn seal_v1(ring: &KeyRing, issuer: u16, plain: &[u8], context: &[u8]) -> Vec<u8> {
        let key = &ring.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).unwrap();
        let mut out = vec![LEGACY_TICKET_VERSION];
        TicketHeader {
            key_id: key.id,
            issuer,
        }
        .encode(&mut out);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        let aad = [&out[..HEADER_LEN], context].concat();
        key.legacy
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..]),
                &mut body,
            )
            .unwrap();
        out.extend_from_slice(&body);
        out
    }

    /// Opens `blob`'s body with `key` as a version 2 blob would be opened.
    fn open_body_with(key: &LessSafeKey, blob: &[u8], context: &[u8]) -> Option<Vec<u8>> {
        let clear = HEADER_LEN + SALT_LEN;
        let nonce = Nonce::try_assume_unique_for_key(&blob[clear..clear + NONCE_LEN]).unwrap();
        let mut body = blob[clear + NONCE_LEN..].to_vec();
        let aad = [&blob[..clear], context].concat();
        let n = key
            .open_in_place(nonce, Aad::from(&aad[..]), &mut body)
            .ok()?
            .len();
        body.truncate(n);
        Some(body)
    }

    #[test]
    fn each_seal_has_its_own_derived_key() {
        let ring = ring42();
        let a = ring.seal(3, b"same plaintext", b"ctx").unwrap();
        let b = ring.seal(3, b"same plaintext", b"ctx").unwrap();
        assert_eq!(a[0], TICKET_VERSION);
        assert_eq!(a.len(), b"same plaintext".len() + OVERHEAD);
        let salt = |blob: &[u8]| -> [u8; SALT_LEN] {
            blob[HEADER_LEN..HEADER_LEN + SALT_LEN].try_into().unwrap()
        };
        assert_ne!(salt(&a), salt(&b), "every seal draws a salt");
        let key = &ring.keys[0];
        // Each blob opens under the key derived from its own salt, not the other's, and never
        // under the ring key itself.
        for (blob, other) in [(&a, &b), (&b, &a)] {
            let own = key.derive(&salt(blob)).unwrap();
            let wrong = key.derive(&salt(other)).unwrap();
            assert_eq!(
                open_body_with(&own, blob, b"ctx").as_deref(),
                Some(&b"same plaintext"[..])
            );
            assert_eq!(open_body_with(&wrong, blob, b"ctx"), None);
            assert_eq!(open_body_with(&key.legacy, blob, b"ctx"), None);
        }
        assert_eq!(
            ring.open(&a, b"ctx").as_deref(),
            Some(&b"same plaintext"[..])
        );
        assert_eq!(ring.open(&a, b"other"), None);
        assert_eq!(ring.seals(), 2);
    }

    #[test]
    fn salt_tampering_and_format_confusion_are_misses() {
        let ring = ring42();
        let blob = ring.seal(3, b"x", b"ctx").unwrap();
        for i in HEADER_LEN..HEADER_LEN + SALT_LEN {
            for bit in 0..8 {
                let mut bad = blob.clone();
                bad[i] ^= 1 << bit;
                assert_eq!(ring.open(&bad, b"ctx"), None, "salt byte {i} bit {bit}");
            }
        }
        // A version 2 blob relabelled version 1, and the reverse, open as nothing.
        let mut v1 = blob.clone();
        v1[0] = LEGACY_TICKET_VERSION;
        assert_eq!(ring.open(&v1, b"ctx"), None);
        let mut v2 = unhex(GOLDEN_V1);
        v2[0] = TICKET_VERSION;
        assert_eq!(ring.open(&v2, b"ctx"), None);
        let mut v3 = blob;
        v3[0] = 3;
        assert_eq!(TicketHeader::parse(&v3), None);
    }

    /// The clear header as the code before `baton_wire::codec` wrote and read it: version,
    /// key id u32, issuer u16, then (version 2) the salt.
    #[test]
    fn header_encoding_is_unchanged() {
        let blob = ring42().seal(0x0a0b, b"x", b"").unwrap();
        assert_eq!(blob[..HEADER_LEN], unhex("02000000070a0b")[..]);
        let v1 = seal_v1(&ring42(), 0x0a0b, b"x", b"");
        assert_eq!(v1[..HEADER_LEN], unhex("01000000070a0b")[..]);
        let mut forged = unhex("02a1b2c3d4e5f6");
        forged.resize(OVERHEAD, 0);
        let header = TicketHeader {
            key_id: 0xa1b2_c3d4,
            issuer: 0xe5f6,
        };
        assert_eq!(TicketHeader::parse(&forged), Some(header));
        assert_eq!(TicketHeader::parse(&forged[..OVERHEAD - 1]), None);
        forged[0] = LEGACY_TICKET_VERSION;
        assert_eq!(
            TicketHeader::parse(&forged[..LEGACY_OVERHEAD]),
            Some(header)
        );
        assert_eq!(TicketHeader::parse(&forged[..LEGACY_OVERHEAD - 1]), None);
        assert_eq!(TicketHeader::parse(&[]), None);
    }

    #[test]
    fn version_1_blobs_still_open() {
        let ring = ring42();
        let old = unhex(GOLDEN_V1);
        assert_eq!(
            TicketHeader::parse(&old),
            Some(TicketHeader {
                key_id: 7,
                issuer: 3
            })
        );
        assert_eq!(
            ring.open(&old, b"ctx").as_deref(),
            Some(&b"sealed before the v2 format"[..])
        );
        assert_eq!(ring.open(&old, b"other"), None);
        for i in 0..old.len() {
            let mut bad = old.clone();
            bad[i] ^= 0x01;
            assert_eq!(ring.open(&bad, b"ctx"), None, "flipped byte {i}");
        }
        let fresh = seal_v1(&ring, 9, b"fresh", b"");
        assert_eq!(ring.open(&fresh, b"").as_deref(), Some(&b"fresh"[..]));
        // Another key with the same id opens neither format.
        let other = KeyRing::new(vec![TicketKey::new(7, &[0x43; 32], Instant::now())]);
        assert_eq!(other.open(&old, b"ctx"), None);
        assert_eq!(other.open(&ring.seal(0, b"y", b"").unwrap(), b""), None);
    }

    #[test]
    fn local_keys_rotate_after_their_seal_budget() {
        let t = Instant::now();
        let s = TicketSealer::local(1, HOUR, t).unwrap().with_seal_budget(3);
        let first: Vec<Vec<u8>> = (0..3).map(|_| s.seal_at(b"a", t).unwrap()).collect();
        let id = |blob: &[u8]| TicketHeader::parse(blob).unwrap().key_id;
        assert!(first.iter().all(|b| id(b) == id(&first[0])));
        // The fourth seal, at the same instant, is under a new key; the first three still open.
        let fourth = s.seal_at(b"b", t).unwrap();
        assert_ne!(id(&fourth), id(&first[0]));
        assert_eq!(s.key_ids().len(), 2);
        for b in &first {
            assert_eq!(s.open_at(b, t).as_deref(), Some(&b"a"[..]));
        }
        // A sealer with keys from a file never makes its own, whatever it has sealed.
        let ring = KeyRing::parse_key_file(&generate_key_line().unwrap(), t).unwrap();
        let ext = TicketSealer::external(1, HOUR, ring).with_seal_budget(1);
        let a = ext.seal_at(b"a", t).unwrap();
        let b = ext.seal_at(b"b", t).unwrap();
        assert_eq!(id(&a), id(&b));
        assert_eq!(ext.key_ids().len(), 1);
    }

    /// Seal + open cost (they are on the handshake path). Run with
    /// `cargo test --release -p baton-session seal_open_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn seal_open_timing() {
        let ring = ring42();
        for size in [200usize, 4096] {
            let plain = vec![0x5a; size];
            for (name, v2) in [("v1 (ring key)", false), ("v2 (per-seal key)", true)] {
                let mut runs: Vec<f64> = (0..9)
                    .map(|_| {
                        const N: u32 = 20_000;
                        let start = std::time::Instant::now();
                        for _ in 0..N {
                            let sealed = if v2 {
                                ring.seal_large(1, &plain, b"ctx").unwrap()
                            } else {
                                seal_v1(&ring, 1, &plain, b"ctx")
                            };
                            let opened = ring.open(&sealed, b"ctx").unwrap();
                            std::hint::black_box(opened);
                        }
                        start.elapsed().as_nanos() as f64 / f64::from(N)
                    })
                    .collect();
                runs.sort_by(f64::total_cmp);
                println!(
                    "seal+open {size} B {name}: median {:.0} ns (min {:.0}, max {:.0}), {} runs",
                    runs[runs.len() / 2],
                    runs[0],
                    runs[runs.len() - 1],
                    runs.len()
                );
            }
        }
    }

    proptest! {
        #[test]
        fn open_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let t = Instant::now();
            let s = TicketSealer::local(1, HOUR, t).unwrap();
            let _ = s.open_at(&bytes, t);
            let _ = TicketHeader::parse(&bytes);
        }

        #[test]
        fn key_file_parser_never_panics(text in "\\PC{0,300}") {
            let _ = KeyRing::parse_key_file(&text, Instant::now());
        }

        #[test]
        fn key_file_round_trips_generated_lines(n in 1usize..5) {
            let lines: Vec<String> = (0..n).map(|_| generate_key_line().unwrap()).collect();
            let ring = KeyRing::parse_key_file(&lines.join("\n"), Instant::now()).unwrap();
            prop_assert_eq!(ring.key_ids().len(), n);
        }
    }
}
