//! The session object of a migrated connection (the CSSL paper's `SESS_OBJ`): what the handshake
//! agent hands the home agent so it can carry on the same TLS connection — version, suite, both
//! directions' keys, IVs, next sequence numbers and (TLS 1.3) traffic secrets for KeyUpdate,
//! the client plaintext already decrypted, and what the application needs to know (ALPN, SNI,
//! the client certificate's subject).
//!
//! On the wire it is sealed with the cluster key ring ([`KeyRing`], AES-256-GCM, key id in
//! clear), bound to the home agent it is for and to this purpose (associated data), and it
//! expires within seconds: a blob opens once, at one agent, soon. [`ReplayGuard`] makes "once"
//! true: importing the same object twice would have two agents encrypt under one key and nonce.
//! Decoded secrets live in `Zeroizing` buffers.
//!
//! ```text
//! object    = version u8 (1) | id[16] | home u16 | expires_ms u64 | version u16 | suite u16
//!             | tx | rx | resumed u8 | alpn<u32> | sni<u32> | client_subject<u32>
//!             | plaintext<u32, at most MAX_CARRIED_PLAINTEXT>
//! direction = seq u64 | key<u32> | iv[12] | secret<u32>
//! ```
//!
//! An absent option is an empty string (none of them is ever present and empty).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_wire::codec::{encode_bytes, read_vec, Codec, Len, Reader};
use baton_wire::{Error, Malformed};
use zeroize::Zeroizing;

use crate::ticket::KeyRing;

/// Encoding version of [`SessionObject`].
const VERSION: u8 = 1;
/// Client plaintext a session object carries at most; a handshake agent holding more keeps the
/// connection itself (a frame holds 64 KiB, and a request this large is not worth moving).
pub const MAX_CARRIED_PLAINTEXT: usize = 32 * 1024;
/// Keys, secrets, ALPN, SNI and the client subject. The seal authenticates the object, so
/// their only bound is the blob's own length.
const FIELD_LEN: Len = Len::U32;
const PLAINTEXT_LEN: Len = Len::U32.at_most(MAX_CARRIED_PLAINTEXT);
/// How long a sealed object stays valid: it crosses one dispatcher on a LAN.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// One direction of the connection, as rustls extracted it.
#[derive(Clone, PartialEq, Eq)]
pub struct DirectionState {
    /// The next sequence number.
    pub seq: u64,
    pub key: Zeroizing<Vec<u8>>,
    pub iv: [u8; 12],
    /// TLS 1.3: this generation's application traffic secret (for KeyUpdate).
    pub secret: Option<Zeroizing<Vec<u8>>>,
}

impl Codec for DirectionState {
    fn encode(&self, out: &mut Vec<u8>) {
        self.seq.encode(out);
        encode_bytes(out, FIELD_LEN, &self.key);
        out.extend_from_slice(&self.iv);
        encode_bytes(
            out,
            FIELD_LEN,
            self.secret.as_deref().map_or(&[], |s| &s[..]),
        );
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        Ok(Self {
            seq: u64::read(r)?,
            key: Zeroizing::new(read_vec(r, FIELD_LEN, "key")?.to_vec()),
            iv: r.take_array("iv")?,
            secret: read_optional(r, "secret")?.map(|s| Zeroizing::new(s.to_vec())),
        })
    }
}

impl std::fmt::Debug for DirectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectionState")
            .field("seq", &self.seq)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// A migrated TLS session.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionObject {
    /// Random, unique per migration: the replay guard's key.
    pub id: [u8; 16],
    /// The agent it is for.
    pub home: u16,
    /// Seconds since the epoch after which it is refused (wall clock: it crosses processes).
    pub expires_ms: u64,
    /// 0x0303 or 0x0304.
    pub version: u16,
    /// The IANA cipher suite.
    pub suite: u16,
    /// Server to client.
    pub tx: DirectionState,
    /// Client to server.
    pub rx: DirectionState,
    pub resumed: bool,
    pub alpn: Option<Vec<u8>>,
    pub sni: Option<String>,
    pub client_subject: Option<String>,
    /// Client application data the handshake agent decrypted before the freeze.
    pub plaintext: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for SessionObject {
    // Keys are redacted by DirectionState; the client's plaintext is not ours to log either.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionObject")
            .field("home", &self.home)
            .field("version", &format_args!("{:#06x}", self.version))
            .field("suite", &format_args!("{:#06x}", self.suite))
            .field("tx", &self.tx)
            .field("rx", &self.rx)
            .field("plaintext_len", &self.plaintext.len())
            .finish_non_exhaustive()
    }
}

