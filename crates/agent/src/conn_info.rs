//! What the HTTP layer knows about the TLS connection it runs on: from rustls after a
//! handshake here, or from the session object of a connection that migrated here.

use std::net::SocketAddr;
use std::sync::Arc;

use baton_session::migration::SessionObject;

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
