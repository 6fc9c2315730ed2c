//! The one error of this crate, grouped by fault as rustls groups its own: the peer sent bytes
//! that do not decrypt, are too large, do not parse, or break the protocol; the peer ended the
//! connection with an alert; or something on our side cannot go on (keys that do not fit the
//! suite, a KeyUpdate we cannot follow without the traffic secret, a worn-out key). The agent
//! logs the first group as "broken client" and the last as its own problem.

use crate::message::{AlertDescription, ContentType, HandshakeType};

/// Why the record layer refused input, or an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // --- the peer's bytes (a fatal alert is queued for it) ---
    /// A record did not authenticate under the current key and sequence number: tampered,
    /// truncated, or a session moved with the wrong sequence number.
    #[error("a record failed to decrypt")]
    DecryptFailed,
    /// A record longer than the protocol allows (RFC 8446 5.2, RFC 5246 6.2).
    #[error("record of {len} bytes, over the limit of {max}")]
    RecordOverflow {
        /// Its length (ciphertext as announced, or plaintext after decryption).
        len: usize,
        /// The limit it broke.
        max: usize,
    },
    /// Bytes that do not parse as what they claim to be.
    #[error("malformed {0}")]
    InvalidMessage(InvalidMessage),
    /// Well-formed, but not allowed at this point of the protocol.
    #[error("peer misbehaved: {0}")]
    PeerMisbehaved(PeerMisbehaved),

    // --- the peer ended the connection (no alert sent back) ---
    /// The peer sent a fatal alert.
    #[error("peer sent fatal alert {0}")]
    AlertReceived(AlertDescription),

    // --- our side ---
    /// The session keys do not fit the suite (a key of the wrong length, a traffic secret of
    /// the wrong length or one that no generation within reach derives the given key from).
    #[error("invalid session keys: {0}")]
    InvalidKeys(&'static str),
    /// A KeyUpdate needs the traffic secret of that direction, and the session did not carry
    /// it. Fatal when the peer updated (we cannot decrypt what follows); when we were about to
    /// update by our own choice, the connection goes on.
    #[error("KeyUpdate needs the {0} traffic secret, which the session does not carry")]
    NoTrafficSecret(Direction),
    /// TLS 1.2 has no KeyUpdate.
    #[error("TLS 1.2 has no KeyUpdate")]
    KeyUpdateUnsupported,
    /// The sending key reached its limit (confidentiality limit or the end of the sequence
    /// space) and cannot be replaced (TLS 1.2, or no traffic secret): close_notify was queued
    /// instead, as RFC 8446 5.3 and RFC 5246 6.1 ask ("rekey or terminate").
    #[error("the sending key is worn out and cannot be replaced; the connection was closed")]
    KeyExhausted,
    /// The peer's records reached the end of the sequence space (no AEAD nonce is left).
    #[error("the peer's sequence numbers are exhausted")]
    PeerSequenceExhausted,
    /// We already sent close_notify: nothing more may be sent.
    #[error("close_notify was already sent")]
    AlreadyClosed,
    /// The crypto library refused an operation it should not refuse (a bug, not an input).
    #[error("crypto operation failed")]
    Crypto,
}

/// A structure that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMessage {
    /// A record header whose legacy version is not 3.x.
    #[error("record header (version {0:#06x})")]
    RecordVersion(u16),
    /// An alert record that is not exactly level + description.
    #[error("alert")]
    Alert,
    /// A handshake message whose length is wrong for its type (a KeyUpdate body is one byte,
    /// a HelloRequest's is empty).
    #[error("{0} length")]
    HandshakeLength(HandshakeType),
    /// A KeyUpdate whose body byte is neither 0 nor 1 (`illegal_parameter`).
    #[error("KeyUpdate value {0}")]
    KeyUpdateValue(u8),
}

