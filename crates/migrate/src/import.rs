//! The home agent's side of a migration as a state machine: bytes from the dispatcher in,
//! events and frames out; the caller opens the session object and runs the sockets. It gives up
//! on a silent dispatcher by closing, never by using the keys: it serves only on Commit.

use std::time::Instant;

use crate::frame::{Frame, MigrationError, RefuseReason, Splitter};
use crate::timeouts::Timeouts;

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
    timeouts: Timeouts,
    deadline: Instant,
}

impl Importer {
    /// A stream that should bring Import within the import timeout of `now`.
    pub fn new(timeouts: Timeouts, now: Instant) -> Self {
        Self {
            state: ImportState::AwaitImport,
            splitter: Splitter::new(),
            timeouts,
            deadline: now + timeouts.import(),
        }
    }

    /// Bytes from the dispatcher. An error means the stream broke the protocol: close it.
    pub fn from_dispatcher(&mut self, data: &[u8]) -> Result<Option<ImportEvent>, MigrationError> {
        if data.is_empty() {
            return Ok(None);
        }
        let expect = match self.state {
            ImportState::AwaitImport | ImportState::Ready => self.state,
            s => return Err(MigrationError::Unexpected("bytes", import_name(s))),
        };
        let split = self.splitter.split(data)?;
        if !split.tls.is_empty() {
            return Err(MigrationError::Unexpected("TLS", import_name(expect)));
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
            (s, Some(f)) => return Err(MigrationError::Unexpected(f.name(), import_name(s))),
        };
        Ok(Some(event))
    }

    /// The object opened: the Ready frame to send. The keys stay unused until Commit, which
    /// must come within the timeout from `now`.
    pub fn ready(&mut self, now: Instant) -> Result<Vec<u8>, MigrationError> {
        if self.state != ImportState::Opening {
            return Err(MigrationError::Unexpected("Ready", import_name(self.state)));
        }
        self.state = ImportState::Ready;
        self.deadline = now + self.timeouts.verdict();
        Ok(Frame::Ready.to_bytes())
    }

    /// The object did not open: the Refused frame to send; the stream is done.
    pub fn refuse(&mut self, reason: RefuseReason) -> Result<Vec<u8>, MigrationError> {
        if self.state != ImportState::Opening {
            return Err(MigrationError::Unexpected(
                "Refused",
                import_name(self.state),
            ));
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
