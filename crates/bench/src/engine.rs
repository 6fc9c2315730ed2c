//! The seam between a transaction and the TLS library that speaks for it: `--engine rustls`
//! (the default, [`crate::tls`]) or `--engine openssl` ([`crate::openssl_engine`]). Each
//! engine builds its per-virtual-client state once, runs the handshake, and reports what was
//! negotiated and whether it resumed; after that a transaction only sees a [`TlsIo`] stream.

use std::future::Future;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::{BenchConfig, Engine};
use crate::openssl_engine::{OsslClient, OsslTls};
use crate::tls::{ClientSessions, Tls};

/// What every virtual client shares, per engine.
pub enum TlsEngine {
    Rustls(Box<Tls>),
    Openssl(OsslTls),
}

impl TlsEngine {
    pub fn new(cfg: &BenchConfig) -> anyhow::Result<Self> {
        Ok(match cfg.engine {
            Engine::Rustls => Self::Rustls(Box::new(Tls::new(cfg)?)),
            Engine::Openssl => Self::Openssl(OsslTls::new(cfg)?),
        })
    }

    /// One virtual client's TLS state (its config and its own sessions).
    pub fn client(&self) -> ClientTls {
        match self {
            Self::Rustls(tls) => {
                let (config, sessions) = tls.client();
                ClientTls::Rustls {
                    config,
                    sessions,
                    server_name: tls.server_name.clone(),
                }
            }
            Self::Openssl(tls) => ClientTls::Openssl(tls.client()),
        }
    }
}

/// One virtual client's TLS state.
pub enum ClientTls {
    Rustls {
        config: Arc<ClientConfig>,
        sessions: Arc<ClientSessions>,
        server_name: ServerName<'static>,
    },
    Openssl(OsslClient),
}

impl ClientTls {
    /// Drops the client's sessions: its next handshake is full.
    pub fn forget(&self) {
        match self {
            Self::Rustls { sessions, .. } => sessions.forget(),
            Self::Openssl(c) => c.forget(),
        }
    }
}

/// A client TLS stream after its handshake.
pub trait TlsIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Sends close_notify (the caller bounds it with its timeout).
    fn close_notify(&mut self) -> impl Future<Output = ()> + Send;
}

impl TlsIo for tokio_rustls::client::TlsStream<TcpStream> {
    async fn close_notify(&mut self) {
        // then `close` on drop sends the FIN (a `shutdown` first would only add a system call)
        self.get_mut().1.send_close_notify();
        let _ = self.flush().await;
    }
}

impl TlsIo for tokio_openssl::SslStream<TcpStream> {
    async fn close_notify(&mut self) {
        // SSL_shutdown: tokio-openssl's only way to send close_notify (it then shuts the TCP
        // write side too)
        let _ = self.shutdown().await;
    }
}
