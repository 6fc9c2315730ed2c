//! The peer replication protocol: each agent tells every other agent about the sessions it
//! creates (the paper's broadcast), over a channel that is authenticated and sealed with the
//! cluster key. Plain state machines; `peers.rs` runs them on sockets.
//!
//! ```text
//! receiver -> sender, once:  "BTNP" version u8 (2) challenge[16]
//! sender -> receiver, each:  len u32 | seq u64 | KeyRing::seal(sender id, message,
//!                                                    context = challenge || seq)
//! message:                   op u8 (1 put, 2 remove) | key_len u8 | key
//!                            | put only: ttl_ms u32 | value
//!                          | op u8 (3 ping)
//! ```
//!
//! The challenge binds every frame to one connection and the sequence number to one place in
//! it, so a recorded frame can be neither replayed on another connection nor repeated or
//! reordered on the same one. A frame that fails any check ends the connection.
//!
//! The first frame that opens is the sender's answer to the challenge: it proves the cluster
//! key and names the sender (the issuer in its clear header, which the seal authenticates);
//! every later frame must name the same sender. A sender sends a ping first, so it answers at
//! once, and then whenever it has had nothing to send for a while, so a receiver can tell a
//! quiet peer from a dead connection. Version 1 receivers (no ping) are still served: a sender
//! then sends them no pings. Version 1 senders cannot serve version 2 receivers (they refuse the
//! hello), so while a cluster is upgraded, sessions flow only from upgraded agents.

use baton_wire::codec::{encode_bytes, read_vec, Codec, Len, Reader};
use baton_wire::{Error, Malformed};
use zeroize::Zeroizing;

use crate::ticket::{KeyRing, TicketHeader};

pub const MAGIC: &[u8; 4] = b"BTNP";
pub const VERSION: u8 = 2;
/// The version before pings: a sender still serves receivers that greet with it.
pub const VERSION_NO_PING: u8 = 1;
pub const CHALLENGE_LEN: usize = 16;
pub const HELLO_LEN: usize = MAGIC.len() + 1 + CHALLENGE_LEN;
/// Largest sealed frame accepted: a session with a client certificate chain is a few KB.
pub const MAX_FRAME: usize = 80 * 1024;
/// A frame's length and sequence number, before the sealed message.
pub const FRAME_HEADER: usize = 4 + 8;
/// A message's key: a TLS session id or stateful ticket.
const KEY_LEN: Len = Len::U8;

/// What one agent tells another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A new session: store `value` under `key` for `ttl_ms`.
    Put {
        key: Vec<u8>,
        value: Zeroizing<Vec<u8>>,
        ttl_ms: u32,
    },
    /// A single-use session (TLS 1.3 stateful ticket) was consumed: forget it everywhere.
    Remove { key: Vec<u8> },
    /// Nothing: the sender's first frame (its answer to the challenge) and its heartbeat.
    Ping,
}

/// Why a replication channel was closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicationError {
    #[error("peer hello malformed or of another protocol version")]
    BadHello,
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("frame out of sequence: expected {expected}, got {got}")]
    Sequence { expected: u64, got: u64 },
    #[error("frame failed authentication (wrong cluster key, or tampered)")]
    Auth,
    #[error("message malformed")]
    Malformed,
    #[error("frame from agent {got} on agent {expected}'s connection")]
    Sender { expected: u16, got: u16 },
}

impl From<Error> for ReplicationError {
    fn from(_: Error) -> Self {
        ReplicationError::Malformed
    }
}

impl Codec for Message {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Message::Put { key, value, ttl_ms } => {
                1u8.encode(out);
                encode_bytes(out, KEY_LEN, key);
                ttl_ms.encode(out);
                out.extend_from_slice(value);
            }
            Message::Remove { key } => {
                2u8.encode(out);
                encode_bytes(out, KEY_LEN, key);
            }
            Message::Ping => 3u8.encode(out),
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        match u8::read(r)? {
            1 => Ok(Message::Put {
                key: read_vec(r, KEY_LEN, "key")?.to_vec(),
                ttl_ms: u32::read(r)?,
                // The value is the rest: the seal's length is the message's.
                value: Zeroizing::new(r.rest().to_vec()),
            }),
            2 => Ok(Message::Remove {
                key: read_vec(r, KEY_LEN, "key")?.to_vec(),
            }),
            3 => Ok(Message::Ping),
            _ => Err(Malformed::Unknown("replication message").into()),
        }
    }
}

impl Message {
    /// Reads a whole opened message.
    pub fn decode(bytes: &[u8]) -> Result<Self, ReplicationError> {
        Ok(Self::read_bytes(bytes)?)
    }

    /// Whether the message fits the protocol (keys are at most 255 bytes).
    pub fn is_valid(&self) -> bool {
        match self {
            Message::Put { key, .. } | Message::Remove { key } => key.len() <= u8::MAX as usize,
            Message::Ping => true,
        }
    }
}

