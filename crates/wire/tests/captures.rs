//! First flights captured from real clients on Debian 12 (`testdata/capture.sh` regenerates
//! them): each must parse, peek the same in any chunking, re-encode to the very bytes sent, and
//! give the fields the client was asked to send.

use baton_wire::record::{RecordHeader, HEADER_LEN};
use baton_wire::FirstMessage;
use baton_wire::{
    ClientHello, ContentType, ExtensionType, HelloReader, NamedGroup, Progress, ProtocolVersion,
    PskKeyExchangeMode,
};

const OPENSSL_TLS12: &[u8] = include_bytes!("../testdata/openssl-tls12.bin");
const OPENSSL_TLS13: &[u8] = include_bytes!("../testdata/openssl-tls13.bin");
const OPENSSL_TLS12_RESUME: &[u8] = include_bytes!("../testdata/openssl-tls12-resume.bin");
const OPENSSL_TLS13_RESUME: &[u8] = include_bytes!("../testdata/openssl-tls13-resume.bin");
const CURL: &[u8] = include_bytes!("../testdata/curl.bin");
const CHROMIUM: &[u8] = include_bytes!("../testdata/chromium.bin");

const ALL: [&[u8]; 6] = [
    OPENSSL_TLS12,
    OPENSSL_TLS13,
    OPENSSL_TLS12_RESUME,
    OPENSSL_TLS13_RESUME,
    CURL,
    CHROMIUM,
];

/// The handshake bytes the records carry.
fn payload(mut wire: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Ok(Some(h)) = RecordHeader::parse(wire) {
        assert_eq!(h.typ, ContentType::HANDSHAKE);
        out.extend_from_slice(&wire[HEADER_LEN..HEADER_LEN + h.len]);
        wire = &wire[HEADER_LEN + h.len..];
    }
    assert!(wire.is_empty(), "the capture ends at a record boundary");
    out
}

fn parse(wire: &[u8]) -> ClientHello {
    match HelloReader::new().push(wire) {
        Ok(Progress::Done(hello, used)) => {
            assert_eq!(used, wire.len());
            hello
        }
        other => panic!("{other:?}"),
    }
}

fn alpn(h: &ClientHello) -> Vec<&str> {
    h.alpn_protocols()
        .unwrap_or_default()
        .iter()
        .map(|p| std::str::from_utf8(p).unwrap())
        .collect()
}

#[test]
fn every_capture_reencodes_to_the_bytes_sent() {
    for wire in ALL {
        let msg = payload(wire);
        let hello = ClientHello::read_message(&msg).unwrap();
        let mut again = Vec::new();
        hello.encode_message(&mut again);
        assert_eq!(again, msg, "{:?}", hello.server_name());
    }
}

#[test]
fn every_capture_peeks_the_same_byte_by_byte() {
    for wire in ALL {
        let whole = parse(wire);
        let mut reader = HelloReader::new();
        let (last, init) = wire.split_last().unwrap();
        for b in init {
            assert_eq!(reader.push(std::slice::from_ref(b)), Ok(Progress::NeedMore));
        }
        assert_eq!(reader.push(&[*last]), Ok(Progress::Done(whole, 1)));
    }
}

#[test]
fn openssl_tls12_only() {
    let h = parse(OPENSSL_TLS12);
    assert_eq!(h.server_name(), Some("tls12.example"));
    assert_eq!(alpn(&h), ["http/1.1"]);
    assert!(!h.offers_tls13());
    assert_eq!(h.max_version(), ProtocolVersion::TLSV1_2);
    assert_eq!(h.supported_versions(), None);
    assert_eq!(h.key_shares(), None);
    assert_eq!(h.session_ticket(), Some(&[][..]), "asks for a ticket");
    assert!(h.session_id.is_empty());
}

#[test]
fn openssl_tls13_only() {
    let h = parse(OPENSSL_TLS13);
    assert_eq!(h.server_name(), Some("tls13.example"));
    assert_eq!(alpn(&h), ["h2", "http/1.1"]);
    assert_eq!(
        h.supported_versions(),
        Some(&[ProtocolVersion::TLSV1_3][..])
    );
    assert_eq!(h.legacy_version, ProtocolVersion::TLSV1_2);
    assert_eq!(
        h.key_share_groups().collect::<Vec<_>>(),
        [(NamedGroup::X25519, 32)]
    );
    assert_eq!(
        h.psk_key_exchange_modes(),
        Some(&[PskKeyExchangeMode::PSK_DHE_KE][..])
    );
    assert_eq!(h.session_id.len(), 32, "middlebox compatibility mode");
    assert!(h.pre_shared_key().is_none());
}

#[test]
fn openssl_tls13_resumption_offers_its_ticket_as_psk() {
    let h = parse(OPENSSL_TLS13_RESUME);
    assert_eq!(h.server_name(), Some("resume.example"));
    assert!(h.offers_tls13());
    let psk = h.pre_shared_key().expect("resumption offers a PSK");
    assert_eq!(psk.identities.len(), 1);
    assert!(
        psk.identities[0].identity.len() > 100,
        "an OpenSSL stateless ticket"
    );
    assert_eq!(psk.binders.len(), 1);
    assert_eq!(
        psk.binders[0].len(),
        48,
        "SHA-384 binder: the session used OpenSSL's first choice, AES-256-GCM"
    );
    assert_eq!(
        h.extensions.last().map(|e| e.typ()),
        Some(ExtensionType::PRE_SHARED_KEY)
    );
    assert!(!h.early_data());
}

#[test]
fn openssl_tls12_resumption_sends_its_ticket() {
    let h = parse(OPENSSL_TLS12_RESUME);
    assert_eq!(h.server_name(), Some("resume.example"));
    assert!(!h.offers_tls13());
    let ticket = h.session_ticket().expect("session_ticket extension");
    assert!(
        ticket.len() > 100,
        "an OpenSSL ticket, {} bytes",
        ticket.len()
    );
    assert_eq!(
        h.session_id.len(),
        32,
        "RFC 5077 3.4: a session id is sent with the ticket"
    );
    assert!(h.pre_shared_key().is_none());
}

#[test]
fn curl_offers_both_versions_and_h2() {
    let h = parse(CURL);
    assert_eq!(h.server_name(), Some("curl.example"));
    assert_eq!(alpn(&h), ["h2", "http/1.1"]);
    assert!(h.offers_tls13());
    assert!(h
        .supported_versions()
        .unwrap()
        .contains(&ProtocolVersion::TLSV1_2));
    assert!(
        h.extension(ExtensionType::PADDING).is_some(),
        "OpenSSL pads hellos of 256..511 bytes"
    );
}

#[test]
fn chromium_greases_and_offers_a_post_quantum_share() {
    let h = parse(CHROMIUM);
    assert_eq!(h.server_name(), Some("chromium.example"));
    assert_eq!(alpn(&h), ["h2", "http/1.1"]);
    assert_eq!(h.max_version(), ProtocolVersion::TLSV1_3);
    assert!(h.cipher_suites[0].is_grease());
    assert!(h.supported_versions().unwrap()[0].is_grease());
    let shares: Vec<_> = h
        .key_share_groups()
        .filter(|(g, _)| !g.is_grease())
        .collect();
    assert_eq!(
        shares,
        [
            (NamedGroup::X25519_MLKEM768, 1216),
            (NamedGroup::X25519, 32)
        ]
    );
    assert!(h.extensions.iter().filter(|e| e.typ().is_grease()).count() >= 2);
    assert!(
        h.extension(ExtensionType::ENCRYPTED_CLIENT_HELLO).is_some(),
        "ECH GREASE"
    );
}
