//! Two record layers talking to each other (deterministic keys from [`crate::fuzzing::pair`]),
//! and the RFC 8448 records through the whole layer.

use super::*;
use crate::cipher::HEADER_LEN;
use crate::error::{InvalidMessage, PeerMisbehaved};
use crate::fuzzing::{feed, pair, ALL};
use crate::message::HandshakeType;
use crate::{MAX_KEY_UPDATES_WITHOUT_DATA, MAX_WARNING_ALERTS, SEQ_HARD_LIMIT, SEQ_SOFT_LIMIT};

/// Moves everything `from` wants to send into `to` and processes it.
fn pump(from: &mut RecordLayer, to: &mut RecordLayer) -> Result<(), Error> {
    let bytes = from.pending_tls().to_vec();
    from.consume_tls(bytes.len());
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let n = to.read_tls(rest);
        rest = &rest[n..];
        to.process()?;
        if n == 0 {
            panic!("stuck");
        }
    }
    Ok(())
}

fn take_plaintext(layer: &mut RecordLayer) -> Vec<u8> {
    let p = layer.plaintext().to_vec();
    layer.consume_plaintext(p.len());
    p
}

#[test]
fn round_trip_every_combination() {
    for (version, suite) in ALL {
        let (mut server, mut client) = pair(version, suite);
        assert_eq!(client.write_plaintext(b"GET /").unwrap(), 5);
        pump(&mut client, &mut server).unwrap();
        assert_eq!(take_plaintext(&mut server), b"GET /");
        assert_eq!(server.rx_seq(), 2);
        server.write_plaintext(b"200 OK").unwrap();
        pump(&mut server, &mut client).unwrap();
        assert_eq!(take_plaintext(&mut client), b"200 OK");
        assert_eq!(server.tx_seq(), 3);
        server.send_close_notify();
        pump(&mut server, &mut client).unwrap();
        assert!(client.peer_closed());
        assert_eq!(server.write_plaintext(b"x"), Err(Error::AlreadyClosed));
    }
}

#[test]
fn key_update_requested_is_answered_once_and_both_sides_move_on() {
    for suite in [Suite::Aes128Gcm, Suite::Aes256Gcm, Suite::Chacha20Poly1305] {
        let (mut server, mut client) = pair(Version::Tls13, suite);
        client.send_key_update(true).unwrap();
        assert_eq!(client.tx_seq(), 0);
        client.write_plaintext(b"after update").unwrap();
        pump(&mut client, &mut server).unwrap();
        assert_eq!(take_plaintext(&mut server), b"after update");
        assert_eq!(server.rx_seq(), 1);
        // the answer went out under the old key, then the server switched
        assert_eq!(server.tx_seq(), 0);
        assert_eq!(server.pending_tls().len(), HEADER_LEN + 5 + 1 + 16);
        server.write_plaintext(b"reply").unwrap();
        pump(&mut server, &mut client).unwrap();
        assert_eq!(take_plaintext(&mut client), b"reply");
        // the client's KeyUpdate(not_requested) answer is not answered again
        assert!(!client.wants_write());
    }
}

#[test]
fn tls12_has_no_key_update() {
    let (mut server, _) = pair(Version::Tls12, Suite::Aes128Gcm);
    assert_eq!(
        server.send_key_update(true),
        Err(Error::KeyUpdateUnsupported)
    );
    assert!(server.may_send());
}

#[test]
fn key_update_without_traffic_secret_is_a_clean_fatal_error() {
    let version = Version::Tls13;
    let suite = Suite::Aes128Gcm;
    let mut rx = crate::fuzzing::direction(version, suite, 0x22, 1);
    rx.traffic_secret = None;
    let mut server = RecordLayer::new(SessionKeys {
        version,
        suite,
        tx: crate::fuzzing::direction(version, suite, 0x11, 2),
        rx,
    })
    .unwrap();
    let (_, mut client) = pair(version, suite);
    client.send_key_update(false).unwrap();
    let err = pump(&mut client, &mut server).unwrap_err();
    assert_eq!(err, Error::NoTrafficSecret(crate::Direction::Rx));
    assert_eq!(err.alert(), Some(AlertDescription::INTERNAL_ERROR));
    assert!(server.wants_write());
    assert_eq!(server.process(), Err(err));
}

