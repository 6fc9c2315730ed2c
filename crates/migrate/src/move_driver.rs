//! The dispatcher's side of one move (a handshake's, or a draining agent's Leave), as a driver
//! in the style of quinn-proto's `Connection`, around the [`Relay`]: the caller feeds it what
//! the client, the handshake agent's stream and the home agent's stream bring (or that they
//! ended) and the time ([`MoveDriver::handle_timeout`] at [`MoveDriver::poll_timeout`]); it does
//! what [`MoveDriver::poll_io`] asks, in order, until that says where the connection goes.
//!
//! The relay decides the protocol; this driver adds what the shell used to decide around it:
//! Done is told by releasing the agent's stream (so it is not written, and the agent's stream
//! is not also shut down), a client's EOF while its bytes are held waits with them, a home
//! stream that cannot be written or ends is a failed home, and when the handshake is over for
//! the router. The dispatcher's tokio shell and the agent's in-memory harness both run this
//! same driver.

use std::collections::VecDeque;
use std::time::Instant;

use crate::frame::{Frame, MigrationError};
use crate::relay::{Action, Expired, Relay, Target};
use crate::timeouts::Timeouts;

/// What the dispatcher must do next, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum MoveIo {
    ToClient(Vec<u8>),
    ToAgent(Vec<u8>),
    /// Write to the home agent's stream, if it is open; a failed write is
    /// [`MoveDriver::home_write_failed`].
    ToHome(Vec<u8>),
    /// Open a stream on the home agent's link by the deadline [`MoveDriver::poll_timeout`]
    /// gives now; answer with [`MoveDriver::home_opened`].
    OpenHome,
    /// End the handshake agent's stream (it keeps no part in the connection).
    ShutdownAgent,
    /// Reset the home agent's stream: it drops the keys it was never told to use.
    ResetHome,
    /// The handshake is over (the agent cut or declined): tell the router, once.
    HandshakeOver,
    /// The move is over: splice the client to this agent (the home agent's stream, or the
    /// handshake agent's; after a Stay, the agent that asked to leave keeps it). After a move
    /// to the home agent, the handshake agent's stream is released: that is its Done.
    Splice(Target),
    /// The connection ends: a party left before the move finished, or a deadline passed.
    Close,
    /// A stream broke the protocol: the connection ends.
    Broken(MigrationError),
}

/// The dispatcher's side of one move, around the connection's relay.
#[derive(Debug)]
pub struct MoveDriver {
    relay: Relay,
    /// Terminal answers, ahead of the relay's actions.
    end: VecDeque<MoveIo>,
    /// Done was queued for the agent: its stream is released, not shut down.
    released: bool,
    /// The client ended its half while its bytes were held: the EOF waits with them.
    client_ended: bool,
    /// The splice the relay asked for in the round under way.
    spliced: Option<Target>,
    handshake_told: bool,
    finished: bool,
}

impl MoveDriver {
    /// Drives a relay that serves a connection whose agent asked to leave, or that is in the
    /// middle of a move.
    pub fn new(relay: Relay) -> Self {
        Self {
            relay,
            end: VecDeque::new(),
            released: false,
            client_ended: false,
            spliced: None,
            handshake_told: false,
            finished: false,
        }
    }

    /// A handshake offered to move: the Offer and the client's `first` bytes are written to
    /// the handshake agent already.
    pub fn offered(timeouts: Timeouts, first: &[u8]) -> Result<Self, MigrationError> {
        let mut relay = Relay::new().with_timeouts(timeouts);
        relay.from_client(first)?;
        while relay.poll_action().is_some() {}
        Ok(Self::new(relay))
    }

    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    pub fn relay_mut(&mut self) -> &mut Relay {
        &mut self.relay
    }

    /// The relay, to go on with once the move is over.
    pub fn into_relay(self) -> Relay {
        self.relay
    }

    /// Whether the caller should read from the client now.
    pub fn wants_client_bytes(&self) -> bool {
        !self.client_ended && self.relay.wants_client_bytes()
    }

