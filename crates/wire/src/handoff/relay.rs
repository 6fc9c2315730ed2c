//! The dispatcher's side of the handoff as a state machine (see the module docs for the
//! exchange).

use std::collections::VecDeque;

use super::{Frame, HandoffError, Passed, RefuseReason, Splitter, BINDING_LEN, MAX_HELD};

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
            self.inner.track(&data[i..i + step])?;
            i += step;
        }
        Ok(i)
    }
}

/// Where a served connection stands, for a successor dispatcher that carries it on
/// (`crate::handover`): how far each direction is into its current record (or frame), and
/// whether the agent has asked to leave and waits for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    client: Splitter,
    agent: Splitter,
    pub left: bool,
}

impl Position {
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.client.encode(out);
        self.agent.encode(out);
        out.push(u8::from(self.left));
    }

    pub fn decode(r: &mut crate::codec::Reader<'_>) -> Result<Self, HandoffError> {
        let client = Splitter::decode(r)?;
        // the client's direction is only ever tracked: never a frame in it
        if client.head.first() == Some(&super::FRAME_TYPE) {
            return Err(HandoffError::FrameFromClient);
        }
        let agent = Splitter::decode(r)?;
        let left = match r
            .take(1, "left")
            .map_err(|_| HandoffError::Malformed("position"))?
        {
            [0] => false,
            [1] => true,
            _ => return Err(HandoffError::Malformed("position")),
        };
        Ok(Self {
            client,
            agent,
            left,
        })
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
    /// Open a stream on the home agent's link named in the Offer's binding, carrying the
    /// binding's token, then call [`Relay::home_connected`] or [`Relay::home_failed`].
    ConnectHome,
    ToHome(Vec<u8>),
    /// The handshake agent is done with this connection: close its stream.
    CloseAgent,
    /// The home agent's stream is useless (it refused, broke or was too late): reset it.
    CloseHome,
    /// The move is over: from here on the connection is served by `Target` (after a
    /// migration the home agent's stream becomes the agent's: [`Relay::from_agent`] and
    /// [`Relay::watch_agent`] take its bytes). The shell splices, following the records
    /// ([`Relay::watch_client`], [`Relay::watch_agent`]) so the agent can still ask to leave.
    Splice(Target),
    /// The agent asked to leave (it drains): choose the client's next home and call
    /// [`Relay::move_to`], or [`Relay::stay`] when there is none.
    ChooseHome,
}

/// Why a session moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    /// A full handshake ran away from the client's home agent (CSSL-SF).
    Handshake,
    /// Its agent drains: the live connection moves to another agent.
    Drain,
}

impl MoveReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::Handshake => "handshake",
            Self::Drain => "drain",
        }
    }
}

