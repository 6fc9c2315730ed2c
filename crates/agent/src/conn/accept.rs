//! One client connection from its first byte: on the public port (a PROXY v2 header, if
//! configured) or on the agent link (a migration's Offer or Import first, if any); then the
//! TLS handshake under a deadline, counted as full or resumed, and HTTP/1.1 (`http1`) or
//! HTTP/2 (`serve_stream`) by ALPN until the client leaves, the connection idles out, moves,
//! or the agent drains.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::{HandshakeKind, ProtocolVersion};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use baton_link::LinkStream;
use baton_migrate::secrets::{Expected, TrafficSecrets};
use baton_ops::cidr::Cidr;
use baton_wire::proxy_v2::ProxyHeader;

use super::decide::{self, Waited};
use super::early_serve;
use super::early_tls::{self, Start};
use super::http1::{self, Http1};
use super::legacy::refuse_legacy_client;
use super::park::Parked;
use super::prefixed::Prefixed;
use super::serve_stream::serve_h2;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::metrics::{FailureReason, Metrics, Version};
use crate::migration::export::{self, Exported};
use crate::migration::import;
use crate::migration::metrics::Why;
use crate::migration::offer::{first_frame, FirstFrame, Offer};
use crate::transport::agent_io::AgentIo;
use crate::transport::conn_io::ConnIo;
use crate::transport::engine::{Engine, RustlsStream};
use crate::transport::migrated::MigratedStream;

/// A client connection on the public port: TLS at once (after a PROXY v2 header, if
/// configured). Handoff frames are never read here: one gets rustls' alert, never an import.
pub async fn serve_tcp(tcp: TcpStream, peer: SocketAddr, ctx: Arc<Context>) {
    // Boxed: the work (handshake, requests) needs a large future, and a connection parked
    // between requests only a small one (`park`), in this same task.
    let parked = Box::pin(serve_tcp_working(tcp, peer, ctx)).await;
    http1::idle(parked).await
}

async fn serve_tcp_working(tcp: TcpStream, peer: SocketAddr, ctx: Arc<Context>) -> Option<Parked> {
    let cfg = &ctx.config;
    let metrics = &ctx.metrics;
    let deadline = tokio::time::Instant::now() + cfg.handshake_timeout;
    let mut tcp = tcp;
    let mut peer = peer;
    // A PROXY header names the client: only the balancers and dispatchers may send one.
    if cfg.proxy_protocol && !Cidr::any_contains(&cfg.proxy_protocol_from, peer.ip()) {
        metrics.failure(FailureReason::Untrusted);
        tracing::debug!(%peer, "PROXY protocol expected, but not from this address: refused");
        return None;
    }
    if cfg.proxy_protocol {
        match tokio::time::timeout_at(deadline, baton_ops::proxy_header::read(&mut tcp)).await {
            Ok(Ok(Some(ProxyHeader::Proxy { source, .. }))) => peer = source,
            Ok(Ok(Some(ProxyHeader::Local))) => {}
            Ok(Ok(None)) => return None, // closed before sending anything (a health check)
            Ok(Err(e)) => {
                metrics.failure(FailureReason::Malformed);
                tracing::debug!(%peer, error = %e, "bad PROXY protocol header");
                return None;
            }
            Err(_) => {
                metrics.failure(FailureReason::Timeout);
                return None;
            }
        }
    }
    serve(AgentIo::tcp(tcp), peer, None, false, deadline, ctx).await
}

/// A client stream of the agent link: the client's address is its metadata. With `--handoff`
/// it may start with a handoff frame: an Offer asks this agent to hand the session on after
/// the handshake; an Import carries a session to continue here instead of a handshake.
pub async fn serve_link(stream: LinkStream, ctx: Arc<Context>) {
    // boxed for the same reason as `serve_tcp`'s
    let parked = Box::pin(serve_link_working(stream, ctx)).await;
    http1::idle(parked).await
}

async fn serve_link_working(stream: LinkStream, ctx: Arc<Context>) -> Option<Parked> {
    let cfg = &ctx.config;
    let metrics = &ctx.metrics;
    let deadline = tokio::time::Instant::now() + cfg.handshake_timeout;
    let peer = stream.meta().source;
    let drain = stream.meta().drain;
    // The dispatcher follows every link stream's records: with `--handoff` a connection can
    // then move to another agent when this one drains (not through a dispatcher that does not
    // follow it: it would pass a Leave on to the client).
    let movable = cfg.handoff && stream.meta().follows;
    // A dispatcher's operator drained this agent, or enabled it again: not a client.
    if let Some(shed) = stream.meta().shed {
        match shed {
            true => tracing::info!("drained at a dispatcher: idle connections move elsewhere"),
            false => tracing::info!("enabled again at a dispatcher: connections stay"),
        }
        ctx.shedding.send_replace(shed);
        return None;
    }
    let mut binding = [0u8; baton_migrate::BINDING_LEN];
    binding[..16].copy_from_slice(&stream.link_id());
    binding[16..].copy_from_slice(&stream.meta().token.unwrap_or_default());
    let mut io = AgentIo::link(stream);
    let mut offer = None;
    if cfg.handoff {
        match tokio::time::timeout_at(deadline, first_frame(&mut io)).await {
            Ok(Ok(FirstFrame::None)) => {}
            Ok(Ok(FirstFrame::Offer(o))) => offer = Some(o),
            Ok(Ok(FirstFrame::Import)) => {
                let mut io = ConnIo::new(io, metrics.clone(), cfg.idle_timeout);
                if offer.is_some() {
                    io.track_records();
                }
                let why = match drain {
                    true => Why::Drain,
                    false => Why::Handshake,
                };
                let (stream, info) = import::import(io, peer, &binding, why, &ctx).await?;
                let first_by = tokio::time::Instant::now() + cfg.request_timeout;
                return serve_migrated(stream, info, first_by, movable, &ctx).await;
            }
            Ok(Err(_)) => {
                metrics.failure(FailureReason::Malformed);
                return None;
            }
            Err(_) => {
                metrics.failure(FailureReason::Timeout);
                return None;
            }
        }
    }
    serve(io, peer, offer, movable, deadline, ctx).await
}