    /// Whether the client ended its half while its bytes were held (whoever gets the stream
    /// gets the EOF after them).
    pub fn client_ended_held(&self) -> bool {
        self.client_ended
    }

    /// The next thing to do.
    pub fn poll_io(&mut self) -> Option<MoveIo> {
        if let Some(end) = self.end.pop_front() {
            self.finished = true;
            return Some(end);
        }
        if self.finished {
            return None;
        }
        while let Some(action) = self.relay.poll_action() {
            return Some(match action {
                Action::ToClient(b) => MoveIo::ToClient(b),
                // Done is told by releasing the agent's stream once the splice starts: one
                // frame, and the agent owes no END.
                Action::ToAgent(b) if b == Frame::Done.to_bytes() => {
                    self.released = true;
                    continue;
                }
                Action::ToAgent(b) => MoveIo::ToAgent(b),
                Action::ToHome(b) => MoveIo::ToHome(b),
                Action::ConnectHome => MoveIo::OpenHome,
                Action::CloseAgent if self.released => continue,
                Action::CloseAgent => MoveIo::ShutdownAgent,
                Action::CloseHome => MoveIo::ResetHome,
                Action::Splice(t) => {
                    self.spliced = Some(t);
                    continue;
                }
                // a Leave is answered before the move is driven (`Relay::move_to`, `stay`)
                Action::ChooseHome => {
                    self.relay.stay();
                    continue;
                }
            });
        }
        // the round is over
        if let Some(t) = self.spliced {
            self.finished = true;
            return Some(MoveIo::Splice(t));
        }
        if self.relay.is_serving() {
            // a Stay: the agent keeps it, nothing moved
            self.finished = true;
            return Some(MoveIo::Splice(Target::HandshakeAgent));
        }
        if !self.relay.is_relaying_handshake() && !self.handshake_told {
            self.handshake_told = true;
            return Some(MoveIo::HandshakeOver);
        }
        None
    }

    /// When [`MoveDriver::handle_timeout`] is due: call after every round of
    /// [`MoveDriver::poll_io`], with that round's time.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Instant> {
        self.relay.poll_timeout(now)
    }

    /// The time is `now`: a home agent past its deadline is given up, a cut past its deadline
    /// ends the connection.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.relay.handle_timeout(now) == Expired::Close {
            self.end.push_back(MoveIo::Close);
        }
    }

    pub fn handle_client(&mut self, data: &[u8]) {
        let r = self.relay.from_client(data);
        self.check(r);
    }

    /// The client ended its half (or its socket broke).
    pub fn client_ended(&mut self) {
        if self.relay.awaiting_cut() {
            // held: its EOF waits with its held bytes, for whoever gets the stream
            self.client_ended = true;
        } else {
            // the client left before the move finished: nobody to serve
            self.end.push_back(MoveIo::Close);
        }
    }

    pub fn handle_agent(&mut self, data: &[u8]) {
        let r = self.relay.from_agent(data);
        self.check(r);
    }

    /// The handshake agent's stream ended or broke.
    pub fn agent_ended(&mut self) {
        self.end.push_back(MoveIo::Close);
    }

    pub fn handle_home(&mut self, data: &[u8]) {
        let r = self.relay.from_home(data);
        self.check(r);
    }

    /// The home agent's stream ended or broke before the splice.
    pub fn home_ended(&mut self) {
        self.relay.home_failed();
    }

    /// A write to the home agent's stream failed.
    pub fn home_write_failed(&mut self) {
        if self.spliced.is_none() {
            self.relay.home_failed();
        }
    }

    /// The answer to [`MoveIo::OpenHome`].
    pub fn home_opened(&mut self, opened: bool) {
        match opened {
            true => self.relay.home_connected(),
            false => self.relay.home_failed(),
        }
    }

    fn check(&mut self, r: Result<(), MigrationError>) {
        if let Err(e) = r {
            self.end.push_back(MoveIo::Broken(e));
        }
    }
}
