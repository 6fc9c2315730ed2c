//! The dispatcher handover: how a dispatcher process gives its listening sockets and its live
//! client connections to a successor (a new binary, new settings) and exits, with no
//! connection closed.
//!
//! The two processes talk over a private unix socket (the old one creates it owner-only,
//! starts the successor and checks the peer's pid); sockets travel beside the messages as
//! `SCM_RIGHTS`. Each message is `len u32 | kind u8 | body`, at most [`MAX_MESSAGE`].
//!
//! ```text
//!  old -> new  Listeners{kinds}      + one listening socket per kind, in order
//!  new -> old  Ready                 its links to the agents are up; it accepts now, and the
//!                                    old process stops accepting
//!  old -> new  Conn{...}             + the client's socket, once per connection: the old
//!                                    process stopped reading the client at a chunk boundary,
//!                                    ended the agent's link stream with an END carrying
//!                                    TOKEN, and forwarded everything the agent sent up to
//!                                    its `ack`; the agent waits for a stream that re-attaches
//!                                    with TOKEN (`baton-link`)
//!  old -> new  Done                  no more; the old process exits
//! ```
//!
//! Nothing is lost or sent twice: the client's bytes not read by the old process are still in
//! the socket's receive queue, the agent's bytes before its `ack` travel in the message and
//! those after it come on the successor's stream, and the record positions ([`Position`]) let the successor go on following both
//! directions (a later move cuts at a record boundary). No TLS state is in a dispatcher, so no
//! key changes hands here.

use std::net::SocketAddr;

use crate::{MigrationError, Position};
use baton_wire::codec::{Codec, Reader};

/// The most bytes a connection may carry to the successor each way. Owed to the client: what
/// the agent had queued on its stream when it saw the handover (a stream window, 256 KiB, one
/// write, and what the old process had read but the client had not taken), with room to
/// spare; owed to the agent: one read.
pub const MAX_PENDING: usize = 1024 * 1024;

/// The largest message: the owed bytes, and a position (at most two record headers and a
/// frame), with room to spare.
pub const MAX_MESSAGE: usize = 2 * MAX_PENDING + 160 * 1024;

/// What a passed listening socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// Clients (`--listen`).
    Public,
    /// `--metrics`.
    Metrics,
    /// `--admin`.
    Admin,
}

