//! The link's frames, sans-IO: what travels inside the sealed records, one client connection
//! per stream.
//!
//! ```text
//! kind u8 | stream u32 | len u16 | payload (len bytes)
//!   OPEN    dispatcher -> agent  a new stream, ids rising; payload: its metadata (meta.rs)
//!   ANSWER  agent -> dispatcher  the agent took the stream before sending anything on it
//!   DATA    both ways            1..=MAX_DATA bytes of the client's connection
//!   END     both ways            this side sends no more; payload: nothing (a plain end),
//!                                1 | token[16] (a dispatcher hands the stream over),
//!                                2 (the agent acknowledges a handover and waits)
//!   RESET   both ways            the stream ends both ways at once; payload: a reason u8
//!   WINDOW  both ways            increment u32 of the receiver's window; stream 0: the link's
//!   GOAWAY  agent -> dispatcher  no new streams; `stream` is the last one the agent took
//! ```
//!
//! A frame of an unknown kind or of a length its kind never has is a protocol error: the link
//! is torn down (the dispatcher makes a new one).

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The head of every frame.
pub const HEAD_LEN: usize = 7;
/// Largest DATA payload.
pub const MAX_DATA: usize = 16 * 1024;
/// Largest OPEN payload (the metadata of a stream).
pub const MAX_OPEN: usize = 64;

const OPEN: u8 = 0;
const ANSWER: u8 = 1;
const DATA: u8 = 2;
const END: u8 = 3;
const RESET: u8 = 4;
const WINDOW: u8 = 5;
const GOAWAY: u8 = 6;

const END_HANDOVER: u8 = 1;
const END_ACK: u8 = 2;

/// How a side ends its half of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Plain,
    /// The dispatcher hands the stream over to a successor, which re-attaches with the token.
    Handover([u8; 16]),
    /// The agent acknowledges a handover: it waits for the successor.
    Ack,
}

/// Why a stream was reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not a failure: the dispatcher's verdict that a session moved (`LinkStream::release`).
    Release,
    /// Given up: aborted, or dropped before it ended both ways.
    Cancel,
    /// The agent never took it (going away, too many streams, a re-attach nobody waits for):
    /// safe to retry elsewhere.
    Refused,
    /// Its metadata did not parse.
    Protocol,
}

impl Reason {
    fn code(self) -> u8 {
        match self {
            Self::Release => 0,
            Self::Cancel => 1,
            Self::Refused => 2,
            Self::Protocol => 3,
        }
    }