#[test]
fn sending_key_update_without_our_secret_is_refused_not_fatal() {
    let version = Version::Tls13;
    let suite = Suite::Chacha20Poly1305;
    let mut tx = crate::fuzzing::direction(version, suite, 0x11, 2);
    tx.traffic_secret = None;
    let mut server = RecordLayer::new(SessionKeys {
        version,
        suite,
        tx,
        rx: crate::fuzzing::direction(version, suite, 0x22, 1),
    })
    .unwrap();
    assert_eq!(
        server.send_key_update(false),
        Err(Error::NoTrafficSecret(crate::Direction::Tx))
    );
    assert!(!server.wants_write());
    assert_eq!(server.write_plaintext(b"ok"), Ok(2));
}

/// A secret that derives no generation of its key is found out at the direction's first
/// KeyUpdate, which it fails (nothing is derived from it, so no key is used twice); until then
/// the connection works on the given keys. Our own update is refused and the connection stays
/// as it was; the peer's fails the connection.
#[test]
fn mismatched_traffic_secret_fails_the_first_key_update() {
    let version = Version::Tls13;
    let suite = Suite::Aes128Gcm;
    let mismatched = || {
        let mut tx = crate::fuzzing::direction(version, suite, 0x11, 2);
        tx.traffic_secret = Some(zeroize::Zeroizing::new(vec![0x33; 32]));
        let mut rx = crate::fuzzing::direction(version, suite, 0x22, 1);
        rx.traffic_secret = Some(zeroize::Zeroizing::new(vec![0x44; 32]));
        RecordLayer::new(SessionKeys {
            version,
            suite,
            tx,
            rx,
        })
        .unwrap()
    };
    let (_, mut client) = pair(version, suite);
    let mut server = mismatched();
    client.write_plaintext(b"before").unwrap();
    pump(&mut client, &mut server).unwrap();
    assert_eq!(take_plaintext(&mut server), b"before");
    assert!(matches!(
        server.send_key_update(false),
        Err(Error::InvalidKeys(_))
    ));
    assert!(!server.wants_write());
    server.write_plaintext(b"still").unwrap();
    pump(&mut server, &mut client).unwrap();
    assert_eq!(take_plaintext(&mut client), b"still");

    let (_, mut client) = pair(version, suite);
    let mut server = mismatched();
    client.send_key_update(false).unwrap();
    let err = pump(&mut client, &mut server).unwrap_err();
    assert!(matches!(err, Error::InvalidKeys(_)));
    assert_eq!(server.process(), Err(err));

    let mut keys = SessionKeys {
        version: Version::Tls12,
        suite: Suite::Aes256Gcm,
        tx: crate::fuzzing::direction(Version::Tls12, Suite::Aes256Gcm, 1, 0),
        rx: crate::fuzzing::direction(Version::Tls12, Suite::Aes256Gcm, 2, 0),
    };
    keys.rx.key = zeroize::Zeroizing::new(vec![0; 16]);
    assert!(matches!(RecordLayer::new(keys), Err(Error::InvalidKeys(_))));
}

/// A migrating agent carries the key log's generation-0 secrets; the keys may be generations
/// on (KeyUpdates before the move, both ways). The layer follows the secrets to the keys'
/// generation, so the next KeyUpdate derives a fresh key, not one already used.
#[test]
fn an_earlier_generation_secret_is_followed_to_the_key() {
    let (version, suite) = (Version::Tls13, Suite::Aes256Gcm);
    let (mut server, mut client) = pair(version, suite);
    for _ in 0..2 {
        client.send_key_update(true).unwrap();
        pump(&mut client, &mut server).unwrap();
        pump(&mut server, &mut client).unwrap();
    }
    server.send_key_update(false).unwrap();
    pump(&mut server, &mut client).unwrap();
    let mut keys = server.export().expect("at rest");
    drop(server);
    // the generation-0 secrets (tx is 3 generations on, rx 2)
    keys.tx.traffic_secret = crate::fuzzing::direction(version, suite, 0x11, 0)
        .traffic_secret
        .clone();
    keys.rx.traffic_secret = crate::fuzzing::direction(version, suite, 0x22, 0)
        .traffic_secret
        .clone();
    let mut moved = RecordLayer::new(keys).unwrap();
    client.send_key_update(true).unwrap();
    client.write_plaintext(b"after").unwrap();
    pump(&mut client, &mut moved).unwrap();
    assert_eq!(take_plaintext(&mut moved), b"after");
    moved.write_plaintext(b"and back").unwrap();
    pump(&mut moved, &mut client).unwrap();
    assert_eq!(take_plaintext(&mut client), b"and back");
    let keys = moved.export().expect("at rest");
    let gen = |seed, n| {
        let mut s = crate::key_schedule::TrafficSecret::new(
            suite,
            &crate::fuzzing::direction(version, suite, seed, 0)
                .traffic_secret
                .clone()
                .unwrap(),
        )
        .unwrap();
        for _ in 0..n {
            s = s.next().unwrap();
        }
        s.expose().to_vec()
    };
    assert_eq!(
        keys.tx.traffic_secret.as_deref().unwrap()[..],
        gen(0x11, 4)[..]
    );
    assert_eq!(
        keys.rx.traffic_secret.as_deref().unwrap()[..],
        gen(0x22, 3)[..]
    );
}

