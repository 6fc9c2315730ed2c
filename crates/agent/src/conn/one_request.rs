//! HTTP/1.1 requests in a hyper connection, on any stream (rustls, the record layer, a
//! connection still in its 0-RTT handshake): hyper reads each head under its pace (`pace`),
//! the service answers, and at a request boundary (a keep-alive response handed to hyper
//! whole, hyper reading no more) the hyper connection is dissolved (its ~16 KiB of buffers
//! freed): the stream comes back with what hyper read past it, for the next wait.
//!
//! Request at a time (no [`Keep`]), the stream comes back after each request. Kept, hyper
//! goes on to the next request while it comes within the park time and no drain is pending,
//! and the stream comes back only when that wait ends (the connection parks, moves or
//! closes from there): a busy keep-alive connection costs one hyper connection per burst
//! instead of one per request. When it keeps hyper is decided in `decide`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1::Builder;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::decide::{self, Next, Waited};
use super::pace::{self, HeadPace, RequestState, TooSlow};
use super::prefixed::{Prefixed, Turn};
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

/// Keeping hyper from one request to the next (`decide::keep_for`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    /// How long hyper waits for the next request before the stream goes back (to park).
    pub(crate) wait: Duration,
    /// Whether a dispatcher's drain (shedding) moves the connection.
    pub(crate) movable: bool,
}

/// The stream back at a request boundary.
pub(crate) struct Served<S> {
    pub(crate) stream: S,
    /// What hyper read past the last request.
    pub(crate) ahead: bytes::Bytes,
    /// How the wait for the next request has already ended in hyper (kept: `Drain` or
    /// `Park`), and when it began (the last response sent).
    pub(crate) waited: Option<(Waited, Instant)>,
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
    let served = serve_requests(stream, ahead, pace, info, ctx, builder, None).await?;
    Some((served.stream, served.ahead))
}

