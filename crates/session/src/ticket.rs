//! Stateless session tickets: sealing with a ring of keys that rotates.
//!
//! Wire layout of a ticket (what a dispatcher may read without any key):
//!
//! ```text
//! 0      version (1)
//! 1..5   key id, big endian: which key of the ring sealed it
//! 5..7   issuer: the agent id that issued it (0 for a lone agent)
//! 7..19  nonce (random)
//! 19..   AES-256-GCM(plain) || tag, with bytes 0..7 as associated data
//! ```
//!
//! The key id and the issuer sit outside the sealed part on purpose: the cluster's dispatcher
//! routes a resumption to the agent that holds the session without decrypting anything.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use zeroize::Zeroizing;

use crate::Error;

pub const TICKET_VERSION: u8 = 1;
const HEADER_LEN: usize = 1 + 4 + 2;
const OVERHEAD: usize = HEADER_LEN + NONCE_LEN + 16;
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
    /// Reads the clear header of a ticket sealed by [`TicketSealer`]; `None` if it is not one.
    pub fn parse(ticket: &[u8]) -> Option<Self> {
        if ticket.len() < OVERHEAD || ticket[0] != TICKET_VERSION {
            return None;
        }
        Some(Self {
            key_id: u32::from_be_bytes(ticket[1..5].try_into().ok()?),
            issuer: u16::from_be_bytes(ticket[5..7].try_into().ok()?),
        })
    }
}

/// One ticket key.
pub struct TicketKey {
    id: u32,
    key: LessSafeKey,
    created: Instant,
}

impl std::fmt::Debug for TicketKey {
    // The key itself is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKey")
            .field("id", &format_args!("{:08x}", self.id))
            .finish()
    }
}

impl TicketKey {
    /// A key from its 32 secret bytes.
    pub fn new(id: u32, secret: &[u8; 32], created: Instant) -> Self {
        // AES-256 accepts any 32 bytes, so this cannot fail.
        let unbound = UnboundKey::new(&AES_256_GCM, secret).expect("32-byte AES-256 key");
        Self {
            id,
            key: LessSafeKey::new(unbound),
            created,
        }
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
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD);
        out.push(TICKET_VERSION);
        out.extend_from_slice(&key.id.to_be_bytes());
        out.extend_from_slice(&issuer.to_be_bytes());
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        let aad = [&out[..HEADER_LEN], context].concat();
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..]),
                &mut body,
            )
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    /// Opens what [`KeyRing::seal`] sealed with the same `context`; `None` for anything else.
    pub fn open(&self, ticket: &[u8], context: &[u8]) -> Option<Vec<u8>> {
        let header = TicketHeader::parse(ticket)?;
        let key = self.keys.iter().find(|k| k.id == header.key_id)?;
        let nonce =
            Nonce::try_assume_unique_for_key(&ticket[HEADER_LEN..HEADER_LEN + NONCE_LEN]).ok()?;
        let mut body = ticket[HEADER_LEN + NONCE_LEN..].to_vec();
        let plain_len = key
            .key
            .open_in_place(
                nonce,
                Aad::from(&[&ticket[..HEADER_LEN], context].concat()[..]),
                &mut body,
            )
            .ok()?
            .len();
        body.truncate(plain_len);
        Some(body)
    }
}

/// How the ring gets new keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// The sealer generates a key every interval itself (a lone agent).
    Local { every: Duration },
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
    /// A sealer that makes its own keys, a new one every `lifetime`; a key stays usable for
    /// opening while tickets it sealed may still be valid.
    pub fn local(issuer: u16, lifetime: Duration, now: Instant) -> Result<Self, Error> {
        Ok(Self {
            issuer,
            lifetime,
            rotation: Rotation::Local { every: lifetime },
            ring: RwLock::new(KeyRing::new(vec![TicketKey::generate(now)?])),
        })
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
        let Rotation::Local { every } = self.rotation else {
            return;
        };
        let due = |ring: &KeyRing| {
            ring.keys
                .first()
                .is_none_or(|k| now.saturating_duration_since(k.created) >= every)
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
        // A key that stopped sealing at `created + every` may still open tickets for `lifetime`.
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
