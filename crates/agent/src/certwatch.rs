//! `baton_certificate_expiry_timestamp_seconds{name,key}`: when each certificate served
//! expires, read from the live store at scrape time, so a reload, an OCSP staple or a renewed
//! certificate swapped in shows on the next scrape.
//!
//! `name` is the certificate's first name (its first subjectAltName, the one an operator
//! named it for), `key` its key type. Two certificates with the same first name and key type
//! (one from --cert, one from --cert-dir, say) are one series: the earlier expiry, the one an
//! alert must not miss.

use std::collections::BTreeMap;

use baton_ops::metrics::gauges;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use rustls::SignatureAlgorithm;

use crate::certs::CertEntry;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct CertLabels {
    pub name: String,
    pub key: &'static str,
}

/// The `key` label of a certificate's algorithm.
pub fn key_label(alg: SignatureAlgorithm) -> &'static str {
    match alg {
        SignatureAlgorithm::ECDSA => "ecdsa",
        SignatureAlgorithm::RSA => "rsa",
        SignatureAlgorithm::ED25519 => "ed25519",
        SignatureAlgorithm::ED448 => "ed448",
        _ => "other",
    }
}

/// The end-entity certificate's notAfter, in seconds since the Unix epoch.
pub fn not_after(entry: &CertEntry) -> Option<i64> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(entry.certified.end_entity_cert().ok()?).ok()?;
    Some(parsed.validity().not_after.timestamp())
}

/// One sample per (first name, key type), the earliest expiry of those sharing one.
pub fn expiries(entries: &[CertEntry]) -> BTreeMap<CertLabels, i64> {
    let mut out: BTreeMap<CertLabels, i64> = BTreeMap::new();
    for e in entries {
        let Some(at) = not_after(e) else { continue };
        let labels = CertLabels {
            name: e.names.first().cloned().unwrap_or_default(),
            key: key_label(e.algorithm),
        };
        out.entry(labels)
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }
    out
}

pub fn encode(e: &mut DescriptorEncoder, entries: &[CertEntry]) -> Result<(), std::fmt::Error> {
    gauges(
        e,
        "baton_certificate_expiry_timestamp_seconds",
        "When each certificate served expires (notAfter, Unix seconds), by its first name and \
         key type.",
        expiries(entries),
    )?;
    crate::stapler::encode(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::self_signed;
    use crate::config::KeyKind;

    #[test]
    fn one_series_per_first_name_and_key_with_the_earliest_expiry() {
        let names = vec!["site.test".to_string(), "www.site.test".to_string()];
        let a = self_signed(KeyKind::EcdsaP256, &names).unwrap().0;
        let b = self_signed(KeyKind::Rsa2048, &names).unwrap().0;
        let c = self_signed(KeyKind::Ed25519, &["x.test".to_string()])
            .unwrap()
            .0;
        let got = expiries(&[a.clone(), b, c, a.clone()]);
        let keys: Vec<_> = got.keys().map(|l| (l.name.as_str(), l.key)).collect();
        assert_eq!(
            keys,
            vec![
                ("site.test", "ecdsa"),
                ("site.test", "rsa"),
                ("x.test", "ed25519")
            ]
        );
        // rcgen's default validity ends in 4096
        let expected = x509_parser::parse_x509_certificate(&a.certified.cert[0])
            .unwrap()
            .1
            .validity()
            .not_after
            .timestamp();
        assert!(expected > 2_000_000_000);
        assert!(got.values().all(|t| *t == expected), "{got:?}");
    }
}
