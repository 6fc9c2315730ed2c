//! The handshake agent's side of a migration: the tokio shell that pumps
//! `baton_migrate::Exporter` (the protocol) and `super::session` (the TLS work) over the
//! connection's link stream. Every decision is in those two; this file only reads, writes and
//! waits.

use std::time::Instant;

use baton_migrate::{ExportEvent, Exporter, Frame};
use baton_session::migration::MAX_CARRIED_PLAINTEXT;
use rustls::ProtocolVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::metrics::{HandoffFailure, Side, Why};
use super::offer::Offer;
use super::stream::MigratedStream;
use crate::conn::engine::{Engine, RustlsStream};
use crate::conn::io::ConnIo;
use crate::conn::transport::AgentIo;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use baton_migrate::extract::{self, Extras};
use baton_migrate::secrets::TrafficSecrets;
use baton_ops::process::thread_cpu;

/// How a handoff attempt left the connection.
pub enum Exported {
    /// The home agent has it; this agent is done.
    Migrated,
    /// Extracted, but the home agent did not take it: served here from the record layer.
    ServeHere(Box<MigratedStream<ConnIo<AgentIo>>>),
    /// Not extracted: carry on with rustls. The plaintext is what was already read from it.
    Keep(Box<RustlsStream>, Vec<u8>),
    /// Lost: the client or the dispatcher went away, or broke the protocol.
    Closed,
}

/// Runs the handshake agent's side for a connection the dispatcher offered to hand on, right
/// after the handshake (before any application data was read). The traffic secrets are taken
/// only if the session moves: one that stays here keeps them (and its records followed), so
/// that it can park on the record layer later.
pub async fn hand_off(
    mut stream: RustlsStream,
    offer: Offer,
    secrets: &mut TrafficSecrets,
    info: &ConnInfo,
    ctx: &Context,
) -> Exported {
    let cfg = &ctx.config;
    let m = &ctx.metrics.handoff;
    let tls13 = stream.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    // Where the client's records stand in what rustls read during the handshake (and the
    // stream stops following them, whatever happens next).
    let read = stream.get_mut().0.take_records();
    let ring = ctx.tls.cluster_ring();
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
    // The cut: the end of the last whole client record rustls has read (bytes after the
    // Offer). A record it read part of is not consumed: its sequence number stays unused,
    // rustls drops its bytes at extraction, and the dispatcher's copy has them for whoever
    // serves on.
    let Ok(cut) = u32::try_from(stream.get_ref().0.record_boundary()) else {
        m.failure(HandoffFailure::Protocol);
        return Exported::Closed;
    };
    let mut x = Exporter::cut(MAX_CARRIED_PLAINTEXT, cfg.migration_timeouts, tokio_now());
    x.continue_from(read.clone());
    // The NewSessionTickets must leave rustls before the extraction (it refuses queued
    // records, and the tx sequence must count them). They stay held in the stream and go out
    // with the Switch (or the Abort) in one write: one DATA frame on the link, one system call
    // here and one read at the dispatcher (`conn::accept::serve` left them held).
    if stream.flush().await.is_err() || stream.get_ref().1.wants_write() {
        return Exported::Closed;
    }
    // Every whole record rustls has read, decrypted now: a TLS 1.3 client's first request
    // rides with its Finished, and may already be decrypted inside rustls.
    let t = thread_cpu();
    let mut plain = Vec::new();
    let mut engine = Engine::Rustls(Box::new(stream));
    let Ok(n) = engine.decrypt(&[], &mut plain) else {
        // the client's bytes do not decrypt: rustls' alert ends it
        let _ = engine.flush().await;
        return Exported::Closed;
    };
    x.decrypted(n);
    if !x.within_cap() {
        m.failure(HandoffFailure::TooMuchPlaintext);
        return keep_after_abort(engine, &mut x, plain, Some(read)).await;
    }
    let how = Move {
        offer: Some(offer),
        secrets: std::mem::take(secrets),
        started,
        why: Why::Handshake,
        cut,
    };
    switch(
        engine,
        x,
        how,
        plain,
        Metered {
            before: std::time::Duration::ZERO,
            open_since: Some(t),
        },
        info,
        ctx,
    )
    .await
}

