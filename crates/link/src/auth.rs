//! The link's mutual authentication, as plain functions over byte buffers (the socket code in
//! `server.rs` and `client.rs` only moves these bytes, under a deadline).

use baton_session::ticket::KeyRing;
use baton_wire::codec::{encode_bytes, Codec, Len, Reader};

pub const MAGIC: &[u8; 4] = b"BTLK";
/// The link's protocol version, in the agent's hello. 2: the handoff exchange without
/// Freeze/Frozen (the handshake agent cuts by itself, `baton_migrate`); a dispatcher
/// refuses an agent of another version (and an older dispatcher a newer agent) rather than
/// mis-read its frames, so a cluster mixing builds during an upgrade fails loudly, per link.
pub const VERSION: u8 = 2;
/// The agent's hello: magic, version, agent id, link id.
pub const HELLO_LEN: usize = 4 + 1 + 2 + 16;
/// Largest proof accepted (a sealed empty message is 51 bytes).
pub const MAX_PROOF: usize = 256;
/// The issuer id the dispatcher seals its proof under (agents have ids below it).
pub const DISPATCHER_ISSUER: u16 = 0xFFFF;
/// A proof on the wire; the socket code refuses one over [`MAX_PROOF`] when its length arrives.
const PROOF_LEN: Len = Len::U16;

/// What the agent sends first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentHello {
    pub agent_id: u16,
    pub link_id: [u8; 16],
}

// Fixed-size arrays rather than `Codec`: the socket code reads exactly HELLO_LEN bytes.
impl AgentHello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = Vec::with_capacity(HELLO_LEN);
        out.extend_from_slice(MAGIC);
        VERSION.encode(&mut out);
        self.agent_id.encode(&mut out);
        out.extend_from_slice(&self.link_id);
        let mut hello = [0; HELLO_LEN];
        hello.copy_from_slice(&out);
        hello
    }

    /// The version a hello with the link's magic announces (`None`: not a link's hello), so
    /// that a mismatch can be told apart from garbage.
    pub fn version_of(b: &[u8; HELLO_LEN]) -> Option<u8> {
        (b[..4] == *MAGIC).then_some(b[4])
    }

    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Self> {
        let mut r = Reader::new(b);
        if r.take_array::<4>("magic").ok()? != *MAGIC || u8::read(&mut r).ok()? != VERSION {
            return None;
        }
        Some(Self {
            agent_id: u16::read(&mut r).ok()?,
            link_id: r.take_array("link id").ok()?,
        })
    }
}

fn context(who: &[u8], hello: &AgentHello, challenge: &[u8; 16]) -> Vec<u8> {
    [
        who,
        &hello.agent_id.to_be_bytes(),
        &hello.link_id,
        challenge,
    ]
    .concat()
}

const DISPATCHER: &[u8] = b"baton link v1 dispatcher";
const AGENT: &[u8] = b"baton link v1 agent";

/// The dispatcher's proof that it holds the cluster key, for this link and its challenge.
pub fn dispatcher_proof(
    ring: &KeyRing,
    hello: &AgentHello,
    challenge: &[u8; 16],
) -> Option<Vec<u8>> {
    ring.seal(
        DISPATCHER_ISSUER,
        &[],
        &context(DISPATCHER, hello, challenge),
    )
}

pub fn verify_dispatcher(
    ring: &KeyRing,
    hello: &AgentHello,
    challenge: &[u8; 16],
    proof: &[u8],
) -> bool {
    opens_empty(ring, proof, &context(DISPATCHER, hello, challenge))
}

/// The agent's proof, given only once the dispatcher's has been verified.
pub fn agent_proof(ring: &KeyRing, hello: &AgentHello, challenge: &[u8; 16]) -> Option<Vec<u8>> {
    ring.seal(hello.agent_id, &[], &context(AGENT, hello, challenge))
}

pub fn verify_agent(
    ring: &KeyRing,
    hello: &AgentHello,
    challenge: &[u8; 16],
    proof: &[u8],
) -> bool {
    opens_empty(ring, proof, &context(AGENT, hello, challenge))
}

fn opens_empty(ring: &KeyRing, proof: &[u8], context: &[u8]) -> bool {
    proof.len() <= MAX_PROOF && ring.open(proof, context).is_some_and(|p| p.is_empty())
}

