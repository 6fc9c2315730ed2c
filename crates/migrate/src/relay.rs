//! The dispatcher's side of the handoff as a state machine (see the module docs for the
//! exchange).

use std::collections::VecDeque;
use std::time::Instant;

use crate::frame::{Frame, MigrationError, Passed, RefuseReason, Splitter, BINDING_LEN, MAX_HELD};
use crate::timeouts::Timeouts;

/// Tracks the boundaries between the client's records, refusing anything but TLS records.
#[derive(Debug, Default)]
struct ClientRecords {
    inner: Splitter,
}

impl ClientRecords {
    /// How many of `data`'s bytes come before the next record boundary (all of them if none
    /// falls inside). At a boundary already: 0.
    fn len_to_boundary(&mut self, data: &[u8]) -> Result<usize, MigrationError> {
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

    pub fn decode(r: &mut baton_wire::codec::Reader<'_>) -> Result<Self, MigrationError> {
        let client = Splitter::decode(r)?;
        // the client's direction is only ever tracked: never a frame in it
        if client.head.first() == Some(&crate::frame::FRAME_TYPE) {
            return Err(MigrationError::FrameFromClient);
        }
        let agent = Splitter::decode(r)?;
        let left = match r
            .take(1, "left")
            .map_err(|_| MigrationError::Malformed("position"))?
        {
            [0] => false,
            [1] => true,
            _ => return Err(MigrationError::Malformed("position")),
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
    /// The handshake agent kept the connection (over its plaintext cap, not extractable, or
    /// not sealed).
    Aborted,
    Migrated,
    /// The home agent refused, broke or timed out before Ready; the handshake agent kept the
    /// connection.
    FellBack(Option<RefuseReason>),
}

impl Outcome {
    /// The outcome's label in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Migrated => "migrated",
            Outcome::Declined => "declined",
            Outcome::Aborted => "aborted",
            Outcome::FellBack(_) => "fell_back",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Relaying the handshake, every client byte copied (the home agent's, from the cut on);
    /// the handshake agent may cut (Switch, Kept) or keep the connection (Decline, Abort).
    Relaying,
    /// The agent cut: client bytes pass to it up to the end of the record they are in (its
    /// stream must reach a boundary), then are held. `kept`: it keeps the session (Kept).
    Finishing { kept: bool },
    /// A Leave's answer is due while the client is in the middle of a record: its bytes pass
    /// to the agent up to the boundary, then the Offer goes.
    Offering {
        home: u16,
        binding: [u8; BINDING_LEN],
    },
    /// The Offer answered a Leave at a boundary: client bytes are held from there; waiting for
    /// the agent's Switch (with cut 0), Kept or Abort.
    Offered,
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
            State::Finishing { .. } => "finishing a record",
            State::Offering { .. } => "offering",
            State::Offered => "offered",
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
    /// Relaying: the copy of every client byte forwarded since the Offer. After the cut (and
    /// after a Leave's Offer): the client's bytes from the cut on, held for whoever gets them.
    held: Vec<u8>,
    actions: VecDeque<Action>,
    outcome: Option<Outcome>,
    reason: MoveReason,
    timeouts: Timeouts,
    /// The wait under way and when it ends, armed by [`Relay::poll_timeout`].
    deadline: Option<(Wait, Instant)>,
}

/// What the relay can be waiting on, each with its own deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The home agent's stream and its Ready.
    Home,
    /// The end of the client's current record, or the agent's Switch after a Leave's Offer.
    Cut,
}

/// What a passed deadline meant ([`Relay::handle_timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Nothing was due yet.
    NotYet,
    /// The home agent was too slow: the handshake agent keeps the connection (the queued
    /// actions say so to both agents).
    FellBack,
    /// The cut never came: close the connection (no agent has been given the keys).
    Close,
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
            timeouts: Timeouts::default(),
            deadline: None,
        }
    }

    /// The same relay, with the deadlines of `timeouts` (the default's otherwise).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
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
    pub fn offer(home: u16, binding: [u8; BINDING_LEN]) -> Vec<u8> {
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

    /// Whether the shell should read from the client now (false while enough is copied or
    /// held). A cut, or a Leave's Offer, waits for the end of the client's current record:
    /// that is read whatever is held, one record more at most.
    pub fn wants_client_bytes(&self) -> bool {
        self.held.len() < MAX_HELD
            || matches!(self.state, State::Finishing { .. } | State::Offering { .. })
    }

    /// Client bytes copied or held.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Whether the handshake is still being relayed (the agent has neither cut nor declined
    /// the connection).
    pub fn is_relaying_handshake(&self) -> bool {
        self.state == State::Relaying
    }

    /// When the shell must call [`Relay::handle_timeout`], if the relay waits on a peer. A
    /// wait's deadline starts at the first call after the wait began: call this after every
    /// round of [`Relay::poll_action`], with that round's time.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Instant> {
        let wait = if self.awaiting_home() {
            Wait::Home
        } else if self.awaiting_cut() {
            Wait::Cut
        } else {
            self.deadline = None;
            return None;
        };
        match self.deadline {
            Some((armed, at)) if armed == wait => Some(at),
            _ => {
                let at = now
                    + match wait {
                        Wait::Home => self.timeouts.home(),
                        Wait::Cut => self.timeouts.cut(),
                    };
                self.deadline = Some((wait, at));
                Some(at)
            }
        }
    }