/// Asks the dispatcher to move a connection this agent is idle on (between two HTTP/1.1
/// requests) because the agent drains: Leave, then, if the dispatcher names an agent (its
/// Offer is the cut), the same export and two-phase verdict as after a handshake. `Keep`
/// (with any request bytes that came meanwhile) when it stays or cannot move: the caller then
/// ends it as a drain does. Only for a link stream whose client records were followed from
/// the first byte.
pub(crate) async fn leave(
    mut stream: Engine,
    secrets: TrafficSecrets,
    info: &ConnInfo,
    ctx: &Context,
) -> Exported {
    let cfg = &ctx.config;
    let m = &ctx.metrics.handoff;
    // A rustls connection's TLS 1.3 secrets come from the key log; the layer has its own.
    let secrets_known = match &stream {
        Engine::Rustls(_) => secrets.client.is_some() && secrets.server.is_some(),
        Engine::Layer(_) => true,
    };
    let usable = ctx.tls.cluster_ring().is_some() && (!stream.is_tls13() || secrets_known);
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
        return keep(stream, Vec::new());
    };
    let started = Instant::now();
    let (mut x, leave) =
        Exporter::leave(MAX_CARRIED_PLAINTEXT, cfg.migration_timeouts, tokio_now());
    x.continue_from(read);
    if stream.io().write_all(&leave).await.is_err() {
        return Exported::Closed;
    }
    // Decrypt every client record up to the dispatcher's answer.
    let mut plain = Vec::new();
    let mut cpu = std::time::Duration::ZERO;
    // Filled by reads only (`read_buf` takes spare capacity): nothing to zero first.
    let mut buf = Vec::with_capacity(18 * 1024);
    let offer = loop {
        let Some(Read::Data(data)) = read_until(stream.io(), &mut buf, &x).await else {
            m.failure(HandoffFailure::Protocol);
            return Exported::Closed;
        };
        let Ok(input) = x.from_dispatcher(&buf[..data]) else {
            m.failure(HandoffFailure::Protocol);
            return Exported::Closed;
        };
        let t = thread_cpu();
        let Ok(n) = stream.decrypt(&input.decrypt, &mut plain) else {
            let _ = stream.flush().await;
            return Exported::Closed;
        };
        x.decrypted(n);
        cpu += thread_cpu().saturating_sub(t);
        match (input.moved, input.event) {
            (Some(ExportEvent::Move { home, binding }), None) => break Offer { home, binding },
            (None, None) => continue,
            // Nowhere to go: the engine reads on from what came after the answer.
            (None, Some(ExportEvent::Stay { ciphertext })) => {
                if stream.decrypt(&ciphertext, &mut plain).is_err() {
                    let _ = stream.flush().await;
                    return Exported::Closed;
                }
                return keep(stream, plain);
            }
            _ => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        }
    };
    if !x.within_cap() {
        m.failure(HandoffFailure::TooMuchPlaintext);
        // the dispatcher gives back what it held after its Offer: the engine reads it on
        return keep_after_abort(stream, &mut x, plain, None).await;
    }
    let how = Move {
        offer: Some(offer),
        secrets,
        started,
        why: Why::Drain,
        cut: 0,
    };
    let metered = Metered {
        before: cpu,
        open_since: None,
    };
    switch(stream, x, how, plain, metered, info, ctx).await
}

/// A move under way, from the handshake agent's side.
struct Move {
    /// Where to, from the Offer.
    offer: Option<Offer>,
    secrets: TrafficSecrets,
    started: Instant,
    why: Why,
    /// Client bytes after the Offer this agent consumed (0 after a Leave: the Offer is it).
    cut: u32,
}

/// Nothing extracted, and the connection stays: Abort (after the held tickets, if any), and
/// the engine reads on. `read`: where its records stood, to follow them on.
async fn keep_after_abort(
    mut stream: Engine,
    x: &mut Exporter,
    plain: Vec<u8>,
    read: Option<baton_migrate::Splitter>,
) -> Exported {
    let Ok(abort) = x.abort() else {
        return Exported::Closed;
    };
    if send_with_held(stream.io(), &abort).await.is_err() {
        return Exported::Closed;
    }
    if let Some(read) = read {
        stream.io().continue_records(read);
    }
    keep(stream, plain)
}

/// The export's thread CPU so far: `before`, closed sections, and the one still open since
/// `open_since` (the decryption right before, with no await between: one clock read fewer
/// per migration, a `CLOCK_THREAD_CPUTIME_ID` read being a real system call here).
struct Metered {
    before: std::time::Duration,
    open_since: Option<std::time::Duration>,
}

