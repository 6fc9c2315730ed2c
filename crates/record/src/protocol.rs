//! What the records of an established connection mean: application data goes to the
//! plaintext buffer; alerts close or kill the connection; KeyUpdate replaces a key; a TLS 1.2
//! renegotiation attempt is politely refused. Each rule is RFC 8446 / RFC 5246 as rustls
//! applies it, with rustls' limits on how often a peer may make us do work for nothing.

use crate::buffer::ByteQueue;
use crate::cipher::MAX_PLAINTEXT_LEN;
use crate::error::{Direction, Error, InvalidMessage, PeerMisbehaved};
use crate::handshake::{Handler, HandshakeJoiner, Want};
use crate::key_schedule::TrafficSecret;
use crate::message::{
    Alert, AlertDescription, AlertLevel, ContentType, HandshakeType, KeyUpdateRequest,
};
use crate::opener::Opener;
use crate::sealer::Sealer;
use crate::suite::{Suite, Version};

/// Warning alerts (TLS 1.2) or user_canceled (TLS 1.3) ignored over a connection's life
/// before the next one is fatal: they cost us a decryption each and carry nothing. rustls'
/// value.
pub const MAX_WARNING_ALERTS: u8 = 4;

/// KeyUpdates accepted in a row without application data between them: each costs three HKDF
/// expansions (six if answered). BoringSSL's `kMaxKeyUpdates`, also used by rustls.
pub const MAX_KEY_UPDATES_WITHOUT_DATA: u8 = 32;

/// TLS 1.2 renegotiation attempts refused with a warning before the next one is fatal. rustls'
/// value: a client that retries after no_renegotiation is not going to stop.
pub const MAX_RENEGOTIATION_REQUESTS: u8 = 1;

/// Which end of the connection we are. The home agent is always the server; the client side
/// exists so that two record layers can talk to each other in tests (and a client could use
/// it): it ignores TLS 1.3 NewSessionTickets and refuses TLS 1.2 HelloRequests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We accepted the connection (the peer is a TLS client).
    Server,
    /// We opened the connection (the peer is a TLS server).
    Client,
}

/// The state of our sending direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tx {
    /// Application data may be sent.
    Open,
    /// We sent close_notify.
    Closed,
    /// The key wore out and could not be replaced; close_notify was sent.
    Exhausted,
}

/// One direction's current key and, for TLS 1.3, the secret it came from.
pub(crate) struct Keys<C> {
    pub(crate) cipher: C,
    /// The key's secret, or (until `followed`) one of an earlier generation.
    pub(crate) secret: Option<TrafficSecret>,
    /// Whether `secret` is known to be the key's own generation: true once derived here, false
    /// for a session's given keys until the direction's first KeyUpdate follows it
    /// ([`TrafficSecret::followed_to`]). Only a KeyUpdate needs the secret, and most migrated
    /// connections never make one.
    pub(crate) followed: bool,
}

/// What a direction's cipher tells of its key: enough to find the secret's generation.
pub(crate) trait CurrentKey {
    fn current_key(&self) -> &[u8];
}

impl CurrentKey for Sealer {
    fn current_key(&self) -> &[u8] {
        self.key_iv().0
    }
}

impl CurrentKey for Opener {
    fn current_key(&self) -> &[u8] {
        self.key_iv().0
    }
}

impl<C: CurrentKey> Keys<C> {
    /// The secret of the key's own generation, followed there first if it has not been; its
    /// absence is `NoTrafficSecret(dir)`. A failure changes nothing.
    fn key_secret(&mut self, dir: Direction) -> Result<&TrafficSecret, Error> {
        let current = self.secret.as_mut().ok_or(Error::NoTrafficSecret(dir))?;
        if !self.followed {
            *current = current.followed_to(self.cipher.current_key())?;
            self.followed = true;
        }
        Ok(current)
    }
}

/// Everything of a connection except its undecrypted input and partial handshake message.
pub(crate) struct Conn {
    pub(crate) version: Version,
    pub(crate) suite: Suite,
    pub(crate) role: Role,
    pub(crate) rx: Keys<Opener>,
    pub(crate) tx: Keys<Sealer>,
    pub(crate) plaintext: ByteQueue,
    pub(crate) outgoing: ByteQueue,
    pub(crate) peer_closed: bool,
    pub(crate) tx_state: Tx,
    pub(crate) failed: Option<Error>,
    warnings_left: u8,
    key_updates_left: u8,
    renegotiations_left: u8,
}

impl Conn {
    pub(crate) fn new(
        version: Version,
        suite: Suite,
        role: Role,
        rx: Keys<Opener>,
        tx: Keys<Sealer>,
    ) -> Self {
        Self {
            version,
            suite,
            role,
            rx,
            tx,
            plaintext: ByteQueue::default(),
            outgoing: ByteQueue::default(),
            peer_closed: false,
            tx_state: Tx::Open,
            failed: None,
            warnings_left: MAX_WARNING_ALERTS,
            key_updates_left: MAX_KEY_UPDATES_WITHOUT_DATA,
            renegotiations_left: MAX_RENEGOTIATION_REQUESTS,
        }
    }

