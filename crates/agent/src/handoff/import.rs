//! The home agent's side of a migration: a stream from the dispatcher that starts with
//! `Import{sealed session object}` instead of a ClientHello. The object must open with the
//! cluster key, be addressed to this agent, be unexpired and never seen before; then this agent
//! answers Accepted and carries on the client's connection from the record layer. Otherwise it
//! answers Refused and the dispatcher falls back to the handshake agent.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::SystemTime;

use baton_session::migration::{ImportError, ReplayGuard, SessionObject};
use baton_wire::handoff::{Frame, RefuseReason};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::metrics::{HandoffFailure, Side};
use super::stream::MigratedStream;
use crate::http::ConnInfo;
use crate::io::ConnIo;
use crate::server::Shared;
use baton_ops::process::thread_cpu;

/// Ids of imported session objects, remembered until they expire. Objects live seconds, so
/// this bounds the rate of imports at ~MAX_REMEMBERED per TTL, far above what an agent serves.
const MAX_REMEMBERED: usize = 1 << 20;

/// The home agent's import state.
#[derive(Debug)]
pub struct Importer {
    guard: Mutex<ReplayGuard>,
}

impl Default for Importer {
    fn default() -> Self {
        Self {
            guard: Mutex::new(ReplayGuard::new(MAX_REMEMBERED)),
        }
    }
}

/// Opens `sealed` and, if it is good, answers Accepted and returns the migrated connection.
pub async fn import(
    mut tcp: TcpStream,
    peer: SocketAddr,
    sealed: &[u8],
    shared: &Shared,
) -> Option<(MigratedStream<ConnIo<TcpStream>>, ConnInfo)> {
    let m = &shared.metrics.handoff;
    let t = thread_cpu();
    let opened = match shared.tls.cluster_ring() {
        None => Err(RefuseReason::Unavailable),
        Some(ring) => {
            let ring = ring.read().unwrap_or_else(|p| p.into_inner());
            let mut guard = shared
                .importer
                .guard
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            SessionObject::open(
                sealed,
                &ring,
                shared.config.agent_id,
                SystemTime::now(),
                &mut guard,
            )
            .map_err(|e| {
                let (failure, reason) = match e {
                    ImportError::Seal => (HandoffFailure::ImportSeal, RefuseReason::Seal),
                    ImportError::Expired => (HandoffFailure::ImportExpired, RefuseReason::Expired),
                    ImportError::Replay => (HandoffFailure::ImportReplay, RefuseReason::Replay),
                    ImportError::Invalid => (HandoffFailure::ImportInvalid, RefuseReason::Invalid),
                };
                m.failure(failure);
                reason
            })
        }
    };
    let layer = opened.and_then(|obj| match super::record_layer(&obj) {
        Some(layer) => Ok((obj, layer)),
        None => {
            m.failure(HandoffFailure::ImportInvalid);
            Err(RefuseReason::Invalid)
        }
    });
    m.cpu(Side::Import, thread_cpu().saturating_sub(t));
    let (obj, layer) = match layer {
        Ok(x) => x,
        Err(reason) => {
            tracing::debug!(%peer, reason = reason.label(), "refused a migrated session");
            let _ = tcp.write_all(&Frame::Refused(reason).to_bytes()).await;
            return None;
        }
    };
    if tcp.write_all(&Frame::Accepted.to_bytes()).await.is_err() {
        return None;
    }
    m.migrated_in();
    let info = super::conn_info(&obj, peer);
    let io = ConnIo::new(tcp, shared.metrics.clone(), shared.config.idle_timeout);
    Some((MigratedStream::new(io, layer, obj.plaintext.clone()), info))
}