#[test]
fn flipped_bit_is_bad_record_mac_and_the_connection_stays_dead() {
    for (version, suite) in ALL {
        let (mut server, mut client) = pair(version, suite);
        client.write_plaintext(b"hello").unwrap();
        let mut wire = client.pending_tls().to_vec();
        let last = wire.len() - 3;
        wire[last] ^= 0x10;
        let (plaintext, failed) = feed(&mut server, &wire, 7);
        assert!(failed);
        assert!(plaintext.is_empty());
        assert_eq!(server.process(), Err(Error::DecryptFailed));
        assert_eq!(server.write_plaintext(b"x"), Err(Error::DecryptFailed));
        // The server queued a fatal bad_record_mac alert; the client reads it as such.
        let (mut server, mut client) = pair(version, suite);
        client.write_plaintext(b"hello").unwrap();
        let mut wire = client.pending_tls().to_vec();
        wire[last] ^= 0x10;
        server.read_tls(&wire);
        assert_eq!(server.process(), Err(Error::DecryptFailed));
        assert_eq!(
            pump(&mut server, &mut client),
            Err(Error::AlertReceived(AlertDescription::BAD_RECORD_MAC))
        );
    }
}

#[test]
fn oversized_records_are_record_overflow() {
    for (version, suite) in ALL {
        let (mut server, mut client) = pair(version, suite);
        let max = match version {
            Version::Tls12 => crate::cipher::TLS12_MAX_CIPHERTEXT_LEN,
            Version::Tls13 => crate::cipher::TLS13_MAX_CIPHERTEXT_LEN,
        };
        let len = (max + 1) as u16;
        server.read_tls(&[23, 3, 3, (len >> 8) as u8, len as u8]);
        assert!(matches!(
            server.process(),
            Err(Error::RecordOverflow { .. })
        ));
        pump(&mut server, &mut client).unwrap_err();
        assert_eq!(
            client.error(),
            Some(&Error::AlertReceived(AlertDescription::RECORD_OVERFLOW))
        );
    }
}

#[test]
fn plaintext_over_2_14_after_decryption_is_record_overflow() {
    for (version, suite) in ALL {
        let (mut server, client) = pair(version, suite);
        // seal a too-large record with the client's raw sealer state: bypass write_plaintext
        let secrets = crate::fuzzing::direction(version, suite, 0x22, 1);
        let sealer = Sealer::new(version, suite, &secrets.key, &secrets.iv, 1).unwrap();
        let _ = client;
        let mut wire = Vec::new();
        // 2^14 + 1 bytes: seal_with_seq refuses, so build it from two halves' worth by hand
        let big = vec![7u8; MAX_PLAINTEXT_LEN + 1];
        assert!(sealer
            .seal_with_seq(1, ContentType::APPLICATION_DATA, &big, &mut wire)
            .is_err());
        let wire = seal_unchecked(version, suite, &secrets, 1, &big);
        server.read_tls(&wire);
        assert!(
            matches!(server.process(), Err(Error::RecordOverflow { .. })),
            "{version:?} {suite:?}"
        );
    }
}

/// Seals a record without the plaintext length check, as a broken peer would.
fn seal_unchecked(
    version: Version,
    suite: Suite,
    secrets: &crate::DirectionSecrets,
    seq: u64,
    payload: &[u8],
) -> Vec<u8> {
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(UnboundKey::new(suite.aead(), &secrets.key).unwrap());
    let nonce = crate::cipher::xor_nonce(&secrets.iv, seq);
    let mut out = Vec::new();
    match version {
        Version::Tls13 => {
            let mut inner = payload.to_vec();
            inner.push(23);
            let hdr =
                crate::cipher::header(ContentType::APPLICATION_DATA, inner.len() + 16).unwrap();
            key.seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(hdr),
                &mut inner,
            )
            .unwrap();
            out.extend_from_slice(&hdr);
            out.extend_from_slice(&inner);
        }
        Version::Tls12 => {
            let explicit = suite.tls12_explicit_nonce_len();
            let hdr =
                crate::cipher::header(ContentType::APPLICATION_DATA, explicit + payload.len() + 16)
                    .unwrap();
            let aad = crate::cipher::tls12_aad(
                seq,
                ContentType::APPLICATION_DATA,
                [3, 3],
                payload.len() as u16,
            );
            let mut body = payload.to_vec();
            key.seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body,
            )
            .unwrap();
            out.extend_from_slice(&hdr);
            out.extend_from_slice(&nonce[12 - explicit..]);
            out.extend_from_slice(&body);
        }
    }
    out
}

