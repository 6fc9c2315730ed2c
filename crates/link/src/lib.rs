//! The agent link: how the dispatcher reaches its agents.
//!
//! The dispatcher keeps a few long-lived TCP connections to each agent's `--link-listen`
//! address (never its public TLS port) and carries every client connection over them as one
//! stream, in frames of the link's own (`frame.rs`) with HTTP/2's flow control per stream and
//! per link (`mux.rs`), so one slow client never stalls another. A client then costs the
//! dispatcher one socket and an agent no accept; a session migration is one more stream on a
//! link that is already up.
//!
//! ```text
//! TCP connect, then a Noise handshake, Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s (auth.rs; snow,
//! with X25519 and ChaCha20-Poly1305 from aws-lc-rs: crypto.rs):
//!   dispatcher -> agent:  "BTLK" 0x04 | len u16 | psk, e                   (empty payload)
//!   agent -> dispatcher:  "BTLK" 0x04 | len u16 | e, ee | seal(agent_id u16 | link_id[16])
//!     prologue = "BTLK" 0x04; psk = HKDF of a cluster key, label "baton link psk v3"
//!     (the dispatcher uses the key ring's first key, the agent tries each of its ring's)
//! then every byte both ways in Noise transport messages (seal.rs):
//!   len u16 | ciphertext and tag (len <= 65535), numbered from 0 each way (the nonce)
//! inside them frames (frame.rs), dispatcher = opener of streams, agent = taker:
//!   kind u8 | stream u32 | len u16 | payload
//!   OPEN (the client's metadata: source, destination, kind of stream; meta.rs), ANSWER,
//!   DATA, END, RESET (release, cancel, refused, protocol), WINDOW, GOAWAY
//!
//! dispatcher handover (a new dispatcher process takes the client's socket over):
//!   old dispatcher -> agent:  END carrying TOKEN (16 bytes) after its stream's last bytes
//!   agent -> old dispatcher:  the rest of what it sent, then END with ack
//!                             (the agent's stream now waits, up to REATTACH_TIMEOUT)
//!   old dispatcher passes the client's socket to the successor, only after the ack
//!   successor -> agent:       OPEN on its own link with reattach: TOKEN
//!   agent -> successor:       ANSWER at once; the waiting stream goes on there
//!   (a token nobody waits for: RESET refused; END without a token: a plain end)
//! ```
//!
//! What is protected: the agent sends nothing until the dispatcher's first message has opened
//! with the cluster key, so a peer without it learns nothing, not even the agent's id; the
//! agent's reply proves the key back; the session keys come from both ends' ephemeral keys
//! (forward secrecy: the cluster key does not open a recorded link). After the handshake every
//! byte both ways is encrypted and authenticated in order: a changed, dropped, replayed or
//! inserted byte makes a message that does not open, and the link is torn down at once
//! (`baton_link_integrity_failures_total` on the agent) and the dispatcher makes a new one.
//! A replayed handshake gets an answer its replayer cannot use. What a relay on the path still
//! sees: that a link exists, and the size and timing of its messages. Every handshake has a
//! deadline and bounded buffers; a record is at most 64 KiB, one buffered per link direction.
//! The link id names the connection: a migrated session object is sealed for one link and
//! one token (`baton_migrate`), so it opens nowhere else, and not after a restart.

#![forbid(unsafe_code)]

pub mod auth;
mod client;
mod crypto;
mod driver;
pub mod frame;
pub mod fuzzing;
mod meta;
mod mux;
mod rejoin;
pub mod seal;
mod server;
mod stats;
mod stream;

pub use client::{LinkHandle, LinkPool};
pub use meta::StreamMeta;
pub use server::LinkListener;
pub use stats::LinkStats;
pub use stream::{is_refused, is_release, LinkStream};

use std::time::Duration;

/// Time allowed for a link's handshake, each side.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Flow-control window of one stream: what one client may have in flight on the link.
pub const STREAM_WINDOW: u32 = 256 * 1024;
/// Flow-control window of one link connection.
pub const CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
/// Streams at once on one link connection (an agent serves 20,000 connections by default).
pub const MAX_STREAMS: u32 = 100_000;
/// The longest the dispatcher's Done waits for company: a release nobody waits on
/// ([`LinkStream::release_later`]) leaves with the next frames written to that agent anyway,
/// or alone this much later (the agent's verdict deadline is seconds, never this).
pub const RELEASE_DELAY: Duration = Duration::from_millis(4);
/// How long an agent's stream handed over by its dispatcher waits for the successor's
/// re-attach stream (`LinkListener::set_reattach_timeout` changes it).
pub const REATTACH_TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh random 16-byte value (link ids, challenges, import tokens).
pub fn token() -> [u8; 16] {
    let mut t = [0u8; 16];
    // A failed RNG leaves zeros: authentication then fails (the proofs would be reusable),
    // which is safe.
    let _ = aws_lc_rs::rand::fill(&mut t);
    t
}

/// TCP settings of a link socket: no Nagle delay (every client's bytes ride it), keepalive to
/// find a dead peer behind a silent network.
fn tune(tcp: &tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5));
    let _ = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka);
}
