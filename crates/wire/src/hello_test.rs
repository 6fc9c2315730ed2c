use super::*;
use crate::enums::ContentType;
use crate::error::NotTls;

fn sample() -> ClientHello {
    ClientHello {
        legacy_version: ProtocolVersion::TLSV1_2,
        random: [0x11; 32],
        session_id: vec![0x22; 32],
        cipher_suites: vec![CipherSuite(0x2a2a), CipherSuite::TLS13_AES_128_GCM_SHA256],
        compression_methods: vec![Compression::NULL],
        extensions: vec![
            ClientExtension::Other {
                typ: ExtensionType(0x1a1a),
                data: vec![],
            },
            ClientExtension::ServerName(vec![ServerName {
                typ: ServerNameType::HOST_NAME,
                name: b"example.com".to_vec(),
            }]),
            ClientExtension::Alpn(vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
            ClientExtension::SupportedVersions(vec![
                ProtocolVersion(0x3a3a),
                ProtocolVersion::TLSV1_3,
                ProtocolVersion::TLSV1_2,
            ]),
            ClientExtension::SupportedGroups(vec![NamedGroup::X25519_MLKEM768, NamedGroup::X25519]),
            ClientExtension::KeyShare(vec![
                KeyShareEntry {
                    group: NamedGroup::X25519_MLKEM768,
                    payload: vec![1; 1216],
                },
                KeyShareEntry {
                    group: NamedGroup::X25519,
                    payload: vec![2; 32],
                },
            ]),
            ClientExtension::SignatureAlgorithms(vec![SignatureScheme::ED25519]),
            ClientExtension::SessionTicket(vec![]),
            ClientExtension::PskKeyExchangeModes(vec![PskKeyExchangeMode::PSK_DHE_KE]),
            ClientExtension::EarlyData,
            ClientExtension::PreSharedKey(OfferedPsks {
                identities: vec![PskIdentity {
                    identity: b"ticket".to_vec(),
                    obfuscated_ticket_age: 7,
                }],
                binders: vec![vec![9; 32]],
            }),
        ],
    }
}

fn message(hello: &ClientHello) -> Vec<u8> {
    let mut m = Vec::new();
    hello.encode_message(&mut m);
    m
}

/// A hello whose extensions block is given raw, to write what our encoder would refuse to.
fn with_raw_extensions(exts: &[u8]) -> Vec<u8> {
    let mut hello = sample();
    hello.extensions.clear();
    let mut body = Vec::new();
    hello.encode(&mut body);
    encode_bytes(&mut body, Len::U16, exts);
    let mut m = Vec::new();
    HandshakeType::CLIENT_HELLO.encode(&mut m);
    encode_bytes(&mut m, Len::U24, &body);
    m
}

#[test]
fn accessors_find_each_extension() {
    let h = ClientHello::read_message(&message(&sample())).unwrap();
    assert_eq!(h, sample());
    assert_eq!(h.server_name(), Some("example.com"));
    assert_eq!(
        h.alpn_protocols(),
        Some(&[b"h2".to_vec(), b"http/1.1".to_vec()][..])
    );
    assert!(h.offers_tls13());
    assert_eq!(
        h.max_version(),
        ProtocolVersion::TLSV1_3,
        "GREASE 0x3a3a is not a version"
    );
    assert_eq!(
        h.key_share_groups().collect::<Vec<_>>(),
        [
            (NamedGroup::X25519_MLKEM768, 1216),
            (NamedGroup::X25519, 32)
        ]
    );
    assert_eq!(
        h.supported_groups(),
        Some(&[NamedGroup::X25519_MLKEM768, NamedGroup::X25519][..])
    );
    assert_eq!(
        h.signature_algorithms(),
        Some(&[SignatureScheme::ED25519][..])
    );
    assert_eq!(h.session_ticket(), Some(&[][..]));
    assert_eq!(
        h.pre_shared_key().unwrap().identities[0].identity,
        b"ticket"
    );
    assert_eq!(
        h.psk_key_exchange_modes(),
        Some(&[PskKeyExchangeMode::PSK_DHE_KE][..])
    );
    assert!(h.early_data());
    assert!(h.extension(ExtensionType(0x1a1a)).is_some());
}

#[test]
fn old_hello_without_extensions() {
    let mut h = sample();
    h.extensions.clear();
    h.legacy_version = ProtocolVersion::TLSV1_0;
    let m = message(&h);
    assert_eq!(
        m.len(),
        4 + 2 + 32 + 33 + 6 + 2,
        "no extensions block at all"
    );
    let back = ClientHello::read_message(&m).unwrap();
    assert_eq!(back.max_version(), ProtocolVersion::TLSV1_0);
    assert!(!back.offers_tls13());
    assert_eq!(back.server_name(), None);
}

#[test]
fn refuses_duplicate_extensions_and_a_psk_that_is_not_last() {
    let ems = [0x00, 0x17, 0x00, 0x00];
    let dup = [&ems[..], &ems[..]].concat();
    assert_eq!(
        ClientHello::read_message(&with_raw_extensions(&dup)),
        Err(Malformed::DuplicateExtension(ExtensionType::EXTENDED_MASTER_SECRET).into())
    );
    let mut h = sample();
    h.extensions.rotate_right(1);
    assert_eq!(
        ClientHello::read_message(&message(&h)),
        Err(Malformed::PskNotLast.into())
    );
}

#[test]
fn psk_binders_are_bounded_and_counted() {
    let mut h = sample();
    let Some(ClientExtension::PreSharedKey(psk)) = h.extensions.last_mut() else {
        panic!("sample ends with a PSK")
    };
    psk.binders = vec![vec![9; 31]];
    assert_eq!(
        ClientHello::read_message(&message(&h)),
        Err(Malformed::TooShort("PSK binder").into())
    );
    let Some(ClientExtension::PreSharedKey(psk)) = h.extensions.last_mut() else {
        panic!()
    };
    psk.binders = vec![vec![9; 32], vec![9; 255]];
    assert_eq!(
        ClientHello::read_message(&message(&h)),
        Err(Malformed::PskBinderCount {
            identities: 1,
            binders: 2
        }
        .into())
    );
}

#[test]
fn refuses_trailing_bytes_inside_an_extension_and_after_the_hello() {
    // early_data with a body
    assert_eq!(
        ClientHello::read_message(&with_raw_extensions(&[0x00, 0x2a, 0x00, 0x01, 0x00])),
        Err(Malformed::TrailingBytes("extension").into())
    );
    let mut m = message(&sample());
    m.push(0);
    assert_eq!(
        ClientHello::read_message(&m),
        Err(Malformed::TrailingBytes("ClientHello message").into())
    );
}

#[test]
fn refuses_overlong_session_id_and_empty_lists() {
    let mut h = sample();
    h.session_id = vec![0; 33];
    assert_eq!(
        ClientHello::read_message(&message(&h)),
        Err(Malformed::OverLong("session id").into())
    );
    let mut h = sample();
    h.cipher_suites.clear();
    assert_eq!(
        ClientHello::read_message(&message(&h)),
        Err(Malformed::Empty("cipher suites").into())
    );
    let mut h = sample();
    h.extensions[1] = ClientExtension::ServerName(vec![]);
    assert_eq!(
        ClientHello::read_message(&message(&h)),
        Err(Malformed::Empty("server_name").into())
    );
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let m = message(&sample());
    for cut in 0..m.len() {
        assert!(
            ClientHello::read_message(&m[..cut]).is_err(),
            "cut at {cut}"
        );
    }
}

#[test]
fn reader_peeks_a_fragmented_hello() {
    let h = sample();
    let mut wire = Vec::new();
    h.encode_records(&mut wire, 100);
    assert!(wire.len() > 1300 + 5 * 13, "several records");
    let mut reader = HelloReader::new();
    let (first, second) = wire.split_at(wire.len() - 10);
    assert_eq!(reader.push(first), Ok(Progress::NeedMore));
    let mut more = second.to_vec();
    more.extend_from_slice(b"early data record");
    assert_eq!(reader.push(&more), Ok(Progress::Done(h.clone(), 10)));
    assert_eq!(reader.consumed(), wire.len());
    assert_eq!(reader.push(b"x"), Ok(Progress::Done(h, 0)));
}

#[test]
fn reader_refuses_plain_http_at_once_and_big_hellos_without_holding_them() {
    let mut reader = HelloReader::new();
    assert_eq!(
        reader.push(b"G"),
        Err(NotTls::ContentType(ContentType(b'G')).into())
    );
    let mut wire = Vec::new();
    sample().encode_records(&mut wire, 1 << 14);
    let mut reader = HelloReader::with_limit(1000);
    assert!(matches!(
        reader.push(&wire),
        Err(Error::TooLarge { max: 1000, .. })
    ));
    assert!(reader.buffered() <= 1000);
}
