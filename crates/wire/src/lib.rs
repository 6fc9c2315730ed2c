//! TLS wire code for Baton's dispatcher: record framing, the reassembly of a first handshake
//! message from records, and parsers (and encoders) for the ClientHello and the ServerHello.
//!
//! Deterministic and sans-IO: no sockets, no tokio, no clock, no randomness. Callers push the
//! bytes they have read and get back either "need more", a parsed message, or an error. Every
//! input, however hostile, yields one of those: nothing here panics on input (fuzzed, see
//! `fuzz/` and [`fuzzing`]), and what is buffered is bounded by a limit the caller sets.

pub mod codec;
pub mod enums;
mod error;
pub mod fuzzing;
pub mod hello;
pub mod proxy_v2;
pub mod record;
pub mod server_hello;

pub use enums::{
    CipherSuite, Compression, ContentType, ExtensionType, HandshakeType, NamedGroup,
    ProtocolVersion, PskKeyExchangeMode, ServerNameType, SignatureScheme,
};
pub use error::{Error, Malformed, NotTls};
pub use hello::{
    ClientExtension, ClientHello, HelloReader, KeyShareEntry, OfferedPsks, Progress, PskIdentity,
    ServerName,
};
pub use record::{RecordHeader, DEFAULT_MESSAGE_LIMIT};
pub use server_hello::{ServerExtension, ServerHello, ServerHelloReader};
