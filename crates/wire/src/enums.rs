//! TLS code points as newtypes with named constants rather than Rust enums: a value we have no
//! name for (a new cipher suite, a GREASE value from RFC 8701) is still a valid value, reads and
//! writes back unchanged, and prints as hex instead of being lost as "Unknown".

use std::fmt;

use crate::codec::{Codec, Reader};
use crate::error::Error;

macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident($ty:ty) {
            $( $(#[$vmeta:meta])* $konst:ident = $val:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub $ty);

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
                    None => write!(f, "{}({:#0w$x})", stringify!($name), self.0,
                        w = 2 + 2 * std::mem::size_of::<$ty>()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }

        impl From<$ty> for $name {
            fn from(v: $ty) -> Self {
                Self(v)
            }
        }

        impl Codec for $name {
            fn encode(&self, out: &mut Vec<u8>) {
                self.0.encode(out);
            }
            fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
                <$ty>::read(r).map(Self)
            }
        }
    };
}

/// Whether a 16-bit code point is a GREASE value (RFC 8701: `0x?a?a` with both bytes equal),
/// which clients send to keep servers tolerant of unknown values.
pub const fn is_grease_u16(v: u16) -> bool {
    v & 0x0f0f == 0x0a0a && v >> 8 == v & 0xff
}

wire_enum! {
    /// The type of a TLS record (RFC 8446 5.1).
    ContentType(u8) {
        CHANGE_CIPHER_SPEC = 20,
        ALERT = 21,
        HANDSHAKE = 22,
        APPLICATION_DATA = 23,
        HEARTBEAT = 24,
    }
}

wire_enum! {
    /// The type of a handshake message (RFC 8446 4).
    HandshakeType(u8) {
        HELLO_REQUEST = 0,
        CLIENT_HELLO = 1,
        SERVER_HELLO = 2,
        NEW_SESSION_TICKET = 4,
        END_OF_EARLY_DATA = 5,
        ENCRYPTED_EXTENSIONS = 8,
        CERTIFICATE = 11,
        SERVER_KEY_EXCHANGE = 12,
        CERTIFICATE_REQUEST = 13,
        SERVER_HELLO_DONE = 14,
        CERTIFICATE_VERIFY = 15,
        CLIENT_KEY_EXCHANGE = 16,
        FINISHED = 20,
        KEY_UPDATE = 24,
        MESSAGE_HASH = 254,
    }
}

wire_enum! {
    /// The level of a TLS 1.2 alert (TLS 1.3 ignores it: RFC 8446 6).
    AlertLevel(u8) {
        /// May be ignored (TLS 1.2 only).
        WARNING = 1,
        /// Ends the connection.
        FATAL = 2,
    }
}

