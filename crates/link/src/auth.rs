//! The link's handshake, as plain functions over byte buffers and snow's handshake state (the
//! socket code in `server.rs` and `client.rs` only moves these bytes, under a deadline).
//!
//! A Noise `NNpsk0` handshake: the pre-shared key is derived from the cluster key ring, so the
//! dispatcher's first message opens only for a holder of the key (the agent answers nothing
//! else), the agent's reply proves the key back, and both ephemeral keys make the session keys
//! (forward secrecy). What the agent tells (its id, the link id) travels in its reply's
//! encrypted payload. Every handshake message starts with [`HEADER`] in clear, which is also
//! the prologue, so the version is bound into the session keys and a peer of another version
//! can be told apart from a stranger.

use baton_session::ticket::KeyRing;
use baton_wire::codec::{Codec, Reader};
use zeroize::Zeroizing;

use crate::seal::Transport;

pub const MAGIC: &[u8; 4] = b"BTLK";
/// The link's protocol version, in the clear header of both handshake messages and in their
/// prologue. 4: the link's own frames in the sealed transport (3: h2 in it; 2: a challenge on
/// the cluster key, then plain h2). Both ends refuse a peer of another version rather than
/// mis-read its frames, so a cluster mixing builds during an upgrade fails loudly, per link.
pub const VERSION: u8 = 4;
/// Every handshake message's clear start, and the Noise prologue.
pub const HEADER: [u8; 5] = [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION];
/// The header and the length of the Noise message that follows it (u16, big-endian).
pub const HEAD_LEN: usize = HEADER.len() + 2;
/// Largest handshake message accepted (the first is 48 bytes, the reply 66).
pub const MAX_MESSAGE: usize = 256;
/// The Noise protocol: the dispatcher (initiator) proves the pre-shared key in its first
/// message; both ends send an ephemeral key only.
pub const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// What the pre-shared key is derived for ([`KeyRing::derive_secrets`]).
const PSK_LABEL: &[u8] = b"baton link psk v3";

/// What the agent tells the dispatcher, inside its encrypted reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentHello {
    pub agent_id: u16,
    /// Random per link connection: names it (a migrated session is sealed for one link).
    pub link_id: [u8; 16],
}

const HELLO_LEN: usize = 2 + 16;

impl AgentHello {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HELLO_LEN);
        self.agent_id.encode(&mut out);
        out.extend_from_slice(&self.link_id);
        out
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Reader::new(b);
        let hello = Self {
            agent_id: u16::read(&mut r).ok()?,
            link_id: r.take_array("link id").ok()?,
        };
        (!r.any_left()).then_some(hello)
    }
}

/// Why a handshake was refused. No variant carries a secret or a peer's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The peer speaks the link protocol in another version.
    OtherVersion(u8),
    /// Not the link protocol at all.
    NotALink,
    /// A handshake message of a length that no peer of this version sends.
    BadLength,
    /// The message does not open with the cluster key (another key, tampered, garbage).
    Unauthenticated,
    /// The reply came from another agent than the one this link is for.
    OtherAgent(u16),
    /// The cluster key ring is empty, or the crypto failed locally.
    NoKey,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OtherVersion(v) => write!(
                f,
                "the peer speaks link protocol version {v}, this build {VERSION}: \
                 run one build across the cluster"
            ),
            Self::NotALink => f.write_str("not an agent link"),
            Self::BadLength => f.write_str("a link handshake message of a bad length"),
            Self::Unauthenticated => f.write_str("the peer did not prove the cluster key"),
            Self::OtherAgent(id) => write!(f, "another agent ({id}) answered the link"),
            Self::NoKey => f.write_str("no usable cluster key"),
        }
    }
}

impl std::error::Error for Refused {}

impl From<Refused> for std::io::Error {
    fn from(r: Refused) -> Self {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, r)
    }
}

/// The pre-shared keys a ring gives, in its order (the first is what a dispatcher uses).
pub fn psks(ring: &KeyRing) -> Vec<Zeroizing<[u8; 32]>> {
    ring.derive_secrets(PSK_LABEL)
}

/// The length of the Noise message that follows a handshake message's head, once its header
/// is checked.
pub fn message_len(head: &[u8; HEAD_LEN]) -> Result<usize, Refused> {
    if head[..4] != *MAGIC {
        return Err(Refused::NotALink);
    }
    if head[4] != VERSION {
        return Err(Refused::OtherVersion(head[4]));
    }
    let len = usize::from(u16::from_be_bytes([head[5], head[6]]));
    if len == 0 || len > MAX_MESSAGE {
        return Err(Refused::BadLength);
    }
    Ok(len)
}

fn builder(psk: &[u8; 32]) -> Result<snow::Builder<'_>, Refused> {
    let params = PATTERN.parse().map_err(|_| Refused::NoKey)?;
    snow::Builder::with_resolver(params, crate::crypto::resolver())
        .psk(0, psk)
        .and_then(|b| b.prologue(&HEADER))
        .map_err(|_| Refused::NoKey)
}

