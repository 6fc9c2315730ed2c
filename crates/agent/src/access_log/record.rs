//! What a connection's lines say about it, and the record of a connection that carried no
//! request.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// How the connection's TLS session began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Handshake {
    #[default]
    Full,
    Resumed,
    /// Resumed, with early data accepted.
    EarlyData,
}

impl Handshake {
    pub fn label(self) -> &'static str {
        match self {
            Handshake::Full => "full",
            Handshake::Resumed => "resumed",
            Handshake::EarlyData => "0-rtt",
        }
    }
}

/// Whether the session was handshaken here or arrived by migration, and from which agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Migrated {
    /// Handshaken on this agent.
    #[default]
    No,
    /// Moved here from this agent id.
    From(u16),
    /// Moved here, from an agent the session object does not name.
    Unknown,
}

/// What a connection's lines say about it, fixed once its handshake is done.
#[derive(Debug, Clone)]
pub struct ConnFields {
    /// The client, as the PROXY header named it (or the TCP peer).
    pub peer: SocketAddr,
    pub sni: Option<Box<str>>,
    pub version: &'static str,
    pub suite: Box<str>,
    pub alpn: Option<Box<str>>,
    pub handshake: Handshake,
    pub migrated: Migrated,
    pub agent_id: u16,
}

impl Default for ConnFields {
    fn default() -> Self {
        ConnFields {
            peer: SocketAddr::from(([0, 0, 0, 0], 0)),
            sni: None,
            version: "-",
            suite: Box::from(""),
            alpn: None,
            handshake: Handshake::Full,
            migrated: Migrated::No,
            agent_id: 0,
        }
    }
}

/// A connection that carried no request, at its end.
#[derive(Debug)]
pub struct ConnLine {
    pub fields: ConnFields,
    pub at: SystemTime,
    pub lasted: Duration,
}
