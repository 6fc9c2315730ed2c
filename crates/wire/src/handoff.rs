//! The handoff protocol (CSSL-SF, seed 000 section 4.4.1): how a TLS connection that one agent
//! (the *handshake agent*) has just finished the handshake for is switched, on the same client
//! TCP stream, to another agent (the client's *home agent*), which carries the bulk traffic.
//!
//! After ServerHello everything is an encrypted record of type 23, so the dispatcher cannot see
//! where the handshake ends: the handshake agent tells it, in-band, with *handoff frames*. A
//! frame looks like a record header with a content type TLS never uses (0xBA), the magic "BT"
//! and a 16-bit length, so one splitter walks a stream that mixes records and frames. Frames
//! travel only between Baton processes; the client never sees one, and one that comes from the
//! client is an error.
//!
//! The exchange (dispatcher D, handshake agent A, home agent H, client C):
//!
//! ```text
//!  D->A  Offer{home}        before the ClientHello: "hand this connection to agent `home`"
//!  ...   the handshake, relayed both ways (D tracks C's record boundaries)
//!  A->D  Freeze             A's handshake is done and its NewSessionTickets are sent
//!        (or Decline: A keeps the connection; D splices A<->C from here on)
//!  D->A  Frozen             at the next boundary between C's records; C's later bytes are held
//!  A     decrypts every record before Frozen, extracts the session, seals it
//!  A->D  Switch{session}    the sealed session object (or Abort: D gives A the held bytes)
//!  D->H  Import{session}    first bytes of a new stream to H (after its PROXY header)
//!  H->D  Accepted           H opened the session: D sends Done to A and closes it, gives H the
//!                           held bytes and splices H<->C; H's TLS records follow
//!        (Refused, EOF, or D's timeout: D sends Resume to A, gives it the held bytes and
//!         splices A<->C: A serves the session itself from its own record layer)
//! ```
//!
//! Why this order keeps the invariants (shared/DESIGN.md): client bytes go to exactly one
//! agent, cut only at a record boundary, so no record is split between two decryptors and none
//! is lost or repeated; H has the session (it arrives before any client byte on H's stream)
//! before the first record it must decrypt; A sends nothing after Switch until D's verdict, and
//! exactly one of A and H is told to use the keys, so a nonce is never used twice.
//!
//! [`Relay`] is the dispatcher's side as a state machine: bytes in, [`Action`]s out, no
//! sockets, no clock (the shell owns the timeouts and calls [`Relay::home_failed`]). The
//! agents' side is linear and lives in their shells; [`Splitter`] is what they read frames with.

use std::collections::VecDeque;

use crate::record::{HEADER_LEN, MAX_CIPHERTEXT_LEN};

/// The content type of a frame: unassigned in TLS (RFC 8446 B.1, IANA TLS ContentType).
pub const FRAME_TYPE: u8 = 0xBA;
/// The two bytes where a record carries its version: "BT".
pub const FRAME_MAGIC: [u8; 2] = *b"BT";
/// The largest frame body: a sealed session object plus the client plaintext it carries.
pub const MAX_FRAME_BODY: usize = u16::MAX as usize;
/// Client bytes the dispatcher holds while a connection is frozen; it stops reading the client
/// beyond this (TCP backpressure), so a frozen connection costs bounded memory.
pub const MAX_HELD: usize = 256 * 1024;

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

/// One handoff frame. The sealed session objects are opaque here.
#[derive(Clone, PartialEq, Eq)]
pub enum Frame {
    Offer { home: u16 },
    Freeze,
    Decline,
    Frozen,
    Switch(Vec<u8>),
    Abort,
    Done,
    Resume,
    Import(Vec<u8>),
    Accepted,
    Refused(RefuseReason),
}