#[test]
fn garbage_is_refused_at_its_first_byte() {
    for (version, suite) in ALL {
        let (mut server, _) = pair(version, suite);
        server.read_tls(b"GET / HTTP/1.1\r\n");
        let err = server.process().unwrap_err();
        assert_eq!(err.alert(), Some(AlertDescription::UNEXPECTED_MESSAGE));
        assert_eq!(
            server.read_tls(b"more"),
            4,
            "input after death is discarded"
        );
    }
}

/// A client-side record layer sealing arbitrary TLS 1.3 inner content, for protocol tests.
fn client_record(
    version: Version,
    suite: Suite,
    seq: u64,
    typ: ContentType,
    body: &[u8],
) -> Vec<u8> {
    let secrets = crate::fuzzing::direction(version, suite, 0x22, seq);
    let sealer = Sealer::new(version, suite, &secrets.key, &secrets.iv, seq).unwrap();
    let mut out = Vec::new();
    sealer.seal_with_seq(seq, typ, body, &mut out).unwrap();
    out
}

#[test]
fn tls13_post_handshake_messages() {
    let v = Version::Tls13;
    let s = Suite::Aes128Gcm;
    let hs = ContentType::HANDSHAKE;
    let cases: Vec<(&[u8], Error)> = vec![
        (
            &[24, 0, 0, 1, 0, 23],
            PeerMisbehaved::DataAfterKeyUpdate.into(),
        ),
        (&[24, 0, 0, 1, 2], InvalidMessage::KeyUpdateValue(2).into()),
        (
            &[24, 0, 0, 2, 0, 0],
            InvalidMessage::HandshakeLength(HandshakeType::KEY_UPDATE).into(),
        ),
        (
            &[4, 0, 0, 1, 0],
            PeerMisbehaved::UnexpectedHandshake(HandshakeType::NEW_SESSION_TICKET).into(),
        ),
        (
            &[1, 0, 0, 0],
            PeerMisbehaved::UnexpectedHandshake(HandshakeType::CLIENT_HELLO).into(),
        ),
        (&[], PeerMisbehaved::EmptyFragment(hs).into()),
    ];
    for (body, want) in cases {
        let (mut server, _) = pair(v, s);
        server.read_tls(&client_record(v, s, 1, hs, body));
        assert_eq!(server.process(), Err(want.clone()), "{body:?}");
        assert!(server.wants_write(), "alert queued for {want}");
    }
    // illegal_parameter for a bad KeyUpdate value
    assert_eq!(
        Error::from(InvalidMessage::KeyUpdateValue(2)).alert(),
        Some(AlertDescription::ILLEGAL_PARAMETER)
    );
}

#[test]
fn tls13_key_update_fragmented_across_records() {
    let v = Version::Tls13;
    let s = Suite::Chacha20Poly1305;
    let (mut server, _) = pair(v, s);
    let mut wire = client_record(v, s, 1, ContentType::HANDSHAKE, &[24, 0]);
    wire.extend(client_record(v, s, 2, ContentType::HANDSHAKE, &[0, 1, 0]));
    server.read_tls(&wire);
    server.process().unwrap();
    assert_eq!(server.rx_seq(), 0, "new generation");

    // a data record inside a fragmented message is refused
    let (mut server, _) = pair(v, s);
    let mut wire = client_record(v, s, 1, ContentType::HANDSHAKE, &[24, 0]);
    wire.extend(client_record(v, s, 2, ContentType::APPLICATION_DATA, b"x"));
    server.read_tls(&wire);
    assert_eq!(
        server.process(),
        Err(PeerMisbehaved::InterleavedHandshake.into())
    );
}

