//! Properties over arbitrary input: whatever bytes arrive, in whatever pieces, the record layer
//! neither panics nor grows a buffer past its bound; a valid stream decrypts to the same
//! plaintext however it is split; a truncated or tampered stream yields a prefix of the
//! plaintext and then (for tampering) an error, never wrong bytes.

use baton_record::fuzzing::{check_bounds, feed, pair, ALL};
use baton_record::{RecordLayer, Version};
use proptest::prelude::*;

/// Feeds `data` cut at the given sizes (cycled), processing and draining after each piece.
fn feed_split(layer: &mut RecordLayer, data: &[u8], sizes: &[usize]) -> (Vec<u8>, bool) {
    let mut plaintext = Vec::new();
    let mut rest = data;
    let mut i = 0;
    while !rest.is_empty() {
        let size = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(1)
            .max(1);
        i += 1;
        let (p, failed) = feed(layer, &rest[..size.min(rest.len())], size);
        plaintext.extend(p);
        if failed {
            return (plaintext, true);
        }
        rest = &rest[size.min(rest.len())..];
    }
    (plaintext, false)
}

/// A valid client-to-server stream carrying `pieces`, with a KeyUpdate (TLS 1.3) after the
/// pieces marked true, and close_notify at the end.
fn valid_stream(combo: usize, pieces: &[(Vec<u8>, bool)]) -> (RecordLayer, Vec<u8>, Vec<u8>) {
    let (version, suite) = ALL[combo];
    let (server, mut client) = pair(version, suite);
    let mut wire = Vec::new();
    let mut sent = Vec::new();
    for (piece, update) in pieces {
        let mut rest = &piece[..];
        while !rest.is_empty() {
            let n = client.write_plaintext(rest).unwrap();
            rest = &rest[n..];
            wire.extend_from_slice(client.pending_tls());
            client.consume_tls(usize::MAX);
        }
        sent.extend_from_slice(piece);
        if *update && version == Version::Tls13 {
            client.send_key_update(false).unwrap();
        }
    }
    client.send_close_notify();
    wire.extend_from_slice(client.pending_tls());
    (server, wire, sent)
}

fn pieces() -> impl Strategy<Value = Vec<(Vec<u8>, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                prop::collection::vec(any::<u8>(), 16_000..40_000),
            ],
            any::<bool>(),
        ),
        0..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_nor_overflow(
        combo in 0..ALL.len(),
        data in prop::collection::vec(any::<u8>(), 0..2048),
        sizes in prop::collection::vec(1usize..300, 1..8),
        client_side in any::<bool>(),
    ) {
        let (version, suite) = ALL[combo];
        let (server, client) = pair(version, suite);
        let mut layer = if client_side { client } else { server };
        let _ = feed_split(&mut layer, &data, &sizes);
        check_bounds(&layer);
    }

    /// The fuzz target itself, on proptest's inputs.
    #[test]
    fn fuzz_entry_point(data in prop::collection::vec(any::<u8>(), 0..3000)) {
        baton_record::fuzzing::record(&data);
    }

    /// Authenticated records with arbitrary types and bodies: the protocol logic behind the
    /// AEAD (alerts, handshake fragments, KeyUpdates) on arbitrary input.
    #[test]
    fn arbitrary_authenticated_records_never_panic(
        combo in 0..ALL.len(),
        script in prop::collection::vec(
            prop_oneof![
                3 => 20u8..=24,
                1 => any::<u8>(),
                3 => 0u8..=4,
                ],
            0..600,
        ),
        sizes in prop::collection::vec(1usize..300, 1..8),
    ) {
        let (version, suite) = ALL[combo];
        let (mut server, _) = pair(version, suite);
        let wire = baton_record::fuzzing::sealed_script(version, suite, &script);
        let _ = feed_split(&mut server, &wire, &sizes);
        check_bounds(&server);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_prefix_never_panic(
        combo in 0..ALL.len(),
        garbage in prop::collection::vec(any::<u8>(), 0..2048),
        sizes in prop::collection::vec(1usize..5000, 1..8),
    ) {
        let (mut server, wire, _) = valid_stream(combo, &[(b"hello".to_vec(), true)]);
        // drop the close_notify so the garbage is read
        let without_close = &wire[..wire.len() - 1];
        let mut data = without_close.to_vec();
        data.extend(garbage);
        let _ = feed_split(&mut server, &data, &sizes);
        check_bounds(&server);
    }

    #[test]
    fn any_split_of_a_valid_stream_gives_the_same_plaintext(
        combo in 0..ALL.len(),
        pieces in pieces(),
        sizes in prop::collection::vec(1usize..20_000, 1..10),
    ) {
        let (mut server, wire, sent) = valid_stream(combo, &pieces);
        let (got, failed) = feed_split(&mut server, &wire, &sizes);
        prop_assert!(!failed, "{:?}", server.error());
        prop_assert_eq!(got, sent);
        prop_assert!(server.peer_closed());
    }

    #[test]
    fn truncated_stream_gives_a_prefix_and_no_error(
        combo in 0..ALL.len(),
        pieces in pieces(),
        cut in any::<prop::sample::Index>(),
        sizes in prop::collection::vec(1usize..3000, 1..6),
    ) {
        let (mut server, wire, sent) = valid_stream(combo, &pieces);
        let cut = cut.index(wire.len() + 1);
        let (got, failed) = feed_split(&mut server, &wire[..cut], &sizes);
        prop_assert!(!failed, "{:?}", server.error());
        prop_assert!(sent.starts_with(&got));
    }

    #[test]
    fn tampered_stream_gives_a_prefix_then_fails_or_waits(
        combo in 0..ALL.len(),
        pieces in pieces(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        sizes in prop::collection::vec(1usize..3000, 1..6),
    ) {
        let (mut server, mut wire, sent) = valid_stream(combo, &pieces);
        let at = at.index(wire.len());
        wire[at] ^= flip;
        let (got, failed) = feed_split(&mut server, &wire, &sizes);
        prop_assert!(sent.starts_with(&got), "never wrong plaintext");
        // A changed length can leave the layer waiting for bytes that never come; anything
        // else must fail, and a failure always has an alert queued unless it was the peer's.
        if failed {
            let err = server.error().unwrap();
            prop_assert!(err.alert().is_some() || matches!(err, baton_record::Error::AlertReceived(_)));
        } else {
            prop_assert!(!server.peer_closed());
        }
    }
}
