//! The handshake agent's side of a migration: the tokio shell that pumps
//! `baton_migrate::ExportDriver` (every decision of the side) over the connection's link
//! stream, doing the TLS work it asks for with the connection's engine. This file only reads,
//! writes, waits and runs the engine.

use std::time::{Duration, Instant};

use baton_migrate::{ExportDriver, ExportFailure, ExportStep, Extraction, Offered};
use baton_session::migration::{SessionObject, MAX_CARRIED_PLAINTEXT};
use rustls::ProtocolVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::metrics::{HandoffFailure, Side, Why};
use super::offer::Offer;
use crate::conn_info::ConnInfo;
use crate::context::Context;
use crate::transport::agent_io::AgentIo;
use crate::transport::conn_io::ConnIo;
use crate::transport::engine::{Engine, RustlsStream};
use crate::transport::migrated::MigratedStream;
use baton_migrate::extract::Extras;
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
/// only if the session is taken out: one that stays here keeps them (and its records
/// followed), so that it can park on the record layer later.
pub async fn hand_off(
    mut stream: RustlsStream,
    offer: Offer,
    secrets: &mut TrafficSecrets,
    info: &ConnInfo,
    ctx: &Context,
) -> Exported {
    let cfg = &ctx.config;
    let tls13 = stream.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    // Where the client's records stand in what rustls read during the handshake (and the
    // stream stops following them, whatever happens next).
    let read = stream.get_mut().0.take_records();
    let usable = ctx.tls.cluster_ring().is_some()
        && (!tls13 || secrets.client.is_some() && secrets.server.is_some());
    let offered = Offered {
        me: cfg.agent_id,
        home: offer.home,
        binding: offer.binding,
        usable,
        read,
        boundary: stream.get_ref().0.record_boundary(),
    };
    let driver = ExportDriver::handshake(
        offered,
        MAX_CARRIED_PLAINTEXT,
        cfg.migration_timeouts,
        tokio_now(),
    );
    let side = Pump {
        driver,
        tls: Tls::Engine(Engine::Rustls(Box::new(stream))),
        plain: Vec::new(),
        started: Instant::now(),
        why: Why::Handshake,
        cpu: Duration::ZERO,
        open_since: None,
    };
    side.run(secrets, info, ctx).await
}

/// Asks the dispatcher to move a connection this agent is idle on (between two HTTP/1.1
/// requests) because the agent drains: Leave, then, if the dispatcher names an agent (its
/// Offer is the cut), the same export and two-phase verdict as after a handshake. `Keep`
/// (with any request bytes that came meanwhile) when it stays or cannot move: the caller then
/// ends it as a drain does. Only for a link stream whose client records were followed from
/// the first byte.
pub(crate) async fn leave(
    mut stream: Engine,
    mut secrets: TrafficSecrets,
    info: &ConnInfo,
    ctx: &Context,
) -> Exported {
    let cfg = &ctx.config;
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
    let (driver, leave) = ExportDriver::leave(
        usable,
        read,
        MAX_CARRIED_PLAINTEXT,
        cfg.migration_timeouts,
        tokio_now(),
    );
    if let Some(leave) = leave {
        if stream.io().write_all(&leave).await.is_err() {
            return Exported::Closed;
        }
    }
    let side = Pump {
        driver,
        tls: Tls::Engine(stream),
        plain: Vec::new(),
        started: Instant::now(),
        why: Why::Drain,
        cpu: Duration::ZERO,
        open_since: None,
    };
    side.run(&mut secrets, info, ctx).await
}

/// The TLS side of the connection: the engine, until the session is taken out of it.
enum Tls {
    Engine(Engine),
    Extracted(ConnIo<AgentIo>, Box<SessionObject>),
    Gone,
}

impl Tls {
    fn io(&mut self) -> Option<&mut ConnIo<AgentIo>> {
        match self {
            Tls::Engine(e) => Some(e.io()),
            Tls::Extracted(io, _) => Some(io),
            Tls::Gone => None,
        }
    }
}

