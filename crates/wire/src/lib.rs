//! TLS wire code for Baton's dispatcher: record framing, the reassembly of a first handshake
//! message from records, and parsers (and encoders) for the ClientHello and the ServerHello.
//!
//! Deterministic and sans-IO: no sockets, no tokio, no clock, no randomness. Callers push the
//! bytes they have read and get back either "need more", a parsed message, or an error. Every
//! input, however hostile, yields one of those: nothing here panics on input (fuzzed, see
//! `fuzz/` and [`fuzzing`]), and what is buffered is bounded by a limit the caller sets.
//!
//! ```
//! use baton_wire::{Error, HelloReader, NotTls, Progress};
//!
//! // The dispatcher pushes each read, forwards the same bytes to the chosen agent, and stops
//! // peeking at `Done` (or routes by address only on an error).
//! let mut reader = HelloReader::new();
//! match reader.push(b"GET / HTTP/1.1\r\n") {
//!     Err(Error::NotTls(NotTls::ContentType(_))) => {} // plain HTTP on the TLS port
//!     other => panic!("{other:?}"),
//! }
//! # let hello_bytes: &[u8] = &[];
//! let mut reader = HelloReader::new();
//! if let Ok(Progress::Done(hello, _consumed)) = reader.push(hello_bytes) {
//!     let _route_on = (hello.server_name(), hello.pre_shared_key(), hello.session_id.clone());
//! }
//! ```

#![forbid(unsafe_code)]

pub mod codec;
pub mod enums;
mod error;
pub mod fuzzing;
pub mod hello;
pub mod message;
pub mod names;
pub mod proxy_v2;
pub mod record;
pub mod server_hello;

pub use enums::{
    AlertDescription, AlertLevel, CipherSuite, Compression, ContentType, ExtensionType,
    HandshakeType, NamedGroup, ProtocolVersion, PskKeyExchangeMode, ServerNameType,
    SignatureScheme,
};
pub use error::{Error, Malformed, NotTls};
pub use hello::{
    ClientExtension, ClientHello, HelloReader, KeyShareEntry, OfferedPsks, Progress, PskIdentity,
    ServerName,
};
pub use message::{FirstMessage, MessageReader};
pub use record::{RecordHeader, DEFAULT_MESSAGE_LIMIT};
pub use server_hello::{ServerExtension, ServerHello, ServerHelloReader};
