//! One HTTP/1.1 request in a hyper connection of its own, on any stream (rustls, the record
//! layer, a connection still in its 0-RTT handshake): hyper reads the head under its pace
//! (`pace`), the service answers, and once a keep-alive response has been handed to hyper
//! whole, hyper reads no more and is dissolved (its ~16 KiB of buffers freed): the stream
//! comes back at a request boundary, with what hyper read past it, for the next wait.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::server::conn::http1::Builder;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::decide::{self, Next};
use super::pace::{self, HeadPace, RequestState, TooSlow};
use super::prefixed::Prefixed;
use crate::body::on_end;
use crate::config::AgentConfig;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::http::wants_keep_alive;

/// hyper's HTTP/1.1 server with the agent's bounds on heads and buffers.
pub(crate) fn builder(cfg: &AgentConfig) -> Builder {
    let mut builder = Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_headers(cfg.max_headers)
        .max_header_size(cfg.max_header_bytes)
        // Bounds what one connection may buffer (pipelined requests, body reads).
        .max_buf_size(cfg.max_header_bytes.max(64 * 1024));
    builder
}

/// Serves one request on `stream`, `ahead` (bytes already read) first; gives the stream back
/// with what hyper read after the request, or `None` when the connection ends here (the
/// client's `Connection: close`, an error: closed; a request too slow: counted, dropped).
pub(crate) async fn serve<S>(
    stream: S,
    ahead: bytes::Bytes,
    pace: HeadPace,
    info: &Arc<ConnInfo>,
    ctx: &Context,
    builder: &Builder,
) -> Option<(S, bytes::Bytes)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(RequestState::default());
    // Set by the service when a keep-alive response has been handed to hyper whole.
    let whole = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(AtomicBool::new(false));
    let http = ctx.http.clone();
    // The upstream's side of a WebSocket, once it has said 101: the stream is joined to it.
    // (Only a proxy switches protocols: the built-in responder allocates nothing for it.)
    let switched = ctx
        .http
        .proxy
        .is_some()
        .then(|| Arc::new(std::sync::Mutex::new(None)));
    let (i, n, p, seen, sw) = (
        info.clone(),
        whole.clone(),
        gate.clone(),
        state.clone(),
        switched.clone(),
    );
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        seen.saw_head();
        let keep_alive = wants_keep_alive(&req);
        let (http, i, n, p, sw) = (http.clone(), i.clone(), n.clone(), p.clone(), sw.clone());
        // boxed: hyper needs an Unpin future to hand the stream back
        Box::pin(async move {
            let mut resp = http.handle(i, req).await?;
            if let (Some(sw), Some(upstream)) = (&sw, crate::websocket::upstream_of(&mut resp)) {
                *sw.lock().unwrap_or_else(|e| e.into_inner()) = Some(upstream);
            }
            Ok::<_, std::convert::Infallible>(if keep_alive {
                resp.map(|b| {
                    on_end(b, move || {
                        p.store(true, Ordering::Relaxed);
                        n.notify_one();
                    })
                })
            } else {
                resp
            })
        })
    });
    // Once the response is whole, hyper reads no more: the next request must wait for the
    // stream, not start in this hyper connection that is about to shut down.
    let io = TokioIo::new(Prefixed {
        ahead,
        inner: stream,
        gate: Some(gate.clone()),
        state: Some(state.clone()),
    });
    let mut conn = Box::pin(builder.serve_connection(io, service));
    let result = loop {
        tokio::select! {
            r = std::future::poll_fn(|cx| conn.as_mut().poll_without_shutdown(cx)) => break r,
            // hyper has the whole response: stop after it instead of waiting for another.
            // (A drain needs no branch: this hyper connection serves one request, whose
            // bytes are here, and the next wait meets the drain. Shutting hyper down before
            // it has read them would close the connection unanswered.)
            _ = whole.notified() => conn.as_mut().graceful_shutdown(),
            why = pace::overdue(pace, &state) => {
                ctx.metrics.slow_request(why == TooSlow::Rate);
                return None;
            }
        }
    };
    let parts = Pin::into_inner(conn).into_parts();
    let Prefixed {
        ahead: left,
        inner: mut stream,
        ..
    } = parts.io.into_inner();
    if let Err(e) = &result {
        tracing::debug!(peer = %info.peer, error = %e, "connection ended with an error");
    }
    let upstream = switched.and_then(|sw| sw.lock().unwrap_or_else(|e| e.into_inner()).take());
    if let (Some(upstream), true) = (upstream, result.is_ok()) {
        // hyper wrote the 101 and stopped: the rest of the connection is the WebSocket's, here
        // until it ends (never back to waiting for requests: not parked, not moved)
        let client = Prefixed {
            ahead: [parts.read_buf, left].concat().into(),
            inner: stream,
            gate: None,
            state: None,
        };
        let drain = crate::websocket::Drain {
            draining: ctx.draining.clone(),
            within: ctx.config.drain_timeout,
        };
        crate::websocket::tunnel(client, upstream, drain).await;
        return None;
    }
    if decide::after_request(result.is_ok(), gate.load(Ordering::Relaxed)) == Next::Close {
        // close_notify, then FIN
        let close = tokio::io::AsyncWriteExt::shutdown(&mut stream);
        let _ = tokio::time::timeout(ctx.config.idle_timeout, close).await;
        return None;
    }
    // what hyper read ahead comes first, then anything still unread in the prefix
    Some((stream, [parts.read_buf, left].concat().into()))
}
