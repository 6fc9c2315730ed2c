//! The handshake agent's side of a migration: the tokio shell that pumps
//! `baton_wire::handoff::Exporter` (the protocol) and `super::session` (the TLS work) over the
//! connection's link stream. Every decision is in those two; this file only reads, writes and
//! waits.

use std::time::Instant;

use baton_session::migration::MAX_CARRIED_PLAINTEXT;
use baton_wire::handoff::{ExportEvent, Exporter, Frame};
use rustls::ProtocolVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::metrics::{HandoffFailure, Side, Why};
use super::secrets::TrafficSecrets;
use super::session::{self, Extras};
use super::stream::MigratedStream;
use crate::conn::Tls;
use crate::engine::Engine;
use crate::http::ConnInfo;
use crate::io::ConnIo;
use crate::server::Shared;
use crate::transport::AgentIo;
use baton_ops::process::thread_cpu;

/// How a handoff attempt left the connection.
pub enum Exported {
    /// The home agent has it; this agent is done.
    Migrated,
    /// Extracted, but the home agent did not take it: served here from the record layer.
    ServeHere(Box<MigratedStream<ConnIo<AgentIo>>>),
    /// Not extracted: carry on with rustls. The plaintext is what was already read from it.
    Keep(Box<Tls>, Vec<u8>),
    /// Lost: the client or the dispatcher went away, or broke the protocol.
    Closed,
}

/// The dispatcher's Offer: where the session should go, and what its object is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Offer {
    pub home: u16,
    pub binding: [u8; baton_wire::handoff::BINDING_LEN],
}

/// Runs the handshake agent's side for a connection the dispatcher offered to hand on, right
/// after the handshake (before any application data was read). The traffic secrets are taken
/// only if the session moves: one that stays here keeps them (and its records followed), so
/// that it can park on the record layer later.
pub async fn hand_off(
    mut stream: Tls,
    offer: Offer,
    secrets: &mut TrafficSecrets,
    info: &ConnInfo,
    shared: &Shared,
) -> Exported {
    let cfg = &shared.config;
    let m = &shared.metrics.handoff;
    let tls13 = stream.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    // Where the client's records stand in what rustls read during the handshake (and the
    // stream stops following them, whatever happens next).
    let read = stream.get_mut().0.take_records();
    let ring = shared.tls.cluster_ring();
    let usable = ring.is_some() && (!tls13 || secrets.client.is_some() && secrets.server.is_some());
    if offer.home == cfg.agent_id || !usable {
        if offer.home == cfg.agent_id {
            m.declined();
        } else {
            m.failure(HandoffFailure::NoSecrets);
        }
        let (io, _) = stream.get_mut();
        if let Some(read) = read {
            io.continue_records(read);
        }
        return match send_with_held(io, &Frame::Decline.to_bytes()).await {
            Ok(()) => Exported::Keep(Box::new(stream), Vec::new()),
            Err(_) => Exported::Closed,
        };
    }
    let started = Instant::now();
    let Some(read) = read else {
        m.failure(HandoffFailure::Protocol);
        return Exported::Closed;
    };
    let (mut x, freeze) = Exporter::freeze(MAX_CARRIED_PLAINTEXT, cfg.handoff_timeout, tokio_now());
    x.continue_from(read);
    // The NewSessionTickets must be on the wire before the freeze: extraction refuses queued
    // records, and the tx sequence must count them. They go out with the Freeze in one write
    // (one DATA frame on the link, one system call here and one read at the dispatcher,
    // instead of two of each): the handshake left them held (`conn::serve`).
    if stream.flush().await.is_err() || stream.get_ref().1.wants_write() {
        return Exported::Closed;
    }
    if send_with_held(stream.get_mut().0, &freeze).await.is_err() {
        return Exported::Closed;
    }
    let how = Move {
        offer: Some(offer),
        secrets: std::mem::take(secrets),
        started,
        why: Why::Handshake,
    };
    migrate(Engine::Rustls(Box::new(stream)), x, how, info, shared).await
}

