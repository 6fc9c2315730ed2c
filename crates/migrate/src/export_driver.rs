//! The handshake agent's whole side of one migration, as a driver in the style of quinn-proto's
//! `Connection`: the caller feeds it the dispatcher's bytes ([`ExportDriver::handle`]), its
//! stream's end ([`ExportDriver::closed`], [`ExportDriver::released`]) and the time
//! ([`ExportDriver::handle_timeout`] at [`ExportDriver::poll_timeout`]); it writes what
//! [`ExportDriver::poll_transmit`] gives and does what [`ExportDriver::poll_step`] asks, in
//! order. The steps that need the TLS engine (decrypting client records, taking the session
//! out and sealing it) are asked of the caller, who answers with
//! [`ExportDriver::decrypted`] and [`ExportDriver::extracted`].
//!
//! Every decision of the side is here: declining an Offer it cannot honour, cutting at the
//! handshake's last whole record, keeping the connection past the plaintext cap or when the
//! session cannot be taken out, Kept instead of Switch when the object cannot be sealed or a
//! TLS 1.3 session lacks its traffic secrets, what each failure counts as, and giving up on a
//! silent dispatcher by closing. The agent's tokio shell and the in-memory harness both run
//! this same driver.

use std::collections::VecDeque;
use std::time::Instant;

use crate::export::{ExportEvent, Exporter};
use crate::frame::{Frame, Splitter, BINDING_LEN};
use crate::timeouts::Timeouts;

/// Why an attempt did not migrate, as the agent counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFailure {
    /// A TLS 1.3 session without its traffic secrets (or no cluster key): it stays.
    NoSecrets,
    /// More client plaintext than a session object may carry: it stays.
    TooMuchPlaintext,
    /// The session could not be taken out, or its object not sealed.
    Export,
    /// The home agent did not take it: served here after the dispatcher's Resume.
    FellBack,
    /// The dispatcher's stream broke the protocol, ended, or went silent.
    Protocol,
}

/// What the caller must do next, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum ExportStep {
    /// The Offer names this agent: nothing to move (counted, not a failure).
    Declined,
    /// Count this failure.
    Failed(ExportFailure),
    /// Push what the TLS engine still has to send (the handshake's tickets) out of it, into
    /// the writes held for the frame that follows: the session cannot be taken out with
    /// records queued, and its send sequence must count them.
    FlushEngine,
    /// Give the engine these client records and keep all the plaintext it then holds; answer
    /// with [`ExportDriver::decrypted`].
    Decrypt(Vec<u8>),
    /// At the cut: take the session out of the engine (if it can be without loss) for this
    /// home agent, seal it bound to `binding`; answer with [`ExportDriver::extracted`].
    Extract {
        home: u16,
        binding: [u8; BINDING_LEN],
    },
    /// Nothing was taken out: the engine serves on, after the plaintext decrypted so far;
    /// first decrypting `ciphertext` (client bytes that came after the dispatcher's answer),
    /// if any; following the client's records on from `records`, if given.
    Keep {
        ciphertext: Option<Vec<u8>>,
        records: Option<Splitter>,
    },
    /// The home agent did not take the extracted session: serve it here, from the record
    /// layer, starting with `ciphertext` (the client's bytes from the cut on).
    ServeHere { ciphertext: Vec<u8> },
    /// The home agent has the connection: drop the keys, close the stream.
    Migrated,
    /// Close the stream without using the keys.
    Close,
}

/// How taking the session out went ([`ExportStep::Extract`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Extraction {
    /// It could not be taken out without loss: nothing was, the engine is intact.
    NotExtractable,
    /// Taking it out failed after the engine was given up: the connection is lost.
    Failed,
    /// Taken out. `sealed`: the object sealed for the home agent (`None`: it could not be);
    /// `keyless`: a TLS 1.3 session without the traffic secrets its keys came from (the next
    /// KeyUpdate would break it at the home agent).
    Extracted {
        sealed: Option<Vec<u8>>,
        keyless: bool,
    },
}

