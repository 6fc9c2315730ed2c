//! One client connection: TLS handshake under a deadline, counted as full or resumed, then
//! HTTP/1.1 or HTTP/2 by ALPN until the client leaves, the connection idles out, or the agent
//! drains.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use rustls::{HandshakeKind, ProtocolVersion};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use baton_migrate::{self as handoff_wire, Frame};
use baton_ops::cidr::Cidr;
use baton_wire::proxy_v2::ProxyHeader;

use crate::engine::{Engine, Waited};
use crate::h2bounds::{self, Limits};
use crate::h2watch::{Action, Signal, Watched};
use crate::handoff::{self, export::Exported, export::Offer};
use crate::http::ConnInfo;
use crate::io::ConnIo;
use crate::metrics::{FailureReason, Version};
use crate::pace::{self, HeadPace, RequestState, TooSlow};
use crate::park::{Parked, Parking};
use crate::server::Shared;
use crate::transport::AgentIo;
use baton_link::LinkStream;
use baton_migrate::secrets::TrafficSecrets;

/// A client connection on the public port: TLS at once (after a PROXY v2 header, if
/// configured). Handoff frames are never read here: one gets rustls' alert, never an import.
pub async fn serve_tcp(tcp: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    // Boxed: the work (handshake, requests) needs a large future, and a connection parked
    // between requests only a small one (`park`), in this same task.
    let parked = Box::pin(serve_tcp_working(tcp, peer, shared)).await;
    crate::park::idle(parked).await
}

async fn serve_tcp_working(
    tcp: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
) -> Option<Parked> {
    let cfg = &shared.config;
    let metrics = &shared.metrics;
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
    serve(AgentIo::tcp(tcp), peer, None, false, deadline, shared).await
}

/// A client stream of the agent link: the client's address is its metadata. With `--handoff`
/// it may start with a handoff frame: an Offer asks this agent to hand the session on after
/// the handshake; an Import carries a session to continue here instead of a handshake.
pub async fn serve_link(stream: LinkStream, shared: Arc<Shared>) {
    // boxed for the same reason as `serve_tcp`'s
    let parked = Box::pin(serve_link_working(stream, shared)).await;
    crate::park::idle(parked).await
}