    /// The time is `now`: a home agent past its deadline is given up (the handshake agent
    /// keeps the connection), and a cut past its deadline ends the connection.
    pub fn handle_timeout(&mut self, now: Instant) -> Expired {
        match self.deadline {
            Some((wait, at)) if now >= at => match wait {
                Wait::Home if self.awaiting_home() => {
                    self.deadline = None;
                    self.home_failed();
                    Expired::FellBack
                }
                Wait::Cut if self.awaiting_cut() => Expired::Close,
                _ => Expired::NotYet,
            },
            _ => Expired::NotYet,
        }
    }

    /// Whether the relay is waiting on the home agent ([`Relay::poll_timeout`] says until when).
    pub fn awaiting_home(&self) -> bool {
        matches!(self.state, State::Connecting | State::Importing)
    }

    /// Whether the relay is waiting on the client to finish a record before it can hold its
    /// bytes (after a cut, or to answer a Leave), or on the agent's Switch after a Leave's
    /// Offer ([`Relay::poll_timeout`] says until when; a client's EOF then waits with its held
    /// bytes).
    pub fn awaiting_cut(&self) -> bool {
        matches!(
            self.state,
            State::Finishing { .. } | State::Offering { .. } | State::Offered
        )
    }

    pub fn from_client(&mut self, data: &[u8]) -> Result<(), MigrationError> {
        match self.state {
            // The handshake: forwarded, and copied for the home agent. The shell stops reading
            // at MAX_HELD; a read may overshoot it by one buffer.
            State::Relaying => {
                self.client.inner.track(data)?;
                self.held.extend_from_slice(data);
                self.push(Action::ToAgent(data.to_vec()));
            }
            // Until the Offer the agent gets the client's bytes.
            State::Serving | State::Leaving => {
                self.client.inner.track(data)?;
                self.push(Action::ToAgent(data.to_vec()));
            }
            // After the cut: the rest of the current record still goes to the agent (which
            // discards it), and all of it is held for whoever serves on.
            State::Finishing { kept } => {
                let n = self.client.len_to_boundary(data)?;
                if n > 0 {
                    self.push(Action::ToAgent(data[..n].to_vec()));
                }
                self.held.extend_from_slice(&data[..n]);
                if self.client.inner.at_boundary() {
                    self.cut_done(kept);
                    // the rest as the next state has it: held, or the agent's again (Kept)
                    return self.from_client(&data[n..]);
                }
            }
            State::Offering { home, binding } => {
                let n = self.client.len_to_boundary(data)?;
                if n > 0 {
                    self.push(Action::ToAgent(data[..n].to_vec()));
                }
                if self.client.inner.at_boundary() {
                    self.offer_now(home, binding);
                    return self.from_client(&data[n..]);
                }
            }
            State::Offered | State::Connecting | State::Importing => {
                self.client.inner.track(data)?;
                self.held.extend_from_slice(data)
            }
        }
        Ok(())
    }

    /// Client bytes the shell forwards to the agent itself while serving (no copy): only
    /// followed, so the next move can cut at a record boundary.
    pub fn watch_client(&mut self, data: &[u8]) -> Result<(), MigrationError> {
        if !matches!(self.state, State::Serving | State::Leaving) {
            return Err(MigrationError::Unexpected(
                "spliced bytes",
                self.state.name(),
            ));
        }
        self.client.inner.track(data)
    }

    /// Agent bytes while serving: the front `tls` bytes go to the client unchanged. A Leave
    /// frame after them asks for [`Action::ChooseHome`] (the shell stops splicing and does the
    /// actions); the bytes after `consumed` are the shell's to feed again.
    pub fn watch_agent(&mut self, data: &[u8]) -> Result<Passed, MigrationError> {
        if self.state != State::Serving {
            return Err(MigrationError::Unexpected(
                "spliced bytes",
                self.state.name(),
            ));
        }
        let passed = self.agent.pass(data)?;
        match &passed.frame {
            None => {}
            Some(Frame::Leave) => self.leave(),
            Some(f) => return Err(MigrationError::Unexpected(f.name(), "serving")),
        }
        Ok(passed)
    }

