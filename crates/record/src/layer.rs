//! [`RecordLayer`]: one established connection's record layer, sans-IO like rustls'
//! `Connection`. The caller pumps bytes: ciphertext in with [`RecordLayer::read_tls`] and
//! [`RecordLayer::process`], plaintext out with [`RecordLayer::plaintext`]; plaintext in with
//! [`RecordLayer::write_plaintext`], ciphertext out with [`RecordLayer::pending_tls`]. Every
//! buffer is bounded; when one is full the calls that would grow it take nothing (return 0,
//! or stop early) until the caller drains it.

use crate::cipher::MAX_PLAINTEXT_LEN;
use crate::deframer::Deframer;
use crate::error::Error;
use crate::handshake::HandshakeJoiner;
use crate::key_schedule::TrafficSecret;
use crate::keys::{DirectionSecrets, SessionKeys};
use crate::message::{Alert, AlertDescription, ContentType, KeyUpdateRequest};
use crate::opener::Opener;
use crate::protocol::{Conn, Keys, Role, Tx};
use crate::sealer::Sealer;
use crate::suite::{Suite, Version};

/// The most decrypted application data held for the caller: `process` stops decrypting while
/// a further full record might not fit under it (so it never holds more than this).
pub const PLAINTEXT_LIMIT: usize = 64 * 1024;

/// The most ciphertext queued for sending by `write_plaintext`: it takes only what fits
/// below this, and `process` stops (answering KeyUpdates, refusing renegotiation) while the
/// queue is above it. Control records may exceed it by a few hundred bytes
/// ([`MAX_PENDING_TLS`]).
pub const OUTGOING_LIMIT: usize = 64 * 1024;

/// The most ciphertext ever queued for sending because of the peer's input and
/// `write_plaintext`: [`OUTGOING_LIMIT`] plus room for the control records (a KeyUpdate
/// answer or a no_renegotiation warning, and a fatal alert) one record can trigger. Only the
/// caller's own `send_key_update` / `send_close_notify` calls go beyond it.
pub const MAX_PENDING_TLS: usize = OUTGOING_LIMIT + 256;

/// The record layer of one established connection.
pub struct RecordLayer {
    input: Deframer,
    joiner: HandshakeJoiner,
    conn: Conn,
}

impl RecordLayer {
    /// The server side of a migrated session. Checks key and secret lengths against the suite.
    /// A TLS 1.3 traffic secret may be of an earlier generation than its key: it is followed
    /// to the key's generation at that direction's first KeyUpdate, and a secret that derives
    /// no generation of the key then fails the update ([`Error::InvalidKeys`]) rather than
    /// derive a key already used.
    pub fn new(keys: SessionKeys) -> Result<Self, Error> {
        Self::with_role(keys, Role::Server)
    }

    /// Like [`Self::new`], for either end (the client side is for tests and tools).
    pub fn with_role(keys: SessionKeys, role: Role) -> Result<Self, Error> {
        let SessionKeys {
            version,
            suite,
            ref tx,
            ref rx,
        } = keys;
        let tx_secret = traffic_secret(version, suite, tx)?;
        let rx_secret = traffic_secret(version, suite, rx)?;
        let tx = Keys {
            cipher: Sealer::new(version, suite, &tx.key, &tx.iv, tx.seq)?,
            secret: tx_secret,
            followed: false,
        };
        let rx = Keys {
            cipher: Opener::new(version, suite, &rx.key, &rx.iv, rx.seq)?,
            secret: rx_secret,
            followed: false,
        };
        Ok(Self {
            input: Deframer::new(version),
            joiner: HandshakeJoiner::default(),
            conn: Conn::new(version, suite, role, rx, tx),
        })
    }

