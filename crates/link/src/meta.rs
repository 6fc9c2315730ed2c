//! A stream's metadata: who the client is, and what kind of stream it is; the payload of its
//! OPEN frame.
//!
//! ```text
//! flags u8 | source | destination | token[16] (flag 1) | reattach[16] (flag 2)
//!   flags: 1 token, 2 reattach, 4 drain, 8 follows, 16 shed, 32 shed on
//!   an address: 4 | ip[4] | port u16, or 6 | ip[16] | port u16
//! ```

use std::net::SocketAddr;

use baton_wire::codec::{Codec, Reader};

// The OPEN payload's flags.
const TOKEN: u8 = 1;
const REATTACH: u8 = 2;
const DRAIN: u8 = 4;
const FOLLOWS: u8 = 8;
const SHED: u8 = 16;
const SHED_ON: u8 = 32;
const ALL: u8 = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamMeta {
    /// The client's address (what PROXY v2 carried before the link).
    pub source: SocketAddr,
    /// The address the client connected to.
    pub destination: SocketAddr,
    /// A migration's import stream: the token its session object is sealed for.
    pub token: Option<[u8; 16]>,
    /// An import stream for a session whose agent drains (not one after a handshake): for the
    /// home agent's counters only.
    pub drain: bool,
    /// A control stream, not a client's: the dispatcher's operator drained the agent (`true`:
    /// move its idle connections elsewhere) or enabled it again (`false`).
    pub shed: Option<bool>,
    /// The dispatcher follows this stream's records for its whole life, so the agent may ask
    /// to move it when it drains (a handoff Leave). A dispatcher that does not (an older
    /// version, during an upgrade) would pass the Leave to the client.
    pub follows: bool,
    /// A successor dispatcher's stream that continues the agent's stream handed over with
    /// this token (a handover's END); never delivered by `LinkListener::accept`.
    pub reattach: Option<[u8; 16]>,
}

impl StreamMeta {
    /// A client's stream whose records the dispatcher follows for its whole life (every
    /// stream today's dispatcher opens for a client); the rest is set per kind of stream.
    pub fn followed(source: SocketAddr, destination: SocketAddr) -> Self {
        Self {
            source,
            destination,
            token: None,
            drain: false,
            shed: None,
            follows: true,
            reattach: None,
        }
    }

    /// The OPEN frame's payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut flags = 0u8;
        for (bit, on) in [
            (TOKEN, self.token.is_some()),
            (REATTACH, self.reattach.is_some()),
            (DRAIN, self.drain),
            (FOLLOWS, self.follows),
            (SHED, self.shed.is_some()),
            (SHED_ON, self.shed == Some(true)),
        ] {
            if on {
                flags |= bit;
            }
        }
        out.push(flags);
        self.source.encode(out);
        self.destination.encode(out);
        for t in [self.token, self.reattach].into_iter().flatten() {
            out.extend_from_slice(&t);
        }
    }

    /// `None` for anything [`encode`](Self::encode) does not write: an unknown flag, an
    /// address family other than 4 and 6, a missing or extra byte.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Reader::new(b);
        let flags = u8::read(&mut r).ok()?;
        if flags & !ALL != 0 || (flags & SHED_ON != 0 && flags & SHED == 0) {
            return None;
        }
        let source = SocketAddr::read(&mut r).ok()?;
        let destination = SocketAddr::read(&mut r).ok()?;
        let mut token = |on: bool| -> Option<Option<[u8; 16]>> {
            if !on {
                return Some(None);
            }
            Some(Some(r.take_array("token").ok()?))
        };
        let meta = Self {
            source,
            destination,
            token: token(flags & TOKEN != 0)?,
            reattach: token(flags & REATTACH != 0)?,
            drain: flags & DRAIN != 0,
            follows: flags & FOLLOWS != 0,
            shed: (flags & SHED != 0).then_some(flags & SHED_ON != 0),
        };
        (!r.any_left()).then_some(meta)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn full() -> StreamMeta {
        StreamMeta {
            source: "10.0.0.7:5000".parse().unwrap(),
            destination: "[::1]:443".parse().unwrap(),
            token: Some([0xab; 16]),
            drain: true,
            shed: Some(true),
            follows: true,
            reattach: Some([0x5c; 16]),
        }
    }

    fn encoded(m: &StreamMeta) -> Vec<u8> {
        let mut b = Vec::new();
        m.encode(&mut b);
        b
    }

    #[test]
    fn round_trip_and_refusals() {
        let m = full();
        assert_eq!(StreamMeta::decode(&encoded(&m)), Some(m));
        let plain = StreamMeta {
            token: None,
            drain: false,
            shed: Some(false),
            follows: false,
            reattach: None,
            ..m
        };
        let b = encoded(&plain);
        assert_eq!(StreamMeta::decode(&b), Some(plain));
        assert!(b.len() <= crate::frame::MAX_OPEN);
        assert!(encoded(&m).len() <= crate::frame::MAX_OPEN);
        // one byte more or less, an unknown flag, "shed on" without "shed", a bad family
        let b = encoded(&m);
        assert_eq!(StreamMeta::decode(&b[..b.len() - 1]), None);
        assert_eq!(StreamMeta::decode(&[&b[..], &[0]].concat()), None);
        let mut bad = b.clone();
        bad[0] |= 64;
        assert_eq!(StreamMeta::decode(&bad), None);
        let mut bad = encoded(&plain);
        bad[0] = SHED_ON;
        assert_eq!(StreamMeta::decode(&bad), None);
        let mut bad = b.clone();
        bad[1] = 5;
        assert_eq!(StreamMeta::decode(&bad), None);
        assert_eq!(StreamMeta::decode(&[]), None);
    }

    proptest! {
        #[test]
        fn arbitrary_payloads_decode_to_what_encodes_back(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Some(m) = StreamMeta::decode(&b) {
                prop_assert_eq!(encoded(&m), b);
            }
        }
    }
}