impl std::fmt::Debug for Frame {
    // Sealed, but still nobody's business in a log: print sizes only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Frame::Switch(b) | Frame::Import(b) => {
                write!(f, "{}(<{} sealed bytes>)", self.name(), b.len())
            }
            Frame::Offer { home } => write!(f, "Offer {{ home: {home} }}"),
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
            Frame::Offer { .. } => 1,
            Frame::Freeze => 2,
            Frame::Decline => 3,
            Frame::Frozen => 4,
            Frame::Switch(_) => 5,
            Frame::Abort => 6,
            Frame::Done => 7,
            Frame::Resume => 8,
            Frame::Import(_) => 9,
            Frame::Accepted => 10,
            Frame::Refused(_) => 11,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Frame::Offer { .. } => "Offer",
            Frame::Freeze => "Freeze",
            Frame::Decline => "Decline",
            Frame::Frozen => "Frozen",
            Frame::Switch(_) => "Switch",
            Frame::Abort => "Abort",
            Frame::Done => "Done",
            Frame::Resume => "Resume",
            Frame::Import(_) => "Import",
            Frame::Accepted => "Accepted",
            Frame::Refused(_) => "Refused",
        }
    }

    /// Appends the frame's wire form. A session object longer than [`MAX_FRAME_BODY`] - 1
    /// cannot be framed; [`Frame::fits`] says so before anyone tries.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut body = vec![self.kind()];
        match self {
            Frame::Offer { home } => body.extend_from_slice(&home.to_be_bytes()),
            Frame::Switch(b) | Frame::Import(b) => body.extend_from_slice(b),
            Frame::Refused(r) => body.push(*r as u8),
            _ => {}
        }
        debug_assert!(body.len() <= MAX_FRAME_BODY);
        let len = body.len().min(MAX_FRAME_BODY);
        out.push(FRAME_TYPE);
        out.extend_from_slice(&FRAME_MAGIC);
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&body[..len]);
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Whether a session object of `len` bytes fits one Switch/Import frame.
    pub fn fits(len: usize) -> bool {
        len < MAX_FRAME_BODY
    }

    fn decode(body: &[u8]) -> Result<Frame, HandoffError> {
        let (&kind, rest) = body.split_first().ok_or(HandoffError::Malformed("empty"))?;
        let empty = |f: Frame| {
            if rest.is_empty() {
                Ok(f)
            } else {
                Err(HandoffError::Malformed(f.name()))
            }
        };
        match kind {
            1 => match rest {
                [a, b] => Ok(Frame::Offer {
                    home: u16::from_be_bytes([*a, *b]),
                }),
                _ => Err(HandoffError::Malformed("Offer")),
            },
            2 => empty(Frame::Freeze),
            3 => empty(Frame::Decline),
            4 => empty(Frame::Frozen),
            5 => Ok(Frame::Switch(rest.to_vec())),
            6 => empty(Frame::Abort),
            7 => empty(Frame::Done),
            8 => empty(Frame::Resume),
            9 => Ok(Frame::Import(rest.to_vec())),
            10 => empty(Frame::Accepted),
            11 => match rest {
                [r] => Ok(Frame::Refused(RefuseReason::from_u8(*r))),
                _ => Err(HandoffError::Malformed("Refused")),
            },
            k => Err(HandoffError::UnknownKind(k)),
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
#[derive(Debug, Default)]
pub struct Splitter {
    /// A unit's header being collected, or a whole frame.
    head: Vec<u8>,
    /// Body bytes still to pass of the record in progress.
    body_left: usize,
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
                    frame_len(&self.head) - self.head.len()
                };
                let n = need.min(data.len() - i);
                self.head.extend_from_slice(&data[i..i + n]);
                i += n;
                classify(&self.head)?
            };
            if self.head.len() < HEADER_LEN {
                continue;
            }
            let len = usize::from(u16::from_be_bytes([self.head[3], self.head[4]]));
            if !is_frame {
                if len > MAX_CIPHERTEXT_LEN {
                    return Err(HandoffError::RecordTooLarge(len));
                }
                out.tls.append(&mut self.head);
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

fn frame_len(head: &[u8]) -> usize {
    HEADER_LEN + usize::from(u16::from_be_bytes([head[3], head[4]]))
}

/// Tracks the boundaries between the client's records, refusing anything but TLS records.
#[derive(Debug, Default)]
struct ClientRecords {
    inner: Splitter,
}

impl ClientRecords {
    /// How many of `data`'s bytes come before the next record boundary (all of them if none
    /// falls inside). At a boundary already: 0.
    fn len_to_boundary(&mut self, data: &[u8]) -> Result<usize, HandoffError> {
        if self.inner.at_boundary() {
            return Ok(0);
        }
        let mut i = 0;
        while i < data.len() && !self.inner.at_boundary() {
            // feed one byte-run at a time: up to the end of the current header or body
            let step = if self.inner.body_left > 0 {
                self.inner.body_left.min(data.len() - i)
            } else {
                1
            };
            self.feed(&data[i..i + step])?;
            i += step;
        }
        Ok(i)
    }

    fn feed(&mut self, data: &[u8]) -> Result<(), HandoffError> {
        let s = self.inner.split(data)?;
        if s.frame.is_some() || !self.inner.head.is_empty() && self.inner.head[0] == FRAME_TYPE {
            return Err(HandoffError::FrameFromClient);
        }
        Ok(())
    }
}

/// Where the client's stream goes once the dispatcher stops looking at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The agent that ran the handshake (no handoff, or it failed).
    HandshakeAgent,
    /// The home agent, which imported the session.
    HomeAgent,
}

/// What the dispatcher shell must do, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    ToClient(Vec<u8>),
    ToAgent(Vec<u8>),
    /// Open a stream to the home agent (PROXY header first, if configured), then call
    /// [`Relay::home_connected`] or [`Relay::home_failed`].
    ConnectHome,
    ToHome(Vec<u8>),
    /// The handshake agent is done with this connection: close its stream.
    CloseAgent,
    /// The home agent's stream is useless (it refused or broke): close it.
    CloseHome,
    /// From here on copy bytes between the client and `Target` without looking at them.
    Splice(Target),
}

