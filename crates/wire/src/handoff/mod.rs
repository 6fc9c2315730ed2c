//! The handoff protocol (CSSL-SF, the CSSL paper, section 4.4.1): how a TLS connection that one agent
//! (the *handshake agent*) has just finished the handshake for is switched, on the same client
//! TCP stream, to another agent (the client's *home agent*), which carries the bulk traffic.
//!
//! Every client connection reaches an agent as one stream of the *agent link* (`baton-link`:
//! a few long-lived connections between the dispatcher and each agent, authenticated both ways
//! with the cluster key, multiplexed). A migration is a stream move: the dispatcher opens a
//! stream on the home agent's link, not a TCP connection. Handoff frames are read on link
//! streams only, never on an agent's public port.
//!
//! After ServerHello everything is an encrypted record of type 23, so the dispatcher cannot see
//! where the handshake ends: the handshake agent tells it, in-band, with *handoff frames*. A
//! frame looks like a record header with a content type TLS never uses (0xBA), the magic "BT"
//! and a 16-bit length, so one splitter walks a stream that mixes records and frames. Frames
//! travel only between Baton processes; the client never sees one, and one that comes from the
//! client is an error.
//!
//! The exchange (dispatcher D, handshake agent A, home agent H, client C) is a two-phase
//! commit: at every moment at most one agent may use the session's keys.
//!
//! ```text
//!  D->A  Offer{home, binding}  before the ClientHello: "hand this connection to agent `home`";
//!                              `binding` = the id of the H link D will use || a fresh token
//!                              (no Offer when A is the home agent already: a plain splice)
//!  ...   the handshake, relayed both ways; D tracks C's record boundaries and keeps a copy
//!        of every client byte it forwards to A from the Offer on (at most MAX_HELD: past it
//!        D stops reading C until A has cut)
//!  A     its handshake is done: it decrypts every whole client record rustls has read (at
//!        most MAX_CARRIED plaintext: past it A sends Abort and keeps the connection), and
//!        cuts there: `cut` = how many client bytes after the Offer it consumed, a record
//!        boundary (part of a record rustls read past it is not consumed: its sequence number
//!        stays unused, and rustls drops it at extraction); A extracts the session and seals
//!        it bound to `binding`
//!  A->D  tickets + Switch{cut, session}   in one write
//!        (or Decline / Abort: A keeps the connection; D splices A<->C from here on)
//!  D     forwards to A the rest of the client record it is in the middle of (a frame can
//!        follow only a record boundary), then holds C's bytes: the held bytes start at `cut`
//!        in the copy. A discards every client record after its cut until the verdict.
//!  D->H  Import{session}    the first bytes of a new stream on that H link, carrying the token
//!  H->D  Ready              H opened the object (bound to this link and token, unexpired,
//!                           never imported, issued after H started); H uses nothing yet
//!        (or Refused{reason})
//!  D->H  Commit             D's decision, once: then the held bytes, and H<->C is spliced;
//!  D->A  Done               A drops the keys and closes its stream (on the agent link, D
//!                           sends Done as the stream's release, a reset with NO_ERROR: one
//!                           frame, and A owes no END_STREAM back)
//!        Refused, a broken H stream, or D's timeout before Ready:
//!  D->H  Abort              (and the H stream is reset): H drops the keys, sends nothing
//!  D->A  Resume             then the held bytes: A serves the session from its own record layer
//!  (A->D Kept{cut}          A cut and extracted but could not seal: D answers Resume and the
//!                           held bytes from `cut` at once, as after a refusal)
//! ```
//!
//! A draining agent moves an established connection the same way, with the dispatcher's
//! answer as the cut: A sends Leave (nothing more to the client from there) and decrypts the
//! client's records until D's Offer; D sends the Offer at a client record boundary (forwarding
//! the rest of the record it is in first) and holds every client byte after it; A switches with
//! `cut` = 0 (or Abort: D gives it the held bytes and it keeps the connection). D answers
//! Stay instead when there is nowhere to go.
//!
//! Why this keeps the invariants: client bytes go to exactly one agent, cut only at a record
//! boundary, so no record is split between two decryptors and none is lost or repeated: A
//! decrypted exactly the records before `cut` (D checks that `cut` is a record boundary within
//! what it forwarded), and H gets exactly the copy from `cut` on, in order, before anything
//! later. A decrypts nothing after its cut (it discards those records; on Resume it gets them
//! again, from the copy). H has the session before the first record it must decrypt. Nobody
//! encrypts twice under a key and sequence number: A sends nothing after Switch until D's
//! verdict, H nothing after Ready until Commit, and D sends exactly one of Commit (to H) and
//! Resume (to A). A timeout never grants the keys: A waiting for a verdict and H waiting for
//! Commit give up by closing, never by using them. A sealed object copied off a link opens only
//! on that link, with that token, once. The copy cannot deadlock the cut: A cuts as soon as
//! its handshake is done, and the client's bytes up to its Finished (a hello and at most a
//! certificate flight) are far below MAX_HELD, so D never stops reading the client before A
//! can cut; after Switch D reads on to the end of the current record whatever the copy holds
//! (one record more, at most).
//!
//! The link's hello carries the protocol version (`baton_link::auth::VERSION`): a dispatcher
//! and agents of builds that speak different exchanges refuse each other's links rather than
//! mis-parse these frames (the frame kinds of the retired Freeze/Frozen exchange are not
//! reused either).
//!
//! [`Relay`] is the dispatcher's side as a state machine: bytes in, [`Action`]s out, no
//! sockets, no clock (the shell owns the timeouts and calls [`Relay::home_failed`]).
//! [`Exporter`] and [`Importer`] are the handshake and home agents' sides, with
//! their deadlines given as instants (virtual time in tests).