    /// Handles one decrypted record.
    pub(crate) fn record(
        &mut self,
        typ: ContentType,
        body: &[u8],
        joiner: &mut HandshakeJoiner,
    ) -> Result<(), Error> {
        if typ != ContentType::HANDSHAKE && !joiner.is_idle() {
            return Err(PeerMisbehaved::InterleavedHandshake.into());
        }
        match typ {
            ContentType::APPLICATION_DATA => {
                // the opener already refused more than MAX_PLAINTEXT_LEN
                debug_assert!(body.len() <= MAX_PLAINTEXT_LEN);
                if !body.is_empty() {
                    self.key_updates_left = MAX_KEY_UPDATES_WITHOUT_DATA;
                }
                self.plaintext.extend(body);
                Ok(())
            }
            ContentType::ALERT if body.is_empty() => Err(PeerMisbehaved::EmptyFragment(typ).into()),
            ContentType::ALERT => self.alert(Alert::read(body).ok_or(InvalidMessage::Alert)?),
            ContentType::HANDSHAKE if body.is_empty() => {
                Err(PeerMisbehaved::EmptyFragment(typ).into())
            }
            ContentType::HANDSHAKE => joiner.push(body, self),
            _ => Err(PeerMisbehaved::UnexpectedContentType(typ).into()),
        }
    }

    fn alert(&mut self, alert: Alert) -> Result<(), Error> {
        if alert.description == AlertDescription::CLOSE_NOTIFY {
            self.peer_closed = true;
            return Ok(());
        }
        let ignorable = match self.version {
            // RFC 8446 6.1: every alert but close_notify and user_canceled is fatal, whatever
            // its level says.
            Version::Tls13 => alert.description == AlertDescription::USER_CANCELED,
            Version::Tls12 => alert.level == AlertLevel::WARNING,
        };
        if !ignorable {
            return Err(Error::AlertReceived(alert.description));
        }
        self.warnings_left = self
            .warnings_left
            .checked_sub(1)
            .ok_or(PeerMisbehaved::TooManyWarningAlerts)?;
        Ok(())
    }

    /// Seals a control record (alert, KeyUpdate) regardless of the outgoing bound: they are
    /// few and small, and the bound on peer-triggered ones is the counters above.
    pub(crate) fn seal_control(&mut self, typ: ContentType, payload: &[u8]) -> Result<(), Error> {
        self.tx.cipher.seal(typ, payload, self.outgoing.tail())
    }

    /// Sends a KeyUpdate under the current key, then switches to the next generation
    /// (RFC 8446 4.6.3). Derives first, so a failure leaves everything as it was.
    pub(crate) fn update_tx(&mut self, request: KeyUpdateRequest) -> Result<(), Error> {
        if self.version == Version::Tls12 {
            return Err(Error::KeyUpdateUnsupported);
        }
        let secret = self.tx.key_secret(Direction::Tx)?;
        let next = secret.next()?;
        let keys = next.keys()?;
        let sealer = Sealer::new(self.version, self.suite, &keys.key, &keys.iv, 0)?;
        self.seal_control(ContentType::HANDSHAKE, &request.encode())?;
        self.tx = Keys {
            cipher: sealer,
            secret: Some(next),
            followed: true,
        };
        Ok(())
    }

    fn key_update(&mut self, request: KeyUpdateRequest) -> Result<(), Error> {
        self.key_updates_left = self
            .key_updates_left
            .checked_sub(1)
            .ok_or(PeerMisbehaved::TooManyKeyUpdateRequests)?;
        let secret = self.rx.key_secret(Direction::Rx)?;
        let next = secret.next()?;
        let keys = next.keys()?;
        self.rx = Keys {
            cipher: Opener::new(self.version, self.suite, &keys.key, &keys.iv, 0)?,
            secret: Some(next),
            followed: true,
        };
        // One answer per request. After our close_notify (or a worn-out key) we send nothing
        // more, and the peer's new key does not depend on our answer.
        if request == KeyUpdateRequest::Requested && self.tx_state == Tx::Open {
            self.update_tx(KeyUpdateRequest::NotRequested)?;
        }
        Ok(())
    }
}

impl Handler for Conn {
    fn header(&mut self, typ: HandshakeType, len: usize) -> Result<Want, Error> {
        let expect_len = |n| {
            if len == n {
                Ok(Want::Body)
            } else {
                Err(InvalidMessage::HandshakeLength(typ).into())
            }
        };
        match (self.version, self.role, typ) {
            (Version::Tls13, _, HandshakeType::KEY_UPDATE) => expect_len(1),
            (Version::Tls13, Role::Client, HandshakeType::NEW_SESSION_TICKET) => Ok(Want::Skip),
            (Version::Tls12, Role::Server, HandshakeType::CLIENT_HELLO) => Ok(Want::Skip),
            (Version::Tls12, Role::Client, HandshakeType::HELLO_REQUEST) => expect_len(0),
            _ => Err(PeerMisbehaved::UnexpectedHandshake(typ).into()),
        }
    }

    fn message(&mut self, typ: HandshakeType, body: &[u8], ends_record: bool) -> Result<(), Error> {
        match typ {
            HandshakeType::KEY_UPDATE => {
                // A key change must fall on a record boundary (RFC 8446 5.1).
                if !ends_record {
                    return Err(PeerMisbehaved::DataAfterKeyUpdate.into());
                }
                let byte = body.first().copied().unwrap_or(0xff);
                let request = KeyUpdateRequest::from_byte(byte)
                    .ok_or(InvalidMessage::KeyUpdateValue(byte))?;
                self.key_update(request)
            }
            HandshakeType::CLIENT_HELLO | HandshakeType::HELLO_REQUEST => {
                // Renegotiation: refuse with a warning and carry on, as rustls does.
                self.renegotiations_left = self
                    .renegotiations_left
                    .checked_sub(1)
                    .ok_or(PeerMisbehaved::TooManyRenegotiationRequests)?;
                if self.tx_state == Tx::Open {
                    let alert = Alert::warning(AlertDescription::NO_RENEGOTIATION);
                    self.seal_control(ContentType::ALERT, &alert.encode())?;
                }
                Ok(())
            }
            // NewSessionTicket on the client side: nothing to do with it here.
            _ => Ok(()),
        }
    }
}
