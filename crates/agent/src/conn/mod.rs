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
//! - [`park`] (an idle HTTP/1.1 connection on the record layer) over [`engine`] (waiting for
//!   a request on the TLS engine, rustls or the record layer under HTTP/1.1);
//! - [`decide`] (what to do next, plain functions), [`pace`] (request heads' deadlines),
//!   [`prefixed`] (bytes read ahead), [`legacy`] (pre-TLS 1.2 clients).
//!
//! Below this folder, `crate::transport` (the socket or link stream, the idle timeout and byte
//! counts, the TLS engine). A migration's shells (`crate::migration`) sit between them: the
//! connection path calls them to move an engine out and gets back what stays; they use
//! `transport` and nothing here.

pub(crate) mod accept;
pub(crate) mod decide;
pub(crate) mod early_serve;
pub(crate) mod early_tls;
pub(crate) mod engine;
pub(crate) mod http1;
pub(crate) mod legacy;
pub(crate) mod one_request;
pub(crate) mod pace;
pub(crate) mod park;
pub(crate) mod prefixed;
pub(crate) mod serve_stream;

// Tests of parking through whole connections (`accept` down to `park`).
#[cfg(test)]
mod park_test;
