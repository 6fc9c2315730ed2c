//! A rustls connection parked on the record layer, without sockets: the handshake
//! and requests on rustls (a KeyUpdate among them), then `extract::into_layer`, after which the
//! record layer alone carries the connection on: requests, the client's KeyUpdates, our own,
//! close_notify. The client is rustls and must never see an error.

use std::io::{Read as _, Write as _};
use std::ops::DerefMut;
use std::sync::Arc;

use baton_record::RecordLayer;
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ConnectionCommon, ServerConnection};

use super::harness::{client_config, pattern, server_config};
use baton_migrate::extract;
use baton_migrate::secrets::{self, SecretLog, TrafficSecrets};

/// Everything `from` wants to send.
pub(super) fn flight<C, D>(from: &mut C) -> Vec<u8>
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    let mut out = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut out).unwrap();
    }
    out
}

pub(super) fn feed<C, D>(to: &mut C, mut bytes: &[u8])
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    while !bytes.is_empty() {
        to.read_tls(&mut bytes).unwrap();
        to.process_new_packets().expect("no TLS error");
    }
}

fn read_all<C, D>(conn: &mut C) -> Vec<u8>
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    let mut v = Vec::new();
    let _ = conn.reader().read_to_end(&mut v);
    v
}

/// A handshake between a rustls client and server whose secrets the log captured.
fn established(tls13: bool) -> (ClientConnection, ServerConnection, TrafficSecrets) {
    established_with(&Arc::new(SecretLog::default()), tls13)
}

/// The same, with the server's key log given (one log for many sessions, as an agent's).
pub(super) fn established_with(
    log: &Arc<SecretLog>,
    tls13: bool,
) -> (ClientConnection, ServerConnection, TrafficSecrets) {
    let name = ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(client_config(tls13), name).unwrap();
    let mut server = ServerConnection::new(server_config(log.clone())).unwrap();
    let mut expected = None;
    while client.is_handshaking() || server.is_handshaking() {
        let bytes = flight(&mut client);
        if expected.is_none() {
            expected = secrets::client_random(&bytes).and_then(|r| log.expect(r));
        }
        feed(&mut server, &bytes);
        let bytes = flight(&mut server);
        feed(&mut client, &bytes);
    }
    let secrets = expected.map(|e| e.take()).unwrap_or_default();
    (client, server, secrets)
}

/// The layer decrypts `tls` and answers with what it got.
fn layer_echoes(layer: &mut RecordLayer, tls: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut rest = tls;
    let mut plain = Vec::new();
    while !rest.is_empty() {
        let n = layer.read_tls(rest);
        rest = &rest[n..];
        layer.process().unwrap();
        let p = layer.plaintext().to_vec();
        layer.consume_plaintext(p.len());
        plain.extend(p);
    }
    if !plain.is_empty() {
        layer.write_plaintext(&plain).unwrap();
    }
    let out = layer.pending_tls().to_vec();
    layer.consume_tls(out.len());
    (plain, out)
}

#[test]
fn a_parked_rustls_connection_goes_on_from_the_record_layer() {
    for tls13 in [true, false] {
        let (mut client, mut server, secrets) = established(tls13);
        assert_eq!(
            secrets.client.is_some() && secrets.server.is_some(),
            tls13,
            "the log has TLS 1.3 traffic secrets only"
        );
        // two requests on rustls; in TLS 1.3 a KeyUpdate between them, so the keys to park
        // with are a generation past the logged secrets
        let mut sent = 0;
        for round in 0..2 {
            if tls13 && round == 1 {
                client.refresh_traffic_keys().unwrap();
            }
            client.writer().write_all(&pattern(sent, 500)).unwrap();
            sent += 500;
            let bytes = flight(&mut client);
            feed(&mut server, &bytes);
            let got = read_all(&mut server);
            server.writer().write_all(&got).unwrap();
            let bytes = flight(&mut server);
            feed(&mut client, &bytes);
        }
        assert_eq!(read_all(&mut client), pattern(0, sent));

        // idle: it parks
        assert!(extract::layer_can_carry(&server, &secrets));
        assert!(extract::extractable(&mut server));
        let (mut layer, (version, suite)) = extract::into_layer(server, &secrets).unwrap();
        assert_eq!(version, if tls13 { 0x0304 } else { 0x0303 });
        assert!(baton_migrate::record_suite(version, suite).is_some());
        assert!(layer.release_buffers());

        // the client's next requests, its KeyUpdates, and ours
        let mut echoed = Vec::new();
        for round in 0..3 {
            if tls13 && round > 0 {
                client.refresh_traffic_keys().unwrap();
            }
            if tls13 && round == 2 {
                layer.send_key_update(false).unwrap();
            }
            client.writer().write_all(&pattern(sent, 700)).unwrap();
            sent += 700;
            let (plain, out) = layer_echoes(&mut layer, &flight(&mut client));
            echoed.extend(plain);
            feed(&mut client, &out);
            assert!(layer.release_buffers(), "at rest again");
        }
        assert_eq!(echoed, pattern(1000, 2100), "tls13={tls13}");
        assert_eq!(read_all(&mut client), pattern(1000, 2100));

        // close_notify both ways
        client.send_close_notify();
        let (_, out) = layer_echoes(&mut layer, &flight(&mut client));
        assert!(out.is_empty());
        assert!(layer.peer_closed());
        layer.send_close_notify();
        feed(&mut client, layer.pending_tls());
        assert!(client.process_new_packets().unwrap().peer_has_closed());
    }
}

#[test]
fn without_the_traffic_secrets_a_tls13_connection_stays_on_rustls() {
    let (_, server, secrets) = established(true);
    assert!(extract::layer_can_carry(&server, &secrets));
    assert!(!extract::layer_can_carry(
        &server,
        &TrafficSecrets::default()
    ));
    // TLS 1.2 needs none: there is no KeyUpdate to follow
    let (_, server, _) = established(false);
    assert!(extract::layer_can_carry(
        &server,
        &TrafficSecrets::default()
    ));
}