async fn serve_link_working(stream: LinkStream, shared: Arc<Shared>) -> Option<Parked> {
    let cfg = &shared.config;
    let metrics = &shared.metrics;
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
        shared.shedding.send_replace(shed);
        return None;
    }
    let mut binding = [0u8; handoff_wire::BINDING_LEN];
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
                    true => handoff::metrics::Why::Drain,
                    false => handoff::metrics::Why::Handshake,
                };
                let (stream, info) =
                    handoff::import::import(io, peer, &binding, why, &shared).await?;
                let first_by = tokio::time::Instant::now() + cfg.request_timeout;
                return serve_migrated(stream, info, first_by, movable, &shared).await;
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
    serve(io, peer, offer, movable, deadline, shared).await
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
    shared: Arc<Shared>,
) -> Option<Parked> {
    let cfg = &shared.config;
    let metrics = &shared.metrics;
    // The first request's head is due this long after accept, handshake included.
    let first_by = deadline - cfg.handshake_timeout + cfg.request_timeout;
    // A socket's peek returns what has come; a link stream's waits for all it asks for (the
    // hello's client random only once the first bytes look like a ClientHello).
    let mut head = [0u8; 43];
    let want = if io.is_tcp() { head.len() } else { 11 };
    let mut n =
        match tokio::time::timeout_at(deadline, refuse_legacy_client(&mut io, &mut head[..want]))
            .await
        {
            Ok(Ok(Some(n))) => n,
            Ok(Ok(None)) => {
                metrics.failure(FailureReason::Incompatible);
                return None;
            }
            // Closed before sending a byte: a port probe or health check, not a failed handshake.
            Ok(Err(_)) => return None,
            Err(_) => {
                metrics.failure(FailureReason::Timeout);
                return None;
            }
        };
    if n < head.len() && baton_migrate::secrets::client_random_may_follow(&head[..n]) {
        n = tokio::time::timeout_at(deadline, io.peek(&mut head))
            .await
            .map_or(0, |r| r.unwrap_or(0));
    }
    // The TLS 1.3 traffic secrets (for KeyUpdate after a move, or on the record layer once
    // parked): the key log finds them by the ClientHello's random.
    let expected = baton_migrate::secrets::client_random(&head[..n])
        .and_then(|random| shared.tls.secret_log().expect(random));
    let on_link = !io.is_tcp();
    let mut io = ConnIo::new(io, metrics.clone(), cfg.idle_timeout);
    io.track_records();
    let accept = if cfg.early_data > 0 {
        // `--early-data`: the hello is read first, to decide about its early data
        match crate::early_tls::start(io, offer.is_some(), deadline, &shared).await {
            crate::early_tls::Start::Plain(accept) => accept,
            crate::early_tls::Start::Early(conn) => {
                let early = crate::early_tls::serve(*conn, peer, first_by, deadline, &shared);
                let handover = early.await?;
                // Its handshake done (its first request answered): on as every other one.
                let conn = Http1 {
                    stream: Engine::Rustls(Box::new(handover.stream)),
                    info: Arc::new(handover.info),
                    shared,
                    secrets: expected.map(|e| e.take()).unwrap_or_default(),
                    movable,
                    first: handover.first,
                };
                return serve_http1(conn, handover.ahead, None).await;
            }
            crate::early_tls::Start::Done => return None,
        }
    } else {
        // The built-in responder waits on nothing but the client: its flight, tickets,
        // response and close_notify can share system calls (see `transport`).
        if shared.http.proxy.is_none() && offer.is_none() {
            io.coalesce_writes();
        }
        // Offered for a move: the tickets wait for the handoff frame that follows them
        // (`handoff::export::hand_off` sends both and stops holding).
        if offer.is_some() && on_link {
            io.hold_writes();
        }
        TlsAcceptor::from(shared.tls.config()).accept(io)
    };
    let stream = match tokio::time::timeout_at(deadline, accept).await {
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

    let info = {
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
    };
    let h2 = info.alpn.as_deref() == Some("h2");
    let mut stream = stream;
    let mut ahead = bytes::Bytes::new();
    // Taken now: the log keeps them only during handshakes, the connection for its life.
    let mut secrets = expected.map(|e| e.take()).unwrap_or_default();
    // A connection kept after an offer is not followed for a move any more: it cannot move
    // later (one served from the record layer can: the layer knows where its records stand).
    let moves_later = movable && offer.is_none();
    if let Some(offer) = offer {
        match handoff::export::hand_off(stream, offer, &mut secrets, &info, &shared).await {
            Exported::Migrated | Exported::Closed => return None,
            Exported::ServeHere(migrated) => {
                return serve_migrated(*migrated, info, first_by, movable, &shared).await
            }
            Exported::Keep(kept, plain) => {
                stream = *kept;
                ahead = plain.into();
            }
        }
    }

    if h2 {
        // hyper allocates ~16 KiB of buffers per connection as soon as it starts, so it starts
        // only once the client has sent something: connections that idle after the handshake
        // (browser preconnects, pools warmed ahead of need) then hold only their TLS state.
        // Nothing is read here: either rustls already holds request bytes, or the socket
        // becomes readable. (HTTP/1.1 waits the same way in `serve_http1`.)
        let mut engine = Engine::Rustls(Box::new(stream));
        if ahead.is_empty()
            && engine
                .wait_request(&shared, first_by, false, false, None, &mut false)
                .await
                != Waited::Request
        {
            return None;
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
                gate: None,
                state: None,
            },
            info,
            first_by,
            &shared,
        )
        .await;
        None
    } else {
        // A TLS 1.3 connection's tickets wait for the first request, to leave with its response
        // (one send fewer: `transport`), if its park time bounds that wait (a park sends them).
        let tls13 = stream.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3);
        if tls13 && cfg.park_after <= TICKETS_WAIT_MAX {
            stream.get_mut().0.hold_until_request();
        }
        let conn = Http1 {
            stream: Engine::Rustls(Box::new(stream)),
            info: Arc::new(info),
            shared,
            secrets,
            movable: moves_later,
            first: Some(first_by),
        };
        serve_http1(conn, ahead, None).await
    }
}