/// One export under way: the driver and what its steps work on.
struct Pump {
    driver: ExportDriver,
    tls: Tls,
    /// The client plaintext decrypted for the move (carried with the session, or served
    /// here first if it stays).
    plain: Vec<u8>,
    started: Instant,
    why: Why,
    /// The export's thread CPU: closed sections, and the one still open since `open_since`
    /// (one section spans the decryption and the extraction when no read falls between:
    /// a `CLOCK_THREAD_CPUTIME_ID` read is a real system call here).
    cpu: Duration,
    open_since: Option<Duration>,
}

impl Pump {
    fn meter(&mut self) {
        if self.open_since.is_none() {
            self.open_since = Some(thread_cpu());
        }
    }

    fn pause_meter(&mut self) {
        if let Some(t) = self.open_since.take() {
            self.cpu += thread_cpu().saturating_sub(t);
        }
    }

    /// Does what the driver asks until the connection's fate is known.
    async fn run(
        mut self,
        secrets: &mut TrafficSecrets,
        info: &ConnInfo,
        ctx: &Context,
    ) -> Exported {
        let m = &ctx.metrics.handoff;
        // Filled by reads only (`read_buf` takes spare capacity): nothing to zero first.
        let mut buf = Vec::with_capacity(18 * 1024);
        loop {
            while let Some(step) = self.driver.poll_step() {
                match step {
                    ExportStep::Declined => m.declined(),
                    ExportStep::Failed(f) => m.failure(failure(f)),
                    // The NewSessionTickets leave rustls now; they stay held in the stream
                    // and go out with the Switch (or the Abort) in one write: one DATA frame
                    // on the link, one system call here and one read at the dispatcher
                    // (`conn::accept::serve` left them held).
                    ExportStep::FlushEngine => {
                        let Tls::Engine(Engine::Rustls(s)) = &mut self.tls else {
                            continue;
                        };
                        if s.flush().await.is_err() || s.get_ref().1.wants_write() {
                            return Exported::Closed;
                        }
                    }
                    ExportStep::Decrypt(tls) => {
                        self.meter();
                        let Tls::Engine(engine) = &mut self.tls else {
                            return Exported::Closed;
                        };
                        match engine.decrypt(&tls, &mut self.plain) {
                            Ok(n) => self.driver.decrypted(Ok(n)),
                            Err(_) => {
                                // the client's bytes do not decrypt: the engine's alert ends it
                                let _ = engine.flush().await;
                                return Exported::Closed;
                            }
                        }
                    }
                    ExportStep::Extract { home, binding } => {
                        self.meter();
                        let how = self.extract(home, &binding, secrets, info, ctx);
                        self.pause_meter();
                        m.cpu(Side::Export, self.cpu);
                        self.driver.extracted(how, tokio_now());
                    }
                    ExportStep::Keep {
                        ciphertext,
                        records,
                    } => {
                        if self.send().await.is_err() {
                            return Exported::Closed;
                        }
                        let Tls::Engine(mut engine) = std::mem::replace(&mut self.tls, Tls::Gone)
                        else {
                            return Exported::Closed;
                        };
                        if let Some(read) = records {
                            engine.io().continue_records(read);
                        }
                        if let Some(c) = ciphertext {
                            if engine.decrypt(&c, &mut self.plain).is_err() {
                                let _ = engine.flush().await;
                                return Exported::Closed;
                            }
                        }
                        return keep(engine, self.plain);
                    }
                    ExportStep::ServeHere { ciphertext } => {
                        let Tls::Extracted(io, obj) = self.tls else {
                            return Exported::Closed;
                        };
                        return serve_here(io, &obj, &ciphertext);
                    }
                    ExportStep::Migrated => {
                        m.migrated_out(self.started.elapsed(), self.why);
                        return Exported::Migrated;
                    }
                    ExportStep::Close => return Exported::Closed,
                }
            }
            if self.send().await.is_err() {
                return Exported::Closed;
            }
            // The dispatcher's answer (to Leave), or its verdict (after Switch): until then the
            // keys are not ours; a dispatcher that never answers gets the connection closed,
            // not served.
            self.pause_meter();
            let Some(deadline) = self.driver.poll_timeout() else {
                return Exported::Closed;
            };
            let Some(io) = self.tls.io() else {
                return Exported::Closed;
            };
            match read_until(io, &mut buf, deadline).await {
                Read::Data(n) => self.driver.handle(tokio_now(), &buf[..n]),
                Read::Released => self.driver.released(),
                Read::Ended => self.driver.closed(),
                Read::TimedOut => self.driver.handle_timeout(tokio_now()),
            }
        }
    }

