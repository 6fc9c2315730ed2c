//! The agents' sides of the handoff as state machines: [`Exporter`] for the handshake agent,
//! [`Importer`] for the home agent. Bytes from the dispatcher in, events and frames out; the
//! caller runs the TLS engine (decrypt, extract, seal, open) and the sockets. Deadlines are
//! instants the caller passes in, so tests run them on virtual time.
//!
//! Both machines give up on a silent dispatcher by *closing*, never by using the keys: the
//! handshake agent serves the session only on the dispatcher's Resume, the home agent only on
//! its Commit. That is what keeps two agents from encrypting under one key and sequence number
//! whatever times out first.

use std::time::Instant;

use crate::frame::{Frame, MigrationError, Splitter, BINDING_LEN};
use crate::timeouts::Timeouts;

/// What the handshake agent must do next.
#[derive(Debug, PartialEq, Eq)]
pub enum ExportEvent {
    /// The dispatcher answered Leave with where to move (in [`ExportInput::moved`]): its Offer
    /// is the cut. Extract and seal for this home agent and binding, then
    /// [`Exporter::switch`] with cut 0 (or [`Exporter::abort`], [`Exporter::kept`]).
    Move {
        home: u16,
        binding: [u8; BINDING_LEN],
    },
    /// The dispatcher answered Leave with Stay: carry on with the TLS engine, feeding it
    /// `ciphertext` (client bytes after the answer) first.
    Stay { ciphertext: Vec<u8> },
    /// The home agent has the connection: drop the keys, close the stream.
    Migrated,
    /// The home agent did not take it (or this agent kept it): serve the session here, from
    /// the record layer, starting with `ciphertext` (the client's bytes from the cut on).
    ServeHere { ciphertext: Vec<u8> },
}

/// The result of one [`Exporter::from_dispatcher`] call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExportInput {
    /// Client records to decrypt now (before a Leave's answer), in order.
    pub decrypt: Vec<u8>,
    /// [`ExportEvent::Move`], when the dispatcher's answer to Leave came in this input.
    pub moved: Option<ExportEvent>,
    pub event: Option<ExportEvent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExportState {
    /// Leave sent: client records are decrypted (their plaintext carried, if the connection
    /// moves) until the dispatcher's Offer or Stay.
    Leaving,
    /// At the cut: the caller extracts and seals, then switches (or keeps the connection).
    Cutting,
    /// Switch (or Kept) sent: waiting for the verdict; client records that come are after the
    /// cut, and discarded. Nothing may be sent.
    Switched { kept: bool },
    /// Finished one way or another.
    Finished,
}

/// The handshake agent's side of one migration, from its cut to the dispatcher's verdict.
#[derive(Debug)]
pub struct Exporter {
    state: ExportState,
    splitter: Splitter,
    cap: usize,
    plaintext: usize,
    timeouts: Timeouts,
    deadline: Instant,
}

impl Exporter {
    /// Starts a migration at the cut (the handshake is done, its tickets are written or about
    /// to be with the Switch, and every client record rustls has read is to be decrypted).
    /// `cap` bounds the client plaintext the session object may carry; `timeouts` the waits on
    /// the dispatcher.
    pub fn cut(cap: usize, timeouts: Timeouts, now: Instant) -> Self {
        Self {
            state: ExportState::Cutting,
            splitter: Splitter::new(),
            cap,
            plaintext: 0,
            timeouts,
            deadline: now + timeouts.verdict(),
        }
    }

    /// Starts moving an established connection at `now` because this agent drains: the
    /// machine and the Leave frame to send. Nothing may be sent to the client from here on
    /// (the last response is on the wire). The dispatcher answers with an Offer
    /// ([`ExportEvent::Move`]: then as at a cut, with cut 0) or Stay.
    pub fn leave(cap: usize, timeouts: Timeouts, now: Instant) -> (Self, Vec<u8>) {
        let mut me = Self::cut(cap, timeouts, now);
        me.state = ExportState::Leaving;
        (me, Frame::Leave.to_bytes())
    }

    /// Where the client's stream stood when the TLS engine stopped reading it: `read` has
    /// [tracked](Splitter::track) every client byte the engine took. The engine reads in
    /// chunks, so the handshake may end with part of a record inside it and the rest still on
    /// the stream; without this the rest would be read as a record header.
    pub fn continue_from(&mut self, read: Splitter) {
        if matches!(self.state, ExportState::Cutting | ExportState::Leaving) {
            self.splitter = read;
        }
    }