/// Serves requests on `stream`, `ahead` first: one, or (`keep`) as many as come each within
/// the park time of the last response while no drain is pending. `None` as for [`serve`].
pub(crate) async fn serve_requests<S>(
    stream: S,
    ahead: bytes::Bytes,
    pace: HeadPace,
    info: &Arc<ConnInfo>,
    ctx: &Context,
    builder: &Builder,
    keep: Option<Keep>,
) -> Option<Served<S>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(RequestState::default());
    // Set when a keep-alive response has been handed to hyper whole (and, kept, sent).
    let turn = Arc::new(Turn::new(keep.is_some()));
    let http = ctx.http.clone();
    // The upstream's side of a WebSocket, once it has said 101: the stream is joined to it.
    // (Only a proxy switches protocols: the built-in responder allocates nothing for it.)
    let switched = ctx
        .http
        .proxy
        .is_some()
        .then(|| Arc::new(std::sync::Mutex::new(None)));
    let (i, t, seen, sw) = (info.clone(), turn.clone(), state.clone(), switched.clone());
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        seen.saw_head();
        let keep_alive = wants_keep_alive(&req);
        let (http, i, t, sw) = (http.clone(), i.clone(), t.clone(), sw.clone());
        // boxed: hyper needs an Unpin future to hand the stream back
        Box::pin(async move {
            let mut resp = http.handle(i, req).await?;
            if let (Some(sw), Some(upstream)) = (&sw, crate::websocket::upstream_of(&mut resp)) {
                *sw.lock().unwrap_or_else(|e| e.into_inner()) = Some(upstream);
            }
            Ok::<_, std::convert::Infallible>(if keep_alive {
                resp.map(|b| on_end(b, move || t.whole()))
            } else {
                resp
            })
        })
    });
    // Once the response is whole, hyper reads no more: the next request must wait for the
    // stream (or, kept, for the boundary's decision), not start in a hyper connection that
    // may be about to shut down.
    let io = TokioIo::new(Prefixed {
        ahead,
        inner: stream,
        turn: Some(turn.clone()),
        state: Some(state.clone()),
    });
    let mut conn = Box::pin(builder.serve_connection(io, service));
    let mut overdue = std::pin::pin!(pace::overdue(pace, &state));
    // Kept: the wait for the next request, its park time, and a drain to meet at a boundary.
    let mut wait = Between::default();
    let mut park_time = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    let mut shedding = ctx.shedding.subscribe();
    let movable = keep.is_some_and(|k| k.movable);
    let mut handed = None;
    let result = loop {
        // At most one decision: once the stream goes back, hyper only finishes.
        let undecided = keep.is_some() && handed.is_none();
        let back = tokio::select! {
            // (in this order: a boundary re-arms `overdue` before it can see the next request
            // under the last one's pace)
            biased;
            r = std::future::poll_fn(|cx| conn.as_mut().poll_without_shutdown(cx)) => break r,
            // hyper has the whole response (kept: has sent it)
            _ = turn.notified() => match keep {
                // stop after it instead of waiting for another. (A drain needs no branch:
                // this hyper connection serves one request, whose bytes are here, and the
                // next wait meets the drain. Shutting hyper down before it has read them
                // would close the connection unanswered.)
                None => {
                    conn.as_mut().graceful_shutdown();
                    None
                }
                Some(k) => {
                    // the next request, paced from here (its head may be in already: pipelined)
                    let now = Instant::now();
                    state.responses_sent(turn.sent());
                    wait = Between { waiting: true, since: now, drain: wait.drain };
                    let back = decide::hand_back(wait.idle(&state), wait.drain, false);
                    if back.is_none() {
                        overdue.set(pace::overdue(
                            HeadPace { start: now, first_by: None, min_rate: pace.min_rate },
                            &state,
                        ));
                        park_time.as_mut().reset(now + k.wait);
                        turn.open();
                    }
                    back
                }
            },
            why = &mut overdue => {
                ctx.metrics.slow_request(why == TooSlow::Rate);
                return None;
            }
            _ = &mut park_time, if undecided && wait.waiting => {
                // (a request under way is served on; the next boundary sets a new park time)
                let back = decide::hand_back(wait.idle(&state), wait.drain, true);
                wait.waiting = back.is_some();
                back
            }
            _ = ctx.draining.cancelled(), if undecided && !wait.drain => {
                wait.drain = true;
                decide::hand_back(wait.idle(&state), true, false)
            }
            _ = shedding.wait_for(|shed| *shed), if undecided && movable && !wait.drain => {
                wait.drain = true;
                decide::hand_back(wait.idle(&state), true, false)
            }
        };
        if let Some(waited) = back {
            // hyper, idle, reads no more and ends at once
            turn.close();
            conn.as_mut().graceful_shutdown();
            handed = Some((waited, wait.since));
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
            turn: None,
            state: None,
        };
        let drain = crate::websocket::Drain {
            draining: ctx.draining.clone(),
            within: ctx.config.drain_timeout,
        };
        crate::websocket::tunnel(client, upstream, drain).await;
        return None;
    }
    if decide::after_request(result.is_ok(), turn.closed()) == Next::Close {
        // close_notify, then FIN
        let close = tokio::io::AsyncWriteExt::shutdown(&mut stream);
        let _ = tokio::time::timeout(ctx.config.idle_timeout, close).await;
        return None;
    }
    // what hyper read ahead comes first, then anything still unread in the prefix
    Some(Served {
        stream,
        ahead: [parts.read_buf, left].concat().into(),
        waited: handed,
    })
}

/// A kept hyper connection between two requests.
#[derive(Debug, Clone, Copy)]
struct Between {
    /// The last response is sent and the next request's head is not (yet) complete.
    waiting: bool,
    /// When the last response was sent.
    since: Instant,
    /// A drain is pending: the stream goes back at the next boundary.
    drain: bool,
}

impl Between {
    /// Nothing of the next request read yet. (Asked when a branch has fired, not before the
    /// wait: hyper may have read meanwhile.)
    fn idle(&self, state: &RequestState) -> bool {
        self.waiting && !state.head_seen() && state.bytes() == 0
    }
}

impl Default for Between {
    fn default() -> Self {
        Between {
            waiting: false,
            since: Instant::now(),
            drain: false,
        }
    }
}