/// Head and Noise message, as sent.
fn framed(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_LEN + message.len());
    out.extend_from_slice(&HEADER);
    // handshake messages are far below MAX_MESSAGE, so the length fits
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The dispatcher's side, between its first message and the agent's reply.
pub struct Initiator {
    state: snow::HandshakeState,
}

impl Initiator {
    /// Starts a handshake with the ring's first key; returns the state and the first message
    /// (head included) to send.
    pub fn start(ring: &KeyRing) -> Result<(Self, Vec<u8>), Refused> {
        let psk = psks(ring).into_iter().next().ok_or(Refused::NoKey)?;
        let mut state = builder(&psk)?
            .build_initiator()
            .map_err(|_| Refused::NoKey)?;
        let mut buf = [0u8; MAX_MESSAGE];
        let n = state
            .write_message(&[], &mut buf)
            .map_err(|_| Refused::NoKey)?;
        Ok((Self { state }, framed(&buf[..n])))
    }

    /// Reads the agent's reply (the Noise message after its head): the agent's hello and the
    /// link's transport, if it proved the key and is the agent `agent_id`.
    pub fn finish(
        mut self,
        reply: &[u8],
        agent_id: u16,
    ) -> Result<(AgentHello, Transport), Refused> {
        if reply.len() > MAX_MESSAGE {
            return Err(Refused::BadLength);
        }
        let mut payload = [0u8; MAX_MESSAGE];
        let n = self
            .state
            .read_message(reply, &mut payload)
            .map_err(|_| Refused::Unauthenticated)?;
        let hello = AgentHello::decode(&payload[..n]).ok_or(Refused::Unauthenticated)?;
        if hello.agent_id != agent_id {
            return Err(Refused::OtherAgent(hello.agent_id));
        }
        let transport = Transport::new(
            self.state
                .into_stateless_transport_mode()
                .map_err(|_| Refused::Unauthenticated)?,
        );
        Ok((hello, transport))
    }
}