use crate::codec::{encode_bytes, Codec, Len, Reader};
use crate::error::Error;
use crate::record::{HEADER_LEN, MAX_CIPHERTEXT_LEN};

/// The content type of a frame: unassigned in TLS (RFC 8446 B.1, IANA TLS ContentType).
pub const FRAME_TYPE: u8 = 0xBA;
/// The two bytes where a record carries its version: "BT".
pub const FRAME_MAGIC: [u8; 2] = *b"BT";
/// The largest frame body: a sealed session object plus the client plaintext it carries.
pub const MAX_FRAME_BODY: usize = u16::MAX as usize;
/// A frame's body, after its type and magic: `body<0..MAX_FRAME_BODY>`, the kind byte first.
const BODY_LEN: Len = Len::U16;
/// Client bytes the dispatcher keeps for a move: the copy of what it forwarded to the handshake
/// agent since the Offer, then what it holds after the cut. It stops reading the client beyond
/// this (TCP backpressure), so a move costs bounded memory.
pub const MAX_HELD: usize = 256 * 1024;
/// The kind byte of an Import frame (after the 5-byte header): a home agent tells an import
/// stream from a handoff offer by it before reading the frame.
pub const IMPORT_KIND: u8 = 9;
/// Length of an Offer's binding: the home agent's link id (16) and a fresh token (16).
pub const BINDING_LEN: usize = 32;

/// Why a home agent refused a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RefuseReason {
    /// The session object did not open (wrong or unknown key, tampered, not for this agent).
    Seal = 1,
    /// It opened but had expired.
    Expired = 2,
    /// This agent had already imported it once (a replay).
    Replay = 3,
    /// It opened but its contents were unusable (unknown suite, bad lengths).
    Invalid = 4,
    /// This agent does not take migrated sessions (no cluster key, or shutting down).
    Unavailable = 5,
    /// A reason this version does not know.
    Other = 255,
}

impl RefuseReason {
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Seal,
            2 => Self::Expired,
            3 => Self::Replay,
            4 => Self::Invalid,
            5 => Self::Unavailable,
            _ => Self::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Seal => "seal",
            Self::Expired => "expired",
            Self::Replay => "replay",
            Self::Invalid => "invalid",
            Self::Unavailable => "unavailable",
            Self::Other => "other",
        }
    }
}

impl Codec for RefuseReason {
    fn encode(&self, out: &mut Vec<u8>) {
        (*self as u8).encode(out);
    }
    // A newer home agent's reason reads as `Other`: it is still a refusal.
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        u8::read(r).map(Self::from_u8)
    }
}