/// How a handoff ended, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Declined,
    Aborted,
    Migrated,
    /// The home agent refused, broke or timed out; the handshake agent kept the connection.
    FellBack(Option<RefuseReason>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Relaying the handshake; the agent may ask to freeze.
    Relaying,
    /// Asked to freeze: client bytes pass up to the next record boundary.
    Freezing,
    /// Frozen: client bytes are held; waiting for Switch or Abort.
    Frozen,
    /// Waiting for the home agent's stream.
    Connecting,
    /// Waiting for the home agent's Accepted or Refused.
    Importing,
    /// Spliced: nothing more to decide.
    Spliced(Target),
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Relaying => "relaying",
            State::Freezing => "freezing",
            State::Frozen => "frozen",
            State::Connecting => "connecting",
            State::Importing => "importing",
            State::Spliced(_) => "spliced",
        }
    }
}

/// The dispatcher's side of one handed-off connection. Push what each peer sends with
/// [`Relay::from_client`], [`Relay::from_agent`], [`Relay::from_home`]; report the home
/// stream's fate with [`Relay::home_connected`] / [`Relay::home_failed`]; after each call, do
/// every [`Relay::poll_action`] in order. Once an [`Action::Splice`] comes out, the relay is
/// finished and the shell copies bytes blindly.
#[derive(Debug)]
pub struct Relay {
    state: State,
    client: ClientRecords,
    agent: Splitter,
    home: Splitter,
    session: Vec<u8>,
    held: Vec<u8>,
    actions: VecDeque<Action>,
    outcome: Option<Outcome>,
}

impl Relay {
    /// A relay for a connection whose handshake agent was sent `Offer`. The offer frame itself
    /// is the shell's to write, ahead of the client's first bytes: [`Relay::offer`].
    pub fn new() -> Self {
        Self {
            state: State::Relaying,
            client: ClientRecords::default(),
            agent: Splitter::new(),
            home: Splitter::new(),
            session: Vec::new(),
            held: Vec::new(),
            actions: VecDeque::new(),
            outcome: None,
        }
    }

