use baton_wire::codec::{encode_bytes, Codec, Len, Reader};
use baton_wire::record::{HEADER_LEN, MAX_CIPHERTEXT_LEN};
use baton_wire::Error;

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
pub enum MigrationError {
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
    pub(crate) fn kind(&self) -> u8 {
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

    pub(crate) fn name(&self) -> &'static str {
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
    pub(crate) fn decode(body: &[u8]) -> Result<Frame, MigrationError> {
        let mut r = Reader::new(body);
        let kind = u8::read(&mut r).map_err(|_| MigrationError::Malformed("empty"))?;
        let frame = match kind {
            1 => {
                let offer = |r: &mut Reader<'_>| -> Result<Frame, Error> {
                    Ok(Frame::Offer {
                        home: u16::read(r)?,
                        binding: r.take_array("binding")?,
                    })
                };
                offer(&mut r).map_err(|_| MigrationError::Malformed("Offer"))?
            }
            3 => Frame::Decline,
            6 => Frame::Abort,
            7 => Frame::Done,
            8 => Frame::Resume,
            IMPORT_KIND => Frame::Import(r.rest().to_vec()),
            10 => Frame::Ready,
            11 => Frame::Refused(
                RefuseReason::read(&mut r).map_err(|_| MigrationError::Malformed("Refused"))?,
            ),
            12 => Frame::Commit,
            13 => Frame::Leave,
            14 => Frame::Stay,
            15 => Frame::Switch {
                cut: u32::read(&mut r).map_err(|_| MigrationError::Malformed("Switch"))?,
                sealed: r.rest().to_vec(),
            },
            16 => Frame::Kept {
                cut: u32::read(&mut r).map_err(|_| MigrationError::Malformed("Kept"))?,
            },
            k => return Err(MigrationError::UnknownKind(k)),
        };
        match r.expect_empty("frame") {
            Ok(()) => Ok(frame),
            Err(_) => Err(MigrationError::Malformed(frame.name())),
        }
    }
}

/// What the front of a stream is, from its first bytes (at least one).
fn classify(head: &[u8]) -> Result<bool, MigrationError> {
    // true: a frame; false: a TLS record
    match head[0] {
        FRAME_TYPE => {
            if head.len() >= 3 && head[1..3] != FRAME_MAGIC {
                return Err(MigrationError::Magic);
            }
            Ok(true)
        }
        20..=24 => {
            if head.len() >= 2 && head[1] != 3 {
                return Err(MigrationError::NotARecord(head[0]));
            }
            Ok(false)
        }
        t => Err(MigrationError::NotARecord(t)),
    }
}

/// Walks a stream of TLS records and handoff frames without holding record bodies: TLS bytes
/// are passed through as they come (a record may end in a later push), frames are collected
/// whole (bounded by [`MAX_FRAME_BODY`]) and returned one at a time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Splitter {
    /// A unit's header being collected, or a whole frame.
    pub(crate) head: Vec<u8>,
    /// Body bytes still to pass of the record in progress.
    pub(crate) body_left: usize,
    /// How many bytes at the front of `head` were [tracked](Self::track) (passed on by
    /// someone else) and must not be passed again.
    pub(crate) head_passed: usize,
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
    /// take over mid-record. A frame is [`MigrationError::FrameFromClient`].
    pub fn track(&mut self, data: &[u8]) -> Result<(), MigrationError> {
        let mut i = 0;
        while i < data.len() {
            i += self.follow_record(&data[i..])?;
        }
        Ok(())
    }

    /// [`Splitter::track`], also saying where the last record boundary in `data` falls:
    /// `Some(i)` when `data[..i]` ends a record (the largest such `i`), `None` when no record
    /// ends in `data`. The handshake agent counts its cut with it.
    pub fn follow(&mut self, data: &[u8]) -> Result<Option<usize>, MigrationError> {
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
    /// frame where a record should start is [`MigrationError::FrameFromClient`].
    fn follow_record(&mut self, data: &[u8]) -> Result<usize, MigrationError> {
        if self.body_left > 0 {
            let n = self.body_left.min(data.len());
            self.body_left -= n;
            return Ok(n);
        }
        // More than a header held: a frame or garbage that an earlier call refused (a caller
        // that goes on after an error gets the error again, not a wrapped length).
        let Some(room) = HEADER_LEN.checked_sub(self.head.len()) else {
            return Err(MigrationError::Malformed("header"));
        };
        let n = room.min(data.len());
        self.head.extend_from_slice(&data[..n]);
        // passed on as they came: a later `split` must not pass them again
        self.head_passed = self.head.len();
        if classify(&self.head)? {
            return Err(MigrationError::FrameFromClient);
        }
        if self.head.len() == HEADER_LEN {
            let len = body_len(&self.head)?;
            if len > MAX_CIPHERTEXT_LEN {
                return Err(MigrationError::RecordTooLarge(len));
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
    pub fn pass(&mut self, data: &[u8]) -> Result<Passed, MigrationError> {
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
    pub fn split(&mut self, data: &[u8]) -> Result<Split, MigrationError> {
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
                    return Err(MigrationError::RecordTooLarge(len));
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
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, MigrationError> {
        let bad = |_| MigrationError::Malformed("splitter position");
        let head =
            baton_wire::codec::read_vec(r, Len::U32.at_most(HEADER_LEN + MAX_FRAME_BODY), "head")
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
            return Err(MigrationError::Malformed("splitter position"));
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
fn body_len(head: &[u8]) -> Result<usize, MigrationError> {
    let mut r = Reader::new(head);
    let len = r
        .take(3, "unit header")
        .and_then(|_| u16::read(&mut r))
        .map_err(|_| MigrationError::Malformed("header"))?;
    Ok(usize::from(len))
}