/// What the driver waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The caller decrypts what the engine read in the handshake.
    Decrypting,
    /// Leave sent: decrypting client records until the dispatcher's Offer or Stay.
    Leaving,
    /// The caller decrypts records that came before the Offer (or Stay) queued behind.
    LeaveDecrypting,
    /// The caller extracts and seals.
    Extracting,
    /// Switch or Kept sent: the dispatcher's verdict.
    Verdict,
    Finished,
}

/// The handshake agent's side of one migration: after a handshake the dispatcher offered to
/// hand on ([`ExportDriver::handshake`]), or for a connection its draining agent moves
/// ([`ExportDriver::leave`]).
#[derive(Debug)]
pub struct ExportDriver {
    x: Option<Exporter>,
    phase: Phase,
    transmit: VecDeque<Vec<u8>>,
    steps: VecDeque<ExportStep>,
    /// Where to, once known.
    offer: Option<(u16, [u8; BINDING_LEN])>,
    /// Client bytes after the Offer consumed (0 after a Leave).
    cut: u32,
    /// After a handshake: where the client's records stood in what the engine read, to
    /// follow them on if the connection stays.
    read: Option<Splitter>,
    /// Kept sent (rather than Switch): a Resume is expected, not a fallback.
    kept: bool,
}

/// A handshake the dispatcher offered to move (its Offer came before the ClientHello).
#[derive(Debug)]
pub struct Offered {
    /// This agent's id.
    pub me: u16,
    /// The Offer.
    pub home: u16,
    pub binding: [u8; BINDING_LEN],
    /// Whether this agent can move a session at all: a cluster key to seal with, and for TLS
    /// 1.3 the session's traffic secrets.
    pub usable: bool,
    /// Where the client's records stand in what the engine read during the handshake
    /// (`None`: they were not followed).
    pub read: Option<Splitter>,
    /// The end of the last whole client record the engine read, in bytes after the Offer.
    pub boundary: u64,
}

impl ExportDriver {
    fn new(x: Option<Exporter>, phase: Phase) -> Self {
        Self {
            x,
            phase,
            transmit: VecDeque::new(),
            steps: VecDeque::new(),
            offer: None,
            cut: 0,
            read: None,
            kept: false,
        }
    }

    /// The handshake is done at `now` on a connection the dispatcher offered to hand on
    /// (before any application data was read). `cap` bounds the client plaintext the session
    /// object may carry.
    pub fn handshake(o: Offered, cap: usize, timeouts: Timeouts, now: Instant) -> Self {
        if o.home == o.me || !o.usable {
            let mut d = Self::new(None, Phase::Finished);
            d.steps.push_back(match o.home == o.me {
                true => ExportStep::Declined,
                false => ExportStep::Failed(ExportFailure::NoSecrets),
            });
            d.transmit.push_back(Frame::Decline.to_bytes());
            d.steps.push_back(ExportStep::Keep {
                ciphertext: None,
                records: o.read,
            });
            return d;
        }
        // The cut: the end of the last whole client record the engine has read. A record it
        // read part of is not consumed: its sequence number stays unused, the engine drops
        // its bytes at extraction, and the dispatcher's copy has them for whoever serves on.
        let (Some(read), Ok(cut)) = (o.read, u32::try_from(o.boundary)) else {
            let mut d = Self::new(None, Phase::Finished);
            d.fail(ExportFailure::Protocol);
            return d;
        };
        let mut x = Exporter::cut(cap, timeouts, now);
        x.continue_from(read.clone());
        let mut d = Self::new(Some(x), Phase::Decrypting);
        d.offer = Some((o.home, o.binding));
        d.cut = cut;
        d.read = Some(read);
        // Every whole record the engine has read is decrypted now: a TLS 1.3 client's first
        // request rides with its Finished, and may already be decrypted inside it.
        d.steps.push_back(ExportStep::FlushEngine);
        d.steps.push_back(ExportStep::Decrypt(Vec::new()));
        d
    }