    /// Ciphertext from the peer. Copies as much as the bounded input buffer takes (it holds
    /// at most one maximum-size record, [`crate::INPUT_LIMIT`], that `process` has not used)
    /// and returns the count; 0 means: call `process`, drain the plaintext and pending TLS,
    /// then offer the rest again. After the peer's close_notify or a fatal error, input is
    /// discarded and counted as taken.
    pub fn read_tls(&mut self, data: &[u8]) -> usize {
        if self.conn.failed.is_some() || self.conn.peer_closed {
            return data.len();
        }
        self.input.read(data)
    }

    /// Decrypts every complete buffered record, stopping while the plaintext buffer could not
    /// take another full record ([`PLAINTEXT_LIMIT`]) or the outgoing one is over
    /// [`OUTGOING_LIMIT`]. Handles KeyUpdate (TLS 1.3: new receiving keys; if the peer asked,
    /// our own KeyUpdate(update_not_requested) under the current sending key, then new sending
    /// keys), alerts and close_notify.
    ///
    /// On a fatal error it queues the matching alert ([`Error::alert`]) for sending and
    /// returns the error; the connection is then dead, and every later call returns the same
    /// error. Plaintext decrypted before the error stays readable.
    pub fn process(&mut self) -> Result<(), Error> {
        if let Some(e) = &self.conn.failed {
            return Err(e.clone());
        }
        self.process_records().inspect_err(|e| self.fail(e.clone()))
    }

    fn process_records(&mut self) -> Result<(), Error> {
        loop {
            if self.conn.peer_closed {
                // RFC 8446 6.1: anything after close_notify is ignored.
                self.input.clear();
                return Ok(());
            }
            if self.conn.plaintext.len() > PLAINTEXT_LIMIT - MAX_PLAINTEXT_LEN
                || self.conn.outgoing.len() > OUTGOING_LIMIT
            {
                return Ok(());
            }
            let Some(record) = self.input.peek()? else {
                return Ok(());
            };
            let payload = self.input.payload_mut(&record);
            let opened = self.conn.rx.cipher.open(&record.header, payload)?;
            let body = payload.get(opened.range).unwrap_or_default();
            self.conn.record(opened.typ, body, &mut self.joiner)?;
            self.input.consume(&record);
        }
    }

    /// Marks the connection dead and queues the fatal alert, if the error has one.
    fn fail(&mut self, error: Error) {
        if let Some(description) = error.alert() {
            if self.conn.tx_state == Tx::Open {
                let alert = Alert::fatal(description);
                // If even the alert cannot be sealed (sequence exhausted), close silently.
                let _ = self.conn.seal_control(ContentType::ALERT, &alert.encode());
            }
        }
        self.input.clear();
        self.conn.failed = Some(error);
    }

    /// Decrypted application data not taken yet.
    pub fn plaintext(&self) -> &[u8] {
        self.conn.plaintext.as_slice()
    }

    /// Takes `n` bytes of plaintext (at most what there is).
    pub fn consume_plaintext(&mut self, n: usize) {
        self.conn.plaintext.consume(n);
    }

    /// Whether the peer sent close_notify: no plaintext comes after what is buffered.
    pub fn peer_closed(&self) -> bool {
        self.conn.peer_closed
    }

    /// Seals application data into records of at most 16 KiB of plaintext each, appended to
    /// the outgoing buffer, and returns how much it took: only whole records that fit under
    /// [`OUTGOING_LIMIT`] (so 0 when it is full: send `pending_tls` first).
    ///
    /// Before sealing with a worn-out key ([`Sealer::is_worn_out`]) it sends a KeyUpdate
    /// (TLS 1.3 with a traffic secret) or, failing that, close_notify and returns
    /// [`Error::KeyExhausted`] (or the count taken before, the error coming on the next call).
    pub fn write_plaintext(&mut self, data: &[u8]) -> Result<usize, Error> {
        self.check_can_send()?;
        let mut taken = 0;
        while taken < data.len() {
            if self.conn.tx.cipher.is_worn_out() && !self.refresh_worn_out_key() {
                return if taken > 0 {
                    Ok(taken)
                } else {
                    Err(Error::KeyExhausted)
                };
            }
            let chunk = &data[taken..data.len().min(taken + MAX_PLAINTEXT_LEN)];
            let record_len = self.conn.tx.cipher.record_len(chunk.len());
            if !self.conn.outgoing.is_empty()
                && self.conn.outgoing.len() + record_len > OUTGOING_LIMIT
            {
                break;
            }
            // the whole record at once, not grown by its header, body and tag in turn
            let out = self.conn.outgoing.tail();
            out.reserve(record_len);
            self.conn
                .tx
                .cipher
                .seal(ContentType::APPLICATION_DATA, chunk, out)?;
            taken += chunk.len();
        }
        Ok(taken)
    }