    /// Takes the session out for `home` and seals it bound to `binding`.
    fn extract(
        &mut self,
        home: u16,
        binding: &[u8],
        secrets: &mut TrafficSecrets,
        info: &ConnInfo,
        ctx: &Context,
    ) -> Extraction {
        let extras_secrets = std::mem::take(secrets);
        let Tls::Engine(engine) = &mut self.tls else {
            return Extraction::Failed;
        };
        if !engine.extractable() {
            return Extraction::NotExtractable;
        }
        let Tls::Engine(engine) = std::mem::replace(&mut self.tls, Tls::Gone) else {
            return Extraction::Failed;
        };
        let tls13 = engine.is_tls13();
        let extras = Extras {
            home,
            secrets: extras_secrets,
            app: info.application(),
            plaintext: std::mem::take(&mut self.plain),
        };
        let Ok((io, obj)) = engine.extract(extras) else {
            return Extraction::Failed;
        };
        // Without the traffic secrets its keys came from, a TLS 1.3 session's next KeyUpdate
        // would break it at the home agent (a client that updated its keys earlier, while the
        // secrets kept were those of the handshake).
        let keyless = tls13 && (obj.tx.secret.is_none() || obj.rx.secret.is_none());
        let sealed = ctx.tls.cluster_ring().and_then(|r| {
            let ring = r.read().unwrap_or_else(|p| p.into_inner());
            obj.seal(&ring, ctx.config.agent_id, binding)
        });
        self.tls = Tls::Extracted(io, Box::new(obj));
        Extraction::Extracted { sealed, keyless }
    }

    /// Writes the driver's frames, each after what the handshake left held (see
    /// `conn::accept::serve`), and stops holding writes.
    async fn send(&mut self) -> std::io::Result<()> {
        while let Some(frame) = self.driver.poll_transmit() {
            let Some(io) = self.tls.io() else {
                return Err(std::io::ErrorKind::NotConnected.into());
            };
            io.write_all(&frame).await?;
            io.stop_coalescing();
            io.flush().await?;
        }
        Ok(())
    }
}

fn failure(f: ExportFailure) -> HandoffFailure {
    match f {
        ExportFailure::NoSecrets => HandoffFailure::NoSecrets,
        ExportFailure::TooMuchPlaintext => HandoffFailure::TooMuchPlaintext,
        ExportFailure::Export => HandoffFailure::Export,
        ExportFailure::FellBack => HandoffFailure::FellBack,
        ExportFailure::Protocol => HandoffFailure::Protocol,
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

fn tokio_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// What one read from the dispatcher brought.
enum Read {
    Data(usize),
    /// The stream was released (after Switch: Done).
    Released,
    /// EOF or an error.
    Ended,
    TimedOut,
}

/// One read from the dispatcher before `deadline`. The dispatcher tells Done by releasing the
/// link stream (one reset frame, no answer owed).
async fn read_until(io: &mut ConnIo<AgentIo>, buf: &mut Vec<u8>, deadline: Instant) -> Read {
    buf.clear();
    match tokio::time::timeout_at(deadline.into(), io.read_buf(buf)).await {
        Ok(Ok(n)) if n > 0 => Read::Data(n),
        Ok(Err(e)) if baton_link::is_release(&e) => Read::Released,
        Ok(_) => Read::Ended,
        Err(_) => Read::TimedOut,
    }
}

/// Serves an extracted session here after all, from the record layer (built only now: most
/// sessions move, and their keys are needed only at the home agent). `ciphertext` came with
/// the dispatcher's Resume.
fn serve_here(io: ConnIo<AgentIo>, obj: &SessionObject, ciphertext: &[u8]) -> Exported {
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
