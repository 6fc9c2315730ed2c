//! The user-space TLS 1.2 and 1.3 record layer that a Baton home agent runs for a migrated
//! session: the handshake agent finishes the handshake with rustls, extracts the traffic keys,
//! IVs, sequence numbers (and, for TLS 1.3, the traffic secrets from its key log), and the home
//! agent carries the rest of the same TCP stream with a [`RecordLayer`] built from them.
//!
//! Deterministic and sans-IO, like rustls' `Connection` and quinn-proto: no sockets, no tokio,
//! no clock, no randomness. The caller pushes ciphertext and plaintext in and takes
//! ciphertext and plaintext out; every buffer is bounded; nothing panics on any input (fuzzed,
//! see `fuzz/` and [`fuzzing`]). Key material is zeroized on drop and never printed.
//!
//! What it supports: AES-128-GCM, AES-256-GCM and ChaCha20-Poly1305 in both versions (the only
//! suites Baton's agent negotiates); application data, close_notify and alerts; TLS 1.3
//! KeyUpdate both ways (answering the peer's requests, and replacing our key before its
//! confidentiality limit); refusing TLS 1.2 renegotiation with a warning, as rustls does.
//!
//! ```
//! use baton_record::{DirectionSecrets, RecordLayer, SessionKeys, Suite, Version};
//! use zeroize::Zeroizing;
//!
//! # fn secrets(seq: u64, byte: u8) -> DirectionSecrets {
//! #     DirectionSecrets { seq, key: Zeroizing::new(vec![byte; 16]), iv: [byte; 12], traffic_secret: None }
//! # }
//! let keys = SessionKeys {
//!     version: Version::Tls13,
//!     suite: Suite::Aes128Gcm,
//!     tx: secrets(2, 1), // from rustls' ExtractedSecrets::tx (and the key log, for KeyUpdate)
//!     rx: secrets(0, 2),
//! };
//! let mut layer = RecordLayer::new(keys).unwrap();
//! # let from_client: &[u8] = &[];
//! // The agent's loop: bytes from the socket in, plaintext out, replies in, ciphertext out.
//! let mut input = from_client;
//! while !input.is_empty() {
//!     let n = layer.read_tls(input);
//!     input = &input[n..];
//!     if let Err(e) = layer.process() {
//!         // the alert is in pending_tls(): send it, then close
//!         let _ = e.alert();
//!         break;
//!     }
//!     let n = layer.plaintext().len();
//!     layer.consume_plaintext(n); // ... handed to the application
//! }
//! layer.write_plaintext(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
//! let to_client = layer.pending_tls().to_vec();
//! layer.consume_tls(to_client.len());
//! # assert_eq!(to_client.len(), 5 + 19 + 1 + 16);
//! ```

#![forbid(unsafe_code)]

mod buffer;
pub mod cipher;
mod deframer;
mod error;
pub mod fuzzing;
mod handshake;
pub mod key_schedule;
mod keys;
mod layer;
pub mod message;
mod opener;
mod protocol;
mod sealer;
mod suite;
#[cfg(test)]
mod testutil;

pub use cipher::{MAX_PLAINTEXT_LEN, SEQ_HARD_LIMIT, SEQ_SOFT_LIMIT};
pub use deframer::INPUT_LIMIT;
pub use error::{Direction, Error, InvalidMessage, PeerMisbehaved};
pub use handshake::MAX_BODY as MAX_HANDSHAKE_BODY;
pub use keys::{DirectionSecrets, SessionKeys};
pub use layer::{RecordLayer, MAX_PENDING_TLS, OUTGOING_LIMIT, PLAINTEXT_LIMIT};
pub use message::{AlertDescription, ContentType};
pub use opener::{Opened, Opener};
pub use protocol::{
    Role, MAX_KEY_UPDATES_WITHOUT_DATA, MAX_RENEGOTIATION_REQUESTS, MAX_WARNING_ALERTS,
};
pub use sealer::Sealer;
pub use suite::{
    Suite, Version, AES_GCM_CONFIDENTIALITY_LIMIT, CHACHA20_POLY1305_CONFIDENTIALITY_LIMIT,
};
