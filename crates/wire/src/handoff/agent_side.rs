//! The agents' sides of the handoff as state machines: [`Exporter`] for the handshake agent,
//! [`Importer`] for the home agent. Bytes from the dispatcher in, events and frames out; the
//! caller runs the TLS engine (decrypt, extract, seal, open) and the sockets. Deadlines are
//! instants the caller passes in, so tests run them on virtual time.
//!
//! Both machines give up on a silent dispatcher by *closing*, never by using the keys: the
//! handshake agent serves the session only on the dispatcher's Resume, the home agent only on
//! its Commit. That is what keeps two agents from encrypting under one key and sequence number
//! whatever times out first.

use std::time::{Duration, Instant};

use super::{Frame, HandoffError, RefuseReason, Splitter, BINDING_LEN};

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
    timeout: Duration,
    deadline: Instant,
}

impl Exporter {
    /// Starts a migration at the cut (the handshake is done, its tickets are written or about
    /// to be with the Switch, and every client record rustls has read is to be decrypted).
    /// `cap` bounds the client plaintext the session object may carry; `timeout` each wait on
    /// the dispatcher.
    pub fn cut(cap: usize, timeout: Duration, now: Instant) -> Self {
        Self {
            state: ExportState::Cutting,
            splitter: Splitter::new(),
            cap,
            plaintext: 0,
            timeout,
            deadline: now + timeout * 2,
        }
    }