/// Why a sealed session object was not imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("session object did not open (key, tampering, or not for this agent)")]
    Seal,
    #[error("session object expired")]
    Expired,
    #[error("session object already imported")]
    Replay,
    #[error("session object issued before this agent started")]
    Stale,
    #[error("session object malformed")]
    Invalid,
}

/// The associated data: the purpose, the home agent, and the binding the dispatcher gave in
/// its Offer (the home agent's link id and the import stream's token), so an object opens only
/// at that agent, on that link, for that stream.
fn context(home: u16, binding: &[u8]) -> Vec<u8> {
    [
        &b"baton session object v2 for agent "[..],
        &home.to_be_bytes(),
        binding,
    ]
    .concat()
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SessionObject {
    /// A fresh random id for a migration.
    pub fn new_id() -> [u8; 16] {
        let mut id = [0u8; 16];
        // A failed RNG leaves zeros: the guard then refuses the second such object, safely.
        let _ = aws_lc_rs::rand::fill(&mut id);
        id
    }

    /// The expiry for an object made at `now`.
    pub fn expiry(now: SystemTime, ttl: Duration) -> u64 {
        unix_ms(now + ttl)
    }

    /// Seals for `self.home` and `binding`, issued by `issuer` (in clear, for metrics at the
    /// receiver). `None` if the ring has no key or the object is too large.
    pub fn seal(&self, ring: &KeyRing, issuer: u16, binding: &[u8]) -> Option<Vec<u8>> {
        // Sized up front: a reallocation would leave a copy of the keys behind, unzeroized.
        let mut plain = Zeroizing::new(Vec::with_capacity(
            160 + self.tx.key.len() + self.rx.key.len() + 2 * 64 + self.plaintext.len(),
        ));
        self.encode(&mut plain);
        ring.seal_large(issuer, &plain, &context(self.home, binding))
    }

    /// Opens a blob sealed for agent `me` and `binding`; checks its expiry at `now`, that it
    /// was issued after `started` (this agent's start: its replay guard knows nothing older,
    /// so an older object is refused for one lifetime after a restart) and that `me` has not
    /// imported it before. The caller's guard remembers it from here on.
    pub fn open(
        sealed: &[u8],
        ring: &KeyRing,
        me: u16,
        binding: &[u8],
        now: SystemTime,
        started: SystemTime,
        guard: &mut ReplayGuard,
    ) -> Result<Self, ImportError> {
        let plain = Zeroizing::new(
            ring.open(sealed, &context(me, binding))
                .ok_or(ImportError::Seal)?,
        );
        let obj = Self::read_bytes(&plain).map_err(|_| ImportError::Invalid)?;
        if obj.home != me {
            return Err(ImportError::Seal);
        }
        let now_ms = unix_ms(now);
        if now_ms > obj.expires_ms {
            return Err(ImportError::Expired);
        }
        let issued_ms = obj
            .expires_ms
            .saturating_sub(DEFAULT_TTL.as_millis() as u64);
        if issued_ms < unix_ms(started) {
            return Err(ImportError::Stale);
        }
        if !guard.admit(obj.id, obj.expires_ms, now_ms) {
            return Err(ImportError::Replay);
        }
        Ok(obj)
    }
}

impl Codec for SessionObject {
    fn encode(&self, out: &mut Vec<u8>) {
        VERSION.encode(out);
        out.extend_from_slice(&self.id);
        self.home.encode(out);
        self.expires_ms.encode(out);
        self.version.encode(out);
        self.suite.encode(out);
        self.tx.encode(out);
        self.rx.encode(out);
        u8::from(self.resumed).encode(out);
        encode_bytes(out, FIELD_LEN, self.alpn.as_deref().unwrap_or_default());
        let sni = self.sni.as_deref().unwrap_or_default();
        encode_bytes(out, FIELD_LEN, sni.as_bytes());
        let subject = self.client_subject.as_deref().unwrap_or_default();
        encode_bytes(out, FIELD_LEN, subject.as_bytes());
        encode_bytes(out, PLAINTEXT_LEN, &self.plaintext);
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        if u8::read(r)? != VERSION {
            return Err(Malformed::Unknown("session object version").into());
        }
        Ok(Self {
            id: r.take_array("id")?,
            home: u16::read(r)?,
            expires_ms: u64::read(r)?,
            version: u16::read(r)?,
            suite: u16::read(r)?,
            tx: DirectionState::read(r)?,
            rx: DirectionState::read(r)?,
            // Any byte but 1 has always read as "not resumed".
            resumed: u8::read(r)? == 1,
            alpn: read_optional(r, "ALPN")?.map(<[u8]>::to_vec),
            sni: read_text(r, "SNI")?,
            client_subject: read_text(r, "client subject")?,
            plaintext: Zeroizing::new(read_vec(r, PLAINTEXT_LEN, "plaintext")?.to_vec()),
        })
    }
}

fn read_optional<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<Option<&'a [u8]>, Error> {
    let bytes = read_vec(r, FIELD_LEN, what)?;
    Ok((!bytes.is_empty()).then_some(bytes))
}