#[test]
fn tls13_alerts() {
    let v = Version::Tls13;
    let s = Suite::Aes256Gcm;
    let a = ContentType::ALERT;
    let (mut server, _) = pair(v, s);
    let mut wire = client_record(v, s, 1, a, &[1, 90]); // user_canceled: ignored
    wire.extend(client_record(
        v,
        s,
        2,
        ContentType::APPLICATION_DATA,
        b"data",
    ));
    wire.extend(client_record(v, s, 3, a, &[1, 0])); // close_notify
    wire.extend(client_record(
        v,
        s,
        4,
        ContentType::APPLICATION_DATA,
        b"ignored",
    ));
    server.read_tls(&wire);
    server.process().unwrap();
    assert_eq!(server.plaintext(), b"data");
    assert!(server.peer_closed());

    // any other alert is fatal, whatever its level
    let (mut server, _) = pair(v, s);
    server.read_tls(&client_record(v, s, 1, a, &[1, 42]));
    assert_eq!(
        server.process(),
        Err(Error::AlertReceived(AlertDescription(42)))
    );
    assert!(!server.wants_write(), "no alert answers an alert");

    // too many user_canceled
    let (mut server, _) = pair(v, s);
    let mut wire = Vec::new();
    for seq in 1..=u64::from(MAX_WARNING_ALERTS) + 1 {
        wire.extend(client_record(v, s, seq, a, &[1, 90]));
    }
    server.read_tls(&wire);
    assert_eq!(
        server.process(),
        Err(PeerMisbehaved::TooManyWarningAlerts.into())
    );

    // malformed alert
    let (mut server, _) = pair(v, s);
    server.read_tls(&client_record(v, s, 1, a, &[1, 0, 0]));
    assert_eq!(server.process(), Err(InvalidMessage::Alert.into()));

    // inner ChangeCipherSpec
    let (mut server, _) = pair(v, s);
    server.read_tls(&client_record(
        v,
        s,
        1,
        ContentType::CHANGE_CIPHER_SPEC,
        &[1],
    ));
    assert_eq!(
        server.process(),
        Err(PeerMisbehaved::UnexpectedContentType(ContentType::CHANGE_CIPHER_SPEC).into())
    );
}

#[test]
fn tls12_renegotiation_is_refused_with_a_warning_then_fatal() {
    let v = Version::Tls12;
    let s = Suite::Aes128Gcm;
    let (mut server, mut client) = pair(v, s);
    // a ClientHello split across two records, with a body we do not hold
    let mut hello = vec![1, 0, 0, 40];
    hello.extend([0xab; 40]);
    let mut wire = client_record(v, s, 1, ContentType::HANDSHAKE, &hello[..10]);
    wire.extend(client_record(v, s, 2, ContentType::HANDSHAKE, &hello[10..]));
    wire.extend(client_record(
        v,
        s,
        3,
        ContentType::APPLICATION_DATA,
        b"still here",
    ));
    server.read_tls(&wire);
    server.process().unwrap();
    assert_eq!(server.plaintext(), b"still here");
    // the client sees a warning no_renegotiation, which it ignores
    pump(&mut server, &mut client).unwrap();
    assert!(client.error().is_none());

    server.read_tls(&client_record(v, s, 4, ContentType::HANDSHAKE, &hello));
    assert_eq!(
        server.process(),
        Err(PeerMisbehaved::TooManyRenegotiationRequests.into())
    );
}

#[test]
fn tls12_alerts_and_change_cipher_spec() {
    let v = Version::Tls12;
    let s = Suite::Chacha20Poly1305;
    let (mut server, _) = pair(v, s);
    let mut wire = client_record(v, s, 1, ContentType::ALERT, &[1, 90]);
    wire.extend(client_record(v, s, 2, ContentType::ALERT, &[2, 40]));
    server.read_tls(&wire);
    assert_eq!(
        server.process(),
        Err(Error::AlertReceived(AlertDescription(40)))
    );

    let (mut server, _) = pair(v, s);
    server.read_tls(&client_record(
        v,
        s,
        1,
        ContentType::CHANGE_CIPHER_SPEC,
        &[1],
    ));
    assert_eq!(
        server.process(),
        Err(PeerMisbehaved::UnexpectedContentType(ContentType::CHANGE_CIPHER_SPEC).into())
    );
}

