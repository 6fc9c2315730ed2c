//! HTTP/1.1 from request to request on an engine (rustls or the record layer): waits for each
//! request, parks the connection when a wait lasts (`park`), moves it when the agent drains
//! (`migration::export::leave`), and wakes it from its park; what to do at each step is
//! decided in `decide`.

use std::sync::Arc;

use tokio::time::Instant;

use super::decide::{self, Left, Next, Waited};
use super::one_request::{self, Keep};
use super::pace::{self, HeadPace};
use super::park::{self, Parked, Parking};
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::migration::export::{self, Exported};
use crate::transport::engine::Engine;
use baton_migrate::secrets::TrafficSecrets;

/// Serves a connection's parked stretches until it ends: each one a small wait (`park`), then
/// the connection's full state again (boxed: it lives only while the connection works) until
/// it parks again or ends.
pub(crate) async fn idle(mut next: Option<Parked>) {
    while let Some(mut parked) = next {
        let woken = parked.wait().await;
        if woken == Waited::End {
            return;
        }
        next = Box::pin(resume(parked, woken)).await;
    }
}

/// A parked connection's client sent something, or the agent drains: its full state again,
/// from the record layer, with the wait it parked in.
pub(crate) async fn resume(parked: Parked, woken: Waited) -> Option<Parked> {
    let Parked {
        stream,
        info,
        ctx,
        movable,
        first,
        until,
    } = parked;
    let conn = Http1 {
        stream: Engine::Layer(stream),
        info,
        ctx,
        secrets: TrafficSecrets::default(),
        movable,
        first,
    };
    serve_http1(conn, bytes::Bytes::new(), Some((until, woken))).await
}

/// What an HTTP/1.1 connection carries from request to request.
pub(crate) struct Http1 {
    pub(crate) stream: Engine,
    pub(crate) info: Arc<ConnInfo>,
    pub(crate) ctx: Arc<Context>,
    /// A rustls connection's TLS 1.3 traffic secrets, for parking it or moving it (the record
    /// layer has its own).
    pub(crate) secrets: TrafficSecrets,
    /// Whether the dispatcher can move it to another agent while it idles (a drain's Leave).
    pub(crate) movable: bool,
    /// The first request's deadline, until it has come.
    pub(crate) first: Option<Instant>,
}

/// HTTP/1.1, a hyper connection per request or per burst of them: while requests come within
/// the park time of each other (`decide::keep_for`), hyper serves them back to back; after a
/// keep-alive response with none come, or when a drain is pending, the hyper connection is
/// dissolved (its ~16 KiB of buffers freed) and the TLS stream waits for the next request; a
/// wait that lasts `--park-after` parks the connection (returned: see `park`), so an idle
/// keep-alive connection holds only its socket and keys. Bytes hyper read ahead (pipelined
/// requests) are handed to the next one. `resume`: the wait a parked connection was in (its
/// deadline) and what woke it, or how hyper's wait ended.
pub(crate) async fn serve_http1(
    conn: Http1,
    mut ahead: bytes::Bytes,
    mut resume: Option<(Instant, Waited)>,
) -> Option<Parked> {
    let Http1 {
        mut stream,
        info,
        ctx,
        mut secrets,
        mut movable,
        mut first,
    } = conn;
    let cfg = &ctx.config;
    let peer = info.peer;
    let builder = one_request::builder(cfg);
    let keep = decide::keep_for(
        cfg.park_after,
        cfg.header_timeout,
        cfg.idle_timeout,
        pace::GRACE,
    );
    // Cleared for a connection that rustls must keep: it waits without a park time.
    let mut parkable = true;
    loop {
        if ahead.is_empty() {
            let wait = Wait {
                until: match resume {
                    Some((until, _)) => until,
                    None => decide::wait_until(first, Instant::now(), cfg.idle_timeout),
                },
                later: first.is_none(),
                movable,
                park_at: parkable.then(|| Instant::now() + cfg.park_after),
                // hyper's wait ended at its park time with part of a record read (not a byte
                // of a request, or hyper would have waited on)
                begun: matches!(resume, Some((_, Waited::Park))) && stream.inside_record(),
                woken: resume.take().map(|(_, woken)| woken),
            };
            let waited = match wait_or_park(stream, &ctx, &wait, &secrets, &mut parkable).await {
                Waiting::Over(engine, waited) => {
                    stream = engine;
                    waited
                }
                Waiting::Parked(layered) => {
                    return Some(Parked {
                        stream: layered,
                        info,
                        ctx,
                        movable,
                        first,
                        until: wait.until,
                    })
                }
                Waiting::Lost => {
                    tracing::debug!(%peer, "idle connection lost on its way to the record layer");
                    return None;
                }
            };
            match decide::after_wait(waited, movable) {
                Next::Serve => {}
                Next::DrainClose => {
                    ctx.metrics.handoff.drain_closed();
                    close(&mut stream, cfg.idle_timeout).await;
                    return None;
                }
                Next::Leave => {
                    // one move: a connection that stays is not offered again
                    movable = false;
                    let secrets = std::mem::take(&mut secrets);
                    // Boxed: a move is rare, and its future large; inline, every parked
                    // connection's wake-up would allocate and copy it.
                    let stays = Box::pin(leave(stream, secrets, &info, &ctx)).await;
                    // served at once if something came meanwhile, else waited for
                    (stream, ahead) = stays?;
                    continue;
                }
                // the wait ended (idle timeout, deadline, error): nothing more to send
                _ => return None,
            }
        }
        let pace = HeadPace {
            start: Instant::now(),
            first_by: first.take(),
            min_rate: cfg.min_header_rate,
        };
        // A drain is met at the next wait (kept: hyper's, ended by it): a connection that can
        // move moves then.
        let kept = keep.map(|wait| Keep { wait, movable });
        // (boxed: a working connection's future, large, kept out of a parked one's)
        let served = Box::pin(one_request::serve_requests(
            stream, ahead, pace, &info, &ctx, &builder, kept,
        ))
        .await?;
        (stream, ahead) = (served.stream, served.ahead);
        // a wait that ended in hyper goes on from there, unless bytes were read ahead (served
        // at once, as they would be after any wait)
        resume = served
            .waited
            .filter(|_| ahead.is_empty())
            .map(|(waited, since)| (since + cfg.idle_timeout, waited));
    }
}

