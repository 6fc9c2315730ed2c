//! Other spellings of cipher suite names. rustls (and Baton's flags) use the IANA names with
//! TLS 1.3 suites written `TLS13_*`; IANA writes those `TLS_*`, and OpenSSL has names of its own.

/// (other name, rustls' name), for the AEAD suites rustls implements.
const SUITE_ALIASES: &[(&str, &str)] = &[
    ("TLS_AES_128_GCM_SHA256", "TLS13_AES_128_GCM_SHA256"),
    ("TLS_AES_256_GCM_SHA384", "TLS13_AES_256_GCM_SHA384"),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS13_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// rustls' name for a suite given by its IANA or OpenSSL name (case-insensitive); other names
/// come back unchanged.
pub fn rustls_suite_name(name: &str) -> &str {
    SUITE_ALIASES
        .iter()
        .find(|(alias, _)| alias.eq_ignore_ascii_case(name))
        .map_or(name, |(_, rustls)| rustls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases() {
        assert_eq!(
            rustls_suite_name("ecdhe-rsa-aes128-gcm-sha256"),
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
        );
        assert_eq!(
            rustls_suite_name("TLS_AES_128_GCM_SHA256"),
            "TLS13_AES_128_GCM_SHA256"
        );
        assert_eq!(
            rustls_suite_name("TLS13_AES_128_GCM_SHA256"),
            "TLS13_AES_128_GCM_SHA256"
        );
    }
}
