//! The handshake agent's side of a migration (`baton_wire::handoff` has the whole exchange).
//!
//! rustls' buffered connection drops, on extraction, ciphertext it has not decrypted and
//! plaintext nobody read (`shared/MIGRATION-NOTES.md`). Neither can happen here: after Freeze
//! the dispatcher sends client bytes only up to a record boundary and then Frozen, and this
//! side feeds rustls exactly those whole records and reads out all their plaintext before it
//! extracts. The plaintext travels in the session object; nothing is left behind in rustls.

use std::io::Read as _;
use std::time::{Instant, SystemTime};

use baton_session::migration::{DirectionState, SessionObject, DEFAULT_TTL, MAX_CARRIED_PLAINTEXT};
use baton_wire::handoff::{Frame, Splitter};
use rustls::{ConnectionTrafficSecrets, ProtocolVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout_at;
use zeroize::Zeroizing;

use super::metrics::{HandoffFailure, Side};
use super::secrets::{Expected, TrafficSecrets};
use super::stream::MigratedStream;
use crate::conn::Tls;
use crate::http::ConnInfo;
use crate::io::ConnIo;
use crate::server::Shared;
use baton_ops::process::thread_cpu;

/// How a handoff attempt left the connection.
pub enum Exported {
    /// The home agent has it; this agent is done.
    Migrated,
    /// Extracted, but the home agent did not take it: served here from the record layer.
    ServeHere(Box<MigratedStream<ConnIo<TcpStream>>>),
    /// Not extracted: carry on with rustls. The plaintext is what was already read from it.
    Keep(Box<Tls>, Vec<u8>),
    /// Lost: the client or the dispatcher went away, or broke the protocol.
    Closed,
}

/// Runs the handshake agent's side for a connection the dispatcher offered to hand to agent
/// `home`, right after the handshake (before any application data was read).
pub async fn hand_off(
    mut stream: Tls,
    home: u16,
    expected: Option<Expected>,
    info: &ConnInfo,
    shared: &Shared,
) -> Exported {
    let cfg = &shared.config;
    let m = &shared.metrics.handoff;
    let tls13 = stream.get_ref().1.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    let secrets = expected.map(|e| e.take()).unwrap_or_default();
    let ring = shared.tls.cluster_ring();
    let usable = ring.is_some() && (!tls13 || secrets.client.is_some() && secrets.server.is_some());
    if home == cfg.agent_id || !usable {
        if home == cfg.agent_id {
            m.declined();
        } else {
            m.failure(HandoffFailure::NoSecrets);
        }
        let (io, _) = stream.get_mut();
        return match io.write_all(&Frame::Decline.to_bytes()).await {
            Ok(()) => Exported::Keep(Box::new(stream), Vec::new()),
            Err(_) => Exported::Closed,
        };
    }
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + cfg.handoff_timeout;
    // The NewSessionTickets must be on the wire before the freeze: extraction refuses queued
    // records, and the tx sequence must count them.
    if stream.flush().await.is_err() || stream.get_ref().1.wants_write() {
        return Exported::Closed;
    }
    if stream
        .get_mut()
        .0
        .write_all(&Frame::Freeze.to_bytes())
        .await
        .is_err()
    {
        return Exported::Closed;
    }

    // Decrypt every client record up to Frozen.
    let mut splitter = Splitter::new();
    let mut plain = Vec::new();
    let mut cpu = std::time::Duration::ZERO;
    let mut buf = vec![0u8; 18 * 1024];
    'frozen: loop {
        let n = match timeout_at(deadline, stream.get_mut().0.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            Ok(_) => return Exported::Closed,
            Err(_) => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        };
        let mut data = &buf[..n];
        while !data.is_empty() {
            let Ok(split) = splitter.split(data) else {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            };
            data = &data[split.consumed..];
            let t = thread_cpu();
            let fed = feed(stream.get_mut().1, &split.tls, &mut plain);
            cpu += thread_cpu().saturating_sub(t);
            if fed.is_err() {
                // the client's bytes do not decrypt: rustls' alert ends it
                let _ = stream.flush().await;
                return Exported::Closed;
            }
            match split.frame {
                None => {}
                Some(Frame::Frozen) if data.is_empty() => break 'frozen,
                Some(_) => {
                    m.failure(HandoffFailure::Protocol);
                    return Exported::Closed;
                }
            }
        }
    }

    let t = thread_cpu();
    let conn = stream.get_mut().1;
    let peer_closed = conn
        .process_new_packets()
        .map(|s| s.peer_has_closed())
        .unwrap_or(true);
    if plain.len() > MAX_CARRIED_PLAINTEXT || conn.wants_write() || peer_closed {
        m.failure(HandoffFailure::TooMuchPlaintext);
        return abort_keep(stream, plain).await;
    }
    let suite = conn
        .negotiated_cipher_suite()
        .map(|s| u16::from(s.suite()))
        .unwrap_or(0);
    let (io, conn) = stream.into_inner();
    let Ok(extracted) = conn.dangerous_extract_secrets() else {
        m.failure(HandoffFailure::Export);
        return Exported::Closed;
    };
    let (Some(tx), Some(rx)) = (
        key_iv(extracted.tx.1, extracted.tx.0),
        key_iv(extracted.rx.1, extracted.rx.0),
    ) else {
        m.failure(HandoffFailure::Export);
        return Exported::Closed;
    };
    let obj = session_object(
        home,
        if tls13 { 0x0304 } else { 0x0303 },
        suite,
        (tx, rx),
        secrets,
        info,
        plain,
    );
    let mut io = io;
    let sealed = ring
        .and_then(|r| obj.seal(&r.read().unwrap_or_else(|p| p.into_inner()), cfg.agent_id))
        .filter(|s| Frame::fits(s.len()));
    m.cpu(Side::Export, cpu + thread_cpu().saturating_sub(t));
    let Some(sealed) = sealed else {
        m.failure(HandoffFailure::Export);
        if io.write_all(&Frame::Abort.to_bytes()).await.is_err() {
            return Exported::Closed;
        }
        return serve_here(io, &obj, &[]);
    };
    if io
        .write_all(&Frame::Switch(sealed).to_bytes())
        .await
        .is_err()
    {
        return Exported::Closed;
    }

    // The verdict: Done, or Resume followed by the client's held bytes.
    let deadline = tokio::time::Instant::now() + cfg.handoff_timeout * 2;
    let mut splitter = Splitter::new();
    loop {
        let n = match timeout_at(deadline, io.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        };
        let Ok(split) = splitter.split(&buf[..n]) else {
            m.failure(HandoffFailure::Protocol);
            return Exported::Closed;
        };
        match split.frame {
            None if split.tls.is_empty() => continue,
            Some(Frame::Done) if split.tls.is_empty() => {
                m.migrated_out(started.elapsed());
                return Exported::Migrated;
            }
            Some(Frame::Resume) if split.tls.is_empty() => {
                m.failure(HandoffFailure::FellBack);
                return serve_here(io, &obj, &buf[split.consumed..n]);
            }
            _ => {
                m.failure(HandoffFailure::Protocol);
                return Exported::Closed;
            }
        }
    }
}

