//! The sealed transport under the link's frames, sans-IO: every byte after the handshake travels in Noise
//! transport messages, each behind its length.
//!
//! ```text
//! len u16 | Noise transport message (ciphertext and a 16-byte tag), len <= 65535
//! ```
//!
//! Each direction numbers its messages from 0 (the Noise nonce; nothing of it is sent), so a
//! changed, dropped, replayed, reordered or inserted message does not open, and a link whose
//! message did not open is torn down: nothing after it is read.

use std::sync::Arc;

/// Largest Noise message, and so of a record's body.
pub const MAX_MESSAGE: usize = 65535;
/// The tag each message adds.
pub const TAG_LEN: usize = 16;
/// Plaintext one message carries at most.
pub const MAX_PLAIN: usize = MAX_MESSAGE - TAG_LEN;
/// A record's length field.
const LEN_LEN: usize = 2;

/// A link's session keys, shared by its reading and writing halves (each keeps its own count).
#[derive(Clone)]
pub struct Transport(Arc<snow::StatelessTransportState>);

/// Why a record was refused. The link is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// A length no sender writes (shorter than a tag).
    BadLength,
    /// The message does not open: changed, out of order, replayed, or not from the peer.
    Unauthenticated,
}

impl std::fmt::Display for Integrity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::BadLength => "a link message of a bad length: link torn down",
            Self::Unauthenticated => {
                "a link message failed authentication (changed, replayed or not from the peer): \
                 link torn down"
            }
        })
    }
}

impl std::error::Error for Integrity {}

impl Transport {
    pub(crate) fn new(state: snow::StatelessTransportState) -> Self {
        Self(Arc::new(state))
    }

    /// One message: `plain` (at most [`MAX_PLAIN`]) sealed as message number `nonce`.
    pub fn seal_one(&self, nonce: u64, plain: &[u8]) -> Result<Vec<u8>, Integrity> {
        let mut out = vec![0u8; plain.len() + TAG_LEN];
        let n = self
            .0
            .write_message(nonce, plain, &mut out)
            .map_err(|_| Integrity::BadLength)?;
        out.truncate(n);
        Ok(out)
    }

    /// Opens message number `nonce`.
    pub fn open_one(&self, nonce: u64, message: &[u8]) -> Result<Vec<u8>, Integrity> {
        let mut out = vec![0u8; message.len()];
        let n = self.open_into(nonce, message, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    fn open_into(&self, nonce: u64, message: &[u8], out: &mut [u8]) -> Result<usize, Integrity> {
        if message.len() < TAG_LEN || message.len() > MAX_MESSAGE {
            return Err(Integrity::BadLength);
        }
        self.0
            .read_message(nonce, message, out)
            .map_err(|_| Integrity::Unauthenticated)
    }
}

/// The writing half: seals the frames written, as few records as fit.
pub struct Sealer {
    transport: Transport,
    nonce: u64,
}

impl Sealer {
    pub fn new(transport: Transport) -> Self {
        Self {
            transport,
            nonce: 0,
        }
    }

    /// Appends `plain` to `out` as records of at most [`MAX_MESSAGE`] bytes each.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), Integrity> {
        for chunk in plain.chunks(MAX_PLAIN) {
            let at = out.len();
            let len = chunk.len() + TAG_LEN;
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.resize(at + LEN_LEN + len, 0);
            let n = self
                .transport
                .0
                .write_message(self.nonce, chunk, &mut out[at + LEN_LEN..])
                .map_err(|_| Integrity::BadLength)?;
            debug_assert_eq!(n, len);
            self.nonce += 1;
        }
        Ok(())
    }
}

/// The reading half: records in, plaintext out, one record buffered at most.
pub struct Opener {
    transport: Transport,
    nonce: u64,
    /// Received bytes; `input[start..end]` not yet opened.
    input: Box<[u8]>,
    start: usize,
    end: usize,
    /// The last record's plaintext; `plain[pos..]` not yet taken.
    plain: Box<[u8]>,
    plain_len: usize,
    pos: usize,
    /// Once a record is refused, so is everything after it.
    failed: Option<Integrity>,
}

impl Opener {
    pub fn new(transport: Transport) -> Self {
        Self {
            transport,
            nonce: 0,
            input: vec![0u8; LEN_LEN + MAX_MESSAGE].into_boxed_slice(),
            start: 0,
            end: 0,
            plain: vec![0u8; MAX_MESSAGE].into_boxed_slice(),
            plain_len: 0,
            pos: 0,
            failed: None,
        }
    }

    /// Where the next received bytes go (never empty while [`Self::next`] asks for more).
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.input[self.end..]
    }