/// A message or record that is well-formed but not allowed here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerMisbehaved {
    /// A record type not allowed after the handshake (ChangeCipherSpec, an unencrypted TLS
    /// 1.3 record, an unknown type).
    #[error("unexpected record type {0}")]
    UnexpectedContentType(ContentType),
    /// A handshake message not allowed after the handshake, or from this peer.
    #[error("unexpected handshake message {0}")]
    UnexpectedHandshake(HandshakeType),
    /// Bytes after a KeyUpdate in the same record: they would straddle a key change
    /// (RFC 8446 5.1).
    #[error("data after KeyUpdate in the same record")]
    DataAfterKeyUpdate,
    /// A record of another type in the middle of a fragmented handshake message
    /// (RFC 8446 5.1).
    #[error("handshake message interleaved with another record type")]
    InterleavedHandshake,
    /// A TLS 1.3 record whose inner plaintext is all zero: it has no content type.
    #[error("TLS 1.3 record without an inner content type")]
    MissingInnerContentType,
    /// A zero-length alert or handshake record (RFC 8446 5.1, RFC 5246 6.2.1).
    #[error("empty {0} record")]
    EmptyFragment(ContentType),
    /// More warning alerts (TLS 1.2) or user_canceled (TLS 1.3) than we agree to ignore.
    #[error("too many warning alerts")]
    TooManyWarningAlerts,
    /// More KeyUpdates asking for an answer, without application data between them, than we
    /// agree to answer.
    #[error("too many KeyUpdate requests")]
    TooManyKeyUpdateRequests,
    /// More renegotiation attempts (TLS 1.2) than we agree to refuse politely.
    #[error("too many renegotiation requests")]
    TooManyRenegotiationRequests,
}

/// One direction of the connection, from our point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// What we receive (the peer's sending keys).
    Rx,
    /// What we send.
    Tx,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rx => "receiving",
            Self::Tx => "sending",
        })
    }
}

impl From<InvalidMessage> for Error {
    fn from(e: InvalidMessage) -> Self {
        Self::InvalidMessage(e)
    }
}

impl From<PeerMisbehaved> for Error {
    fn from(e: PeerMisbehaved) -> Self {
        Self::PeerMisbehaved(e)
    }
}

impl Error {
    /// The fatal alert sent to the peer when this error ends the connection (the record layer
    /// queues it for `write_tls`). `None` when the peer ended the connection itself, when the
    /// error is a refused local operation that leaves the connection alive, or when we close
    /// with close_notify instead. Errors returned by a refused local operation (e.g.
    /// `send_key_update` without a traffic secret) queue nothing, whatever this says.
    pub fn alert(&self) -> Option<AlertDescription> {
        Some(match self {
            Self::DecryptFailed => AlertDescription::BAD_RECORD_MAC,
            Self::RecordOverflow { .. } => AlertDescription::RECORD_OVERFLOW,
            Self::InvalidMessage(InvalidMessage::KeyUpdateValue(_)) => {
                AlertDescription::ILLEGAL_PARAMETER
            }
            Self::InvalidMessage(_) => AlertDescription::DECODE_ERROR,
            Self::PeerMisbehaved(_) => AlertDescription::UNEXPECTED_MESSAGE,
            Self::NoTrafficSecret(_) | Self::PeerSequenceExhausted | Self::Crypto => {
                AlertDescription::INTERNAL_ERROR
            }
            Self::AlertReceived(_)
            | Self::InvalidKeys(_)
            | Self::KeyUpdateUnsupported
            | Self::KeyExhausted
            | Self::AlreadyClosed => return None,
        })
    }

    /// Whether the error is the peer's fault (bad bytes or a fatal alert), as opposed to ours.
    pub fn is_peer_fault(&self) -> bool {
        matches!(
            self,
            Self::DecryptFailed
                | Self::RecordOverflow { .. }
                | Self::InvalidMessage(_)
                | Self::PeerMisbehaved(_)
                | Self::AlertReceived(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_follow_the_rfc_names() {
        assert_eq!(
            Error::DecryptFailed.alert(),
            Some(AlertDescription::BAD_RECORD_MAC)
        );
        assert_eq!(
            Error::from(InvalidMessage::KeyUpdateValue(7)).alert(),
            Some(AlertDescription::ILLEGAL_PARAMETER)
        );
        assert_eq!(
            Error::from(InvalidMessage::HandshakeLength(HandshakeType::KEY_UPDATE)).alert(),
            Some(AlertDescription::DECODE_ERROR)
        );
        assert_eq!(
            Error::from(PeerMisbehaved::DataAfterKeyUpdate).alert(),
            Some(AlertDescription::UNEXPECTED_MESSAGE)
        );
        assert_eq!(
            Error::AlertReceived(AlertDescription::BAD_RECORD_MAC).alert(),
            None
        );
        assert_eq!(Error::KeyUpdateUnsupported.alert(), None);
    }
}