wire_enum! {
    /// An alert description (RFC 8446 6, RFC 5246 7.2); the ones Baton sends or acts on.
    AlertDescription(u8) {
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

wire_enum! {
    /// A protocol version as written on the wire (`legacy_version`, `supported_versions`).
    ProtocolVersion(u16) {
        SSLV3 = 0x0300,
        TLSV1_0 = 0x0301,
        TLSV1_1 = 0x0302,
        TLSV1_2 = 0x0303,
        TLSV1_3 = 0x0304,
    }
}

wire_enum! {
    /// A cipher suite (IANA TLS Cipher Suites registry); only the ones Baton meets are named.
    CipherSuite(u16) {
        TLS_RSA_WITH_AES_128_CBC_SHA = 0x002f,
        TLS_RSA_WITH_AES_256_CBC_SHA = 0x0035,
        TLS_RSA_WITH_AES_128_GCM_SHA256 = 0x009c,
        TLS_RSA_WITH_AES_256_GCM_SHA384 = 0x009d,
        TLS_EMPTY_RENEGOTIATION_INFO_SCSV = 0x00ff,
        TLS13_AES_128_GCM_SHA256 = 0x1301,
        TLS13_AES_256_GCM_SHA384 = 0x1302,
        TLS13_CHACHA20_POLY1305_SHA256 = 0x1303,
        TLS_FALLBACK_SCSV = 0x5600,
        TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA = 0xc009,
        TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA = 0xc00a,
        TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA = 0xc013,
        TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA = 0xc014,
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 = 0xc02b,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 = 0xc02c,
        TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 = 0xc02f,
        TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 = 0xc030,
        TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 = 0xcca8,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 = 0xcca9,
    }
}

impl CipherSuite {
    /// Whether this is a GREASE value (RFC 8701).
    pub const fn is_grease(self) -> bool {
        is_grease_u16(self.0)
    }
}

wire_enum! {
    /// A hello extension's type (IANA TLS ExtensionType Values).
    ExtensionType(u16) {
        SERVER_NAME = 0,
        MAX_FRAGMENT_LENGTH = 1,
        STATUS_REQUEST = 5,
        SUPPORTED_GROUPS = 10,
        EC_POINT_FORMATS = 11,
        SIGNATURE_ALGORITHMS = 13,
        USE_SRTP = 14,
        HEARTBEAT = 15,
        ALPN = 16,
        SIGNED_CERTIFICATE_TIMESTAMP = 18,
        PADDING = 21,
        ENCRYPT_THEN_MAC = 22,
        EXTENDED_MASTER_SECRET = 23,
        COMPRESS_CERTIFICATE = 27,
        RECORD_SIZE_LIMIT = 28,
        SESSION_TICKET = 35,
        PRE_SHARED_KEY = 41,
        EARLY_DATA = 42,
        SUPPORTED_VERSIONS = 43,
        COOKIE = 44,
        PSK_KEY_EXCHANGE_MODES = 45,
        CERTIFICATE_AUTHORITIES = 47,
        POST_HANDSHAKE_AUTH = 49,
        SIGNATURE_ALGORITHMS_CERT = 50,
        KEY_SHARE = 51,
        APPLICATION_SETTINGS_OLD = 0x4469,
        APPLICATION_SETTINGS = 0x44cd,
        ENCRYPTED_CLIENT_HELLO = 0xfe0d,
        RENEGOTIATION_INFO = 0xff01,
    }
}

impl ExtensionType {
    /// Whether this is a GREASE value (RFC 8701).
    pub const fn is_grease(self) -> bool {
        is_grease_u16(self.0)
    }
}

wire_enum! {
    /// A key exchange group (IANA TLS Supported Groups), including the hybrid post-quantum ones.
    NamedGroup(u16) {
        SECP256R1 = 0x0017,
        SECP384R1 = 0x0018,
        SECP521R1 = 0x0019,
        X25519 = 0x001d,
        X448 = 0x001e,
        FFDHE2048 = 0x0100,
        FFDHE3072 = 0x0101,
        FFDHE4096 = 0x0102,
        MLKEM512 = 0x0200,
        MLKEM768 = 0x0201,
        MLKEM1024 = 0x0202,
        SECP256R1_MLKEM768 = 0x11eb,
        X25519_MLKEM768 = 0x11ec,
        SECP384R1_MLKEM1024 = 0x11ed,
        X25519_KYBER768_DRAFT00 = 0x6399,
    }
}

impl NamedGroup {
    /// Whether this is a GREASE value (RFC 8701).
    pub const fn is_grease(self) -> bool {
        is_grease_u16(self.0)
    }
}

wire_enum! {
    /// A signature algorithm (RFC 8446 4.2.3).
    SignatureScheme(u16) {
        RSA_PKCS1_SHA1 = 0x0201,
        ECDSA_SHA1 = 0x0203,
        RSA_PKCS1_SHA256 = 0x0401,
        ECDSA_SECP256R1_SHA256 = 0x0403,
        RSA_PKCS1_SHA384 = 0x0501,
        ECDSA_SECP384R1_SHA384 = 0x0503,
        RSA_PKCS1_SHA512 = 0x0601,
        ECDSA_SECP521R1_SHA512 = 0x0603,
        RSA_PSS_RSAE_SHA256 = 0x0804,
        RSA_PSS_RSAE_SHA384 = 0x0805,
        RSA_PSS_RSAE_SHA512 = 0x0806,
        ED25519 = 0x0807,
        ED448 = 0x0808,
        RSA_PSS_PSS_SHA256 = 0x0809,
        RSA_PSS_PSS_SHA384 = 0x080a,
        RSA_PSS_PSS_SHA512 = 0x080b,
    }
}

impl SignatureScheme {
    /// Whether this is a GREASE value (RFC 8701).
    pub const fn is_grease(self) -> bool {
        is_grease_u16(self.0)
    }
}

impl ProtocolVersion {
    /// Whether this is a GREASE value (RFC 8701).
    pub const fn is_grease(self) -> bool {
        is_grease_u16(self.0)
    }
}

wire_enum! {
    /// How a resumption may use a PSK (RFC 8446 4.2.9).
    PskKeyExchangeMode(u8) {
        PSK_KE = 0,
        PSK_DHE_KE = 1,
    }
}

wire_enum! {
    /// The kind of a name in the server_name extension (RFC 6066 3).
    ServerNameType(u8) {
        HOST_NAME = 0,
    }
}

wire_enum! {
    /// A compression method; only `NULL` is still allowed (RFC 8446 4.1.2).
    Compression(u8) {
        NULL = 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_values_print_their_name_and_unknown_ones_hex() {
        assert_eq!(
            format!("{:?}", CipherSuite::TLS13_AES_128_GCM_SHA256),
            "TLS13_AES_128_GCM_SHA256"
        );
        assert_eq!(format!("{:?}", CipherSuite(0x0a0a)), "CipherSuite(0x0a0a)");
        assert_eq!(format!("{}", ContentType(0x63)), "ContentType(0x63)");
        assert_eq!(format!("{:?}", NamedGroup(0x11ec)), "X25519_MLKEM768");
    }

    #[test]
    fn grease_is_recognised_and_round_trips() {
        for v in [0x0a0a, 0x1a1a, 0xfafa] {
            assert!(is_grease_u16(v), "{v:#x}");
            assert_eq!(
                ExtensionType::read_bytes(&ExtensionType(v).get_encoding()),
                Ok(ExtensionType(v))
            );
        }
        for v in [0x0a1a, 0x0a0b, 0x0000, 0x1301] {
            assert!(!is_grease_u16(v), "{v:#x}");
        }
    }
}
