//! Property tests: generated hellos (random fields, GREASE values, random extension orders)
//! survive encode -> parse unchanged, however their records are fragmented and however the
//! bytes are chunked on arrival; arbitrary and mutated bytes never panic and never make the
//! reader hold more than its limit.

use baton_wire::codec::Codec;
use baton_wire::record::{RecordHeader, MAX_PLAINTEXT_LEN};
use baton_wire::FirstMessage;
use baton_wire::{
    fuzzing, CipherSuite, ClientExtension, ClientHello, Compression, ContentType, ExtensionType,
    HelloReader, KeyShareEntry, NamedGroup, OfferedPsks, Progress, ProtocolVersion, PskIdentity,
    PskKeyExchangeMode, ServerExtension, ServerHello, ServerName, ServerNameType, SignatureScheme,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn grease() -> impl Strategy<Value = u16> {
    (0u16..16).prop_map(|i| (i << 12) | 0x0a00 | (i << 4) | 0x0a)
}

/// Mostly arbitrary values, often GREASE.
fn code16() -> impl Strategy<Value = u16> {
    prop_oneof![3 => any::<u16>(), 1 => grease()]
}

fn bytes(min: usize, max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), min..=max)
}

fn extension() -> impl Strategy<Value = ClientExtension> {
    prop_oneof![
        vec((any::<u8>(), bytes(1, 40)), 1..3).prop_map(|names| ClientExtension::ServerName(
            names
                .into_iter()
                .map(|(t, name)| ServerName {
                    typ: ServerNameType(t),
                    name
                })
                .collect()
        )),
        vec(bytes(1, 12), 1..4).prop_map(ClientExtension::Alpn),
        vec(code16().prop_map(ProtocolVersion), 1..6).prop_map(ClientExtension::SupportedVersions),
        vec(
            (code16(), prop_oneof![bytes(1, 65), bytes(1216, 1216)]),
            0..3
        )
        .prop_map(|shares| {
            ClientExtension::KeyShare(
                shares
                    .into_iter()
                    .map(|(g, payload)| KeyShareEntry {
                        group: NamedGroup(g),
                        payload,
                    })
                    .collect(),
            )
        }),
        vec(code16().prop_map(NamedGroup), 1..8).prop_map(ClientExtension::SupportedGroups),
        vec(code16().prop_map(SignatureScheme), 1..8)
            .prop_map(ClientExtension::SignatureAlgorithms),
        bytes(0, 200).prop_map(ClientExtension::SessionTicket),
        vec((bytes(1, 200), any::<u32>(), bytes(32, 255)), 1..3).prop_map(|psks| {
            let (identities, binders) = psks
                .into_iter()
                .map(|(identity, obfuscated_ticket_age, binder)| {
                    (
                        PskIdentity {
                            identity,
                            obfuscated_ticket_age,
                        },
                        binder,
                    )
                })
                .unzip();
            ClientExtension::PreSharedKey(OfferedPsks {
                identities,
                binders,
            })
        }),
        Just(ClientExtension::EarlyData),
        vec(any::<u8>().prop_map(PskKeyExchangeMode), 1..3)
            .prop_map(ClientExtension::PskKeyExchangeModes),
        (
            code16().prop_filter("parsed types have their own variant", |t| {
                !ClientExtension::is_parsed(ExtensionType(*t))
            }),
            bytes(0, 64)
        )
            .prop_map(|(t, data)| ClientExtension::Other {
                typ: ExtensionType(t),
                data
            }),
    ]
}

/// Distinct extension types in a random order, pre_shared_key (if any) last.
fn extensions() -> impl Strategy<Value = Vec<ClientExtension>> {
    vec(extension(), 0..14)
        .prop_map(|mut exts| {
            let mut seen = std::collections::HashSet::new();
            exts.retain(|e| seen.insert(e.typ()));
            exts
        })
        .prop_shuffle()
        .prop_map(|mut exts| {
            if let Some(i) = exts
                .iter()
                .position(|e| e.typ() == ExtensionType::PRE_SHARED_KEY)
            {
                let psk = exts.remove(i);
                exts.push(psk);
            }
            exts
        })
}