/// `movable`: a link stream the dispatcher can move to another agent while it lives (its
/// TLS 1.3 traffic secrets are kept and its client records followed, for an export later).
/// Every connection's secrets are asked for and its records followed, so that an idle HTTP/1.1
/// connection can park on the record layer (`park`).
async fn serve(
    mut io: AgentIo,
    peer: SocketAddr,
    offer: Option<Offer>,
    movable: bool,
    deadline: tokio::time::Instant,
    ctx: Arc<Context>,
) -> Option<Parked> {
    let cfg = &ctx.config;
    let metrics = &ctx.metrics;
    // The first request's head is due this long after accept, handshake included.
    let first_by = deadline - cfg.handshake_timeout + cfg.request_timeout;
    let expected = peek_hello(&mut io, deadline, &ctx).await?;
    let on_link = !io.is_tcp();
    let mut io = ConnIo::new(io, metrics.clone(), cfg.idle_timeout);
    io.track_records();
    let accept = if cfg.early_data > 0 {
        // `--early-data`: the hello is read first, to decide about its early data
        // Both boxed: the early-data path's futures are the largest of a connection's, and
        // inline they made every connection's future (moved at each spawn and call) twice
        // the size, early data or not.
        match Box::pin(early_tls::start(io, offer.is_some(), deadline, &ctx)).await {
            Start::Plain(accept) => accept,
            Start::Early(conn) => {
                let early = Box::pin(early_serve::serve(*conn, peer, first_by, deadline, &ctx));
                let handover = early.await?;
                // Its handshake done (its first request answered): on as every other one.
                let conn = Http1 {
                    stream: Engine::Rustls(Box::new(handover.stream)),
                    info: Arc::new(handover.info),
                    ctx,
                    secrets: expected.map(|e| e.take()).unwrap_or_default(),
                    movable,
                    first: handover.first,
                };
                return http1::serve_http1(conn, handover.ahead, None).await;
            }
            Start::Done => return None,
        }
    } else {
        let writes = decide::handshake_writes(ctx.http.proxy.is_some(), offer.is_some(), on_link);
        if writes.coalesce {
            io.coalesce_writes();
        }
        if writes.hold {
            io.hold_writes();
        }
        TlsAcceptor::from(ctx.tls.config()).accept(io)
    };
    let mut stream = match tokio::time::timeout_at(deadline, accept).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            let reason = FailureReason::of(&e);
            metrics.failure(reason);
            tracing::debug!(%peer, reason = reason.label(), error = %e, "handshake failed");
            return None;
        }
        Err(_) => {
            metrics.failure(FailureReason::Timeout);
            tracing::debug!(%peer, "handshake timed out");
            return None;
        }
    };

    let info = handshake_done(&stream, peer, metrics).logged(
        ctx.http.access_log.as_ref(),
        crate::access_log::Migrated::No,
    );
    // A TLS-ALPN-01 validation is over once the handshake is (RFC 8737): no HTTP on it.
    if info.alpn.as_deref() == Some("acme-tls/1") {
        let _ = tokio::time::timeout_at(deadline, tokio::io::AsyncWriteExt::shutdown(&mut stream))
            .await;
        return None;
    }
    let h2 = info.alpn.as_deref() == Some("h2");
    let mut ahead = bytes::Bytes::new();
    // Taken now: the log keeps them only during handshakes, the connection for its life.
    let mut secrets = expected.map(|e| e.take()).unwrap_or_default();
    let moves_later = decide::moves_later(movable, offer.is_some());
    if let Some(offer) = offer {
        match export::hand_off(stream, offer, &mut secrets, &info, &ctx).await {
            Exported::Migrated | Exported::Closed => return None,
            Exported::ServeHere(migrated) => {
                return serve_migrated(*migrated, info, first_by, movable, &ctx).await
            }
            Exported::Keep(kept, plain) => {
                stream = *kept;
                ahead = plain.into();
            }
        }
    }

    if h2 {
        serve_h2_rustls(stream, ahead, info, first_by, &ctx).await;
        None
    } else {
        let tls13 = stream.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3);
        if decide::tickets_wait(tls13, cfg.park_after) {
            stream.get_mut().0.hold_until_request();
        }
        let conn = Http1 {
            stream: Engine::Rustls(Box::new(stream)),
            info: Arc::new(info),
            ctx,
            secrets,
            movable: moves_later,
            first: Some(first_by),
        };
        http1::serve_http1(conn, ahead, None).await
    }
}

