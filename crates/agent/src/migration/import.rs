//! The home agent's side of a migration: the tokio shell around
//! `baton_migrate::Importer`. A link stream that starts with `Import{sealed object}`
//! instead of a ClientHello: the object must open with the cluster key and this stream's
//! binding (the link's id and the stream's token), be addressed to this agent, unexpired,
//! issued after this agent started and never seen before. Then this agent answers Ready and
//! waits — using nothing — for the dispatcher's Commit, after which it carries on the client's
//! connection from the record layer. Refused, Abort, a reset stream or a late Commit: the keys
//! are dropped unused.

use std::net::SocketAddr;
use std::time::SystemTime;

use baton_migrate::{ImportDriver, ImportFailure, ImportStep, RefuseReason};
use baton_session::migration::{ImportError, SessionObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::metrics::{HandoffFailure, Side, Why};
use crate::access_log::Migrated;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::transport::agent_io::AgentIo;
use crate::transport::conn_io::ConnIo;
use crate::transport::migrated::MigratedStream;
use baton_ops::process::thread_cpu;

/// Opens a sealed object for this agent and `binding`, counting why it was refused.
pub fn open(sealed: &[u8], binding: &[u8], ctx: &Context) -> Result<SessionObject, RefuseReason> {
    let m = &ctx.metrics.handoff;
    let Some(ring) = ctx.tls.cluster_ring() else {
        return Err(RefuseReason::Unavailable);
    };
    let ring = ring.read().unwrap_or_else(|p| p.into_inner());
    let state = &ctx.importer;
    let mut guard = state.guard.lock().unwrap_or_else(|p| p.into_inner());
    let me = ctx.config.agent_id;
    SessionObject::open(
        sealed,
        &ring,
        me,
        binding,
        SystemTime::now(),
        state.started,
        &mut guard,
    )
    .map_err(|e| {
        let (failure, reason) = refusal(e);
        m.failure(failure);
        reason
    })
}

/// Why an object that did not open is refused, and how that is counted.
pub fn refusal(e: ImportError) -> (HandoffFailure, RefuseReason) {
    match e {
        ImportError::Seal => (HandoffFailure::ImportSeal, RefuseReason::Seal),
        ImportError::Expired | ImportError::Stale => {
            (HandoffFailure::ImportExpired, RefuseReason::Expired)
        }
        ImportError::Replay => (HandoffFailure::ImportReplay, RefuseReason::Replay),
        ImportError::Invalid => (HandoffFailure::ImportInvalid, RefuseReason::Invalid),
    }
}

/// Runs the home agent's side on a link stream whose first bytes are an Import frame: pumps
/// `baton_migrate::ImportDriver` (every decision of the side), opening the object it is
/// handed; returns the migrated connection once the dispatcher has committed it here.
pub async fn import(
    mut io: ConnIo<AgentIo>,
    peer: SocketAddr,
    binding: &[u8],
    why: Why,
    ctx: &Context,
) -> Option<(MigratedStream<ConnIo<AgentIo>>, ConnInfo)> {
    let m = &ctx.metrics.handoff;
    let mut driver = ImportDriver::new(ctx.config.migration_timeouts, now());
    // Read into spare capacity (`read_buf`): nothing to zero first.
    let mut buf = Vec::with_capacity(8 * 1024);
    let mut opened = None;
    // The agent that sealed the session (its clear header, authenticated once it opens).
    let mut issuer = None;
    loop {
        while let Some(step) = driver.poll_step() {
            match step {
                ImportStep::Open(sealed) => {
                    issuer = baton_session::TicketHeader::parse(&sealed).map(|h| h.issuer);
                    let t = thread_cpu();
                    let layer =
                        open(&sealed, binding, ctx).and_then(
                            |obj| match baton_migrate::record_layer(&obj) {
                                Some(layer) => Ok((obj, layer)),
                                None => {
                                    m.failure(HandoffFailure::ImportInvalid);
                                    Err(RefuseReason::Invalid)
                                }
                            },
                        );
                    m.cpu(Side::Import, thread_cpu().saturating_sub(t));
                    let answer = match layer {
                        Ok(x) => {
                            opened = Some(x);
                            Ok(())
                        }
                        Err(reason) => {
                            tracing::debug!(%peer, reason = reason.label(), "refused a migrated session");
                            Err(reason)
                        }
                    };
                    driver.opened(answer, now());
                }
                ImportStep::Failed(ImportFailure::Uncommitted) => {
                    m.failure(HandoffFailure::Uncommitted)
                }
                ImportStep::Failed(ImportFailure::Protocol(e)) => {
                    tracing::debug!(%peer, error = %e, "import stream broke the protocol");
                    m.failure(HandoffFailure::Protocol);
                }
                ImportStep::Commit { ciphertext } => {
                    let (obj, layer) = opened?;
                    m.migrated_in(why);
                    let from = issuer.map_or(Migrated::Unknown, Migrated::From);
                    let info =
                        ConnInfo::migrated(&obj, peer).logged(ctx.http.access_log.as_ref(), from);
                    let mut s = MigratedStream::new(io, layer, obj.plaintext.clone())
                        .negotiated(obj.version, obj.suite);
                    s.prefill_ciphertext(&ciphertext);
                    return Some((s, info));
                }
                ImportStep::Close => {
                    // a Refused goes out before the stream closes
                    while let Some(frame) = driver.poll_transmit() {
                        let _ = io.write_all(&frame).await;
                    }
                    return None;
                }
            }
        }
        while let Some(frame) = driver.poll_transmit() {
            if io.write_all(&frame).await.is_err() {
                return None;
            }
        }
        let deadline = driver.poll_timeout()?;
        buf.clear();
        match tokio::time::timeout_at(deadline.into(), io.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => driver.handle(now(), &buf[..n]),
            // EOF or a reset stream (the dispatcher went another way): drop it all
            Ok(_) => driver.closed(),
            Err(_) => driver.handle_timeout(now()),
        }
    }
}

fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
