//! The TLS engine under an HTTP/1.1 connection: rustls (the handshake was done here) or the
//! record layer (the session moved here from another agent, or the connection parked on it
//! while it idled: `park`). Both wait for requests the same way, and both can move on
//! again when this agent drains, so the HTTP/1.1 loop (`http1`) and the move
//! (`migration::export`) see one type.

use std::io;
use std::pin::Pin;
use std::task::{self, Poll};

use baton_migrate::Splitter;
use baton_session::migration::SessionObject;
use rustls::ProtocolVersion;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use super::decide::Waited;
use super::io::ConnIo;
use super::transport::AgentIo;
use crate::context::Context;
use crate::migration::stream::MigratedStream;
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

    /// Waits, without reading any plaintext, until request bytes are there (decrypted and
    /// waiting, or the socket is readable and what arrived decrypts to some) or the peer
    /// closed. Bytes that decrypt to nothing (a record trickled in) do not extend the wait past
    /// `until`. A drain ends only a `later` wait (for a keep-alive connection's next request):
    /// a new connection's client connected while we served, and gets its answer. So does an
    /// operator's drain at a dispatcher (shedding), for a connection that can move. With
    /// `park_at` before `until`, a wait still without a request then ends as `Park`.
    /// `begun` tells whether part of a request has come during the wait (the caller keeps it
    /// across the calls of one wait): a `later` wait that ends at `until` with none come (not
    /// a byte, or only whole records that carry no request, such as a KeyUpdate) is a keep-alive
    /// connection's idle timeout, not a slow request, and is not counted as one.
    pub(crate) async fn wait_request(
        &mut self,
        ctx: &Context,
        until: Instant,
        later: bool,
        movable: bool,
        park_at: Option<Instant>,
        begun: &mut bool,
    ) -> Waited {
        let mut shedding = ctx.shedding.subscribe();
        let park_at = park_at.filter(|&p| p < until);
        let mut read_some = false;
        loop {
            if self.request_here() {
                return Waited::Request;
            }
            if read_some {
                // Whole records that carry no request (a TLS 1.3 KeyUpdate) are not the start
                // of one; part of a record may be.
                *begun = self.mid_record();
            }
            // one timer for both: the park time comes first, if there is one
            tokio::select! {
                r = self.io().readable() => if r.is_err() { return Waited::End },
                _ = ctx.draining.cancelled(), if later => return Waited::Drain,
                _ = shedding.wait_for(|shed| *shed), if later && movable => return Waited::Drain,
                _ = tokio::time::sleep_until(park_at.unwrap_or(until)) => {
                    if park_at.is_some() {
                        return Waited::Park;
                    }
                    if !later || *begun {
                        ctx.metrics.slow_request(false);
                    }
                    return Waited::End;
                }
            }
            let read = match self {
                Engine::Rustls(s) => {
                    let (io, tls) = s.get_mut();
                    tls.read_tls(&mut SyncRead(io))
                }
                Engine::Layer(s) => s.read_available(),
            };
            match read {
                Ok(0) => return Waited::Request, // EOF: hyper sees it and ends the connection
                Ok(_) => read_some = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Waited::End,
            }
        }
    }

    /// Whether what was read ends inside a record (processed as far as it goes). Unknown
    /// (records not followed) counts as inside one.
    fn mid_record(&mut self) -> bool {
        match self {
            Engine::Rustls(s) => s.get_ref().0.records_at_boundary() != Some(true),
            Engine::Layer(s) => s.mid_record(),
        }
    }

    /// Whether what the engine holds already answers a wait: plaintext, the peer's close, or
    /// an error (hyper meets it and closes cleanly).
    fn request_here(&mut self) -> bool {
        match self {
            Engine::Rustls(s) => match s.get_mut().1.process_new_packets() {
                Ok(state) => state.plaintext_bytes_to_read() > 0 || state.peer_has_closed(),
                Err(_) => true,
            },
            Engine::Layer(s) => {
                s.decrypt_buffered();
                s.has_plaintext() || s.ended()
            }
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

/// `std::io::Read` over a non-blocking socket, for `rustls::read_tls`.
struct SyncRead<'a>(&'a mut ConnIo<AgentIo>);

impl io::Read for SyncRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}
