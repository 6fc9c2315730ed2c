//! The one error of this crate, grouped by fault: the input ended early, broke a rule of the
//! format, was larger than we agree to hold, or was not a TLS handshake at all. The dispatcher
//! treats the first three as "a broken TLS client" and the last as "not TLS" (plain HTTP, a port
//! scanner), which it may want to log differently.

use crate::enums::{ContentType, ExtensionType, HandshakeType, ProtocolVersion};

/// Why bytes could not be read as the TLS structure asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The input ended inside `what`: a length promised more bytes than there were.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// The bytes are there but break a rule of the format.
    #[error("malformed: {0}")]
    Malformed(Malformed),
    /// `what` is `len` bytes, more than the `max` we agree to read or hold.
    #[error("{what} is {len} bytes, over the limit of {max}")]
    TooLarge {
        /// Which structure.
        what: &'static str,
        /// Its length (as announced, or as accumulated so far).
        len: usize,
        /// The limit it broke.
        max: usize,
    },
    /// The bytes are not (the start of) a TLS handshake.
    #[error("not a TLS handshake: {0}")]
    NotTls(NotTls),
}

/// A rule of the format that the input broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Bytes were left over after `what`, inside a length that should have been used up.
    #[error("trailing bytes after {0}")]
    TrailingBytes(&'static str),
    /// `what` is a vector that must not be empty.
    #[error("empty {0}")]
    Empty(&'static str),
    /// `what` is a vector of fixed-size items whose length is not a multiple of their size.
    #[error("{0} length is not a multiple of its item size")]
    Ragged(&'static str),
    /// `what` is longer than the format allows (e.g. a session id over 32 bytes).
    #[error("{0} is over its maximum length")]
    OverLong(&'static str),
    /// `what` is shorter than the format allows (e.g. a PSK binder under 32 bytes).
    #[error("{0} is under its minimum length")]
    TooShort(&'static str),
    /// The same extension twice in one hello (RFC 8446 4.2).
    #[error("duplicate extension {0:?}")]
    DuplicateExtension(ExtensionType),
    /// pre_shared_key must be the last extension of a ClientHello (RFC 8446 4.2.11).
    #[error("pre_shared_key is not the last extension")]
    PskNotLast,
    /// The number of PSK binders differs from the number of identities (RFC 8446 4.2.11).
    #[error("{identities} PSK identities but {binders} binders")]
    PskBinderCount {
        /// Identities offered.
        identities: usize,
        /// Binders sent.
        binders: usize,
    },
    /// `what` is a version or kind code this side does not know.
    #[error("unknown {0}")]
    Unknown(&'static str),
    /// `what` is text that is not UTF-8.
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    /// A zero-length handshake record (forbidden by RFC 8446 5.1).
    #[error("empty handshake record")]
    EmptyRecord,
    /// Other bytes share a record with the ClientHello, which must be the whole first flight.
    #[error("data after the ClientHello in its record")]
    DataAfterHello,
}

/// Evidence that the peer does not speak TLS (or not a handshake we can peek at).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotTls {
    /// A record type that TLS does not define (plain text, an SSLv2 hello, random bytes).
    #[error("unknown record type {0:?}")]
    ContentType(ContentType),
    /// A record of another content type where a handshake record was expected.
    #[error("record type {0:?}, expected handshake")]
    NotHandshake(ContentType),
    /// A record whose legacy version is not 3.x (an SSLv2 hello, HTTP, random bytes).
    #[error("record version {0:?}")]
    RecordVersion(ProtocolVersion),
    /// The first handshake message is not the one expected.
    #[error("handshake message {got:?}, expected {expected:?}")]
    UnexpectedMessage {
        /// What arrived.
        got: HandshakeType,
        /// What we were waiting for.
        expected: HandshakeType,
    },
}

impl From<Malformed> for Error {
    fn from(m: Malformed) -> Self {
        Error::Malformed(m)
    }
}

impl From<NotTls> for Error {
    fn from(n: NotTls) -> Self {
        Error::NotTls(n)
    }
}