    /// Starts moving an established connection at `now` because this agent drains: the
    /// machine and the Leave frame to send. Nothing may be sent to the client from here on
    /// (the last response is on the wire). The dispatcher answers with an Offer
    /// ([`ExportEvent::Move`]: then as at a cut, with cut 0) or Stay.
    pub fn leave(cap: usize, timeout: Duration, now: Instant) -> (Self, Vec<u8>) {
        let mut me = Self::cut(cap, timeout, now);
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
    pub fn from_dispatcher(&mut self, mut data: &[u8]) -> Result<ExportInput, HandoffError> {
        let mut out = ExportInput::default();
        while !data.is_empty() {
            match self.state {
                ExportState::Leaving => {}
                ExportState::Switched { kept } => return self.verdict(data, kept),
                s => return Err(HandoffError::Unexpected("bytes", export_name(s))),
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
                Some(f) => return Err(HandoffError::Unexpected(f.name(), export_name(self.state))),
            }
        }
        Ok(out)
    }

    /// After Switch: client records the dispatcher forwarded before it saw the cut are
    /// discarded (they reach whoever serves on, from the dispatcher's copy), then the verdict.
    fn verdict(&mut self, mut data: &[u8], kept: bool) -> Result<ExportInput, HandoffError> {
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
                Some(f) => return Err(HandoffError::Unexpected(f.name(), "switched")),
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
    pub fn released(&mut self) -> Result<ExportEvent, HandoffError> {
        match self.state {
            ExportState::Switched { kept: false } => {
                self.state = ExportState::Finished;
                Ok(ExportEvent::Migrated)
            }
            s => Err(HandoffError::Unexpected("release", export_name(s))),
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
    ) -> Result<Vec<u8>, HandoffError> {
        self.start_waiting("Switch", false, now)?;
        Ok(Frame::Switch { cut, sealed }.to_bytes())
    }

    /// Extracted, but the object could not be sealed: the Kept frame to send. The dispatcher
    /// answers Resume and the client's bytes from `cut` on ([`ExportEvent::ServeHere`]).
    pub fn kept(&mut self, cut: u32, now: Instant) -> Result<Vec<u8>, HandoffError> {
        self.start_waiting("Kept", true, now)?;
        Ok(Frame::Kept { cut }.to_bytes())
    }

    fn start_waiting(
        &mut self,
        what: &'static str,
        kept: bool,
        now: Instant,
    ) -> Result<(), HandoffError> {
        if self.state != ExportState::Cutting {
            return Err(HandoffError::Unexpected(what, export_name(self.state)));
        }
        self.state = ExportState::Switched { kept };
        self.deadline = now + self.timeout * 2;
        Ok(())
    }

    /// Over the cap, or not extractable, before anything was extracted: the Abort frame. The
    /// TLS engine reads on: after a handshake the dispatcher splices as after a Decline; after
    /// a Leave's Offer it gives this agent the bytes it held.
    pub fn abort(&mut self) -> Result<Vec<u8>, HandoffError> {
        if self.state != ExportState::Cutting {
            return Err(HandoffError::Unexpected("Abort", export_name(self.state)));
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

/// What the home agent must do next.
#[derive(Debug, PartialEq, Eq)]
pub enum ImportEvent {
    /// Open this sealed session object (bound to the link and token it came with), then
    /// [`Importer::ready`] or [`Importer::refuse`].
    Open(Vec<u8>),
    /// The dispatcher's decision: serve the session, starting with `ciphertext` (the client
    /// bytes it held), then what the stream brings.
    Commit { ciphertext: Vec<u8> },
    /// The dispatcher went another way: drop the keys, send nothing, close.
    Aborted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImportState {
    AwaitImport,
    Opening,
    Ready,
    Finished,
}

/// The home agent's side of one migration: a link stream that starts with Import.
#[derive(Debug)]
pub struct Importer {
    state: ImportState,
    splitter: Splitter,
    timeout: Duration,
    deadline: Instant,
}

impl Importer {
    /// A stream that should bring Import within `timeout` of `now`.
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            state: ImportState::AwaitImport,
            splitter: Splitter::new(),
            timeout,
            deadline: now + timeout,
        }
    }

    /// Bytes from the dispatcher. An error means the stream broke the protocol: close it.
    pub fn from_dispatcher(&mut self, data: &[u8]) -> Result<Option<ImportEvent>, HandoffError> {
        if data.is_empty() {
            return Ok(None);
        }
        let expect = match self.state {
            ImportState::AwaitImport | ImportState::Ready => self.state,
            s => return Err(HandoffError::Unexpected("bytes", import_name(s))),
        };
        let split = self.splitter.split(data)?;
        if !split.tls.is_empty() {
            return Err(HandoffError::Unexpected("TLS", import_name(expect)));
        }
        let rest = &data[split.consumed..];
        let event = match (expect, split.frame) {
            (_, None) => return Ok(None),
            // Nothing follows Import until this agent has answered.
            (ImportState::AwaitImport, Some(Frame::Import(sealed))) if rest.is_empty() => {
                self.state = ImportState::Opening;
                ImportEvent::Open(sealed)
            }
            (ImportState::Ready, Some(Frame::Commit)) => {
                self.state = ImportState::Finished;
                ImportEvent::Commit {
                    ciphertext: rest.to_vec(),
                }
            }
            (ImportState::Ready, Some(Frame::Abort)) => {
                self.state = ImportState::Finished;
                ImportEvent::Aborted
            }
            (s, Some(f)) => return Err(HandoffError::Unexpected(f.name(), import_name(s))),
        };
        Ok(Some(event))
    }

    /// The object opened: the Ready frame to send. The keys stay unused until Commit, which
    /// must come within the timeout from `now`.
    pub fn ready(&mut self, now: Instant) -> Result<Vec<u8>, HandoffError> {
        if self.state != ImportState::Opening {
            return Err(HandoffError::Unexpected("Ready", import_name(self.state)));
        }
        self.state = ImportState::Ready;
        self.deadline = now + self.timeout * 2;
        Ok(Frame::Ready.to_bytes())
    }

    /// The object did not open: the Refused frame to send; the stream is done.
    pub fn refuse(&mut self, reason: RefuseReason) -> Result<Vec<u8>, HandoffError> {
        if self.state != ImportState::Opening {
            return Err(HandoffError::Unexpected("Refused", import_name(self.state)));
        }
        self.state = ImportState::Finished;
        Ok(Frame::Refused(reason).to_bytes())
    }

    /// When the caller must give up waiting on the dispatcher (drop the keys, close).
    pub fn deadline(&self) -> Option<Instant> {
        matches!(self.state, ImportState::AwaitImport | ImportState::Ready).then_some(self.deadline)
    }

    pub fn timed_out(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }
}

fn import_name(s: ImportState) -> &'static str {
    match s {
        ImportState::AwaitImport => "awaiting import",
        ImportState::Opening => "opening",
        ImportState::Ready => "ready",
        ImportState::Finished => "finished",
    }
}