    /// `n` bytes were received into [`Self::spare`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.input.len());
    }

    /// Whether received bytes wait for the rest of their record.
    pub fn partial(&self) -> bool {
        self.end > self.start
    }

    /// The plaintext ready to be taken: empty when the next record is not all here yet
    /// (receive more), an error for a record that does not open (and at every call after it).
    pub fn available(&mut self) -> Result<&[u8], Integrity> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        while self.pos == self.plain_len {
            let got = &self.input[self.start..self.end];
            let Some(len) = got
                .get(..LEN_LEN)
                .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
            else {
                break;
            };
            if len < TAG_LEN {
                return Err(*self.failed.insert(Integrity::BadLength));
            }
            if got.len() < LEN_LEN + len {
                break;
            }
            let message = &self.input[self.start + LEN_LEN..self.start + LEN_LEN + len];
            match self
                .transport
                .open_into(self.nonce, message, &mut self.plain)
            {
                Ok(n) => {
                    self.nonce += 1;
                    self.start += LEN_LEN + len;
                    self.plain_len = n;
                    self.pos = 0;
                }
                Err(e) => return Err(*self.failed.insert(e)),
            }
        }
        Ok(&self.plain[self.pos..self.plain_len])
    }

    /// `n` bytes of [`Self::available`] were taken.
    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.plain_len);
    }

    /// Moves plaintext into `dst`: `Ok(0)` when [`Self::available`] has none.
    pub fn read(&mut self, dst: &mut [u8]) -> Result<usize, Integrity> {
        let got = self.available()?;
        let n = dst.len().min(got.len());
        dst[..n].copy_from_slice(&got[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// A handshake between two fresh ends with a fixed key: the dispatcher's transport and the
/// agent's (tests and fuzzing).
pub(crate) fn pair() -> (Transport, Transport) {
    use std::time::Instant;
    let ring = baton_session::ticket::KeyRing::parse_key_file(
        "00000001 4242424242424242424242424242424242424242424242424242424242424242",
        Instant::now(),
    )
    .expect("a fixed key");
    let hello = crate::auth::AgentHello {
        agent_id: 1,
        link_id: [1; 16],
    };
    let (init, first) = crate::auth::Initiator::start(&ring).expect("a key");
    let (reply, agent) = crate::auth::respond(
        &crate::auth::psks(&ring),
        &first[crate::auth::HEAD_LEN..],
        &hello,
    )
    .expect("the same key");
    let (_, dispatcher) = init
        .finish(&reply[crate::auth::HEAD_LEN..], 1)
        .expect("the same key");
    (dispatcher, agent)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    use crate::fuzzing::feed as receive;

    #[test]
    fn what_is_sealed_opens_in_order_in_any_pieces() {
        let (d, a) = pair();
        let mut s = Sealer::new(d);
        let mut wire = Vec::new();
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        s.seal(b"first", &mut wire).unwrap();
        s.seal(&big, &mut wire).unwrap();
        s.seal(b"", &mut wire).unwrap();
        // 200,000 bytes: four records, none over the limit
        assert_eq!(wire.len(), 2 + 5 + 16 + 200_000 + 4 * (2 + 16));
        for step in [1, 7, 65_537, wire.len()] {
            let mut o = Opener::new(a.clone());
            let got = receive(&mut o, &wire, step).unwrap();
            assert_eq!(&got[..5], b"first");
            assert!(got[5..] == big[..], "step {step}");
            assert!(!o.partial());
        }
    }

    #[test]
    fn any_flipped_byte_is_refused_and_so_is_all_after_it() {
        let (d, a) = pair();
        let mut s = Sealer::new(d);
        let mut wire = Vec::new();
        s.seal(b"baton-source: 192.0.2.1", &mut wire).unwrap();
        s.seal(b"more", &mut wire).unwrap();
        let first = 2 + 23 + TAG_LEN;
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x20;
            let mut o = Opener::new(a.clone());
            // the records before the changed one open, none from it on
            let before: &[u8] = if i < first {
                b""
            } else {
                b"baton-source: 192.0.2.1"
            };
            let mut got = Vec::new();
            let mut buf = [0u8; 100];
            let end = loop {
                match o.read(&mut buf) {
                    Ok(0) if o.spare().len() > wire.len() && !bad.is_empty() => {
                        let n = bad.len();
                        o.spare()[..n].copy_from_slice(&bad);
                        o.filled(n);
                        bad.clear();
                    }
                    Ok(0) => break None,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => break Some(e),
                }
            };
            assert_eq!(got, before, "byte {i}");
            // a changed length may only leave the record waiting for bytes that never come
            assert!(
                end.is_some() || (o.partial() && [0, 1, first, first + 1].contains(&i)),
                "byte {i}"
            );
            assert!(receive(&mut o, &wire, wire.len()).map_or(true, |g| g.is_empty()));
        }
    }

    #[test]
    fn replayed_dropped_or_reordered_records_are_refused() {
        let (d, a) = pair();
        let mut s = Sealer::new(d);
        let (mut one, mut two) = (Vec::new(), Vec::new());
        s.seal(b"one", &mut one).unwrap();
        s.seal(b"two", &mut two).unwrap();
        let replay = [one.clone(), one.clone()].concat();
        let mut o = Opener::new(a.clone());
        assert_eq!(
            receive(&mut o, &replay, replay.len()),
            Err(Integrity::Unauthenticated)
        );
        let mut o = Opener::new(a.clone());
        assert_eq!(receive(&mut o, &two, 100), Err(Integrity::Unauthenticated));
        // the other direction's records do not open here
        let mut o = Opener::new(a.clone());
        let mut back = Vec::new();
        Sealer::new(a).seal(b"x", &mut back).unwrap();
        assert_eq!(receive(&mut o, &back, 100), Err(Integrity::Unauthenticated));
    }

    #[test]
    fn a_length_below_a_tag_is_refused() {
        let (_, a) = pair();
        let mut o = Opener::new(a);
        assert_eq!(receive(&mut o, &[0, 15], 2), Err(Integrity::BadLength));
    }

    proptest! {
        #[test]
        fn arbitrary_records_are_refused_without_panic(
            wire in proptest::collection::vec(any::<u8>(), 0..2000),
            step in 1usize..300,
        ) {
            let (_, a) = pair();
            let mut o = Opener::new(a);
            match receive(&mut o, &wire, step) {
                Err(_) => {}
                Ok(got) => prop_assert!(got.is_empty()),
            }
        }
    }
}
