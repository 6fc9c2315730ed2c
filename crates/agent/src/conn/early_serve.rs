//! A connection that offered early data, served from its server flight on: with early data
//! accepted, its first HTTP/1.1 request is answered at once, before the client's Finished
//! (0.5-RTT data), in a hyper connection of its own (`one_request`) that gives the stream
//! back at a request boundary; then its handshake ends (`early_tls`) and the connection is
//! handed over to the path every connection takes (`http1`). HTTP/2 stays on `EarlyConn`
//! for its life (`serve_stream`).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::early_tls::{EarlyConn, Handover};
use super::one_request;
use super::pace::HeadPace;
use super::serve_stream::serve_stream;
use crate::context::Context;

/// Serves a connection driven by `early_tls`: sends the server's flight, then (accepted early
/// data) answers the first request at once. The handshake must still end by `deadline`: a
/// client that sent early data and never its Finished is cut then (its early request was
/// answered). An HTTP/1.1 connection is then handed over (`None`: it ended); an HTTP/2 one is
/// served here to its end.
pub(crate) async fn serve(
    mut conn: EarlyConn,
    peer: SocketAddr,
    first_by: Instant,
    deadline: Instant,
    ctx: &Arc<Context>,
) -> Option<Handover> {
    if !conn.send_flight(deadline).await {
        return None;
    }
    let info = conn.info(peer).logged(
        ctx.http.access_log.as_ref(),
        crate::access_log::Migrated::No,
    );
    // the connection's log goes on with it after the handshake (its line says 0-RTT)
    let log = info.log.clone();
    let overdue = conn.handshake_overdue(deadline, peer);
    if info.alpn.as_deref() == Some("h2") {
        tokio::select! {
            () = serve_stream(conn, info, first_by, ctx) => {}
            () = overdue => {}
        }
        return None;
    }
    let (mut conn, mut ahead, mut first) = (conn, bytes::Bytes::new(), Some(first_by));
    if conn.accepted() {
        // the first request, answered on the connection as `early_tls` drives it: at once,
        // before the client's Finished has come (0.5-RTT data)
        let pace = HeadPace {
            start: Instant::now(),
            first_by: Some(first_by),
            min_rate: ctx.config.min_header_rate,
        };
        let (info, builder) = (Arc::new(info), one_request::builder(&ctx.config));
        let (served, read) = tokio::select! {
            served = one_request::serve(conn, ahead, pace, &info, ctx, &builder) => served?,
            () = overdue => return None,
        };
        (conn, ahead, first) = (served, read, None);
    }
    let mut handover = conn
        .finish(ahead, first, peer, deadline, ctx.tls.config())
        .await?;
    handover.info.log = log;
    Some(handover)
}