    fn of(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::Release,
            1 => Self::Cancel,
            2 => Self::Refused,
            3 => Self::Protocol,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Open(u32, Bytes),
    Answer(u32),
    Data(u32, Bytes),
    End(u32, End),
    Reset(u32, Reason),
    Window(u32, u32),
    GoAway(u32),
}

/// Bytes that are no frame: the link is torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    UnknownKind(u8),
    BadLength { kind: u8, len: usize },
    BadPayload { kind: u8 },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownKind(k) => write!(f, "a link frame of unknown kind {k}"),
            Self::BadLength { kind, len } => {
                write!(f, "a link frame of kind {kind} with a bad length {len}")
            }
            Self::BadPayload { kind } => {
                write!(f, "a link frame of kind {kind} that does not parse")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// The head of a frame, appended to `out`.
fn head(out: &mut BytesMut, kind: u8, stream: u32, len: usize) {
    debug_assert!(len <= usize::from(u16::MAX));
    out.put_u8(kind);
    out.put_u32(stream);
    out.put_u16(len as u16);
}

/// Appends a DATA frame of `data` (at most [`MAX_DATA`] bytes, not empty).
pub fn put_data(out: &mut BytesMut, stream: u32, data: &[&[u8]]) {
    let len = data.iter().map(|d| d.len()).sum();
    head(out, DATA, stream, len);
    for d in data {
        out.extend_from_slice(d);
    }
}

/// Appends `frame` (DATA included, for tests and fuzzing).
pub fn put(out: &mut BytesMut, frame: &Frame) {
    match frame {
        Frame::Open(s, meta) => {
            head(out, OPEN, *s, meta.len());
            out.extend_from_slice(meta);
        }
        Frame::Answer(s) => head(out, ANSWER, *s, 0),
        Frame::Data(s, d) => put_data(out, *s, &[d]),
        Frame::End(s, End::Plain) => head(out, END, *s, 0),
        Frame::End(s, End::Handover(token)) => {
            head(out, END, *s, 17);
            out.put_u8(END_HANDOVER);
            out.extend_from_slice(token);
        }
        Frame::End(s, End::Ack) => {
            head(out, END, *s, 1);
            out.put_u8(END_ACK);
        }
        Frame::Reset(s, r) => {
            head(out, RESET, *s, 1);
            out.put_u8(r.code());
        }
        Frame::Window(s, n) => {
            head(out, WINDOW, *s, 4);
            out.put_u32(*n);
        }
        Frame::GoAway(last) => head(out, GOAWAY, *last, 0),
    }
}

/// Whether `len` is a length a frame of `kind` has.
fn valid_len(kind: u8, len: usize) -> Result<(), FrameError> {
    let ok = match kind {
        OPEN => (1..=MAX_OPEN).contains(&len),
        ANSWER | GOAWAY => len == 0,
        DATA => (1..=MAX_DATA).contains(&len),
        END => matches!(len, 0 | 1 | 17),
        RESET => len == 1,
        WINDOW => len == 4,
        k => return Err(FrameError::UnknownKind(k)),
    };
    if ok {
        Ok(())
    } else {
        Err(FrameError::BadLength { kind, len })
    }
}

/// Takes the next whole frame off the front of `buf`: `Ok(None)` while it is not all there.
/// A bad head is refused as soon as it is here, not after its payload.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEAD_LEN {
        return Ok(None);
    }
    let kind = buf[0];
    let stream = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let len = usize::from(u16::from_be_bytes([buf[5], buf[6]]));
    valid_len(kind, len)?;
    if buf.len() < HEAD_LEN + len {
        return Ok(None);
    }
    buf.advance(HEAD_LEN);
    let mut payload = buf.split_to(len);
    let bad = FrameError::BadPayload { kind };
    Ok(Some(match kind {
        OPEN => Frame::Open(stream, payload.freeze()),
        ANSWER => Frame::Answer(stream),
        DATA => Frame::Data(stream, payload.freeze()),
        END => Frame::End(
            stream,
            match (payload.first().copied(), len) {
                (None, _) => End::Plain,
                (Some(END_ACK), 1) => End::Ack,
                (Some(END_HANDOVER), 17) => {
                    let mut token = [0u8; 16];
                    token.copy_from_slice(&payload[1..]);
                    End::Handover(token)
                }
                _ => return Err(bad),
            },
        ),
        RESET => Frame::Reset(stream, Reason::of(payload[0]).ok_or(bad)?),
        WINDOW => Frame::Window(stream, payload.get_u32()),
        GOAWAY => Frame::GoAway(stream),
        _ => unreachable!("valid_len refused it"),
    }))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Open(1, Bytes::from_static(b"meta")),
            Frame::Answer(3),
            Frame::Data(5, Bytes::from(vec![7u8; MAX_DATA])),
            Frame::End(7, End::Plain),
            Frame::End(9, End::Handover([0xab; 16])),
            Frame::End(11, End::Ack),
            Frame::Reset(13, Reason::Release),
            Frame::Reset(13, Reason::Cancel),
            Frame::Reset(13, Reason::Refused),
            Frame::Reset(13, Reason::Protocol),
            Frame::Window(0, 1 << 20),
            Frame::Window(u32::MAX, 1),
            Frame::GoAway(41),
        ]
    }

    #[test]
    fn every_frame_round_trips_in_any_pieces() {
        let mut wire = BytesMut::new();
        for f in samples() {
            put(&mut wire, &f);
        }
        for step in [1, 3, 7, 100, wire.len()] {
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in wire.chunks(step) {
                buf.extend_from_slice(piece);
                while let Some(f) = decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, samples(), "step {step}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn bad_heads_are_refused_before_their_payload() {
        let refused = |b: &[u8]| decode(&mut BytesMut::from(b)).unwrap_err();
        assert_eq!(refused(&[9, 0, 0, 0, 1, 0, 0]), FrameError::UnknownKind(9));
        // a DATA frame longer than any sender writes, and an empty one
        assert!(matches!(
            refused(&[DATA, 0, 0, 0, 1, 0x40, 1]),
            FrameError::BadLength { .. }
        ));
        assert!(matches!(
            refused(&[DATA, 0, 0, 0, 1, 0, 0]),
            FrameError::BadLength { .. }
        ));
        assert!(matches!(
            refused(&[WINDOW, 0, 0, 0, 1, 0, 3]),
            FrameError::BadLength { .. }
        ));
        assert_eq!(
            refused(&[RESET, 0, 0, 0, 1, 0, 1, 9]),
            FrameError::BadPayload { kind: RESET }
        );
        assert_eq!(
            refused(&[END, 0, 0, 0, 1, 0, 1, END_HANDOVER]),
            FrameError::BadPayload { kind: END }
        );
        // a good head waits for its payload
        assert_eq!(
            decode(&mut BytesMut::from(&[DATA, 0, 0, 0, 1, 0, 2, 1][..])),
            Ok(None)
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_decode_or_are_refused_without_panic(
            wire in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut buf = BytesMut::from(&wire[..]);
            while let Ok(Some(f)) = decode(&mut buf) {
                // what decodes encodes back to the same bytes
                let mut again = BytesMut::new();
                put(&mut again, &f);
                prop_assert!(again.len() >= HEAD_LEN);
            }
            prop_assert!(buf.len() <= wire.len());
        }
    }
}
