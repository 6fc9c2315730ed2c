//! The first HTTP/1.1 request of a connection whose early data was accepted (`early_tls`),
//! answered on the connection as `early_tls` drives it: at once, before the client's Finished
//! has come (0.5-RTT data). One hyper connection for that one request, as `http1::serve_http1`
//! serves each: once the response is whole, hyper reads no more and the stream comes back, at
//! a request boundary, for the path every connection takes after it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::time::Instant;

use super::early_tls::EarlyConn;
use super::pace::{self, HeadPace, RequestState, TooSlow};
use super::prefixed::Prefixed;
use crate::body::on_end;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::http::wants_keep_alive;

/// Serves the first request on `conn`; gives the connection back with what hyper read after
/// the request, or `None` when the connection ends here (the client's `Connection: close`, an
/// error, a request too slow).
pub(crate) async fn serve_first(
    conn: EarlyConn,
    info: ConnInfo,
    first_by: Instant,
    ctx: &Arc<Context>,
) -> Option<(EarlyConn, bytes::Bytes)> {
    let cfg = &ctx.config;
    let peer = info.peer;
    let info = Arc::new(info);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_headers(cfg.max_headers)
        .max_header_size(cfg.max_header_bytes)
        .max_buf_size(cfg.max_header_bytes.max(64 * 1024));
    let state = Arc::new(RequestState::default());
    let pace = HeadPace {
        start: Instant::now(),
        first_by: Some(first_by),
        min_rate: cfg.min_header_rate,
    };
    // Set by the service when a keep-alive response has been handed to hyper whole.
    let whole = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(AtomicBool::new(false));
    let http = ctx.http.clone();
    let (n, p, seen) = (whole.clone(), gate.clone(), state.clone());
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        seen.saw_head();
        let keep_alive = wants_keep_alive(&req);
        let (http, i, n, p) = (http.clone(), info.clone(), n.clone(), p.clone());
        Box::pin(async move {
            let resp = http.handle(i, req).await?;
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
    let io = TokioIo::new(Prefixed {
        ahead: bytes::Bytes::new(),
        inner: conn,
        gate: Some(gate.clone()),
        state: Some(state.clone()),
    });
    let mut http1 = Box::pin(builder.serve_connection(io, service));
    let result = loop {
        tokio::select! {
            r = std::future::poll_fn(|cx| http1.as_mut().poll_without_shutdown(cx)) => break r,
            _ = whole.notified() => http1.as_mut().graceful_shutdown(),
            why = pace::overdue(pace, &state) => {
                ctx.metrics.slow_request(why == TooSlow::Rate);
                return None;
            }
        }
    };
    let parts = Pin::into_inner(http1).into_parts();
    let Prefixed {
        ahead: left,
        inner: mut conn,
        ..
    } = parts.io.into_inner();
    if let Err(e) = &result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
    if result.is_err() || !gate.load(Ordering::Relaxed) {
        let close = tokio::io::AsyncWriteExt::shutdown(&mut conn);
        let _ = tokio::time::timeout(cfg.idle_timeout, close).await;
        return None;
    }
    Some((conn, [parts.read_buf, left].concat().into()))
}