#[test]
fn bounded_buffers_apply_back_pressure() {
    for (version, suite) in ALL {
        let (mut server, mut client) = pair(version, suite);
        // the writer takes only what fits
        let big = vec![0x61u8; 1 << 20];
        let n = client.write_plaintext(&big).unwrap();
        assert!(n > 0 && n < big.len());
        assert!(client.pending_tls().len() <= OUTGOING_LIMIT);
        assert_eq!(client.write_plaintext(&big).unwrap(), 0);
        let mut wire = Vec::new();
        let mut sent = n;
        while sent < big.len() {
            wire.extend_from_slice(client.pending_tls());
            client.consume_tls(usize::MAX);
            sent += client.write_plaintext(&big[sent..]).unwrap();
        }
        wire.extend_from_slice(client.pending_tls());
        // the reader stops decrypting when its plaintext is full, and input stops
        let mut taken = 0;
        loop {
            let n = server.read_tls(&wire[taken..]);
            taken += n;
            server.process().unwrap();
            crate::fuzzing::check_bounds(&server);
            if n == 0 {
                break;
            }
        }
        assert!(server.plaintext().len() > PLAINTEXT_LIMIT - 2 * MAX_PLAINTEXT_LEN);
        assert!(taken < wire.len());
        let mut got = take_plaintext(&mut server);
        // what was read but not decrypted yet comes out once there is room
        server.process().unwrap();
        got.extend(take_plaintext(&mut server));
        let (rest, failed) = feed(&mut server, &wire[taken..], 1000);
        assert!(!failed);
        got.extend(rest);
        assert_eq!(got, big);
    }
}

#[test]
fn worn_out_key_updates_itself_in_tls13_and_closes_in_tls12() {
    for (version, suite) in ALL {
        let limit = SEQ_SOFT_LIMIT.min(suite.confidentiality_limit());
        let mut keys = SessionKeys {
            version,
            suite,
            tx: crate::fuzzing::direction(version, suite, 0x11, limit - 1),
            rx: crate::fuzzing::direction(version, suite, 0x22, 1),
        };
        let mut server = RecordLayer::new(keys.clone()).unwrap();
        // the client side that reads it
        std::mem::swap(&mut keys.tx, &mut keys.rx);
        let mut client = RecordLayer::with_role(keys, crate::Role::Client).unwrap();
        assert_eq!(server.write_plaintext(b"last").unwrap(), 4);
        match version {
            Version::Tls13 => {
                assert_eq!(server.write_plaintext(b"next").unwrap(), 4);
                assert_eq!(
                    server.tx_seq(),
                    1,
                    "KeyUpdate, then one record under the new key"
                );
                pump(&mut server, &mut client).unwrap();
                assert_eq!(take_plaintext(&mut client), b"lastnext");
            }
            Version::Tls12 => {
                assert_eq!(server.write_plaintext(b"next"), Err(Error::KeyExhausted));
                assert!(!server.may_send());
                pump(&mut server, &mut client).unwrap();
                assert_eq!(take_plaintext(&mut client), b"last");
                assert!(client.peer_closed());
            }
        }
    }
}

#[test]
fn peer_sequence_exhaustion_is_an_error_not_a_wrap() {
    let (version, suite) = (Version::Tls12, Suite::Aes128Gcm);
    let server = RecordLayer::new(SessionKeys {
        version,
        suite,
        tx: crate::fuzzing::direction(version, suite, 0x11, 2),
        rx: crate::fuzzing::direction(version, suite, 0x22, SEQ_HARD_LIMIT),
    });
    let mut server = server.unwrap();
    server.read_tls(&client_record(
        version,
        suite,
        SEQ_HARD_LIMIT,
        ContentType::APPLICATION_DATA,
        b"x",
    ));
    assert_eq!(server.process(), Err(Error::PeerSequenceExhausted));
}

#[test]
fn many_key_updates_without_data_are_refused() {
    let v = Version::Tls13;
    let s = Suite::Aes128Gcm;
    let (mut server, mut client) = pair(v, s);
    for _ in 0..MAX_KEY_UPDATES_WITHOUT_DATA {
        client.send_key_update(false).unwrap();
    }
    pump(&mut client, &mut server).unwrap();
    client.send_key_update(false).unwrap();
    assert_eq!(
        pump(&mut client, &mut server),
        Err(PeerMisbehaved::TooManyKeyUpdateRequests.into())
    );
    // with data between them, there is no limit
    let (mut server, mut client) = pair(v, s);
    for _ in 0..2 * MAX_KEY_UPDATES_WITHOUT_DATA {
        client.send_key_update(true).unwrap();
        client.write_plaintext(b".").unwrap();
    }
    pump(&mut client, &mut server).unwrap();
    assert_eq!(
        server.plaintext().len(),
        2 * MAX_KEY_UPDATES_WITHOUT_DATA as usize
    );
    // one answer per request, each under the previous key
    assert_eq!(
        server.pending_tls().len(),
        2 * MAX_KEY_UPDATES_WITHOUT_DATA as usize * (HEADER_LEN + 5 + 1 + 16)
    );
}