/// One handoff frame. The sealed session objects are opaque here.
#[derive(Clone, PartialEq, Eq)]
pub enum Frame {
    /// `binding` ties the sealed session object to the home agent's link and the stream the
    /// dispatcher will import it on ([`BINDING_LEN`] bytes, opaque to the handshake agent).
    Offer {
        home: u16,
        binding: [u8; BINDING_LEN],
    },
    Decline,
    /// Where the handshake agent cut the client's stream (bytes after the Offer), and the
    /// sealed session object.
    Switch {
        cut: u32,
        sealed: Vec<u8>,
    },
    /// The handshake agent cut at `cut` and extracted, but keeps the session: the dispatcher
    /// answers Resume and the client's bytes from `cut` on.
    Kept {
        cut: u32,
    },
    Abort,
    Done,
    Resume,
    Import(Vec<u8>),
    Ready,
    Refused(RefuseReason),
    Commit,
    /// An agent that drains asks to move an established connection it is idle on (between
    /// two HTTP/1.1 requests). It sends nothing more until the dispatcher answers with an
    /// Offer (the cut: the agent then switches with `cut` = 0) or Stay.
    Leave,
    /// The dispatcher's answer to Leave when there is nowhere to move: keep the connection.
    Stay,
}

impl std::fmt::Debug for Frame {
    // Sealed, but still nobody's business in a log: print sizes only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Frame::Switch { cut, sealed } => {
                write!(
                    f,
                    "Switch {{ cut: {cut}, <{} sealed bytes> }}",
                    sealed.len()
                )
            }
            Frame::Kept { cut } => write!(f, "Kept {{ cut: {cut} }}"),
            Frame::Import(b) => write!(f, "Import(<{} sealed bytes>)", b.len()),
            Frame::Offer { home, .. } => write!(f, "Offer {{ home: {home} }}"),
            Frame::Refused(r) => write!(f, "Refused({r:?})"),
            _ => f.write_str(self.name()),
        }
    }
}