    /// Replaces a worn-out sending key by a KeyUpdate, or closes. Returns whether sending may
    /// go on.
    fn refresh_worn_out_key(&mut self) -> bool {
        if self.conn.version == Version::Tls13
            && self.conn.tx.secret.is_some()
            && self.conn.update_tx(KeyUpdateRequest::NotRequested).is_ok()
        {
            return true;
        }
        self.queue_close_notify();
        self.conn.tx_state = Tx::Exhausted;
        false
    }

    fn check_can_send(&self) -> Result<(), Error> {
        if let Some(e) = &self.conn.failed {
            return Err(e.clone());
        }
        match self.conn.tx_state {
            Tx::Open => Ok(()),
            Tx::Closed => Err(Error::AlreadyClosed),
            Tx::Exhausted => Err(Error::KeyExhausted),
        }
    }

    fn queue_close_notify(&mut self) {
        let alert = Alert::warning(AlertDescription::CLOSE_NOTIFY);
        // Sealing fails only at the hard sequence limit; then the TCP close has to do.
        let _ = self.conn.seal_control(ContentType::ALERT, &alert.encode());
    }

    /// Queues close_notify; nothing may be sent after it. Does nothing if the connection
    /// already failed or was closed.
    pub fn send_close_notify(&mut self) {
        if self.check_can_send().is_ok() {
            self.queue_close_notify();
            self.conn.tx_state = Tx::Closed;
        }
    }

    /// TLS 1.3 only: queues a KeyUpdate under the current sending key, then switches to the
    /// next generation. `request_peer` sets update_requested, so the peer updates its key
    /// too. TLS 1.2: [`Error::KeyUpdateUnsupported`]; without the sending traffic secret:
    /// [`Error::NoTrafficSecret`]. These refusals leave the connection as it was.
    pub fn send_key_update(&mut self, request_peer: bool) -> Result<(), Error> {
        self.check_can_send()?;
        let request = if request_peer {
            KeyUpdateRequest::Requested
        } else {
            KeyUpdateRequest::NotRequested
        };
        self.conn.update_tx(request)
    }

    /// Ciphertext to send.
    pub fn pending_tls(&self) -> &[u8] {
        self.conn.outgoing.as_slice()
    }

    /// Records that `n` bytes of [`Self::pending_tls`] were sent.
    pub fn consume_tls(&mut self, n: usize) {
        self.conn.outgoing.consume(n);
    }

    /// Whether there is ciphertext to send.
    pub fn wants_write(&self) -> bool {
        !self.conn.outgoing.is_empty()
    }

    /// The TLS version.
    pub fn version(&self) -> Version {
        self.conn.version
    }

    /// The AEAD.
    pub fn suite(&self) -> Suite {
        self.conn.suite
    }

    /// Which end we are.
    pub fn role(&self) -> Role {
        self.conn.role
    }

    /// The sequence number of our next record (under the current key generation).
    pub fn tx_seq(&self) -> u64 {
        self.conn.tx.cipher.seq()
    }

    /// The sequence number the peer's next record must carry (under the current generation).
    pub fn rx_seq(&self) -> u64 {
        self.conn.rx.cipher.seq()
    }

    /// The error that ended the connection, if one did.
    pub fn error(&self) -> Option<&Error> {
        self.conn.failed.as_ref()
    }