    /// Bytes from the dispatcher. An error means the stream broke the protocol: close it.
    pub fn from_dispatcher(&mut self, mut data: &[u8]) -> Result<ExportInput, MigrationError> {
        let mut out = ExportInput::default();
        while !data.is_empty() {
            match self.state {
                ExportState::Leaving => {}
                ExportState::Switched { kept } => return self.verdict(data, kept),
                s => return Err(MigrationError::Unexpected("bytes", export_name(s))),
            }
            let split = self.splitter.split(data)?;
            data = &data[split.consumed..];
            out.decrypt.extend_from_slice(&split.tls);
            match split.frame {
                None => {}
                // The dispatcher holds every client byte after its Offer until the verdict.
                Some(Frame::Offer { home, binding }) if data.is_empty() => {
                    self.state = ExportState::Cutting;
                    out.moved = Some(ExportEvent::Move { home, binding });
                }
                Some(Frame::Stay) => {
                    self.state = ExportState::Finished;
                    out.event = Some(ExportEvent::Stay {
                        ciphertext: data.to_vec(),
                    });
                    return Ok(out);
                }
                Some(f) => {
                    return Err(MigrationError::Unexpected(
                        f.name(),
                        export_name(self.state),
                    ))
                }
            }
        }
        Ok(out)
    }

    /// After Switch: client records the dispatcher forwarded before it saw the cut are
    /// discarded (they reach whoever serves on, from the dispatcher's copy), then the verdict.
    fn verdict(&mut self, mut data: &[u8], kept: bool) -> Result<ExportInput, MigrationError> {
        let mut event = None;
        while !data.is_empty() {
            let split = self.splitter.split(data)?;
            data = &data[split.consumed..];
            event = match split.frame {
                None => continue,
                Some(Frame::Done) if data.is_empty() && !kept => Some(ExportEvent::Migrated),
                Some(Frame::Resume) => Some(ExportEvent::ServeHere {
                    ciphertext: data.to_vec(),
                }),
                Some(f) => return Err(MigrationError::Unexpected(f.name(), "switched")),
            };
            self.state = ExportState::Finished;
            break;
        }
        Ok(ExportInput {
            event,
            ..ExportInput::default()
        })
    }

    /// The dispatcher released the stream after Switch: that is Done, wherever the stream
    /// stood (a release may overtake client bytes still queued before it, which were after
    /// the cut anyway).
    pub fn released(&mut self) -> Result<ExportEvent, MigrationError> {
        match self.state {
            ExportState::Switched { kept: false } => {
                self.state = ExportState::Finished;
                Ok(ExportEvent::Migrated)
            }
            s => Err(MigrationError::Unexpected("release", export_name(s))),
        }
    }

    /// `n` more bytes of client plaintext came out of the records decrypted for the move.
    pub fn decrypted(&mut self, n: usize) {
        self.plaintext += n;
    }

    /// Whether the plaintext decrypted so far may ride with the session object. Past the cap
    /// the connection stays here: [`Exporter::abort`].
    pub fn within_cap(&self) -> bool {
        self.plaintext <= self.cap
    }

    /// Client plaintext decrypted so far.
    pub fn plaintext(&self) -> usize {
        self.plaintext
    }

    /// The sealed session object is ready: the Switch frame to send, with the cut (client
    /// bytes after the Offer this agent consumed; 0 after a Leave). From here the keys are not
    /// this agent's to use until a Resume.
    pub fn switch(
        &mut self,
        cut: u32,
        sealed: Vec<u8>,
        now: Instant,
    ) -> Result<Vec<u8>, MigrationError> {
        self.start_waiting("Switch", false, now)?;
        Ok(Frame::Switch { cut, sealed }.to_bytes())
    }

    /// Extracted, but the object could not be sealed: the Kept frame to send. The dispatcher
    /// answers Resume and the client's bytes from `cut` on ([`ExportEvent::ServeHere`]).
    pub fn kept(&mut self, cut: u32, now: Instant) -> Result<Vec<u8>, MigrationError> {
        self.start_waiting("Kept", true, now)?;
        Ok(Frame::Kept { cut }.to_bytes())
    }

    fn start_waiting(
        &mut self,
        what: &'static str,
        kept: bool,
        now: Instant,
    ) -> Result<(), MigrationError> {
        if self.state != ExportState::Cutting {
            return Err(MigrationError::Unexpected(what, export_name(self.state)));
        }
        self.state = ExportState::Switched { kept };
        self.deadline = now + self.timeouts.verdict();
        Ok(())
    }

    /// Over the cap, or not extractable, before anything was extracted: the Abort frame. The
    /// TLS engine reads on: after a handshake the dispatcher splices as after a Decline; after
    /// a Leave's Offer it gives this agent the bytes it held.
    pub fn abort(&mut self) -> Result<Vec<u8>, MigrationError> {
        if self.state != ExportState::Cutting {
            return Err(MigrationError::Unexpected("Abort", export_name(self.state)));
        }
        self.state = ExportState::Finished;
        Ok(Frame::Abort.to_bytes())
    }

    /// When the caller must give up waiting on the dispatcher (close without using the keys).
    pub fn deadline(&self) -> Option<Instant> {
        matches!(
            self.state,
            ExportState::Leaving | ExportState::Switched { .. }
        )
        .then_some(self.deadline)
    }

    /// Whether the wait has outlived its deadline at `now`.
    pub fn timed_out(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }
}

fn export_name(s: ExportState) -> &'static str {
    match s {
        ExportState::Leaving => "leaving",
        ExportState::Cutting => "cutting",
        ExportState::Switched { .. } => "switched",
        ExportState::Finished => "finished",
    }
}