/// Asks the dispatcher to move a connection this agent is idle on (between two HTTP/1.1
/// requests) because the agent drains: Leave, then, if the dispatcher names an agent, the
/// same freeze, export and two-phase verdict as after a handshake. `Keep` (with any request
/// bytes that came meanwhile) when it stays or cannot move: the caller then ends it as a drain
/// does. Only for a link stream whose client records were followed from the first byte.
pub(crate) async fn leave(
    mut stream: Engine,
    secrets: TrafficSecrets,
    info: &ConnInfo,
    shared: &Shared,
) -> Exported {
    let cfg = &shared.config;
    // A rustls connection's TLS 1.3 secrets come from the key log; the layer has its own.
    let secrets_known = match &stream {
        Engine::Rustls(_) => secrets.client.is_some() && secrets.server.is_some(),
        Engine::Layer(_) => true,
    };
    let usable = shared.tls.cluster_ring().is_some() && (!stream.is_tls13() || secrets_known);
    // Every response byte must be on the wire first: after Leave this agent sends nothing.
    if stream.flush().await.is_err() {
        return Exported::Closed;
    }
    if let Engine::Rustls(s) = &stream {
        if s.get_ref().1.wants_write() {
            return Exported::Closed;
        }
    }
    let read = stream.records();
    let Some(read) = read.filter(|_| usable) else {
        return stream.keep(Vec::new());
    };
    let started = Instant::now();
    let (mut x, leave) = Exporter::leave(MAX_CARRIED_PLAINTEXT, cfg.handoff_timeout, tokio_now());
    x.continue_from(read);
    if stream.io().write_all(&leave).await.is_err() {
        return Exported::Closed;
    }
    let how = Move {
        offer: None,
        secrets,
        started,
        why: Why::Drain,
    };
    migrate(stream, x, how, info, shared).await
}

/// A move under way, from the handshake agent's side.
struct Move {
    /// Where to: the Offer (a Leave learns it from the dispatcher's answer).
    offer: Option<Offer>,
    secrets: TrafficSecrets,
    started: Instant,
    why: Why,
}

/// Decrypts up to Frozen, extracts, seals, switches, and waits for the verdict.
async fn migrate(
    mut stream: Engine,
    mut x: Exporter,
    how: Move,
    info: &ConnInfo,
    shared: &Shared,
) -> Exported {
    let cfg = &shared.config;
    let m = &shared.metrics.handoff;
    let Move {
        mut offer,
        secrets,
        started,
        why,
    } = how;
    // Decrypt every client record up to Frozen, within the plaintext cap.
    let mut plain = Vec::new();
    let mut cpu = std::time::Duration::ZERO;
    // The metered section of the last decryption, left open when extraction follows at once
    // (no await between them): one clock read fewer per migration, the same total.
    let mut open_since = None;
    // Filled by reads only (`read_buf` takes spare capacity): nothing to zero first.
    let mut buf = Vec::with_capacity(18 * 1024);
    loop {
        let Some(data) = read_until(stream.io(), &mut buf, &x).await else {
            m.failure(HandoffFailure::Protocol);
            return Exported::Closed;
        };
        let Ok(input) = x.from_dispatcher(&buf[..data]) else {
            m.failure(HandoffFailure::Protocol);
            return Exported::Closed;
        };
        // Even with nothing new: a TLS 1.3 client's first request rides with its Finished and
        // may already be decrypted inside rustls, which extraction would drop.
        {
            let t = thread_cpu();
            let fed = stream.decrypt(&input.decrypt, &mut plain);
            let Ok(n) = fed else {
                // the client's bytes do not decrypt: rustls' alert ends it
                let _ = stream.flush().await;
                return Exported::Closed;
            };
            if let Some(ExportEvent::Move { home, binding }) = input.moved {
                offer = Some(Offer { home, binding });
            }
            let abort = x.decrypted(n);
            match (&abort, &input.event) {
                (None, Some(ExportEvent::Frozen)) => open_since = Some(t),
                _ => cpu += thread_cpu().saturating_sub(t),
            }
            if let Some(abort) = abort {
                m.failure(HandoffFailure::TooMuchPlaintext);
                if stream.io().write_all(&abort).await.is_err() {
                    return Exported::Closed;
                }
            }
        }
        match input.event {
            None => continue,
            Some(ExportEvent::Frozen) => break,
            // Over the cap: the records kept since go to rustls like the rest.
            // Over the cap, or nowhere to go (Stay): the engine reads on, from the records
            // kept since or what came after the answer.
            Some(ExportEvent::Keep { ciphertext }) | Some(ExportEvent::Stay { ciphertext }) => {
                if stream.decrypt(&ciphertext, &mut plain).is_err() {
                    let _ = stream.flush().await;
                    return Exported::Closed;
                }
                return stream.keep(plain);
            }
            Some(_) => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        }
    }
    let Some(offer) = offer else {
        m.failure(HandoffFailure::Protocol);
        return Exported::Closed;
    };
    let ring = shared.tls.cluster_ring();

    let t = open_since.unwrap_or_else(thread_cpu);
    if !stream.extractable() {
        m.failure(HandoffFailure::Export);
        let Ok(abort) = x.abort() else {
            return Exported::Closed;
        };
        return match stream.io().write_all(&abort).await {
            Ok(()) => stream.keep(plain),
            Err(_) => Exported::Closed,
        };
    }
    let tls13 = stream.is_tls13();
    let extras = Extras {
        home: offer.home,
        secrets,
        info,
        plaintext: plain,
    };
    let (mut io, obj) = match stream.extract(extras) {
        Ok(extracted) => extracted,
        Err(session::ExtractFailed) => {
            m.failure(HandoffFailure::Export);
            return Exported::Closed;
        }
    };
    // A TLS 1.3 session moves only with the traffic secrets its keys came from: without them
    // the next KeyUpdate would break it there (a client that updated its keys earlier, while
    // the secrets kept were those of the handshake). It stays, served from the record layer.
    let keyless = tls13 && (obj.tx.secret.is_none() || obj.rx.secret.is_none());
    let sealed = ring
        .and_then(|r| {
            let ring = r.read().unwrap_or_else(|p| p.into_inner());
            obj.seal(&ring, cfg.agent_id, &offer.binding)
        })
        .filter(|s| Frame::fits(s.len()) && !keyless);
    m.cpu(Side::Export, cpu + thread_cpu().saturating_sub(t));
    let Some(sealed) = sealed else {
        m.failure(match keyless {
            true => HandoffFailure::NoSecrets,
            false => HandoffFailure::Export,
        });
        let Ok(abort) = x.abort() else {
            return Exported::Closed;
        };
        if io.write_all(&abort).await.is_err() {
            return Exported::Closed;
        }
        return serve_here(io, &obj, &[]);
    };
    let Ok(switch) = x.switch(sealed, tokio_now()) else {
        return Exported::Closed;
    };
    if io.write_all(&switch).await.is_err() {
        return Exported::Closed;
    }

    // The verdict: Done, or Resume followed by the client's held bytes. Until then the keys
    // are not ours; a dispatcher that never answers gets the connection closed, not served.
    loop {
        let Some(n) = read_until(&mut io, &mut buf, &x).await else {
            m.failure(HandoffFailure::Protocol);
            return Exported::Closed;
        };
        match x.from_dispatcher(&buf[..n]).map(|input| input.event) {
            Ok(None) => continue,
            Ok(Some(ExportEvent::Migrated)) => {
                m.migrated_out(started.elapsed(), why);
                return Exported::Migrated;
            }
            Ok(Some(ExportEvent::ServeHere { ciphertext })) => {
                m.failure(HandoffFailure::FellBack);
                return serve_here(io, &obj, &ciphertext);
            }
            Ok(Some(_)) | Err(_) => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        }
    }
}