/// A handoff stream broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandoffError {
    #[error("not a TLS record or handoff frame (type {0:#04x})")]
    NotARecord(u8),
    #[error("record of {0} bytes exceeds the TLS limit")]
    RecordTooLarge(usize),
    #[error("handoff frame without the BT magic")]
    Magic,
    #[error("handoff frame body too large: {0} bytes")]
    FrameTooLarge(usize),
    #[error("unknown handoff frame kind {0}")]
    UnknownKind(u8),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("handoff frame from the client")]
    FrameFromClient,
    #[error("unexpected {0} in state {1}")]
    Unexpected(&'static str, &'static str),
}

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            // 2, 4 and 5 were Freeze, Frozen and the old Switch: never reused, so a peer of
            // the old exchange reads an unknown kind rather than a wrong frame
            Frame::Offer { .. } => 1,
            Frame::Decline => 3,
            Frame::Abort => 6,
            Frame::Done => 7,
            Frame::Resume => 8,
            Frame::Import(_) => IMPORT_KIND,
            Frame::Ready => 10,
            Frame::Refused(_) => 11,
            Frame::Commit => 12,
            Frame::Leave => 13,
            Frame::Stay => 14,
            Frame::Switch { .. } => 15,
            Frame::Kept { .. } => 16,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Frame::Offer { .. } => "Offer",
            Frame::Decline => "Decline",
            Frame::Switch { .. } => "Switch",
            Frame::Kept { .. } => "Kept",
            Frame::Abort => "Abort",
            Frame::Done => "Done",
            Frame::Resume => "Resume",
            Frame::Import(_) => "Import",
            Frame::Ready => "Ready",
            Frame::Refused(_) => "Refused",
            Frame::Commit => "Commit",
            Frame::Leave => "Leave",
            Frame::Stay => "Stay",
        }
    }

    /// Appends the frame's wire form. A session object longer than [`MAX_FRAME_BODY`] - 1
    /// cannot be framed; [`Frame::fits`] says so before anyone tries.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut body = vec![self.kind()];
        match self {
            Frame::Offer { home, binding } => {
                home.encode(&mut body);
                body.extend_from_slice(binding);
            }
            Frame::Switch { cut, sealed } => {
                cut.encode(&mut body);
                body.extend_from_slice(sealed);
            }
            Frame::Kept { cut } => cut.encode(&mut body),
            Frame::Import(b) => body.extend_from_slice(b),
            Frame::Refused(r) => r.encode(&mut body),
            _ => {}
        }
        // Cut rather than write a length that disagrees with the body: the stream would lose
        // its framing, not just this frame.
        debug_assert!(body.len() <= MAX_FRAME_BODY);
        let body = &body[..body.len().min(MAX_FRAME_BODY)];
        FRAME_TYPE.encode(out);
        out.extend_from_slice(&FRAME_MAGIC);
        encode_bytes(out, BODY_LEN, body);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Whether a session object of `len` bytes fits one Switch (kind and cut before it) and
    /// one Import frame.
    pub fn fits(len: usize) -> bool {
        len + 1 + 4 <= MAX_FRAME_BODY
    }

    /// Reads a frame's body (what its length covers). Not a [`Codec`]: the splitter has read
    /// the header already, among TLS records, and the errors name the frame kind.
    fn decode(body: &[u8]) -> Result<Frame, HandoffError> {
        let mut r = Reader::new(body);
        let kind = u8::read(&mut r).map_err(|_| HandoffError::Malformed("empty"))?;
        let frame = match kind {
            1 => {
                let offer = |r: &mut Reader<'_>| -> Result<Frame, Error> {
                    Ok(Frame::Offer {
                        home: u16::read(r)?,
                        binding: r.take_array("binding")?,
                    })
                };
                offer(&mut r).map_err(|_| HandoffError::Malformed("Offer"))?
            }
            3 => Frame::Decline,
            6 => Frame::Abort,
            7 => Frame::Done,
            8 => Frame::Resume,
            IMPORT_KIND => Frame::Import(r.rest().to_vec()),
            10 => Frame::Ready,
            11 => Frame::Refused(
                RefuseReason::read(&mut r).map_err(|_| HandoffError::Malformed("Refused"))?,
            ),
            12 => Frame::Commit,
            13 => Frame::Leave,
            14 => Frame::Stay,
            15 => Frame::Switch {
                cut: u32::read(&mut r).map_err(|_| HandoffError::Malformed("Switch"))?,
                sealed: r.rest().to_vec(),
            },
            16 => Frame::Kept {
                cut: u32::read(&mut r).map_err(|_| HandoffError::Malformed("Kept"))?,
            },
            k => return Err(HandoffError::UnknownKind(k)),
        };
        match r.expect_empty("frame") {
            Ok(()) => Ok(frame),
            Err(_) => Err(HandoffError::Malformed(frame.name())),
        }
    }
}

/// What the front of a stream is, from its first bytes (at least one).
fn classify(head: &[u8]) -> Result<bool, HandoffError> {
    // true: a frame; false: a TLS record
    match head[0] {
        FRAME_TYPE => {
            if head.len() >= 3 && head[1..3] != FRAME_MAGIC {
                return Err(HandoffError::Magic);
            }
            Ok(true)
        }
        20..=24 => {
            if head.len() >= 2 && head[1] != 3 {
                return Err(HandoffError::NotARecord(head[0]));
            }
            Ok(false)
        }
        t => Err(HandoffError::NotARecord(t)),
    }
}

/// Walks a stream of TLS records and handoff frames without holding record bodies: TLS bytes
/// are passed through as they come (a record may end in a later push), frames are collected
/// whole (bounded by [`MAX_FRAME_BODY`]) and returned one at a time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Splitter {
    /// A unit's header being collected, or a whole frame.
    head: Vec<u8>,
    /// Body bytes still to pass of the record in progress.
    body_left: usize,
    /// How many bytes at the front of `head` were [tracked](Self::track) (passed on by
    /// someone else) and must not be passed again.
    head_passed: usize,
}

