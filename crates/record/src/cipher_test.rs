//! Known answers for [`Sealer`](crate::Sealer) and [`Opener`]: the TLS 1.3 records of RFC 8448
//! section 3 (TLS_AES_128_GCM_SHA256), byte for byte, and TLS 1.2 nonce layout checks. The
//! TLS 1.2 suites are cross-checked against rustls in `tests/rustls_roundtrip.rs`.

use super::*;
use crate::testutil::hex;
use crate::Sealer;

const CLIENT_AP_KEY: &str = "17422dda596ed5d9acd890e3c63f5051";
const CLIENT_AP_IV: &str = "5b78923dee08579033e523d9";
const SERVER_AP_KEY: &str = "9f02283b6c9c07efc26bb9f2ac92e356";
const SERVER_AP_IV: &str = "cf782b88dd83549aadf1e984";

/// `{client} send application_data record` (sequence 0): 50 bytes 00 01 .. 31.
pub(crate) const CLIENT_APP_RECORD: &str = "
    17 03 03 00 43 a2 3f 70 54 b6 2c 94 d0 af fa fe 82 28 ba 55
    cb ef ac ea 42 f9 14 aa 66 bc ab 3f 2b 98 19 a8 a5 b4 6b 39
    5b d5 4a 9a 20 44 1e 2b 62 97 4e 1f 5a 62 92 a2 97 70 14 bd
    1e 3d ea e6 3a ee bb 21 69 49 15 e4";

/// `{server} send application_data record` (sequence 1, after the NewSessionTicket).
pub(crate) const SERVER_APP_RECORD: &str = "
    17 03 03 00 43 2e 93 7e 11 ef 4a c7 40 e5 38 ad 36 00 5f c4
    a4 69 32 fc 32 25 d0 5f 82 aa 1b 36 e3 0e fa f9 7d 90 e6 df
    fc 60 2d cb 50 1a 59 a8 fc c4 9c 4b f2 e5 f0 a2 1c 00 47 c2
    ab f3 32 54 0d d0 32 e1 67 c2 95 5d";

/// `{client} send alert record` (close_notify, sequence 1).
pub(crate) const CLIENT_ALERT_RECORD: &str =
    "17 03 03 00 13 c9 87 27 60 65 56 66 b7 4d 7f f1 15 3e fd 6d b6 d0 b0 e3";

/// `{server} send alert record` (close_notify, sequence 2).
pub(crate) const SERVER_ALERT_RECORD: &str =
    "17 03 03 00 13 b5 8f d6 71 66 eb f5 99 d2 47 20 cf be 7e fa 7a 88 64 a9";

fn iv(s: &str) -> [u8; 12] {
    hex(s).try_into().unwrap()
}

fn split(record: &[u8]) -> ([u8; 5], Vec<u8>) {
    (record[..5].try_into().unwrap(), record[5..].to_vec())
}

#[test]
fn rfc8448_server_app_record_seals_exactly() {
    let sealer = Sealer::new(
        Version::Tls13,
        Suite::Aes128Gcm,
        &hex(SERVER_AP_KEY),
        &iv(SERVER_AP_IV),
        1,
    )
    .unwrap();
    let mut out = Vec::new();
    let data: Vec<u8> = (0u8..50).collect();
    sealer
        .seal_with_seq(1, ContentType::APPLICATION_DATA, &data, &mut out)
        .unwrap();
    assert_eq!(out, hex(SERVER_APP_RECORD));

    let mut out = Vec::new();
    sealer
        .seal_with_seq(2, ContentType::ALERT, &[1, 0], &mut out)
        .unwrap();
    assert_eq!(out, hex(SERVER_ALERT_RECORD));
}

#[test]
fn rfc8448_client_records_open_exactly() {
    let mut opener = Opener::new(
        Version::Tls13,
        Suite::Aes128Gcm,
        &hex(CLIENT_AP_KEY),
        &iv(CLIENT_AP_IV),
        0,
    )
    .unwrap();
    let (hdr, mut payload) = split(&hex(CLIENT_APP_RECORD));
    let opened = opener.open(&hdr, &mut payload).unwrap();
    assert_eq!(opened.typ, ContentType::APPLICATION_DATA);
    assert_eq!(payload[opened.range], (0u8..50).collect::<Vec<_>>()[..]);
    assert_eq!(opener.seq(), 1);

    let (hdr, mut payload) = split(&hex(CLIENT_ALERT_RECORD));
    let opened = opener.open(&hdr, &mut payload).unwrap();
    assert_eq!(opened.typ, ContentType::ALERT);
    assert_eq!(&payload[opened.range], &[1, 0]);
}

#[test]
fn rfc8448_record_at_the_wrong_sequence_fails() {
    let opener = Opener::new(
        Version::Tls13,
        Suite::Aes128Gcm,
        &hex(CLIENT_AP_KEY),
        &iv(CLIENT_AP_IV),
        0,
    )
    .unwrap();
    let (hdr, mut payload) = split(&hex(CLIENT_APP_RECORD));
    assert_eq!(
        opener.open_with_seq(1, &hdr, &mut payload),
        Err(Error::DecryptFailed)
    );
}

