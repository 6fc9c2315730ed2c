//! The dispatcher's hot restart ("handover" in its flags, metrics and messages): on SIGUSR2
//! or `POST /restart` (`/handover`) the dispatcher starts a
//! successor (the binary now at its path, with its own command line), passes it the listening
//! sockets, and once it is ready, every live client connection, then exits. Clients notice
//! nothing: their TCP connection, TLS session and agent stay the same.
//!
//! Each connection stops at a chunk boundary each way (never inside a write), ends its agent
//! stream with a handover END (a token), forwards what the agent still sends until its `ack`
//! (the agent then waits for a re-attach stream with that token, `baton-link`), and passes
//! the client's socket with its record positions ([`baton_migrate::restart`]). The successor
//! opens the re-attach stream on its own link to the same agent and serves on.
//!
//! Failures: a successor that does not get ready in `--restart-timeout` is killed and the old
//! process serves on. A successor that dies once ready: connections not passed yet are
//! re-attached by the old process itself, which accepts again; those passed die with it.
//! Connections that cannot be handed over (not TLS, agents over plain TCP, a client that has
//! ended its half) stay until the deadline and close with the old process.
//!
//! Under systemd (`Type=notify`, [`crate::notify`]): the old process says `RELOADING=1`, the
//! successor `MAINPID=` itself and `READY=1` before it tells the old process it is ready (so
//! the old one's exit is not the service's), and an old process that serves on after a failed
//! successor claims the main pid back.

pub(crate) mod attach;
pub(crate) mod channel;
pub(crate) mod give;
pub(crate) mod state;
pub(crate) mod successor;
pub(crate) mod take;