/// The receiving end of one connection.
#[derive(Debug)]
pub struct Inbound {
    challenge: [u8; CHALLENGE_LEN],
    expected_seq: u64,
    buf: Vec<u8>,
    /// The sender, once a frame has opened.
    peer: Option<u16>,
}

impl Inbound {
    pub fn new(challenge: [u8; CHALLENGE_LEN]) -> Self {
        Self {
            challenge,
            expected_seq: 0,
            buf: Vec::new(),
            peer: None,
        }
    }

    /// The sender's agent id, once it has answered the challenge (a frame opened); `None`
    /// before: the connection is not authenticated yet.
    pub fn peer(&self) -> Option<u16> {
        self.peer
    }

    /// The bytes to send to the peer first.
    pub fn hello(&self) -> Vec<u8> {
        Hello {
            version: VERSION,
            challenge: self.challenge,
        }
        .get_encoding()
    }

    /// Bytes received and not yet part of a whole frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Feeds received bytes; returns the messages completed by them with their sender's id
    /// (pings included: each proves the sender alive). Buffers at most one frame.
    pub fn push(
        &mut self,
        ring: &KeyRing,
        bytes: &[u8],
    ) -> Result<Vec<(u16, Message)>, ReplicationError> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            // The length covers the sealed message only, not the sequence number after it.
            let mut r = Reader::new(&self.buf);
            let Ok(len) = u32::read(&mut r) else { break };
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            // Refused as soon as the length arrives: a receiver buffers at most one frame.
            if len > MAX_FRAME {
                return Err(ReplicationError::TooLarge(len));
            }
            let (Ok(seq), Ok(sealed)) = (u64::read(&mut r), r.take(len, "sealed message")) else {
                break;
            };
            if seq != self.expected_seq {
                return Err(ReplicationError::Sequence {
                    expected: self.expected_seq,
                    got: seq,
                });
            }
            let sender = TicketHeader::parse(sealed)
                .ok_or(ReplicationError::Auth)?
                .issuer;
            let plain = Zeroizing::new(
                ring.open(sealed, &context(&self.challenge, seq))
                    .ok_or(ReplicationError::Auth)?,
            );
            match self.peer {
                Some(expected) if expected != sender => {
                    return Err(ReplicationError::Sender {
                        expected,
                        got: sender,
                    })
                }
                _ => self.peer = Some(sender),
            }
            out.push((sender, Message::decode(&plain)?));
            self.expected_seq += 1;
            let used = r.used();
            self.buf.drain(..used);
        }
        Ok(out)
    }
}

/// The sending end of one connection, once the peer's hello has arrived.
#[derive(Debug)]
pub struct Outbound {
    sender: u16,
    challenge: [u8; CHALLENGE_LEN],
    next_seq: u64,
    /// Whether the receiver knows pings (version 2 on).
    pings: bool,
}

impl Outbound {
    pub fn new(sender: u16, hello: &[u8]) -> Result<Self, ReplicationError> {
        let hello = Hello::read_bytes(hello).map_err(|_| ReplicationError::BadHello)?;
        if !matches!(hello.version, VERSION | VERSION_NO_PING) {
            return Err(ReplicationError::BadHello);
        }
        Ok(Self {
            sender,
            challenge: hello.challenge,
            next_seq: 0,
            pings: hello.version != VERSION_NO_PING,
        })
    }

    /// Whether the receiver takes pings. One that does not (version 1) expects nothing until
    /// the first session.
    pub fn pings(&self) -> bool {
        self.pings
    }

    /// One frame carrying `msg`; `None` if the ring has no key, the message is invalid, or it
    /// is a ping and the receiver does not take them.
    pub fn frame(&mut self, ring: &KeyRing, msg: &Message) -> Option<Vec<u8>> {
        if !msg.is_valid() || (*msg == Message::Ping && !self.pings) {
            return None;
        }
        let seq = self.next_seq;
        let mut plain = Zeroizing::new(Vec::new());
        msg.encode(&mut plain);
        let sealed = ring.seal(self.sender, &plain, &context(&self.challenge, seq))?;
        if sealed.len() > MAX_FRAME {
            return None;
        }
        let len = u32::try_from(sealed.len()).ok()?;
        self.next_seq += 1;
        let mut out = Vec::with_capacity(FRAME_HEADER + sealed.len());
        len.encode(&mut out);
        seq.encode(&mut out);
        out.extend_from_slice(&sealed);
        Some(out)
    }
}

/// The receiver's greeting: magic, the protocol version it speaks, and its challenge.
struct Hello {
    version: u8,
    challenge: [u8; CHALLENGE_LEN],
}