#[test]
fn rfc8448_records_through_the_layer() {
    use crate::testutil::hex;
    let secret = |s: &str, key: &str, iv: &str, seq| crate::DirectionSecrets {
        seq,
        key: zeroize::Zeroizing::new(hex(key)),
        iv: hex(iv).try_into().unwrap(),
        traffic_secret: Some(zeroize::Zeroizing::new(hex(s))),
    };
    let client_ap = |seq| {
        secret(
            "9e40646ce79a7f9dc05af8889bce6552875afa0b06df0087f792ebb7c17504a5",
            "17422dda596ed5d9acd890e3c63f5051",
            "5b78923dee08579033e523d9",
            seq,
        )
    };
    let server_ap = |seq| {
        secret(
            "a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643",
            "9f02283b6c9c07efc26bb9f2ac92e356",
            "cf782b88dd83549aadf1e984",
            seq,
        )
    };
    // the server after sending its NewSessionTicket (seq 0)
    let mut server = RecordLayer::new(SessionKeys {
        version: Version::Tls13,
        suite: Suite::Aes128Gcm,
        tx: server_ap(1),
        rx: client_ap(0),
    })
    .unwrap();
    let data: Vec<u8> = (0u8..50).collect();
    let mut wire = hex(crate::opener::tests::CLIENT_APP_RECORD);
    wire.extend(hex(crate::opener::tests::CLIENT_ALERT_RECORD));
    let (plaintext, failed) = feed(&mut server, &wire, 3);
    assert!(!failed);
    assert_eq!(plaintext, data);
    assert!(server.peer_closed());
    server.write_plaintext(&data).unwrap();
    server.send_close_notify();
    let mut expected = hex(crate::opener::tests::SERVER_APP_RECORD);
    expected.extend(hex(crate::opener::tests::SERVER_ALERT_RECORD));
    assert_eq!(server.pending_tls(), &expected[..]);

    // the client, from the server's first application record: the NewSessionTicket (ignored
    // on the client side), the data, close_notify
    let mut client = RecordLayer::with_role(
        SessionKeys {
            version: Version::Tls13,
            suite: Suite::Aes128Gcm,
            tx: client_ap(0),
            rx: server_ap(0),
        },
        crate::Role::Client,
    )
    .unwrap();
    let mut wire = hex(RFC8448_NEW_SESSION_TICKET_RECORD);
    wire.extend(expected);
    let (plaintext, failed) = feed(&mut client, &wire, 64);
    assert!(!failed, "{:?}", client.error());
    assert_eq!(plaintext, data);
    assert!(client.peer_closed());
}

/// `{server} send handshake record` carrying the NewSessionTicket (sequence 0 under the
/// server application key), RFC 8448 section 3.
const RFC8448_NEW_SESSION_TICKET_RECORD: &str = "
    17 03 03 00 de 3a 6b 8f 90 41 4a 97 d6 95 9c 34 87 68 0d e5
    13 4a 2b 24 0e 6c ff ac 11 6e 95 d4 1d 6a f8 f6 b5 80 dc f3
    d1 1d 63 c7 58 db 28 9a 01 59 40 25 2f 55 71 3e 06 1d c1 3e
    07 88 91 a3 8e fb cf 57 53 ad 8e f1 70 ad 3c 73 53 d1 6d 9d
    a7 73 b9 ca 7f 2b 9f a1 b6 c0 d4 a3 d0 3f 75 e0 9c 30 ba 1e
    62 97 2a c4 6f 75 f7 b9 81 be 63 43 9b 29 99 ce 13 06 46 15
    13 98 91 d5 e4 c5 b4 06 f1 6e 3f c1 81 a7 7c a4 75 84 00 25
    db 2f 0a 77 f8 1b 5a b0 5b 94 c0 13 46 75 5f 69 23 2c 86 51
    9d 86 cb ee ac 87 aa c3 47 d1 43 f9 60 5d 64 f6 50 db 4d 02
    3e 70 e9 52 ca 49 fe 51 37 12 1c 74 bc 26 97 68 7e 24 87 46
    d6 df 35 30 05 f3 bc e1 86 96 12 9c 81 53 55 6b 3b 6c 67 79
    b3 7b f1 59 85 68 4f";