/// How a handoff ended, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Declined,
    /// The handshake agent kept the connection (before or after the freeze).
    Aborted,
    Migrated,
    /// The home agent refused, broke or timed out before Ready; the handshake agent kept the
    /// connection.
    FellBack(Option<RefuseReason>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Relaying the handshake; the agent may ask to freeze.
    Relaying,
    /// Asked to freeze: client bytes pass up to the next record boundary. `aborted`: the
    /// agent has already said it keeps the connection; Frozen still marks the boundary.
    Freezing { aborted: bool },
    /// Frozen: client bytes are held; waiting for Switch or Abort.
    Frozen,
    /// Waiting for the home agent's stream.
    Connecting,
    /// Waiting for the home agent's Ready or Refused.
    Importing,
    /// Served by the current agent, whose records pass untouched; it may ask to leave.
    Serving,
    /// The agent asked to leave; the shell is choosing where to.
    Leaving,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Relaying => "relaying",
            State::Freezing { .. } => "freezing",
            State::Frozen => "frozen",
            State::Connecting => "connecting",
            State::Importing => "importing",
            State::Serving => "serving",
            State::Leaving => "leaving",
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
    reason: MoveReason,
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
            reason: MoveReason::Handshake,
        }
    }

    /// A relay for a connection that was not offered for migration (any policy but
    /// `handoff`, or a client at its home agent already): the client's and the agent's bytes
    /// pass, followed record by record from their first byte, until the agent asks to leave.
    pub fn serving() -> Self {
        Self {
            state: State::Serving,
            ..Self::new()
        }
    }

    /// Where the connection stands, for a successor dispatcher: only between moves (serving,
    /// or the agent's Leave not answered yet), `None` in the middle of one.
    pub fn position(&self) -> Option<Position> {
        let left = match self.state {
            State::Serving => false,
            State::Leaving => true,
            _ => return None,
        };
        Some(Position {
            client: self.client.inner.clone(),
            agent: self.agent.clone(),
            left,
        })
    }

    /// The relay of a successor dispatcher that took a connection over at `position`: it
    /// follows both directions on from there, and if the agent had asked to leave, the
    /// answer is the shell's to choose ([`Action::ChooseHome`] is queued).
    pub fn resume(position: Position) -> Self {
        let mut relay = Self::serving();
        relay.client.inner = position.client;
        relay.agent = position.agent;
        if position.left {
            relay.leave();
        }
        relay
    }

    /// Whether the agent asked to leave and waits for [`Relay::move_to`] or [`Relay::stay`].
    pub fn is_leaving(&self) -> bool {
        self.state == State::Leaving
    }

    /// The frame that opens the handshake agent's stream.
    pub fn offer(home: u16, binding: [u8; super::BINDING_LEN]) -> Vec<u8> {
        Frame::Offer { home, binding }.to_bytes()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// How the last move ended, once it has.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Why the last move was tried.
    pub fn reason(&self) -> MoveReason {
        self.reason
    }

    /// Whether the connection is being served, no move under way: the shell splices (with
    /// [`Relay::watch_client`] and [`Relay::watch_agent`]).
    pub fn is_serving(&self) -> bool {
        self.state == State::Serving
    }

    /// Whether the shell should read from the client now (false while enough is held).
    pub fn wants_client_bytes(&self) -> bool {
        self.held.len() < MAX_HELD
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
        matches!(self.state, State::Freezing { .. } | State::Frozen)
    }

    pub fn from_client(&mut self, data: &[u8]) -> Result<(), HandoffError> {
        match self.state {
            // Until Frozen the agent gets the client's bytes, also while it asks to leave.
            State::Relaying | State::Serving | State::Leaving => {
                self.client.inner.track(data)?;
                self.push(Action::ToAgent(data.to_vec()));
            }
            State::Freezing { aborted } => {
                let n = self.client.len_to_boundary(data)?;
                if n > 0 {
                    self.push(Action::ToAgent(data[..n].to_vec()));
                }
                if self.client.inner.at_boundary() {
                    self.freeze_now();
                    // followed too: wherever they end up, a later move needs the boundaries
                    self.client.inner.track(&data[n..])?;
                    self.held.extend_from_slice(&data[n..]);
                    if aborted {
                        self.release_to_agent();
                        self.finish(Target::HandshakeAgent, Outcome::Aborted);
                    }
                }
            }
            // The shell stops reading at MAX_HELD; a read may overshoot it by one buffer.
            State::Frozen | State::Connecting | State::Importing => {
                self.client.inner.track(data)?;
                self.held.extend_from_slice(data)
            }
        }
        Ok(())
    }

    /// Client bytes the shell forwards to the agent itself while serving (no copy): only
    /// followed, so the next move can cut at a record boundary.
    pub fn watch_client(&mut self, data: &[u8]) -> Result<(), HandoffError> {
        if !matches!(self.state, State::Serving | State::Leaving) {
            return Err(HandoffError::Unexpected("spliced bytes", self.state.name()));
        }
        self.client.inner.track(data)
    }

    /// Agent bytes while serving: the front `tls` bytes go to the client unchanged. A Leave
    /// frame after them asks for [`Action::ChooseHome`] (the shell stops splicing and does the
    /// actions); the bytes after `consumed` are the shell's to feed again.
    pub fn watch_agent(&mut self, data: &[u8]) -> Result<Passed, HandoffError> {
        if self.state != State::Serving {
            return Err(HandoffError::Unexpected("spliced bytes", self.state.name()));
        }
        let passed = self.agent.pass(data)?;
        match &passed.frame {
            None => {}
            Some(Frame::Leave) => self.leave(),
            Some(f) => return Err(HandoffError::Unexpected(f.name(), "serving")),
        }
        Ok(passed)
    }

    /// Moves the connection, whose agent asked to leave, to the agent `home` (its id), bound
    /// as in an Offer: the exchange then goes on as after a Freeze.
    pub fn move_to(&mut self, home: u16, binding: [u8; BINDING_LEN]) {
        if self.state != State::Leaving {
            return;
        }
        self.push(Action::ToAgent(Frame::Offer { home, binding }.to_bytes()));
        if self.client.inner.at_boundary() {
            self.freeze_now();
        } else {
            self.state = State::Freezing { aborted: false };
        }
    }

    /// Nowhere to move: the agent keeps the connection.
    pub fn stay(&mut self) {
        if self.state != State::Leaving {
            return;
        }
        self.push(Action::ToAgent(Frame::Stay.to_bytes()));
        self.state = State::Serving;
    }

    fn leave(&mut self) {
        self.state = State::Leaving;
        // A new move: the last one's outcome is told already (a Stay ends with none).
        self.reason = MoveReason::Drain;
        self.outcome = None;
        self.push(Action::ChooseHome);
    }

    pub fn from_agent(&mut self, mut data: &[u8]) -> Result<(), HandoffError> {
        while !data.is_empty() {
            let split = self.agent.split(data)?;
            data = &data[split.consumed..];
            if !split.tls.is_empty() {
                // The agent sends TLS only while the handshake is relayed, or it serves.
                if !matches!(self.state, State::Relaying | State::Serving) {
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
                        self.state = State::Freezing { aborted: false };
                    }
                }
                // Too much plaintext before the boundary: the agent keeps the connection, and
                // Frozen still tells it where the client's bytes stop being in the way.
                (State::Freezing { aborted: false }, Frame::Abort) => {
                    self.state = State::Freezing { aborted: true };
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
                (State::Serving, Frame::Leave) => self.leave(),
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
    /// agent keeps the connection. After Commit this changes nothing: the home agent has it.
    pub fn home_failed(&mut self) {
        self.fall_back(None);
    }

    pub fn from_home(&mut self, mut data: &[u8]) -> Result<(), HandoffError> {
        while !data.is_empty() {
            match self.state {
                State::Importing => {}
                // a late answer after a fallback: the home stream is reset, nothing to do
                _ => return Ok(()),
            }
            let split = self.home.split(data)?;
            data = &data[split.consumed..];
            if !split.tls.is_empty() {
                self.fall_back(None);
                return Err(HandoffError::Unexpected("TLS before Ready", "importing"));
            }
            match split.frame {
                None => {}
                Some(Frame::Ready) => {
                    // The decision: from here the home agent has the keys, and the handshake
                    // agent is told only Done.
                    self.push(Action::ToHome(Frame::Commit.to_bytes()));
                    let held = std::mem::take(&mut self.held);
                    if !held.is_empty() {
                        self.push(Action::ToHome(held));
                    }
                    self.push(Action::ToAgent(Frame::Done.to_bytes()));
                    self.push(Action::CloseAgent);
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
        if self.state == State::Importing {
            // The home agent may have opened the object and be waiting for Commit.
            self.push(Action::ToHome(Frame::Abort.to_bytes()));
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
        self.state = State::Serving;
        self.outcome = Some(outcome);
        if target == Target::HomeAgent {
            // The home agent serves from here, its stream at a boundary after Ready: it is
            // the agent a next move starts from.
            self.agent = std::mem::take(&mut self.home);
        }
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