impl Codec for Hello {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        self.version.encode(out);
        out.extend_from_slice(&self.challenge);
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        if r.take_array::<4>("magic")? != *MAGIC {
            return Err(Malformed::Unknown("replication protocol").into());
        }
        Ok(Self {
            version: u8::read(r)?,
            challenge: r.take_array("challenge")?,
        })
    }
}

fn context(challenge: &[u8; CHALLENGE_LEN], seq: u64) -> Vec<u8> {
    [&challenge[..], &seq.to_be_bytes()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ticket::generate_key_line;
    use proptest::prelude::*;
    use std::time::Instant;

    fn ring(line: &str) -> KeyRing {
        KeyRing::parse_key_file(line, Instant::now()).unwrap()
    }

    fn put(k: &[u8], v: &[u8]) -> Message {
        Message::Put {
            key: k.to_vec(),
            value: Zeroizing::new(v.to_vec()),
            ttl_ms: 60_000,
        }
    }

    fn pair(ch: u8) -> (Inbound, Outbound) {
        let inbound = Inbound::new([ch; CHALLENGE_LEN]);
        let outbound = Outbound::new(7, &inbound.hello()).unwrap();
        (inbound, outbound)
    }

    #[test]
    fn frames_round_trip_in_any_chunking() {
        let key = ring(&generate_key_line().unwrap());
        let (mut rx, mut tx) = pair(1);
        let msgs = [
            put(b"id-1", b"secret"),
            Message::Remove {
                key: b"id-1".to_vec(),
            },
            put(b"", b""),
        ];
        let wire: Vec<u8> = msgs
            .iter()
            .flat_map(|m| tx.frame(&key, m).unwrap())
            .collect();
        let mut got = Vec::new();
        for chunk in wire.chunks(5) {
            got.extend(rx.push(&key, chunk).unwrap());
        }
        assert_eq!(got, msgs.iter().map(|m| (7, m.clone())).collect::<Vec<_>>());
    }

    #[test]
    fn wrong_key_replay_and_reorder_are_refused() {
        let key = ring(&generate_key_line().unwrap());
        let other = ring(&generate_key_line().unwrap());
        let (mut rx, mut tx) = pair(1);
        let f0 = tx.frame(&key, &put(b"a", b"1")).unwrap();
        let f1 = tx.frame(&key, &put(b"b", b"2")).unwrap();
        // wrong cluster key
        assert_eq!(pair(1).0.push(&other, &f0), Err(ReplicationError::Auth));
        // a frame recorded on one connection does not open on another
        assert_eq!(pair(2).0.push(&key, &f0), Err(ReplicationError::Auth));
        // reordering and repetition
        assert!(matches!(
            pair(1).0.push(&key, &f1),
            Err(ReplicationError::Sequence { .. })
        ));
        rx.push(&key, &f0).unwrap();
        assert!(matches!(
            rx.push(&key, &f0),
            Err(ReplicationError::Sequence { .. })
        ));
    }

    #[test]
    fn oversized_frames_and_bad_hellos_are_refused() {
        let key = ring(&generate_key_line().unwrap());
        let mut rx = Inbound::new([0; CHALLENGE_LEN]);
        assert_eq!(
            rx.push(&key, &u32::MAX.to_be_bytes()),
            Err(ReplicationError::TooLarge(u32::MAX as usize))
        );
        assert!(Outbound::new(1, b"BTNP\x03xxxxxxxxxxxxxxxx").is_err());
        assert!(Outbound::new(1, b"BTNP\x02xxxxxxxxxxxxxxx").is_err());
        assert!(Outbound::new(1, b"HTTP").is_err());
    }

    #[test]
    fn the_first_frame_that_opens_names_the_sender_for_the_whole_connection() {
        let key = ring(&generate_key_line().unwrap());
        let (mut rx, mut tx) = pair(1);
        assert_eq!(rx.peer(), None);
        // a frame that does not open authenticates nothing
        let forged = pair(2).1.frame(&key, &Message::Ping).unwrap();
        assert_eq!(pair(1).0.push(&key, &forged), Err(ReplicationError::Auth));
        let ping = tx.frame(&key, &Message::Ping).unwrap();
        // half a frame is not an answer yet
        assert_eq!(rx.push(&key, &ping[..ping.len() - 1]), Ok(vec![]));
        assert_eq!(rx.peer(), None);
        assert_eq!(
            rx.push(&key, &ping[ping.len() - 1..]),
            Ok(vec![(7, Message::Ping)])
        );
        assert_eq!(rx.peer(), Some(7));
        // another cluster member cannot take the connection over, even in sequence
        let mut other = Outbound::new(8, &Inbound::new([1; CHALLENGE_LEN]).hello()).unwrap();
        let _seq0 = other.frame(&key, &Message::Ping).unwrap();
        let seq1 = other.frame(&key, &put(b"a", b"1")).unwrap();
        assert_eq!(
            rx.push(&key, &seq1),
            Err(ReplicationError::Sender {
                expected: 7,
                got: 8
            })
        );
    }

    #[test]
    fn version_1_receivers_get_no_pings() {
        let key = ring(&generate_key_line().unwrap());
        let mut old = Outbound::new(3, b"BTNP\x01xxxxxxxxxxxxxxxx").unwrap();
        assert!(!old.pings());
        assert_eq!(old.frame(&key, &Message::Ping), None);
        // the ping took no sequence number: the first real frame is still frame 0
        let f = old.frame(&key, &put(b"a", b"1")).unwrap();
        assert_eq!(&f[4..12], &0u64.to_be_bytes());
        assert!(pair(1).1.pings());
        assert_eq!(Message::decode(&[3, 0]), Err(ReplicationError::Malformed));
        assert_eq!(
            Message::decode(&Message::Ping.get_encoding()),
            Ok(Message::Ping)
        );
    }

    /// Encodings made by the code before it moved onto `baton_wire::codec` (agents of both
    /// versions share a cluster while it is upgraded).
    #[test]
    fn encoding_is_unchanged() {
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(&put(b"id", b"val").get_encoding()),
            "010269640000ea6076616c"
        );
        assert_eq!(
            hex(&Message::Remove { key: vec![0xab; 3] }.get_encoding()),
            "0203ababab"
        );
        assert_eq!(hex(&Message::Ping.get_encoding()), "03");
        let (rx, mut tx) = pair(0x5a);
        assert_eq!(
            hex(&rx.hello()),
            "42544e50025a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
        );
        let key = ring("00000001 0000000000000000000000000000000000000000000000000000000000000000");
        tx.frame(&key, &Message::Ping).unwrap();
        let f = tx.frame(&key, &put(b"k", b"v")).unwrap();
        // len u32 | seq u64 | the sealed message (random salt and nonce)
        assert_eq!(hex(&f[..FRAME_HEADER]), "0000003b0000000000000001");
        assert_eq!(
            f.len(),
            FRAME_HEADER + crate::ticket::OVERHEAD + 1 + 1 + 1 + 4 + 1
        );
    }

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            Just(Message::Ping),
            (
                proptest::collection::vec(any::<u8>(), 0..40),
                proptest::collection::vec(any::<u8>(), 0..200),
                any::<u32>()
            )
                .prop_map(|(key, value, ttl_ms)| Message::Put {
                    key,
                    value: Zeroizing::new(value),
                    ttl_ms
                }),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|key| Message::Remove { key }),
        ]
    }

    proptest! {
        #[test]
        fn streams_of_pings_and_sessions_arrive_whole_and_name_their_sender(
            msgs in proptest::collection::vec(message(), 0..20),
            chunk in 1usize..300,
            sender in any::<u16>(),
        ) {
            let key = ring("00000001 0000000000000000000000000000000000000000000000000000000000000000");
            let mut rx = Inbound::new([9; CHALLENGE_LEN]);
            let mut tx = Outbound::new(sender, &rx.hello()).unwrap();
            let wire: Vec<u8> = msgs.iter().flat_map(|m| tx.frame(&key, m).unwrap()).collect();
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                got.extend(rx.push(&key, piece).unwrap());
                // authenticated exactly when a whole frame has arrived
                prop_assert_eq!(rx.peer().is_some(), !got.is_empty());
            }
            prop_assert_eq!(got, msgs.into_iter().map(|m| (sender, m)).collect::<Vec<_>>());
            prop_assert_eq!(rx.buffered(), 0);
        }

        #[test]
        fn garbage_never_panics_and_buffers_at_most_a_frame(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let key = ring("00000001 0000000000000000000000000000000000000000000000000000000000000000");
            let mut rx = Inbound::new([0; CHALLENGE_LEN]);
            let _ = rx.push(&key, &bytes);
            prop_assert!(rx.buf.len() <= FRAME_HEADER + MAX_FRAME);
            prop_assert_eq!(rx.peer(), None);
            let _ = Message::decode(&bytes);
        }

        #[test]
        fn messages_round_trip(key in proptest::collection::vec(any::<u8>(), 0..255), value in proptest::collection::vec(any::<u8>(), 0..500), ttl in any::<u32>()) {
            let m = Message::Put { key: key.clone(), value: Zeroizing::new(value), ttl_ms: ttl };
            prop_assert_eq!(Message::decode(&m.get_encoding()).unwrap(), m);
            let r = Message::Remove { key };
            prop_assert_eq!(Message::decode(&r.get_encoding()).unwrap(), r);
            prop_assert_eq!(Message::decode(&Message::Ping.get_encoding()).unwrap(), Message::Ping);
        }
    }
}