fn client_hello() -> impl Strategy<Value = ClientHello> {
    (
        code16(),
        any::<[u8; 32]>(),
        bytes(0, 32),
        vec(code16().prop_map(CipherSuite), 1..30),
        vec(any::<u8>().prop_map(Compression), 1..3),
        extensions(),
    )
        .prop_map(
            |(v, random, session_id, cipher_suites, compression_methods, extensions)| ClientHello {
                legacy_version: ProtocolVersion(v),
                random,
                session_id,
                cipher_suites,
                compression_methods,
                extensions,
            },
        )
}

fn server_hello() -> impl Strategy<Value = ServerHello> {
    let ext = prop_oneof![
        code16().prop_map(|v| ServerExtension::SupportedVersions(ProtocolVersion(v))),
        (
            code16().prop_filter("not supported_versions", |t| *t
                != ExtensionType::SUPPORTED_VERSIONS.0),
            bytes(0, 40)
        )
            .prop_map(|(t, data)| ServerExtension::Other {
                typ: ExtensionType(t),
                data
            }),
    ];
    (
        code16(),
        any::<[u8; 32]>(),
        bytes(0, 32),
        code16(),
        any::<u8>(),
        vec(ext, 0..6),
    )
        .prop_map(|(v, random, session_id, suite, comp, mut extensions)| {
            let mut seen = std::collections::HashSet::new();
            extensions.retain(|e| seen.insert(e.typ()));
            ServerHello {
                legacy_version: ProtocolVersion(v),
                random,
                session_id,
                cipher_suite: CipherSuite(suite),
                compression_method: Compression(comp),
                extensions,
            }
        })
}

fn message(hello: &ClientHello) -> Vec<u8> {
    let mut m = Vec::new();
    hello.encode_message(&mut m);
    m
}

/// `msg` cut into records of the given sizes (cycled), each with one of the legacy versions
/// clients use.
fn fragment(msg: &[u8], sizes: &[usize], versions: &[bool]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = msg;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].min(rest.len());
        let version = if versions[i % versions.len()] {
            ProtocolVersion::TLSV1_0
        } else {
            ProtocolVersion::TLSV1_2
        };
        RecordHeader {
            typ: ContentType::HANDSHAKE,
            version,
            len: n,
        }
        .encode(&mut out);
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    out
}

