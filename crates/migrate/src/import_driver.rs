//! The home agent's whole side of one migration, as a driver in the style of quinn-proto's
//! `Connection`: the caller feeds it the dispatcher's bytes ([`ImportDriver::handle`]), the
//! stream's end ([`ImportDriver::closed`]) and the time ([`ImportDriver::handle_timeout`] at
//! [`ImportDriver::poll_timeout`]); it writes what [`ImportDriver::poll_transmit`] gives and
//! does what [`ImportDriver::poll_step`] asks, in order. Opening the sealed object (the
//! cluster key, the replay guard, the record layer) is asked of the caller, who answers with
//! [`ImportDriver::opened`].
//!
//! The side's decisions are here: answer Ready or Refused, use the keys only on Commit, and
//! drop them unused on Abort, a broken or ended stream, or a dispatcher that never decides.
//! The agent's tokio shell and the in-memory harness both run this same driver.

use std::collections::VecDeque;
use std::time::Instant;

use crate::frame::{MigrationError, RefuseReason};
use crate::import::{ImportEvent, Importer};
use crate::timeouts::Timeouts;

/// Why an import did not carry the connection on, as the agent counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportFailure {
    /// The object opened, but the dispatcher never committed it here (Abort, a reset or
    /// ended stream, or its deadline).
    Uncommitted,
    /// The stream broke the protocol.
    Protocol(MigrationError),
}

/// What the caller must do next, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum ImportStep {
    /// Open this sealed session object (bound to the link and token the stream came with);
    /// answer with [`ImportDriver::opened`].
    Open(Vec<u8>),
    /// Count this failure.
    Failed(ImportFailure),
    /// The dispatcher's decision: serve the opened session, starting with `ciphertext` (the
    /// client bytes it held), then what the stream brings.
    Commit { ciphertext: Vec<u8> },
    /// Drop the keys, if any, unused; close the stream.
    Close,
}

/// The home agent's side of one migration: a link stream that starts with Import.
#[derive(Debug)]
pub struct ImportDriver {
    machine: Importer,
    transmit: VecDeque<Vec<u8>>,
    steps: VecDeque<ImportStep>,
    opened: bool,
    finished: bool,
}

impl ImportDriver {
    /// A stream that should bring Import within the import timeout of `now`.
    pub fn new(timeouts: Timeouts, now: Instant) -> Self {
        Self {
            machine: Importer::new(timeouts, now),
            transmit: VecDeque::new(),
            steps: VecDeque::new(),
            opened: false,
            finished: false,
        }
    }

    /// Bytes to write to the dispatcher, in order.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.pop_front()
    }

    /// The next thing to do.
    pub fn poll_step(&mut self) -> Option<ImportStep> {
        self.steps.pop_front()
    }

    /// When [`ImportDriver::handle_timeout`] is due: while it waits for the Import, or for the
    /// decision after Ready.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.finished {
            true => None,
            false => self.machine.deadline(),
        }
    }

    /// Whether the driver is done (nothing more to read for it).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The time is `now`: a dispatcher that let the deadline pass gets the stream closed, the
    /// keys dropped unused.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.finished && self.machine.timed_out(now) {
            self.closed();
        }
    }

    /// The stream ended, was reset (the dispatcher went another way) or broke.
    pub fn closed(&mut self) {
        if self.finished {
            return;
        }
        if self.opened {
            self.steps
                .push_back(ImportStep::Failed(ImportFailure::Uncommitted));
        }
        self.close();
    }

    /// Bytes from the dispatcher.
    pub fn handle(&mut self, _now: Instant, data: &[u8]) {
        if self.finished {
            return;
        }
        match self.machine.from_dispatcher(data) {
            Ok(None) => {}
            Ok(Some(ImportEvent::Open(sealed))) => self.steps.push_back(ImportStep::Open(sealed)),
            Ok(Some(ImportEvent::Commit { ciphertext })) => {
                self.finished = true;
                self.steps.push_back(ImportStep::Commit { ciphertext });
            }
            Ok(Some(ImportEvent::Aborted)) => {
                self.steps
                    .push_back(ImportStep::Failed(ImportFailure::Uncommitted));
                self.close();
            }
            Err(e) => {
                self.steps
                    .push_back(ImportStep::Failed(ImportFailure::Protocol(e)));
                self.close();
            }
        }
    }

    /// The answer to [`ImportStep::Open`] at `now`: the object opened (Ready; the keys stay
    /// unused until Commit), or why it did not (Refused; the stream is done).
    pub fn opened(&mut self, result: Result<(), RefuseReason>, now: Instant) {
        let answer = match result {
            Ok(()) => self.machine.ready(now),
            Err(reason) => self.machine.refuse(reason),
        };
        match answer {
            Ok(frame) => self.transmit.push_back(frame),
            Err(_) => return self.close(),
        }
        match result {
            Ok(()) => self.opened = true,
            Err(_) => self.close(),
        }
    }

    fn close(&mut self) {
        self.finished = true;
        self.steps.push_back(ImportStep::Close);
    }
}
