//! The agent link: how the dispatcher reaches its agents.
//!
//! The dispatcher keeps a few long-lived TCP connections to each agent's `--link-listen`
//! address (never its public TLS port) and carries every client connection over them as one
//! HTTP/2 stream (the `h2` crate as the multiplexer: per-stream flow control, so one slow
//! client never stalls another; no HTTP semantics beyond a request whose body is what the
//! client sends and a response whose body is what the agent sends). A client then costs the
//! dispatcher one socket and an agent no accept; a session migration is one more stream on a
//! link that is already up.
//!
//! ```text
//! TCP connect, then, before anything else (auth.rs):
//!   agent -> dispatcher:  "BTLK" 0x02 | agent_id u16 | link_id[16]        (random per link)
//!   dispatcher -> agent:  d_challenge[16] | len u16 | seal(0xFFFF, "", ctx_d)
//!   agent -> dispatcher:  len u16 | seal(agent_id, "", ctx_a)
//!     ctx_d = "baton link v1 dispatcher" || agent_id || link_id || d_challenge
//!     ctx_a = "baton link v1 agent"      || agent_id || link_id || d_challenge
//!   (the cluster key ring's AEAD over an empty message: a MAC bound to both challenges)
//! then HTTP/2, dispatcher = client, agent = server; per client one stream with
//!   baton-source: the client's address    baton-destination: the address it connected to
//!   baton-token: 32 hex digits (a migration's import stream only)
//!   baton-reattach: 32 hex digits (a successor dispatcher's stream continuing a handed-over one)
//!
//! dispatcher handover (a new dispatcher process takes the client's socket over):
//!   old dispatcher -> agent:  its stream's end, trailers  baton-handover: TOKEN (32 hex digits)
//!   agent -> old dispatcher:  the rest of what it sent, then trailers  baton-handover: ack
//!                             (the agent's stream now waits, up to REATTACH_TIMEOUT)
//!   old dispatcher passes the client's socket to the successor, only after the ack
//!   successor -> agent:       a new stream on its own link with  baton-reattach: TOKEN
//!   agent -> successor:       response headers at once; the waiting stream goes on there
//!   (a token nobody waits for: REFUSED_STREAM; trailers without a valid token: a plain end)
//! ```
//!
//! The agent proves itself only after the dispatcher has, so a peer without the key learns
//! nothing but random bytes, and every handshake has a deadline. The link id is the agent's
//! challenge and names the connection: a migrated session object is sealed for one link and
//! one token (`baton_migrate`), so it opens nowhere else, and not after a restart.
//! What is not protected: after the handshake, frames on the link are not sealed one by one;
//! the link belongs on the cluster's own network (the session objects it carries are sealed).

#![forbid(unsafe_code)]

pub mod auth;
mod client;
mod coalesce;
mod later;
mod meta;
mod rejoin;
mod server;
mod stats;
mod stream;

pub use client::{LinkHandle, LinkPool};
pub use later::RELEASE_DELAY;
pub use meta::StreamMeta;
pub use server::LinkListener;
pub use stats::LinkStats;
pub use stream::{is_refused, is_release, LinkStream};

use std::time::Duration;

/// Time allowed for a link's authentication, each side.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Flow-control window of one stream: what one client may have in flight on the link.
pub const STREAM_WINDOW: u32 = 256 * 1024;
/// Flow-control window of one link connection.
pub const CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
/// Streams at once on one link connection (an agent serves 20,000 connections by default).
pub const MAX_STREAMS: u32 = 100_000;
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
