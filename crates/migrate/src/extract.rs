//! The handshake agent's TLS work in a migration, without I/O: decrypting the client's records
//! up to the cut, and turning a finished rustls connection into a session object. The shell
//! (`export.rs`) and the in-memory harness drive the same functions.
//!
//! rustls' buffered connection drops, on extraction, ciphertext it has not decrypted and
//! plaintext nobody read (`shared/MIGRATION-NOTES.md`). Nothing is lost by it: [`decrypt`]
//! reads out all the plaintext of every whole record rustls holds, the cut is the end of the
//! last of them, and the part of a record rustls read past it (dropped, its sequence number
//! unused) reaches whoever serves on from the dispatcher's copy.

use std::io::{Read as _, Write as _};
use std::time::SystemTime;

use baton_session::migration::{DirectionState, SessionObject, DEFAULT_TTL};
use rustls::{ConnectionTrafficSecrets, ProtocolVersion, ServerConnection};
use zeroize::Zeroizing;

use crate::secrets::TrafficSecrets;

/// Gives rustls whole client records and appends all the plaintext it then holds to `plain`;
/// returns how many bytes it appended.
pub fn decrypt(
    conn: &mut ServerConnection,
    mut tls: &[u8],
    plain: &mut Vec<u8>,
) -> Result<usize, rustls::Error> {
    let before = plain.len();
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
            return Ok(plain.len() - before);
        }
    }
}

/// rustls refused to extract, or gave a suite the record layer lacks; the connection is
/// consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractFailed;

/// What the home agent needs besides the keys.
pub struct Extras<'a> {
    pub home: u16,
    pub secrets: TrafficSecrets,
    pub app: Application<'a>,
    pub plaintext: Vec<u8>,
}

/// What the application was told about the connection, told again to the home agent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Application<'a> {
    pub resumed: bool,
    pub alpn: Option<&'a str>,
    pub sni: Option<&'a str>,
    pub client_subject: Option<&'a str>,
}

/// Whether rustls is in a state to be extracted without losing anything.
pub fn extractable(conn: &mut ServerConnection) -> bool {
    // A client's KeyUpdate(update_requested) leaves rustls' answer sealed but queued until its
    // next write, outside `wants_write`; the extracted sending key is already the next one, so
    // the answer would be lost and the client could decrypt nothing after the move. An empty
    // write moves the answer into the outgoing buffer, and the connection stays here.
    let _ = conn.writer().write(&[]);
    let peer_closed = conn
        .process_new_packets()
        .map(|s| s.peer_has_closed())
        .unwrap_or(true);
    !conn.wants_write() && !peer_closed
}

/// Extracts the session from a connection whose handshake is done and whose client records
/// have all been decrypted (check [`extractable`] first).
pub fn extract(
    conn: ServerConnection,
    mut extras: Extras<'_>,
) -> Result<SessionObject, ExtractFailed> {
    let keys = keys_of(conn, std::mem::take(&mut extras.secrets))?;
    Ok(object(keys.version, keys.suite, keys.tx, keys.rx, extras))
}

/// What a move ([`extract`]) and a park ([`into_layer`]) both take from a rustls connection.
struct Keys {
    /// IANA version and suite, one the record layer has.
    version: u16,
    suite: u16,
    tx: DirectionState,
    rx: DirectionState,
}

/// Each direction's key, IV and next sequence number from rustls, with the key log's traffic
/// secret (TLS 1.3; none if it was not captured). Consumes the connection.
///
/// The secret is generation 0; the key may be a later one (KeyUpdates of the client, and the
/// answers rustls sent). Which one is not worked out here: the record layer that carries the
/// session on follows the secret to the key's generation at that direction's first KeyUpdate,
/// and fails the update if none within reach derives the key
/// (`baton_record::key_schedule::TrafficSecret::followed_to`). Matching on every migration
/// would cost one HKDF expansion per direction that most connections never need.
fn keys_of(conn: ServerConnection, secrets: TrafficSecrets) -> Result<Keys, ExtractFailed> {
    let tls13 = conn.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    let version = if tls13 { 0x0304 } else { 0x0303 };
    let suite = conn
        .negotiated_cipher_suite()
        .map(|s| u16::from(s.suite()))
        .unwrap_or(0);
    crate::suite::record_suite(version, suite).ok_or(ExtractFailed)?;
    let extracted = conn
        .dangerous_extract_secrets()
        .map_err(|_| ExtractFailed)?;
    let (Some(tx), Some(rx)) = (
        key_iv(extracted.tx.1, extracted.tx.0),
        key_iv(extracted.rx.1, extracted.rx.0),
    ) else {
        return Err(ExtractFailed);
    };
    // TLS 1.2 has no traffic secret to carry (and the layer refuses one there).
    let secret = |s: Option<Zeroizing<Vec<u8>>>| s.filter(|_| tls13);
    let direction = |(seq, key, iv): KeyIv, secret| DirectionState {
        secret,
        seq,
        key,
        iv,
    };
    Ok(Keys {
        version,
        suite,
        tx: direction(tx, secret(secrets.server)),
        rx: direction(rx, secret(secrets.client)),
    })
}