    /// Moves the connection, whose agent asked to leave, to the agent `home` (its id), bound
    /// as in an Offer. The Offer is the cut: it goes at the next client record boundary, and
    /// the client's bytes after it are held.
    pub fn move_to(&mut self, home: u16, binding: [u8; BINDING_LEN]) {
        if self.state != State::Leaving {
            return;
        }
        if self.client.inner.at_boundary() {
            self.offer_now(home, binding);
        } else {
            self.state = State::Offering { home, binding };
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

    pub fn from_agent(&mut self, mut data: &[u8]) -> Result<(), MigrationError> {
        while !data.is_empty() {
            let split = self.agent.split(data)?;
            data = &data[split.consumed..];
            if !split.tls.is_empty() {
                // The agent sends TLS only while the handshake is relayed, or it serves.
                if !matches!(self.state, State::Relaying | State::Serving) {
                    return Err(MigrationError::Unexpected(
                        "TLS from the agent",
                        self.state.name(),
                    ));
                }
                self.push(Action::ToClient(split.tls));
            }
            let Some(frame) = split.frame else { continue };
            match (self.state, frame) {
                (State::Relaying, Frame::Decline) => {
                    self.held = Vec::new();
                    self.finish(Target::HandshakeAgent, Outcome::Declined);
                }
                // Over the plaintext cap, or not extractable: nothing was cut, the agent reads
                // on as after a Decline.
                (State::Relaying, Frame::Abort) => {
                    self.held = Vec::new();
                    self.finish(Target::HandshakeAgent, Outcome::Aborted);
                }
                (State::Relaying, Frame::Switch { cut, sealed }) => {
                    self.take_cut(cut, self.held.len())?;
                    self.session = sealed;
                    self.finish_record(false);
                }
                (State::Relaying, Frame::Kept { cut }) => {
                    self.take_cut(cut, self.held.len())?;
                    self.finish_record(true);
                }
                // After a Leave's Offer nothing was forwarded: the cut is the Offer.
                (State::Offered, Frame::Switch { cut, sealed }) => {
                    self.take_cut(cut, 0)?;
                    self.session = sealed;
                    self.cut_done(false);
                }
                (State::Offered, Frame::Kept { cut }) => {
                    self.take_cut(cut, 0)?;
                    self.cut_done(true);
                }
                (State::Offered, Frame::Abort) => {
                    self.release_to_agent();
                    self.finish(Target::HandshakeAgent, Outcome::Aborted);
                }
                (State::Serving, Frame::Leave) => self.leave(),
                (s, f) => return Err(MigrationError::Unexpected(f.name(), s.name())),
            }
        }
        Ok(())
    }

    /// The agent cut at `cut` bytes of the copy, of which it was sent `forwarded`: a record
    /// boundary within them, or the stream broke the protocol. The held bytes start there.
    fn take_cut(&mut self, cut: u32, forwarded: usize) -> Result<(), MigrationError> {
        let cut = cut as usize;
        let bad = MigrationError::Malformed("cut");
        if cut > forwarded || cut > self.held.len() {
            return Err(bad);
        }
        // The copy starts at a boundary (the ClientHello, or a Leave's Offer): walk its record
        // headers up to the cut, a few per handshake.
        let mut i = 0;
        while i < cut {
            let Some(head) = self.held.get(i..i + baton_wire::record::HEADER_LEN) else {
                return Err(bad);
            };
            i += baton_wire::record::HEADER_LEN
                + usize::from(u16::from_be_bytes([head[3], head[4]]));
        }
        if i != cut {
            return Err(bad);
        }
        self.held.drain(..cut);
        Ok(())
    }

    /// After a cut: hold from the end of the client's current record.
    fn finish_record(&mut self, kept: bool) {
        if self.client.inner.at_boundary() {
            self.cut_done(kept);
        } else {
            self.state = State::Finishing { kept };
        }
    }

    /// The agent's stream is at a client record boundary after its cut: import the session
    /// at the home agent, or, if the agent keeps it, give the agent the held bytes.
    fn cut_done(&mut self, kept: bool) {
        if kept {
            self.push(Action::ToAgent(Frame::Resume.to_bytes()));
            self.release_to_agent();
            self.finish(Target::HandshakeAgent, Outcome::Aborted);
        } else {
            self.state = State::Connecting;
            self.push(Action::ConnectHome);
        }
    }

    fn offer_now(&mut self, home: u16, binding: [u8; BINDING_LEN]) {
        self.push(Action::ToAgent(Frame::Offer { home, binding }.to_bytes()));
        self.state = State::Offered;
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

    pub fn from_home(&mut self, mut data: &[u8]) -> Result<(), MigrationError> {
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
                return Err(MigrationError::Unexpected("TLS before Ready", "importing"));
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
                    return Err(MigrationError::Unexpected(f.name(), "importing"));
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