/// At the cut, every record before it decrypted into `plain`: extracts, seals, switches (the
/// held tickets with it), and waits for the verdict.
async fn switch(
    mut stream: Engine,
    mut x: Exporter,
    how: Move,
    plain: Vec<u8>,
    metered: Metered,
    info: &ConnInfo,
    ctx: &Context,
) -> Exported {
    let cfg = &ctx.config;
    let m = &ctx.metrics.handoff;
    let Move {
        offer,
        secrets,
        started,
        why,
        cut,
    } = how;
    let Some(offer) = offer else {
        m.failure(HandoffFailure::Protocol);
        return Exported::Closed;
    };
    let ring = ctx.tls.cluster_ring();

    let t = metered.open_since.unwrap_or_else(thread_cpu);
    if !stream.extractable() {
        m.failure(HandoffFailure::Export);
        return keep_after_abort(stream, &mut x, plain, None).await;
    }
    let tls13 = stream.is_tls13();
    let extras = Extras {
        home: offer.home,
        secrets,
        app: info.application(),
        plaintext: plain,
    };
    let (mut io, obj) = match stream.extract(extras) {
        Ok(extracted) => extracted,
        Err(extract::ExtractFailed) => {
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
    m.cpu(
        Side::Export,
        metered.before + thread_cpu().saturating_sub(t),
    );
    let (frame, kept) = match sealed {
        Some(sealed) => (x.switch(cut, sealed, tokio_now()), false),
        None => {
            m.failure(match keyless {
                true => HandoffFailure::NoSecrets,
                false => HandoffFailure::Export,
            });
            // extracted: rustls dropped what it read past the cut, the dispatcher has it
            (x.kept(cut, tokio_now()), true)
        }
    };
    let Ok(frame) = frame else {
        return Exported::Closed;
    };
    if send_with_held(&mut io, &frame).await.is_err() {
        return Exported::Closed;
    }

    // The verdict: Done, or Resume followed by the client's bytes from the cut. Until then
    // the keys are not ours; a dispatcher that never answers gets the connection closed, not
    // served. Client records after the cut that come first are discarded.
    let mut buf = Vec::with_capacity(18 * 1024);
    loop {
        let event = match read_until(&mut io, &mut buf, &x).await {
            Some(Read::Data(n)) => x.from_dispatcher(&buf[..n]).map(|input| input.event),
            Some(Read::Released) => x.released().map(Some),
            None => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        };
        match event {
            Ok(None) => continue,
            Ok(Some(ExportEvent::Migrated)) => {
                m.migrated_out(started.elapsed(), why);
                return Exported::Migrated;
            }
            Ok(Some(ExportEvent::ServeHere { ciphertext })) => {
                if !kept {
                    m.failure(HandoffFailure::FellBack);
                }
                return serve_here(io, &obj, &ciphertext);
            }
            Ok(Some(_)) | Err(_) => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        }
    }
}

/// The connection stays here after all: serve on, `plain` (what came meanwhile) first.
fn keep(engine: Engine, plain: Vec<u8>) -> Exported {
    match engine {
        Engine::Rustls(s) => Exported::Keep(s, plain),
        Engine::Layer(mut s) => {
            s.prefill_plaintext(plain);
            Exported::ServeHere(s)
        }
    }
}

/// Writes `frame` after what the handshake left held (see `conn::accept::serve`), as one write, and
/// stops holding writes.
async fn send_with_held(io: &mut ConnIo<AgentIo>, frame: &[u8]) -> std::io::Result<()> {
    io.write_all(frame).await?;
    io.stop_coalescing();
    io.flush().await
}

fn tokio_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// What one read from the dispatcher brought.
enum Read {
    Data(usize),
    /// The stream was released (after Switch: Done).
    Released,
}

/// One read from the dispatcher before the machine's deadline; `None` on EOF, error or
/// timeout. The dispatcher tells Done by releasing the link stream (one reset frame, no
/// answer owed).
async fn read_until(io: &mut ConnIo<AgentIo>, buf: &mut Vec<u8>, x: &Exporter) -> Option<Read> {
    let deadline = x.deadline()?;
    buf.clear();
    match tokio::time::timeout_at(deadline.into(), io.read_buf(buf)).await {
        Ok(Ok(n)) if n > 0 => Some(Read::Data(n)),
        Ok(Err(e)) if baton_link::is_release(&e) => Some(Read::Released),
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
    match baton_migrate::record_layer(obj) {
        Some(layer) => {
            let mut s = MigratedStream::new(io, layer, obj.plaintext.clone())
                .negotiated(obj.version, obj.suite);
            s.prefill_ciphertext(ciphertext);
            Exported::ServeHere(Box::new(s))
        }
        None => Exported::Closed,
    }
}