    /// Whether we may still send application data (no close_notify sent, no fatal error).
    pub fn may_send(&self) -> bool {
        self.check_can_send().is_ok()
    }

    /// Bytes of ciphertext received but not yet decrypted.
    pub fn buffered_tls(&self) -> usize {
        self.input.len()
    }

    /// Ciphertext received but not yet decrypted (a record's start, or records `process`
    /// has not reached): it begins at a record boundary.
    pub fn undecrypted(&self) -> &[u8] {
        self.input.as_slice()
    }

    /// Gives back the allocations of the buffers that hold nothing (ciphertext in, plaintext
    /// out, ciphertext out, a handshake message), so that a connection idling between requests
    /// holds its keys and little else; returns whether every buffer was empty. The buffers
    /// grow again as they are used.
    pub fn release_buffers(&mut self) -> bool {
        let input = self.input.release_if_empty();
        let joiner = self.joiner.release_if_idle();
        let plaintext = self.conn.plaintext.release_if_empty();
        let outgoing = self.conn.outgoing.release_if_empty();
        input && joiner && plaintext && outgoing
    }

    /// The session's keys as they stand, to carry the connection on elsewhere (an agent that
    /// drains moves it): per direction the current key, IV, next sequence number and (TLS 1.3)
    /// traffic secret, ready for [`RecordLayer::new`] there. `None` unless the layer is at
    /// rest: nothing undecrypted, no plaintext unread, nothing to send, no partial handshake
    /// message, open both ways, no error. From then on this layer must not be used: the keys
    /// and sequence numbers are the other end's.
    pub fn export(&self) -> Option<SessionKeys> {
        let c = &self.conn;
        let at_rest = self.input.len() == 0
            && self.joiner.is_idle()
            && c.plaintext.is_empty()
            && c.outgoing.is_empty()
            && !c.peer_closed
            && c.tx_state == Tx::Open
            && c.failed.is_none();
        if !at_rest {
            return None;
        }
        let direction =
            |(key, iv): (&[u8], &[u8; crate::suite::NONCE_LEN]),
             seq: u64,
             secret: &Option<crate::key_schedule::TrafficSecret>| {
                DirectionSecrets {
                    seq,
                    key: zeroize::Zeroizing::new(key.to_vec()),
                    iv: *iv,
                    traffic_secret: secret
                        .as_ref()
                        .map(|s| zeroize::Zeroizing::new(s.expose().to_vec())),
                }
            };
        Some(SessionKeys {
            version: c.version,
            suite: c.suite,
            tx: direction(c.tx.cipher.key_iv(), c.tx.cipher.seq(), &c.tx.secret),
            rx: direction(c.rx.cipher.key_iv(), c.rx.cipher.seq(), &c.rx.secret),
        })
    }
}

impl std::fmt::Debug for RecordLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordLayer")
            .field("version", &self.conn.version)
            .field("suite", &self.conn.suite)
            .field("role", &self.conn.role)
            .field("tx_seq", &self.tx_seq())
            .field("rx_seq", &self.rx_seq())
            .field("peer_closed", &self.conn.peer_closed)
            .field("failed", &self.conn.failed)
            .finish_non_exhaustive()
    }
}

/// The TLS 1.3 traffic secret of one direction's key; none in TLS 1.2. The secret may be of
/// an earlier generation than the key; it is followed to the key's generation at the
/// direction's first KeyUpdate, not here ([`crate::protocol::Keys::followed`]): a migrated
/// session pays those expansions only if it ever updates its keys.
fn traffic_secret(
    version: Version,
    suite: Suite,
    dir: &DirectionSecrets,
) -> Result<Option<TrafficSecret>, Error> {
    let Some(secret) = &dir.traffic_secret else {
        return Ok(None);
    };
    if version == Version::Tls12 {
        return Err(Error::InvalidKeys("TLS 1.2 has no traffic secret"));
    }
    TrafficSecret::new(suite, secret).map(Some)
}

#[cfg(test)]
#[path = "layer_test.rs"]
mod tests;