/// The longest park time for which a new connection's TLS 1.3 tickets wait for its first
/// request (see `transport`): a longer one would keep them from a client that sends nothing.
const TICKETS_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(200);

/// A connection whose session moved here (imported, or served here after a move failed):
/// HTTP/2 as it comes, HTTP/1.1 parked between requests like a rustls one, so that it can
/// move on again when this agent drains.
async fn serve_migrated(
    stream: handoff::stream::MigratedStream<ConnIo<AgentIo>>,
    info: ConnInfo,
    first_by: Instant,
    movable: bool,
    shared: &Arc<Shared>,
) -> Option<Parked> {
    if info.alpn.as_deref() == Some("h2") {
        serve_h2(stream, info, first_by, shared).await;
        return None;
    }
    let conn = Http1 {
        stream: Engine::Layer(Box::new(stream)),
        info: Arc::new(info),
        shared: shared.clone(),
        // its traffic secrets are the layer's own
        secrets: TrafficSecrets::default(),
        movable,
        first: Some(first_by),
    };
    serve_http1(conn, bytes::Bytes::new(), None).await
}

/// A parked connection's client sent something, or the agent drains: its full state again,
/// from the record layer, with the wait it parked in.
pub(crate) async fn resume(parked: Parked, woken: Waited) -> Option<Parked> {
    let Parked {
        stream,
        info,
        shared,
        movable,
        first,
        until,
    } = parked;
    let conn = Http1 {
        stream: Engine::Layer(stream),
        info,
        shared,
        secrets: TrafficSecrets::default(),
        movable,
        first,
    };
    serve_http1(conn, bytes::Bytes::new(), Some((until, woken))).await
}