/// The result of one [`Splitter::pass`] call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Passed {
    /// How many bytes at the front of the input are TLS, to forward unchanged.
    pub tls: usize,
    /// The first complete frame, if one ended in this input (after those TLS bytes).
    pub frame: Option<Frame>,
    /// How many input bytes were consumed (the TLS bytes, then the frame or part of it).
    pub consumed: usize,
}

/// The result of one [`Splitter::split`] call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// TLS bytes, in order, up to the frame (or the end of the input).
    pub tls: Vec<u8>,
    /// The first complete frame, if one ended in this input.
    pub frame: Option<Frame>,
    /// How many input bytes were consumed; bytes after a frame are left to the caller, who may
    /// treat them differently once it has acted on the frame.
    pub consumed: usize,
}

impl Splitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the stream so far ends exactly between two units.
    pub fn at_boundary(&self) -> bool {
        self.head.is_empty() && self.body_left == 0
    }

    /// Follows a stream of TLS records only, keeping none of their bytes: afterwards the
    /// splitter knows where the stream stands (in which record, how far), so another reader can
    /// take over mid-record. A frame is [`HandoffError::FrameFromClient`].
    pub fn track(&mut self, data: &[u8]) -> Result<(), HandoffError> {
        let mut i = 0;
        while i < data.len() {
            i += self.follow_record(&data[i..])?;
        }
        Ok(())
    }

    /// [`Splitter::track`], also saying where the last record boundary in `data` falls:
    /// `Some(i)` when `data[..i]` ends a record (the largest such `i`), `None` when no record
    /// ends in `data`. The handshake agent counts its cut with it.
    pub fn follow(&mut self, data: &[u8]) -> Result<Option<usize>, HandoffError> {
        let (mut i, mut last) = (0, None);
        while i < data.len() {
            i += self.follow_record(&data[i..])?;
            if self.at_boundary() {
                last = Some(i);
            }
        }
        Ok(last)
    }

    /// Takes a record's bytes from the front of `data` (the rest of its body, or of its
    /// header, checked as it comes), keeping only an unfinished header; returns how many. A
    /// frame where a record should start is [`HandoffError::FrameFromClient`].
    fn follow_record(&mut self, data: &[u8]) -> Result<usize, HandoffError> {
        if self.body_left > 0 {
            let n = self.body_left.min(data.len());
            self.body_left -= n;
            return Ok(n);
        }
        // More than a header held: a frame or garbage that an earlier call refused (a caller
        // that goes on after an error gets the error again, not a wrapped length).
        let Some(room) = HEADER_LEN.checked_sub(self.head.len()) else {
            return Err(HandoffError::Malformed("header"));
        };
        let n = room.min(data.len());
        self.head.extend_from_slice(&data[..n]);
        // passed on as they came: a later `split` must not pass them again
        self.head_passed = self.head.len();
        if classify(&self.head)? {
            return Err(HandoffError::FrameFromClient);
        }
        if self.head.len() == HEADER_LEN {
            let len = body_len(&self.head)?;
            if len > MAX_CIPHERTEXT_LEN {
                return Err(HandoffError::RecordTooLarge(len));
            }
            self.head.clear();
            self.head_passed = 0;
            self.body_left = len;
        }
        Ok(n)
    }

    /// Walks a stream of records that may carry frames between them, copying nothing but a
    /// frame: the front `passed.tls` bytes of `data` are TLS to forward as they are (record
    /// headers included, as they come). Stops after the first complete frame; the caller
    /// forwards `data[..tls]`, acts on the frame and calls again with `data[consumed..]`.
    /// For a spliced stream, where copying every record as [`Splitter::split`] does would
    /// cost the bulk traffic a copy.
    pub fn pass(&mut self, data: &[u8]) -> Result<Passed, HandoffError> {
        let mut i = 0;
        while i < data.len() {
            // A unit starts (or its header goes on): its first byte tells a frame at once.
            let frame_starts = self.body_left == 0 && self.head.is_empty() && data[i] == FRAME_TYPE;
            if frame_starts || self.head.first() == Some(&FRAME_TYPE) {
                let tls = if frame_starts { i } else { 0 };
                let s = self.split(&data[i..])?;
                return Ok(Passed {
                    tls,
                    frame: s.frame,
                    consumed: i + s.consumed,
                });
            }
            i += self.follow_record(&data[i..])?;
        }
        Ok(Passed {
            tls: data.len(),
            frame: None,
            consumed: data.len(),
        })
    }

    /// Consumes `data` up to and including the first complete frame.
    pub fn split(&mut self, data: &[u8]) -> Result<Split, HandoffError> {
        let mut out = Split::default();
        let mut i = 0;
        while i < data.len() {
            if self.body_left > 0 {
                let n = self.body_left.min(data.len() - i);
                out.tls.extend_from_slice(&data[i..i + n]);
                self.body_left -= n;
                i += n;
                continue;
            }
            // collecting a header (or a frame)
            let is_frame = {
                let need = if self.head.len() < HEADER_LEN {
                    HEADER_LEN - self.head.len()
                } else {
                    HEADER_LEN + body_len(&self.head)? - self.head.len()
                };
                let n = need.min(data.len() - i);
                self.head.extend_from_slice(&data[i..i + n]);
                i += n;
                classify(&self.head)?
            };
            if self.head.len() < HEADER_LEN {
                continue;
            }
            let len = body_len(&self.head)?;
            if !is_frame {
                if len > MAX_CIPHERTEXT_LEN {
                    return Err(HandoffError::RecordTooLarge(len));
                }
                out.tls.extend_from_slice(&self.head[self.head_passed..]);
                self.head.clear();
                self.head_passed = 0;
                self.body_left = len;
                continue;
            }
            if self.head.len() < HEADER_LEN + len {
                continue;
            }
            let frame = Frame::decode(&self.head[HEADER_LEN..])?;
            self.head.clear();
            out.frame = Some(frame);
            break;
        }
        out.consumed = i;
        Ok(out)
    }
}

