//! Protocol policy: which TLS versions, cipher suites and key exchange groups the agent accepts.
//!
//! The ceiling is fixed: TLS 1.2 and 1.3 only, and in TLS 1.2 only ECDHE with AEAD suites (what
//! rustls implements). TLS 1.0/1.1, RSA key exchange, CBC, RC4, 3DES and anonymous suites are
//! refused by the handshake with a `protocol_version` or `handshake_failure` alert. Operators
//! may only narrow this set.

use std::sync::Arc;

use anyhow::bail;
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

use crate::metering::metered_provider;

/// The resolved policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub provider: Arc<CryptoProvider>,
    pub versions: Vec<&'static SupportedProtocolVersion>,
}

/// Other spellings of group names.
const GROUP_ALIASES: &[(&str, &str)] = &[
    ("p-256", "secp256r1"),
    ("p256", "secp256r1"),
    ("prime256v1", "secp256r1"),
    ("p-384", "secp384r1"),
    ("p384", "secp384r1"),
    ("p-521", "secp521r1"),
];

/// Builds the policy from `--tls-versions`, `--suites`, `--groups` (empty = all allowed).
pub fn build(versions: &[String], suites: &[String], groups: &[String]) -> anyhow::Result<Policy> {
    let base = metered_provider();
    let versions = parse_versions(versions)?;
    let mut cipher_suites = select(&base.cipher_suites, suites, suite_name, |name| {
        baton_wire::names::rustls_suite_name(name).to_ascii_uppercase()
    })
    .map_err(|bad| {
        anyhow::anyhow!(
            "--suites: `{bad}` is not accepted; Baton offers only these AEAD suites (TLS 1.2 \
             ECDHE only, no RSA key exchange, CBC, RC4, 3DES or anonymous suites): {}",
            base.cipher_suites
                .iter()
                .map(suite_name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    if suites.is_empty() {
        // Default order: rustls' default preference (AES-256 first) for all enabled suites.
        cipher_suites = rustls::crypto::aws_lc_rs::DEFAULT_CIPHER_SUITES
            .iter()
            .filter_map(|d| base.cipher_suites.iter().find(|s| s.suite() == d.suite()))
            .copied()
            .collect();
    }
    cipher_suites.retain(|s| versions.iter().any(|v| s.version() == *v));
    if cipher_suites.is_empty() {
        bail!("--suites and --tls-versions leave no cipher suite");
    }
    let mut kx_groups = select(
        &base.kx_groups,
        groups,
        |g| group_name(*g),
        |name| {
            let lower = name.to_ascii_lowercase();
            GROUP_ALIASES
                .iter()
                .find(|(alias, _)| *alias == lower)
                .map_or(lower, |(_, canonical)| canonical.to_string())
        },
    )
    .map_err(|bad| {
        anyhow::anyhow!(
            "--groups: `{bad}` is not supported; choose from {}",
            base.kx_groups
                .iter()
                .map(|g| group_name(*g))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    if groups.is_empty() {
        kx_groups = rustls::crypto::aws_lc_rs::DEFAULT_KX_GROUPS
            .iter()
            .filter_map(|d| base.kx_groups.iter().find(|g| g.name() == d.name()))
            .copied()
            .collect();
    }
    Ok(Policy {
        provider: Arc::new(CryptoProvider {
            cipher_suites,
            kx_groups,
            ..base.clone()
        }),
        versions,
    })
}

/// `--tls-versions` names (`1.2`, `TLSv1.3`, ...) as rustls versions; none named = both.
pub fn parse_versions(names: &[String]) -> anyhow::Result<Vec<&'static SupportedProtocolVersion>> {
    if names.is_empty() {
        return Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12]);
    }
    let mut out = Vec::new();
    for name in names {
        let v = match name
            .trim()
            .to_ascii_lowercase()
            .trim_start_matches("tls")
            .trim_start_matches('v')
        {
            "1.3" | "13" => &rustls::version::TLS13,
            "1.2" | "12" => &rustls::version::TLS12,
            "1.0" | "1.1" | "1" | "10" | "11" => {
                bail!("--tls-versions: TLS {name} is refused (broken); use 1.2 and/or 1.3")
            }
            _ => bail!("--tls-versions: unknown version `{name}` (1.2, 1.3)"),
        };
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

/// Picks `wanted` (in the operator's order) from `all`, matching canonical names; returns the
/// first unknown name as the error.
fn select<T: Copy>(
    all: &[T],
    wanted: &[String],
    name_of: impl Fn(&T) -> String,
    canonical: impl Fn(&str) -> String,
) -> Result<Vec<T>, String> {
    wanted
        .iter()
        .map(|w| {
            let c = canonical(w.trim());
            all.iter()
                .find(|item| name_of(item).eq_ignore_ascii_case(&c))
                .copied()
                .ok_or_else(|| w.clone())
        })
        .collect()
}

pub fn suite_name(s: &SupportedCipherSuite) -> String {
    format!("{:?}", s.suite())
}

pub fn group_name(g: &dyn SupportedKxGroup) -> String {
    format!("{:?}", g.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn defaults_are_both_versions_all_aead_suites() {
        let p = build(&[], &[], &[]).unwrap();
        assert_eq!(p.versions.len(), 2);
        assert_eq!(p.provider.cipher_suites.len(), 9);
        assert!(p
            .provider
            .kx_groups
            .iter()
            .any(|g| group_name(*g) == "X25519"));
    }

    #[test]
    fn narrowing_by_either_name_and_order_kept() {
        let p = build(
            &[],
            &s(&[
                "ECDHE-RSA-AES128-GCM-SHA256",
                "tls13_chacha20_poly1305_sha256",
            ]),
            &s(&["P-256", "x25519"]),
        )
        .unwrap();
        let names: Vec<_> = p.provider.cipher_suites.iter().map(suite_name).collect();
        assert_eq!(
            names,
            [
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS13_CHACHA20_POLY1305_SHA256"
            ]
        );
        let groups: Vec<_> = p
            .provider
            .kx_groups
            .iter()
            .map(|g| group_name(*g))
            .collect();
        assert_eq!(groups, ["secp256r1", "X25519"]);
    }

    #[test]
    fn versions_filter_suites() {
        let p = build(&s(&["1.2"]), &[], &[]).unwrap();
        assert!(p
            .provider
            .cipher_suites
            .iter()
            .all(|s| s.version() == &rustls::version::TLS12));
        assert!(build(&s(&["1.3"]), &s(&["ECDHE-RSA-AES128-GCM-SHA256"]), &[]).is_err());
    }

    #[test]
    fn weak_things_are_refused_with_reasons() {
        let e = build(&s(&["1.1"]), &[], &[]).unwrap_err().to_string();
        assert!(e.contains("refused"), "{e}");
        let e = build(&[], &s(&["AES128-SHA"]), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no RSA key exchange, CBC"), "{e}");
        assert!(build(&[], &[], &s(&["ffdhe2048x"])).is_err());
    }
}
