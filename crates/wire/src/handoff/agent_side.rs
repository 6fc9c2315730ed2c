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

use super::{Frame, HandoffError, RefuseReason, Splitter, BINDING_LEN, MAX_HELD};

/// What the handshake agent must do next.
#[derive(Debug, PartialEq, Eq)]
pub enum ExportEvent {
    /// The dispatcher answered Leave with where to move (in [`ExportInput::moved`]): seal
    /// for this home agent and binding. The machine waits for Frozen next, as after a Freeze.
    Move {
        home: u16,
        binding: [u8; BINDING_LEN],
    },

    /// The dispatcher answered Leave with Stay: carry on with the TLS engine, feeding it
    /// `ciphertext` (client bytes after the answer) first.
    Stay { ciphertext: Vec<u8> },
    /// Every client record before the freeze has been given out to decrypt: extract and seal
    /// the session, then [`Exporter::switch`] (or [`Exporter::abort`]).
    Frozen,
    /// The dispatcher acknowledged an abort at the boundary: carry on with the TLS engine,
    /// feeding it `ciphertext` (client records that came after the plaintext cap) first.
    Keep { ciphertext: Vec<u8> },
    /// The home agent has the connection: drop the keys, close the stream.
    Migrated,
    /// The home agent did not take it: serve the session here, from the record layer, starting
    /// with `ciphertext` (client bytes the dispatcher held during the move).
    ServeHere { ciphertext: Vec<u8> },
}

/// The result of one [`Exporter::from_dispatcher`] call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExportInput {
    /// Client records to decrypt now (before the freeze), in order.
    pub decrypt: Vec<u8>,
    /// [`ExportEvent::Move`], when the dispatcher's answer to Leave came in this input (an
    /// `event` may follow it in the same input).
    pub moved: Option<ExportEvent>,
    pub event: Option<ExportEvent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExportState {
    /// Leave sent: client records are decrypted (their plaintext carried, if the connection
    /// moves) until the dispatcher's Offer or Stay.
    Leaving,
    /// Freeze sent; client records until Frozen are decrypted and their plaintext carried.
    Freezing,
    /// Over the plaintext cap: Abort sent; records until Frozen are kept as ciphertext.
    Aborting,
    /// Frozen arrived; the caller extracts.
    Frozen,
    /// Switch sent: waiting for Done or Resume; nothing may be sent.
    Switched,
    /// Finished one way or another.
    Finished,
}

/// The handshake agent's side of one migration, from its Freeze to the dispatcher's verdict.
#[derive(Debug)]
pub struct Exporter {
    state: ExportState,
    splitter: Splitter,
    cap: usize,
    plaintext: usize,
    kept: Vec<u8>,
    timeout: Duration,
    deadline: Instant,
}

impl Exporter {
    /// Starts a migration at `now` (the handshake is done and its last flight is on the wire):
    /// returns the machine and the Freeze frame to send. `cap` bounds the client plaintext the
    /// session object may carry; `timeout` each wait on the dispatcher.
    pub fn freeze(cap: usize, timeout: Duration, now: Instant) -> (Self, Vec<u8>) {
        let me = Self {
            state: ExportState::Freezing,
            splitter: Splitter::new(),
            cap,
            plaintext: 0,
            kept: Vec::new(),
            timeout,
            deadline: now + timeout * 2,
        };
        (me, Frame::Freeze.to_bytes())
    }

    /// Starts moving an established connection at `now` because this agent drains: the
    /// machine and the Leave frame to send. Nothing may be sent to the client from here on
    /// (the last response is on the wire). The dispatcher answers with an Offer
    /// ([`ExportEvent::Move`]; then as after [`Exporter::freeze`]) or Stay.
    pub fn leave(cap: usize, timeout: Duration, now: Instant) -> (Self, Vec<u8>) {
        let (mut me, _) = Self::freeze(cap, timeout, now);
        me.state = ExportState::Leaving;
        (me, Frame::Leave.to_bytes())
    }

    /// Where the client's stream stood when the TLS engine stopped reading it: `read` has
    /// [tracked](Splitter::track) every client byte the engine took during the handshake. The
    /// engine reads in chunks, so the handshake may end with part of a record inside it and the
    /// rest still on the stream; without this the rest would be read as a record header.
    pub fn continue_from(&mut self, read: Splitter) {
        if matches!(self.state, ExportState::Freezing | ExportState::Leaving) {
            self.splitter = read;
        }
    }

