//! What the HTTP layer knows about the TLS connection it runs on: from rustls after a
//! handshake here, or from the session object of a connection that migrated here.

use std::net::SocketAddr;
use std::sync::Arc;

use baton_session::migration::SessionObject;

use crate::access_log::{AccessLog, ConnFields, Handshake, Migrated};
use crate::early::EarlyState;

/// What the HTTP layer knows about the TLS connection it runs on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub version: &'static str,
    pub suite: String,
    pub alpn: Option<String>,
    pub sni: Option<String>,
    pub resumed: bool,
    /// Subject of the verified client certificate (mutual TLS), RFC 4514.
    pub client_subject: Option<String>,
    /// A connection whose early data (0-RTT) was accepted: says whether its handshake is
    /// still running, i.e. whether a request read now came in early data.
    pub early: Option<Arc<EarlyState>>,
    /// The connection's part of the access log, when there is one (see `access_log`).
    pub log: Option<Arc<crate::access_log::ConnLog>>,
}

impl ConnInfo {
    /// With its part of the access log, when there is a log (`migrated`: how its session came).
    pub fn logged(mut self, log: Option<&AccessLog>, migrated: Migrated) -> ConnInfo {
        if let Some(log) = log {
            let handshake = if self.early.is_some() {
                Handshake::EarlyData
            } else if self.resumed {
                Handshake::Resumed
            } else {
                Handshake::Full
            };
            self.log = Some(log.connection(ConnFields {
                peer: self.peer,
                sni: self.sni.as_deref().map(Box::from),
                version: self.version,
                suite: Box::from(self.suite.as_str()),
                alpn: self.alpn.as_deref().map(Box::from),
                handshake,
                migrated,
                agent_id: 0,
            }));
        }
        self
    }

    /// What a home agent is told about this connection when it moves there.
    pub fn application(&self) -> baton_migrate::extract::Application<'_> {
        baton_migrate::extract::Application {
            resumed: self.resumed,
            alpn: self.alpn.as_deref(),
            sni: self.sni.as_deref(),
            client_subject: self.client_subject.as_deref(),
        }
    }

    /// What rustls negotiated on a server connection (no early data: see `early_tls`).
    pub fn of(peer: SocketAddr, tls: &rustls::ServerConnection) -> ConnInfo {
        ConnInfo {
            peer,
            version: match tls.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "TLSv1.3",
            },
            suite: tls
                .negotiated_cipher_suite()
                .map(|s| format!("{:?}", s.suite()))
                .unwrap_or_default(),
            alpn: tls
                .alpn_protocol()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            sni: tls.server_name().map(String::from),
            resumed: tls.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
            client_subject: tls
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(crate::certs::subject_of),
            early: None,
            log: None,
        }
    }
    /// What the HTTP side is told about a connection that migrated here.
    pub fn migrated(obj: &SessionObject, peer: SocketAddr) -> ConnInfo {
        ConnInfo {
            peer,
            version: if obj.version == 0x0304 {
                "TLSv1.3"
            } else {
                "TLSv1.2"
            },
            suite: format!("{:?}", rustls::CipherSuite::from(obj.suite)),
            alpn: obj
                .alpn
                .as_ref()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            sni: obj.sni.clone(),
            resumed: obj.resumed,
            client_subject: obj.client_subject.clone(),
            // Early data never rides a migration: a migrated connection's handshake is over.
            early: None,
            log: None,
        }
    }
}
