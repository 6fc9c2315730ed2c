//! What a connection runs on, below the connection path (`conn`) and the migration shells
//! (`migration`), which both use it and which it uses neither of:
//!
//! - [`agent_io`]: the socket or agent-link stream, with write coalescing;
//! - [`conn_io`]: over it, the idle timeout, byte counts and the following of the client's
//!   TLS records;
//! - [`engine`]: the TLS engine over that, rustls or the record layer;
//! - [`migrated`]: the record layer over the socket as a tokio stream (a session moved here,
//!   or parked on it).

pub(crate) mod agent_io;
pub(crate) mod conn_io;
pub(crate) mod engine;
pub(crate) mod migrated;