#[test]
fn an_exported_session_carries_on_in_a_new_layer_and_this_one_must_be_at_rest() {
    for (version, suite) in ALL {
        let (mut server, mut client) = pair(version, suite);
        client.write_plaintext(b"first").unwrap();
        pump(&mut client, &mut server).unwrap();
        // plaintext unread: not at rest
        assert!(server.export().is_none());
        assert_eq!(take_plaintext(&mut server), b"first");
        server.write_plaintext(b"answer").unwrap();
        assert!(server.export().is_none(), "ciphertext to send");
        pump(&mut server, &mut client).unwrap();
        take_plaintext(&mut client);
        if version == Version::Tls13 {
            // a KeyUpdate before the move: the new layer starts from the new generation
            client.send_key_update(true).unwrap();
            pump(&mut client, &mut server).unwrap();
            pump(&mut server, &mut client).unwrap();
        }
        // half a record received: not at rest either
        client.write_plaintext(b"partial").unwrap();
        let record = client.pending_tls().to_vec();
        client.consume_tls(record.len());
        assert_eq!(server.read_tls(&record[..4]), 4);
        server.process().unwrap();
        assert_eq!(server.undecrypted(), &record[..4]);
        assert!(server.export().is_none());
        assert_eq!(server.read_tls(&record[4..]), record.len() - 4);
        server.process().unwrap();
        assert_eq!(take_plaintext(&mut server), b"partial");

        let keys = server.export().expect("at rest");
        drop(server);
        let mut moved = RecordLayer::new(keys).unwrap();
        client.write_plaintext(b"to the new agent").unwrap();
        pump(&mut client, &mut moved).unwrap();
        assert_eq!(take_plaintext(&mut moved), b"to the new agent");
        moved.write_plaintext(b"from it").unwrap();
        pump(&mut moved, &mut client).unwrap();
        assert_eq!(take_plaintext(&mut client), b"from it");
        if version == Version::Tls13 {
            // and KeyUpdate both ways after the move
            client.send_key_update(true).unwrap();
            pump(&mut client, &mut moved).unwrap();
            pump(&mut moved, &mut client).unwrap();
            moved.send_key_update(false).unwrap();
            moved.write_plaintext(b"after").unwrap();
            pump(&mut moved, &mut client).unwrap();
            assert_eq!(take_plaintext(&mut client), b"after");
        }
    }
}

#[test]
fn released_buffers_come_back_and_the_session_goes_on() {
    for (version, suite) in ALL {
        let (mut server, mut client) = pair(version, suite);
        client.write_plaintext(&[b'q'; 20_000]).unwrap();
        pump(&mut client, &mut server).unwrap();
        assert!(!server.release_buffers(), "plaintext unread");
        assert_eq!(take_plaintext(&mut server).len(), 20_000);
        server.write_plaintext(&[b'r'; 30_000]).unwrap();
        assert!(!server.release_buffers(), "ciphertext to send");
        pump(&mut server, &mut client).unwrap();
        assert_eq!(take_plaintext(&mut client).len(), 30_000);
        // half a record in: kept
        client.write_plaintext(b"partial").unwrap();
        let record = client.pending_tls().to_vec();
        client.consume_tls(record.len());
        server.read_tls(&record[..4]);
        server.process().unwrap();
        assert!(!server.release_buffers(), "half a record held");
        assert_eq!(server.undecrypted(), &record[..4]);
        server.read_tls(&record[4..]);
        server.process().unwrap();
        assert_eq!(take_plaintext(&mut server), b"partial");
        assert!(server.release_buffers(), "at rest");
        if version == Version::Tls13 {
            // a fragmented KeyUpdate: the message in progress is kept over a release
            let (mut fresh, _) = pair(version, suite);
            let first = client_record(version, suite, 1, ContentType::HANDSHAKE, &[24, 0]);
            fresh.read_tls(&first);
            fresh.process().unwrap();
            assert!(!fresh.release_buffers(), "a handshake message in progress");
            let rest = client_record(version, suite, 2, ContentType::HANDSHAKE, &[0, 1, 0]);
            fresh.read_tls(&rest);
            fresh.process().unwrap();
            assert_eq!(fresh.rx_seq(), 0, "new generation");
            assert!(fresh.release_buffers());
            // and a KeyUpdate both ways on the released pair
            client.send_key_update(true).unwrap();
        }
        pump(&mut client, &mut server).unwrap();
        pump(&mut server, &mut client).unwrap();
        client.write_plaintext(b"next request").unwrap();
        pump(&mut client, &mut server).unwrap();
        assert_eq!(take_plaintext(&mut server), b"next request");
        server.write_plaintext(b"next answer").unwrap();
        pump(&mut server, &mut client).unwrap();
        assert_eq!(take_plaintext(&mut client), b"next answer");
        server.send_close_notify();
        assert!(!server.release_buffers(), "close_notify to send");
        pump(&mut server, &mut client).unwrap();
        assert!(client.peer_closed());
    }
}
