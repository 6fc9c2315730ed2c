//! Entry points for the cargo-fuzz targets in `fuzz/` (each target is one line calling a
//! function here), so the fuzzed invariants are built and type-checked with the crate. Unlike
//! the rest of the crate these functions panic on purpose: a panic is a finding.
//!
//! Both take bytes a peer controls: a session object arrives from another agent through the
//! dispatcher, replication frames from another agent's socket. Sealing means a forged blob
//! never gets past the AEAD, so each target also seals the fuzzer's input with a fixed ring,
//! to reach the decoders behind it.

use std::time::{Duration, Instant, UNIX_EPOCH};

use baton_wire::codec::Codec;

use crate::migration::{ReplayGuard, SessionObject};
use crate::replication::{Inbound, Message, Outbound, CHALLENGE_LEN, FRAME_HEADER, MAX_FRAME};
use crate::ticket::{
    KeyRing, TicketHeader, TicketKey, LEGACY_TICKET_VERSION, OVERHEAD, SALT_LEN, TICKET_VERSION,
};

fn ring() -> KeyRing {
    KeyRing::new(vec![TicketKey::new(7, &[0x42; 32], Instant::now())])
}

/// A session object as the home agent receives it. Checks: a decoded object re-encodes to
/// one that decodes equal; sealed for its home it opens there exactly once, and nowhere else;
/// the raw bytes never open; a key file made of them parses or fails without panicking; and
/// the sealed format itself (`sealed_blob`).
pub fn session_object(data: &[u8]) {
    let ring = ring();
    let _ = TicketHeader::parse(data);
    sealed_blob(&ring, data);
    let mut guard = ReplayGuard::new(4);
    assert!(SessionObject::open(data, &ring, 0, &[], UNIX_EPOCH, UNIX_EPOCH, &mut guard).is_err());
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = KeyRing::parse_key_file(text, Instant::now());
    }

    let Ok(obj) = SessionObject::read_bytes(data) else {
        return;
    };
    let again =
        SessionObject::read_bytes(&obj.get_encoding()).expect("a re-encoded object decodes");
    assert!(again == obj, "session object round trip");

    let sealed = obj.seal(&ring, 3, &[1; 32]).expect("the ring has a key");
    // The epoch as "now": no object has expired yet, whatever its expiry.
    let opened = SessionObject::open(
        &sealed, &ring, obj.home, &[1; 32], UNIX_EPOCH, UNIX_EPOCH, &mut guard,
    );
    assert!(opened.as_ref() == Ok(&obj), "sealed object opens at home");
    assert!(SessionObject::open(
        &sealed, &ring, obj.home, &[1; 32], UNIX_EPOCH, UNIX_EPOCH, &mut guard
    )
    .is_err());
    let elsewhere = obj.home.wrapping_add(1);
    let mut fresh = ReplayGuard::new(4);
    assert!(SessionObject::open(
        &sealed, &ring, elsewhere, &[1; 32], UNIX_EPOCH, UNIX_EPOCH, &mut fresh
    )
    .is_err());
    // (An expiry of u64::MAX ms has no later instant in the same unit.)
    if let Some(late) = obj.expires_ms.checked_add(1) {
        let late = UNIX_EPOCH + Duration::from_millis(late);
        assert!(SessionObject::open(
            &sealed, &ring, obj.home, &[1; 32], late, UNIX_EPOCH, &mut fresh
        )
        .is_err());
    }
}

/// The format every sealed blob has (tickets, session objects, replication frames). Checks: the
/// bytes read as either version never open; sealed, they open to themselves with the header
/// read back, but not with one bit of the salt flipped nor relabelled as version 1.
fn sealed_blob(ring: &KeyRing, data: &[u8]) {
    for version in [LEGACY_TICKET_VERSION, TICKET_VERSION] {
        let mut forged = data.to_vec();
        if let Some(first) = forged.first_mut() {
            *first = version;
        }
        assert!(
            ring.open(&forged, &[]).is_none(),
            "forged v{version} opened"
        );
    }
    let sealed = ring
        .seal_large(5, data, b"fuzz")
        .expect("the ring has a key");
    assert_eq!(sealed.len(), data.len() + OVERHEAD);
    assert_eq!(
        TicketHeader::parse(&sealed),
        Some(TicketHeader {
            key_id: 7,
            issuer: 5
        })
    );
    assert!(
        ring.open(&sealed, b"fuzz").as_deref() == Some(data),
        "blob round trip"
    );
    // The salt follows the version, key id and issuer.
    const SALT_AT: usize = 1 + 4 + 2;
    let bit = usize::from(data.first().copied().unwrap_or(0)) % (8 * SALT_LEN);
    let mut bad = sealed.clone();
    bad[SALT_AT + bit / 8] ^= 1 << (bit % 8);
    assert!(ring.open(&bad, b"fuzz").is_none(), "salt bit {bit} flipped");
    let mut bad = sealed;
    bad[0] = LEGACY_TICKET_VERSION;
    assert!(ring.open(&bad, b"fuzz").is_none(), "relabelled version 1");
}

