//! The few TLS messages a connection still exchanges after its handshake: alerts (RFC 8446 6,
//! RFC 5246 7.2), KeyUpdate (RFC 8446 4.6.3) and the headers of the handshake messages we
//! refuse or ignore. Code points are newtypes with named constants, as in `baton-wire`, so a
//! value we have no name for still prints (as hex) instead of vanishing into "unknown".

use std::fmt;

macro_rules! code_point {
    ($(#[$meta:meta])* $name:ident { $( $(#[$vmeta:meta])* $konst:ident = $val:expr, )* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub u8);

        impl $name {
            $( $(#[$vmeta])* pub const $konst: Self = Self($val); )*

            /// The registry name of this value, if it has one here.
            pub fn name(self) -> Option<&'static str> {
                match self {
                    $( Self::$konst => Some(stringify!($konst)), )*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({:#04x})", stringify!($name), self.0),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

code_point! {
    /// The type of a record (outer, or in TLS 1.3 the inner type after decryption).
    ContentType {
        /// ChangeCipherSpec: only during a handshake, never after it.
        CHANGE_CIPHER_SPEC = 20,
        /// An alert.
        ALERT = 21,
        /// Handshake messages.
        HANDSHAKE = 22,
        /// Application data (and every TLS 1.3 record's outer type).
        APPLICATION_DATA = 23,
    }
}

code_point! {
    /// The level of a TLS 1.2 alert (TLS 1.3 ignores it: RFC 8446 6).
    AlertLevel {
        /// May be ignored (TLS 1.2 only).
        WARNING = 1,
        /// Ends the connection.
        FATAL = 2,
    }
}

code_point! {
    /// An alert description (RFC 8446 6, RFC 5246 7.2).
    AlertDescription {
        /// Orderly end of the sender's direction.
        CLOSE_NOTIFY = 0,
        /// A record or message that is not allowed here.
        UNEXPECTED_MESSAGE = 10,
        /// A record failed to decrypt.
        BAD_RECORD_MAC = 20,
        /// A record longer than the protocol allows.
        RECORD_OVERFLOW = 22,
        /// A field has a value out of range.
        ILLEGAL_PARAMETER = 47,
        /// A message could not be parsed.
        DECODE_ERROR = 50,
        /// A local failure unrelated to the peer's bytes.
        INTERNAL_ERROR = 80,
        /// The sender cancels (TLS 1.3: not fatal by itself).
        USER_CANCELED = 90,
        /// TLS 1.2: the sender refuses to renegotiate (warning level).
        NO_RENEGOTIATION = 100,
    }
}

code_point! {
    /// A handshake message type (RFC 8446 4, RFC 5246 7.4).
    HandshakeType {
        /// TLS 1.2: a server asking the client to renegotiate.
        HELLO_REQUEST = 0,
        /// A new handshake (TLS 1.2: a renegotiation attempt after the first one).
        CLIENT_HELLO = 1,
        /// TLS 1.3: a resumption ticket from the server.
        NEW_SESSION_TICKET = 4,
        /// TLS 1.3: post-handshake authentication request from the server.
        CERTIFICATE_REQUEST = 13,
        /// TLS 1.3: a key update (RFC 8446 4.6.3).
        KEY_UPDATE = 24,
    }
}

/// Bytes of a handshake message header: type and 24-bit body length.
pub const HANDSHAKE_HEADER_LEN: usize = 4;

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
