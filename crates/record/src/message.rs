//! The few TLS messages a connection still exchanges after its handshake: alerts (RFC 8446 6,
//! RFC 5246 7.2), KeyUpdate (RFC 8446 4.6.3) and the headers of the handshake messages we
//! refuse or ignore. Code points are `baton-wire`'s newtypes with named constants, so a value
//! we have no name for still prints (as hex) instead of vanishing into "unknown".

// The code points are `baton-wire`'s: one registry of names for the dispatcher's parsers and
// the record layer.
pub use baton_wire::enums::{AlertDescription, AlertLevel, ContentType, HandshakeType};
/// Bytes of a handshake message header: type and 24-bit body length.
pub use baton_wire::record::HANDSHAKE_HEADER_LEN;

/// An alert as it travels in a record: level and description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alert {
    /// The level (ignored in TLS 1.3).
    pub level: AlertLevel,
    /// What happened.
    pub description: AlertDescription,
}

impl Alert {
    /// A fatal alert.
    pub fn fatal(description: AlertDescription) -> Self {
        Self {
            level: AlertLevel::FATAL,
            description,
        }
    }

    /// A warning alert (close_notify is sent at warning level, RFC 5246 7.2.1).
    pub fn warning(description: AlertDescription) -> Self {
        Self {
            level: AlertLevel::WARNING,
            description,
        }
    }

    /// The two bytes of the alert.
    pub fn encode(self) -> [u8; 2] {
        [self.level.0, self.description.0]
    }

    /// Reads an alert record's plaintext: exactly two bytes (a record with more, or a
    /// fragmented alert, is refused, as rustls and BoringSSL do), `None` otherwise.
    pub fn read(bytes: &[u8]) -> Option<Self> {
        match bytes {
            &[level, description] => Some(Self {
                level: AlertLevel(level),
                description: AlertDescription(description),
            }),
            _ => None,
        }
    }
}

/// The body of a KeyUpdate (RFC 8446 4.6.3): whether the sender asks us to update ours too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUpdateRequest {
    /// `update_not_requested` (0): an answer, or an update of the sender's own accord.
    NotRequested,
    /// `update_requested` (1): the receiver must answer with its own KeyUpdate.
    Requested,
}

impl KeyUpdateRequest {
    /// The complete handshake message: header and the one-byte body.
    pub fn encode(self) -> [u8; HANDSHAKE_HEADER_LEN + 1] {
        let body = match self {
            Self::NotRequested => 0,
            Self::Requested => 1,
        };
        [HandshakeType::KEY_UPDATE.0, 0, 0, 1, body]
    }

    /// Reads the body byte; any other value is `illegal_parameter` for the caller.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::NotRequested),
            1 => Some(Self::Requested),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_are_exactly_two_bytes() {
        let a = Alert::fatal(AlertDescription::BAD_RECORD_MAC);
        assert_eq!(a.encode(), [2, 20]);
        assert_eq!(Alert::read(&a.encode()), Some(a));
        assert_eq!(Alert::read(&[1]), None);
        assert_eq!(Alert::read(&[1, 0, 0]), None);
    }

    #[test]
    fn key_update_encodes_as_rfc_8446_says() {
        assert_eq!(KeyUpdateRequest::Requested.encode(), [24, 0, 0, 1, 1]);
        assert_eq!(
            KeyUpdateRequest::from_byte(0),
            Some(KeyUpdateRequest::NotRequested)
        );
        assert_eq!(KeyUpdateRequest::from_byte(2), None);
    }

    #[test]
    fn unknown_code_points_print_as_hex() {
        assert_eq!(
            format!("{:?}", AlertDescription(0x73)),
            "AlertDescription(0x73)"
        );
        assert_eq!(
            format!("{}", AlertDescription::RECORD_OVERFLOW),
            "RECORD_OVERFLOW"
        );
    }
}