/// Pushes `wire` in chunks of the given sizes (cycled) and returns the outcome and the number
/// of bytes consumed, checking the bound after every push.
fn feed(
    reader: &mut HelloReader,
    wire: &[u8],
    chunks: &[usize],
) -> (Result<Progress, baton_wire::Error>, usize) {
    let mut at = 0;
    let mut i = 0;
    loop {
        let n = chunks[i % chunks.len()].min(wire.len() - at);
        let result = reader.push(&wire[at..at + n]);
        assert!(
            reader.buffered() <= reader.limit(),
            "held {} > {}",
            reader.buffered(),
            reader.limit()
        );
        match result {
            Ok(Progress::NeedMore) if at + n < wire.len() => at += n,
            Ok(Progress::NeedMore) => return (Ok(Progress::NeedMore), wire.len()),
            Ok(Progress::Done(h, used)) => return (Ok(Progress::Done(h, used)), at + used),
            Err(e) => return (Err(e), at),
        }
        i += 1;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn client_hello_round_trips(hello in client_hello()) {
        let msg = message(&hello);
        let back = ClientHello::read_message(&msg);
        prop_assert_eq!(back.as_ref(), Ok(&hello));
        prop_assert_eq!(message(&back.unwrap()), msg);
    }

    #[test]
    fn server_hello_round_trips(hello in server_hello()) {
        let mut msg = Vec::new();
        hello.encode_message(&mut msg);
        prop_assert_eq!(ServerHello::read_message(&msg), Ok(hello));
    }

    #[test]
    fn any_fragmentation_and_chunking_peeks_the_same_hello(
        hello in client_hello(),
        sizes in vec(prop_oneof![1usize..8, 8usize..300, Just(MAX_PLAINTEXT_LEN)], 1..8),
        versions in vec(any::<bool>(), 1..4),
        chunks in vec(prop_oneof![1usize..4, 4usize..600, Just(100_000)], 1..8),
        tail in bytes(0, 20),
    ) {
        let wire = fragment(&message(&hello), &sizes, &versions);
        let mut stream = wire.clone();
        stream.extend_from_slice(&tail);
        let mut reader = HelloReader::new();
        let (outcome, consumed) = feed(&mut reader, &stream, &chunks);
        prop_assert!(matches!(outcome, Ok(Progress::Done(ref h, _)) if *h == hello), "{:?}", outcome);
        prop_assert_eq!(consumed, wire.len(), "stops exactly at the end of the hello's last record");
        prop_assert_eq!(reader.consumed(), wire.len());
    }

    #[test]
    fn a_limit_below_the_hello_refuses_it_without_holding_more(
        hello in client_hello(),
        cut in 0.0f64..1.0,
        chunks in vec(1usize..500, 1..4),
    ) {
        let msg = message(&hello);
        let limit = (msg.len() as f64 * cut) as usize;
        let wire = fragment(&msg, &[300], &[true]);
        let mut reader = HelloReader::with_limit(limit);
        let (outcome, _) = feed(&mut reader, &wire, &chunks);
        prop_assert!(matches!(outcome, Err(baton_wire::Error::TooLarge { .. })), "{:?}", outcome);
    }

    #[test]
    fn arbitrary_bytes_never_panic_nor_exceed_the_limit(
        prefix in prop_oneof![Just(vec![]), Just(vec![22, 3, 1]), Just(vec![22, 3, 3, 0x01, 0x00, 1, 0, 0])],
        data in bytes(0, 3000),
        limit in prop_oneof![0usize..64, 64usize..4096, Just(64 * 1024)],
        chunks in vec(1usize..700, 1..5),
    ) {
        let wire = [prefix, data].concat();
        let _ = ClientHello::read_message(&wire);
        let _ = ServerHello::read_message(&wire);
        let mut reader = HelloReader::with_limit(limit);
        let (_, consumed) = feed(&mut reader, &wire, &chunks);
        prop_assert!(consumed <= wire.len());
        fuzzing::client_hello(&wire);
    }

    #[test]
    fn mutated_hellos_never_panic_and_reparse_stably(
        hello in client_hello(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = Vec::new();
        hello.encode_records(&mut wire, 512);
        for (at, byte) in &edits {
            let i = at.index(wire.len());
            wire[i] = *byte;
        }
        wire.truncate(cut.index(wire.len() + 1).max(1));
        fuzzing::client_hello(&wire);
        let msg = wire.get(5..).unwrap_or_default();
        fuzzing::client_hello(msg);
        if let Ok(parsed) = ClientHello::read_message(msg) {
            prop_assert_eq!(ClientHello::read_message(&message(&parsed)), Ok(parsed));
        }
    }
}

#[test]
fn server_hello_codec_is_exercised_by_read_bytes() {
    // `read_bytes` refuses trailing bytes for whole structures too.
    let sh = ServerHello {
        legacy_version: ProtocolVersion::TLSV1_2,
        random: [0; 32],
        session_id: vec![],
        cipher_suite: CipherSuite::TLS13_AES_128_GCM_SHA256,
        compression_method: Compression::NULL,
        extensions: vec![],
    };
    let mut body = sh.get_encoding();
    assert_eq!(ServerHello::read_bytes(&body), Ok(sh));
    body.extend_from_slice(&[0, 0, 0]);
    assert!(ServerHello::read_bytes(&body).is_err());
}
