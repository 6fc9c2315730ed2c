//! Parking idle HTTP/1.1 connections: what a keep-alive connection holds while it
//! waits for the client's next request (or its first), which is most of a connection's life.
//!
//! A connection works in a large future (the handshake, hyper, a move: about 17 KB) and rustls
//! keeps buffers it never gives back (a 4 KiB read buffer, and more). Once a wait for a request
//! has lasted `--park-after`, the connection parks: a rustls connection moves onto the record
//! layer (`baton_record`, as a migrated session does: key, IV, sequence numbers and the TLS 1.3
//! traffic secrets, so KeyUpdates go on), the layer's empty buffers are given back, and the
//! large future ends. What stays is [`Parked`]: the socket, the record layer and the
//! connection's facts, waited on by a small loop (`http1::idle`) in the connection's own task. When
//! the client sends, the agent drains, or it is drained at a dispatcher, the connection's full
//! state is built again (boxed, so it is paid only while the connection works) and serves on
//! from the record layer.
//!
//! A connection parks only with nothing in flight: rustls holds no ciphertext it has not
//! decrypted (the stream's records are followed from the first byte, and the last one read is
//! whole), no plaintext, nothing to send; the suite is one the record layer has; and a TLS 1.3
//! connection's traffic secrets were captured (the key log). Otherwise it waits on as before.
//! HTTP/2 connections never park; one that took early data can once its first request has
//! been answered and its handshake has ended (`early_tls`).

use std::sync::Arc;
use std::task::Poll;

use tokio::time::Instant;
use zeroize::Zeroizing;

use super::decide::Waited;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::metrics::Metrics;
use crate::transport::agent_io::AgentIo;
use crate::transport::conn_io::ConnIo;
use crate::transport::engine::Engine;
use crate::transport::migrated::MigratedStream;
use baton_migrate::extract;
use baton_migrate::secrets::TrafficSecrets;

/// A connection served from the record layer.
pub(crate) type Layered = Box<MigratedStream<ConnIo<AgentIo>>>;

/// An HTTP/1.1 connection parked between requests: all it keeps.
pub(crate) struct Parked {
    /// The socket and the record layer, its buffers given back.
    pub(crate) stream: Layered,
    pub(crate) info: Arc<ConnInfo>,
    pub(crate) ctx: Arc<Context>,
    /// Whether the dispatcher can move it to another agent.
    pub(crate) movable: bool,
    /// The first request's deadline, until it has come.
    pub(crate) first: Option<Instant>,
    /// When the wait for the request ends: the first request's deadline, or the idle timeout
    /// from when the wait began (parking does not move it).
    pub(crate) until: Instant,
}

/// How an attempt to park went.
pub(crate) enum Parking {
    Parked(Layered),
    /// Not now (something in flight): the engine waits on, and may park at its next wait.
    Later(Engine),
    /// Never: rustls must keep this connection (no traffic secrets, records not followed).
    Never(Engine),
    /// Taken out of rustls but refused by the record layer: the connection is lost.
    Lost,
}

/// Takes an idle connection's engine down to the record layer and its keys. `secrets`: a
/// rustls connection's TLS 1.3 traffic secrets (the record layer keeps its own). Not async (so
/// that the future of whoever parks stays small): [`flush_now`] first, if the engine is not
/// [`settled`].
pub(crate) fn park(mut engine: Engine, secrets: &TrafficSecrets) -> Parking {
    if let Engine::Rustls(tls) = &mut engine {
        let (io, conn) = tls.get_mut();
        if !extract::layer_can_carry(conn, secrets) || io.records_at_boundary().is_none() {
            return Parking::Never(engine);
        }
    }
    if !settled(&mut engine) {
        return Parking::Later(engine);
    }
    match engine {
        Engine::Layer(s) => Parking::Parked(s),
        Engine::Rustls(tls) => {
            let (mut io, conn) = tls.into_inner();
            // the layer knows where the records stand from here on
            io.take_records();
            match extract::into_layer(conn, secrets) {
                Ok((layer, (version, suite))) => {
                    let s = MigratedStream::new(io, layer, Zeroizing::new(Vec::new()))
                        .negotiated(version, suite);
                    Parking::Parked(Box::new(s))
                }
                Err(extract::ExtractFailed) => Parking::Lost,
            }
        }
    }
}

/// Sends what the engine has queued if the socket takes it now, without waiting.
pub(crate) async fn flush_now(engine: &mut Engine) {
    let _ = std::future::poll_fn(|cx| {
        Poll::Ready(tokio::io::AsyncWrite::poll_flush(
            std::pin::Pin::new(&mut *engine),
            cx,
        ))
    })
    .await;
}

/// Whether the engine holds nothing in flight: no ciphertext it has not decrypted, no
/// plaintext, nothing to send, the peer not closed (nor the layer failed).
pub(crate) fn settled(engine: &mut Engine) -> bool {
    match engine {
        Engine::Rustls(tls) => {
            let (io, conn) = tls.get_mut();
            io.records_at_boundary() == Some(true)
                && extract::extractable(conn)
                && conn
                    .process_new_packets()
                    .is_ok_and(|s| s.plaintext_bytes_to_read() == 0)
        }
        // (the layer's empty buffers are given back on the way)
        Engine::Layer(s) => !s.ended() && s.release_buffers(),
    }
}

/// A connection counted as parked (`baton_connections_parked`) while this lives.
struct Counted(Arc<Metrics>);

impl Counted {
    fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.parked(true);
        Counted(metrics.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.parked(false);
    }
}

impl Parked {
    /// Waits as `Engine::wait_request` does, reading nothing, counted as parked meanwhile:
    /// `Request` once the socket is readable (or closed), `Drain` as it would, `End` at the
    /// deadline or the idle timeout. (Then `http1::resume`, unless it ended.)
    pub(crate) async fn wait(&mut self) -> Waited {
        let _counted = Counted::new(&self.ctx.metrics);
        let later = self.first.is_none();
        let ctx = &*self.ctx;
        let mut shedding = ctx.shedding.subscribe();
        tokio::select! {
            r = self.stream.io_mut().readable() => match r {
                Ok(()) => Waited::Request,
                Err(_) => Waited::End,
            },
            _ = ctx.draining.cancelled(), if later => Waited::Drain,
            _ = shedding.wait_for(|shed| *shed), if later && self.movable => Waited::Drain,
            _ = tokio::time::sleep_until(self.until) => {
                // A parked connection holds no part of a request (it parks only settled): at
                // a later wait's end it is idle, not slow.
                if !later {
                    ctx.metrics.slow_request(false);
                }
                Waited::End
            }
        }
    }
}
