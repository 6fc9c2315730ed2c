//! The record layer against a real rustls 0.23 client, for every version and suite: after a
//! full in-memory handshake the server's session is migrated into a [`RecordLayer`], which
//! must read the client's exact bytes and write bytes the client accepts, across record
//! boundaries, KeyUpdates in both directions, and close_notify both ways.

mod common;

use baton_record::fuzzing::ALL;
use baton_record::{RecordLayer, Suite, Version};
use common::{client_input, client_output, client_send, handshake, Chunks};

/// Feeds the wire bytes into the layer in chunks of arbitrary sizes, processing and draining
/// as the agent would; returns the plaintext.
fn layer_input(layer: &mut RecordLayer, wire: &[u8], chunks: &mut Chunks) -> Vec<u8> {
    let mut plaintext = Vec::new();
    let mut rest = wire;
    while !rest.is_empty() {
        let piece = &rest[..chunks.next(40_000).min(rest.len())];
        let n = layer.read_tls(piece);
        rest = &rest[n..];
        layer.process().unwrap();
        plaintext.extend_from_slice(layer.plaintext());
        layer.consume_plaintext(usize::MAX);
    }
    plaintext
}

/// Writes all of `data` through the layer and returns the ciphertext.
fn layer_send(layer: &mut RecordLayer, data: &[u8]) -> Vec<u8> {
    let mut wire = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = layer.write_plaintext(rest).unwrap();
        rest = &rest[n..];
        wire.extend_from_slice(layer.pending_tls());
        layer.consume_tls(usize::MAX);
    }
    wire
}

fn take_pending(layer: &mut RecordLayer) -> Vec<u8> {
    let out = layer.pending_tls().to_vec();
    layer.consume_tls(out.len());
    out
}

