//! Waiting for the next request on a connection's TLS engine (`crate::transport::engine`):
//! the read-ahead that lets an idle HTTP/1.1 connection park, move or end without reading any
//! plaintext.

use std::io;

use tokio::time::Instant;

use super::decide::Waited;
use crate::context::Context;
use crate::transport::agent_io::AgentIo;
use crate::transport::conn_io::ConnIo;
use crate::transport::engine::Engine;

impl Engine {
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

    /// Whether what was read ends inside a record, as far as the engine knows (records not
    /// followed: not).
    pub(crate) fn inside_record(&mut self) -> bool {
        match self {
            Engine::Rustls(s) => s.get_ref().0.records_at_boundary() == Some(false),
            Engine::Layer(s) => s.mid_record(),
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
}

/// `std::io::Read` over a non-blocking socket, for `rustls::read_tls`.
struct SyncRead<'a>(&'a mut ConnIo<AgentIo>);

impl io::Read for SyncRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}