/// One live client connection, as the successor takes it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    /// The client's address (after any PROXY header).
    pub source: SocketAddr,
    /// The address the client connected to.
    pub destination: SocketAddr,
    /// The agent serving it (its stable id).
    pub agent: u16,
    /// The token the agent waits for on a re-attach stream.
    pub token: [u8; 16],
    /// Where both directions stand (after the owed bytes).
    pub position: Position,
    /// What the agent sent that the client has not been given yet: the successor writes it
    /// first (the old process does not wait for a slow client to read it).
    pub to_client: Vec<u8>,
    /// What the client sent that the agent has not taken yet (at most one read): the
    /// successor writes it first on the re-attach stream.
    pub to_agent: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Listeners(Vec<ListenerKind>),
    Ready,
    Conn(Box<Handed>),
    Done,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandoverError {
    #[error("handover message of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("unknown handover message kind {0}")]
    UnknownKind(u8),
    #[error("malformed handover {0}")]
    Malformed(&'static str),
    #[error("handover connection position: {0}")]
    Position(#[from] MigrationError),
}

impl ListenerKind {
    fn code(self) -> u8 {
        match self {
            ListenerKind::Public => 1,
            ListenerKind::Metrics => 2,
            ListenerKind::Admin => 3,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => ListenerKind::Public,
            2 => ListenerKind::Metrics,
            3 => ListenerKind::Admin,
            _ => return None,
        })
    }
}

impl Message {
    /// The message's wire form, length prefix included.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        match self {
            Message::Listeners(kinds) => {
                body.push(1);
                (kinds.len() as u16).encode(&mut body);
                body.extend(kinds.iter().map(|k| k.code()));
            }
            Message::Ready => body.push(2),
            Message::Conn(c) => {
                body.push(3);
                c.source.encode(&mut body);
                c.destination.encode(&mut body);
                c.agent.encode(&mut body);
                body.extend_from_slice(&c.token);
                c.position.encode(&mut body);
                baton_wire::codec::encode_bytes(&mut body, PENDING_LEN, &c.to_client);
                baton_wire::codec::encode_bytes(&mut body, PENDING_LEN, &c.to_agent);
            }
            Message::Done => body.push(4),
        }
        let mut out = Vec::with_capacity(4 + body.len());
        (body.len() as u32).encode(&mut out);
        out.extend_from_slice(&body);
        out
    }

    /// How many more bytes the message at the front of `buf` needs (0: it is whole), checking
    /// the announced length against [`MAX_MESSAGE`] first.
    pub fn needs(buf: &[u8]) -> Result<usize, HandoverError> {
        let Some(head) = buf.get(..4) else {
            return Ok(4 - buf.len());
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > MAX_MESSAGE {
            return Err(HandoverError::TooLarge(len));
        }
        Ok((4 + len).saturating_sub(buf.len()))
    }

    /// Reads one whole message from the front of `buf`; returns it and the bytes it took.
    pub fn decode(buf: &[u8]) -> Result<(Message, usize), HandoverError> {
        if Message::needs(buf)? > 0 {
            return Err(HandoverError::Malformed("truncated message"));
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let mut r = Reader::new(&buf[4..4 + len]);
        let bad = |what| move |_| HandoverError::Malformed(what);
        let kind = u8::read(&mut r).map_err(bad("kind"))?;
        let m = match kind {
            1 => {
                let n = u16::read(&mut r).map_err(bad("listeners"))?;
                let codes = r.take(usize::from(n), "kinds").map_err(bad("listeners"))?;
                let kinds = codes
                    .iter()
                    .map(|c| ListenerKind::from_code(*c).ok_or(HandoverError::Malformed("kind")))
                    .collect::<Result<Vec<_>, _>>()?;
                Message::Listeners(kinds)
            }
            2 => Message::Ready,
            3 => {
                let source = decode_addr(&mut r)?;
                let destination = decode_addr(&mut r)?;
                let agent = u16::read(&mut r).map_err(bad("agent"))?;
                let token = r.take_array::<16>("token").map_err(bad("token"))?;
                let position = Position::decode(&mut r)?;
                let mut owed = || {
                    baton_wire::codec::read_vec(&mut r, PENDING_LEN, "owed bytes")
                        .map(<[u8]>::to_vec)
                        .map_err(bad("owed bytes"))
                };
                let (to_client, to_agent) = (owed()?, owed()?);
                Message::Conn(Box::new(Handed {
                    source,
                    destination,
                    agent,
                    token,
                    position,
                    to_client,
                    to_agent,
                }))
            }
            4 => Message::Done,
            k => return Err(HandoverError::UnknownKind(k)),
        };
        r.expect_empty("handover message")
            .map_err(bad("trailing bytes"))?;
        Ok((m, 4 + len))
    }
}

const PENDING_LEN: baton_wire::codec::Len = baton_wire::codec::Len::U32.at_most(MAX_PENDING);

fn decode_addr(r: &mut Reader<'_>) -> Result<SocketAddr, HandoverError> {
    SocketAddr::read(r).map_err(|_| HandoverError::Malformed("address"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Relay, Splitter};
    use proptest::prelude::*;

    /// A position reached by following real bytes: `client` and `agent` cut anywhere.
    fn position(client: &[u8], agent: &[u8], left: bool) -> Position {
        let mut relay = Relay::serving();
        relay.watch_client(client).unwrap();
        let mut rest = agent;
        while !rest.is_empty() {
            let p = relay.watch_agent(rest).unwrap();
            rest = &rest[p.consumed..];
        }
        if left {
            relay.watch_agent(&crate::Frame::Leave.to_bytes()).unwrap();
        }
        relay.position().unwrap()
    }

    fn record(len: u16) -> Vec<u8> {
        let mut r = vec![23, 3, 3];
        r.extend_from_slice(&len.to_be_bytes());
        r.extend(std::iter::repeat_n(0xAA, usize::from(len)));
        r
    }

    proptest! {
        #[test]
        fn a_conn_round_trips_wherever_its_streams_were_cut(
            c_cut in 0usize..40, a_cut in 0usize..40, left in any::<bool>(),
            v6 in any::<bool>(), agent in any::<u16>(), to_client in proptest::collection::vec(any::<u8>(), 0..64), to_agent in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let stream = [record(20), record(3)].concat();
            let client = &stream[..c_cut.min(stream.len())];
            // a Leave comes only between two records
            let a_cut = a_cut.min(stream.len());
            let a_cut = if left { [0, 25, 33].into_iter().filter(|b| *b <= a_cut).max().unwrap() } else { a_cut };
            let agent_bytes = &stream[..a_cut];
            let source: SocketAddr = if v6 { "[2001:db8::7]:5000".parse().unwrap() } else { "10.1.2.3:5000".parse().unwrap() };
            let m = Message::Conn(Box::new(Handed {
                source,
                destination: "127.0.0.1:8443".parse().unwrap(),
                agent,
                token: [7; 16],
                position: position(client, agent_bytes, left),
                to_client,
                to_agent,
            }));
            let bytes = m.to_bytes();
            prop_assert_eq!(Message::needs(&bytes), Ok(0));
            prop_assert_eq!(Message::decode(&bytes), Ok((m, bytes.len())));
            // every shorter prefix asks for more, none decodes
            for k in 0..bytes.len() {
                prop_assert!(Message::needs(&bytes[..k]).unwrap() > 0);
            }
        }
    }

    #[test]
    fn a_resumed_relay_follows_on_as_the_old_one_would_have() {
        // the old dispatcher stopped inside a record each way
        let stream = [record(10), record(4), record(30)].concat();
        let (c_cut, a_cut) = (12, 7);
        let mut old = Relay::serving();
        old.watch_client(&stream[..c_cut]).unwrap();
        let p = old.watch_agent(&stream[..a_cut]).unwrap();
        assert_eq!(p.tls, a_cut);
        let position = old.position().unwrap();
        let mut bytes = Vec::new();
        position.encode(&mut bytes);
        let position = Position::decode(&mut Reader::new(&bytes)).unwrap();
        let mut new = Relay::resume(position);
        new.watch_client(&stream[c_cut..]).unwrap();
        // the agent's rest, then a Leave at the record boundary
        let rest = [&stream[a_cut..], &crate::Frame::Leave.to_bytes()[..]].concat();
        let p = new.watch_agent(&rest).unwrap();
        assert_eq!(p.tls, stream.len() - a_cut);
        assert_eq!(p.frame, Some(crate::Frame::Leave));
        assert!(new.is_leaving());
        // a fresh relay put at the same cut would have refused the middle of a record
        let mut blind = Relay::serving();
        assert!(blind.watch_agent(&stream[a_cut..]).is_err());
    }

    #[test]
    fn a_leave_not_answered_is_asked_again_of_the_successor() {
        let p = position(&[], &[], true);
        let mut relay = Relay::resume(p);
        assert!(relay.is_leaving());
        assert_eq!(relay.poll_action(), Some(crate::Action::ChooseHome));
    }

    #[test]
    fn positions_no_stream_can_be_in_are_refused() {
        let decode = |b: &[u8]| Position::decode(&mut Reader::new(b));
        let mut at_rest = Vec::new();
        Splitter::new().encode(&mut at_rest);
        // body left inside a header still being read
        let mut bad = Vec::new();
        bad.extend_from_slice(&2u32.to_be_bytes());
        bad.extend_from_slice(&[23, 3]);
        bad.extend_from_slice(&5u32.to_be_bytes());
        bad.extend_from_slice(&0u32.to_be_bytes());
        assert!(decode(&[&bad[..], &at_rest, &[0]].concat()).is_err());
        // a frame in the client's direction
        let mut frame = Vec::new();
        frame.extend_from_slice(&1u32.to_be_bytes());
        frame.push(crate::FRAME_TYPE);
        frame.extend_from_slice(&0u32.to_be_bytes());
        frame.extend_from_slice(&0u32.to_be_bytes());
        assert!(decode(&[&frame[..], &at_rest, &[0]].concat()).is_err());
        // ...but one in the agent's is a frame being collected
        assert!(decode(&[&at_rest[..], &frame, &[0]].concat()).is_ok());
        // a record larger than TLS allows, a passed count beyond the head, a bad flag
        let mut big = Vec::new();
        big.extend_from_slice(&0u32.to_be_bytes());
        big.extend_from_slice(&20_000u32.to_be_bytes());
        big.extend_from_slice(&0u32.to_be_bytes());
        assert!(decode(&[&big[..], &at_rest, &[0]].concat()).is_err());
        let mut passed = Vec::new();
        passed.extend_from_slice(&0u32.to_be_bytes());
        passed.extend_from_slice(&0u32.to_be_bytes());
        passed.extend_from_slice(&1u32.to_be_bytes());
        assert!(decode(&[&passed[..], &at_rest, &[0]].concat()).is_err());
        assert!(decode(&[&at_rest[..], &at_rest, &[2]].concat()).is_err());
        assert!(decode(&[&at_rest[..], &at_rest, &[1]].concat()).is_ok());
    }

    #[test]
    fn messages_over_the_limit_or_unknown_are_refused() {
        let mut huge = ((MAX_MESSAGE + 1) as u32).to_be_bytes().to_vec();
        huge.push(2);
        assert_eq!(
            Message::needs(&huge),
            Err(HandoverError::TooLarge(MAX_MESSAGE + 1))
        );
        assert_eq!(
            Message::decode(&[0, 0, 0, 1, 9]),
            Err(HandoverError::UnknownKind(9))
        );
        assert!(Message::decode(&[0, 0, 0, 2, 2, 0]).is_err());
        for m in [
            Message::Ready,
            Message::Done,
            Message::Listeners(vec![
                ListenerKind::Public,
                ListenerKind::Public,
                ListenerKind::Metrics,
                ListenerKind::Admin,
            ]),
        ] {
            let b = m.to_bytes();
            assert_eq!(Message::decode(&b), Ok((m, b.len())));
        }
    }
}
