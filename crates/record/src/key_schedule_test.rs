//! Known answers from RFC 8448 section 3 ("Simple 1-RTT Handshake", TLS_AES_128_GCM_SHA256):
//! the application traffic secrets expand to the printed keys and IVs.

use super::*;
use crate::testutil::hex;

/// `{client} derive secret "tls13 c ap traffic"`.
const CLIENT_AP_SECRET: &str = "9e40646ce79a7f9dc05af8889bce6552875afa0b06df0087f792ebb7c17504a5";
/// `{server} derive secret "tls13 s ap traffic"`.
const SERVER_AP_SECRET: &str = "a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643";

#[test]
fn rfc8448_application_keys_from_traffic_secrets() {
    let client = TrafficSecret::new(Suite::Aes128Gcm, &hex(CLIENT_AP_SECRET)).unwrap();
    let keys = client.keys().unwrap();
    assert_eq!(&keys.key[..], &hex("17422dda596ed5d9acd890e3c63f5051")[..]);
    assert_eq!(&keys.iv[..], &hex("5b78923dee08579033e523d9")[..]);

    let server = TrafficSecret::new(Suite::Aes128Gcm, &hex(SERVER_AP_SECRET)).unwrap();
    let keys = server.keys().unwrap();
    assert_eq!(&keys.key[..], &hex("9f02283b6c9c07efc26bb9f2ac92e356")[..]);
    assert_eq!(&keys.iv[..], &hex("cf782b88dd83549aadf1e984")[..]);
}

#[test]
fn rfc8448_expand_label_directly() {
    // The same derivation through the bare function, as `{server} derive write traffic keys
    // for application data` prints it: key = HKDF-Expand-Label(secret, "key", "", 16).
    let mut key = [0u8; 16];
    hkdf_expand_label(
        hkdf::HKDF_SHA256,
        &hex(SERVER_AP_SECRET),
        b"key",
        &[],
        &mut key,
    )
    .unwrap();
    assert_eq!(&key[..], &hex("9f02283b6c9c07efc26bb9f2ac92e356")[..]);
}

#[test]
fn next_generation_changes_the_secret_and_keeps_its_length() {
    for suite in [Suite::Aes128Gcm, Suite::Aes256Gcm, Suite::Chacha20Poly1305] {
        let s0 = TrafficSecret::new(suite, &vec![7u8; suite.hash_len()]).unwrap();
        let s1 = s0.next().unwrap();
        assert_eq!(s1.expose().len(), suite.hash_len());
        assert_ne!(s0.expose(), s1.expose());
        assert_eq!(s1.keys().unwrap().key.len(), suite.key_len());
        // deterministic
        assert_eq!(s0.next().unwrap().expose(), s1.expose());
    }
}

#[test]
fn wrong_secret_length_is_refused() {
    assert!(TrafficSecret::new(Suite::Aes256Gcm, &[0u8; 32]).is_err());
    assert!(TrafficSecret::new(Suite::Aes128Gcm, &[0u8; 48]).is_err());
}

#[test]
fn debug_is_redacted() {
    let s = TrafficSecret::new(Suite::Aes128Gcm, &[0x5a; 32]).unwrap();
    let text = format!("{s:?}");
    assert!(!text.contains("90"), "{text}");
    assert!(text.contains("redacted"));
}