/// HTTP/2 over any established TLS stream; the first request must be in by `first_by`, and
/// the connection keeps the bounds in `h2bounds` (heads, idle time, cancelled streams).
async fn serve_h2<S>(stream: S, info: ConnInfo, first_by: Instant, shared: &Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let cfg = &shared.config;
    let peer = info.peer;
    let info = Arc::new(info);
    let http = shared.http.clone();
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
    let watched = Watched::new(stream, limits, signal.clone(), shared.metrics.clone());
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
    // Boxed, so its size is paid only once HTTP starts, not by every connection's task.
    let conn = Box::pin(builder.serve_connection(io, service));
    if let Err(e) = drive(conn, pace, &state, Some(&signal), shared).await {
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
    shared: &Shared,
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
            _ = shared.draining.cancelled() => {
                // HTTP/2 (GOAWAY: its streams finish) and migrated connections are not moved
                shared.metrics.handoff.drain_closed();
                conn.as_mut().graceful_shutdown();
                return conn.await;
            }
            why = &mut overdue => {
                shared.metrics.slow_request(why == TooSlow::Rate);
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
    shared: &Arc<Shared>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if info.alpn.as_deref() == Some("h2") {
        return serve_h2(stream, info, first_by, shared).await;
    }
    let cfg = &shared.config;
    let peer = info.peer;
    let info = Arc::new(info);
    let http = shared.http.clone();
    let (state, pace) = first_request(first_by);
    let seen = state.clone();
    let service = service_fn(move |req| {
        seen.saw_head();
        http.clone().handle(info.clone(), req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_headers(cfg.max_headers)
        .max_header_size(cfg.max_header_bytes)
        .max_buf_size(cfg.max_header_bytes.max(64 * 1024));
    let conn = Box::pin(builder.serve_connection(TokioIo::new(stream), service));
    if let Err(e) = drive(conn, pace, &state, None, shared).await {
        tracing::debug!(%peer, error = %e, "migrated connection ended with an error");
    }
}

/// How a link stream begins.
enum FirstFrame {
    /// With anything but a frame (a ClientHello), left unread.
    None,
    Offer(Offer),
    /// With an Import frame, left unread for the importer.
    Import,
}

/// Looks at the first frame of a link stream, consuming it only if it is an Offer. Bounded by
/// the frame format (64 KiB).
async fn first_frame(io: &mut AgentIo) -> std::io::Result<FirstFrame> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 6];
    let n = io.peek(&mut head).await?;
    if n == 0 || head[0] != handoff_wire::FRAME_TYPE {
        return Ok(FirstFrame::None);
    }
    if n < head.len() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if head[5] == handoff_wire::IMPORT_KIND {
        return Ok(FirstFrame::Import);
    }
    let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
    let mut frame = vec![0u8; 5 + len];
    io.read_exact(&mut frame).await?;
    let bad = |e: handoff_wire::MigrationError| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
    };
    match handoff_wire::Splitter::new()
        .split(&frame)
        .map_err(bad)?
        .frame
    {
        Some(Frame::Offer { home, binding }) => Ok(FirstFrame::Offer(Offer { home, binding })),
        _ => Err(std::io::ErrorKind::InvalidData.into()),
    }
}

/// `protocol_version` alert, TLS 1.0 record framing (what a TLS 1.0/1.1 client reads).
const PROTOCOL_VERSION_ALERT: [u8; 7] = [0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46];

/// Refuses a client whose best version is below TLS 1.2 with the alert RFC 5246 (E.1) names,
/// `protocol_version`. rustls would refuse it too, but with `handshake_failure`: such a
/// ClientHello lacks the signature_algorithms extension and rustls checks that first.
/// Peeks (at least 11 bytes of `head`), so rustls still sees every byte; returns how many
/// bytes it peeked into `head`, `None` if the client was refused.
async fn refuse_legacy_client(io: &mut AgentIo, head: &mut [u8]) -> std::io::Result<Option<usize>> {
    let n = io.peek(head).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if !is_legacy_client_hello(&head[..n]) {
        return Ok(Some(n));
    }
    // Seven bytes into a fresh socket's send buffer: one try is enough, and a failure only
    // means the client goes without its alert.
    io.write_best_effort(&PROTOCOL_VERSION_ALERT).await;
    Ok(None)
}

/// Whether these first bytes of a connection are a ClientHello whose client_version is below
/// TLS 1.2 (0x0303). A TLS 1.3 client always sends 0x0303 there (RFC 8446 section 4.1.2), so
/// this never refuses a client that could negotiate 1.2 or 1.3. Too few bytes: not decided here.
pub(crate) fn is_legacy_client_hello(head: &[u8]) -> bool {
    // record: type 22 (handshake), version, length; handshake: type 1 (client_hello), u24 length,
    // then client_version.
    head.len() >= 11
        && head[0] == 0x16
        && head[5] == 0x01
        && u16::from_be_bytes([head[9], head[10]]) < 0x0303
        && head[9] == 0x03
}

pub(crate) type Tls = TlsStream<ConnIo<AgentIo>>;

/// What an HTTP/1.1 connection carries from request to request.
struct Http1 {
    stream: Engine,
    info: Arc<ConnInfo>,
    shared: Arc<Shared>,
    /// A rustls connection's TLS 1.3 traffic secrets, for parking it or moving it (the record
    /// layer has its own).
    secrets: TrafficSecrets,
    /// Whether the dispatcher can move it to another agent while it idles (a drain's Leave).
    movable: bool,
    /// The first request's deadline, until it has come.
    first: Option<Instant>,
}

/// HTTP/1.1, one hyper connection per request: after each keep-alive response the hyper
/// connection is dissolved (its ~16 KiB of buffers freed) and the TLS stream waits for the
/// next request; a wait that lasts `--park-after` parks the connection (returned: see `park`),
/// so an idle keep-alive connection holds only its socket and keys. Bytes hyper read ahead
/// (pipelined requests) are handed to the next one. `resume`: the wait a parked connection
/// was in (its deadline) and what woke it.
async fn serve_http1(
    conn: Http1,
    mut ahead: bytes::Bytes,
    mut resume: Option<(Instant, Waited)>,
) -> Option<Parked> {
    let Http1 {
        mut stream,
        info,
        shared,
        mut secrets,
        mut movable,
        mut first,
    } = conn;
    let cfg = &shared.config;
    let peer = info.peer;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_headers(cfg.max_headers)
        .max_header_size(cfg.max_header_bytes)
        // Bounds what one connection may buffer (pipelined requests, body reads).
        .max_buf_size(cfg.max_header_bytes.max(64 * 1024));
    // Cleared for a connection that rustls must keep: it waits without a park time.
    let mut parkable = true;
    loop {
        if ahead.is_empty() {
            // The first request is due by `first_by`; each later one within the idle timeout
            // of the wait's start, however its bytes trickle in (a park keeps the deadline).
            let later = first.is_none();
            let (until, mut woken) = match resume.take() {
                Some((until, woken)) => (until, Some(woken)),
                None => (
                    first.unwrap_or_else(|| Instant::now() + cfg.idle_timeout),
                    None,
                ),
            };
            let mut park_at = parkable.then(|| Instant::now() + cfg.park_after);
            // whether any of the next request came (see `wait_request`)
            let mut begun = false;
            let waited = loop {
                let waited = match woken.take() {
                    // a parked connection woken by its client reads what came
                    Some(Waited::Request) | None => {
                        stream
                            .wait_request(&shared, until, later, movable, park_at, &mut begun)
                            .await
                    }
                    Some(woken) => woken,
                };
                if waited != Waited::Park {
                    break waited;
                }
                park_at = None;
                if !crate::park::settled(&mut stream) {
                    // a KeyUpdate answer may be queued: it goes out now if the socket takes it
                    crate::park::flush_now(&mut stream).await;
                }
                match crate::park::park(stream, &secrets) {
                    Parking::Parked(layered) => {
                        return Some(Parked {
                            stream: layered,
                            info,
                            shared,
                            movable,
                            first,
                            until,
                        })
                    }
                    Parking::Later(engine) => stream = engine,
                    Parking::Never(engine) => {
                        stream = engine;
                        parkable = false;
                    }
                    Parking::Lost => {
                        tracing::debug!(%peer, "idle connection lost on its way to the record layer");
                        return None;
                    }
                }
            };
            match waited {
                Waited::Request => {}
                Waited::End | Waited::Park => return None,
                // Idle between requests while the agent drains (or is drained at a dispatcher):
                // the dispatcher moves the live connection to another agent (its client
                // notices nothing). Else a drain ends it here; a dispatcher's drain lets it be.
                Waited::Drain => {
                    let draining = shared.draining.is_cancelled();
                    if !movable {
                        shared.metrics.handoff.drain_closed();
                        close(&mut stream, cfg.idle_timeout).await;
                        return None;
                    }
                    // one move: a connection that stays is not offered again
                    movable = false;
                    let secrets = std::mem::take(&mut secrets);
                    // Boxed: a move is rare, and its future large; inline, every parked
                    // connection's wake-up would allocate and copy it.
                    let left = Box::pin(handoff::export::leave(stream, secrets, &info, &shared));
                    match left.await {
                        Exported::Migrated => return None,
                        Exported::Closed => {
                            shared.metrics.handoff.drain_closed();
                            return None;
                        }
                        // It stays (served from the record layer if it was extracted): what
                        // came meanwhile is served, then the drain ends it.
                        Exported::ServeHere(migrated) => {
                            stream = Engine::Layer(migrated);
                            continue;
                        }
                        Exported::Keep(kept, plain) => {
                            stream = Engine::Rustls(kept);
                            ahead = plain.into();
                            if ahead.is_empty() && draining {
                                shared.metrics.handoff.drain_closed();
                                close(&mut stream, cfg.idle_timeout).await;
                                return None;
                            }
                            if ahead.is_empty() {
                                continue;
                            }
                        }
                    }
                }
            }
        }
        let state = Arc::new(RequestState::default());
        let pace = HeadPace {
            start: Instant::now(),
            first_by: first.take(),
            min_rate: cfg.min_header_rate,
        };
        // Set by the service when a keep-alive response has been handed to hyper whole.
        let whole = Arc::new(tokio::sync::Notify::new());
        let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let http = shared.http.clone();
        let (i, n, p, seen) = (info.clone(), whole.clone(), gate.clone(), state.clone());
        let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
            seen.saw_head();
            let keep_alive = wants_keep_alive(&req);
            let (http, i, n, p) = (http.clone(), i.clone(), n.clone(), p.clone());
            // boxed: hyper needs an Unpin future to hand the stream back
            Box::pin(async move {
                let resp = http.handle(i, req).await?;
                Ok::<_, std::convert::Infallible>(if keep_alive {
                    resp.map(|b| {
                        crate::http::on_end(b, move || {
                            p.store(true, std::sync::atomic::Ordering::Relaxed);
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
                // bytes are here, and `again` below ends the loop. Shutting hyper down before
                // it has read them would close the connection unanswered.)
                _ = whole.notified() => conn.as_mut().graceful_shutdown(),
                why = pace::overdue(pace, &state) => {
                    shared.metrics.slow_request(why == TooSlow::Rate);
                    return None;
                }
            }
        };
        let parts = Pin::into_inner(conn).into_parts();
        let Prefixed {
            ahead: left, inner, ..
        } = parts.io.into_inner();
        stream = inner;
        // what hyper read ahead comes first, then anything still unread in the prefix
        ahead = [parts.read_buf, left].concat().into();
        // A drain is met at the next wait: a connection that can move moves then.
        let again = result.is_ok() && gate.load(std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = &result {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
        if !again {
            close(&mut stream, cfg.idle_timeout).await;
            return None;
        }
    }
}

/// close_notify, then FIN. (By reference: the engine by value would make this future, and
/// every one that awaits it, an engine larger.)
async fn close(stream: &mut Engine, within: std::time::Duration) {
    let _ = tokio::time::timeout(within, tokio::io::AsyncWriteExt::shutdown(stream)).await;
}

/// HTTP/1.1 keeps the connection unless the request says `Connection: close`; 1.0 only with
/// `Connection: keep-alive`.
pub(crate) fn wants_keep_alive<B>(req: &http::Request<B>) -> bool {
    // the tokens compared in place: no allocation per request
    let has = |token: &str| {
        req.headers()
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    match req.version() {
        http::Version::HTTP_11 => !has("close"),
        http::Version::HTTP_10 => has("keep-alive"),
        _ => false,
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

/// A stream with bytes already read from it in front.
pub(crate) struct Prefixed<S> {
    pub(crate) ahead: bytes::Bytes,
    pub(crate) inner: S,
    /// When set and true, reads stay pending (see `serve_http1`); whoever set it shuts the
    /// hyper connection down, which needs no read, and takes the stream back.
    pub(crate) gate: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The request being read, told how many bytes it got (for `--min-header-rate`).
    pub(crate) state: Option<Arc<RequestState>>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self
            .gate
            .as_ref()
            .is_some_and(|g| g.load(std::sync::atomic::Ordering::Relaxed))
        {
            return std::task::Poll::Pending;
        }
        let before = buf.filled().len();
        let r = if !self.ahead.is_empty() {
            let n = self.ahead.len().min(buf.remaining());
            let chunk = self.ahead.split_to(n);
            buf.put_slice(&chunk);
            std::task::Poll::Ready(Ok(()))
        } else {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        };
        if let Some(state) = &self.state {
            state.read(buf.filled().len() - before);
        }
        r
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::is_legacy_client_hello;

    #[test]
    fn legacy_client_versions() {
        let hello = |v: [u8; 2]| {
            [
                0x16, 0x03, 0x01, 0x00, 0x80, 0x01, 0x00, 0x00, 0x7c, v[0], v[1],
            ]
        };
        assert!(is_legacy_client_hello(&hello([0x03, 0x01])), "TLS 1.0");
        assert!(is_legacy_client_hello(&hello([0x03, 0x02])), "TLS 1.1");
        assert!(is_legacy_client_hello(&hello([0x03, 0x00])), "SSL 3");
        assert!(
            !is_legacy_client_hello(&hello([0x03, 0x03])),
            "TLS 1.2 / 1.3"
        );
        assert!(
            !is_legacy_client_hello(&hello([0x03, 0x02])[..10]),
            "too short to tell"
        );
        assert!(!is_legacy_client_hello(b"GET / HTTP/1.1\r\n"), "not TLS");
    }
}