/// A wait for a request: until when, whether it is for a later request (a drain ends it),
/// whether the dispatcher can move the connection, when it parks, whether part of a record
/// came before it (in hyper's wait), and what woke it from its park or ended hyper's wait.
struct Wait {
    until: Instant,
    later: bool,
    movable: bool,
    park_at: Option<Instant>,
    begun: bool,
    woken: Option<Waited>,
}

/// How a wait for a request ended.
enum Waiting {
    /// With the engine, and why.
    Over(Engine, Waited),
    /// Parked on the record layer at the wait's park time: the caller returns it.
    Parked(park::Layered),
    /// Taken out of rustls but refused by the record layer.
    Lost,
}

/// Waits for a request on `stream`; once the wait lasts to its park time, parks the connection
/// if `park` can (if it never can, `parkable` is cleared and the wait goes on without one).
async fn wait_or_park(
    mut stream: Engine,
    ctx: &Context,
    wait: &Wait,
    secrets: &TrafficSecrets,
    parkable: &mut bool,
) -> Waiting {
    let (mut woken, mut park_at) = (wait.woken, wait.park_at);
    // whether any of the next request came (see `wait_request`)
    let mut begun = wait.begun;
    loop {
        let waited = match woken.take() {
            // a parked connection woken by its client reads what came
            Some(Waited::Request) | None => {
                let (until, later, movable) = (wait.until, wait.later, wait.movable);
                stream
                    .wait_request(ctx, until, later, movable, park_at, &mut begun)
                    .await
            }
            Some(woken) => woken,
        };
        if waited != Waited::Park {
            return Waiting::Over(stream, waited);
        }
        park_at = None;
        if !park::settled(&mut stream) {
            // a KeyUpdate answer may be queued: it goes out now if the socket takes it
            park::flush_now(&mut stream).await;
        }
        match park::park(stream, secrets) {
            Parking::Parked(layered) => return Waiting::Parked(layered),
            Parking::Later(engine) => stream = engine,
            Parking::Never(engine) => {
                stream = engine;
                *parkable = false;
            }
            Parking::Lost => return Waiting::Lost,
        }
    }
}

/// Asks the dispatcher to move an idle connection (a drain's Leave). Gives back what stays,
/// with what came meanwhile; `None` when it is gone (moved, lost, or closed for the drain).
async fn leave(
    stream: Engine,
    secrets: TrafficSecrets,
    info: &ConnInfo,
    ctx: &Context,
) -> Option<(Engine, bytes::Bytes)> {
    let draining = ctx.draining.is_cancelled();
    let (left, stayed) = stayed(export::leave(stream, secrets, info, ctx).await);
    let next = decide::after_leave(left, draining);
    let Some((mut engine, plain)) = stayed else {
        if next == Next::DrainEnd {
            ctx.metrics.handoff.drain_closed();
        }
        return None;
    };
    if next == Next::DrainClose {
        ctx.metrics.handoff.drain_closed();
        close(&mut engine, ctx.config.idle_timeout).await;
        return None;
    }
    Some((engine, plain))
}

/// close_notify, then FIN. (By reference: the engine by value would make this future, and
/// every one that awaits it, an engine larger.)
async fn close(stream: &mut Engine, within: std::time::Duration) {
    let _ = tokio::time::timeout(within, tokio::io::AsyncWriteExt::shutdown(stream)).await;
}

/// What a Leave left here: how (for `decide::after_leave`), and the engine with what came
/// meanwhile, if the connection stays.
fn stayed(left: Exported) -> (Left, Option<(Engine, bytes::Bytes)>) {
    match left {
        Exported::Migrated => (Left::Migrated, None),
        Exported::Closed => (Left::Closed, None),
        Exported::ServeHere(layer) => (
            Left::ServeHere,
            Some((Engine::Layer(layer), bytes::Bytes::new())),
        ),
        Exported::Keep(rustls, plain) => {
            let kept = Left::Kept {
                ahead: !plain.is_empty(),
            };
            (kept, Some((Engine::Rustls(rustls), plain.into())))
        }
    }
}