    /// Bytes from the dispatcher. An error means the stream broke the protocol: close it.
    pub fn from_dispatcher(&mut self, mut data: &[u8]) -> Result<ExportInput, HandoffError> {
        let mut out = ExportInput::default();
        while !data.is_empty() {
            match self.state {
                ExportState::Freezing | ExportState::Aborting | ExportState::Leaving => {}
                ExportState::Switched => return self.verdict(data),
                s => return Err(HandoffError::Unexpected("bytes", export_name(s))),
            }
            let split = self.splitter.split(data)?;
            data = &data[split.consumed..];
            if self.state == ExportState::Aborting {
                if self.kept.len() + split.tls.len() > MAX_HELD {
                    return Err(HandoffError::Unexpected("too many records", "aborting"));
                }
                self.kept.extend_from_slice(&split.tls);
            } else {
                out.decrypt.extend_from_slice(&split.tls);
            }
            match split.frame {
                None => {}
                // Records and Frozen may follow in the same input: they are read on.
                Some(Frame::Offer { home, binding }) if self.state == ExportState::Leaving => {
                    self.state = ExportState::Freezing;
                    out.moved = Some(ExportEvent::Move { home, binding });
                }
                Some(Frame::Stay) if self.state == ExportState::Leaving => {
                    self.state = ExportState::Finished;
                    out.event = Some(ExportEvent::Stay {
                        ciphertext: data.to_vec(),
                    });
                    return Ok(out);
                }
                // After an abort, the client's bytes follow Frozen at once: they are the
                // TLS engine's, like those kept since the cap.
                Some(Frame::Frozen) if self.state == ExportState::Aborting => {
                    self.state = ExportState::Finished;
                    let mut ciphertext = std::mem::take(&mut self.kept);
                    ciphertext.extend_from_slice(data);
                    out.event = Some(ExportEvent::Keep { ciphertext });
                    return Ok(out);
                }
                // Otherwise the dispatcher holds every client byte after Frozen until its
                // verdict.
                Some(Frame::Frozen) if data.is_empty() && self.state == ExportState::Freezing => {
                    self.state = ExportState::Frozen;
                    out.event = Some(ExportEvent::Frozen);
                }
                Some(f) => return Err(HandoffError::Unexpected(f.name(), export_name(self.state))),
            }
        }
        Ok(out)
    }

    fn verdict(&mut self, data: &[u8]) -> Result<ExportInput, HandoffError> {
        let split = self.splitter.split(data)?;
        if !split.tls.is_empty() {
            return Err(HandoffError::Unexpected("TLS", "switched"));
        }
        let event = match split.frame {
            None => None,
            Some(Frame::Done) if split.consumed == data.len() => Some(ExportEvent::Migrated),
            Some(Frame::Resume) => Some(ExportEvent::ServeHere {
                ciphertext: data[split.consumed..].to_vec(),
            }),
            Some(f) => return Err(HandoffError::Unexpected(f.name(), "switched")),
        };
        if event.is_some() {
            self.state = ExportState::Finished;
        }
        Ok(ExportInput {
            event,
            ..ExportInput::default()
        })
    }

    /// `n` more bytes of client plaintext came out of the records given to decrypt. Past the
    /// cap, returns the Abort frame to send at once: the connection stays here, and what the
    /// client sends until Frozen is kept as ciphertext instead of decrypted.
    pub fn decrypted(&mut self, n: usize) -> Option<Vec<u8>> {
        self.plaintext += n;
        // While leaving nobody can take an Abort yet; the cap applies once the move starts
        // (the caller reports the records before it then).
        if self.state == ExportState::Freezing && self.plaintext > self.cap {
            self.state = ExportState::Aborting;
            return Some(Frame::Abort.to_bytes());
        }
        None
    }

    /// Client plaintext decrypted so far.
    pub fn plaintext(&self) -> usize {
        self.plaintext
    }

    /// The sealed session object is ready: the Switch frame to send. From here the keys are
    /// not this agent's to use until a Resume.
    pub fn switch(&mut self, sealed: Vec<u8>, now: Instant) -> Result<Vec<u8>, HandoffError> {
        if self.state != ExportState::Frozen {
            return Err(HandoffError::Unexpected("Switch", export_name(self.state)));
        }
        self.state = ExportState::Switched;
        self.deadline = now + self.timeout * 2;
        Ok(Frame::Switch(sealed).to_bytes())
    }

    /// Extraction or sealing failed after Frozen: the Abort frame; the dispatcher then gives
    /// this agent the held bytes, and it keeps the connection.
    pub fn abort(&mut self) -> Result<Vec<u8>, HandoffError> {
        if self.state != ExportState::Frozen {
            return Err(HandoffError::Unexpected("Abort", export_name(self.state)));
        }
        self.state = ExportState::Finished;
        Ok(Frame::Abort.to_bytes())
    }

    /// When the caller must give up waiting on the dispatcher (close without using the keys).
    pub fn deadline(&self) -> Option<Instant> {
        matches!(
            self.state,
            ExportState::Leaving
                | ExportState::Freezing
                | ExportState::Aborting
                | ExportState::Switched
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
        ExportState::Freezing => "freezing",
        ExportState::Aborting => "aborting",
        ExportState::Frozen => "frozen",
        ExportState::Switched => "switched",
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