fn read_text(r: &mut Reader<'_>, what: &'static str) -> Result<Option<String>, Error> {
    read_optional(r, what)?
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| Malformed::NotUtf8(what).into()))
        .transpose()
}

/// The ids of session objects imported and not yet expired. Bounded: an object is remembered
/// only until it expires (after which it is refused anyway), and when the guard is full it
/// refuses new objects rather than forget live ones. Expired ids are forgotten as they expire
/// (oldest first, a few at each admission), so what the guard holds is the objects of the last
/// lifetime or so, not everything since the last time it filled up, and no admission walks
/// the whole table.
#[derive(Debug)]
pub struct ReplayGuard {
    seen: HashMap<[u8; 16], u64>,
    /// The same ids in the order they were admitted, with their expiry. Objects carry the
    /// same lifetime, so this is (nearly) expiry order: one that expires before an older one
    /// waits behind it at most one lifetime.
    order: VecDeque<(u64, [u8; 16])>,
    max: usize,
}

impl ReplayGuard {
    pub fn new(max: usize) -> Self {
        Self {
            seen: HashMap::new(),
            order: VecDeque::new(),
            max,
        }
    }

    /// Whether `id` (valid until `expires_ms`) may be imported now; remembers it if so.
    pub fn admit(&mut self, id: [u8; 16], expires_ms: u64, now_ms: u64) -> bool {
        while let Some(&(exp, old)) = self.order.front() {
            if exp >= now_ms {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if self.seen.contains_key(&id) || self.seen.len() >= self.max {
            return false;
        }
        self.seen.insert(id, expires_ms);
        self.order.push_back((expires_ms, id));
        true
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn ring(line: &str) -> KeyRing {
        KeyRing::parse_key_file(line, Instant::now()).unwrap()
    }
    const KEY_A: &str = "0000000a 1111111111111111111111111111111111111111111111111111111111111111";
    const B: &[u8] = &[5; 32];
    const START: SystemTime = UNIX_EPOCH;
    const KEY_B: &str = "0000000b 2222222222222222222222222222222222222222222222222222222222222222";

    fn object(now: SystemTime) -> SessionObject {
        SessionObject {
            id: SessionObject::new_id(),
            home: 1,
            expires_ms: SessionObject::expiry(now, DEFAULT_TTL),
            version: 0x0304,
            suite: 0x1301,
            tx: DirectionState {
                seq: 2,
                key: Zeroizing::new(vec![7; 16]),
                iv: [8; 12],
                secret: Some(Zeroizing::new(vec![9; 32])),
            },
            rx: DirectionState {
                seq: 0,
                key: Zeroizing::new(vec![1; 16]),
                iv: [2; 12],
                secret: None,
            },
            resumed: false,
            alpn: Some(b"h2".to_vec()),
            sni: Some("localhost".into()),
            client_subject: None,
            plaintext: Zeroizing::new(b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        }
    }

    #[test]
    fn seal_open_round_trip_once() {
        let now = SystemTime::now();
        let obj = object(now);
        let ring = ring(KEY_A);
        let sealed = obj.seal(&ring, 0, B).unwrap();
        let mut guard = ReplayGuard::new(100);
        assert_eq!(
            SessionObject::open(&sealed, &ring, 1, B, now, START, &mut guard).unwrap(),
            obj
        );
        assert_eq!(
            SessionObject::open(&sealed, &ring, 1, B, now, START, &mut guard),
            Err(ImportError::Replay)
        );
    }

    #[test]
    fn refused_when_expired_tampered_misaddressed_or_unkeyed() {
        let now = SystemTime::now();
        let obj = object(now);
        let sealed = obj.seal(&ring(KEY_A), 0, B).unwrap();
        let mut g = ReplayGuard::new(100);
        let later = now + DEFAULT_TTL + Duration::from_secs(1);
        assert_eq!(
            SessionObject::open(&sealed, &ring(KEY_A), 1, B, later, START, &mut g),
            Err(ImportError::Expired)
        );
        let mut bad = sealed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(
            SessionObject::open(&bad, &ring(KEY_A), 1, B, now, START, &mut g),
            Err(ImportError::Seal)
        );
        assert_eq!(
            SessionObject::open(&sealed, &ring(KEY_A), 2, B, now, START, &mut g),
            Err(ImportError::Seal),
            "sealed for agent 1, not 2"
        );
        assert_eq!(
            SessionObject::open(&sealed, &ring(KEY_B), 1, B, now, START, &mut g),
            Err(ImportError::Seal)
        );
        assert_eq!(
            SessionObject::open(&sealed, &ring(KEY_A), 1, &[6; 32], now, START, &mut g),
            Err(ImportError::Seal),
            "bound to another link or stream"
        );
        assert_eq!(
            SessionObject::open(
                &sealed,
                &ring(KEY_A),
                1,
                B,
                now,
                now + Duration::from_secs(1),
                &mut g
            ),
            Err(ImportError::Stale),
            "issued before the agent (re)started"
        );
        assert!(g.is_empty(), "nothing refused is remembered");
    }

    #[test]
    fn debug_never_shows_keys() {
        let dbg = format!("{:?}", object(SystemTime::now()));
        assert!(!dbg.contains("[7, 7"), "{dbg}");
        assert!(!dbg.contains("9, 9"), "{dbg}");
    }

    #[test]
    fn decode_refuses_truncations_and_trailing_bytes() {
        let bytes = object(SystemTime::now()).get_encoding();
        for n in 0..bytes.len() {
            assert!(
                SessionObject::read_bytes(&bytes[..n]).is_err(),
                "prefix {n}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(SessionObject::read_bytes(&long).is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    const FULL: &str = "0111111111111111111111111111111111010201020304050607080304130100\
          0000000000000200000010070707070707070707070707070707070808080808\
          0808080808080800000020090909090909090909090909090909090909090909\
          0909090909090909090909000000000000000000000010010101010101010101\
          0101010101010102020202020202020202020200000000010000000268320000\
          00096c6f63616c686f737400000004434e3d6300000003474554";
    const EMPTY: &str = "0111111111111111111111111111111111010201020304050607080304130100\
          0000000000000200000010070707070707070707070707070707070808080808\
          0808080808080800000020090909090909090909090909090909090909090909\
          0909090909090909090909000000000000000000000010010101010101010101\
          0101010101010102020202020202020202020200000000000000000000000000\
          0000000000000000";

    /// Encodings made by the code before it moved onto `baton_wire::codec`: objects sealed by
    /// an older agent must still open at an upgraded one, and the reverse.
    #[test]
    fn encoding_is_unchanged() {
        let mut full = object(UNIX_EPOCH);
        full.id = [0x11; 16];
        full.home = 0x0102;
        full.expires_ms = 0x0102_0304_0506_0708;
        full.resumed = true;
        full.client_subject = Some("CN=c".into());
        full.plaintext = Zeroizing::new(b"GET".to_vec());
        let empty = SessionObject {
            alpn: None,
            sni: None,
            client_subject: None,
            resumed: false,
            plaintext: Zeroizing::new(Vec::new()),
            ..full.clone()
        };
        for (obj, golden) in [(&full, FULL), (&empty, EMPTY)] {
            assert_eq!(hex(&obj.get_encoding()), golden);
            assert_eq!(
                SessionObject::read_bytes(&obj.get_encoding()).as_ref(),
                Ok(obj)
            );
        }
    }

    #[test]
    fn guard_is_bounded_and_forgets_only_expired_ids() {
        let mut g = ReplayGuard::new(2);
        assert!(g.admit([1; 16], 100, 0));
        assert!(g.admit([2; 16], 200, 0));
        assert!(!g.admit([3; 16], 300, 50), "full of live ids: refuse");
        assert!(g.admit([3; 16], 300, 150), "id 1 expired and was forgotten");
        assert!(!g.admit([2; 16], 200, 150));
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn guard_forgets_expired_ids_before_it_fills() {
        let mut g = ReplayGuard::new(1_000);
        for i in 0..100u64 {
            // one import per ms, each valid for 10 ms
            assert!(g.admit((i as u128).to_be_bytes(), i + 10, i));
            assert!(
                g.len() <= 11,
                "holds only the last lifetime's ids: {}",
                g.len()
            );
        }
        assert!(
            !g.admit(99u128.to_be_bytes(), 109, 100),
            "a live id is still a replay"
        );
        // all expired by now: forgotten (an object that old is refused by its own expiry)
        assert!(g.admit([0xff; 16], 130, 120));
        assert_eq!(g.len(), 1);
    }
}
