//! HTTP for a connection's whole life, in one hyper connection: HTTP/2 on any connection,
//! and HTTP/1.1 on one that took early data (it neither waits between requests nor parks,
//! as `http1` does); bounded by the first request's pace, the agent's drain and, for HTTP/2,
//! the bounds in `h2bounds`.

use std::pin::Pin;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::time::Instant;

use super::one_request;
use super::pace::{self, HeadPace, RequestState, TooSlow};
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::h2bounds::{self, Limits};
use crate::h2watch::{Action, Signal, Watched};

/// HTTP/2 over any established TLS stream; the first request must be in by `first_by`, and
/// the connection keeps the bounds in `h2bounds` (heads, idle time, cancelled streams).
pub(crate) async fn serve_h2<S>(stream: S, info: ConnInfo, first_by: Instant, ctx: &Arc<Context>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &ctx.config;
    let peer = info.peer;
    let info = Arc::new(info);
    let http = ctx.http.clone();
    let (state, pace) = first_request(first_by);
    let seen = state.clone();
    let service = service_fn(move |req| {
        seen.saw_head();
        http.clone().handle(info.clone(), req)
    });
    let limits = Limits {
        header_timeout: cfg.header_timeout,
        min_header_rate: cfg.min_header_rate,
        idle_timeout: cfg.idle_timeout,
        max_resets: cfg.h2_max_resets,
    };
    let signal = Arc::new(Signal::default());
    let watched = Watched::new(stream, limits, signal.clone(), ctx.metrics.clone());
    let io = TokioIo::new(watched);
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(cfg.max_header_bytes as u32)
        .max_concurrent_streams(cfg.h2_max_streams)
        .max_pending_accept_reset_streams(h2bounds::PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(h2bounds::LOCAL_ERROR_RESETS)
        .keep_alive_interval(cfg.h2_keepalive)
        .keep_alive_timeout(cfg.h2_keepalive_timeout);
    if ctx.http.proxy.is_some() {
        // RFC 8441: WebSockets over HTTP/2, passed on to the upstream (`websocket`)
        builder.enable_connect_protocol();
    }
    // Boxed, so its size is paid only once HTTP starts, not by every connection's task.
    let conn = Box::pin(builder.serve_connection(io, service));
    if let Err(e) = drive(conn, pace, &state, Some(&signal), ctx).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// How long a cut HTTP/2 connection has for its GOAWAY to leave before it is closed.
const CUT_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs an HTTP connection to its end: gracefully (in-flight requests finish) once the agent
/// drains, at once if the first request's head falls behind its pace (counted as a slow
/// request, which is not an error of the connection). An HTTP/2 connection's `signal` asks for
/// a GOAWAY when it idles, a close when it idles on, a GOAWAY and a close when it is cut.
async fn drive<C>(
    mut conn: Pin<Box<C>>,
    pace: HeadPace,
    state: &RequestState,
    signal: Option<&Signal>,
    ctx: &Context,
) -> Result<(), C::Error>
where
    C: GracefulConnection,
{
    let next = || async move {
        match signal {
            Some(s) => s.next().await,
            None => std::future::pending().await,
        }
    };
    let overdue = pace::overdue(pace, state);
    tokio::pin!(overdue);
    loop {
        tokio::select! {
            r = conn.as_mut() => return r,
            _ = ctx.draining.cancelled() => {
                // HTTP/2 (GOAWAY: its streams finish) and migrated connections are not moved
                ctx.metrics.handoff.drain_closed();
                conn.as_mut().graceful_shutdown();
                return conn.await;
            }
            why = &mut overdue => {
                ctx.metrics.slow_request(why == TooSlow::Rate);
                return Ok(());
            }
            action = next() => match action {
                Action::Goaway => conn.as_mut().graceful_shutdown(),
                Action::Close => return Ok(()),
                Action::Cut => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(CUT_LINGER, conn.as_mut()).await;
                    return Ok(());
                }
            },
        }
    }
}

/// HTTP/1.1 (keep-alive, pipelining) or HTTP/2 by ALPN over any other stream (a connection
/// that took early data: `early_tls`). One hyper connection for its life: it neither waits
/// between requests as `serve_http1` does nor parks.
pub(crate) async fn serve_stream<S>(
    stream: S,
    info: ConnInfo,
    first_by: Instant,
    ctx: &Arc<Context>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if info.alpn.as_deref() == Some("h2") {
        return serve_h2(stream, info, first_by, ctx).await;
    }
    let cfg = &ctx.config;
    let peer = info.peer;
    let info = Arc::new(info);
    let http = ctx.http.clone();
    let (state, pace) = first_request(first_by);
    let seen = state.clone();
    let service = service_fn(move |req| {
        seen.saw_head();
        http.clone().handle(info.clone(), req)
    });
    let builder = one_request::builder(cfg);
    let conn = Box::pin(builder.serve_connection(TokioIo::new(stream), service));
    if let Err(e) = drive(conn, pace, &state, None, ctx).await {
        tracing::debug!(%peer, error = %e, "migrated connection ended with an error");
    }
}

/// The state and pace of a connection's first request, due by `first_by` (no rate minimum:
/// for HTTP/2 and migrated connections, whose heads hyper reads without a per-request reader).
fn first_request(first_by: Instant) -> (Arc<RequestState>, HeadPace) {
    let pace = HeadPace {
        start: Instant::now(),
        first_by: Some(first_by),
        min_rate: 0,
    };
    (Arc::new(RequestState::default()), pace)
}