/// A proof with its length in front.
pub fn framed(proof: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + proof.len());
    encode_bytes(&mut out, PROOF_LEN, proof);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn hellos_round_trip(agent_id in any::<u16>(), link_id in any::<[u8; 16]>()) {
            let hello = AgentHello { agent_id, link_id };
            prop_assert_eq!(AgentHello::decode(&hello.encode()), Some(hello));
        }

        #[test]
        fn any_hello_bytes_decode_or_not_without_panic(b in any::<[u8; HELLO_LEN]>()) {
            if let Some(hello) = AgentHello::decode(&b) {
                prop_assert_eq!(hello.encode(), b);
            }
        }

        #[test]
        fn framed_proofs_carry_their_length(proof in proptest::collection::vec(any::<u8>(), 0..300)) {
            let framed = framed(&proof);
            let mut r = Reader::new(&framed);
            prop_assert_eq!(baton_wire::codec::read_vec(&mut r, PROOF_LEN, "proof"), Ok(&proof[..]));
            prop_assert!(!r.any_left());
        }
    }

    fn ring(k: &str) -> KeyRing {
        KeyRing::parse_key_file(k, Instant::now()).unwrap()
    }
    const A: &str = "00000001 1111111111111111111111111111111111111111111111111111111111111111";
    const B: &str = "00000001 2222222222222222222222222222222222222222222222222222222222222222";

    /// The hello and the proof framing as the code before `baton_wire::codec` wrote them (a
    /// dispatcher and its agents may run different versions during an upgrade), but for the
    /// version: 2 since the handoff exchange lost Freeze/Frozen.
    #[test]
    fn encoding_is_unchanged() {
        let hello = AgentHello {
            agent_id: 0x0102,
            link_id: [0xab; 16],
        };
        let golden =
            b"BTLK\x02\x01\x02\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab";
        assert_eq!(&hello.encode(), golden);
        assert_eq!(AgentHello::decode(golden), Some(hello));
        assert_eq!(AgentHello::version_of(golden), Some(2));
        let mut other = *golden;
        other[4] = 1;
        assert_eq!(AgentHello::decode(&other), None, "another version");
        assert_eq!(AgentHello::version_of(&other), Some(1));
        other[0] = b'X';
        assert_eq!(AgentHello::version_of(&other), None);
        assert_eq!(framed(&[7, 8, 9]), [0, 3, 7, 8, 9]);
        assert_eq!(framed(&[]), [0, 0]);
    }

    #[test]
    fn both_sides_prove_with_the_same_key_only() {
        let hello = AgentHello {
            agent_id: 3,
            link_id: [9; 16],
        };
        assert_eq!(AgentHello::decode(&hello.encode()), Some(hello));
        let ch = [4; 16];
        let d = dispatcher_proof(&ring(A), &hello, &ch).unwrap();
        assert!(verify_dispatcher(&ring(A), &hello, &ch, &d));
        assert!(!verify_dispatcher(&ring(B), &hello, &ch, &d), "wrong key");
        let a = agent_proof(&ring(A), &hello, &ch).unwrap();
        assert!(verify_agent(&ring(A), &hello, &ch, &a));
        assert!(!verify_agent(&ring(B), &hello, &ch, &a));
        // a proof is one side's, for one link, one challenge and one agent id
        assert!(!verify_agent(&ring(A), &hello, &ch, &d), "reflected");
        let other_link = AgentHello {
            link_id: [8; 16],
            ..hello
        };
        assert!(
            !verify_dispatcher(&ring(A), &other_link, &ch, &d),
            "replayed on another link"
        );
        assert!(!verify_dispatcher(&ring(A), &hello, &[5; 16], &d));
        let other_agent = AgentHello {
            agent_id: 4,
            ..hello
        };
        assert!(
            !verify_agent(&ring(A), &other_agent, &ch, &a),
            "another agent id"
        );
        assert!(!verify_agent(&ring(A), &hello, &ch, &[0; 40]));
        let mut bad = hello.encode();
        bad[0] = b'X';
        assert_eq!(AgentHello::decode(&bad), None);
    }
}