/// Writes `frame` after what the handshake left held (see `conn::serve`), as one write, and
/// stops holding writes.
async fn send_with_held(io: &mut ConnIo<AgentIo>, frame: &[u8]) -> std::io::Result<()> {
    io.write_all(frame).await?;
    io.stop_coalescing();
    io.flush().await
}

fn tokio_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// One read from the dispatcher before the machine's deadline; `None` on EOF, error or
/// timeout. The dispatcher tells Done by releasing the link stream (one reset frame, no
/// answer owed): that reads as the Done frame it stands for.
async fn read_until(io: &mut ConnIo<AgentIo>, buf: &mut Vec<u8>, x: &Exporter) -> Option<usize> {
    let deadline = x.deadline()?;
    buf.clear();
    match tokio::time::timeout_at(deadline.into(), io.read_buf(buf)).await {
        Ok(Ok(n)) if n > 0 => Some(n),
        Ok(Err(e)) if baton_link::is_release(&e) => {
            buf.extend_from_slice(&Frame::Done.to_bytes());
            Some(buf.len())
        }
        _ => None,
    }
}

/// Serves an extracted session here after all, from the record layer (built only now: most
/// sessions move, and their keys are needed only at the home agent). `ciphertext` came with
/// the dispatcher's Resume.
fn serve_here(
    io: ConnIo<AgentIo>,
    obj: &baton_session::migration::SessionObject,
    ciphertext: &[u8],
) -> Exported {
    match super::record_layer(obj) {
        Some(layer) => {
            let mut s = MigratedStream::new(io, layer, obj.plaintext.clone())
                .negotiated(obj.version, obj.suite);
            s.prefill_ciphertext(ciphertext);
            Exported::ServeHere(Box::new(s))
        }
        None => Exported::Closed,
    }
}