    /// This agent drains: moves a connection it is idle on (every response byte on the wire;
    /// nothing more goes to the client from here). `read`: where the client's records stand
    /// (`None`: not followed from the first byte, it cannot move); `usable` as in
    /// [`Offered::usable`]. Returns the driver and the Leave frame to write, or no frame when
    /// the connection cannot move (the driver then asks to keep it).
    pub fn leave(
        usable: bool,
        read: Option<Splitter>,
        cap: usize,
        timeouts: Timeouts,
        now: Instant,
    ) -> (Self, Option<Vec<u8>>) {
        let Some(read) = read.filter(|_| usable) else {
            let mut d = Self::new(None, Phase::Finished);
            d.steps.push_back(ExportStep::Keep {
                ciphertext: None,
                records: None,
            });
            return (d, None);
        };
        let (mut x, leave) = Exporter::leave(cap, timeouts, now);
        x.continue_from(read);
        (Self::new(Some(x), Phase::Leaving), Some(leave))
    }

    /// Bytes to write to the dispatcher, in order (each after what the handshake left held).
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.pop_front()
    }

    /// The next thing to do.
    pub fn poll_step(&mut self) -> Option<ExportStep> {
        self.steps.pop_front()
    }

    /// When [`ExportDriver::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Leaving | Phase::Verdict => self.x.as_ref().and_then(Exporter::deadline),
            _ => None,
        }
    }

    /// The time is `now`: a dispatcher that let the deadline pass gets the stream closed,
    /// never the keys used.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due = self.poll_timeout().is_some_and(|d| now >= d);
        if due {
            self.fail(ExportFailure::Protocol);
        }
    }

    /// Whether the driver is done (nothing more to read for it).
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Bytes from the dispatcher.
    pub fn handle(&mut self, _now: Instant, data: &[u8]) {
        let Some(x) = self.x.as_mut() else { return };
        match self.phase {
            Phase::Leaving => {
                let Ok(input) = x.from_dispatcher(data) else {
                    return self.fail(ExportFailure::Protocol);
                };
                self.steps.push_back(ExportStep::Decrypt(input.decrypt));
                match (input.moved, input.event) {
                    (Some(ExportEvent::Move { home, binding }), None) => {
                        self.offer = Some((home, binding));
                        self.phase = Phase::LeaveDecrypting;
                    }
                    (None, None) => {}
                    // Nowhere to go: the engine reads on from what came after the answer.
                    (None, Some(ExportEvent::Stay { ciphertext })) => {
                        self.phase = Phase::Finished;
                        self.steps.push_back(ExportStep::Keep {
                            ciphertext: Some(ciphertext),
                            records: None,
                        });
                    }
                    _ => self.fail(ExportFailure::Protocol),
                }
            }
            Phase::Verdict => {
                let event = x.from_dispatcher(data).map(|input| input.event);
                self.verdict(event);
            }
            _ => self.fail(ExportFailure::Protocol),
        }
    }

    /// The dispatcher released the stream (after Switch, that is Done).
    pub fn released(&mut self) {
        match (self.phase, self.x.as_mut()) {
            (Phase::Verdict, Some(x)) => {
                let event = x.released().map(Some);
                self.verdict(event);
            }
            _ => self.fail(ExportFailure::Protocol),
        }
    }

    /// The dispatcher's stream ended or broke before the migration did.
    pub fn closed(&mut self) {
        if self.phase != Phase::Finished {
            self.fail(ExportFailure::Protocol);
        }
    }

    fn verdict(&mut self, event: Result<Option<ExportEvent>, crate::MigrationError>) {
        match event {
            Ok(None) => {}
            Ok(Some(ExportEvent::Migrated)) => {
                self.phase = Phase::Finished;
                self.steps.push_back(ExportStep::Migrated);
            }
            Ok(Some(ExportEvent::ServeHere { ciphertext })) => {
                self.phase = Phase::Finished;
                if !self.kept {
                    self.steps
                        .push_back(ExportStep::Failed(ExportFailure::FellBack));
                }
                self.steps.push_back(ExportStep::ServeHere { ciphertext });
            }
            Ok(Some(_)) | Err(_) => self.fail(ExportFailure::Protocol),
        }
    }

    /// The answer to [`ExportStep::Decrypt`]: `n` more bytes of plaintext, or the records did
    /// not decrypt (the engine's alert ends the connection).
    pub fn decrypted(&mut self, n: Result<usize, ()>) {
        let Ok(n) = n else {
            self.steps.clear();
            self.phase = Phase::Finished;
            self.steps.push_back(ExportStep::Close);
            return;
        };
        let Some(x) = self.x.as_mut() else { return };
        x.decrypted(n);
        let at_cut = match self.phase {
            Phase::Decrypting => true,
            // the Offer came: the records before it are all decrypted once the queue is
            Phase::LeaveDecrypting => !self
                .steps
                .iter()
                .any(|s| matches!(s, ExportStep::Decrypt(_))),
            _ => false,
        };
        if !at_cut {
            return;
        }
        if !x.within_cap() {
            self.steps
                .push_back(ExportStep::Failed(ExportFailure::TooMuchPlaintext));
            // After a handshake the records are followed on from where the engine stood;
            // after a Leave's Offer the dispatcher gives back the bytes it held.
            let records = self.read.take();
            return self.abort(records);
        }
        let Some((home, binding)) = self.offer else {
            return self.fail(ExportFailure::Protocol);
        };
        self.phase = Phase::Extracting;
        self.steps.push_back(ExportStep::Extract { home, binding });
    }

    /// The answer to [`ExportStep::Extract`], at `now`.
    pub fn extracted(&mut self, how: Extraction, now: Instant) {
        let Some(x) = self.x.as_mut().filter(|_| self.phase == Phase::Extracting) else {
            return self.fail(ExportFailure::Protocol);
        };
        let (sealed, keyless) = match how {
            Extraction::NotExtractable => {
                self.steps
                    .push_back(ExportStep::Failed(ExportFailure::Export));
                return self.abort(None);
            }
            Extraction::Failed => return self.fail(ExportFailure::Export),
            Extraction::Extracted { sealed, keyless } => (sealed, keyless),
        };
        // A TLS 1.3 session moves only with the traffic secrets its keys came from; one that
        // cannot move is served here from the record layer, from the cut (Kept).
        let frame = match sealed.filter(|s| Frame::fits(s.len()) && !keyless) {
            Some(sealed) => x.switch(self.cut, sealed, now),
            None => {
                self.steps.push_back(ExportStep::Failed(match keyless {
                    true => ExportFailure::NoSecrets,
                    false => ExportFailure::Export,
                }));
                self.kept = true;
                x.kept(self.cut, now)
            }
        };
        match frame {
            Ok(frame) => {
                self.transmit.push_back(frame);
                self.phase = Phase::Verdict;
            }
            Err(_) => {
                self.phase = Phase::Finished;
                self.steps.push_back(ExportStep::Close);
            }
        }
    }

    /// Nothing taken out, and the connection stays: Abort, and the engine serves on.
    fn abort(&mut self, records: Option<Splitter>) {
        self.phase = Phase::Finished;
        match self.x.as_mut().map(Exporter::abort) {
            Some(Ok(abort)) => {
                self.transmit.push_back(abort);
                self.steps.push_back(ExportStep::Keep {
                    ciphertext: None,
                    records,
                });
            }
            _ => self.steps.push_back(ExportStep::Close),
        }
    }

    fn fail(&mut self, why: ExportFailure) {
        self.phase = Phase::Finished;
        self.steps.push_back(ExportStep::Failed(why));
        self.steps.push_back(ExportStep::Close);
    }
}