/// A replication channel's receiving end. The first byte picks a chunk size; the rest is read
/// three ways. Checks: a decoded message re-encodes to itself; raw bytes to a receiver never
/// yield a message (they are not sealed) and never make it hold more than one frame plus one
/// read; messages cut from the data and framed by a real sender come out whole, in order,
/// however the stream is chunked.
pub fn replication(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(cut);
    let ring = ring();

    if let Ok(msg) = Message::decode(rest) {
        assert!(msg.is_valid());
        assert_eq!(
            Message::decode(&msg.get_encoding()),
            Ok(msg),
            "message round trip"
        );
    }

    let mut inbound = Inbound::new([cut; CHALLENGE_LEN]);
    for piece in rest.chunks(chunk) {
        match inbound.push(&ring, piece) {
            Ok(msgs) => assert!(msgs.is_empty(), "an unsealed frame was accepted"),
            Err(_) => break,
        }
        assert!(inbound.buffered() <= FRAME_HEADER + MAX_FRAME + chunk);
    }

    // Messages: each a length byte then that many bytes, decoded where they parse, else a
    // Put carrying them as its value.
    let mut sent = Vec::new();
    let mut r = rest;
    while let Some((&n, tail)) = r.split_first() {
        let (body, tail) = tail.split_at(usize::from(n).min(tail.len()));
        r = tail;
        sent.push(Message::decode(body).unwrap_or_else(|_| Message::Put {
            key: body.iter().take(32).copied().collect(),
            value: body.to_vec().into(),
            ttl_ms: u32::from(n),
        }));
    }
    let mut inbound = Inbound::new([cut; CHALLENGE_LEN]);
    let mut outbound = Outbound::new(9, &inbound.hello()).expect("a receiver's own hello");
    let stream: Vec<u8> = sent
        .iter()
        .flat_map(|m| {
            outbound
                .frame(&ring, m)
                .expect("small valid messages frame")
        })
        .collect();
    let mut received = Vec::new();
    for piece in stream.chunks(chunk) {
        let msgs = inbound.push(&ring, piece).expect("a real sender's frames");
        received.extend(msgs.into_iter().map(|(sender, m)| {
            assert_eq!(sender, 9);
            m
        }));
    }
    assert_eq!(received, sent, "framed messages differ");
    assert_eq!(inbound.buffered(), 0);
}

// The fuzz targets' invariants, run on stable in `cargo test` too: structured inputs the fuzzer
// would take long to find, and its findings.
#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use zeroize::Zeroizing;

    use super::*;
    use crate::migration::DirectionState;

    fn direction() -> impl Strategy<Value = DirectionState> {
        (
            any::<u64>(),
            vec(any::<u8>(), 0..40),
            any::<[u8; 12]>(),
            vec(any::<u8>(), 0..64),
        )
            .prop_map(|(seq, key, iv, secret)| DirectionState {
                seq,
                key: Zeroizing::new(key),
                iv,
                secret: (!secret.is_empty()).then(|| Zeroizing::new(secret)),
            })
    }

    fn object() -> impl Strategy<Value = SessionObject> {
        (
            (
                any::<[u8; 16]>(),
                any::<u16>(),
                any::<u64>(),
                any::<u16>(),
                any::<u16>(),
            ),
            (direction(), direction(), any::<bool>()),
            (
                vec(any::<u8>(), 0..8),
                "[a-z.]{0,20}",
                "[ -~]{0,30}",
                vec(any::<u8>(), 0..300),
            ),
        )
            .prop_map(
                |(
                    (id, home, expires_ms, version, suite),
                    (tx, rx, resumed),
                    (alpn, sni, subject, plaintext),
                )| {
                    SessionObject {
                        id,
                        home,
                        expires_ms,
                        version,
                        suite,
                        tx,
                        rx,
                        resumed,
                        alpn: (!alpn.is_empty()).then_some(alpn),
                        sni: (!sni.is_empty()).then_some(sni),
                        client_subject: (!subject.is_empty()).then_some(subject),
                        plaintext: Zeroizing::new(plaintext),
                    }
                },
            )
    }

    /// The fuzzer's first finding (in the harness, not the decoder): this object expires at
    /// u64::MAX ms, which has no "1 ms after expiry" to test.
    #[test]
    fn an_object_that_never_expires() {
        const CRASH: &[u8] = &[
            0x01, 0x20, 0x20, 0x20, 0x01, 0x20, 0x20, 0x20, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0b,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe1, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x10, 0x00, 0xe4, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(
            SessionObject::read_bytes(CRASH).map(|o| o.expires_ms),
            Ok(u64::MAX)
        );
        session_object(CRASH);
    }

    proptest! {
        #[test]
        fn objects_and_their_mutations(obj in object(), at in any::<usize>(), bit in 0u8..8) {
            let mut bytes = obj.get_encoding();
            session_object(&bytes);
            let i = at % bytes.len();
            bytes[i] ^= 1 << bit;
            session_object(&bytes);
            session_object(&bytes[..i]);
        }

        #[test]
        fn arbitrary_session_objects(data in vec(any::<u8>(), 0..400)) {
            session_object(&data);
        }

        #[test]
        fn replication_streams(data in vec(any::<u8>(), 0..2048)) {
            replication(&data);
        }
    }
}