/// The agent's side: opens the dispatcher's first message (the Noise message after its head)
/// with each key of the ring in turn (a rotation: old and new are both accepted); returns the
/// reply to send (head included), carrying `hello`, and the link's transport. A message that
/// opens with no key gets no reply.
pub fn respond(
    psks: &[Zeroizing<[u8; 32]>],
    first: &[u8],
    hello: &AgentHello,
) -> Result<(Vec<u8>, Transport), Refused> {
    if first.is_empty() || first.len() > MAX_MESSAGE {
        return Err(Refused::BadLength);
    }
    let mut payload = [0u8; MAX_MESSAGE];
    for psk in psks {
        let mut state = builder(psk)?
            .build_responder()
            .map_err(|_| Refused::NoKey)?;
        // The dispatcher sends nothing in its payload: anything else is not this version.
        match state.read_message(first, &mut payload) {
            Ok(0) => {}
            Ok(_) | Err(_) => continue,
        }
        let mut buf = [0u8; MAX_MESSAGE];
        let n = state
            .write_message(&hello.encode(), &mut buf)
            .map_err(|_| Refused::NoKey)?;
        let transport = Transport::new(
            state
                .into_stateless_transport_mode()
                .map_err(|_| Refused::NoKey)?,
        );
        return Ok((framed(&buf[..n]), transport));
    }
    Err(Refused::Unauthenticated)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;

    fn ring(k: &str) -> KeyRing {
        KeyRing::parse_key_file(k, Instant::now()).unwrap()
    }
    const A: &str = "00000001 1111111111111111111111111111111111111111111111111111111111111111";
    const B: &str = "00000002 2222222222222222222222222222222222222222222222222222222222222222";
    const HELLO: AgentHello = AgentHello {
        agent_id: 3,
        link_id: [9; 16],
    };

    /// Splits a framed handshake message into its checked head's length and its message.
    fn unframe(m: &[u8]) -> &[u8] {
        let head: [u8; HEAD_LEN] = m[..HEAD_LEN].try_into().unwrap();
        let len = message_len(&head).unwrap();
        assert_eq!(m.len(), HEAD_LEN + len);
        &m[HEAD_LEN..]
    }

    fn handshake(
        dispatcher: &KeyRing,
        agent: &KeyRing,
    ) -> Result<(AgentHello, Transport, Transport), Refused> {
        let (init, first) = Initiator::start(dispatcher)?;
        let (reply, agent_side) = respond(&psks(agent), unframe(&first), &HELLO)?;
        let (hello, dispatcher_side) = init.finish(unframe(&reply), HELLO.agent_id)?;
        Ok((hello, dispatcher_side, agent_side))
    }

    #[test]
    fn both_ends_with_the_key_get_the_hello_and_one_transport() {
        let (hello, d, a) = handshake(&ring(A), &ring(A)).unwrap();
        assert_eq!(hello, HELLO);
        let sealed = d.seal_one(0, b"hello agent").unwrap();
        assert_eq!(a.open_one(0, &sealed).unwrap(), b"hello agent");
        let sealed = a.seal_one(0, b"hello dispatcher").unwrap();
        assert_eq!(d.open_one(0, &sealed).unwrap(), b"hello dispatcher");
        // what one side sealed does not open as the other side's, nor at another position
        assert!(d.open_one(1, &sealed).is_err());
        let mine = d.seal_one(1, b"x").unwrap();
        assert!(d.open_one(1, &mine).is_err(), "reflected");
    }

    #[test]
    fn a_dispatcher_without_the_key_gets_no_reply() {
        assert_eq!(
            handshake(&ring(B), &ring(A)).err(),
            Some(Refused::Unauthenticated)
        );
    }

    #[test]
    fn during_a_rotation_the_agent_accepts_either_key() {
        let both = ring(&format!("{B}\n{A}"));
        assert!(handshake(&ring(A), &both).is_ok(), "old key");
        assert!(handshake(&ring(B), &both).is_ok(), "new key");
        assert!(
            handshake(&both, &ring(A)).is_err(),
            "the agent lacks the new key"
        );
    }

    #[test]
    fn the_reply_of_another_agent_or_tampered_is_refused() {
        let (init, first) = Initiator::start(&ring(A)).unwrap();
        let other = AgentHello {
            agent_id: 4,
            ..HELLO
        };
        let (reply, _) = respond(&psks(&ring(A)), unframe(&first), &other).unwrap();
        assert_eq!(
            init.finish(unframe(&reply), 3).err(),
            Some(Refused::OtherAgent(4))
        );
        let (init, first) = Initiator::start(&ring(A)).unwrap();
        let (reply, _) = respond(&psks(&ring(A)), unframe(&first), &HELLO).unwrap();
        let mut bad = unframe(&reply).to_vec();
        bad[40] ^= 1;
        assert_eq!(init.finish(&bad, 3).err(), Some(Refused::Unauthenticated));
    }

    #[test]
    fn a_replayed_first_message_gets_a_session_its_sender_alone_could_use() {
        let (_, first) = Initiator::start(&ring(A)).unwrap();
        // the agent answers a replay (it cannot tell), but with a fresh ephemeral key: what the
        // dispatcher sent in the first session does not open in the second
        let (_, one) = respond(&psks(&ring(A)), unframe(&first), &HELLO).unwrap();
        let (_, two) = respond(&psks(&ring(A)), unframe(&first), &HELLO).unwrap();
        let from_one = one.seal_one(0, b"stream").unwrap();
        assert!(two.open_one(0, &from_one).is_err());
    }

    #[test]
    fn heads_tell_another_version_from_a_stranger() {
        let mut head = [0u8; HEAD_LEN];
        head[..5].copy_from_slice(&HEADER);
        head[6] = 48;
        assert_eq!(message_len(&head), Ok(48));
        head[4] = 2;
        assert_eq!(message_len(&head), Err(Refused::OtherVersion(2)));
        // the sealed link over h2, the version before this one
        head[4] = 3;
        assert_eq!(message_len(&head), Err(Refused::OtherVersion(3)));
        // what a version 2 agent sends first: its hello
        assert_eq!(
            message_len(b"BTLK\x02\x00\x03"),
            Err(Refused::OtherVersion(2))
        );
        head[4] = VERSION;
        head[5] = 1;
        assert_eq!(message_len(&head), Err(Refused::BadLength));
        head[5..].copy_from_slice(&[0, 0]);
        assert_eq!(message_len(&head), Err(Refused::BadLength));
        head[0] = b'G';
        assert_eq!(message_len(&head), Err(Refused::NotALink));
        assert!(Refused::OtherVersion(3).to_string().contains("version 3"));
    }

    #[test]
    fn the_first_message_has_its_documented_shape() {
        let (_, first) = Initiator::start(&ring(A)).unwrap();
        assert_eq!(&first[..5], b"BTLK\x04");
        // an ephemeral key and the tag of an empty payload
        assert_eq!(unframe(&first).len(), 32 + 16);
        let (_, reply) = {
            let (init, first) = Initiator::start(&ring(A)).unwrap();
            (
                init,
                respond(&psks(&ring(A)), unframe(&first), &HELLO).unwrap().0,
            )
        };
        assert_eq!(unframe(&reply).len(), 32 + HELLO_LEN + 16);
    }

    proptest! {
        #[test]
        fn arbitrary_first_messages_are_refused(m in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert!(respond(&psks(&ring(A)), &m, &HELLO).is_err());
        }

        #[test]
        fn arbitrary_replies_are_refused(m in proptest::collection::vec(any::<u8>(), 0..300)) {
            let (init, _) = Initiator::start(&ring(A)).unwrap();
            prop_assert!(init.finish(&m, 3).is_err());
        }

        #[test]
        fn arbitrary_heads_never_panic(h in any::<[u8; HEAD_LEN]>()) {
            if let Ok(n) = message_len(&h) {
                prop_assert!(n > 0 && n <= MAX_MESSAGE);
                prop_assert_eq!(&h[..5], &HEADER[..]);
            }
        }

        #[test]
        fn hellos_round_trip(agent_id in any::<u16>(), link_id in any::<[u8; 16]>()) {
            let hello = AgentHello { agent_id, link_id };
            prop_assert_eq!(AgentHello::decode(&hello.encode()), Some(hello));
        }
    }
}
