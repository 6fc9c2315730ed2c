//! The connection path, from the first byte to the last, in layers (each file uses only
//! those below it, nothing calls back up):
//!
//! - [`accept`]: a connection on the public port or the agent link, its handshake, and the
//!   HTTP that follows by ALPN;
//! - [`early_serve`] (a connection that offered early data) over [`early_tls`] (its
//!   handshake, driven here);
//! - [`http1`] (HTTP/1.1 from request to request: waits, parks, moves, wakes) and
//!   [`serve_stream`] (one hyper connection for a connection's life: HTTP/2, or HTTP/1.1
//!   after early data);
//! - [`one_request`] (one HTTP/1.1 request in a hyper connection of its own);
//! - [`park`] (an idle HTTP/1.1 connection on the record layer) over [`engine`] (rustls or
//!   the record layer under HTTP/1.1);
//! - [`decide`] (what to do next, plain functions), [`pace`] (request heads' deadlines),
//!   [`prefixed`] (bytes read ahead), [`legacy`] (pre-TLS 1.2 clients), [`io`] (idle
//!   timeout, byte counts) and [`transport`] (the socket or link stream, write coalescing).
//!
//! A migration's shells (`migration`) sit between `engine` and `accept`: they move an engine
//! out and hand back what stays.

pub(crate) mod accept;
pub(crate) mod decide;
pub(crate) mod early_serve;
pub(crate) mod early_tls;
pub(crate) mod engine;
pub(crate) mod http1;
pub(crate) mod io;
pub(crate) mod legacy;
pub(crate) mod one_request;
pub(crate) mod pace;
pub(crate) mod park;
pub(crate) mod prefixed;
pub(crate) mod serve_stream;
pub(crate) mod transport;

// Tests of parking through whole connections (`accept` down to `park`).
#[cfg(test)]
mod park_test;
