//! The TLS engine under an HTTP/1.1 connection: rustls (the handshake was done here) or the
//! record layer (the session moved here from another agent, or the connection parked on it
//! while it idled: `conn::park`). Both wait for requests the same way (`conn::engine`), and
//! both can move on again when this agent drains, so the HTTP/1.1 loop (`conn::http1`) and
//! the move (`migration::export`) see one type.

use std::io;
use std::pin::Pin;
use std::task::{self, Poll};

use baton_migrate::Splitter;
use baton_session::migration::SessionObject;
use rustls::ProtocolVersion;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;

use super::agent_io::AgentIo;
use super::conn_io::ConnIo;
use super::migrated::MigratedStream;
use baton_migrate::extract::{self, ExtractFailed, Extras};

/// A connection handshaken here, served by rustls (through tokio-rustls).
pub(crate) type RustlsStream = TlsStream<ConnIo<AgentIo>>;

/// A connection's TLS engine. Both variants are boxed: the engine is moved in and out of the
/// futures that serve it, and each of those is as large as the engine (a parked connection's
/// wake-up allocates and copies one); a rustls stream is 1.3 KB.
pub(crate) enum Engine {
    Rustls(Box<RustlsStream>),
    Layer(Box<MigratedStream<ConnIo<AgentIo>>>),
}

impl Engine {
    pub(crate) fn io(&mut self) -> &mut ConnIo<AgentIo> {
        match self {
            Engine::Rustls(s) => s.get_mut().0,
            Engine::Layer(s) => s.io_mut(),
        }
    }

    pub(crate) fn is_tls13(&self) -> bool {
        match self {
            Engine::Rustls(s) => s.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3),
            Engine::Layer(s) => s.negotiated_suite().0 == 0x0304,
        }
    }

    /// Where the client's records stand in what was read (a move cuts at a boundary);
    /// `None` if they were not followed, or the stream held something else.
    pub(crate) fn records(&mut self) -> Option<Splitter> {
        match self {
            Engine::Rustls(s) => s.get_mut().0.take_records(),
            Engine::Layer(s) => s.records().ok(),
        }
    }

    /// Gives the engine whole client records and appends all the plaintext it then holds to
    /// `plain`; returns how much it appended.
    pub(crate) fn decrypt(&mut self, tls: &[u8], plain: &mut Vec<u8>) -> Result<usize, String> {
        match self {
            Engine::Rustls(s) => {
                extract::decrypt(s.get_mut().1, tls, plain).map_err(|e| e.to_string())
            }
            Engine::Layer(s) => s.decrypt(tls, plain),
        }
    }

    /// Whether the session can be taken out without losing anything.
    pub(crate) fn extractable(&mut self) -> bool {
        match self {
            Engine::Rustls(s) => extract::extractable(s.get_mut().1),
            Engine::Layer(s) => s.keys_at_rest().is_some(),
        }
    }

    /// Takes the session out (check [`Engine::extractable`] first): the socket, and the object
    /// that carries it on elsewhere. The engine is consumed either way.
    pub(crate) fn extract(
        self,
        extras: Extras<'_>,
    ) -> Result<(ConnIo<AgentIo>, SessionObject), ExtractFailed> {
        match self {
            Engine::Rustls(s) => {
                let (io, conn) = s.into_inner();
                Ok((io, extract::extract(conn, extras)?))
            }
            Engine::Layer(s) => {
                let keys = s.keys_at_rest().ok_or(ExtractFailed)?;
                let obj = extract::from_layer(&keys, s.negotiated_suite(), extras)?;
                Ok((s.into_io(), obj))
            }
        }
    }
}

impl AsyncRead for Engine {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Engine::Rustls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Engine::Layer(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Engine {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Engine::Rustls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Engine::Layer(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Engine::Rustls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Engine::Layer(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Engine::Rustls(s) => s.is_write_vectored(),
            Engine::Layer(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Engine::Rustls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Engine::Layer(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Engine::Rustls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Engine::Layer(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