#[test]
fn tls13_padding_is_stripped_and_all_zero_is_refused() {
    let key = [3u8; 32];
    let iv = [4u8; 12];
    let sealer = Sealer::new(Version::Tls13, Suite::Chacha20Poly1305, &key, &iv, 0).unwrap();
    let opener = Opener::new(Version::Tls13, Suite::Chacha20Poly1305, &key, &iv, 0).unwrap();
    // content "hi", inner type 23, two zeros of padding: seal it as raw inner plaintext by
    // sealing type 0 after "hi\x17\0" (the sealer appends the type byte, here 0).
    let mut out = Vec::new();
    sealer
        .seal_with_seq(0, ContentType(0), b"hi\x17\0", &mut out)
        .unwrap();
    let (hdr, mut payload) = split(&out);
    let opened = opener.open_with_seq(0, &hdr, &mut payload).unwrap();
    assert_eq!(opened.typ, ContentType::APPLICATION_DATA);
    assert_eq!(&payload[opened.range], b"hi");

    let mut out = Vec::new();
    sealer
        .seal_with_seq(1, ContentType(0), &[0, 0, 0], &mut out)
        .unwrap();
    let (hdr, mut payload) = split(&out);
    assert_eq!(
        opener.open_with_seq(1, &hdr, &mut payload),
        Err(PeerMisbehaved::MissingInnerContentType.into())
    );
}

#[test]
fn tls12_gcm_explicit_nonce_is_iv_tail_xor_seq() {
    let key = [1u8; 16];
    let iv: [u8; 12] = [0xa0, 0xa1, 0xa2, 0xa3, 0, 0, 0, 0, 0, 0, 0x10, 0x01];
    let sealer = Sealer::new(Version::Tls12, Suite::Aes128Gcm, &key, &iv, 0).unwrap();
    let mut out = Vec::new();
    sealer
        .seal_with_seq(0x0102, ContentType::APPLICATION_DATA, b"abc", &mut out)
        .unwrap();
    assert_eq!(&out[..5], &[23, 3, 3, 0, (8 + 3 + 16) as u8]);
    assert_eq!(&out[5..13], &[0, 0, 0, 0, 0, 0, 0x11, 0x03]);

    let opener = Opener::new(Version::Tls12, Suite::Aes128Gcm, &key, &iv, 0).unwrap();
    let (hdr, mut payload) = split(&out);
    let opened = opener.open_with_seq(0x0102, &hdr, &mut payload).unwrap();
    assert_eq!(&payload[opened.range], b"abc");
    // the sequence number is in the AAD even though the nonce is explicit
    let (hdr, mut payload) = split(&out);
    assert_eq!(
        opener.open_with_seq(0x0103, &hdr, &mut payload),
        Err(Error::DecryptFailed)
    );
}

#[test]
fn tls12_round_trip_every_suite_and_tamper() {
    for suite in [Suite::Aes128Gcm, Suite::Aes256Gcm, Suite::Chacha20Poly1305] {
        let key = vec![9u8; suite.key_len()];
        let iv = [7u8; 12];
        let mut sealer = Sealer::new(Version::Tls12, suite, &key, &iv, 5).unwrap();
        let mut opener = Opener::new(Version::Tls12, suite, &key, &iv, 5).unwrap();
        for len in [0usize, 1, 100, MAX_PLAINTEXT_LEN] {
            let data = vec![0x42u8; len];
            let mut out = Vec::new();
            sealer
                .seal(ContentType::APPLICATION_DATA, &data, &mut out)
                .unwrap();
            assert_eq!(out.len(), sealer.record_len(len));
            let (hdr, mut payload) = split(&out);
            let opened = opener.open(&hdr, &mut payload).unwrap();
            assert_eq!(payload[opened.range], data[..]);
        }
        let mut out = Vec::new();
        sealer.seal(ContentType::ALERT, &[1, 0], &mut out).unwrap();
        let last = out.len() - 1;
        out[last] ^= 1;
        let (hdr, mut payload) = split(&out);
        assert_eq!(opener.open(&hdr, &mut payload), Err(Error::DecryptFailed));
        assert_eq!(opener.seq(), 9, "a failed open does not advance");
    }
}

#[test]
fn sealing_refuses_oversized_plaintext_and_the_hard_limit() {
    let mut sealer = Sealer::new(
        Version::Tls13,
        Suite::Aes128Gcm,
        &[0u8; 16],
        &[0u8; 12],
        SEQ_HARD_LIMIT - 1,
    )
    .unwrap();
    let mut out = Vec::new();
    assert!(sealer
        .seal(
            ContentType::APPLICATION_DATA,
            &vec![0; MAX_PLAINTEXT_LEN + 1],
            &mut out
        )
        .is_err());
    assert!(out.is_empty());
    assert!(sealer.is_worn_out());
    sealer.seal(ContentType::ALERT, &[1, 0], &mut out).unwrap();
    assert_eq!(
        sealer.seal(ContentType::ALERT, &[1, 0], &mut out),
        Err(Error::KeyExhausted)
    );
}

#[test]
fn short_payloads_fail_cleanly() {
    for version in [Version::Tls12, Version::Tls13] {
        let opener = Opener::new(version, Suite::Aes128Gcm, &[0u8; 16], &[0u8; 12], 0).unwrap();
        for len in 0..30 {
            let mut payload = vec![0u8; len];
            let hdr = [23, 3, 3, 0, len as u8];
            assert!(opener.open_with_seq(0, &hdr, &mut payload).is_err());
        }
    }
}