/// Serves an extracted session here after all, from the record layer (built only now: most
/// sessions move, and their keys are needed only at the home agent). `ciphertext` came with
/// the dispatcher's Resume.
fn serve_here(io: ConnIo<TcpStream>, obj: &SessionObject, ciphertext: &[u8]) -> Exported {
    match super::record_layer(obj) {
        Some(layer) => {
            let mut s = MigratedStream::new(io, layer, obj.plaintext.clone());
            s.prefill_ciphertext(ciphertext);
            Exported::ServeHere(Box::new(s))
        }
        None => Exported::Closed,
    }
}

/// Abort before extraction: the dispatcher gives the held client bytes back and this agent
/// carries on with rustls.
async fn abort_keep(mut stream: Tls, plain: Vec<u8>) -> Exported {
    match stream.get_mut().0.write_all(&Frame::Abort.to_bytes()).await {
        Ok(()) => Exported::Keep(Box::new(stream), plain),
        Err(_) => Exported::Closed,
    }
}

/// Gives rustls whole client records and takes out all the plaintext it holds.
fn feed(
    conn: &mut rustls::ServerConnection,
    mut tls: &[u8],
    plain: &mut Vec<u8>,
) -> Result<(), rustls::Error> {
    let mut chunk = [0u8; 4096];
    // At least once: records read during the handshake (a TLS 1.3 client's first request
    // rides with its Finished) may already be decrypted inside rustls, with nothing new to
    // feed; extraction would drop that plaintext.
    loop {
        if !tls.is_empty() && conn.read_tls(&mut tls).is_err() {
            return Err(rustls::Error::General("read_tls".into()));
        }
        conn.process_new_packets()?;
        loop {
            match conn.reader().read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => plain.extend_from_slice(&chunk[..n]),
            }
        }
        if tls.is_empty() {
            return Ok(());
        }
    }
}

/// Key and IV of one direction, with its next sequence number.
fn key_iv(s: ConnectionTrafficSecrets, seq: u64) -> Option<(u64, Zeroizing<Vec<u8>>, [u8; 12])> {
    let (key, iv) = match &s {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
        _ => return None,
    };
    Some((
        seq,
        Zeroizing::new(key.as_ref().to_vec()),
        iv.as_ref().try_into().ok()?,
    ))
}

type KeyIv = (u64, Zeroizing<Vec<u8>>, [u8; 12]);

fn session_object(
    home: u16,
    version: u16,
    suite: u16,
    (tx, rx): (KeyIv, KeyIv),
    secrets: TrafficSecrets,
    info: &ConnInfo,
    plain: Vec<u8>,
) -> SessionObject {
    // A secret is kept only if it is the one the extracted key came from: a client that sent a
    // KeyUpdate before the freeze has moved on, and a stale secret would derive wrong keys.
    let checked = |secret: Option<Zeroizing<Vec<u8>>>, key: &[u8], iv: &[u8; 12]| {
        let (_, s) = super::record_suite(version, suite)?;
        let secret = secret?;
        let derived = baton_record::key_schedule::TrafficSecret::new(s, &secret)
            .ok()?
            .keys()
            .ok()?;
        (derived.key[..] == key[..] && derived.iv[..] == iv[..]).then_some(secret)
    };
    SessionObject {
        id: SessionObject::new_id(),
        home,
        expires_ms: SessionObject::expiry(SystemTime::now(), DEFAULT_TTL),
        version,
        suite,
        tx: DirectionState {
            secret: checked(secrets.server, &tx.1, &tx.2),
            seq: tx.0,
            key: tx.1,
            iv: tx.2,
        },
        rx: DirectionState {
            secret: checked(secrets.client, &rx.1, &rx.2),
            seq: rx.0,
            key: rx.1,
            iv: rx.2,
        },
        resumed: info.resumed,
        alpn: info.alpn.as_ref().map(|a| a.as_bytes().to_vec()),
        sni: info.sni.clone(),
        client_subject: info.client_subject.clone(),
        plaintext: Zeroizing::new(plain),
    }
}