    /// The frame that opens the handshake agent's stream.
    pub fn offer(home: u16) -> Vec<u8> {
        Frame::Offer { home }.to_bytes()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// How the handoff ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Whether the shell should read from the client now (false while enough is held).
    pub fn wants_client_bytes(&self) -> bool {
        !matches!(self.state, State::Spliced(_)) && self.held.len() < MAX_HELD
    }

    /// Client bytes held while frozen.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Whether the handshake is still being relayed (the agent has neither frozen nor
    /// declined the connection).
    pub fn is_relaying_handshake(&self) -> bool {
        self.state == State::Relaying
    }

    /// Whether the relay is waiting on the home agent (the shell's timeout applies).
    pub fn awaiting_home(&self) -> bool {
        matches!(self.state, State::Connecting | State::Importing)
    }

    /// Whether the relay is waiting on the handshake agent's Switch/Abort, or on the client to
    /// finish a record before it can freeze (the shell's timeout applies).
    pub fn awaiting_freeze(&self) -> bool {
        matches!(self.state, State::Freezing | State::Frozen)
    }

    pub fn from_client(&mut self, data: &[u8]) -> Result<(), HandoffError> {
        match self.state {
            State::Relaying => {
                self.client.feed(data)?;
                self.push(Action::ToAgent(data.to_vec()));
            }
            State::Freezing => {
                let n = self.client.len_to_boundary(data)?;
                if n > 0 {
                    self.push(Action::ToAgent(data[..n].to_vec()));
                }
                if self.client.inner.at_boundary() {
                    self.freeze_now();
                    self.held.extend_from_slice(&data[n..]);
                }
            }
            // The shell stops reading at MAX_HELD; a read may overshoot it by one buffer.
            State::Frozen | State::Connecting | State::Importing => {
                self.held.extend_from_slice(data)
            }
            // bytes that raced the splice: the shell forwards them to the target
            State::Spliced(t) => self.push(match t {
                Target::HandshakeAgent => Action::ToAgent(data.to_vec()),
                Target::HomeAgent => Action::ToHome(data.to_vec()),
            }),
        }
        Ok(())
    }

    pub fn from_agent(&mut self, mut data: &[u8]) -> Result<(), HandoffError> {
        while !data.is_empty() {
            if let State::Spliced(Target::HandshakeAgent) = self.state {
                self.push(Action::ToClient(data.to_vec()));
                return Ok(());
            }
            let split = self.agent.split(data)?;
            data = &data[split.consumed..];
            if !split.tls.is_empty() {
                // The agent sends TLS only while the handshake is relayed.
                if self.state != State::Relaying {
                    return Err(HandoffError::Unexpected(
                        "TLS from the agent",
                        self.state.name(),
                    ));
                }
                self.push(Action::ToClient(split.tls));
            }
            let Some(frame) = split.frame else { continue };
            match (self.state, frame) {
                (State::Relaying, Frame::Decline) => {
                    self.finish(Target::HandshakeAgent, Outcome::Declined);
                }
                (State::Relaying, Frame::Freeze) => {
                    if self.client.inner.at_boundary() {
                        self.freeze_now();
                    } else {
                        self.state = State::Freezing;
                    }
                }
                (State::Frozen, Frame::Abort) => {
                    self.release_to_agent();
                    self.finish(Target::HandshakeAgent, Outcome::Aborted);
                }
                (State::Frozen, Frame::Switch(session)) => {
                    self.session = session;
                    self.state = State::Connecting;
                    self.push(Action::ConnectHome);
                }
                (s, f) => return Err(HandoffError::Unexpected(f.name(), s.name())),
            }
        }
        Ok(())
    }

    /// The home agent's stream is open: send it the session.
    pub fn home_connected(&mut self) {
        if self.state != State::Connecting {
            return;
        }
        self.state = State::Importing;
        let session = std::mem::take(&mut self.session);
        self.push(Action::ToHome(Frame::Import(session).to_bytes()));
    }

    /// The home agent could not be reached, closed, or did not answer in time: the handshake
    /// agent keeps the connection.
    pub fn home_failed(&mut self) {
        self.fall_back(None);
    }

    pub fn from_home(&mut self, mut data: &[u8]) -> Result<(), HandoffError> {
        while !data.is_empty() {
            match self.state {
                State::Spliced(Target::HomeAgent) => {
                    self.push(Action::ToClient(data.to_vec()));
                    return Ok(());
                }
                State::Importing => {}
                // a late answer after a fallback: the home stream is closed, nothing to do
                _ => return Ok(()),
            }
            let split = self.home.split(data)?;
            data = &data[split.consumed..];
            if !split.tls.is_empty() {
                self.fall_back(None);
                return Err(HandoffError::Unexpected("TLS before Accepted", "importing"));
            }
            match split.frame {
                None => {}
                Some(Frame::Accepted) => {
                    self.push(Action::ToAgent(Frame::Done.to_bytes()));
                    self.push(Action::CloseAgent);
                    let held = std::mem::take(&mut self.held);
                    if !held.is_empty() {
                        self.push(Action::ToHome(held));
                    }
                    self.finish(Target::HomeAgent, Outcome::Migrated);
                }
                Some(Frame::Refused(r)) => self.fall_back(Some(r)),
                Some(f) => {
                    self.fall_back(None);
                    return Err(HandoffError::Unexpected(f.name(), "importing"));
                }
            }
        }
        Ok(())
    }

    fn fall_back(&mut self, reason: Option<RefuseReason>) {
        if !matches!(self.state, State::Connecting | State::Importing) {
            return;
        }
        self.session.clear();
        self.push(Action::CloseHome);
        self.push(Action::ToAgent(Frame::Resume.to_bytes()));
        self.release_to_agent();
        self.finish(Target::HandshakeAgent, Outcome::FellBack(reason));
    }

    fn freeze_now(&mut self) {
        self.state = State::Frozen;
        self.push(Action::ToAgent(Frame::Frozen.to_bytes()));
    }

    fn release_to_agent(&mut self) {
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            self.push(Action::ToAgent(held));
        }
    }

    fn finish(&mut self, target: Target, outcome: Outcome) {
        self.state = State::Spliced(target);
        self.outcome = Some(outcome);
        self.push(Action::Splice(target));
    }

    fn push(&mut self, a: Action) {
        self.actions.push_back(a);
    }
}

impl Default for Relay {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
#[path = "handoff_test.rs"]
mod tests;
