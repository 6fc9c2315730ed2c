//! Entry points for the cargo-fuzz target in `fuzz/` (one line calling [`record`]) and the
//! deterministic connection pairs the property tests and the fuzzer share, so the fuzzed
//! invariants are built and type-checked with the crate. Unlike the rest of the crate these
//! functions panic on purpose: a panic is a finding.

use zeroize::Zeroizing;

use crate::key_schedule::TrafficSecret;
use crate::keys::{DirectionSecrets, SessionKeys};
use crate::layer::{RecordLayer, MAX_PENDING_TLS, PLAINTEXT_LIMIT};
use crate::message::ContentType;
use crate::protocol::Role;
use crate::sealer::Sealer;
use crate::suite::{Suite, Version};
use crate::INPUT_LIMIT;

/// All six version and suite combinations.
pub const ALL: [(Version, Suite); 6] = [
    (Version::Tls12, Suite::Aes128Gcm),
    (Version::Tls12, Suite::Aes256Gcm),
    (Version::Tls12, Suite::Chacha20Poly1305),
    (Version::Tls13, Suite::Aes128Gcm),
    (Version::Tls13, Suite::Aes256Gcm),
    (Version::Tls13, Suite::Chacha20Poly1305),
];

/// One direction's secrets derived from a fixed seed (TLS 1.3: from a traffic secret, so
/// KeyUpdate works; TLS 1.2: key and IV directly).
pub fn direction(version: Version, suite: Suite, seed: u8, seq: u64) -> DirectionSecrets {
    match version {
        Version::Tls12 => DirectionSecrets {
            seq,
            key: Zeroizing::new(vec![seed; suite.key_len()]),
            iv: [seed ^ 0x5a; 12],
            traffic_secret: None,
        },
        Version::Tls13 => {
            let secret = vec![seed; suite.hash_len()];
            let keys = TrafficSecret::new(suite, &secret)
                .and_then(|s| s.keys())
                .expect("fixed-length secret");
            DirectionSecrets {
                seq,
                key: keys.key,
                iv: *keys.iv,
                traffic_secret: Some(Zeroizing::new(secret)),
            }
        }
    }
}

/// A connected (server, client) pair with deterministic keys, as after a handshake (server
/// sequence numbers 2 and 1, like rustls after its tickets and Finished).
pub fn pair(version: Version, suite: Suite) -> (RecordLayer, RecordLayer) {
    let s2c = |seq| direction(version, suite, 0x11, seq);
    let c2s = |seq| direction(version, suite, 0x22, seq);
    let server = RecordLayer::new(SessionKeys {
        version,
        suite,
        tx: s2c(2),
        rx: c2s(1),
    })
    .expect("valid keys");
    let client = RecordLayer::with_role(
        SessionKeys {
            version,
            suite,
            tx: c2s(1),
            rx: s2c(2),
        },
        Role::Client,
    )
    .expect("valid keys");
    (server, client)
}

/// Checks the buffer bounds every public state must respect.
pub fn check_bounds(layer: &RecordLayer) {
    assert!(layer.buffered_tls() <= INPUT_LIMIT, "input over its bound");
    assert!(
        layer.plaintext().len() <= PLAINTEXT_LIMIT,
        "plaintext over its bound"
    );
    assert!(
        layer.pending_tls().len() <= MAX_PENDING_TLS,
        "outgoing over its bound"
    );
}

/// Feeds `data` to `layer` in pieces of `chunk` bytes, processing and draining as an agent
/// would, checking bounds after every step. Returns the plaintext received and whether
/// processing failed. Panics if the layer stops taking input without failing.
pub fn feed(layer: &mut RecordLayer, data: &[u8], chunk: usize) -> (Vec<u8>, bool) {
    let mut plaintext = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        let mut piece = piece;
        let mut stuck = 0;
        while !piece.is_empty() {
            let n = layer.read_tls(piece);
            piece = &piece[n..];
            check_bounds(layer);
            let failed = layer.process().is_err();
            check_bounds(layer);
            plaintext.extend_from_slice(layer.plaintext());
            layer.consume_plaintext(usize::MAX);
            let pending = layer.pending_tls().len();
            layer.consume_tls(pending);
            if failed {
                return (plaintext, true);
            }
            stuck = if n == 0 { stuck + 1 } else { 0 };
            assert!(
                stuck < 3,
                "read_tls takes nothing although everything was drained"
            );
        }
    }
    (plaintext, false)
}

/// The fuzz target: the first byte picks version, suite and chunking; the rest is fed
/// 1. as the peer's ciphertext, to both ends (it must never panic or break a bound);
/// 2. as a script of records (type, length, body) that a peer with the right keys seals, so
///    that alerts, handshake fragments and KeyUpdates reach the protocol logic behind the
///    AEAD (again: no panic, bounds kept);
/// 3. as plaintext through a real peer, which must come out unchanged whatever the chunking.
pub fn record(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (version, suite) = ALL[usize::from(selector % 6)];
    let chunk = 1 + usize::from(selector / 6) * 131;

    // 1. arbitrary bytes as ciphertext, on both sides
    let (mut server, mut client) = pair(version, suite);
    feed(&mut server, rest, chunk);
    feed(&mut client, rest, chunk);

    // 2. the bytes as a script of authenticated records
    let (mut server, _) = pair(version, suite);
    feed(&mut server, &sealed_script(version, suite, rest), chunk);

    // 3. the bytes as plaintext, through a real peer, possibly with KeyUpdates between
    let (mut server, mut client) = pair(version, suite);
    let mut wire = Vec::new();
    for (i, part) in rest.chunks(4096).enumerate() {
        let mut part = part;
        while !part.is_empty() {
            let n = client.write_plaintext(part).expect("client may send");
            part = &part[n..];
            wire.extend_from_slice(client.pending_tls());
            let sent = client.pending_tls().len();
            client.consume_tls(sent);
        }
        if version == Version::Tls13 && i % 3 == 1 {
            client.send_key_update(false).expect("TLS 1.3 with secrets");
        }
    }
    client.send_close_notify();
    wire.extend_from_slice(client.pending_tls());
    let (plaintext, failed) = feed(&mut server, &wire, chunk);
    assert!(!failed, "{:?}", server.error());
    assert_eq!(plaintext, rest);
    assert!(server.peer_closed());
}

/// Reads `script` as records (content type byte, length byte, that many body bytes) and seals
/// each as the client of [`pair`] would, at consecutive sequence numbers under its first key
/// (so a KeyUpdate in the script makes the following records fail to decrypt, as they should).
pub fn sealed_script(version: Version, suite: Suite, script: &[u8]) -> Vec<u8> {
    let secrets = direction(version, suite, 0x22, 1);
    let sealer = Sealer::new(version, suite, &secrets.key, &secrets.iv, 1).expect("valid keys");
    let mut wire = Vec::new();
    let mut rest = script;
    let mut seq = 1;
    while let [typ, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let _ = sealer.seal_with_seq(seq, ContentType(*typ), &tail[..len], &mut wire);
        seq += 1;
        rest = &tail[len..];
    }
    wire
}