fn big(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn migrated_session_talks_to_rustls_every_suite() {
    for (version, suite) in ALL {
        let mut m = handshake(version, suite);
        let mut layer = RecordLayer::new(m.keys.clone()).unwrap();
        let mut chunks = Chunks::new(0x5eed ^ suite as u64);

        // the sequence numbers rustls left us (MIGRATION-NOTES: tx 1 after tickets in 1.3 =
        // two tickets here, rx 0; TLS 1.2: 1 and 1)
        assert_eq!(layer.tx_seq(), m.keys.tx.seq);
        assert_eq!(layer.rx_seq(), m.keys.rx.seq);

        // client -> layer, the exact bytes
        let wire = client_send(&mut m.client, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(
            layer_input(&mut layer, &wire, &mut chunks),
            b"GET / HTTP/1.1\r\n\r\n"
        );

        // layer -> client
        let wire = layer_send(&mut layer, b"HTTP/1.1 200 OK\r\n\r\n");
        let (got, closed) = client_input(&mut m.client, &wire);
        assert_eq!(got, b"HTTP/1.1 200 OK\r\n\r\n");
        assert!(!closed);

        // 1 MiB each way, across 16 KiB records, fed at arbitrary split points
        let up = big(1 << 20, 1);
        let wire = client_send(&mut m.client, &up);
        assert_eq!(
            layer_input(&mut layer, &wire, &mut chunks),
            up,
            "{version:?} {suite:?}"
        );
        let down = big(1 << 20, 2);
        let wire = layer_send(&mut layer, &down);
        let mut got = Vec::new();
        let mut rest = &wire[..];
        while !rest.is_empty() {
            let n = chunks.next(50_000).min(rest.len());
            got.extend(client_input(&mut m.client, &rest[..n]).0);
            rest = &rest[n..];
        }
        assert_eq!(got, down, "{version:?} {suite:?}");

        // close_notify both ways
        m.client.send_close_notify();
        let wire = client_output(&mut m.client);
        assert!(layer_input(&mut layer, &wire, &mut chunks).is_empty());
        assert!(layer.peer_closed());
        let wire = layer_send(&mut layer, b"bye");
        layer.send_close_notify();
        let mut wire = wire;
        wire.extend(take_pending(&mut layer));
        let (got, closed) = client_input(&mut m.client, &wire);
        assert_eq!(got, b"bye");
        assert!(closed, "{version:?} {suite:?}: client saw close_notify");
    }
}

#[test]
fn client_key_update_is_followed_and_answered() {
    for suite in [Suite::Aes128Gcm, Suite::Aes256Gcm, Suite::Chacha20Poly1305] {
        let mut m = handshake(Version::Tls13, suite);
        let mut layer = RecordLayer::new(m.keys.clone()).unwrap();
        let mut chunks = Chunks::new(77);

        // rustls sends KeyUpdate(update_requested) with its next write
        m.client.refresh_traffic_keys().unwrap();
        let wire = client_send(&mut m.client, b"under the new key");
        assert_eq!(
            layer_input(&mut layer, &wire, &mut chunks),
            b"under the new key"
        );
        assert_eq!(layer.rx_seq(), 1, "new receive generation");
        assert_eq!(layer.tx_seq(), 0, "answered, then switched");

        // our answer, then data under our new key: the client follows both
        let mut wire = take_pending(&mut layer);
        wire.extend(layer_send(&mut layer, b"reply"));
        let (got, _) = client_input(&mut m.client, &wire);
        assert_eq!(got, b"reply");

        // and keeps talking
        let wire = client_send(&mut m.client, b"more");
        assert_eq!(layer_input(&mut layer, &wire, &mut chunks), b"more");
        assert!(!layer.wants_write(), "one answer per request, no more");
    }
}

#[test]
fn our_key_update_is_answered_by_rustls() {
    for suite in [Suite::Aes128Gcm, Suite::Aes256Gcm, Suite::Chacha20Poly1305] {
        let mut m = handshake(Version::Tls13, suite);
        let mut layer = RecordLayer::new(m.keys.clone()).unwrap();
        let mut chunks = Chunks::new(99);

        layer.send_key_update(true).unwrap();
        let mut wire = take_pending(&mut layer);
        wire.extend(layer_send(&mut layer, b"after our update"));
        let (got, _) = client_input(&mut m.client, &wire);
        assert_eq!(got, b"after our update");

        // rustls answers with KeyUpdate(update_not_requested) before its next data
        let wire = client_send(&mut m.client, b"client under its new key");
        assert_eq!(
            layer_input(&mut layer, &wire, &mut chunks),
            b"client under its new key"
        );
        assert_eq!(layer.rx_seq(), 1);

        // several updates in a row, both ways, then 100 KiB
        for _ in 0..3 {
            layer.send_key_update(false).unwrap();
            m.client.refresh_traffic_keys().unwrap();
        }
        let down = big(100 * 1024, 3);
        let mut wire = take_pending(&mut layer);
        wire.extend(layer_send(&mut layer, &down));
        assert_eq!(client_input(&mut m.client, &wire).0, down);
        let up = big(100 * 1024, 4);
        let wire = client_send(&mut m.client, &up);
        assert_eq!(layer_input(&mut layer, &wire, &mut chunks), up);
        let (got, _) = client_input(&mut m.client, &take_pending(&mut layer));
        assert!(got.is_empty());
    }
}

#[test]
fn tampered_record_gets_a_bad_record_mac_alert_rustls_understands() {
    let mut m = handshake(Version::Tls12, Suite::Aes128Gcm);
    let mut layer = RecordLayer::new(m.keys.clone()).unwrap();
    let mut wire = client_send(&mut m.client, b"x");
    let last = wire.len() - 1;
    wire[last] ^= 1;
    layer.read_tls(&wire);
    assert_eq!(layer.process(), Err(baton_record::Error::DecryptFailed));
    let alert = take_pending(&mut layer);
    let mut rest = &alert[..];
    m.client.read_tls(&mut rest).unwrap();
    let err = m.client.process_new_packets().unwrap_err();
    assert_eq!(
        err,
        rustls::Error::AlertReceived(rustls::AlertDescription::BadRecordMac)
    );
}

#[test]
fn extracted_sequence_numbers_match_the_migration_notes() {
    for (version, suite) in ALL {
        let m = handshake(version, suite);
        assert!(
            m.keys.tx.seq >= 1,
            "{version:?}: tickets or Finished were sent"
        );
        assert_eq!(
            m.keys.rx.seq,
            match version {
                Version::Tls12 => 1,
                Version::Tls13 => 0,
            }
        );
        assert_eq!(
            m.keys.tx.traffic_secret.is_some(),
            version == Version::Tls13
        );
    }
}