impl Splitter {
    /// The splitter's position in its stream, for a successor dispatcher that carries the
    /// stream on (`crate::handover`): `head<0..2^32-1>` (at most a header and a frame body),
    /// `body_left u32`, `head_passed u32`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(out, Len::U32, &self.head);
        (self.body_left as u32).encode(out);
        (self.head_passed as u32).encode(out);
    }

    /// The inverse of [`Splitter::encode`], refusing a position no stream can be in.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, HandoffError> {
        let bad = |_| HandoffError::Malformed("splitter position");
        let head = crate::codec::read_vec(r, Len::U32.at_most(HEADER_LEN + MAX_FRAME_BODY), "head")
            .map_err(bad)?
            .to_vec();
        let body_left = u32::read(r).map_err(bad)? as usize;
        let head_passed = u32::read(r).map_err(bad)? as usize;
        let whole_header = head.len() >= HEADER_LEN;
        let frame = head.first() == Some(&FRAME_TYPE);
        if body_left > MAX_CIPHERTEXT_LEN
            || head_passed > head.len()
            // a record's body follows only a finished header; a frame is collected whole
            || (body_left > 0 && !head.is_empty())
            || (whole_header && !frame)
            || (!head.is_empty() && classify(&head).is_err())
        {
            return Err(HandoffError::Malformed("splitter position"));
        }
        Ok(Self {
            head,
            body_left,
            head_passed,
        })
    }
}

/// The body length a whole unit header announces: records and frames both end it with a
/// u16, after a type byte and two bytes of version or magic.
fn body_len(head: &[u8]) -> Result<usize, HandoffError> {
    let mut r = Reader::new(head);
    let len = r
        .take(3, "unit header")
        .and_then(|_| u16::read(&mut r))
        .map_err(|_| HandoffError::Malformed("header"))?;
    Ok(usize::from(len))
}

mod agent_side;
mod relay;

pub use agent_side::{ExportEvent, ExportInput, Exporter, ImportEvent, Importer};
pub use relay::{Action, MoveReason, Outcome, Position, Relay, Target};

#[cfg(test)]
#[path = "relay_test.rs"]
mod relay_test;

#[cfg(test)]
#[path = "agent_test.rs"]
mod agent_test;

#[cfg(test)]
#[path = "leave_test.rs"]
mod leave_test;