/// Peeks at the hello before rustls reads it: refuses a client below TLS 1.2 (counted), and
/// asks the key log for the connection's TLS 1.3 traffic secrets (for KeyUpdate after a move,
/// or on the record layer once parked), found by the ClientHello's random. `None`: the
/// connection ends here.
async fn peek_hello(
    io: &mut AgentIo,
    deadline: Instant,
    ctx: &Context,
) -> Option<Option<Expected>> {
    // A socket's peek returns what has come; a link stream's waits for all it asks for (the
    // hello's client random only once the first bytes look like a ClientHello).
    let mut head = [0u8; 43];
    let want = if io.is_tcp() { head.len() } else { 11 };
    let mut n = match tokio::time::timeout_at(deadline, refuse_legacy_client(io, &mut head[..want]))
        .await
    {
        Ok(Ok(Some(n))) => n,
        Ok(Ok(None)) => {
            ctx.metrics.failure(FailureReason::Incompatible);
            return None;
        }
        // Closed before sending a byte: a port probe or health check, not a failed handshake.
        Ok(Err(_)) => return None,
        Err(_) => {
            ctx.metrics.failure(FailureReason::Timeout);
            return None;
        }
    };
    if n < head.len() && baton_migrate::secrets::client_random_may_follow(&head[..n]) {
        n = tokio::time::timeout_at(deadline, io.peek(&mut head))
            .await
            .map_or(0, |r| r.unwrap_or(0));
    }
    let expected = baton_migrate::secrets::client_random(&head[..n])
        .and_then(|random| ctx.tls.secret_log().expect(random));
    Some(expected)
}

/// Counts a handshake that has just ended (version, resumed, HelloRetryRequest) and tells
/// what the HTTP layer knows about the connection.
fn handshake_done(stream: &RustlsStream, peer: SocketAddr, metrics: &Metrics) -> ConnInfo {
    let (_, tls) = stream.get_ref();
    let version = match tls.protocol_version() {
        Some(ProtocolVersion::TLSv1_2) => Version::Tls12,
        _ => Version::Tls13,
    };
    let kind = tls.handshake_kind();
    metrics.handshake(
        version,
        kind == Some(HandshakeKind::Resumed),
        kind == Some(HandshakeKind::FullWithHelloRetryRequest),
    );
    ConnInfo::of(peer, tls)
}

/// HTTP/2 on a connection handshaken here, `ahead` (what a move that kept it read) first.
async fn serve_h2_rustls(
    stream: RustlsStream,
    ahead: bytes::Bytes,
    info: ConnInfo,
    first_by: Instant,
    ctx: &Arc<Context>,
) {
    // hyper allocates ~16 KiB of buffers per connection as soon as it starts, so it starts
    // only once the client has sent something: connections that idle after the handshake
    // (browser preconnects, pools warmed ahead of need) then hold only their TLS state.
    // Nothing is read here: either rustls already holds request bytes, or the socket
    // becomes readable. (HTTP/1.1 waits the same way in `serve_http1`.)
    let mut engine = Engine::Rustls(Box::new(stream));
    if ahead.is_empty()
        && engine
            .wait_request(ctx, first_by, false, false, None, &mut false)
            .await
            != Waited::Request
    {
        return;
    }
    let Engine::Rustls(mut stream) = engine else {
        unreachable!("a rustls connection stays one until it moves")
    };
    // HTTP/2 answers from stream tasks: nothing may stay held while it waits for them.
    let io = stream.get_mut().0;
    io.stop_coalescing();
    io.take_records();
    serve_h2(
        Prefixed {
            ahead,
            inner: stream,
            turn: None,
            state: None,
        },
        info,
        first_by,
        ctx,
    )
    .await
}

/// A connection whose session moved here (imported, or served here after a move failed):
/// HTTP/2 as it comes, HTTP/1.1 parked between requests like a rustls one, so that it can
/// move on again when this agent drains.
async fn serve_migrated(
    stream: MigratedStream<ConnIo<AgentIo>>,
    info: ConnInfo,
    first_by: Instant,
    movable: bool,
    ctx: &Arc<Context>,
) -> Option<Parked> {
    if info.alpn.as_deref() == Some("h2") {
        serve_h2(stream, info, first_by, ctx).await;
        return None;
    }
    let conn = Http1 {
        stream: Engine::Layer(Box::new(stream)),
        info: Arc::new(info),
        ctx: ctx.clone(),
        // its traffic secrets are the layer's own
        secrets: TrafficSecrets::default(),
        movable,
        first: Some(first_by),
    };
    http1::serve_http1(conn, bytes::Bytes::new(), None).await
}