type KeyIv = (u64, Zeroizing<Vec<u8>>, [u8; 12]);

/// Key and IV of one direction, with its next sequence number.
fn key_iv(s: ConnectionTrafficSecrets, seq: u64) -> Option<KeyIv> {
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

/// Whether a rustls connection can go on from the record layer here ([`into_layer`]): its
/// suite is one the layer has and, in TLS 1.3, both traffic secrets were captured (a KeyUpdate
/// needs them). Nothing about its buffers: see [`extractable`].
pub fn layer_can_carry(conn: &ServerConnection, secrets: &TrafficSecrets) -> bool {
    let tls13 = conn.protocol_version() == Some(ProtocolVersion::TLSv1_3);
    let version = if tls13 { 0x0304 } else { 0x0303 };
    let suite = conn
        .negotiated_cipher_suite()
        .map(|s| u16::from(s.suite()))
        .unwrap_or(0);
    crate::suite::record_suite(version, suite).is_some()
        && (!tls13 || secrets.client.is_some() && secrets.server.is_some())
}

/// The record layer that carries a rustls connection on in this agent (an idle connection
/// parks on it: `crate::park`), with the negotiated IANA version and suite; rustls and its
/// buffers are dropped. Check [`layer_can_carry`] and [`extractable`] first, and that rustls
/// holds no ciphertext it has not decrypted (extraction drops it). The connection is consumed
/// either way.
pub fn into_layer(
    conn: ServerConnection,
    secrets: &TrafficSecrets,
) -> Result<(baton_record::RecordLayer, (u16, u16)), ExtractFailed> {
    let Keys {
        version,
        suite,
        tx,
        rx,
    } = keys_of(conn, secrets.clone())?;
    let (v, s) = crate::suite::record_suite(version, suite).ok_or(ExtractFailed)?;
    // TLS 1.3 goes on only with both traffic secrets: a KeyUpdate needs them
    let tls13 = version == 0x0304;
    let direction = |d: DirectionState| {
        let traffic_secret = match tls13 {
            true => Some(d.secret.ok_or(ExtractFailed)?),
            false => None,
        };
        Ok(baton_record::DirectionSecrets {
            seq: d.seq,
            key: d.key,
            iv: d.iv,
            traffic_secret,
        })
    };
    let keys = baton_record::SessionKeys {
        version: v,
        suite: s,
        tx: direction(tx)?,
        rx: direction(rx)?,
    };
    let layer = baton_record::RecordLayer::new(keys).map_err(|_| ExtractFailed)?;
    Ok((layer, (version, suite)))
}

/// The session object of a connection served from the record layer (one that moved here
/// before), from the layer's keys at rest (`RecordLayer::export`): its own traffic secrets,
/// current after any KeyUpdate. `negotiated` is the IANA version and suite it came with.
pub fn from_layer(
    keys: &baton_record::SessionKeys,
    negotiated: (u16, u16),
    extras: Extras<'_>,
) -> Result<SessionObject, ExtractFailed> {
    let (version, suite) = negotiated;
    crate::suite::record_suite(version, suite).ok_or(ExtractFailed)?;
    let direction = |d: &baton_record::DirectionSecrets| DirectionState {
        secret: d.traffic_secret.clone(),
        seq: d.seq,
        key: d.key.clone(),
        iv: d.iv,
    };
    Ok(object(
        version,
        suite,
        direction(&keys.tx),
        direction(&keys.rx),
        extras,
    ))
}

fn object(
    version: u16,
    suite: u16,
    tx: DirectionState,
    rx: DirectionState,
    extras: Extras<'_>,
) -> SessionObject {
    let app = extras.app;
    SessionObject {
        id: SessionObject::new_id(),
        home: extras.home,
        expires_ms: SessionObject::expiry(SystemTime::now(), DEFAULT_TTL),
        version,
        suite,
        tx,
        rx,
        resumed: app.resumed,
        alpn: app.alpn.map(|a| a.as_bytes().to_vec()),
        sni: app.sni.map(str::to_owned),
        client_subject: app.client_subject.map(str::to_owned),
        plaintext: Zeroizing::new(extras.plaintext),
    }
}
